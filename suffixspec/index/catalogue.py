"""The segment catalogue: which segments make up each tokenizer's document index, their files in the
arrays directory, their tombstones, how a new segment is committed, and the clean-up of files no
segment uses.

Beside ``index.db`` lives ``index.db.arrays/``: per tokenizer fingerprint, the document index in
segments (:mod:`index.segments`): ``<name>.tok`` (the token ids, 16-bit where the vocabulary allows),
``<name>.sa`` (int32 suffix array), ``.starts.npy``, ``.buckets.npy``, ``.docids.npy`` and, once
documents in it were deleted or replaced, ``<name>.dead-<tag>.npz`` (tombstones). The token ids live
there only: 6 bytes per token with the suffix array, besides the text.

A segment is sorted with no lock held, then becomes visible in one short ``BEGIN IMMEDIATE``
transaction with the rows that refer to it (:meth:`SegmentCatalogue.commit`); readers read the segment
list in one WAL snapshot and memory-map immutable files, so they see a complete segment set or the
previous one. A crash or Ctrl-C before the commit leaves the previous state (uncommitted files are
deleted, or collected by the next writer after a kill -9). Writers hold a shared ``flock`` on the
arrays directory while their uncommitted files exist (:meth:`SegmentCatalogue.build_guard`); garbage
collection runs only when it can take it exclusively.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import sqlite_utils

try:
    import fcntl
except ImportError:  # Windows: no flock; garbage collection then trusts that writers do not overlap
    fcntl = None  # type: ignore[assignment]

from .database import bump_docs_version, checkpoint, write_txn
from .segments import SegmentInfo, SegmentSet, SegmentWriter, sequence_bounds, tombstone_ranks
from .suffix_array import SuffixArray

SEGMENT_FILES = (".tok", ".sa", ".starts.npy", ".buckets.npy", ".docids.npy")

# Inside a commit: (connection, the new segments' ids) -> (each new segment's document id per sequence,
# -1 where that sequence is not live; the ids of other segments whose documents the commit replaced)
RowsFn = Callable[[sqlite3.Connection, list[int]], tuple[list[np.ndarray], set[int]]]


class SegmentCatalogue:
    """The ``segments`` table and the arrays directory of one store."""

    def __init__(self, db: sqlite_utils.Database, arrays_dir: Path, sort_depth: int) -> None:
        self.db = db
        self.arrays_dir = arrays_dir
        self.sort_depth = sort_depth  # suffix arrays are sorted (and looked up) to this depth
        self._cache: dict[str, SuffixArray] = {}  # segment name -> mapped arrays (no tombstones)
        self._dead_cache: dict[str, np.ndarray] = {}  # tombstone file -> ranks

    # ----- reading -------------------------------------------------------------------------------------
    def infos(self, fingerprint: str) -> list[SegmentInfo]:
        """The committed segments of one tokenizer."""
        if "segments" not in self.db.table_names():  # a read-only database of an earlier version
            return []
        return [SegmentInfo(id=r[0], name=r[1], tokens=r[2], dead_tokens=r[3], sequences=r[4], dead_sequences=r[5],
                            width=r[6], dead_file=r[7])
                for r in self.db.execute("SELECT id, name, n_tokens, dead_tokens, n_seqs, dead_seqs, width, dead "
                                         "FROM segments WHERE fingerprint = ? ORDER BY id", [fingerprint])]

    def fingerprints(self) -> list[str]:
        """The tokenizers that have segments."""
        if "segments" not in self.db.table_names():
            return []
        return [r[0] for r in self.db.execute("SELECT DISTINCT fingerprint FROM segments")]

    def live_sequences(self, fingerprint: str) -> int:
        """Documents live in the segments of ``fingerprint`` (each committed document is live in exactly one)."""
        return self.db.execute("SELECT coalesce(sum(n_seqs - dead_seqs), 0) FROM segments WHERE fingerprint = ?",
                               [fingerprint]).fetchone()[0]

    def segment(self, name: str) -> SuffixArray:
        sa = self._cache.get(name)
        if sa is None:
            sa = self._cache[name] = SuffixArray.load(self.arrays_dir / name, self.sort_depth)
        return sa

    def tombstones(self, dead_file: str | None) -> tuple[np.ndarray, np.ndarray]:
        """(dead ranks, dead sequence numbers) of a tombstone file."""
        if dead_file is None:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
        with np.load(self.arrays_dir / dead_file) as z:
            return z["ranks"], z["seqs"]

    def load(self, info: SegmentInfo) -> SuffixArray:
        """A segment, memory-mapped, with its tombstones."""
        sa = self.segment(info.name)
        if info.dead_file is None:
            return sa
        ranks = self._dead_cache.get(info.dead_file)
        if ranks is None:
            ranks = self._dead_cache[info.dead_file] = self.tombstones(info.dead_file)[0]
        return sa.with_dead(ranks)

    def segment_set(self, infos: list[SegmentInfo]) -> SegmentSet:
        """The segments ``infos`` looked up as one (raises FileNotFoundError when a file is missing: a merge
        replaced them since ``infos`` was read, or the arrays directory was not copied with the database)."""
        segs = [self.load(i) for i in infos]
        names = {i.name for i in infos}
        self._cache = {k: v for k, v in self._cache.items() if k in names}
        files = {i.dead_file for i in infos}
        self._dead_cache = {k: v for k, v in self._dead_cache.items() if k in files}
        return SegmentSet(segs, sum(i.live_tokens for i in infos), sum(i.sequences - i.dead_sequences for i in infos))

    def forget_mappings(self) -> None:
        self._cache.clear()

    def missing(self, fingerprint: str) -> list[SegmentInfo]:
        """Committed segments of ``fingerprint`` with a file missing from the arrays directory."""
        out = []
        for info in self.infos(fingerprint):
            files = [f"{info.name}{ext}" for ext in SEGMENT_FILES]
            if info.dead_file:
                files.append(info.dead_file)
            if not all((self.arrays_dir / f).exists() for f in files):
                out.append(info)
        return out

    # ----- writing --------------------------------------------------------------------------------------
    def new_prefix(self, fingerprint: str) -> Path:
        """A fresh file prefix for a segment being built."""
        self.arrays_dir.mkdir(parents=True, exist_ok=True)
        return self.arrays_dir / f"{fingerprint[:12]}-{int(time.time())}-{os.getpid()}-{secrets.token_hex(4)}"

    def commit(self, fingerprint: str, writers: Sequence[SegmentWriter], rows: RowsFn,
               status: Callable[[str], None] | None = None) -> None:
        """Sort ``writers``' segments (those not sorted yet, one after the other, no lock held), then make
        them visible in one transaction with the rows that refer to them.

        Inside the transaction, ``rows(conn, seg_ids)`` writes the document rows of the new segments and
        returns the document id of each of their sequences (-1: not live, e.g. changed meanwhile: a
        tombstone) and the other segments whose documents it replaced (their tombstones are updated). Any
        exception (a merge's conflict, Ctrl-C) rolls back and deletes the new segments' files.
        """
        docids_paths = [Path(w.prefix + ".docids.npy") for w in writers]
        files = [p for w, d in zip(writers, docids_paths, strict=True) for p in (*w.files, d)]
        try:
            for w in writers:
                if not w.sorted:
                    if status:
                        status(f"sorting {w.num_tokens} tokens")
                    w.finish()
            with write_txn(self.db) as written:
                written.extend(files)
                conn = self.db.conn
                seg_ids = [self._insert(conn, fingerprint, w) for w in writers]
                docids, touched = rows(conn, seg_ids)
                for sid, path, ids in zip(seg_ids, docids_paths, docids, strict=True):
                    _save_synced(path, ids)
                    if (ids < 0).any():
                        touched.add(sid)
                for sid in sorted(touched):
                    self.update_tombstones(conn, sid, written)
                bump_docs_version(self.db)
        except BaseException:
            for w in writers:
                w.abort()
            _unlink(files)
            raise
        checkpoint(self.db)

    def _insert(self, conn: sqlite3.Connection, fingerprint: str, writer: SegmentWriter) -> int:
        return conn.execute("INSERT INTO segments (fingerprint, name, width, n_tokens, n_seqs, dead, dead_seqs, "
                            "dead_tokens, created_at) VALUES (?, ?, ?, ?, ?, NULL, 0, 0, ?)",
                            [fingerprint, Path(writer.prefix).name, writer.width, writer.num_tokens,
                             len(writer.starts), time.time()]).lastrowid

    def update_tombstones(self, conn: sqlite3.Connection, seg_id: int, written: list[Path]) -> None:
        """Inside a write transaction: mark the documents of segment ``seg_id`` that are no longer live
        in it (deleted, replaced, or never committed) as tombstones; drop the segment when none is left."""
        name, old_file = conn.execute("SELECT name, dead FROM segments WHERE id = ?", [seg_id]).fetchone()
        live = np.array([r[0] for r in conn.execute("SELECT doc_id FROM doc_tokens WHERE segment = ?", [seg_id])],
                        dtype=np.int64)
        if len(live) == 0:
            conn.execute("DELETE FROM segments WHERE id = ?", [seg_id])
            return
        docids = np.load(self.arrays_dir / f"{name}.docids.npy")
        dead_seqs = np.flatnonzero(~np.isin(docids, live))
        old_ranks, old_seqs = self.tombstones(old_file)
        new_seqs = np.setdiff1d(dead_seqs, old_seqs)
        if len(new_seqs) == 0 and len(dead_seqs) == len(old_seqs):
            return
        sa = self.segment(name)
        ranks = tombstone_ranks(sa, new_seqs, self.arrays_dir / f"{name}.sa")
        if len(old_ranks):  # disjoint sets (other documents): one sorted array, sorted in place
            ranks = np.concatenate([old_ranks.astype(np.int32), ranks])
            ranks.sort()
        starts, ends = sequence_bounds(sa.starts, sa.num_suffixes)
        dead_tokens = int((ends[dead_seqs] - starts[dead_seqs] - 1).sum())
        path = self.arrays_dir / f"{name}.dead-{secrets.token_hex(4)}.npz"
        written.append(path)
        with open(path, "wb") as f:
            np.savez(f, ranks=ranks, seqs=dead_seqs)
            f.flush()
            os.fsync(f.fileno())
        conn.execute("UPDATE segments SET dead = ?, dead_seqs = ?, dead_tokens = ? WHERE id = ?",
                     [path.name, len(dead_seqs), dead_tokens, seg_id])

    # ----- files ------------------------------------------------------------------------------------------
    @contextmanager
    def build_guard(self) -> Iterator[None]:
        """A shared lock on the arrays directory while this writer has uncommitted array files."""
        self.arrays_dir.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            yield
            return
        fd = os.open(self.arrays_dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    def referenced_files(self) -> set[str]:
        """Names of the files the committed segments use."""
        keep = set()
        for name, dead in self.db.execute("SELECT name, dead FROM segments"):
            keep.update(f"{name}{ext}" for ext in SEGMENT_FILES)
            if dead:
                keep.add(dead)
        return keep

    def collect_garbage(self) -> None:
        """Delete array files no segment refers to (merged or replaced ones, leftovers of a killed writer,
        arrays of earlier versions). Skipped while another writer holds uncommitted files."""
        if not self.arrays_dir.exists():
            return
        fd = os.open(self.arrays_dir, os.O_RDONLY) if fcntl is not None else None
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return
            keep = self.referenced_files()
            for p in self.arrays_dir.iterdir():
                if p.name not in keep:
                    p.unlink(missing_ok=True)
        finally:
            if fd is not None:
                os.close(fd)

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.arrays_dir.iterdir()) if self.arrays_dir.exists() else 0


def _save_synced(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, arr)
        f.flush()
        os.fsync(f.fileno())


def _unlink(paths: Iterable[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)
