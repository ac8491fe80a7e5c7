"""A draft model on its real target, measured the way the issue asks: open-ended chat (the 10 benchmark
prompts of :data:`suffixspec.training.distill.EVAL_IDS`), greedy, history off, side by side with plain
decoding, systems interleaved per prompt, CPU time of the generating thread (one torch thread).

Also, with ``--costs``: the target's verify cost ``t(n)`` (n = 1 + draft tokens, context ~400) and the
draft's cost per drafted token, interleaved, and the break-even acceptance they imply: a chain of ``k``
draft tokens each accepted with probability ``a`` (given the previous ones) yields
``1 + a + ... + a^k`` tokens for ``t(1 + k) + k * c`` seconds, against one token per ``t(1)``.

Worked example: t(1) = 70 ms, t(4) = 90 ms, c = 3 ms, k = 3: break-even where
``(1 + a + a^2 + a^3) * 70 = 99`` -> a = 0.31; 1.25x needs ``1 + a + a^2 + a^3 = 1.77`` -> a = 0.51.

``--fp16-kernel`` adds ``t(n)`` of the same target with every linear layer on fbgemm's float16-packed
weights, measured interleaved with the float32 one: on this CPU MKL's float32 kernels stream the
weights once per input row up to about 4 rows, so ``t(2)`` is ~1.6 ``t(1)`` and even a free draft needs
~0.57 acceptance per token to break even; the packed kernel's ``t(n)`` is nearly flat there.

    python -m suffixspec.training.measure_draft --target /work/models/smollm2-135m-instruct \\
        --draft suffixspec/default_models/smollm2-shallow-draft [--tokens 128] [--costs [--fp16-kernel]]
        [--no-run] [--json out.json]
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
    from suffixspec.loading import load_model, resolve_model_path
    from suffixspec.proposers.draft_model import make_draft_proposer
    from suffixspec.proposers.shallow_draft import ShallowDraftProposer, is_shallow_draft, load_shallow_draft

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
        accepted = o["accepted_pos"] + [0] * (len(o["drafted_pos"]) - len(o["accepted_pos"]))
        o["accept_per_position"] = [round(a / d, 3) if d else None
                                    for a, d in zip(accepted, o["drafted_pos"], strict=True)]
    return out


class _PackedFp16Linear(torch.nn.Module):
    """``nn.Linear`` through fbgemm with float16-packed weights (float32 activations and sums): the
    kernel whose cost stays nearly flat from 1 to 4-8 input rows on this CPU, where MKL's float32
    kernels grow about linearly (each row streams the weights again). For the "what would pay" figure."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        self.packed = torch.fbgemm_pack_gemm_matrix_fp16(lin.weight.detach())
        self.bias = torch.zeros(lin.out_features) if lin.bias is None else lin.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return torch.fbgemm_linear_fp16_weight(rows, self.packed, self.bias).reshape(*x.shape[:-1], -1)


def fp16_weight_copy(path: str) -> Any:
    """The target loaded again with every linear layer (head included) on fbgemm float16 weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, _PackedFp16Linear(child))
    return model


@torch.inference_mode()
def verify_costs(models: dict[str, Any], sizes: tuple[int, ...], rounds: int, context: int = 400
                 ) -> dict[str, dict[int, float]]:
    """Median CPU seconds of one pass over ``n`` new tokens (a chain, tree mask as the engine sends it)
    after ``context`` cached ones, per model; sizes and models interleaved in every round."""
    from suffixspec.kv import new_cache, tree_inputs

    g = torch.Generator().manual_seed(0)
    first = next(iter(models.values()))
    ctx = torch.randint(100, int(first.config.vocab_size) - 100, (1, context), generator=g)
    caches = {}
    for name, model in models.items():
        caches[name] = new_cache(model.config)
        model(input_ids=ctx, cache=caches[name], use_cache=True)
    times: dict[tuple[str, int], list[float]] = {(m, n): [] for m in models for n in sizes}
    for _ in range(rounds):
        for n in sizes:
            ids = torch.randint(100, 10_000, (1, n), generator=g)
            for name, model in models.items():
                kwargs: dict[str, Any] = {"cache": caches[name], "use_cache": True}
                if n > 1:
                    kwargs["attention_mask"], kwargs["position_ids"] = tree_inputs(
                        list(range(-1, n - 2)), context, torch.float32, "cpu")
                c = time.thread_time()
                model(input_ids=ids, **kwargs)
                times[(name, n)].append(time.thread_time() - c)
                caches[name].crop(-n)
    return {m: {n: statistics.median(times[(m, n)]) for n in sizes} for m in models}


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
    ap.add_argument("--fp16-kernel", action="store_true",
                    help="with --costs: also t(n) of the target on fbgemm float16 weights (what would pay)")
    ap.add_argument("--no-run", action="store_true", help="only the costs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from suffixspec.config import SpeculationConfig
    from suffixspec.engine import Engine
    from suffixspec.loading import load_model, resolve_model_path
    from suffixspec.training.distill import chat_ids, eval_prompts

    target = load_model(args.target, device="cpu")
    draft, proposer = load_draft(args.draft, target)
    report: dict[str, Any] = {"target": args.target, "draft": args.draft, "load_start": os.getloadavg()}
    prompts = [chat_ids(target.tokenizer, p) for p in eval_prompts()[: args.prompts]]
    if args.costs:
        models = {"fp32": target.model}
        if args.fp16_kernel:
            models["fp16-weights"] = fp16_weight_copy(resolve_model_path(args.target))
        t_all = verify_costs(models, (1, 2, 3, 4, 5, 6, 8), args.cost_rounds)
        c = draft_cost(proposer, prompts[0] * 2, args.cost_rounds)
        report["costs"] = {"draft_ms_per_token": round(1000 * c, 3), "load": os.getloadavg()}
        for name, t in t_all.items():
            report["costs"][name] = {"t_ms": {n: round(1000 * v, 2) for n, v in t.items()},
                                     "break_even_accept": break_even(t, c), "accept_for_1.25x": break_even(t, c, 1.25),
                                     "free_draft_break_even": break_even(t, 0.0)}
        print(json.dumps(report["costs"]), flush=True)
    if not args.no_run:
        engine = Engine(target, prefix_cache_mb=0, threads=1)  # the one thread set above
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
