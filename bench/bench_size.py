"""Model size: verify cost of k draft tokens relative to one plain step, and the speedup it implies.

A PROJECTION, not a measurement of speedup. For random-weight Llama models of about 10M, 100M and
500M parameters (weights do not change the time of a forward pass), it measures on this machine
the CPU time (one thread) of one forward pass over ``1 + k`` tokens with the tree mask (a chain draft), k = 0
(a plain decode step) .. 32, at a fixed context length, rounds interleaved so that machine load
hits every k alike, medians. Then, for each workload's measured drafting figures (mean accepted
length ``a`` = new tokens per verify step, mean draft size ``k`` = nodes verified per step, from
the deterministic replay of :mod:`bench.bench_drafting`), it computes

    projected speedup = a * t(1) / t(1 + k)

(``t(1 + k)`` interpolated between the measured sizes): a plain step yields one token in t(1), a
speculative step ``a`` tokens in t(1 + k). It ignores proposal time (microseconds to a
millisecond per step), prefill (the same for both), and the engine's gate (which would skip drafts
that do not pay: the projection is a lower bound where drafts are weak and verification costly).

    python -m bench.bench_size [--sizes 10M,100M,500M] [--seconds 60] [--drafting drafting.json]
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import time
from pathlib import Path
from typing import Any

# name -> (hidden, layers, intermediate, heads); vocabulary 8192 (the embedded target's)
SIZES: dict[str, tuple[int, int, int, int]] = {
    "10M": (256, 6, 1024, 8),
    "100M": (768, 12, 2048, 12),
    "500M": (1280, 24, 3584, 20),
}
KS = (0, 1, 2, 4, 8, 16, 24, 32)


def random_llama(size: str, vocab: int = 8192, max_positions: int = 2048) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, inter, heads = SIZES[size]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_positions,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = LlamaForCausalLM(cfg)
    return model.eval()


def verify_costs(model: Any, context_len: int = 512, ks: tuple[int, ...] = KS, seconds: float = 60.0,
                 min_rounds: int = 3, max_rounds: int = 15) -> dict[str, Any]:
    """Median CPU seconds of one forward over ``1 + k`` tokens after ``context_len`` cached tokens.

    Torch runs on one thread and the forward is timed by that thread's CPU clock: on a shared,
    loaded machine wall time measures the other jobs (and idle intra-op threads spin-waiting for a
    descheduled sibling), CPU time measures the work."""
    import torch
    from transformers import DynamicCache

    from suffixspec.kv import keep_accepted, tree_inputs

    ctx = [(7 * i) % 8000 + 3 for i in range(context_len)]
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ctx]), past_key_values=cache, use_cache=True)

    def once(k: int) -> float:
        ids = [5, *range(10, 10 + k)]
        kwargs: dict[str, Any] = {"past_key_values": cache, "use_cache": True}
        if k:
            kwargs["attention_mask"], kwargs["position_ids"] = tree_inputs(list(range(-1, k - 1)), context_len,
                                                                           model.dtype, "cpu")
        t = time.thread_time()
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids]), **kwargs)
        dt = time.thread_time() - t
        keep_accepted(cache, context_len, [])
        return dt

    once(0)
    once(max(ks))  # warm-up
    times: dict[int, list[float]] = {k: [] for k in ks}
    start = time.perf_counter()
    rounds = 0
    while rounds < max_rounds and (rounds < min_rounds or time.perf_counter() - start < seconds):
        order = list(ks) if rounds % 2 == 0 else list(reversed(ks))
        for k in order:
            times[k].append(once(k))
        rounds += 1
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"plain_step_ms": round(1e3 * med[0], 3), "rounds": rounds,
            "relative": {k: round(med[k] / med[0], 3) for k in ks if k}}


def relative_at(relative: dict[int, float], k: float) -> float:
    """t(1 + k) / t(1) interpolated linearly between the measured draft sizes (1.0 at k = 0)."""
    xs = [0, *sorted(relative)]
    ys = [1.0] + [relative[x] for x in xs[1:]]
    if k >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, k)
    lo, hi = xs[i - 1], xs[i]
    w = (k - lo) / (hi - lo)
    return (1 - w) * ys[i - 1] + w * ys[i]


def project(costs: dict[str, Any], drafting: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Projected speedup per size and workload: ``a / (t(1 + k) / t(1))``."""
    out: dict[str, dict[str, float]] = {}
    for size, c in costs.items():
        rel = {int(k): v for k, v in c["relative"].items()}
        out[size] = {w: round(d["mean_accepted_length"] / relative_at(rel, d["mean_draft"]), 2)
                     for w, d in drafting.items()}
    return out


def drafting_figures(path: Path | None) -> dict[str, dict[str, float]]:
    """``ours_all`` (periodic on) per workload from a ``bench_drafting --json`` file."""
    if path is None or not path.exists():
        return {}
    data = json.loads(path.read_text())["results"]
    return {w: {"mean_accepted_length": rows["on"]["ours_all"]["mean_accepted_length"],
                "mean_draft": rows["on"]["ours_all"]["mean_draft"]} for w, rows in data.items()}


def markdown(costs: dict[str, Any], projection: dict[str, dict[str, float]], drafting: dict[str, Any]) -> str:
    ks = [k for k in KS if k]
    lines = ["| model | parameters | plain step ms | " + " | ".join(f"k={k}" for k in ks) + " |",
             "|---|---:|---:|" + "---:|" * len(ks)]
    for size, c in costs.items():
        lines.append(f"| random Llama {size} | {c['params'] / 1e6:.0f}M | {c['plain_step_ms']:.1f} | "
                     + " | ".join(f"{c['relative'].get(k, c['relative'].get(str(k), 0.0)):.2f}" for k in ks) + " |")
    if projection:
        ws = list(drafting)
        lines += ["", "| model | " + " | ".join(f"{w} (a={drafting[w]['mean_accepted_length']:.1f}, "
                                                 f"k={drafting[w]['mean_draft']:.1f})" for w in ws) + " |",
                  "|---|" + "---:|" * len(ws)]
        for size, row in projection.items():
            lines.append(f"| {size} | " + " | ".join(f"{row[w]:.2f}×" for w in ws) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10M,100M,500M")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=60.0, help="time budget per model (at least --rounds rounds)")
    ap.add_argument("--rounds", type=int, default=3, help="fewest rounds of every k per model")
    ap.add_argument("--drafting", type=Path, default=None, help="bench_drafting --json output (for the projection)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)  # see verify_costs
    costs: dict[str, Any] = {}
    for size in args.sizes.split(","):
        model = random_llama(size)
        params = sum(p.numel() for p in model.parameters())
        c = verify_costs(model, args.context, seconds=args.seconds, min_rounds=args.rounds)
        c["params"] = params
        costs[size] = c
        print(f"  {size}: {params / 1e6:.1f}M parameters, plain step {c['plain_step_ms']:.1f} ms, "
              f"{c['rounds']} rounds, relative {c['relative']}", flush=True)
        del model
        _write(args, costs)  # after every model, so a run cut short keeps what it measured


def _write(args: argparse.Namespace, costs: dict[str, Any]) -> None:
    import torch

    drafting = drafting_figures(args.drafting)
    projection = project(costs, drafting) if drafting else {}
    print(f"({torch.get_num_threads()} threads, context {args.context})")
    print(markdown(costs, projection, drafting))
    if args.json:
        args.json.write_text(json.dumps({"meta": {k: str(v) for k, v in vars(args).items()}, "costs": costs,
                                         "drafting": drafting, "projection": projection}, indent=2))


if __name__ == "__main__":
    main()
