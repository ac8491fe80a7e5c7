"""The index at scale, in segments: the scale section (a corpus of source code streamed up to 200M tokens) and
the reopen section (the database a scale run left: merges, lookups of the segment set against its largest
segment and against another checkout's code, a compaction in a child process, adding and deleting one
document)."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from suffixspec.bench.bench_index.children import compact_in_child, main_index_module
from suffixspec.bench.bench_index.corpus import lookup_contexts, sample_sequences, source_files, stream_docs
from suffixspec.bench.bench_index.probes import PeakMemory
from suffixspec.index.speculate import SpecParams
from suffixspec.index.store import DocInput, IndexStore


def _timed_lookups(index, ctxs, params) -> dict:
    specs = []
    index.speculate(ctxs[0], params)
    for c in ctxs:
        t0 = time.perf_counter()
        index.speculate(c, params)
        specs.append(time.perf_counter() - t0)
    return {
        "speculate_median_us": statistics.median(specs) * 1e6,
        "speculate_p90_us": sorted(specs)[int(0.9 * len(specs))] * 1e6,
    }


def bench_scale(tokenizer, stages: list[int], n_lookups: int, workdir: Path, log=print) -> list[dict]:
    """Index ``stages`` (cumulative token counts) of source code with ``suffixspec``'s streaming add,
    merging after each; at each stage: peak memory of this process so far (``ru_maxrss`` as before, which
    counts the pages of mapped arrays that lookups and scans touched, and the sampled peak of its anonymous
    memory, see :class:`PeakMemory`), disk per text byte, the time
    to add one document until it is drafted from and to delete one, and the speculate latency from
    64-token contexts. Run it in a process of its own (``--sections scale``): ``ru_maxrss`` is that
    process' peak."""
    import resource

    files = source_files()
    db = workdir / "scale.db"
    store = IndexStore(db)
    mem = PeakMemory().__enter__()  # sampled for the whole run, beside ru_maxrss
    out = []
    done_tokens, text_bytes = 0, 0
    docs = stream_docs(files, stages[-1])
    t_all = time.perf_counter()
    for target in stages:
        t = time.perf_counter()

        def take(limit=target):
            nonlocal done_tokens
            for d in docs:
                yield d
                if done_tokens >= limit:
                    return

        def progress(n_docs, n_tok, n_bytes):
            nonlocal done_tokens, text_bytes
            done_tokens += n_tok
            text_bytes += n_bytes

        store.add_documents(take(), tokenizer, progress=progress)
        add_s = time.perf_counter() - t
        t = time.perf_counter()
        merges = store.merge_pending()
        merge_s = time.perf_counter() - t
        st = store.stats()
        fp = next(iter(st["tokenizers"]))
        index = store.document_index(tokenizer)
        seqs = [np.asarray(s) for s in sample_sequences(index, 400)]
        ctxs = lookup_contexts(seqs, n_lookups)
        params = SpecParams(max_spec_tokens=32, use_tree_spec=True)
        res = {
            "tokens": index.num_tokens,
            "text_bytes": st["document_bytes"],
            "add_s": add_s,
            "merge_s": merge_s,
            "merges": merges,
            "segments": len(st["tokenizers"][fp]["segments"]),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_anon_bytes": mem.anon,
            "disk_bytes": st["bytes_on_disk"],
            "disk_per_text_byte": st["bytes_on_disk"] / st["document_bytes"],
            **_timed_lookups(index, ctxs, params),
        }
        # one new document, until a reader drafts from it; then its deletion
        marker = f"def scale_marker_{target}(alpha, beta):\n    return alpha * {target} + beta - 17\n" * 3
        reader = IndexStore(db)
        reader.document_index(tokenizer)
        t = time.perf_counter()
        store.add_documents([DocInput(marker, f"marker-{target}.py")], tokenizer)
        fresh = reader.document_index(tokenizer)
        ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
        half = len(ids) // 2
        drafted = fresh.speculate(ids[:half], params)
        res["add_one_until_drafted_s"] = time.perf_counter() - t
        res["add_one_drafts_it"] = drafted.token_ids[:4] == ids[half : half + 4]
        t = time.perf_counter()
        store.remove([f"marker-{target}.py"])
        gone = reader.document_index(tokenizer).count(ids[:half])
        res["delete_one_s"] = time.perf_counter() - t
        res["deleted_is_gone"] = gone == 0
        reader.close()
        res["elapsed_s"] = time.perf_counter() - t_all
        log(json.dumps(res))
        out.append(res)
    mem.__exit__()
    store.close()
    return out


def bench_reopen(
    tokenizer,
    workdir: Path,
    n_lookups: int,
    rounds: int = 5,
    main_root: str | None = None,
    compact: bool = False,
) -> dict:
    """On the database a ``scale`` run left in ``workdir``: run the merges the current policy plans, then
    time speculate, interleaved on the same contexts: the segment set, its largest segment alone, the same
    files read by the code at ``main_root`` (the version before this one), and with ``compact`` the set
    after a compaction (run in a child process, as ``suffixspec index merge`` does: its time and peak
    memory; the old segments stay mapped here, so both sets are timed side by side). Then adding one
    document until a reader drafts from it, and deleting it (``rounds`` times each, medians)."""
    import resource

    db = workdir / "scale.db"
    store = IndexStore(db)
    t = time.perf_counter()
    merges = store.merge_pending()
    res: dict = {"merges": merges, "merge_s": time.perf_counter() - t}
    index = store.document_index(tokenizer)
    res["tokens"] = index.num_tokens
    res["segments"] = [s.num_tokens for s in index.segments]
    seqs = [np.asarray(s) for s in sample_sequences(index, 400)]
    ctxs = lookup_contexts(seqs, n_lookups, seed=5, change_seed=6)
    params = SpecParams(max_spec_tokens=32, use_tree_spec=True)
    systems: dict = {"segments": (index, params), "largest_segment_alone": (index.segments[0], params)}
    old_seg, old_sa, old_spec = (
        main_index_module(main_root, m) for m in ("segments", "suffix_array", "speculate")
    )
    if old_seg is not None:
        fp = next(iter(store.stats()["tokenizers"]))
        old = old_seg.SegmentSet(
            [
                old_sa.SuffixArray.load(
                    store.arrays_dir / i.name, dead=store.catalogue.tombstones(i.dead_file)[0]
                )
                for i in store.segment_infos(fp)
            ]
        )  # with the tombstones, as the store loads them
        systems["segments_main_code"] = (old, old_spec.SpecParams(max_spec_tokens=32, use_tree_spec=True))
    if compact:
        res["compaction"] = compact_in_child(db)
        after = store.document_index(tokenizer)
        res["segments_after_compaction"] = [s.num_tokens for s in after.segments]
        systems["compacted"] = (after, params)
    for c in ctxs:  # warm the mapped pages once
        for idx, p in systems.values():
            idx.speculate(c, p)
    times: dict[str, list[float]] = {k: [] for k in systems}
    cpu: dict[str, list[float]] = {k: [] for k in systems}
    same = 0
    names = list(systems)
    for i, c in enumerate(ctxs):
        drafts = {}
        # the order rotates per context: the first system to look a context up pays its cache misses, the
        # others find the same text and sa entries in the cache
        for name in names[i % len(names) :] + names[: i % len(names)]:
            idx, p = systems[name]
            c0, t0 = time.thread_time(), time.perf_counter()
            drafts[name] = idx.speculate(c, p)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
        same += (
            len(
                {
                    (tuple(d.token_ids), tuple(d.probs))
                    for k, d in drafts.items()
                    if k != "largest_segment_alone"
                }
            )
            == 1
        )
    for name, v in times.items():
        res[f"{name}_speculate_median_us"] = statistics.median(v) * 1e6
        res[f"{name}_speculate_cpu_median_us"] = statistics.median(cpu[name]) * 1e6  # preemptions left out
    # each system alone, one pass over the contexts (every lookup pays its own cache misses), wall and CPU
    for name, (idx, p) in systems.items():
        v, u = [], []
        for c in ctxs:
            c0, t0 = time.thread_time(), time.perf_counter()
            idx.speculate(c, p)
            v.append(time.perf_counter() - t0)
            u.append(time.thread_time() - c0)
        res[f"{name}_alone_speculate_median_us"] = statistics.median(v) * 1e6
        res[f"{name}_alone_speculate_cpu_median_us"] = statistics.median(u) * 1e6
    res["identical_drafts"] = f"{same}/{len(ctxs)}"
    res["load_average"] = os.getloadavg()[0]
    adds, dels = [], []
    reader = IndexStore(db)
    reader.document_index(tokenizer)
    for i in range(rounds):
        marker = f"def reopen_marker_{i}(alpha, beta):\n    return alpha * {i} + beta - 17\n" * 3
        ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
        half = len(ids) // 2
        t = time.perf_counter()
        store.add_documents([DocInput(marker, f"reopen-{i}.py")], tokenizer)
        ok = (
            reader.document_index(tokenizer).speculate(ids[:half], params).token_ids[:4]
            == ids[half : half + 4]
        )
        adds.append(time.perf_counter() - t)
        t = time.perf_counter()
        store.remove([f"reopen-{i}.py"])
        gone = reader.document_index(tokenizer).count(ids[:half]) == 0
        dels.append(time.perf_counter() - t)
        assert ok and gone
    res["add_one_until_drafted_median_s"] = statistics.median(adds)
    res["add_one_until_drafted_max_s"] = max(adds)
    res["delete_one_median_s"] = statistics.median(dels)
    # this process mapped every segment and looked them up: its RSS counts those pages (not allocated memory)
    res["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    st = store.stats()
    res["disk_per_text_byte"] = st["bytes_on_disk"] / st["document_bytes"]
    reader.close()
    store.close()
    return res
