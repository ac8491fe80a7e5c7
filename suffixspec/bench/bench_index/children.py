"""Other processes and other code the index benchmarks measure against: another checkout's
``suffixspec.index`` imported beside this one (the "main-code comparison" of ``--main-root``), a compaction in
a child process, ArcticInference's suffix tree in the Python of its own environment, and the generating
process of the busy-add section.

A checkout's index is imported as the package ``main_index`` (:func:`main_index_module`): its modules import
each other relatively, so the other version's modules use each other, never this version's. Example:
``main_index_module("/src/before", "suffix_array").SuffixArray.build(seqs)`` builds the array the code at
``/src/before`` builds, in this process, beside this version's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from suffixspec.bench.bench_index.probes import PeakMemory

# the folder that holds this ``suffixspec`` package (a checkout's root): a child process started there, or
# with it on PYTHONPATH, runs this version's code
CHECKOUT = Path(__file__).resolve().parents[3]


def main_index_module(main_root: str | None, name: str):
    """Module ``suffixspec.index.<name>`` of the checkout at ``main_root`` (another version's code, imported
    as the package ``main_index`` beside this one; ``index/`` at the root in checkouts before the folder tree
    became the package tree), or None when it has no such file. The index's modules import each other
    relatively, so the other version's modules use each other, not this version's."""
    import importlib.util
    import types

    folders = [Path(main_root) / "suffixspec" / "index", Path(main_root) / "index"] if main_root else []
    folder = next((f for f in folders if (f / f"{name}.py").exists()), None)
    if folder is None:
        return None
    if "main_index" not in sys.modules:
        pkg = types.ModuleType("main_index")
        pkg.__path__ = [str(folder)]
        sys.modules["main_index"] = pkg
    return importlib.import_module(f"main_index.{name}")


_COMPACT_SCRIPT = r"""
import json, sys, time
from suffixspec.index.store import IndexStore
t = time.perf_counter()
with IndexStore(sys.argv[1]) as s:
    n = s.compact()
print(json.dumps({"compactions": n, "compact_s": time.perf_counter() - t}))
"""


def compact_in_child(db: Path) -> dict:
    """``IndexStore.compact()`` in a process of its own (as ``suffixspec index merge`` runs it): its time and
    its peak RSS and anonymous memory, sampled (:class:`PeakMemory`; the child's own ``ru_maxrss`` would
    count this process' pages it was forked with)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _COMPACT_SCRIPT, str(db)], stdout=subprocess.PIPE, text=True, cwd=str(CHECKOUT)
    )
    with PeakMemory(proc.pid) as mem:
        out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"compaction failed ({proc.returncode})")
    return {
        **json.loads(out.strip().splitlines()[-1]),
        "peak_rss_bytes": mem.rss,
        "peak_anon_bytes": mem.anon,
    }


_ARCTIC_SCRIPT = r"""
import json, sys, time, gc
import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

data = np.load(sys.argv[1], allow_pickle=True)
seqs = [s.tolist() for s in data["seqs"]]
ctxs = data["ctxs"].tolist()
total = sum(len(s) for s in seqs)
out = {}
gc.collect()
r0 = rss()
cache = SuffixDecodingCache(max_tree_depth=64, max_cached_requests=-1)
t = time.perf_counter()
for i, s in enumerate(seqs):
    cache.start_request(i, [])
    for tok in s:
        cache.add_active_response(i, [tok])
    cache.stop_request(i)
out["append_us_per_token"] = (time.perf_counter() - t) / total * 1e6
out["bytes_per_token"] = (rss() - r0) / total
cache2 = SuffixDecodingCache(max_tree_depth=64, max_cached_requests=-1)
t = time.perf_counter()
for i, s in enumerate(seqs):
    cache2.start_request(i, [])
    for j in range(0, len(s), 16):
        cache2.add_active_response(i, s[j:j + 16])
    cache2.stop_request(i)
out["extend16_us_per_token"] = (time.perf_counter() - t) / total * 1e6
del cache2
rid = len(seqs) + 1
cache.start_request(rid, [])
for tree in (False, True):
    kind = "tree" if tree else "path"
    per_call, drafted = [], 0
    for c in ctxs:
        t0 = time.perf_counter()
        d = cache.speculate(rid, c, max_spec_tokens=32, max_spec_factor=1.0, max_spec_offset=0.0,
                            min_token_prob=0.1, use_tree_spec=tree)
        per_call.append(time.perf_counter() - t0)
        drafted += len(d.token_ids)
    per_call.sort()
    out[kind + "_speculate_us_per_call"] = sum(per_call) / len(per_call) * 1e6
    out[kind + "_speculate_median_us"] = per_call[len(per_call) // 2] * 1e6
    out[kind + "_mean_draft_tokens"] = drafted / len(ctxs)
    out[kind + "_us_per_drafted_token"] = sum(per_call) / max(1, drafted) * 1e6
print(json.dumps(out))
"""


def run_arctic(python: str, seqs: list[np.ndarray], ctxs: list[list[int]]) -> dict | str:
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "data.npz"
        obj = np.empty(len(seqs), dtype=object)
        obj[:] = seqs
        np.savez(data, seqs=obj, ctxs=np.asarray(ctxs, dtype=np.int64))
        script = Path(d) / "arctic_bench.py"
        script.write_text(_ARCTIC_SCRIPT)
        try:
            out = subprocess.run(
                [python, str(script), str(data)], capture_output=True, text=True, timeout=900
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"not run: {e}"
        if out.returncode != 0:
            return f"failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
        return json.loads(out.stdout.strip().splitlines()[-1])


GENERATOR = """
import sys, time, torch
torch.set_num_threads(1)
from suffixspec import SuffixSpec
spec = SuffixSpec(model=sys.argv[1], draft_model=None, db=False, history=False, threads=1)
print("generating", flush=True)
while True:  # until killed: one long greedy generation after the other
    spec.generate("Write a long story about a lighthouse keeper.", max_tokens=400, temperature=0, ignore_eos=True)
"""
