"""A draft model on its real target, measured the way the issue asks: open-ended chat (the 10 benchmark
prompts of :data:`suffixspec.training.distill.EVAL_IDS`), greedy, history off, side by side with plain
decoding, systems interleaved per prompt, CPU time of the generating thread (one torch thread).

Also, with ``--costs``: the target's verify cost ``t(n)`` (n = 1 + draft tokens, context ~400) and the
draft's cost per drafted token, interleaved, and the break-even acceptance they imply: a chain of ``k``
draft tokens each accepted with probability ``a`` (given the previous ones) yields
``1 + a + ... + a^k`` tokens for ``t(1 + k) + k * c`` seconds, against one token per ``t(1)``.

Worked example: t(1) = 70 ms, t(4) = 90 ms, c = 3 ms, k = 3: break-even where
``(1 + a + a^2 + a^3) * 70 = 99`` -> a = 0.31; 1.25x needs ``1 + a + a^2 + a^3 = 1.77`` -> a = 0.51.

    python -m suffixspec.training.measure_draft --target /work/models/smollm2-135m-instruct \\
        --draft suffixspec/default_models/smollm2-shallow-draft [--tokens 128] [--costs] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch


def load_draft(path: str, target: Any) -> tuple[Any, Any]:
    """(LoadedModel, proposer) for a draft folder: a shallow draft borrows the target's embedding and
    head; any other model goes through ``make_draft_proposer`` (same vocabulary or the bridge)."""
    from suffixspec.loading import load_model
    from suffixspec.proposers.draft_model import make_draft_proposer
    from suffixspec.proposers.shallow_draft import ShallowDraftProposer, is_shallow_draft, load_shallow_draft

    from ..loading import resolve_model_path

    folder = resolve_model_path(path)
    if is_shallow_draft(folder):
        draft = load_shallow_draft(folder, target)
        width = int(target.model.get_output_embeddings().weight.shape[0])
        return draft, ShallowDraftProposer(draft, target_vocab_size=width)
    draft = load_model(path, device="cpu")
    return draft, make_draft_proposer(draft, target)


def run_systems(engine: Any, prompts: list[list[int]], systems: dict[str, Any], tokens: int) -> dict:
    """Each prompt through every system, the order rotating per prompt; per system the CPU seconds of
    this thread, tokens, forward passes, per-position acceptance, and whether it equals plain."""
    from suffixspec.config import SamplingParams, SpeculationConfig

    names = list(systems)
    out = {n: {"cpu_s": 0.0, "wall_s": 0.0, "tokens": 0, "steps": 0, "drafted_pos": [], "accepted_pos": [],
               "identical": 0, "propose_s": 0.0} for n in names}
    plain_ids: dict[int, list[int]] = {}
    sp = SamplingParams(max_tokens=tokens)
    for i, ids in enumerate(prompts):
        order = names[i % len(names):] + names[: i % len(names)]
        results = {}
        for name in order:
            proposers, spec = systems[name]
            engine.proposers = list(proposers)
            wall, cpu = time.perf_counter(), time.thread_time()
            res = engine.generate(ids, sp, spec if spec is not None else SpeculationConfig(enabled=False))
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            results[name] = res
            o = out[name]
            o["cpu_s"] += cpu
            o["wall_s"] += wall
            o["tokens"] += len(res.token_ids)
            o["steps"] += res.stats.steps
            o["propose_s"] += res.stats.time_propose_s
            for key, src in (("drafted_pos", res.stats.drafted_per_position),
                             ("accepted_pos", res.stats.accepted_per_position)):
                o[key] += [0] * (len(src) - len(o[key]))
                for d, v in enumerate(src):
                    o[key][d] += v
        plain_ids[i] = results[names[0]].token_ids
        for name in names:
            out[name]["identical"] += int(results[name].token_ids == plain_ids[i])
        print(f"prompt {i}: " + ", ".join(f"{n} {len(results[n].token_ids)} tok {results[n].stats.steps} passes"
                                           for n in names) + f"; load {os.getloadavg()[0]:.1f}", flush=True)
    engine.proposers = []
    base = out[names[0]]
    for o in out.values():
        o["cpu_tokens_per_s"] = o["tokens"] / o["cpu_s"]
        o["cpu_ratio_vs_plain"] = (o["tokens"] / o["cpu_s"]) / (base["tokens"] / base["cpu_s"])
        o["tokens_per_pass"] = o["tokens"] / max(1, o["steps"])
        o["accept_per_position"] = [round(a / d, 3) if d else None for a, d in zip(
            o["accepted_pos"] + [0] * (len(o["drafted_pos"]) - len(o["accepted_pos"])), o["drafted_pos"])]
    return out


@torch.inference_mode()
def verify_costs(target: Any, sizes: tuple[int, ...], rounds: int, context: int = 400) -> dict[int, float]:
    """Median CPU seconds of one target pass over ``n`` new tokens (a chain) after ``context`` cached ones."""
    from suffixspec.kv import new_cache, tree_inputs

    model = target.model
    cache = new_cache(model.config)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(100, int(model.config.vocab_size) - 100, (1, context), generator=g)
    model(input_ids=ctx, cache=cache, use_cache=True)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds):
        for n in sizes:
            ids = torch.randint(100, 10_000, (1, n), generator=g)
            kwargs: dict[str, Any] = {"cache": cache, "use_cache": True}
            if n > 1:
                kwargs["attention_mask"], kwargs["position_ids"] = tree_inputs(list(range(-1, n - 2)), context,
                                                                                 model.dtype, "cpu")
            c = time.thread_time()
            model(input_ids=ids, **kwargs)
            times[n].append(time.thread_time() - c)
            cache.crop(-n)
    return {n: statistics.median(v) for n, v in times.items()}


def draft_cost(proposer: Any, context: list[int], rounds: int) -> float:
    """Median CPU seconds per drafted token of ``proposer``'s runner (one token fed on a warm cache)."""
    runner = proposer.runner
    runner.logits_after(context)
    per = []
    for _ in range(rounds):
        c = time.thread_time()
        for t in range(8):
            runner.extend(100 + t)
        per.append((time.thread_time() - c) / 8)
        runner.logits_after(context)
    return statistics.median(per)


def break_even(t: dict[int, float], c: float, speedup: float = 1.0) -> dict[int, float]:
    """Per chain length k: the per-token acceptance a at which ``(1 + a + ... + a^k) t(1) / (t(1+k) + k c)``
    reaches ``speedup`` (bisection; 1.0 when even a = 1 does not)."""
    out = {}
    for n, tn in t.items():
        k = n - 1
        if k < 1:
            continue
        need = speedup * (tn + k * c) / t[1]

        def gain(a: float, k: int = k) -> float:
            return sum(a ** d for d in range(k + 1))

        if gain(1.0) < need:
            out[k] = 1.0
            continue
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if gain(mid) < need else (lo, mid)
        out[k] = round(hi, 3)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m suffixspec.training.measure_draft", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--costs", action="store_true", help="also measure t(n), the draft's cost and break-even")
    ap.add_argument("--cost-rounds", type=int, default=5)
    ap.add_argument("--no-run", action="store_true", help="only the costs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from suffixspec.config import SpeculationConfig
    from suffixspec.engine import Engine
    from suffixspec.loading import load_model
    from suffixspec.training.distill import chat_ids, eval_prompts

    target = load_model(args.target, device="cpu")
    draft, proposer = load_draft(args.draft, target)
    report: dict[str, Any] = {"target": args.target, "draft": args.draft, "load_start": os.getloadavg()}
    prompts = [chat_ids(target.tokenizer, p) for p in eval_prompts()[: args.prompts]]
    if args.costs:
        t = verify_costs(target, (1, 2, 3, 4, 5, 6, 8), args.cost_rounds)
        c = draft_cost(proposer, prompts[0] * 2, args.cost_rounds)
        report["costs"] = {"t_ms": {n: round(1000 * v, 2) for n, v in t.items()}, "draft_ms_per_token": round(1000 * c, 3),
                           "break_even_accept": break_even(t, c), "accept_for_1.25x": break_even(t, c, 1.25),
                           "load": os.getloadavg()}
        print(json.dumps(report["costs"]), flush=True)
    if not args.no_run:
        engine = Engine(target, prefix_cache_mb=0)
        systems = {"plain": ((), None), "draft": ((proposer,), SpeculationConfig()),
                   "draft-always": ((proposer,), SpeculationConfig(adaptive=False))}
        report["systems"] = run_systems(engine, prompts, systems, args.tokens)
        report["load_end"] = os.getloadavg()
        for name, o in report["systems"].items():
            print(f"{name:13s} CPU {o['cpu_tokens_per_s']:.2f} tok/s ({o['cpu_ratio_vs_plain']:.3f}x plain), "
                  f"{o['tokens_per_pass']:.3f} tokens/pass, identical {o['identical']}/{len(prompts)}, "
                  f"accept/position {o['accept_per_position'][:6]}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
