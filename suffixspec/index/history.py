"""The output history: finished outputs, bounded by a token budget (oldest evicted), persisted.

Held in an :class:`~index.incremental.IncrementalIndex` (appends are O(1), so adding a finished output
costs about a microsecond per token). When the budget is exceeded, the oldest outputs are dropped until
the history is at most ``evict_to`` of the budget, and the index is rebuilt from the rest in one
vectorised pass, so eviction costs O(budget) once per ``(1 - evict_to) * budget`` tokens added.

With a store, every output is also written to its ``history`` table (:class:`HistoryTable`, trimmed to
the same budget) and a restart reloads the newest outputs that fit the budget. Writing never stalls a request: if another process
holds the write lock (a long ``index add``), outputs wait in memory and go out with a later write
or :meth:`OutputHistory.flush`. A database that refuses writes (read-only file, full disk) never fails
a generation either: the outputs stay in memory only, ``write_error`` says why and ``write_failures``
counts them (the server reports both in ``/health`` and ``/metrics``).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import numpy as np
import sqlite_utils

from .database import busy_timeout, write_txn
from .incremental import IncrementalIndex
from .speculate import SpecParams, SpecResult

log = logging.getLogger(__name__)


class HistoryTable:
    """The ``history`` table: finished outputs per tokenizer fingerprint, oldest first."""

    def __init__(self, db: sqlite_utils.Database) -> None:
        self.db = db

    def append_many(self, fingerprint: str, outputs: Sequence[Sequence[int]], budget_tokens: int | None = None,
                    timeout_s: float | None = None) -> None:
        """Persist finished outputs in one transaction, then drop the oldest beyond ``budget_tokens``. With
        ``timeout_s``, wait at most that long for another writer (a long ``index add``) and raise
        ``sqlite3.OperationalError`` instead of blocking."""
        with busy_timeout(self.db, timeout_s), write_txn(self.db):
            for ids in outputs:
                blob = np.asarray(ids, dtype="<u4").tobytes()
                self.db.execute("INSERT INTO history (fingerprint, n_tokens, ids, created_at) VALUES (?, ?, ?, ?)",
                                [fingerprint, len(ids), blob, time.time()])
            if budget_tokens is not None:
                self._trim(fingerprint, budget_tokens)

    def _trim(self, fingerprint: str, budget_tokens: int) -> None:
        total = 0
        cutoff = None
        for hid, n in self.db.execute("SELECT id, n_tokens FROM history WHERE fingerprint = ? ORDER BY id DESC",
                                      [fingerprint]):
            total += n
            if total > budget_tokens:
                cutoff = hid
                break
        if cutoff is not None:
            self.db.execute("DELETE FROM history WHERE fingerprint = ? AND id <= ?", [fingerprint, cutoff])

    def load(self, fingerprint: str, budget_tokens: int | None = None) -> list[np.ndarray]:
        """Finished outputs for this tokenizer, oldest first, the newest ones within ``budget_tokens``."""
        out: list[np.ndarray] = []
        total = 0
        for n, blob in self.db.execute("SELECT n_tokens, ids FROM history WHERE fingerprint = ? ORDER BY id DESC",
                                       [fingerprint]):
            if budget_tokens is not None and total + n > budget_tokens:
                break
            total += n
            out.append(np.frombuffer(blob, dtype="<u4"))
        return out[::-1]

    def clear(self, fingerprint: str | None = None) -> None:
        if fingerprint is None:
            self.db.execute("DELETE FROM history")
        else:
            self.db.execute("DELETE FROM history WHERE fingerprint = ?", [fingerprint])

    def counts(self, fingerprint: str) -> tuple[int, int]:
        """(outputs, tokens) kept for ``fingerprint``."""
        return self.db.execute("SELECT count(*), coalesce(sum(n_tokens), 0) FROM history WHERE fingerprint = ?",
                               [fingerprint]).fetchone()


class _Persisted(Protocol):
    """A store that keeps the history (:class:`~index.store.IndexStore`)."""

    path: Path
    history: HistoryTable


# the least match length an answer start's draft is read as (SpecParams.rate): a 1-token match's prior rate
# (0.18, PRIOR_RATES) is that of a coincidence, a 2-token match's (0.45) keeps a start every earlier output
# shared above min_token_prob, and a start seen once (trust 1/2: 0.23) below a document's continuation of
# a 2-token match (0.45 x 0.65 = 0.29 at its second token; test_store_backed_documents_and_persistent_history)
START_EVIDENCE = 2


class OutputHistory:
    """Suffix index over earlier requests' outputs (one per tokenizer fingerprint)."""

    def __init__(self, budget_tokens: int = 1_000_000, store: _Persisted | None = None,
                 fingerprint: str | None = None, evict_to: float = 0.9, max_candidates: int = 128) -> None:
        if budget_tokens < 1:
            raise ValueError(f"budget_tokens must be >= 1, got {budget_tokens}")
        if store is not None and not fingerprint:
            raise ValueError("a persisted history needs the tokenizer fingerprint")
        self.budget_tokens = budget_tokens  # at most this many tokens are kept
        self.evict_to = evict_to  # after an eviction, keep at most this fraction of the budget
        self.store = store
        self.fingerprint = fingerprint
        self.max_candidates = max_candidates
        self._outputs: deque[np.ndarray] = deque()  # oldest first
        self._pending: list[np.ndarray] = []  # outputs not yet written to the store
        self._tokens = 0
        self.write_error: str | None = None  # why the last write failed (None: persisting works)
        self.write_failures = 0  # outputs the database refused to store (kept in memory only)
        self.index = IncrementalIndex(max_candidates)
        if store is not None:
            for seq in store.history.load(fingerprint, budget_tokens):
                self._outputs.append(seq)
                self._tokens += len(seq)
            self._rebuild()

    @property
    def num_tokens(self) -> int:
        return self._tokens

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def add(self, output_ids: Sequence[int]) -> None:
        """Remember one finished output (persisted when a store is attached)."""
        if len(output_ids) == 0:
            return
        seq = np.asarray(output_ids, dtype=np.uint32)
        if len(seq) > self.budget_tokens:
            seq = seq[-self.budget_tokens:]
        self._outputs.append(seq)
        self._tokens += len(seq)
        if self._tokens > self.budget_tokens:
            self._evict()
        else:
            self.index.add_sequence(seq)
        if self.store is not None:
            self._pending.append(seq)
            self.flush(timeout_s=0.05)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Write pending outputs to the store; False if the store stayed locked for ``timeout_s``."""
        if self.store is None or not self._pending:
            return True
        try:
            self.store.history.append_many(self.fingerprint, self._pending, self.budget_tokens, timeout_s)
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                if timeout_s is not None:
                    return False
                raise
            self._write_failed(e)
            return False
        except sqlite3.DatabaseError as e:  # SQLITE_FULL, I/O errors, a file made read-only under us
            self._write_failed(e)
            return False
        self._pending.clear()
        self.write_error = None
        return True

    def _write_failed(self, e: Exception) -> None:
        """Keep serving without persisting: the outputs stay in memory; warn once per new reason."""
        if str(e) != self.write_error:
            log.warning("the output history is not being saved to %s (%s); outputs are kept in memory only",
                        getattr(self.store, "path", "the database"), e)
        self.write_error = str(e)
        self.write_failures += len(self._pending)
        self._pending.clear()

    def _evict(self) -> None:
        keep = int(self.budget_tokens * self.evict_to)
        while self._outputs and self._tokens > keep and len(self._outputs) > 1:
            self._tokens -= len(self._outputs.popleft())
        self._rebuild()

    def _rebuild(self) -> None:
        # one vectorised pass: appending the outputs one by one relinked the whole buffer at each output
        # (quadratic), 19 s of CPU at start for a full 1M-token history of 128-token outputs
        self.index = IncrementalIndex.from_sequences(list(self._outputs), self.max_candidates)

    def clear(self) -> None:
        self._outputs.clear()
        self._tokens = 0
        self._rebuild()
        if self.store is not None:
            self.store.history.clear(self.fingerprint)

    def speculate(self, context: Sequence[int], params: SpecParams, max_depth: int = 64) -> SpecResult:
        return self.index.speculate(context, params, max_depth)

    def speculate_start(self, params: SpecParams) -> SpecResult:
        """Draft the first tokens of an output from how the newest earlier outputs began.

        An output's first tokens follow the prompt, which the history does not hold, so no suffix of
        the context matches them; but answers to similar requests often begin alike (an agent's tool
        call, a rewritten file's first line, a code fence). The newest ``max_candidates`` outputs'
        starts are counted as the occurrences of a match: a start all of them share is drafted at
        probability 1, one shared by half of them at 1/2, times ``k / (k + 1)`` for ``k`` outputs (cut by
        ``min_token_prob``). Example: earlier outputs ``[4, 5, 6]`` and ``[4, 5, 7]`` -> ``4 5`` at 2/3,
        then ``6`` and ``7`` at 1/3 each; with a budget of 1 (half of it rounds up to one node): ``4``.
        """
        starts, end = [], len(self.index)
        for seq in reversed(self._outputs):  # each output sits before its separator, newest last
            end -= len(seq) + 1
            starts.append(end)
            if len(starts) >= self.max_candidates:
                break
        # half the budget, the rest stays for the prompt's drafts; at least one node: the engine's cost-aware
        # budget is often 1 on a first step (measured on the tiny Llama), and half of 1 drafted nothing
        n = params.max_spec_tokens
        half = replace(params, max_spec_tokens=min(n, max(1, n // 2)))
        # read as a match of at least START_EVIDENCE tokens (its continuation rates): a small budget cuts the
        # draft but does not make it less likely. At budget 1 a start all earlier outputs shared was read as
        # a 1-token match (rate 0.18, then 2/3 trust: 0.12), and min_token_prob (0.1) pruned it once the rates
        # moved a little (test_text_match_and_answer_starts_keep_engine_output_with_gates_on, under load)
        res = self.index.speculate_at(starts, half, evidence=max(START_EVIDENCE, half.max_spec_tokens))
        trust = len(starts) / (len(starts) + 1)  # rule of succession: one earlier output is weak evidence
        res.probs = [p * trust for p in res.probs]
        res.score = sum(res.probs)
        return res

    def nbytes(self) -> int:
        return self.index.nbytes()
