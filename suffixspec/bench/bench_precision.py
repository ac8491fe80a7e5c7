"""Reduced precision against plain decoding: how often outputs differ, and whether rounding explains it.

A verify pass over ``1 + k`` tokens and a one-token step compute the same logits in different shapes,
so they round differently (no kernel here is batch-invariant); so do our lean forward and
``transformers``' own. In float32 the difference is about 1e-6 of a logit and flips a greedy token only
at a near-exact tie; in bfloat16 (8 bits of mantissa) and float16 (11) it is thousands of times larger.
This measures, per dtype on the CPU, for the same requests (``suffixspec.bench.workloads``, real text):

- ``ours vs generate``: our engine with speculation off against ``transformers`` ``generate``, greedy;
- ``spec vs plain``: speculation on (the request's ``prediction`` = its plain output, token for token,
  so most passes verify long drafts; the engine's gates on) against speculation off, greedy;
- ``seeded spec vs plain``: the same at temperature 1 with a seed (the exponential race).

Per pair: runs, runs whose outputs differ, tokens compared (up to the first difference or the end),
differences per 1,000 tokens compared (the hazard), the draft tokens accepted (spec runs), and at each
first difference the *gap*: how far apart the two paths' tokens are in the model's own forward over
the common prefix (greedy: the difference of their logits; seeded: of their race scores
``log p - log E``), in units of the dtype's epsilon times the largest logit. A gap of a few units is a
near-tie that rounding flips; a large gap would be a bug, in any dtype.

    python -m suffixspec.bench.bench_precision --model smollm2-135m-instruct [--dtypes float32,bfloat16,float16]
        [--requests 12] [--max-tokens 64] [--json out.json]

One torch thread; history off; the prompt-prefix store off.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

WORKLOADS = ("code_edit", "agentic", "open_ended")
PAIRS = ("ours vs generate", "spec vs plain", "seeded spec vs plain")


@dataclass
class PairStats:
    """The comparisons of one pair of paths in one dtype."""

    runs: int = 0  # outputs compared
    differ: int = 0  # outputs that are not identical
    tokens: int = 0  # tokens compared, each run up to its first difference (or its end)
    accepted: int = 0  # draft tokens accepted (spec runs): how much of the output came from verify passes
    gaps: list[float] = field(default_factory=list)  # at each first difference, in eps x largest |logit|

    def row(self) -> dict[str, Any]:
        return {"runs": self.runs, "differ": self.differ, "tokens": self.tokens,
                "per_1000_tokens": round(1000 * self.differ / max(1, self.tokens), 2),
                "accepted_share": round(self.accepted / max(1, self.tokens), 3) if self.accepted else None,
                "largest_gap_eps": round(max(self.gaps), 2) if self.gaps else None}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ (one ending early counts), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def gap(model: Any, prompt: list[int], out: list[int], other: list[int], at: int, seed: int | None,
        vocab: int) -> float:
    """How far apart ``out[at]`` and ``other[at]`` are after ``prompt + out[:at]`` in the model's own
    forward: logits (greedy) or race scores (seeded, temperature 1), over eps x largest |logit|."""
    from suffixspec.core.sampling import PositionRNG

    if at >= len(out) or at >= len(other):
        return float("nan")  # one run ended (EOS or length): nothing to compare at that position
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + out[:at]])).logits[0, -1, :vocab].double()
    a, b = out[at], other[at]
    score = logits
    if seed is not None:
        noise = PositionRNG(seed).race(at, vocab).double()
        score = torch.log_softmax(logits, -1) - torch.log(noise)
    eps = torch.finfo(model.dtype).eps
    return abs(float(score[a] - score[b])) / (eps * float(logits.abs().max()))


def generate_hf(model: Any, prompt: list[int], max_tokens: int, eos: int | None) -> list[int]:
    """``transformers`` greedy ``generate``, stopping at ``eos`` as our engine does (None: never stopping)."""
    import copy

    config = copy.deepcopy(model.generation_config)
    config.update(do_sample=False, num_beams=1, top_k=None, top_p=None, temperature=None, max_new_tokens=max_tokens,
                  eos_token_id=eos, pad_token_id=0 if eos is None else eos)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt):].tolist()


def generate_ours(engine: Any, prompt: list[int], sampling: Any, prediction: list[int] | None) -> Any:
    """Our engine: speculation off (``prediction`` None), or on with the prompt and ``prediction`` (token ids,
    exactly as given) as drafters, the gates on."""
    from suffixspec.config import SpeculationConfig

    spec: Any = False if prediction is None else SpeculationConfig(drafters=("prompt",))
    request, spec = engine.prepare(prompt, sampling, spec)
    request.prediction_ids = prediction
    for ev in engine.scheduler.stream(engine.state_maker(request, spec, None), None, request.prompt_ids):
        if ev.result is not None:
            return ev.result
    raise RuntimeError("the stream ended without a result")


def measure(model_name: str, dtype: str, n: int, max_tokens: int, log=print) -> dict[str, Any]:
    from suffixspec.bench.workloads import build
    from suffixspec.config import SamplingParams
    from suffixspec.drafting.proposers.suffix import SuffixProposer
    from suffixspec.loading import load_model
    from suffixspec.runtimes.engine import Engine

    lm = load_model(model_name, device="cpu", dtype=dtype)
    engine = Engine(lm, [SuffixProposer(tokenizer=lm.tokenizer, history=False)], prefix_cache_mb=0)
    eos = lm.tokenizer.eos_token_id
    context = int(getattr(lm.model.config, "max_position_embeddings", 2048))
    per = [build(w, lm.tokenizer, n, max_tokens, context - max_tokens - 1)[0] for w in WORKLOADS]
    requests = [r for group in zip(*per, strict=False) for r in group]  # the workloads taking turns
    stats = {pair: PairStats() for pair in PAIRS}
    greedy = SamplingParams(max_tokens=max_tokens)
    t0 = time.perf_counter()
    for i, req in enumerate(requests[: n]):
        prompt = engine.encode(req.prompt)
        hf = generate_hf(lm.model, prompt, max_tokens, eos)
        plain = generate_ours(engine, prompt, greedy, None)
        spec = generate_ours(engine, prompt, greedy, plain.token_ids)
        seeded = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i)
        s_plain = generate_ours(engine, prompt, seeded, None)
        s_spec = generate_ours(engine, prompt, seeded, s_plain.token_ids)
        for pair, ref, other, seed, accepted in (
                ("ours vs generate", hf, plain.token_ids, None, 0),
                ("spec vs plain", plain.token_ids, spec.token_ids, None, spec.stats.accepted_tokens),
                ("seeded spec vs plain", s_plain.token_ids, s_spec.token_ids, i, s_spec.stats.accepted_tokens)):
            st = stats[pair]
            at = first_difference(ref, other)
            st.runs += 1
            st.tokens += len(ref) if at is None else at + 1
            st.accepted += accepted
            if at is not None:
                st.differ += 1
                st.gaps.append(gap(lm.model, prompt, ref, other, at, seed, engine.vocab_size))
        log(f"{dtype} request {i + 1}/{min(n, len(requests))} ({time.perf_counter() - t0:.0f} s)")
    return {pair: st.row() for pair, st in stats.items()}


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| dtype | pair | runs | differ | tokens compared | per 1,000 tokens | drafted share | largest gap (eps) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for dtype, pairs in results.items():
        for pair, r in pairs.items():
            share = "–" if r["accepted_share"] is None else f"{100 * r['accepted_share']:.0f}%"
            big = "–" if r["largest_gap_eps"] is None else f"{r['largest_gap_eps']:.1f}"
            lines.append(f"| {dtype} | {pair} | {r['runs']} | {r['differ']} | {r['tokens']} | "
                         f"{r['per_1000_tokens']:.1f} | {share} | {big} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    results = {dt: measure(args.model, dt, args.requests, args.max_tokens) for dt in args.dtypes.split(",")}
    print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
    print(markdown(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "max_tokens": args.max_tokens, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
