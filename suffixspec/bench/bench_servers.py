"""Servers end to end: llama.cpp's own ``llama-server`` against ``suffixspec serve``, through the OpenAI API.

What a CPU user compares: the server they would run instead, on the same GGUF, the same chat requests,
tokens per second as their client sees them. Systems (each a server process of its own):

- ``llama_server_plain``: ``llama-server -m GGUF -t 2`` (no speculation);
- ``llama_server_spec_default``: ``--spec-default`` (its ngram-mod drafter);
- ``llama_server_draft``: the draft model's GGUF, ``-md DRAFT --spec-type draft-simple --spec-draft-n-max 16
  --spec-draft-p-min 0.75`` (only where the target has a draft model: ``suffixspec.models``);
- ``llama_server_draft_ngram``: the same with ngram-mod too (``--spec-type draft-simple,ngram-mod``);
- ``ours_off@W``: ``suffixspec serve --draft-model none`` at weight format ``W``, every request with
  ``"speculation": false`` (plain decoding: the output the speculative ones must equal);
- ``ours_suffix@W``: ``--draft-model none``, the suffix drafters (prompt, documents, references);
- ``ours_all@W``: ``--draft-model auto`` (the shipped draft model where there is one) and every drafter.

History is off for ours (the requests name their drafters without ``history``: an earlier round's answer
must not turn a later round into a copy); the document store is a fresh empty file. Every request is a chat
request (``/v1/chat/completions``: each server applies the model's chat template itself), greedy
(``temperature`` 0), ``max_tokens`` fixed, sent one at a time, not streamed.

One server at a time on 127.0.0.1 (a free port): start it, wait until ``/health`` answers 200, send one
short warm-up request (not timed), then the workload's requests, then read the resident memory of the
process and its children from ``/proc`` (``VmRSS``; file-backed and anonymous parts apart: llama-server maps
the GGUF, so its file pages count), then stop it. Rounds interleave: round 1 runs every system, round 2
every system again, so a change of the machine's load hits every system alike; the load average is
recorded around every server's requests.

Reported per workload and system: end-to-end tokens per second (completion tokens over the client's wall
seconds, prefill included: per round, and the median over rounds), the ratio to ``llama_server_plain`` and to
llama-server's best configuration, the share of outputs identical to ``llama_server_plain``'s and to our
own ``ours_off`` at the same format (ours; llama-server's against the first format's), whether a system
gave the same outputs in every round, the loop share of its outputs (:mod:`suffixspec.bench.loops`:
small models loop under greedy decoding), the resident memory, the draft counts llama-server returns in
``timings`` and ours in ``speculative_decoding``, and the thread count each server ran on (llama-server:
``-t``, 2 by default; ours: its default policy, which ``/health`` reports).

The binary is given by path: ``--llama-server PATH`` or ``$SUFFIXSPEC_LLAMA_SERVER``; without it the
llama-server systems are skipped with the reason (docs/llama_cpp.md says how to build it).

    python -m suffixspec.bench.bench_servers --model smollm2-135m-instruct \\
        --workloads code_edit,open_ended --requests 4 --max-tokens 128 --rounds 2 --weights float32,int8 \\
        --llama-server /work/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server

Writes ``servers.json`` and ``servers.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .loops import LOOPING, loop_share
from .processes import ServerProcess, free_port, resident_memory
from .workloads import build
from .workloads.request import Request

LLAMA_SERVER_ENV = "SUFFIXSPEC_LLAMA_SERVER"  # the llama-server binary, when --llama-server is not given
LLAMA_SYSTEMS = (
    "llama_server_plain",
    "llama_server_spec_default",
    "llama_server_draft",
    "llama_server_draft_ngram",
)
LLAMA_DRAFT_SYSTEMS = ("llama_server_draft", "llama_server_draft_ngram")  # need the draft model's GGUF
OUR_MODES = ("ours_off", "ours_suffix", "ours_all")
DRAFTERS = {
    "ours_suffix": ["prompt", "documents", "references"],  # no history (see the module docstring)
    "ours_all": ["prompt", "documents", "references", "draft_model"],
}
LLAMA_THREADS = 2  # llama-server's -t, as in issue 44's table (both cores of the machine it was measured on)
LLAMA_CONTEXT = 4096  # llama-server's -c (prompt and output), as the llama-cpp runtime's context
DEFAULT_WORKLOADS = ("code_edit", "open_ended")


def llama_server_binary(path: str | None = None) -> Path | None:
    """The llama-server binary: ``path``, else ``$SUFFIXSPEC_LLAMA_SERVER``, else None (not given). A path given
    that is no executable file raises ``FileNotFoundError`` (a typo must not read as "skipped")."""
    path = path or os.environ.get(LLAMA_SERVER_ENV)
    if not path:
        return None
    p = Path(path).expanduser()
    if not (p.is_file() and os.access(p, os.X_OK)):
        raise FileNotFoundError(f"no executable llama-server at {p} (docs/llama_cpp.md says how to build it)")
    return p


def gguf_file(model: str) -> Path | None:
    """The GGUF file llama-server loads for ``model`` (a name from ``suffixspec models`` or a ``.gguf`` path);
    None for a model that has none (a folder, the embedded test models). A model cut into part packages
    (the Qwen pair) is joined once into ``$SUFFIXSPEC_CACHE/gguf/`` and checked against its stated sha256."""
    from suffixspec.gguf_cache import cache_dir, file_lock, sha256_file
    from suffixspec.models import gguf_source

    src = gguf_source(model)
    if src is None:
        return None
    if src.path is not None:
        return src.path
    out = cache_dir() / "gguf" / src.model.gguf
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.parent / f".{out.name}.lock"):
        if not out.is_file():
            tmp = out.with_name(f".{out.name}.tmp")
            parts = src.model.parts
            if parts is not None:
                with open(tmp, "wb") as f:
                    for part in parts.paths():
                        if part is None:
                            raise FileNotFoundError(
                                f"a part of {model} is missing: pip install {' '.join(parts.requirements())}"
                            )
                        with open(part, "rb") as fp:
                            shutil.copyfileobj(fp, f, 1 << 22)
                if sha256_file(tmp) != src.sha256:
                    tmp.unlink()
                    raise ValueError(f"the joined parts of {model} are not the file they state (sha256)")
            else:  # a chunked package: its assemble() checks the sha256
                import importlib

                importlib.import_module(src.model.module).assemble(tmp)
            tmp.rename(out)
    return out


# ----- systems ------------------------------------------------------------------------------------
@dataclass
class System:
    """One server configuration: how to start it and what each request adds."""

    name: str  # e.g. "llama_server_plain", "ours_all@int8"
    kind: str  # "llama" or "ours"
    args: list[str]  # command-line options after the program
    extra: dict[str, Any] = field(default_factory=dict)  # request fields added to every chat request
    weights: str | None = None  # ours: the weight format; None for llama-server (the GGUF as it is)


def _serve_help() -> str:
    return subprocess.run(
        [sys.executable, "-m", "suffixspec", "serve", "--help"],
        capture_output=True,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
    ).stdout


def weight_args(weights: str, helptext: str) -> list[str]:
    """``suffixspec serve``'s option for a weight format: ``--weights W`` where the server has it, else
    ``--dtype W`` (a floating format only: float32, bfloat16, float16)."""
    if "--weights" in helptext:
        return ["--weights", weights]
    if weights in ("float32", "bfloat16", "float16"):
        return ["--dtype", weights]
    raise ValueError(f"this suffixspec serve has no --weights option, so no {weights!r} weights")


def make_systems(
    names: list[str],
    weights: list[str],
    model: str,
    draft: str | None,
    gguf: Path | None,
    draft_gguf: Path | None,
    llama_threads: int,
    context: int,
) -> list[System]:
    """The systems named (``ours_*`` once per weight format, as ``ours_all@int8``), in the order given."""
    helptext = _serve_help() if any(n in OUR_MODES for n in names) else ""
    out = []
    for name in names:
        if name in LLAMA_SYSTEMS:
            args = ["-m", str(gguf), "-t", str(llama_threads), "-c", str(context), "--no-webui"]
            if name == "llama_server_spec_default":
                args += ["--spec-default"]
            elif name in LLAMA_DRAFT_SYSTEMS:
                args += [
                    "-md",
                    str(draft_gguf),
                    "--spec-type",
                    "draft-simple" if name == "llama_server_draft" else "draft-simple,ngram-mod",
                    "--spec-draft-n-max",
                    "16",
                    "--spec-draft-p-min",
                    "0.75",
                ]
            out.append(System(name, "llama", args))
        elif name in OUR_MODES:
            for w in weights:
                args = [
                    "--model",
                    model,
                    "--draft-model",
                    (draft or "none") if name == "ours_all" else "none",
                    *weight_args(w, helptext),
                ]
                extra: dict[str, Any] = (
                    {"speculation": False}
                    if name == "ours_off"
                    else {"speculation": {"drafters": DRAFTERS[name]}}
                )
                out.append(System(f"{name}@{w}", "ours", args, extra, w))
        else:
            raise ValueError(f"unknown system {name!r}; choose from {list(LLAMA_SYSTEMS + OUR_MODES)}")
    return out


def start(system: System, workdir: Path, binary: Path | None) -> ServerProcess:
    port = free_port()
    log = workdir / f"{system.name.replace('@', '-')}.log"
    if system.kind == "llama":
        assert binary is not None
        return ServerProcess(
            [str(binary), *system.args, "--host", "127.0.0.1", "--port", str(port)], port, log
        )
    db = workdir / f"{system.name.replace('@', '-')}.db"
    db.unlink(missing_ok=True)  # a fresh, empty store every round: no documents, no history
    cmd = [sys.executable, "-m", "suffixspec", "serve", *system.args, "--db", str(db), "--port", str(port)]
    return ServerProcess(cmd, port, log)


# ----- a run --------------------------------------------------------------------------------------
@dataclass
class Served:
    """One system's pass over one workload's requests in one round."""

    system: str
    workload: str
    round: int
    texts: list[str]  # each request's output text
    tokens: list[int]  # each request's completion tokens (the server's usage)
    seconds: list[float]  # each request's wall seconds at the client
    drafted: int  # draft tokens the server reports (llama-server's timings, ours' speculative_decoding)
    accepted: int  # of which accepted
    memory_gb: dict[str, float]  # resident memory after the requests (resident_memory)
    ready_s: float  # seconds from spawn to /health 200
    load: tuple[float, float]  # 1-minute load average before and after the requests
    threads: Any = None  # the thread count the server ran on (llama-server: -t; ours: /health)


def serve_workload(
    server: ServerProcess, system: System, workload: str, rnd: int, reqs: list[Request]
) -> Served:
    load = os.getloadavg()[0]
    texts, tokens, seconds, drafted, accepted = [], [], [], 0, 0
    for req in reqs:
        body = {
            "model": "suffixspec",
            "messages": req.messages,
            "max_tokens": req.max_tokens,
            "temperature": 0,
            **system.extra,
        }
        resp, s = server.chat(body)
        texts.append(resp["choices"][0]["message"]["content"] or "")
        tokens.append(int(resp["usage"]["completion_tokens"]))
        seconds.append(s)
        if system.kind == "llama":
            timings = resp.get("timings") or {}
            drafted += int(timings.get("draft_n", 0))
            accepted += int(timings.get("draft_n_accepted", 0))
        else:
            sd = resp.get("speculative_decoding") or {}
            drafted += int(sd.get("drafted_tokens", 0))
            accepted += int(sd.get("accepted_tokens", 0))
    threads: Any = None
    if system.kind == "llama":
        threads = int(system.args[system.args.index("-t") + 1])
    else:
        h = server.get("/health")[1]
        threads = h.get("threads") if isinstance(h, dict) else None
    return Served(
        system.name,
        workload,
        rnd,
        texts,
        tokens,
        seconds,
        drafted,
        accepted,
        resident_memory(server.proc.pid),
        round(server.ready_s, 2),
        (round(load, 2), round(os.getloadavg()[0], 2)),
        threads,
    )


def chat_requests(model: str, workload: str, n: int, max_tokens: int) -> list[Request]:
    """The first ``n`` requests of ``workload`` for ``model`` that fit its context (at most llama-server's
    ``-c``), as chat messages."""
    tokenizer = _tokenizer(model)
    context = LLAMA_CONTEXT
    if _gguf_model(model) is None:  # a folder or an embedded model: its own context may be shorter
        from transformers import AutoConfig

        from suffixspec.loading import max_context, resolve_model_path

        context = min(context, max_context(AutoConfig.from_pretrained(resolve_model_path(model))))
    reqs, _ = build(workload, tokenizer, n, max_tokens, context - max_tokens - 1)
    chats = [r for r in reqs if r.messages is not None]
    if len(chats) < len(reqs):
        raise ValueError(
            f"workload {workload!r} has completion prompts, not chat messages: choose a chat workload"
        )
    return chats


def _gguf_model(model: str) -> Any:
    from suffixspec.models import gguf_source

    return gguf_source(model)


def run(
    model: str,
    systems: list[str],
    workloads: list[str],
    n: int,
    max_tokens: int,
    rounds: int,
    weights: list[str],
    llama_server: str | None = None,
    draft_model: str | None = "auto",
    llama_threads: int = LLAMA_THREADS,
    log=print,
) -> dict[str, Any]:
    """Every system over every workload, ``rounds`` times interleaved; the runs and the summary rows."""
    from suffixspec.models import default_draft

    draft = (
        default_draft(model)
        if draft_model == "auto"
        else (None if draft_model in (None, "none") else draft_model)
    )
    skipped: list[str] = []
    binary = llama_server_binary(llama_server)
    wanted_llama = [s for s in systems if s in LLAMA_SYSTEMS]
    gguf = gguf_file(model) if wanted_llama else None
    draft_gguf = gguf_file(draft) if draft and any(s in LLAMA_DRAFT_SYSTEMS for s in systems) else None
    for s in wanted_llama:
        why = None
        if binary is None:
            why = f"no llama-server binary (--llama-server PATH or ${LLAMA_SERVER_ENV}; docs/llama_cpp.md)"
        elif gguf is None:
            why = f"{model} has no GGUF file for llama-server"
        elif s in LLAMA_DRAFT_SYSTEMS and draft_gguf is None:
            why = f"{model} has no draft model with a GGUF file"
        if why:
            log(f"skipping {s}: {why}")
            skipped.append(f"{s}: {why}")
            systems = [x for x in systems if x != s]
    if "ours_all" in systems and not draft:
        why = f"{model} has no draft model: ours_suffix has every drafter"
        log(f"skipping ours_all: {why}")
        skipped.append(f"ours_all: {why}")
        systems = [x for x in systems if x != "ours_all"]
    plan = make_systems(systems, weights, model, draft, gguf, draft_gguf, llama_threads, LLAMA_CONTEXT)
    requests = {w: chat_requests(model, w, n, max_tokens) for w in workloads}
    warm = Request("", 8, messages=[{"role": "user", "content": "Say hello."}])
    runs: list[Served] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="suffixspec-servers-") as tmp:
        for rnd in range(1, rounds + 1):
            for system in plan:
                log(f"round {rnd}: {system.name}")
                server = start(system, Path(tmp), binary)
                try:
                    server.chat(
                        {
                            "model": "suffixspec",
                            "messages": warm.messages,
                            "max_tokens": 8,
                            "temperature": 0,
                            **system.extra,
                        }
                    )
                    for w, reqs in requests.items():
                        got = serve_workload(server, system, w, rnd, reqs)
                        runs.append(got)
                        log(
                            f"  {w}: {sum(got.tokens)} tokens in {sum(got.seconds):.1f} s "
                            f"({sum(got.tokens) / sum(got.seconds):.1f} tokens/s), rss {got.memory_gb['rss']:.2f} GiB, "
                            f"load {got.load[0]:.1f}-{got.load[1]:.1f}"
                        )
                finally:
                    server.stop()
    tokenizer = _tokenizer(model)
    rows = summarize(runs, [s.name for s in plan], tokenizer)
    meta = {
        "model": model,
        "draft_model": draft,
        "gguf": str(gguf) if gguf else None,
        "draft_gguf": str(draft_gguf) if draft_gguf else None,
        "llama_server": str(binary) if binary else None,
        "llama_threads": llama_threads,
        "llama_context": LLAMA_CONTEXT,
        "rounds": rounds,
        "requests": n,
        "max_tokens": max_tokens,
        "workloads": workloads,
        "weights": weights,
        "temperature": 0.0,
        "history": False,
        "seconds": round(time.perf_counter() - started, 1),
        "cpus": os.cpu_count(),
        "default_weights": _default_weights(model),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    return {"meta": meta, "skipped": skipped, "rows": rows, "runs": [asdict(r) for r in runs]}


def _default_weights(model: str) -> str:
    """What ``--weights auto`` (the default) resolves to for ``model`` on this machine's CPU."""
    from suffixspec.core.formats import resolve

    return resolve("auto", "cpu", model=model)


def _tokenizer(model: str) -> Any:
    """The model's tokenizer (for prompts that fit, and loop shares): a GGUF model's from its tokenizer alone
    (no float32 conversion of its weights when only llama-server runs it), any other model's own."""
    if _gguf_model(model) is not None:
        from suffixspec.runtimes.llama_cpp.model import gguf_tokenizer

        return gguf_tokenizer(model, progress=False)
    from suffixspec.loading import load_tokenizer

    return load_tokenizer(model)


def _tps(rs: list[Served]) -> list[float]:
    return [sum(r.tokens) / sum(r.seconds) for r in rs if sum(r.seconds) > 0]


def summarize(runs: list[Served], order: list[str], tokenizer: Any) -> list[dict[str, Any]]:
    """One row per workload and system (see the module docstring for the columns)."""
    rows = []
    for w in dict.fromkeys(r.workload for r in runs):
        by = {s: [r for r in runs if r.workload == w and r.system == s] for s in order}
        by = {s: rs for s, rs in by.items() if rs}
        med = {s: statistics.median(_tps(rs)) for s, rs in by.items()}
        llama = [s for s in by if s in LLAMA_SYSTEMS]
        best = max(llama, key=lambda s: med[s]) if llama else None
        ours_off = [s for s in by if s.startswith("ours_off@")]
        for s, rs in by.items():
            first = rs[0]
            base_off = f"ours_off@{s.split('@', 1)[1]}" if "@" in s else (ours_off[0] if ours_off else None)
            ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in first.texts]
            row = {
                "workload": w,
                "system": s,
                "requests": len(first.texts),
                "rounds": len(rs),
                "tokens_per_s": round(med[s], 2),
                "tokens_per_s_rounds": [round(x, 2) for x in _tps(rs)],
                "tokens": sum(first.tokens),
                "vs_llama_plain": (
                    round(med[s] / med["llama_server_plain"], 3) if "llama_server_plain" in med else None
                ),
                "vs_llama_best": round(med[s] / med[best], 3) if best else None,
                "llama_best": best,
                "identical_llama_plain": _same(first.texts, by.get("llama_server_plain")),
                "identical_ours_off": _same(first.texts, by.get(base_off) if base_off else None),
                "ours_off": base_off,
                "same_every_round": all(r.texts == first.texts for r in rs),
                "loop_share": round(statistics.mean(loop_share(t) for t in ids), 3) if ids else 0.0,
                "looping_outputs": sum(loop_share(t) >= LOOPING for t in ids),
                "drafted": first.drafted,
                "accepted": first.accepted,
                "rss_gb": max(r.memory_gb["rss"] for r in rs),
                "rss_anon_gb": max(r.memory_gb["anon"] for r in rs),
                "rss_file_gb": max(r.memory_gb["file"] for r in rs),
                "ready_s": statistics.median(r.ready_s for r in rs),
                "threads": first.threads,
                "load": [min(r.load[0] for r in rs), max(r.load[1] for r in rs)],
            }
            rows.append(row)
    return rows


def _same(texts: list[str], other: list[Served] | None) -> str | None:
    """ "k/n": how many of ``texts`` equal the other system's first-round outputs (None without it)."""
    if not other:
        return None
    theirs = other[0].texts
    return f"{sum(a == b for a, b in zip(texts, theirs, strict=True))}/{len(texts)}"


def _threads_text(t: Any) -> str:
    if isinstance(t, dict):
        return f"{t.get('threads')} ({t.get('how', '?')})"
    return str(t)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | system | tokens/s | vs llama plain | vs llama best | = llama plain | = ours off | "
        "loops | RSS GiB (anon + file) | threads | load |",
        "|---|---|---:|---:|---:|:---:|:---:|---:|---:|---|---|",
    ]
    for r in rows:
        f = lambda x: f"{x:.2f}x" if x is not None else "—"  # noqa: E731
        lines.append(
            f"| {r['workload']} | {r['system']} | {r['tokens_per_s']:.1f} | {f(r['vs_llama_plain'])} | "
            f"{f(r['vs_llama_best'])} | {r['identical_llama_plain'] or '—'} | {r['identical_ours_off'] or '—'} | "
            f"{r['looping_outputs']}/{r['requests']} | {r['rss_gb']:.2f} ({r['rss_anon_gb']:.2f} + "
            f"{r['rss_file_gb']:.2f}) | {_threads_text(r['threads'])} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--draft-model",
        default="auto",
        help="our ours_all's draft model and llama-server's -md (auto: the shipped one; none)",
    )
    ap.add_argument("--systems", default=",".join(LLAMA_SYSTEMS + OUR_MODES))
    ap.add_argument(
        "--weights",
        default="float32",
        help="our weight formats, comma-separated (each ours_* system runs at each)",
    )
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--llama-server", default=None, help=f"the llama-server binary (default: ${LLAMA_SERVER_ENV})"
    )
    ap.add_argument("--llama-threads", type=int, default=LLAMA_THREADS)
    ap.add_argument("--out", type=Path, default=Path("bench-servers"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: the server running now is stopped too
    result = run(
        args.model,
        args.systems.split(","),
        args.workloads.split(","),
        args.requests,
        args.max_tokens,
        args.rounds,
        args.weights.split(","),
        args.llama_server,
        args.draft_model,
        args.llama_threads,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "servers.json").write_text(json.dumps(result, indent=1))
    table = markdown(result["rows"])
    load = [r["load"] for r in result["rows"]]
    head = (
        f"{result['meta']['model']}, {args.requests} requests per workload, {args.max_tokens} tokens at most, "
        f"{args.rounds} rounds; load {min(x[0] for x in load):.1f}-{max(x[1] for x in load):.1f}\n\n"
        if load
        else ""
    )
    (args.out / "servers.md").write_text(head + table + "".join(f"\nskipped {s}" for s in result["skipped"]))
    print(head + table)
    for s in result["skipped"]:
        print(f"skipped {s}")


if __name__ == "__main__":
    main()
