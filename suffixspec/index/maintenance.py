"""Merges and compaction of the segments (the LSM side of the document index).

Adds make small segments and deletes make tombstones; :class:`~index.segments.MergePolicy` plans which
segments to rewrite as one (tiers of similar sizes, mostly-dead segments, too many segments), and a
*compaction* rewrites the segments that are not full as the fewest segments of at most ``max_tokens``
(what a read-mostly corpus wants: every lookup asks each segment). A merge copies the live documents'
tokens into new segments with no lock held, then replaces its inputs in one transaction, and only if
no other writer touched them meanwhile (else it is dropped and planned again later).

Where merges run (in this process or a writer process at a low priority, in a background thread after
a server's adds) is the document index's choice: :class:`~index.document_index.DocumentIndex`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Sequence

import numpy as np
import sqlite_utils

from .catalogue import SegmentCatalogue
from .segments import MergePolicy, SegmentInfo, SegmentWriter, sequence_bounds


class _Conflict(Exception):
    """Another writer changed a merge's inputs (or the merge was stopped): the merge is dropped."""


class Merges:
    """Plans and runs the merges of one store's segments."""

    def __init__(self, db: sqlite_utils.Database, catalogue: SegmentCatalogue, policy: MergePolicy) -> None:
        self.db = db
        self.catalogue = catalogue
        self.policy = policy  # when segments are merged and compacted

    def pending(self, fingerprint: str | None = None) -> dict[str, list[list[int]]]:
        """Planned merges per fingerprint: groups of segment ids (see :class:`~index.segments.MergePolicy`)."""
        return self._plans(self.policy.plan, fingerprint)

    def compaction(self, fingerprint: str | None = None) -> dict[str, list[int]]:
        """Planned compactions per fingerprint: the segments :meth:`compact` would rewrite."""
        return self._plans(self.policy.compaction, fingerprint)

    def _plans(self, plan: Callable[[list[SegmentInfo]], list], fingerprint: str | None) -> dict[str, list]:
        """``plan(segments)`` of each fingerprint's segments, where it is not empty."""
        out = {}
        for fp in [fingerprint] if fingerprint else self.catalogue.fingerprints():
            got = plan(self.catalogue.infos(fp))
            if got:
                out[fp] = got
        return out

    def pending_tokens(self, compact: bool = False) -> int:
        """Live tokens the pending merges (and, with ``compact``, the compaction) would rewrite."""
        ids = {i for groups in self.pending().values() for g in groups for i in g}
        if compact:
            ids |= {i for group in self.compaction().values() for i in group}
        return sum(s.live_tokens for fp in self.catalogue.fingerprints() for s in self.catalogue.infos(fp)
                   if s.id in ids)

    def merge_pending(self, progress: Callable[[int], None] | None = None,
                      status: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> int:
        """Run the planned merges (and those they make due) until none is left; returns how many were done.
        ``progress(tokens)`` as tokens are copied; ``status(text)`` before each merge."""
        done = 0
        failed: set[tuple[int, ...]] = set()
        while not (stop is not None and stop.is_set()):
            plans = [(fp, g) for fp, groups in self.pending().items() for g in groups if tuple(g) not in failed]
            if not plans:
                break
            fp, group = plans[0]
            if self.merge(fp, group, progress, status, stop=stop):
                done += 1
            else:
                failed.add(tuple(group))
        return done

    def compact(self, progress: Callable[[int], None] | None = None,
                status: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> int:
        """Rewrite the segments that are not full into as few as ``max_tokens`` allows (see
        :meth:`MergePolicy.compaction`). Returns the number of compactions done (one per tokenizer at most)."""
        done = 0
        for fp, group in self.compaction().items():
            done += self.merge(fp, group, progress, status, split_tokens=self.policy.max_tokens, stop=stop)
        return done

    def merge(self, fp: str, seg_ids: Sequence[int], progress: Callable[[int], None] | None = None,
              status: Callable[[str], None] | None = None, split_tokens: int | None = None,
              stop: threading.Event | None = None) -> bool:
        """Rewrite segments ``seg_ids`` as one, tombstoned documents left out; False (nothing changed) if
        another writer touched one of them before the commit.

        ``split_tokens`` (a compaction): as several segments instead, each filled up to that many tokens
        before the next starts (whole documents; the first ones full, the last one the rest); each is sorted
        as soon as it is full, so memory stays that of one segment's sort, and all replace the inputs in
        one transaction. ``stop`` set: the merge is dropped at the next document (False).
        """
        cat = self.catalogue
        infos = {i.id: i for i in cat.infos(fp)}
        if not all(s in infos for s in seg_ids):
            return False
        inputs = [infos[s] for s in seg_ids]
        if status:
            status(f"merging {len(inputs)} segments ({sum(i.live_tokens for i in inputs)} tokens)")
        width = min(i.width for i in inputs)
        with cat.build_guard():
            writers = [SegmentWriter(cat.new_prefix(fp), width=width)]
            docmaps: list[list[int]] = [[]]
            try:
                for info in inputs:
                    docids = np.load(cat.arrays_dir / f"{info.name}.docids.npy")
                    dead = set(cat.tombstones(info.dead_file)[1].tolist())
                    starts = np.load(cat.arrays_dir / f"{info.name}.starts.npy")
                    tok = cat.arrays_dir / f"{info.name}.tok"
                    starts, ends = sequence_bounds(starts, os.path.getsize(tok) // info.width)
                    dtype = np.dtype(f">u{info.width}")
                    # read, not mapped: mapped pages would stay resident in this process (and count in its
                    # RSS) while the merged segment is sorted, 2 bytes per input token on top of the sort
                    with open(tok, "rb") as f:
                        for k in range(len(docids)):
                            if k in dead or docids[k] < 0:
                                continue
                            if stop is not None and stop.is_set():
                                raise _Conflict
                            n = int(ends[k] - starts[k] - 1)
                            if split_tokens and writers[-1].num_tokens and writers[-1].num_tokens + n > split_tokens:
                                if status:
                                    status(f"sorting {writers[-1].num_tokens} tokens")
                                writers[-1].finish()  # sorted now: one segment's sort in memory at a time
                                writers.append(SegmentWriter(cat.new_prefix(fp), width=width))
                                docmaps.append([])
                            f.seek(int(starts[k]) * info.width)
                            writers[-1].add(np.frombuffer(f.read(n * info.width), dtype=dtype))
                            docmaps[-1].append(int(docids[k]))
                            if progress:
                                progress(n)
            except _Conflict:
                for w in writers:
                    w.abort()
                return False
            except BaseException:
                for w in writers:
                    w.abort()
                raise

            def rows(conn: sqlite3.Connection, new_ids: list[int]) -> tuple[list[np.ndarray], set[int]]:
                for info in inputs:
                    row = conn.execute("SELECT dead FROM segments WHERE id = ?", [info.id]).fetchone()
                    if row is None or row[0] != info.dead_file:
                        raise _Conflict
                marks = ",".join("?" * len(inputs))
                if len(new_ids) == 1:
                    conn.execute(f"UPDATE doc_tokens SET segment = ? WHERE segment IN ({marks})",
                                 [new_ids[0], *[i.id for i in inputs]])
                else:
                    conn.executemany("UPDATE doc_tokens SET segment = ? WHERE doc_id = ? AND fingerprint = ?",
                                     [(sid, d, fp) for sid, m in zip(new_ids, docmaps, strict=True) for d in m])
                conn.execute(f"DELETE FROM segments WHERE id IN ({marks})", [i.id for i in inputs])
                return [np.asarray(m, dtype=np.int64) for m in docmaps], set()

            try:
                cat.commit(fp, writers, rows, status)
            except _Conflict:
                return False
        cat.collect_garbage()
        return True
