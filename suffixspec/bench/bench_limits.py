"""Where the limit is: one plain decode step against the time to read the model's weights once, the
verify cost curve, and what a perfect drafter could reach.

1. Memory bandwidth: a copy loop over a buffer larger than the caches (``numpy.copyto`` of 512 MiB,
   one thread; bytes read + bytes written per second, the best of a few rounds).
2. The weights' bytes (every parameter once; a tied embedding is the LM head's matrix, read in full
   at every step) and the time to read them once at that bandwidth: the floor under one plain step
   of a memory-bound decoder.
3. One plain step and the verify cost curve: one target forward over ``1 + k`` tokens (a chain draft
   with the tree mask, as the engine verifies it), k = 1..64, at a fixed context length; sizes are
   measured round-robin, ``rounds`` times each, medians.
4. Why the curve jumps after one token: one weight product with 1, 2, 4, ... rows, as
   ``transformers`` runs it and as the lean forward does (:func:`matmul_rows`): one row streams the
   weights once, a few rows take a general matrix product.
5. The oracle: a drafter that always drafts the true continuation gets ``k + 1`` tokens per pass at
   ``t(1 + k)``; its best speed over plain decoding is ``max_k (k + 1) * t(1) / t(1 + k)``.
6. The prompt's prefill per token (one pass over ``context`` tokens, divided by them): every system
   pays it once per request, drafts or not, so it bounds what any drafter can gain on a whole request
   (:mod:`suffixspec.bench.bench_drafting` adds it to its estimates when the file has it).

Worked example: SmolLM2-135M (540 MB of fp32 weights) at 10 GB/s reads its weights in 54 ms; a
plain step of 70 ms is then 1.3x the floor. If t(1 + 15) = 2.0 t(1) and t(1 + 31) = 3.6 t(1), the
oracle gets 16 / 2.0 = 8.0x at k = 15 and 32 / 3.6 = 8.9x at k = 31.

    python -m suffixspec.bench.bench_limits --model smollm2-135m-instruct [--context 400] [--rounds 5]
                                 [--stat median|min] [--cpu] [--json suffixspec/bench/published/limits.json]
                                 [--weights float32|int8|bfloat16|...]   (repeat --weights: side by side)

The curve is what :mod:`suffixspec.bench.bench_drafting` turns replayed drafts into time with (``--costs``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def memory_bandwidth(mib: int = 512, rounds: int = 5) -> float:
    """Bytes per second a copy loop moves (read + write), best of ``rounds``."""
    import numpy as np

    src = np.ones(mib * 2**20 // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch both buffers
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best


def verify_pass(engine: Any, context_len: int = 400, cpu: bool = False) -> Callable[[int], float]:
    """A timer of the engine's verify pass at ``context_len`` tokens of context: ``once(k)`` runs one
    target pass over a root and a chain draft of ``k`` nodes (k = 0: a plain step), as the scheduler
    runs a step of one request (``runner.Runner.forward``, on the forward the engine chose: lean, or
    the model's own where its probe turned the lean one off), drops the pass's keys and values again
    and returns its seconds (``cpu``: CPU seconds, ``costs.cpu_clock``). The context is prefilled once, into a
    runner of its own."""
    from suffixspec.core.lean import PassRow
    from suffixspec.core.runner import Runner
    from suffixspec.drafting.costs import cpu_clock

    # CPU time, as the engine's own cost model measures passes: a busy machine's wall clock (load 10 on 2
    # cores: most of it waiting for a core) says little about what a pass costs
    clock = cpu_clock if cpu else time.perf_counter
    vocab = engine.vocab_size
    if context_len < 1 or context_len >= engine.max_context:
        raise ValueError(f"context {context_len} does not fit the model's {engine.max_context} positions")
    lean = engine.scheduler.runner.lean is not None  # the engine's choice (its batching probe)
    runner = Runner(engine.model, 1, None, lean=lean, weights=engine.target.lean_kind)
    row = runner.add_row()
    runner.prefill(row, [(7919 * i) % (vocab - 10) + 5 for i in range(context_len)])

    def once(k: int) -> float:
        if context_len + 1 + k > engine.max_context:
            raise ValueError(f"context {context_len} + 1 + {k} draft nodes exceed {engine.max_context} positions")
        ids = [5] + [(31 * i) % (vocab - 10) + 5 for i in range(k)]
        t = clock()
        runner.forward([PassRow(row, ids, list(range(-1, k - 1)), context_len)])
        dt = clock() - t
        runner.keep(row, context_len, [])  # keep none of the pass's positions: the context alone again
        return dt

    return once


def verify_curve(engine: Any, context_len: int = 400, max_k: int = 64, rounds: int = 5, stat: str = "median",
                 cpu: bool = False) -> dict[int, float]:
    """Seconds of one forward over ``1 + k`` tokens (k = 0: a plain step), k = 0..max_k, at
    ``context_len`` tokens of context (:func:`verify_pass`), the median (or the minimum: what a busy
    machine's other jobs add least to) of ``rounds``; sizes round-robin, so load changes hit them alike."""
    once = verify_pass(engine, context_len, cpu)
    times: dict[int, list[float]] = {k: [] for k in range(max_k + 1)}
    once(0), once(max_k)  # warm-up
    for r in range(rounds):
        ks = list(range(max_k + 1))
        for k in ks if r % 2 == 0 else ks[::-1]:
            times[k].append(once(k))
    pick = min if stat == "min" else statistics.median
    return {k: pick(v) for k, v in times.items()}


def prefill_per_token(engine: Any, context_len: int = 400, rounds: int = 5, stat: str = "median",
                      cpu: bool = False) -> float:
    """Seconds per token of prefilling ``context_len`` tokens into an empty row (one pass, as the engine
    prefills a prompt), the median (or minimum) of ``rounds``."""
    from suffixspec.core.runner import Runner
    from suffixspec.drafting.costs import cpu_clock

    clock = cpu_clock if cpu else time.perf_counter
    lean = engine.scheduler.runner.lean is not None
    ids = [(7919 * i) % (engine.vocab_size - 10) + 5 for i in range(context_len)]
    times = []
    for _ in range(rounds + 1):  # the first is a warm-up
        runner = Runner(engine.model, 1, None, lean=lean, weights=engine.target.lean_kind)
        row = runner.add_row()
        t = clock()
        runner.prefill(row, ids)
        times.append(clock() - t)
        del runner
    pick = min if stat == "min" else statistics.median
    return pick(times[1:]) / context_len


def matmul_rows(model: Any, rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32), repeats: int = 20) -> dict[str, dict[int, float]]:
    """Seconds of one weight product for ``rows`` input rows: the largest matrix of the first decoder
    layer and the LM head (``best of repeats``), each as ``transformers`` runs it (``F.linear``) and as
    the lean forward does (``lean.linear`` on the weight ``lean.packed`` for oneDNN, where that works).
    On a CPU one row is a matrix-vector product that streams the weights once; a few rows take the
    general matrix product, whose small-row cases cost several times more on this machine's BLAS (the
    jump from ``t(1)`` to ``t(2)`` of ``F.linear``), which the packed weight avoids."""
    import torch.nn.functional as F

    from suffixspec.core.weights import linear, packed

    layer = max((m for m in model.modules() if isinstance(m, torch.nn.Linear)), key=lambda m: m.weight.numel()
                if m is not model.get_output_embeddings() else -1)
    out: dict[str, dict[int, float]] = {}
    for name, w in (("largest layer matrix", layer.weight), ("lm head", model.get_output_embeddings().weight)):
        lean_w = packed(w)
        kinds = [("F.linear", lambda x, w=w: F.linear(x, w))]
        if lean_w.is_mkldnn:
            kinds.append(("oneDNN packed", lambda x, p=lean_w: linear(x, p)))
        for kind, product in kinds:
            times = {}
            with torch.inference_mode():
                for m in rows:
                    x = torch.randn(m, w.shape[1], dtype=w.dtype)
                    product(x)
                    best = float("inf")
                    for _ in range(repeats if w.numel() < 50_000_000 else max(3, repeats // 4)):
                        t = time.perf_counter()
                        product(x)
                        best = min(best, time.perf_counter() - t)
                    times[m] = best
            out[f"{name} {tuple(w.shape)}, {kind}"] = times
        del lean_w
    return out


def matmul_rows_lean(lean: Any, rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32), repeats: int = 20
                     ) -> dict[str, dict[int, float]]:
    """:func:`matmul_rows` for a quantized lean forward (its float weights released): its first layer's
    gate/up matrix and its LM head, as ``lean.linear`` runs them (best of ``repeats``)."""
    from suffixspec.core.weights import linear

    out: dict[str, dict[int, float]] = {}
    for name, w in (("first layer gate/up", lean.layers[0].w_gu), ("lm head", lean.head)):
        times = {}
        with torch.inference_mode():
            for m in rows:
                x = torch.randn(m, w.shape[1])
                linear(x, w)
                best = float("inf")
                for _ in range(repeats):
                    t = time.perf_counter()
                    linear(x, w)
                    best = min(best, time.perf_counter() - t)
                times[m] = best
        out[f"{name} {tuple(w.shape)}, {type(w).__name__} {getattr(w, 'kernel', '')}".rstrip()] = times
    return out


def oracle(curve: dict[int, float]) -> tuple[int, float]:
    """(k, speed over plain) of the best chain length for a drafter whose every token is accepted."""
    t1 = curve[0]
    k = max((k for k in curve if k > 0), key=lambda k: (k + 1) * t1 / curve[k])
    return k, (k + 1) * t1 / curve[k]


def limits(model: str, context_len: int = 400, max_k: int = 64, rounds: int = 5, threads: int = 1,
           stat: str = "median", cpu: bool = False, weights: str | None = None) -> dict[str, Any]:
    from suffixspec.core.weights import weight_bytes
    from suffixspec.loading import load_model
    from suffixspec.runtimes.engine import Engine

    if threads:
        torch.set_num_threads(threads)
    engine = Engine(load_model(model, weights=weights), prefix_cache_mb=0, threads=torch.get_num_threads())
    bandwidth = memory_bandwidth()
    lean = engine.scheduler.runner.lean
    wbytes = weight_bytes(engine.model, lean)
    load = os.getloadavg()[0]
    curve = verify_curve(engine, context_len, max_k, rounds, stat, cpu)
    prefill = prefill_per_token(engine, context_len, rounds, stat, cpu)
    products = matmul_rows_lean(lean) if lean is not None and lean.int8 else matmul_rows(engine.model)
    bandwidth_after = memory_bandwidth()
    bw = max(bandwidth, bandwidth_after)
    k, speed = oracle(curve)
    floor = wbytes / bw
    return {
        "model": Path(model).name if os.path.isdir(model) else model,
        "weights": engine.target.weights,
        "threads": torch.get_num_threads(),
        "context": context_len,
        "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
        "statistic": f"{stat} of {rounds}" + (", CPU time" if cpu else ""),
        "memory_bandwidth_gb_s": round(bw / 1e9, 2),
        "weight_bytes": wbytes,
        "weights_read_ms": round(1e3 * floor, 2),
        "plain_step_ms": round(1e3 * curve[0], 2),
        "plain_step_over_floor": round(curve[0] / floor, 2),
        "verify_ms": {k: round(1e3 * v, 2) for k, v in curve.items()},
        "verify_relative": {k: round(v / curve[0], 3) for k, v in curve.items()},
        "prefill_ms_per_token": round(1e3 * prefill, 3),
        "oracle_k": k,
        "oracle_speedup": round(speed, 2),
        "matmul_ms_by_rows": {name: {m: round(1e3 * v, 3) for m, v in t.items()} for name, t in products.items()},
    }


def _label(r: dict[str, Any]) -> str:
    """The model's cell: its name, and its weight format where that is not float32 (``smollm2 (int8)``)."""
    weights = r.get("weights", "float32")
    return r["model"] if weights == "float32" else f"{r['model']} ({weights})"


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| model | weights | bandwidth | weights read once | plain step | step / floor | t(1+8) | t(1+16) "
             "| t(1+32) | t(1+64) | oracle (best k) | prefill per token |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        rel = r["verify_relative"]
        lines.append(f"| {_label(r)} | {r['weight_bytes'] / 1e6:.0f} MB | {r['memory_bandwidth_gb_s']:.1f} GB/s "
                     f"| {r['weights_read_ms']:.1f} ms | {r['plain_step_ms']:.1f} ms | {r['plain_step_over_floor']:.2f}× "
                     + " ".join(f"| {rel[k]:.2f}×" if k in rel else "| –" for k in (8, 16, 32, 64))
                     + f" | {r['oracle_speedup']:.1f}× (k = {r['oracle_k']}) | "
                     + (f"{r['prefill_ms_per_token']:.2f} ms |" if "prefill_ms_per_token" in r else "– |"))
    lines += ["", "| model | weight product | 1 row | 2 rows | 4 rows | 8 rows | 16 rows | 32 rows |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for name, t in r.get("matmul_ms_by_rows", {}).items():
            lines.append(f"| {_label(r)} | {name} | " + " | ".join(f"{v:.2f} ms" for v in t.values()) + " |")
    return "\n".join(lines) + "\n"


def _entry(path: Path, model: str) -> dict[str, Any]:
    data = json.loads(path.read_text())
    name = Path(model).name if os.path.isdir(model) else model
    for r in data if isinstance(data, list) else [data]:
        if r["model"] == name and r.get("weights", "float32") == "float32":  # the engine's curve of reference
            return r
    raise ValueError(f"{path} has no verify curve for {name!r}; run python -m suffixspec.bench.bench_limits --model {model}")


def load_curve(path: Path, model: str) -> dict[int, float]:
    """The measured curve (seconds by draft size k) of ``model`` from a ``--json`` file of this module."""
    return {int(k): v / 1e3 for k, v in _entry(path, model)["verify_ms"].items()}


def load_prefill(path: Path, model: str) -> float | None:
    """Seconds per prompt token of ``model``'s prefill from a ``--json`` file of this module (None where
    the file was written before it was measured)."""
    ms = _entry(path, model).get("prefill_ms_per_token")
    return ms / 1e3 if ms is not None else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="repeat for several models")
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--max-k", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="per size: the median of the rounds, or the minimum (on a busy machine)")
    ap.add_argument("--cpu", action="store_true", help="time passes in CPU seconds (a busy machine), not wall")
    ap.add_argument("--json", type=Path, default=None, help="write (or update, per model) the figures here")
    ap.add_argument("--weights", action="append", default=None,
                    help="weight format (suffixspec.core.formats.FORMATS; default float32); repeat for several, "
                         "measured one after the other")
    args = ap.parse_args()
    results = [limits(m, args.context, args.max_k, args.rounds, args.threads, args.stat, args.cpu, w)
               for m in args.model for w in (args.weights or ["float32"])]
    print(markdown(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(args.json.read_text()) if args.json.exists() else []
        names = {(r["model"], r.get("weights", "float32")) for r in results}
        args.json.write_text(json.dumps([r for r in old if (r["model"], r.get("weights", "float32")) not in names]
                                        + results, indent=1))


if __name__ == "__main__":
    main()
