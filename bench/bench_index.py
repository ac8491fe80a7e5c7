"""Benchmark of the suffix index (index/): append, speculate, memory, a 5M-token corpus, history growth.

Run: ``python -m bench.bench_index [--tokens 5000000] [--tokenizer NAME_OR_PATH] [--json out.json]``

Sections:

1. **micro** — on ~311k tokens of standard-library source (as PEERS.md): appending tokens (one per
   call and in runs of 16), speculating from 64-token contexts (per call and per drafted token,
   path and tree), bytes per indexed token. suffixspec's incremental index (request / history) and
   its static suffix array (documents) side by side with ArcticInference's C++ suffix tree when it is
   installed in ``/work/arctic-venv`` (``--arctic-python``); it runs there in a subprocess on the same
   token data, same machine, same moment.
2. **corpus** — the Python standard library tokenized to ``--tokens`` tokens: time to index through
   the SQLite store (tokenize + store + suffix array + save), the longest wait of another writer
   (a thread writing every 50 ms, as a server's history does) meanwhile, to load (memory-map), the median
   lookup time; bytes per token on disk and in memory.
3. **history** — a repetitive workload (similar templated requests in sequence): the mean accepted
   length per request, with a perfect-oracle verifier (the "target" output is known), grows as the
   output history fills.

Tokenizer: ``--tokenizer`` (a hub id, a local directory, or the embedded ``suffixspec/demo-target``,
the default when present); otherwise a byte-level BPE (8k entries) is trained on a slice of the corpus.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from index.incremental import IncrementalIndex
from index.speculate import SpecParams
from index.store import DocInput, IndexStore
from index.suffix_array import SEP, SuffixArray

ARCTIC_PYTHON = "/work/arctic-venv/bin/python"
PEERS = {"append_us_per_token": "1.1-1.5", "speculate_us_per_call": 92.0, "speculate_us_per_drafted_token": 5.8,
         "mean_draft_tokens": 15.9, "bytes_per_token": 360.0}


# ----- corpus -----------------------------------------------------------------------------------------
def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.rglob("*.py")) if "site-packages" not in p.parts]
    return files


def load_texts(max_chars: int | None = None) -> list[tuple[str, str]]:
    out, total = [], 0
    for p in stdlib_files():
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) > 2_000_000:
            continue
        out.append((str(p), text))
        total += len(text)
        if max_chars is not None and total >= max_chars:
            break
    return out


def get_tokenizer(name: str | None, texts: list[tuple[str, str]]):
    if name is None:
        try:
            from suffixspec.loading import DEFAULT_TARGET, load_tokenizer

            return load_tokenizer(DEFAULT_TARGET), DEFAULT_TARGET
        except Exception:  # the embedded model may not be trained yet
            pass
    if name:
        from suffixspec.loading import load_tokenizer

        return load_tokenizer(name), name
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([t for _, t in texts[::20]], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok), "byte-level BPE 8k trained on a stdlib slice"


def tokenize(tokenizer, texts: list[tuple[str, str]], limit: int) -> list[np.ndarray]:
    from index.store import encode_batched

    out, total = [], 0
    for i in range(0, len(texts), 256):
        for arr in encode_batched(tokenizer, [t for _, t in texts[i:i + 256]]):
            out.append(arr)
            total += len(arr)
            if total >= limit:
                return out
    return out


# ----- helpers -----------------------------------------------------------------------------------------
def contexts(seqs: list[np.ndarray], n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` contexts of ``length`` tokens cut from the corpus (as a request copying from it would be)."""
    rng = random.Random(seed)
    long = [s for s in seqs if len(s) > length + 8]
    out = []
    while len(out) < n:
        s = long[rng.randrange(len(long))]
        j = rng.randrange(length, len(s) - 1)
        out.append(s[j - length:j].tolist())
    return out


def timed(fn, items) -> tuple[float, list]:
    t = time.perf_counter()
    res = [fn(x) for x in items]
    return time.perf_counter() - t, res


def fmt(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


# ----- 1. micro ---------------------------------------------------------------------------------------
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
            idx2.extend(s[i:i + 16])
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
            out = subprocess.run([python, str(script), str(data)], capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"not run: {e}"
        if out.returncode != 0:
            return f"failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
        return json.loads(out.stdout.strip().splitlines()[-1])


class WriteProbe:
    """A thread that writes to the database every ``period_s`` (as a server persisting its output
    history would) and records the longest wait for the write lock."""

    def __init__(self, db: Path, period_s: float = 0.05) -> None:
        import threading

        self.db, self.period_s, self.max_wait = db, period_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import sqlite3

        conn = sqlite3.connect(str(self.db), timeout=600, isolation_level=None)
        conn.execute("CREATE TABLE IF NOT EXISTS bench_probe (t REAL)")
        while not self._stop.wait(self.period_s):
            t = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            self.max_wait = max(self.max_wait, time.perf_counter() - t)
            conn.execute("INSERT INTO bench_probe VALUES (?)", [t])
            conn.execute("COMMIT")
        conn.close()

    def __enter__(self) -> WriteProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ----- 2. corpus ----------------------------------------------------------------------------------------
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
        arrays = [np.asarray(s) for s in seqs]
        ctxs = contexts(arrays, n_lookups, 64, seed=2)
        rng = random.Random(3)
        for c in ctxs[::2]:  # half the contexts do not occur verbatim: the match is shorter than 64
            c[rng.randrange(0, 60)] = 1
        lookups, matches = [], []
        sa.match(ctxs[0])
        for c in ctxs:
            t0 = time.perf_counter()
            L, _, _ = sa.match(c)
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


# ----- 3. history on a repetitive workload ----------------------------------------------------------------
def templated_requests(tokenizer, n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Agent-like requests: the same tool-call template, different arguments each time."""
    rng = random.Random(seed)
    names = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    actions = ["read_file", "list_dir", "run_tests", "search_code"]
    out = []
    for i in range(n):
        name, action, num = rng.choice(names), rng.choice(actions), rng.randrange(1000)
        prompt = f"Task {i}: call {action} on the {name} module with limit {num}.\n"
        output = (f'{{"tool": "{action}", "arguments": {{"path": "src/{name}/main.py", "limit": {num}, '
                  f'"recursive": true, "encoding": "utf-8"}}, "reason": "The user asked to {action.replace("_", " ")} '
                  f'for the {name} module, so I call the tool with the requested limit of {num}."}}\n')
        enc = tokenizer(prompt, add_special_tokens=False)["input_ids"], tokenizer(output, add_special_tokens=False)["input_ids"]
        out.append((list(enc[0]), list(enc[1])))
    return out


def simulate(proposer, prompt: list[int], target: list[int], budget: int = 16) -> tuple[int, int]:
    """Greedy verification against a known output: returns (steps, accepted draft tokens)."""
    from suffixspec.proposers import RequestContext

    proposer.begin(RequestContext(prompt_ids=list(prompt)))
    out: list[int] = []
    steps = accepted = 0
    while len(out) < len(target):
        draft = proposer.propose(prompt + out, budget)
        # walk the tree along the true continuation
        node, n_acc = -1, 0
        while len(out) + n_acc < len(target):
            want = target[len(out) + n_acc]
            nxt = next((i for i, (tok, par) in enumerate(zip(draft.tokens, draft.parents, strict=True))
                        if par == node and tok == want), None)
            if nxt is None:
                break
            node, n_acc = nxt, n_acc + 1
        new = target[len(out):len(out) + n_acc + 1]  # accepted + the target's own token
        out.extend(new)
        proposer.update(new)
        steps += 1
        accepted += n_acc
    proposer.end(out)
    return steps, accepted


def bench_history(tokenizer, n_requests: int) -> dict:
    from suffixspec.proposers.suffix import SuffixConfig, SuffixProposer

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
    return {"requests": n_requests, "output_tokens_per_request": sum(len(t) for _, t in reqs) / n_requests,
            "mean_accepted_length_by_request": buckets, "history_tokens": proposer.history.num_tokens}


# ----- report -----------------------------------------------------------------------------------------
def report(results: dict) -> None:
    m = results.get("micro")
    if m:
        a = m.get("arctic")
        print(f"\n== micro: {m['tokens']:,} tokens of stdlib source, depth 64, contexts of 64 tokens ==")
        rows = [
            ("append, 1 token per call (us/token)", m["incremental_append_us_per_token"], "append_us_per_token"),
            ("append, runs of 16 (us/token)", m["incremental_extend16_us_per_token"], "extend16_us_per_token"),
            ("speculate path (us/call)", m["incremental_path_speculate_us_per_call"], "path_speculate_us_per_call"),
            ("speculate path (us/drafted token)", m["incremental_path_us_per_drafted_token"], "path_us_per_drafted_token"),
            ("speculate path (mean draft tokens)", m["incremental_path_mean_draft_tokens"], "path_mean_draft_tokens"),
            ("speculate tree (us/call)", m["incremental_tree_speculate_us_per_call"], "tree_speculate_us_per_call"),
            ("speculate tree (us/drafted token)", m["incremental_tree_us_per_drafted_token"], "tree_us_per_drafted_token"),
            ("speculate tree (mean draft tokens)", m["incremental_tree_mean_draft_tokens"], "tree_mean_draft_tokens"),
            ("bytes per indexed token", m["incremental_bytes_per_token"], "bytes_per_token"),
        ]
        sa_keys = {"speculate path (us/call)": "suffix_array_path_speculate_us_per_call",
                   "speculate path (us/drafted token)": "suffix_array_path_us_per_drafted_token",
                   "speculate path (mean draft tokens)": "suffix_array_path_mean_draft_tokens",
                   "speculate tree (us/call)": "suffix_array_tree_speculate_us_per_call",
                   "speculate tree (us/drafted token)": "suffix_array_tree_us_per_drafted_token",
                   "speculate tree (mean draft tokens)": "suffix_array_tree_mean_draft_tokens",
                   "bytes per indexed token": "suffix_array_bytes_per_token"}
        print(f"{'':40s} {'incremental':>12s} {'suffix array':>13s} {'arctic C++':>11s}")
        for label, mine, akey in rows:
            sa_v = m.get(sa_keys.get(label, ""), None)
            av = a.get(akey) if isinstance(a, dict) else None
            print(f"{label:40s} {fmt(mine):>12s} {fmt(sa_v) if sa_v is not None else '-':>13s} "
                  f"{fmt(av) if av is not None else '-':>11s}")
        if not isinstance(a, dict):
            print(f"ArcticInference: {a or 'not installed'}; PEERS.md figures on this machine class: {PEERS}")
    c = results.get("corpus")
    if c:
        print(f"\n== corpus: {c['tokens']:,} tokens in {c['documents']} files ==")
        for k in ("tokenize_s", "index_add_s", "other_writer_max_wait_s", "suffix_array_build_s", "load_s",
                  "lookup_median_us", "lookup_p90_us", "lookup_mean_match_len", "speculate_tree_median_us", "memory_bytes_per_token",
                  "arrays_bytes_per_token", "bytes_on_disk_per_token"):
            print(f"{k:32s} {fmt(c[k])}")
    h = results.get("history")
    if h:
        print(f"\n== history: {h['requests']} templated requests, {h['output_tokens_per_request']:.0f} output tokens each ==")
        for k, v in h["mean_accepted_length_by_request"].items():
            print(f"mean accepted length, {k:18s} {v:.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=5_000_000, help="corpus size for the corpus section")
    ap.add_argument("--micro-tokens", type=int, default=311_000, help="tokens for the micro section")
    ap.add_argument("--contexts", type=int, default=2000, help="speculate / lookup calls measured")
    ap.add_argument("--requests", type=int, default=100, help="requests in the history section")
    ap.add_argument("--tokenizer", default=None, help="tokenizer name or path (default: demo-target or a trained BPE)")
    ap.add_argument("--arctic-python", default=ARCTIC_PYTHON if os.path.exists(ARCTIC_PYTHON) else None,
                    help="python of a venv with arctic-inference (default /work/arctic-venv if present)")
    ap.add_argument("--sections", default="micro,corpus,history")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    t = time.perf_counter()
    texts = load_texts()
    tokenizer, tok_name = get_tokenizer(args.tokenizer, texts)
    print(f"tokenizer: {tok_name}; {len(texts)} stdlib files; cores: {os.cpu_count()}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    results: dict = {"tokenizer": tok_name, "load_average": os.getloadavg()[0]}
    if "micro" in sections:
        seqs = tokenize(tokenizer, texts, args.micro_tokens)
        results["micro"] = bench_micro(seqs, args.contexts, args.arctic_python)
    if "corpus" in sections:
        results["corpus"] = bench_corpus(tokenizer, texts, args.tokens, args.contexts)
    if "history" in sections:
        results["history"] = bench_history(tokenizer, args.requests)
    results["wall_s"] = time.perf_counter() - t
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    assert SEP == 0xFFFFFFFF


if __name__ == "__main__":
    main(sys.argv[1:])
