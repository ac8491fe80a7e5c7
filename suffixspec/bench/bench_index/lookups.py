"""The index's own speed and what it drafts: the micro, corpus, history, lookup and retrieval sections of
``python -m suffixspec.bench.bench_index`` (the package docstring says what each measures)."""

from __future__ import annotations

import gc
import json
import os
import random
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from suffixspec.bench.bench_index.children import main_index_module, run_arctic
from suffixspec.bench.bench_index.corpus import (
    contexts,
    held_out_texts,
    lookup_contexts,
    sample_sequences,
    templated_requests,
    tokenize,
)
from suffixspec.bench.bench_index.probes import WriteProbe
from suffixspec.index.incremental import IncrementalIndex
from suffixspec.index.speculate import SpecParams
from suffixspec.index.store import DocInput, IndexStore
from suffixspec.index.suffix_array import SuffixArray


def bench_micro(seqs: list[np.ndarray], n_ctx: int, arctic_python: str | None) -> dict:
    total = sum(len(s) for s in seqs)
    flat = [s.tolist() for s in seqs]
    res: dict = {"tokens": total}

    # append, one token per call
    gc.collect()
    idx = IncrementalIndex()
    t = time.perf_counter()
    for s in flat:
        append = idx.append
        for tok in s:
            append(tok)
        idx.end_sequence()
    res["incremental_append_us_per_token"] = (time.perf_counter() - t) / total * 1e6
    # append in runs of 16 (an accepted draft plus the bonus token)
    idx2 = IncrementalIndex()
    t = time.perf_counter()
    for s in flat:
        for i in range(0, len(s), 16):
            idx2.extend(s[i : i + 16])
        idx2.end_sequence()
    res["incremental_extend16_us_per_token"] = (time.perf_counter() - t) / total * 1e6
    # bulk build of a long run (a prompt)
    t = time.perf_counter()
    IncrementalIndex.from_sequences(seqs)
    res["incremental_bulk_us_per_token"] = (time.perf_counter() - t) / total * 1e6
    # memory of the incremental index, measured
    tracemalloc.start()
    m0 = tracemalloc.get_traced_memory()[0]
    idx3 = IncrementalIndex.from_sequences(seqs)
    res["incremental_bytes_per_token"] = (tracemalloc.get_traced_memory()[0] - m0) / total
    tracemalloc.stop()
    del idx3, idx2
    t = time.perf_counter()
    sa = SuffixArray.build(seqs)
    res["suffix_array_build_s"] = time.perf_counter() - t
    res["suffix_array_bytes_per_token"] = sa.nbytes() / total

    ctxs = contexts(seqs, n_ctx, 64, seed=1)
    for tree in (False, True):
        params = SpecParams(max_spec_tokens=32, max_spec_factor=1.0, min_token_prob=0.1, use_tree_spec=tree)
        kind = "tree" if tree else "path"
        for name, obj in (("incremental", idx), ("suffix_array", sa)):
            obj.speculate(ctxs[0], params)
            per_call = []
            drafted = 0
            for c in ctxs:
                t0 = time.perf_counter()
                r = obj.speculate(c, params)
                per_call.append(time.perf_counter() - t0)
                drafted += len(r)
            mean = sum(per_call) / len(per_call)
            res[f"{name}_{kind}_speculate_us_per_call"] = mean * 1e6
            res[f"{name}_{kind}_speculate_median_us"] = statistics.median(per_call) * 1e6
            res[f"{name}_{kind}_mean_draft_tokens"] = drafted / len(ctxs)
            res[f"{name}_{kind}_us_per_drafted_token"] = sum(per_call) / max(1, drafted) * 1e6
    if arctic_python:
        res["arctic"] = run_arctic(arctic_python, seqs, ctxs)
    return res


def bench_corpus(tokenizer, texts: list[tuple[str, str]], limit: int, n_lookups: int) -> dict:
    res: dict = {}
    t = time.perf_counter()
    seqs = tokenize(tokenizer, texts, limit)
    res["tokenize_s"] = time.perf_counter() - t
    docs = [DocInput(text, path) for (path, text), _ in zip(texts, seqs, strict=False)]
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "index.db"
        store = IndexStore(db)
        with WriteProbe(db) as probe:  # what another writer (history of a server) waits meanwhile
            t = time.perf_counter()
            summary = store.add_documents(docs, tokenizer)
            res["index_add_s"] = time.perf_counter() - t  # tokenize + SQLite + suffix array + save
        res["other_writer_max_wait_s"] = probe.max_wait
        res["documents"] = summary.added
        res["tokens"] = summary.tokens
        store.close()
        t = time.perf_counter()
        store = IndexStore(db)
        sa = store.document_index(tokenizer)
        res["load_s"] = time.perf_counter() - t
        st = store.stats()
        res["bytes_on_disk_per_token"] = st["bytes_on_disk"] / summary.tokens
        res["arrays_bytes_per_token"] = st["arrays_bytes"] / summary.tokens
        res["memory_bytes_per_token"] = sa.nbytes() / summary.tokens
        t = time.perf_counter()
        SuffixArray.build(seqs)
        res["suffix_array_build_s"] = time.perf_counter() - t
        ctxs = lookup_contexts([np.asarray(s) for s in seqs], n_lookups)
        lookups, matches = [], []
        sa.node(ctxs[0])
        for c in ctxs:
            t0 = time.perf_counter()
            L, _ = sa.node(c)
            lookups.append(time.perf_counter() - t0)
            matches.append(L)
        res["lookup_median_us"] = statistics.median(lookups) * 1e6
        res["lookup_p90_us"] = sorted(lookups)[int(0.9 * len(lookups))] * 1e6
        res["lookup_mean_match_len"] = sum(matches) / len(matches)
        params = SpecParams(max_spec_tokens=32, use_tree_spec=True)
        specs = []
        for c in ctxs:
            t0 = time.perf_counter()
            sa.speculate(c, params)
            specs.append(time.perf_counter() - t0)
        res["speculate_tree_median_us"] = statistics.median(specs) * 1e6
        store.close()
        del sa
    return res


def simulate(proposer, prompt: list[int], target: list[int], budget: int = 16) -> tuple[int, int]:
    """Greedy verification against a known output: returns (steps, accepted draft tokens)."""
    from suffixspec.drafting.proposers import RequestContext

    proposer.begin(RequestContext(prompt_ids=list(prompt)))
    out: list[int] = []
    steps = accepted = 0
    while len(out) < len(target):
        draft = proposer.propose(prompt + out, budget)
        # walk the tree along the true continuation
        node, n_acc = -1, 0
        while len(out) + n_acc < len(target):
            want = target[len(out) + n_acc]
            nxt = next(
                (
                    i
                    for i, (tok, par) in enumerate(zip(draft.tokens, draft.parents, strict=True))
                    if par == node and tok == want
                ),
                None,
            )
            if nxt is None:
                break
            node, n_acc = nxt, n_acc + 1
        new = target[len(out) : len(out) + n_acc + 1]  # accepted + the target's own token
        out.extend(new)
        proposer.update(new)
        steps += 1
        accepted += n_acc
    proposer.end(out)
    return steps, accepted


def bench_history(tokenizer, n_requests: int) -> dict:
    from suffixspec.drafting.proposers.suffix import SuffixConfig, SuffixProposer

    proposer = SuffixProposer(config=SuffixConfig(max_spec_factor=2.0, min_token_prob=0.1))
    reqs = templated_requests(tokenizer, n_requests)
    per_request = []
    for prompt, target in reqs:
        steps, acc = simulate(proposer, prompt, target)
        per_request.append(acc / steps)
    buckets = {}
    edges = [0, 1, 2, 5, 10, 20, 50, 100, 200, n_requests]
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        if hi <= n_requests and hi > lo:
            vals = per_request[lo:hi]
            buckets[f"requests {lo + 1}-{hi}"] = sum(vals) / len(vals)
    return {
        "requests": n_requests,
        "output_tokens_per_request": sum(len(t) for _, t in reqs) / n_requests,
        "mean_accepted_length_by_request": buckets,
        "history_tokens": proposer.history.num_tokens,
    }


def bench_lookup_vs_main(tokenizer, texts, limit: int, n_lookups: int, main_root: str) -> dict:
    """Speculate latency at ``limit`` tokens, same contexts, interleaved in one run: the single suffix array
    of the code at ``main_root`` (``--main-root``: e.g. the version before segments), the segmented index
    here as the merge policy leaves it, the same after a compaction, and one array built here."""
    seqs = tokenize(tokenizer, texts, limit)
    res: dict = {"tokens": int(sum(len(s) for s in seqs))}
    mod = main_index_module(main_root, "suffix_array")
    old = mod.SuffixArray.build(seqs) if mod is not None else None
    with tempfile.TemporaryDirectory() as d:
        store = IndexStore(Path(d) / "i.db", flush_tokens=1 << 21)
        store.add_documents([DocInput(t, p) for (p, t), _ in zip(texts, seqs, strict=False)], tokenizer)
        res["segments_before_merge"] = len(store.segment_infos(next(iter(store.stats()["tokenizers"]))))
        store.merge_pending()
        new = store.document_index(tokenizer)
        res["segments"] = len(new.segments)
        store.compact()
        compacted = store.document_index(tokenizer)  # the files of ``new`` stay mapped
        res["segments_after_compaction"] = len(compacted.segments)
        one = SuffixArray.build(seqs)
        ctxs = lookup_contexts([np.asarray(s) for s in seqs], n_lookups)
        params = SpecParams(max_spec_tokens=32, use_tree_spec=True)
        systems = {"main_single_array": old, "segments": new, "compacted": compacted, "one_array_here": one}
        times: dict[str, list[float]] = {k: [] for k, v in systems.items() if v is not None}
        same = True
        names = list(times)
        for i, c in enumerate(ctxs):  # interleaved: the machine's load hits every system alike
            drafts = {}
            for k in (
                names[i % len(names) :] + names[: i % len(names)]
            ):  # rotated: the first pays the cache misses
                t0 = time.perf_counter()
                drafts[k] = systems[k].speculate(c, params)
                times[k].append(time.perf_counter() - t0)
            same &= (
                drafts["segments"].token_ids
                == drafts["one_array_here"].token_ids
                == drafts["compacted"].token_ids
            )
        for k, v in times.items():
            res[f"{k}_speculate_median_us"] = statistics.median(v) * 1e6
        res["segments_equal_one_array"] = bool(same)
        store.close()
    return res


def _walk_lookups(retrieval, walks: list[list[int]], params: SpecParams, steps: int, start: int = 32) -> dict:
    """Decode-step lookups along ``walks`` (each position one step, the context the tokens before it), as
    the suffix proposer makes them (the last match length plus the new token as the hint): per lookup the
    wall and CPU time, and per match length whether the draft's first token is the next one."""
    wall, cpu, hits = [], [], {}
    drafted = 0
    for w in walks:
        hint = None
        for i in range(min(start, len(w) - 1), len(w) - 1):
            c0, t0 = time.thread_time(), time.perf_counter()
            res = retrieval.speculate(w[: i + 1], params, 64, hint=hint)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            hint = res.match_len + 1 if res.match_len else None
            if len(res):
                drafted += 1
                row = hits.setdefault(min(res.match_len, 16), [0, 0])
                row[0] += 1
                row[1] += res.token_ids[0] == w[i + 1]
            if len(wall) >= steps:
                break
        if len(wall) >= steps:
            break
    q = sorted(wall)
    return {
        "steps": len(wall),
        "median_us": statistics.median(wall) * 1e6,
        "p99_us": q[int(0.99 * (len(q) - 1))] * 1e6,
        "max_us": q[-1] * 1e6,
        "cpu_median_us": statistics.median(cpu) * 1e6,
        "cpu_p99_us": sorted(cpu)[int(0.99 * (len(cpu) - 1))] * 1e6,
        "drafted_share": drafted / max(1, len(wall)),
        "first_token_hit_by_match_len": {k: [n, round(h / n, 3)] for k, (n, h) in sorted(hits.items())},
    }


def bench_retrieval(tokenizer, db: Path, steps: int, log=print) -> dict:
    """The documents' draft lookup (``index.retrieval.DocumentRetrieval``, as the suffix proposer runs it: a
    tree of up to 32 nodes, factor 4, the request's prior continuation rates) per decoding step on the store
    ``db`` (e.g. a ``scale`` run's ``scale.db``), along held-out text (:func:`held_out_texts`: the matches
    are short and mostly chance) and along text copied from the corpus (long matches, drafts every step):
    median, 99th percentile and largest time per lookup, and how often the first drafted token came true
    by match length."""
    from suffixspec.index.retrieval import DocumentRetrieval
    from suffixspec.index.speculate import PRIOR_RATES, AcceptanceRates

    store = IndexStore(db)
    index = store.document_index(tokenizer)
    retrieval = DocumentRetrieval(index)
    res: dict = {
        "tokens": index.num_tokens,
        "segments": [s.num_tokens for s in index.segments],
        "min_match": retrieval.min_match,
        "load_average": os.getloadavg()[0],
    }
    params = SpecParams(
        max_spec_tokens=32,
        max_spec_factor=4.0,
        min_token_prob=0.1,
        use_tree_spec=True,
        rates=AcceptanceRates(PRIOR_RATES).table(),
    )
    held = [
        np.asarray(tokenizer(t, add_special_tokens=False)["input_ids"]).tolist() for t in held_out_texts()
    ]
    copied = [s.tolist() for s in sample_sequences(index, 200)]
    random.Random(7).shuffle(copied)
    for walks in (held, copied):  # warm the mapped pages the walks touch
        _walk_lookups(retrieval, walks, params, min(steps, 500))
    res["held_out"] = _walk_lookups(retrieval, held, params, steps)
    log(json.dumps({"held_out": res["held_out"]}))
    res["copied"] = _walk_lookups(retrieval, [w[:400] for w in copied], params, steps)
    log(json.dumps({"copied": res["copied"]}))
    store.close()
    return res
