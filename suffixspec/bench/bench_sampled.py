"""Sampling, honestly: speculation on vs off at temperature 0.7 and 1.0 (top-p 0.95, fixed seeds).

Randomness is keyed by output position (docs/lossless.md, "The target's distribution"): with deterministic
drafts (suffix index, text-bridged draft model) a seeded request gives the same tokens with
speculation on and off, so the only difference is speed. Each request runs off, then on, seconds
apart (interleaved), with the engine's cost gates on and the prompt-prefix store off (each run
prefills its prompt); the table gives, per workload and temperature, whether every output is
identical, tokens per target forward pass, and the speed ratio on/off per request (median,
min-max; by CPU time also the total over the cell's requests, which load inflates least). Above 1 is a gain; below 1 is the overhead of
drafting where little can be drafted (the gates should keep it within 5%).

    python -m suffixspec.bench.bench_sampled --model DIR [--requests 8] [--max-tokens 128] [--temperatures 0.7,1.0] [--json out.json]
                                  [--draft-model NAME [--draft-tokens argmax|sampled]]

A same-vocabulary draft model drafts its argmax tokens by default here (``--draft-tokens argmax``: no ``q``, the
one-hot rule, so seeded outputs stay identical on and off); ``sampled`` draws them from its distribution
and reports ``q`` (``min(1, p/q)``: lossless in distribution, not token for token).

The on-runs keep one suffix proposer per cell, its output history off (as every benchmark here runs
it); off-runs call no proposer. One torch thread unless ``--threads``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suffixspec.bench.workloads import build, index_documents
from suffixspec.bench.workloads.request import Request

TEMPERATURES = (0.7, 1.0)
SAMPLED_WORKLOADS = ("code_edit", "agentic", "rag", "open_ended")


@dataclass
class OnOff:
    """One request run with speculation off and on."""

    off_s: float  # seconds, speculation off (prefill included)
    on_s: float  # seconds, speculation on
    off_cpu_s: float  # CPU seconds of this process, speculation off (what other jobs' load leaves out)
    on_cpu_s: float  # CPU seconds, speculation on
    identical: bool  # same token ids
    tokens: int  # tokens generated (on)
    forwards: int  # target forward passes with speculation on (verify steps + prefill)


def proposers_for(
    target: Any, draft: Any, documents: Any, history: bool = False, sample: bool = True
) -> list[Any]:
    """Our drafters as ``ours_all`` runs them: the suffix proposer, then the draft model if any (``sample``:
    a same-vocabulary draft samples its tokens and reports ``q``; False: its argmax tokens, no ``q``)."""
    from suffixspec.drafting.proposers.draft_model import DraftModelProposer, make_draft_proposer
    from suffixspec.drafting.proposers.suffix import SuffixProposer

    out: list[Any] = [SuffixProposer(tokenizer=target.tokenizer, documents=documents, history=history)]
    if draft is not None:
        proposer = make_draft_proposer(draft, target)
        if isinstance(proposer, DraftModelProposer):
            proposer.sample = sample
        out.append(proposer)
    return out


def on_off(engine: Any, proposers: list[Any], req: Request, sampling: Any) -> OnOff:
    """Run ``req`` with speculation off, then on (same sampling settings and seed)."""
    engine.proposers = []
    t, c = time.perf_counter(), time.process_time()
    off = engine.generate(engine.encode(req.prompt), sampling, False)
    off_s, off_cpu = time.perf_counter() - t, time.process_time() - c
    engine.proposers = proposers
    t, c = time.perf_counter(), time.process_time()
    on = engine.generate(
        engine.encode(req.prompt),
        sampling,
        True,
        references=req.references or None,
        prediction=req.prediction,
    )
    on_s, on_cpu = time.perf_counter() - t, time.process_time() - c
    return OnOff(
        off_s, on_s, off_cpu, on_cpu, off.token_ids == on.token_ids, len(on.token_ids), on.stats.steps + 1
    )


def summarize(runs: list[OnOff]) -> dict[str, Any]:
    """A table row: identical everywhere?, tokens per forward, speed ratios on/off (wall: median,
    min, max; CPU time: median, min, max, and total off / total on, the least noisy)."""
    ratios = [r.off_s / r.on_s for r in runs]
    cpu = [r.off_cpu_s / r.on_cpu_s for r in runs]
    return {
        "identical": all(r.identical for r in runs),
        "requests": len(runs),
        "speedup_cpu_median": round(statistics.median(cpu), 3),
        "speedup_cpu_min": round(min(cpu), 3),
        "speedup_cpu_max": round(max(cpu), 3),
        "speedup_cpu_total": round(
            sum(r.off_cpu_s for r in runs) / max(1e-9, sum(r.on_cpu_s for r in runs)), 3
        ),
        "tokens": sum(r.tokens for r in runs),
        "tokens_per_forward": round(sum(r.tokens for r in runs) / max(1, sum(r.forwards for r in runs)), 3),
        "speedup_median": round(statistics.median(ratios), 3),
        "speedup_min": round(min(ratios), 3),
        "speedup_max": round(max(ratios), 3),
    }


class OnOffBench:
    """What the on/off benchmarks share (this module's sampled cells, :mod:`suffixspec.bench.bench_context`'s
    prompt lengths): the target (and draft) loaded once, one engine warmed up by a plain step, a
    temporary folder where the cells' documents are indexed (once per set of documents); :meth:`cell`
    runs a cell's requests off, then on.

    Use it as a context manager (the folder is removed on exit)."""

    def __init__(self, model: str, draft_model: str | None, sample: bool = True) -> None:
        import torch

        from suffixspec.config import SamplingParams
        from suffixspec.loading import load_model
        from suffixspec.runtimes.engine import Engine

        self.target = load_model(model)
        self.draft = load_model(draft_model) if draft_model else None
        self.sample = sample  # a same-vocabulary draft model samples its tokens (reports q); False: argmax
        # every run prefills its whole prompt: with the prompt-prefix store on, the second run of a
        # request (speculation on) would reuse the first one's keys and values and look faster
        self.engine = Engine(
            self.target, prefix_cache_mb=0, threads=torch.get_num_threads()
        )  # as set in run()
        self.engine.generate(
            self.engine.encode("def main():\n    return 0\n"), SamplingParams(max_tokens=8), False
        )
        self._tmp = tempfile.TemporaryDirectory()

    def __enter__(self) -> OnOffBench:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tmp.cleanup()

    def cell(
        self,
        name: str,
        requests: list[Request],
        docs: list[tuple[str, str]],
        sampling: Callable[[int], Any],
        history: bool = False,
    ) -> list[OnOff]:
        """Each request off, then on, with fresh proposers for the cell (``sampling(i)``: request i's
        settings); ``docs`` are indexed first, in a folder of their own."""
        documents = index_documents(self.target.tokenizer, docs, Path(self._tmp.name))  # once per run
        proposers = proposers_for(self.target, self.draft, documents, history=history, sample=self.sample)
        return [on_off(self.engine, proposers, req, sampling(i)) for i, req in enumerate(requests)]


def run(
    model: str,
    draft_model: str | None,
    workloads: tuple[str, ...] = SAMPLED_WORKLOADS,
    temperatures: tuple[float, ...] = TEMPERATURES,
    n: int = 8,
    max_tokens: int = 128,
    top_p: float = 0.95,
    log=print,
    threads: int = 1,
    draft_tokens: str = "argmax",
) -> dict[str, Any]:
    import torch

    from suffixspec.config import SamplingParams

    if draft_tokens not in ("argmax", "sampled"):
        raise ValueError(f"draft_tokens is 'argmax' or 'sampled', got {draft_tokens!r}")
    if threads:
        torch.set_num_threads(threads)
    results: dict[str, Any] = {}
    with OnOffBench(model, draft_model, sample=draft_tokens == "sampled") as bench:
        for w in workloads:
            requests, docs = build(w, bench.target.tokenizer, n, max_tokens)
            for temp in temperatures:
                row = summarize(
                    bench.cell(
                        f"{w}-{temp}",
                        requests,
                        docs,
                        lambda i, t=temp: SamplingParams(
                            max_tokens=max_tokens, temperature=t, top_p=top_p, seed=1000 + i
                        ),
                    )
                )
                results.setdefault(w, {})[str(temp)] = row
                log(
                    f"  {w:12s} T={temp:<4} identical={row['identical']} tokens/forward={row['tokens_per_forward']:.2f} "
                    f"on/off speed={row['speedup_median']:.2f}x ({row['speedup_min']:.2f}-{row['speedup_max']:.2f}), "
                    f"CPU {row['speedup_cpu_total']:.2f}x"
                )
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| workload | temperature | identical on/off | tokens/forward (on) | speed on/off, wall (median, min–max) | "
        "speed on/off, CPU time (total; median, min–max) |",
        "|---|---:|:---:|---:|---:|---:|",
    ]
    for w, rows in results.items():
        for temp, r in rows.items():
            lines.append(
                f"| {w} | {temp} | {'yes' if r['identical'] else 'NO'} | {r['tokens_per_forward']:.2f} | "
                f"{r['speedup_median']:.2f}× ({r['speedup_min']:.2f}–{r['speedup_max']:.2f}) | "
                f"{r['speedup_cpu_total']:.2f}×; {r['speedup_cpu_median']:.2f}× "
                f"({r['speedup_cpu_min']:.2f}–{r['speedup_cpu_max']:.2f}) |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--draft-model",
        default="none",
        help="a draft model (any tokenizer); 'none' for the suffix index alone",
    )
    ap.add_argument("--workloads", default=",".join(SAMPLED_WORKLOADS))
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--temperatures",
        default=",".join(map(str, TEMPERATURES)),
        help="comma-separated; 1.5 on open_ended is the stress cell where nothing is accepted",
    )
    ap.add_argument(
        "--draft-tokens",
        choices=("argmax", "sampled"),
        default="argmax",
        help="a same-vocabulary draft model's tokens: its argmax (no q: seeded outputs identical on and "
        "off) or sampled from it with q (min(1, p/q))",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    draft = None if args.draft_model in ("", "none") else args.draft_model
    temps = tuple(float(t) for t in args.temperatures.split(","))
    results = run(
        args.model,
        draft,
        tuple(args.workloads.split(",")),
        temps,
        n=args.requests,
        max_tokens=args.max_tokens,
        threads=args.threads,
        draft_tokens=args.draft_tokens,
    )
    print(markdown(results))
    if args.json:
        args.json.write_text(
            json.dumps({"meta": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
