"""Context length (MagicDec's question): speedup and tokens per forward as the prompt grows.

Code-edit and RAG requests from the sources of :mod:`suffixspec.bench.workloads`, with a code window (or
documentation) of about ``L`` prompt tokens, for L from 256 up to the model's context limit (minus the generated tokens).
Each request runs greedy with speculation off and on (``ours_all``: suffix index + draft model),
seconds apart, with the engine's cost gates on; ratios are per request (median).

    python -m suffixspec.bench.bench_context [--lengths 256,512,1024,1920] [--requests 2] [--max-tokens 128]

The output history is off: the windows of one file overlap from length to length, and a history
would measure that repetition rather than the context.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path
from typing import Any

from suffixspec.bench.bench_sampled import OnOffBench, summarize
from suffixspec.bench.workloads.request import Request, chat
from suffixspec.bench.workloads.sources import code_files, doc_chunks, doc_files

CONTEXT_WORKLOADS = ("code_edit", "rag")


def window_tokens(text: str, tokenizer: Any, start_line: int, tokens: int) -> str:
    """Whole lines from ``start_line`` on, as many as fit in ``tokens`` target tokens (wrapping around)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    used = 0
    i = start_line
    while used < tokens and len(out) < 10 * len(lines):
        ln = lines[i % len(lines)]
        n = len(tokenizer.encode(ln, add_special_tokens=False))
        if used + n > tokens and out:
            break
        out.append(ln)
        used += n
        i += 1
    return "".join(out)


def build_at(
    name: str, tokenizer: Any, n: int, prompt_tokens: int, max_tokens: int, seed: int = 0
) -> tuple[list[Request], list[tuple[str, str]]]:
    """``n`` requests of workload ``name`` whose prompts are about ``prompt_tokens`` tokens long: a
    window of a large module of :data:`~suffixspec.bench.workloads.sources.CODE_PACKAGES` and a rename in it (code edit),
    or consecutive chunks of one file of the documentation set and a question on its first heading (RAG)."""
    rng = random.Random(f"context-{name}-{seed}")
    user = "{text}\n\nRename `{old}` to `{old}_v2` in the code above and reply with the whole edited code."
    if name == "code_edit":
        files = [(rel, f.read_text(encoding="utf-8")) for rel, f in code_files() if f.stat().st_size > 20_000]
    elif name == "rag":
        files = [(rel, text) for rel, text in doc_files() if len(text) > 20_000]
        user = "Documentation:\n\n{text}\n\nQuestion: what does the documentation above say about {old}?"
    else:
        raise ValueError(f"unknown context workload {name!r}; choose from {list(CONTEXT_WORKLOADS)}")
    rng.shuffle(files)
    reqs: list[Request] = []
    for rel, text in files[:n]:
        if name == "code_edit":
            lines = text.splitlines()
            start = next((i for i, ln in enumerate(lines) if ln.startswith(("def ", "class "))), 0)
            frame = len(
                tokenizer.encode(
                    chat(tokenizer, [{"role": "user", "content": user.format(text="", old="value")}])
                )
            )
            body = window_tokens(text, tokenizer, start, prompt_tokens - frame)
            words = sorted({w for w in body.replace("(", " ").split() if w.isidentifier() and len(w) > 3})
            old = words[len(words) // 2] if words else "value"
            reqs.append(
                Request(
                    chat(tokenizer, [{"role": "user", "content": user.format(text=body, old=old)}]),
                    max_tokens,
                )
            )
        else:
            chunks = [c for _, _, c in doc_chunks([(rel, text)])]
            topic = chunks[0].split("\n", 1)[0].lstrip("# ")
            frame = len(
                tokenizer.encode(
                    chat(tokenizer, [{"role": "user", "content": user.format(text="", old=topic)}])
                )
            )
            body = window_tokens("\n\n".join(chunks), tokenizer, 0, prompt_tokens - frame)
            reqs.append(
                Request(
                    chat(tokenizer, [{"role": "user", "content": user.format(text=body, old=topic)}]),
                    max_tokens,
                    references=[body],
                )
            )
    docs = files[:n] if name == "rag" else []
    return reqs, docs


def run(
    model: str,
    draft_model: str | None,
    lengths: tuple[int, ...] | None = None,
    n: int = 2,
    max_tokens: int = 128,
    workloads: tuple[str, ...] = CONTEXT_WORKLOADS,
    log=print,
) -> dict[str, Any]:
    from suffixspec.config import SamplingParams

    with OnOffBench(model, draft_model) as bench:
        engine = bench.engine
        limit = engine.max_context - max_tokens - 1
        if lengths is None:
            lengths = tuple(x for x in (256, 512, 1024, 2048, 4096, 8192) if x < limit) + (limit,)
        lengths = tuple(min(x, limit) for x in lengths)
        out: dict[str, Any] = {"context_limit": engine.max_context, "rows": {}}
        for w in workloads:
            for L in lengths:
                requests, docs = build_at(w, bench.target.tokenizer, n, L, max_tokens)
                runs = bench.cell(
                    f"{w}-{L}", requests, docs, lambda i: SamplingParams(max_tokens=max_tokens), history=False
                )
                row = {
                    "prompt_tokens": round(statistics.mean(len(engine.encode(r.prompt)) for r in requests)),
                    **summarize(runs),
                    "plain_tokens_per_s": round(sum(r.tokens for r in runs) / sum(r.off_s for r in runs), 1),
                }
                out["rows"].setdefault(w, {})[str(L)] = row
                log(
                    f"  {w:10s} L={L:5d} ({row['prompt_tokens']} tokens) speedup {row['speedup_median']:.2f}x "
                    f"tokens/forward {row['tokens_per_forward']:.2f} identical={row['identical']}"
                )
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| workload | prompt tokens | plain tok/s | speedup, wall (median, min–max) | speedup, CPU time | "
        "tokens/forward | identical |",
        "|---|---:|---:|---:|---:|---:|:---:|",
    ]
    for w, rows in result["rows"].items():
        for r in rows.values():
            lines.append(
                f"| {w} | {r['prompt_tokens']} | {r['plain_tokens_per_s']:.1f} | {r['speedup_median']:.2f}× "
                f"({r['speedup_min']:.2f}–{r['speedup_max']:.2f}) | {r['speedup_cpu_median']:.2f}× | "
                f"{r['tokens_per_forward']:.2f} | {'yes' if r['identical'] else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    for w, rows in result["rows"].items():
        xs = [r["prompt_tokens"] for r in rows.values()]
        a.plot(xs, [r["speedup_median"] for r in rows.values()], marker="o", label=w)
        b.plot(xs, [r["tokens_per_forward"] for r in rows.values()], marker="o", label=w)
    a.set_xlabel("prompt tokens")
    a.set_ylabel("speedup over plain (median)")
    b.set_xlabel("prompt tokens")
    b.set_ylabel("tokens per forward pass")
    a.axhline(1.0, color="black", linewidth=0.8)
    a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--draft-model",
        default="none",
        help="a draft model (any tokenizer); 'none' for the suffix index alone",
    )
    ap.add_argument(
        "--lengths", default=None, help="comma-separated prompt lengths (default 256, 512, 1024 ... limit)"
    )
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    draft = None if args.draft_model in ("", "none") else args.draft_model
    lengths = tuple(int(x) for x in args.lengths.split(",")) if args.lengths else None
    result = run(args.model, draft, lengths, args.requests, args.max_tokens)
    print(markdown(result))
    if args.json:
        args.json.write_text(
            json.dumps({"meta": {k: str(v) for k, v in vars(args).items()}, "results": result}, indent=2)
        )
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
