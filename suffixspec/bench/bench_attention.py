"""What grouping rows into one attention call per layer saves: the lean forward's pass over 8 rows with each
row's attention apart (``CALL_SCORES = 0``: rows share a call only where padding adds nothing) against one
call for all rows (padded to one shape, masked), the two alternating pass by pass.

Rows at 300-500 tokens of context, as concurrent requests have; three mixes: plain steps (one query per
row), drafts of 4 nodes (one shape), drafts of 0-8 nodes (mixed). Reported per mix and grouping: the
pass's and its attention's time (medians; CPU time of this thread on a CPU, wall time after a
synchronize on a GPU) and the ratio of one call to apart per pair of passes. The numbers behind
``lean.CALL_SCORES`` (and, run on a GPU, what ``lean.GPU_CALL_SCORES`` should be)::

    python -m suffixspec.bench.bench_attention --model smollm2-135m-instruct [--device cpu] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

CONTEXTS = (300, 340, 380, 420, 460, 500, 320, 440)
MIXES = {"plain steps": (0,) * 8, "drafts of 4": (4,) * 8, "drafts of 0-8": (0, 3, 8, 1, 0, 5, 2, 8)}
GROUPINGS = {"apart": 0, "one call": 10**15}


def main() -> None:
    import suffixspec.core.lean as lean_module
    from suffixspec.core.kv import SlotCache
    from suffixspec.core.lean import LeanForward, PassRow
    from suffixspec.loading import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gpu = args.device.startswith("cuda")
    lm = load_model(args.model, device=args.device)
    lean = LeanForward(lm.model)
    vocab = lean.head.shape[0]
    cache = SlotCache(len(CONTEXTS))
    for r, c in enumerate(CONTEXTS):
        cache.add_row()
        lean([PassRow(r, [(7919 * i + 13 * r) % (vocab - 10) + 5 for i in range(c)], None, 0, "none")], cache)
        cache.lengths[r] = c

    def clock() -> float:
        if gpu:
            torch.cuda.synchronize()
            return time.perf_counter()
        return time.thread_time()

    spent = [0.0]
    attend = LeanForward.attend

    def timed(self, *a):  # the attention calls' share of the pass (a synchronize each on a GPU)
        t = clock()
        attend(self, *a)
        spent[0] += clock() - t

    LeanForward.attend = timed
    load = os.getloadavg()[0]
    for mix, ks in MIXES.items():
        rows = [PassRow(r, [5] + [(31 * i) % (vocab - 10) + 5 for i in range(k)], list(range(-1, k - 1)), c)
                for r, (k, c) in enumerate(zip(ks, CONTEXTS, strict=True))]
        times: dict[str, list[tuple[float, float]]] = {g: [] for g in GROUPINGS}
        for i in range(args.rounds + 1):
            for g in (list(GROUPINGS) if i % 2 == 0 else list(GROUPINGS)[::-1]):
                lean_module.CALL_SCORES = lean_module.GPU_CALL_SCORES = GROUPINGS[g]
                spent[0] = 0.0
                t = clock()
                lean(rows, cache)
                if i:
                    times[g].append((clock() - t, spent[0]))
        ratio = statistics.median(a[0] / b[0] for a, b in zip(times["one call"], times["apart"], strict=True))
        print(f"{mix}: " + ", ".join(f"{g} {1e3 * statistics.median(p for p, _ in v):.1f} ms "
                                     f"(attention {1e3 * statistics.median(a for _, a in v):.1f})"
                                     for g, v in times.items()) + f"; one call / apart {ratio:.3f}")
    print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
