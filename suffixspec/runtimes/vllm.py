"""suffixspec's drafters as a vLLM speculative proposer (``method="custom_class"``).

vLLM builds ``SuffixSpecProposer(vllm_config)`` in every worker of the last pipeline stage and, after
each step, calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``: one row per
batch slot, with the tokens sampled this step, the slot's token count and the slot's tokens (prompt
+ output so far). It returns one chain draft per slot; vLLM's rejection sampler verifies it, so the
output is exactly vLLM's output without speculation (greedy and sampled).

Drafts come from every registered drafter that needs no model (``drafting.registry.build_available``:
the suffix index, and any drafter declared so), forked per request and driven through the request
tracker the llama.cpp drafter uses too (:class:`~suffixspec.drafting.tracked.TrackedRequest`): the suffix index
drafts from the request's own context, plus the output history and the document corpus that all requests
share, configured for the single chain vLLM verifies: every source drafts its most likely path, and the
path with the highest score (expected accepted tokens) wins.

Request identity. The interface gives batch slots, not request ids, and vLLM moves requests between
slots (the batch is condensed when a request finishes), takes them out of the batch when they are
preempted or not scheduled in a step, and puts them back later. A request is recognised by its
tokens: the state last seen in a slot keeps it if the slot still holds that state's tokens (its
first and last tokens are compared, then the new ones are appended); otherwise any other live or
parked state whose tokens are a prefix of the slot's tokens is taken over (a relocated or resumed
request), else a new request starts. A state absent from a call has left the batch: its output so
far goes into the output history (finished; or preempted, in which case the rest follows when it
leaves again) and the state is parked for a possible resume. Worked example::

    call 1: slot 0 = [5 6 7 | 8]          new request A (prompt 5 6 7, sampled 8)
    call 2: slot 0 = [5 6 7 8 9 4]        A again: tokens 9 4 appended, draft from A's index
    call 3: slot 0 = [1 2 | 3]            A is gone: history += [8 9 4]; new request B
    call 4: slot 0 = [1 2 3 3], slot 1 = [5 6 7 8 9 4 2]   B; A resumed from its parked state

A wrong guess costs draft quality only, never correctness: vLLM verifies every drafted token.
When the engine goes idle (no call for ``IDLE_S``), the outputs of the requests seen last are saved
too: no later call will show them gone.

Storage. With ``SUFFIXSPEC_DB`` set (vLLM's speculative config accepts no extra fields), the
documents that ``suffixspec index add`` stored are drafted from, the output history is loaded at
start and finished outputs are appended to it. The engine thread never touches SQLite after start:
a writer thread persists outputs and a watcher thread picks up documents added while serving.
Only tensor-parallel rank 0 writes history (every rank sees the same requests).

Settings: ``SUFFIXSPEC_DB`` (the index database; unset = no documents, history in memory only),
``SUFFIXSPEC_VLLM_CONFIG`` (JSON object of :class:`~suffixspec.drafting.proposers.suffix.SuffixConfig`
fields, e.g. ``{"max_depth": 32, "history_tokens": 200000}``), ``SUFFIXSPEC_VLLM_RELOAD_S`` (how
often the watcher checks for new documents, seconds; default 5; 0 = never), ``SUFFIXSPEC_VLLM_SOURCES``
(comma-separated subset of the drafters' sources but ``references`` and ``prediction``, which a vLLM
request does not give: ``prompt,history,documents`` for the suffix index; default all).

Imports stay light: numpy, sqlite, the index package and the proposer; no Flask, no draft models
(``transformers`` only to fingerprint the tokenizer when a database is used; vLLM has loaded it).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import queue
import sqlite3
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from suffixspec.drafting.draft import SOURCE_PREDICTION, SOURCE_REFERENCES
from suffixspec.drafting.proposers import Proposer, RequestContext
from suffixspec.drafting.proposers.suffix import SuffixConfig, SuffixProposer, single_chain_config
from suffixspec.drafting.registry import build_available, source_names
from suffixspec.drafting.tracked import ContextView, TrackedRequest, token_key
from suffixspec.index.history import OutputHistory

log = logging.getLogger("suffixspec.runtimes.vllm")

ENV_DB = "SUFFIXSPEC_DB"
ENV_CONFIG = "SUFFIXSPEC_VLLM_CONFIG"
ENV_RELOAD = "SUFFIXSPEC_VLLM_RELOAD_S"
ENV_SOURCES = "SUFFIXSPEC_VLLM_SOURCES"
REQUEST_ONLY = (SOURCE_REFERENCES, SOURCE_PREDICTION)  # sources of per-request texts, which vLLM never gives
IDLE_S = 1.0  # no propose call for this long: the engine is idle, the live requests' outputs are saved


def _suffix_config() -> SuffixConfig:
    """The drafter's settings: ``SUFFIXSPEC_VLLM_CONFIG`` over the single-chain defaults."""
    raw = os.environ.get(ENV_CONFIG, "").strip()
    fields = {f.name for f in dataclasses.fields(SuffixConfig)}
    try:
        given = json.loads(raw) if raw else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{ENV_CONFIG} must be a JSON object of SuffixConfig fields ({e})") from None
    if not isinstance(given, dict) or set(given) - fields:
        bad = sorted(set(given) - fields) if isinstance(given, dict) else given
        raise ValueError(f"{ENV_CONFIG}: unknown setting(s) {bad}; choose from {sorted(fields)}")
    return single_chain_config(**given)  # vLLM verifies one chain


def vllm_sources() -> tuple[str, ...]:
    """What a vLLM request can draft from: every drafter's sources but the per-request texts."""
    return tuple(s for s in source_names() if s not in REQUEST_ONLY)


def _sources() -> tuple[str, ...]:
    """The sources requests draft from: ``SUFFIXSPEC_VLLM_SOURCES`` or all."""
    known = vllm_sources()
    raw = os.environ.get(ENV_SOURCES, "").strip()
    if not raw:
        return known
    given = tuple(s.strip() for s in raw.split(",") if s.strip())
    bad = [s for s in given if s not in known]
    if bad or not given:
        raise ValueError(f"{ENV_SOURCES}: unknown source(s) {bad}; give a comma-separated subset of {','.join(known)}")
    return given


def _tp_rank() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # not initialised (tests, a single process): act as the only rank
        return 0


class SuffixSpecProposer:
    """vLLM ``custom_class`` proposer: drafts from the request, the output history and documents (the suffix
    index), and from any other registered drafter that needs no model.

    ``LLM(model, speculative_config={"method": "custom_class", "model":
    "suffixspec.runtimes.vllm.SuffixSpecProposer", "num_speculative_tokens": 8})``.
    """

    def __init__(self, vllm_config: Any = None, *, num_speculative_tokens: int | None = None,
                 max_model_len: int | None = None, max_num_seqs: int | None = None,
                 db: str | os.PathLike | None = None, tokenizer: Any = None,
                 config: SuffixConfig | None = None, sources: tuple[str, ...] | None = None,
                 write_history: bool | None = None, idle_s: float = IDLE_S) -> None:
        spec = getattr(vllm_config, "speculative_config", None)
        model_cfg = getattr(vllm_config, "model_config", None)
        sched = getattr(vllm_config, "scheduler_config", None)
        self.k = int(num_speculative_tokens or getattr(spec, "num_speculative_tokens", 0) or 8)
        self.max_model_len = int(max_model_len or getattr(model_cfg, "max_model_len", 0) or 1 << 30)
        max_seqs = int(max_num_seqs or getattr(sched, "max_num_seqs", 0) or 256)
        self.config = config or _suffix_config()
        self.sources = sources or _sources()
        self.max_parked = 4 * max_seqs  # departed requests kept for a resume (their output is saved already)
        self.db = os.fspath(db) if db is not None else (os.environ.get(ENV_DB) or None)
        self.fingerprint: str | None = None
        self._tokenizer = tokenizer
        self._documents = None  # SuffixArray shared by all requests, swapped whole by the watcher
        self._history = OutputHistory(self.config.history_tokens, None, None, max_candidates=self.config.max_candidates)
        self._slots: dict[int, TrackedRequest] = {}  # batch slot -> request seen there in the last call
        self._by_key: dict[bytes, list[TrackedRequest]] = {}  # live and parked requests by their first tokens
        self._key_lens: set[int] = set()  # token lengths of those keys (KEY_TOKENS, or less for short prompts)
        self._parked: OrderedDict[int, TrackedRequest] = OrderedDict()  # id -> departed request, oldest first
        self._writes: queue.Queue[list[np.ndarray] | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._persist = False  # the writer thread runs: finished outputs go to SQLite
        self._lock = threading.Lock()  # propose vs. the writer's idle commit
        self._last_call = time.monotonic()  # when propose was last called
        self.idle_s = idle_s  # no call for this long: save the live outputs
        self.calls = 0  # propose calls (tests, logs)
        if self.db is not None:
            self._open_store(model_cfg, write_history if write_history is not None else _tp_rank() == 0)
        # the drafters every request forks (a fork shares their history, documents and learned rates); the
        # suffix index's history is this worker's, which the writer persists. No tokenizer is offered: the
        # index matches tokens here (text matching would build the vocabulary's bytes in every worker)
        self.proposers: list[Proposer] = build_available(
            {"history": self._history},
            {"suffix": {"config": self.config, "documents": self._documents}})
        # outputs of requests still running are saved when the process exits normally
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref().close())

    # ----- storage ---------------------------------------------------------------------------------
    def _open_store(self, model_cfg: Any, write_history: bool) -> None:
        """Load the documents and the persisted history; start the writer and the watcher."""
        from suffixspec.index.fingerprint import tokenizer_fingerprint
        from suffixspec.index.store import IndexStore

        if self._tokenizer is None:
            from transformers import AutoTokenizer

            name = getattr(model_cfg, "tokenizer", None) or getattr(model_cfg, "model", None)
            if name is None:
                raise ValueError(f"{ENV_DB} is set but the target tokenizer is unknown: pass tokenizer=...")
            self._tokenizer = AutoTokenizer.from_pretrained(
                name, revision=getattr(model_cfg, "tokenizer_revision", None),
                trust_remote_code=bool(getattr(model_cfg, "trust_remote_code", False)))
        self.fingerprint = tokenizer_fingerprint(self._tokenizer)
        store = IndexStore(self.db)
        try:
            # documents stored under another tokenizer are tokenized once here, at start-up
            self._documents = store.document_index(self._tokenizer)
            self._docs_version = store.docs_version()
            for seq in store.history.load(self.fingerprint, self.config.history_tokens):
                self._history.add(seq)
        finally:
            store.close()
        log.info("suffixspec: %s: %d document tokens, %d history tokens", self.db,
                 0 if self._documents is None else self._documents.num_tokens, self._history.num_tokens)
        if write_history:
            self._persist = True
            self._start(self._writer, "suffixspec-history-writer")
        reload_s = float(os.environ.get(ENV_RELOAD, "5"))
        if reload_s > 0:
            self._start(lambda: self._watcher(reload_s), "suffixspec-document-watcher")

    def _start(self, target: Any, name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _writer(self) -> None:
        """Persist finished outputs (its own connection; waits out a long ``index add``, not the engine)."""
        from suffixspec.index.store import IndexStore

        store = IndexStore(self.db)
        try:
            while True:
                try:
                    item = self._writes.get(timeout=min(self.idle_s / 4, 1.0))
                except queue.Empty:
                    self._commit_when_idle()  # queues the outputs it takes; written next round
                    continue
                batch = [] if item is None else list(item)
                done = item is None
                while not self._writes.empty():  # group what queued up meanwhile into one transaction
                    more = self._writes.get_nowait()
                    done = done or more is None
                    batch.extend(more or [])
                for attempt in range(5):
                    try:
                        if batch:
                            store.history.append_many(self.fingerprint, batch, self.config.history_tokens)
                        break
                    except sqlite3.OperationalError as e:  # locked past busy_timeout: try again later
                        log.warning("suffixspec: history write failed (%s), attempt %d", e, attempt + 1)
                        time.sleep(1.0)
                if done:
                    return
        finally:
            store.close()

    def _commit_when_idle(self) -> None:
        """The engine stopped calling (no request left, or shutting down): save the live outputs now.

        vLLM tells a proposer nothing when a request finishes; the next call shows it gone. When no
        call comes for ``idle_s``, the outputs of the requests seen last are saved here instead (a
        request that goes on later adds the rest when it leaves)."""
        if time.monotonic() - self._last_call < self.idle_s:
            return
        with self._lock:
            if time.monotonic() - self._last_call >= self.idle_s:
                for req in self._slots.values():
                    self._commit(req)

    def _watcher(self, every_s: float) -> None:
        """Swap in the document arrays when ``index add`` / ``remove`` changed the corpus."""
        from suffixspec.index.store import IndexStore

        store = IndexStore(self.db)
        try:
            while not self._stop.wait(every_s):
                try:
                    version = store.docs_version()
                    if version != self._docs_version:
                        self._documents = store.document_index(self._tokenizer)
                        self._docs_version = version
                        log.info("suffixspec: documents reloaded (version %d)", version)
                except sqlite3.Error as e:  # a busy or replaced file: keep serving the arrays we have
                    log.warning("suffixspec: document reload failed: %s", e)
        finally:
            store.close()

    def close(self, timeout_s: float = 10.0) -> None:
        """Save the outputs of requests still known and stop the threads (idempotent)."""
        if self._stop.is_set():
            return
        with self._lock:
            for req in list(self._slots.values()):
                self._commit(req)
        self._stop.set()
        if self._persist:
            self._writes.put(None)
        for t in self._threads:
            t.join(timeout_s)

    # ----- vLLM's interface ------------------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load (vLLM calls this with the target model)."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """One chain draft (at most ``num_speculative_tokens``) per batch slot; ``[]`` for no draft."""
        with self._lock:  # the writer thread may save live outputs while the engine is idle
            self._last_call = time.monotonic()
            return self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    def _propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                 token_ids_cpu: np.ndarray) -> list[list[int]]:
        self.calls += 1
        rows = len(sampled_token_ids)
        found: dict[int, TrackedRequest] = {}
        claimed: set[int] = set()
        # 1. slots that still hold the request seen there last time (the usual case)
        for i in range(rows):
            req = self._slots.get(i)
            if req is not None and req.holds(token_ids_cpu[i], int(num_tokens_no_spec[i])):
                found[i] = req
                claimed.add(id(req))
        # 2. the others: a request that moved or resumed, else a new one (not during a partial prefill)
        for i in range(rows):
            if i in found:
                continue
            row, n = token_ids_cpu[i], int(num_tokens_no_spec[i])
            req = self._find(row, n, claimed)
            if req is None and sampled_token_ids[i] and n > len(sampled_token_ids[i]):
                req = self._new(row, n, len(sampled_token_ids[i]))
            if req is not None:
                found[i] = req
                claimed.add(id(req))
                self._parked.pop(id(req), None)
        # 3. requests that left the batch: their output so far goes to the history; parked for a resume
        for req in self._slots.values():
            if id(req) not in claimed:
                self._commit(req)
                self._parked[id(req)] = req
        while len(self._parked) > self.max_parked:
            _, old = self._parked.popitem(last=False)
            self._forget(old)
        self._slots = found
        # 4. drafts
        drafts: list[list[int]] = []
        documents = self._documents
        for i in range(rows):
            req = found.get(i)
            n = int(num_tokens_no_spec[i])
            if req is None or not sampled_token_ids[i]:
                drafts.append([])
                continue
            row = token_ids_cpu[i]
            if n > req.n:
                req.append(row[req.n:n])
                req.tell()
            budget = min(self.k, self.max_model_len - n - 1)
            if budget <= 0:
                drafts.append([])
                continue
            for p in req.proposers:  # documents added while serving reach the requests already running
                if isinstance(p, SuffixProposer):
                    p.documents = documents
            drafts.append(req.propose(ContextView(row, n), budget).tokens)
        return drafts

    # ----- request bookkeeping -----------------------------------------------------------------------
    def _find(self, row: np.ndarray, n: int, claimed: set[int]) -> TrackedRequest | None:
        """The longest unclaimed known request whose tokens start ``row[:n]``."""
        best = None
        for length in self._key_lens:
            for req in self._by_key.get(token_key(row, min(n, length)), ()):
                if id(req) not in claimed and (best is None or req.n > best.n) and req.prefix_of(row, n):
                    best = req
        return best

    def _new(self, row: np.ndarray, n: int, n_sampled: int) -> TrackedRequest:
        """A request first seen now: forks of the drafters (sharing the history, the documents and what each
        source's drafts are worth, ``SuffixProposer._learn``) begin with its prompt and learn its output."""
        request = RequestContext(prompt_ids=row[:n - n_sampled].tolist(), drafters=self.sources)
        req = TrackedRequest.new([p.fork() for p in self.proposers], row, n, request)
        self._by_key.setdefault(req.key, []).append(req)
        self._key_lens.add(req.key_len)
        return req

    def _forget(self, req: TrackedRequest) -> None:
        same = self._by_key.get(req.key, [])
        if req in same:
            same.remove(req)
        if not same:
            self._by_key.pop(req.key, None)

    def _commit(self, req: TrackedRequest) -> None:
        """Add the request's output not yet in the history (in memory now; SQLite by the writer)."""
        if req.n <= req.committed:
            return
        out = req.uncommitted()
        self._history.add(out)
        if self._persist and not self._stop.is_set():
            self._writes.put([out])

    # ----- introspection ---------------------------------------------------------------------------
    @property
    def history_tokens(self) -> int:
        """Tokens in the in-memory output history of this worker."""
        return self._history.num_tokens

    @property
    def live_requests(self) -> int:
        return len(self._slots)

    @property
    def parked_requests(self) -> int:
        return len(self._parked)
