"""The SQLite store (sqlite-utils, WAL) behind the document corpus and the output history.

Tables::

    documents   id, path (unique), content_hash, text, metadata (JSON), n_bytes, added_at
    doc_tokens  (doc_id, fingerprint) -> n_tokens, segment (the segment holding the live version);
                ids (uint32 blob) only in databases of earlier versions, until their first load
    segments    id, fingerprint, name, width, n_tokens, n_seqs, dead (tombstone file), dead_seqs,
                dead_tokens, created_at
    tokenizers  fingerprint -> name, added_at
    history     id, fingerprint, n_tokens, ids (blob), created_at      (finished outputs, oldest first)
    meta        key -> value: "docs_version" (bumped by every change of the document index)

Beside ``index.db`` lives ``index.db.arrays/``: per tokenizer fingerprint, the document index in
segments (:mod:`index.segments`): ``<name>.tok`` (the token ids, 16-bit where the vocabulary allows),
``<name>.sa`` (int32 suffix array), ``.starts.npy``, ``.buckets.npy``, ``.docids.npy`` and, once
documents in it were deleted or replaced, ``<name>.dead-<tag>.npz`` (tombstones). The token ids live
there only: 6 bytes per token with the suffix array, besides the text.

Writes:

- an add streams its documents (tokenized in batches) into a fresh segment file, sorts it with no lock
  held, then commits the document rows and the segment in one short ``BEGIN IMMEDIATE`` transaction;
  a large add commits a segment every ``flush_tokens`` tokens, so memory stays bounded. Replaced
  documents get tombstones in their old segments (one pass over that segment's suffix array);
- a remove deletes the rows and writes tombstones, in one transaction;
- merges (:class:`~index.segments.MergePolicy`) rewrite several segments into one with the tombstoned
  documents left out; they run after adds in a background thread (``auto_merge``, which hands them to a
  writer process at the lowest CPU priority, :mod:`suffixspec.index.writer`) or on request
  (:meth:`IndexStore.merge_pending`), and commit only if no input changed meanwhile;
- a serving process's large adds and ``index add`` run these same methods in a writer process
  (:mod:`suffixspec.index.writer`), so that their tokenizing and sorting yield the cores to generations.

Readers never wait: they read the segment list in one WAL snapshot and memory-map immutable files; a
new segment becomes visible when its transaction commits, a crash or Ctrl-C before that leaves the
previous state (uncommitted files are deleted, or collected by the next writer after a kill -9).
Writers hold a shared ``flock`` on the arrays directory while their uncommitted files exist; garbage
collection runs only when it can take it exclusively.

A database whose arrays are missing (copied without its ``.arrays`` folder) or that an earlier version
wrote is repaired on load: the missing segments are rebuilt from the token ids still in the database,
or from the text with the tokenizer at hand, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sqlite_utils

try:
    import fcntl
except ImportError:  # Windows: no flock; garbage collection then trusts that writers do not overlap
    fcntl = None  # type: ignore[assignment]

from .fingerprint import encode_texts, tokenizer_fingerprint, tokenizer_name
from .segments import MergePolicy, SegmentInfo, SegmentSet, SegmentWriter, sequence_bounds, tombstone_ranks
from .suffix_array import DEFAULT_SORT_DEPTH, SuffixArray

DB_ENV = "SUFFIXSPEC_DB"
TOKENIZE_BATCH_CHARS = 2_000_000  # text per tokenizer batch: parallel enough, memory bounded
TOKENIZE_BATCH_DOCS = 512
FLUSH_TOKENS = 16 << 20  # an add commits a segment at least every this many tokens (~10 bytes/token to sort)
log = logging.getLogger("suffixspec.index")

ProgressFn = Callable[[int, int, int], None]  # (documents, tokens, bytes) done since the last call


class StoreError(RuntimeError):
    """The database file cannot be used as a suffixspec index (not SQLite, corrupt, another program's)."""


# table -> columns this store needs; a file with other tables but not these is someone else's database
_SCHEMA = {"documents": {"id", "path", "content_hash", "text", "metadata", "n_bytes", "added_at"},
           "doc_tokens": {"doc_id", "fingerprint", "n_tokens", "ids"},
           "tokenizers": {"fingerprint", "name", "added_at"},
           "history": {"id", "fingerprint", "n_tokens", "ids", "created_at"},
           "meta": {"key", "value"}}


def default_db_path() -> Path:
    """``$SUFFIXSPEC_DB``, else ``$XDG_DATA_HOME/suffixspec/index.db`` (``~/.local/share/suffixspec/index.db``)."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "suffixspec" / "index.db"


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def encode_batched(tokenizer: Any, texts: Sequence[str], progress: Callable[[int], None] | None = None,
                   batch_chars: int = TOKENIZE_BATCH_CHARS) -> list[np.ndarray]:
    """Token ids (uint32, no special tokens) of each text, encoded in batches of about ``batch_chars``
    characters (at most ``TOKENIZE_BATCH_DOCS`` texts); ``progress(n)`` after each batch of ``n`` texts.

    A fast tokenizer encodes each batch in parallel in Rust (``encode_batch_fast``: the same ids as
    ``encode_batch`` without computing character offsets); others go through ``encode_texts``.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)
    out: list[np.ndarray] = []
    i = 0
    while i < len(texts):
        j, size = i, 0
        while j < len(texts) and (j == i or (size < batch_chars and j - i < TOKENIZE_BATCH_DOCS)):
            size += len(texts[j])
            j += 1
        chunk = list(texts[i:j])
        if fast is not None:
            out.extend(np.asarray(e.ids, dtype=np.uint32) for e in fast(chunk, add_special_tokens=False))
        else:
            out.extend(encode_texts(tokenizer, chunk))
        if progress:
            progress(j - i)
        i = j
    return out


@dataclass
class DocInput:
    """A document to add."""

    text: str  # the content
    path: str | None = None  # source path (the identity of the document); None = "text:<hash prefix>"
    metadata: dict[str, Any] = field(default_factory=dict)  # free-form, stored as JSON

    def key(self) -> str:
        return self.path if self.path else f"text:{content_hash(self.text)[:16]}"


@dataclass
class AddSummary:
    """What an add did."""

    added: int = 0  # new documents
    updated: int = 0  # documents whose content changed (old version replaced)
    unchanged: int = 0  # same path, same content hash: nothing written
    skipped: int = 0  # files not indexed (binary, too large, unreadable), counted by the caller
    tokens: int = 0  # tokens of the added and updated documents
    ids: list[int] = field(default_factory=list)  # document ids added or updated

    def to_dict(self) -> dict[str, Any]:
        return {"added": self.added, "updated": self.updated, "unchanged": self.unchanged,
                "skipped": self.skipped, "tokens": self.tokens, "ids": self.ids}


class _Conflict(Exception):
    """Another writer changed a merge's inputs: the merge is dropped (planned again later)."""


@dataclass
class _Staged:
    """A document tokenized into the segment being written, waiting for its commit."""

    doc: DocInput
    hash: str
    n_tokens: int
    superseded: bool = False  # a later document of this add has the same key


class IndexStore:
    """Documents, their segmented suffix index per tokenizer fingerprint, and the output history."""

    def __init__(self, path: str | os.PathLike | None = None, sort_depth: int = DEFAULT_SORT_DEPTH, *,
                 readonly: bool = False, auto_merge: bool = True, policy: MergePolicy | None = None,
                 flush_tokens: int = FLUSH_TOKENS) -> None:
        self.path = Path(path).expanduser() if path else default_db_path()
        self.arrays_dir = Path(str(self.path) + ".arrays")
        self.sort_depth = sort_depth
        self.readonly = readonly  # open without writing anything (a worker of another program, a copy)
        self.auto_merge = auto_merge and not readonly  # merge segments in a background thread after writes
        self.policy = policy or MergePolicy()
        self.flush_tokens = flush_tokens
        self._cache: dict[str, SuffixArray] = {}  # segment name -> mapped arrays (no tombstones)
        self._dead_cache: dict[str, np.ndarray] = {}  # tombstone file -> ranks
        self._fingerprints: list[tuple[Any, int, str]] = []  # (tokenizer, its length, fingerprint), see _fingerprint
        self._merger: threading.Thread | None = None
        self._stop = threading.Event()
        if readonly:
            if not self.path.exists():
                raise StoreError(f"no index database at {self.path}")
            uri = f"file:{self.path}?mode=ro"
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            uri = str(self.path)
        try:
            conn = sqlite3.connect(uri, timeout=60.0, check_same_thread=False, isolation_level=None, uri=readonly)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the index database {self.path}: {e}") from None
        self.db = sqlite_utils.Database(conn)
        try:
            self.db.execute("PRAGMA busy_timeout = 60000")
            self._check_schema()
            if not readonly:
                if self.db.journal_mode != "wal":
                    self.db.enable_wal()
                # a segment commit writes its text to the WAL; once checkpointed, the file shrinks back
                self.db.execute(f"PRAGMA journal_size_limit = {4 << 20}")
                self.db.execute("PRAGMA foreign_keys = ON")
                self._create_schema()
        except sqlite3.DatabaseError as e:  # "file is not a database", "database disk image is malformed"
            conn.close()
            raise StoreError(f"{self.path} is not a usable suffixspec index database ({e}); "
                             "point --db / $SUFFIXSPEC_DB at another file or move this one away") from None
        except StoreError:
            conn.close()
            raise

    def close(self) -> None:
        """Wait for a background merge to reach a safe point (it stops after its current merge), close."""
        self._stop.set()
        if self._merger is not None:
            self._merger.join()
        self.db.conn.close()

    def __enter__(self) -> IndexStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_schema(self) -> None:
        """Refuse another program's database instead of adding tables to it or failing later."""
        tables = set(self.db.table_names())
        if not tables:
            return  # a new (or empty) file: ours to create
        if not tables & _SCHEMA.keys():
            raise StoreError(f"{self.path} is a SQLite database of another program (tables: "
                             f"{', '.join(sorted(tables)[:5])}), not a suffixspec index; "
                             "point --db / $SUFFIXSPEC_DB at another file")
        for table, cols in _SCHEMA.items():
            if table in tables:
                missing = cols - {c.name for c in self.db[table].columns}
                if missing:
                    raise StoreError(f"{self.path} has a '{table}' table without the column(s) "
                                     f"{sorted(missing)}: not a suffixspec index (or one from an "
                                     "incompatible version); point --db / $SUFFIXSPEC_DB at another file")

    def _create_schema(self) -> None:
        db = self.db
        if "documents" not in db.table_names():
            db["documents"].create({"id": int, "path": str, "content_hash": str, "text": str, "metadata": str,
                                    "n_bytes": int, "added_at": float}, pk="id", if_not_exists=True)
            db["documents"].create_index(["path"], unique=True, if_not_exists=True)
            db["documents"].create_index(["content_hash"], if_not_exists=True)
        if "doc_tokens" not in db.table_names():
            db["doc_tokens"].create({"doc_id": int, "fingerprint": str, "n_tokens": int, "ids": bytes,
                                     "segment": int},
                                    pk=("doc_id", "fingerprint"), foreign_keys=[("doc_id", "documents", "id")],
                                    if_not_exists=True)
        if "tokenizers" not in db.table_names():
            db["tokenizers"].create({"fingerprint": str, "name": str, "added_at": float}, pk="fingerprint",
                                    if_not_exists=True)
        if "history" not in db.table_names():
            db["history"].create({"id": int, "fingerprint": str, "n_tokens": int, "ids": bytes, "created_at": float},
                                 pk="id", if_not_exists=True)
            db["history"].create_index(["fingerprint", "id"], if_not_exists=True)
        if "meta" not in db.table_names():
            db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
        if "segments" not in db.table_names():
            db["segments"].create({"id": int, "fingerprint": str, "name": str, "width": int, "n_tokens": int,
                                   "n_seqs": int, "dead": str, "dead_seqs": int, "dead_tokens": int,
                                   "created_at": float}, pk="id", if_not_exists=True)
            db["segments"].create_index(["fingerprint"], if_not_exists=True)
        if "segment" not in {c.name for c in db["doc_tokens"].columns}:  # a database of an earlier version
            db.execute("ALTER TABLE doc_tokens ADD COLUMN segment INTEGER")
        db["doc_tokens"].create_index(["segment"], if_not_exists=True)

    # ----- small helpers -------------------------------------------------------------------------
    @contextmanager
    def _write_txn(self) -> Iterator[list[Path]]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT). Yields a list the body fills with the array
        files it wrote: on any exception (Ctrl-C included) the transaction rolls back and they are deleted."""
        conn = self.db.conn
        written: list[Path] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield written
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for p in written:
                p.unlink(missing_ok=True)
            raise

    def _meta(self, key: str, default: str | None = None) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return row[0] if row else default

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [key, value])

    def docs_version(self) -> int:
        return int(self._meta("docs_version", "0"))

    def fingerprints(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT fingerprint FROM tokenizers ORDER BY added_at")]

    def _fingerprint(self, tokenizer: Any) -> str:
        """``tokenizer_fingerprint`` remembered per tokenizer object (hashing a vocabulary takes ~20 ms, and
        every reload of the document index asks again); a tokenizer that grew (``add_tokens``) is hashed anew."""
        size = len(tokenizer) if hasattr(tokenizer, "__len__") else -1
        for tok, n, fp in self._fingerprints:
            if tok is tokenizer and n == size:
                return fp
        fp = tokenizer_fingerprint(tokenizer)
        self._fingerprints = [*self._fingerprints[-3:], (tokenizer, size, fp)]
        return fp

    def register_tokenizer(self, tokenizer: Any) -> str:
        fp = self._fingerprint(tokenizer)
        if self.db.execute("SELECT 1 FROM tokenizers WHERE fingerprint = ?", [fp]).fetchone():
            return fp  # known: no write, so no wait behind another writer
        if self.readonly:
            return fp
        self.db.execute("INSERT OR IGNORE INTO tokenizers (fingerprint, name, added_at) VALUES (?, ?, ?)",
                        [fp, tokenizer_name(tokenizer), time.time()])
        return fp

    # ----- documents -----------------------------------------------------------------------------
    def add_documents(self, docs: Iterable[DocInput], tokenizer: Any, progress: ProgressFn | None = None,
                      status: Callable[[str], None] | None = None) -> AddSummary:
        """Add or replace documents; unchanged ones (same path, same hash) are left alone.

        ``docs`` may be a generator: documents are tokenized in batches of about ``TOKENIZE_BATCH_CHARS``
        characters (in parallel by a fast tokenizer) and streamed into a segment file, committed every
        ``flush_tokens`` tokens and at the end, so memory is bounded by one segment, not the corpus.
        An add that fits one segment is atomic; a larger one that is interrupted keeps the segments it
        committed (whole documents; a rerun skips them as unchanged). ``progress(docs, tokens, bytes)``
        is called as documents are read and tokenized; ``status(text)`` when a segment is sorted.
        """
        if self.readonly:
            raise StoreError(f"{self.path} was opened read-only")
        summary = AddSummary()
        fp = self.register_tokenizer(tokenizer)

        def stored_hash(key: str) -> str | None:
            # one indexed lookup per document: reading every (path, hash) row scans the whole table, texts
            # included (0.26 s at 44k documents / 630 MB of text, most of the time an add of one file took)
            row = self.db.execute("SELECT content_hash FROM documents WHERE path = ?", [key]).fetchone()
            return row[0] if row else None

        batch: list[tuple[DocInput, str]] = []
        batch_chars = 0
        staged: list[_Staged] = []
        by_key: dict[str, _Staged] = {}
        pending: set[str] = set()  # keys batched or staged for the segment being written
        writer: SegmentWriter | None = None

        def tokenize_batch() -> None:
            nonlocal writer, batch, batch_chars
            if not batch:
                return
            ids = encode_batched(tokenizer, [d.text for d, _ in batch])
            if writer is None:
                writer = SegmentWriter(self._new_prefix(fp))
            for (d, h), arr in zip(batch, ids, strict=True):
                writer.add(arr)
                st = _Staged(d, h, len(arr))
                old = by_key.get(d.key())
                if old is not None:
                    old.superseded = True  # the last version of a repeated path wins
                by_key[d.key()] = st
                staged.append(st)
            if progress:
                progress(len(batch), int(sum(len(a) for a in ids)), sum(_nbytes(d.text) for d, _ in batch))
            batch, batch_chars = [], 0

        with self._build_guard():
            try:
                for d in docs:
                    h = content_hash(d.text)
                    # a path repeated in this add: its last version wins, even one equal to the stored text
                    if d.key() not in pending and stored_hash(d.key()) == h:
                        summary.unchanged += 1
                        if progress:
                            progress(1, 0, _nbytes(d.text))
                        continue
                    batch.append((d, h))
                    pending.add(d.key())
                    batch_chars += len(d.text)
                    if batch_chars >= TOKENIZE_BATCH_CHARS or len(batch) >= TOKENIZE_BATCH_DOCS:
                        tokenize_batch()
                        if writer is not None and writer.num_tokens >= self.flush_tokens:
                            self._commit_new_segment(fp, writer, staged, summary, status)
                            writer, staged, by_key, pending = None, [], {}, set()
                tokenize_batch()
                if writer is not None:
                    self._commit_new_segment(fp, writer, staged, summary, status)
                    writer = None
            except BaseException:
                if writer is not None:
                    writer.abort()
                raise
        self._collect_garbage()
        self._kick_merges()
        return summary

    def _new_prefix(self, fp: str) -> Path:
        self.arrays_dir.mkdir(parents=True, exist_ok=True)
        return self.arrays_dir / f"{fp[:12]}-{int(time.time())}-{os.getpid()}-{secrets.token_hex(4)}"

    def _commit_new_segment(self, fp: str, writer: SegmentWriter, staged: list[_Staged], summary: AddSummary,
                            status: Callable[[str], None] | None = None) -> None:
        """Commit the documents of an add with their segment (see :meth:`_commit_segment`)."""

        def rows(conn: sqlite3.Connection, seg_id: int) -> tuple[np.ndarray, set[int]]:
            docids = np.full(len(staged), -1, dtype=np.int64)
            touched: set[int] = set()
            now = time.time()
            for k, st in enumerate(staged):
                if st.superseded:
                    continue
                d, key = st.doc, st.doc.key()
                row = conn.execute("SELECT id, content_hash FROM documents WHERE path = ?", [key]).fetchone()
                if row is not None and row[1] == st.hash:  # another writer added this very content meanwhile
                    summary.unchanged += 1
                    continue
                meta = json.dumps(d.metadata, ensure_ascii=False, default=str)
                if row is not None:
                    doc_id = row[0]
                    touched.update(r[0] for r in conn.execute(
                        "SELECT segment FROM doc_tokens WHERE doc_id = ? AND segment IS NOT NULL", [doc_id]))
                    conn.execute("DELETE FROM doc_tokens WHERE doc_id = ?", [doc_id])
                    conn.execute("UPDATE documents SET content_hash = ?, text = ?, metadata = ?, n_bytes = ?, "
                                 "added_at = ? WHERE id = ?", [st.hash, d.text, meta, _nbytes(d.text), now, doc_id])
                    summary.updated += 1
                else:
                    doc_id = conn.execute("INSERT INTO documents (path, content_hash, text, metadata, n_bytes, "
                                          "added_at) VALUES (?, ?, ?, ?, ?, ?)",
                                          [key, st.hash, d.text, meta, _nbytes(d.text), now]).lastrowid
                    summary.added += 1
                conn.execute("INSERT INTO doc_tokens (doc_id, fingerprint, n_tokens, segment) VALUES (?, ?, ?, ?)",
                             [doc_id, fp, st.n_tokens, seg_id])
                docids[k] = doc_id
                summary.tokens += st.n_tokens
                summary.ids.append(doc_id)
            return docids, touched

        self._commit_segment(fp, writer, rows, status)

    def _commit_segment(self, fp: str, writer: SegmentWriter,
                        rows: Callable[[sqlite3.Connection, int], tuple[np.ndarray, set[int]]],
                        status: Callable[[str], None] | None = None) -> None:
        """Sort ``writer``'s segment (no lock held), then commit it and its documents in one transaction.

        Inside the transaction, ``rows(conn, seg_id)`` writes the document rows of the new segment ``seg_id``
        and returns the document id of each of its sequences (-1: not live, e.g. changed meanwhile: a
        tombstone) and the other segments whose documents it replaced (their tombstones are updated). Any
        exception (a merge's conflict, Ctrl-C) rolls back and deletes the segment's files.
        """

        def one(conn: sqlite3.Connection, seg_ids: list[int]) -> tuple[list[np.ndarray], set[int]]:
            docids, touched = rows(conn, seg_ids[0])
            return [docids], touched

        self._commit_segments(fp, [writer], one, status)

    def _commit_segments(self, fp: str, writers: Sequence[SegmentWriter],
                         rows: Callable[[sqlite3.Connection, list[int]], tuple[list[np.ndarray], set[int]]],
                         status: Callable[[str], None] | None = None) -> None:
        """:meth:`_commit_segment` for several new segments at once (a compaction's outputs): those not
        sorted yet are sorted one after the other, then all become visible in one transaction."""
        docids_paths = [Path(w.prefix + ".docids.npy") for w in writers]
        files = [p for w, d in zip(writers, docids_paths, strict=True) for p in (*w.files, d)]
        try:
            for w in writers:
                if not w.sorted:
                    if status:
                        status(f"sorting {w.num_tokens} tokens")
                    w.finish()
            with self._write_txn() as written:
                written.extend(files)
                conn = self.db.conn
                seg_ids = [self._insert_segment(conn, fp, w) for w in writers]
                docids, touched = rows(conn, seg_ids)
                for sid, path, ids in zip(seg_ids, docids_paths, docids, strict=True):
                    _save_synced(path, ids)
                    if (ids < 0).any():
                        touched.add(sid)
                for sid in sorted(touched):
                    self._update_tombstones(conn, sid, written)
                self._bump()
        except BaseException:
            for w in writers:
                w.abort()
            _unlink(files)
            raise
        self._checkpoint()

    def _checkpoint(self) -> None:
        """Copy the WAL into the database (a large add would otherwise keep its text there twice);
        PASSIVE: it never waits for readers or writers, and what it cannot copy now goes later."""
        try:
            self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.OperationalError:
            pass

    def _insert_segment(self, conn: sqlite3.Connection, fp: str, writer: SegmentWriter) -> int:
        return conn.execute("INSERT INTO segments (fingerprint, name, width, n_tokens, n_seqs, dead, dead_seqs, "
                            "dead_tokens, created_at) VALUES (?, ?, ?, ?, ?, NULL, 0, 0, ?)",
                            [fp, Path(writer.prefix).name, writer.width, writer.num_tokens, len(writer.starts),
                             time.time()]).lastrowid

    def _bump(self) -> None:
        self._set_meta("docs_version", str(self.docs_version() + 1))

    def remove(self, keys: Sequence[int | str]) -> int:
        """Remove documents by id or exact path; returns how many were removed. Their tokens become
        tombstones (a segment left with no live document is dropped at once)."""
        if self.readonly:
            raise StoreError(f"{self.path} was opened read-only")
        with self._build_guard(), self._write_txn() as written:
            conn = self.db.conn
            ids: list[int] = []
            for k in keys:
                row = None
                if isinstance(k, int) or (isinstance(k, str) and k.isascii() and k.isdigit()):
                    if 0 <= int(k) < 2**63:  # beyond SQLite's INTEGER no document can have that id
                        row = conn.execute("SELECT id FROM documents WHERE id = ?", [int(k)]).fetchone()
                if row is None:
                    row = conn.execute("SELECT id FROM documents WHERE path = ?", [str(k)]).fetchone()
                if row is None and os.path.exists(str(k)):
                    row = conn.execute("SELECT id FROM documents WHERE path = ?", [str(Path(k).resolve())]).fetchone()
                if row is not None and row[0] not in ids:
                    ids.append(row[0])
            if not ids:
                return 0
            touched: set[int] = set()
            for doc_id in ids:
                touched.update(r[0] for r in conn.execute(
                    "SELECT segment FROM doc_tokens WHERE doc_id = ? AND segment IS NOT NULL", [doc_id]))
                conn.execute("DELETE FROM doc_tokens WHERE doc_id = ?", [doc_id])
                conn.execute("DELETE FROM documents WHERE id = ?", [doc_id])
            for sid in sorted(touched):
                self._update_tombstones(conn, sid, written)
            self._bump()
        self._collect_garbage()
        self._kick_merges()
        return len(ids)

    def list_documents(self) -> list[dict[str, Any]]:
        """id, path, content_hash, n_bytes, added_at, metadata, and tokens per fingerprint."""
        toks: dict[int, dict[str, int]] = {}
        for doc_id, fp, n in self.db.execute("SELECT doc_id, fingerprint, n_tokens FROM doc_tokens"):
            toks.setdefault(doc_id, {})[fp] = n
        out = []
        for row in self.db.execute("SELECT id, path, content_hash, n_bytes, added_at, metadata FROM documents "
                                   "ORDER BY id"):
            out.append({"id": row[0], "path": row[1], "content_hash": row[2], "n_bytes": row[3],
                        "added_at": row[4], "metadata": json.loads(row[5] or "{}"), "tokens": toks.get(row[0], {})})
        return out

    def get_document(self, doc_id: int) -> dict[str, Any] | None:
        row = self.db.execute("SELECT id, path, content_hash, text, metadata, n_bytes, added_at FROM documents "
                              "WHERE id = ?", [doc_id]).fetchone()
        if row is None:
            return None
        return {"id": row[0], "path": row[1], "content_hash": row[2], "text": row[3],
                "metadata": json.loads(row[4] or "{}"), "n_bytes": row[5], "added_at": row[6]}

    # ----- segments ----------------------------------------------------------------------------------
    def segment_infos(self, fingerprint: str) -> list[SegmentInfo]:
        """The committed segments of one tokenizer."""
        if "segments" not in self.db.table_names():  # a read-only database of an earlier version
            return []
        return [SegmentInfo(id=r[0], name=r[1], tokens=r[2], dead_tokens=r[3], sequences=r[4], dead_sequences=r[5],
                            width=r[6], dead_file=r[7])
                for r in self.db.execute("SELECT id, name, n_tokens, dead_tokens, n_seqs, dead_seqs, width, dead "
                                         "FROM segments WHERE fingerprint = ? ORDER BY id", [fingerprint])]

    def _segment(self, name: str) -> SuffixArray:
        sa = self._cache.get(name)
        if sa is None:
            sa = self._cache[name] = SuffixArray.load(self.arrays_dir / name, self.sort_depth)
        return sa

    def _tombstones(self, dead_file: str | None) -> tuple[np.ndarray, np.ndarray]:
        """(dead ranks, dead sequence numbers) of a tombstone file."""
        if dead_file is None:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
        with np.load(self.arrays_dir / dead_file) as z:
            return z["ranks"], z["seqs"]

    def _load(self, info: SegmentInfo) -> SuffixArray:
        sa = self._segment(info.name)
        if info.dead_file is None:
            return sa
        ranks = self._dead_cache.get(info.dead_file)
        if ranks is None:
            ranks = self._dead_cache[info.dead_file] = self._tombstones(info.dead_file)[0]
        return sa.with_dead(ranks)

    def _update_tombstones(self, conn: sqlite3.Connection, seg_id: int, written: list[Path]) -> None:
        """Inside a write transaction: mark the documents of segment ``seg_id`` that are no longer live
        in it (deleted, replaced, or never committed) as tombstones; drop the segment when none is left."""
        name, old_file, n_seqs = conn.execute("SELECT name, dead, n_seqs FROM segments WHERE id = ?",
                                              [seg_id]).fetchone()
        live = np.array([r[0] for r in conn.execute("SELECT doc_id FROM doc_tokens WHERE segment = ?", [seg_id])],
                        dtype=np.int64)
        if len(live) == 0:
            conn.execute("DELETE FROM segments WHERE id = ?", [seg_id])
            return
        docids = np.load(self.arrays_dir / f"{name}.docids.npy")
        dead_seqs = np.flatnonzero(~np.isin(docids, live))
        old_ranks, old_seqs = self._tombstones(old_file)
        new_seqs = np.setdiff1d(dead_seqs, old_seqs)
        if len(new_seqs) == 0 and len(dead_seqs) == len(old_seqs):
            return
        sa = self._segment(name)
        ranks = tombstone_ranks(sa, new_seqs, self.arrays_dir / f"{name}.sa")
        if len(old_ranks):  # disjoint sets (other documents): one sorted array, sorted in place
            ranks = np.concatenate([old_ranks.astype(np.int32), ranks])
            ranks.sort()
        starts, ends = sequence_bounds(sa.starts, sa._n)
        dead_tokens = int((ends[dead_seqs] - starts[dead_seqs] - 1).sum())
        path = self.arrays_dir / f"{name}.dead-{secrets.token_hex(4)}.npz"
        written.append(path)
        with open(path, "wb") as f:
            np.savez(f, ranks=ranks, seqs=dead_seqs)
            f.flush()
            os.fsync(f.fileno())
        conn.execute("UPDATE segments SET dead = ?, dead_seqs = ?, dead_tokens = ? WHERE id = ?",
                     [path.name, len(dead_seqs), dead_tokens, seg_id])

    def document_index(self, fingerprint_or_tokenizer: str | Any) -> SegmentSet | None:
        """The document index for this tokenizer: its segments, memory-mapped (None if no documents).

        Given a tokenizer (not just a fingerprint), documents that have no segment for it (added under
        another tokenizer, or whose arrays are missing) are tokenized now and indexed once; given a
        fingerprint, such documents are indexed from stored token ids when there are some, else left out.
        """
        if isinstance(fingerprint_or_tokenizer, str):
            fp, tokenizer = fingerprint_or_tokenizer, None
        else:
            tokenizer = fingerprint_or_tokenizer
            fp = self._fingerprint(tokenizer)
        if not self.readonly:
            self._repair(fp, tokenizer)
        for _ in range(5):  # a merge may replace the files between reading the list and opening them
            infos = self.segment_infos(fp)
            if not infos:
                return None
            try:
                segs = [self._load(i) for i in infos]
            except FileNotFoundError:
                self._cache.clear()
                if self.readonly:
                    log.warning("%s: segment files are missing from %s; documents are served without them",
                                self.path, self.arrays_dir)
                    return None
                self._repair(fp, tokenizer)
                continue
            names = {i.name for i in infos}
            self._cache = {k: v for k, v in self._cache.items() if k in names}
            files = {i.dead_file for i in infos}
            self._dead_cache = {k: v for k, v in self._dead_cache.items() if k in files}
            return SegmentSet(segs, sum(i.live_tokens for i in infos),
                              sum(i.sequences - i.dead_sequences for i in infos))
        raise RuntimeError(f"could not open the arrays of {self.path}; is a writer stuck?")

    def _missing_segments(self, fp: str) -> list[SegmentInfo]:
        out = []
        for info in self.segment_infos(fp):
            files = [f"{info.name}{ext}" for ext in (".tok", ".sa", ".starts.npy", ".buckets.npy", ".docids.npy")]
            if info.dead_file:
                files.append(info.dead_file)
            if not all((self.arrays_dir / f).exists() for f in files):
                out.append(info)
        return out

    def _all_indexed(self, fp: str) -> bool:
        """Whether every document has a live version in a segment of ``fp``: the live sequences of the
        segments (each committed document is live in exactly one, and every other sequence is a tombstone)
        add up to the documents. Two small queries (~2 ms at 44k documents) instead of the join that lists
        the unindexed ones, which reads the whole documents table (0.15 s per reload of the index)."""
        n_docs = self.db.execute("SELECT count(*) FROM documents").fetchone()[0]
        live = self.db.execute("SELECT coalesce(sum(n_seqs - dead_seqs), 0) FROM segments WHERE fingerprint = ?",
                               [fp]).fetchone()[0]
        return live == n_docs

    def _repair(self, fp: str, tokenizer: Any) -> None:
        """Index the documents that have no live segment for ``fp``: a copy without its arrays folder, a
        database of an earlier version (token ids in the database), documents added under another tokenizer."""
        missing = self._missing_segments(fp)
        if missing:
            log.warning("%s: %d segment(s) of the document index are missing from %s (copied without it?); "
                        "rebuilding them from the database", self.path, len(missing), self.arrays_dir)
            with self._write_txn():
                for info in missing:
                    self.db.execute("UPDATE doc_tokens SET segment = NULL WHERE segment = ?", [info.id])
                    self.db.execute("DELETE FROM segments WHERE id = ?", [info.id])
                self._bump()
        elif self._all_indexed(fp):
            return
        rows = self.db.execute(
            "SELECT d.id, d.content_hash, t.ids IS NOT NULL FROM documents d LEFT JOIN doc_tokens t "
            "ON t.doc_id = d.id AND t.fingerprint = ? WHERE t.segment IS NULL ORDER BY d.id", [fp]).fetchall()
        if not rows:
            return
        need_text = [r[0] for r in rows if not r[2]]
        if need_text and tokenizer is None:
            if not hasattr(self, "_warned_untokenized"):
                self._warned_untokenized = True
                log.warning("%s: %d document(s) have no token ids for tokenizer %s; open the index with the "
                            "tokenizer itself to index them", self.path, len(need_text), fp[:12])
            rows = [r for r in rows if r[2]]
            if not rows:
                return
        if tokenizer is not None:
            self.register_tokenizer(tokenizer)
        elif not self.db.execute("SELECT 1 FROM tokenizers WHERE fingerprint = ?", [fp]).fetchone():
            return
        if not missing:
            log.info("%s: indexing %d document(s) for tokenizer %s", self.path, len(rows), fp[:12])
        with self._build_guard():
            self._index_existing(fp, tokenizer, [(r[0], r[1]) for r in rows])
        self._collect_garbage()

    def _index_existing(self, fp: str, tokenizer: Any, docs: list[tuple[int, str]]) -> None:
        """Build segments (``flush_tokens`` at most each) for stored documents ``(id, content_hash)``,
        from their stored ids or their text; commit each, skipping documents changed meanwhile."""
        i = 0
        while i < len(docs):
            writer = SegmentWriter(self._new_prefix(fp))
            part: list[tuple[int, str, int]] = []
            try:
                while i < len(docs) and writer.num_tokens < self.flush_tokens:
                    chunk = docs[i:i + TOKENIZE_BATCH_DOCS]
                    i += len(chunk)
                    got = []
                    texts = []
                    for doc_id, h in chunk:
                        row = self.db.execute("SELECT ids FROM doc_tokens WHERE doc_id = ? AND fingerprint = ?",
                                              [doc_id, fp]).fetchone()
                        if row is not None and row[0] is not None:
                            got.append((doc_id, h, np.frombuffer(row[0], dtype="<u4")))
                        elif tokenizer is not None:
                            text = self.db.execute("SELECT text FROM documents WHERE id = ?", [doc_id]).fetchone()
                            if text is not None:
                                texts.append((doc_id, h, text[0]))
                    if texts:
                        ids = encode_batched(tokenizer, [t for _, _, t in texts])
                        got += [(d, h, a) for (d, h, _), a in zip(texts, ids, strict=True)]
                    for doc_id, h, arr in got:
                        writer.add(arr)
                        part.append((doc_id, h, len(arr)))
                if not part:
                    writer.abort()
                    continue
            except BaseException:
                writer.abort()
                raise

            def rows(conn: sqlite3.Connection, seg_id: int, part=part) -> tuple[np.ndarray, set[int]]:
                docids = np.full(len(part), -1, dtype=np.int64)
                for k, (doc_id, h, n) in enumerate(part):
                    row = conn.execute("SELECT content_hash FROM documents WHERE id = ?", [doc_id]).fetchone()
                    seg = conn.execute("SELECT segment FROM doc_tokens WHERE doc_id = ? AND fingerprint = ?",
                                       [doc_id, fp]).fetchone()
                    if row is None or row[0] != h or (seg is not None and seg[0] is not None):
                        continue  # removed, changed or indexed by another process meanwhile
                    conn.execute("INSERT OR REPLACE INTO doc_tokens (doc_id, fingerprint, n_tokens, ids, segment) "
                                 "VALUES (?, ?, ?, NULL, ?)", [doc_id, fp, n, seg_id])
                    docids[k] = doc_id
                return docids, set()

            self._commit_segment(fp, writer, rows)

    # ----- merges ------------------------------------------------------------------------------------
    def pending_merges(self, fingerprint: str | None = None) -> dict[str, list[list[int]]]:
        """Planned merges per fingerprint: groups of segment ids (see :class:`~index.segments.MergePolicy`)."""
        return self._plans(self.policy.plan, fingerprint)

    def compaction(self, fingerprint: str | None = None) -> dict[str, list[int]]:
        """Planned compactions per fingerprint: the segments :meth:`compact` would rewrite."""
        return self._plans(self.policy.compaction, fingerprint)

    def _plans(self, plan: Callable[[list[SegmentInfo]], list], fingerprint: str | None) -> dict[str, list]:
        """``plan(segments)`` of each fingerprint's segments, where it is not empty."""
        fps = [fingerprint] if fingerprint else [r[0] for r in self.db.execute(
            "SELECT DISTINCT fingerprint FROM segments")] if "segments" in self.db.table_names() else []
        out = {}
        for fp in fps:
            got = plan(self.segment_infos(fp))
            if got:
                out[fp] = got
        return out

    def merge_pending(self, progress: Callable[[int], None] | None = None,
                      status: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> int:
        """Run the planned merges (and those they make due) until none is left; returns how many were done.
        ``progress(tokens)`` as tokens are copied; ``status(text)`` before each merge."""
        done = 0
        failed: set[tuple[int, ...]] = set()
        while not (stop is not None and stop.is_set()):
            plans = [(fp, g) for fp, groups in self.pending_merges().items() for g in groups
                     if tuple(g) not in failed]
            if not plans:
                break
            fp, group = plans[0]
            if self.merge(fp, group, progress, status, stop=stop):
                done += 1
            else:
                failed.add(tuple(group))
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
        infos = {i.id: i for i in self.segment_infos(fp)}
        if not all(s in infos for s in seg_ids):
            return False
        inputs = [infos[s] for s in seg_ids]
        if status:
            status(f"merging {len(inputs)} segments ({sum(i.live_tokens for i in inputs)} tokens)")
        width = min(i.width for i in inputs)
        with self._build_guard():
            writers = [SegmentWriter(self._new_prefix(fp), width=width)]
            docmaps: list[list[int]] = [[]]
            try:
                for info in inputs:
                    docids = np.load(self.arrays_dir / f"{info.name}.docids.npy")
                    dead = set(self._tombstones(info.dead_file)[1].tolist())
                    starts = np.load(self.arrays_dir / f"{info.name}.starts.npy")
                    tok = self.arrays_dir / f"{info.name}.tok"
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
                                writers.append(SegmentWriter(self._new_prefix(fp), width=width))
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
                self._commit_segments(fp, writers, rows, status)
            except _Conflict:
                return False
        self._collect_garbage()
        return True

    def compact(self, progress: Callable[[int], None] | None = None,
                status: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> int:
        """Rewrite the segments that are not full into as few as ``max_tokens`` allows (see
        :meth:`MergePolicy.compaction`): what a read-mostly corpus wants, every lookup asks each segment.
        Returns the number of compactions done (one per tokenizer at most)."""
        done = 0
        for fp, group in self.compaction().items():
            done += self.merge(fp, group, progress, status, split_tokens=self.policy.max_tokens, stop=stop)
        return done

    def _kick_merges(self) -> None:
        """Start the background merge thread when merges are due (``auto_merge``)."""
        if not self.auto_merge or (self._merger is not None and self._merger.is_alive()):
            return
        if not self.pending_merges() and not (self.policy.idle_compact_s is not None and self.compaction()):
            return
        self._stop.clear()
        self._merger = threading.Thread(target=self._merge_in_background, name="suffixspec-merge", daemon=True)
        self._merger.start()

    def _merge_in_background(self) -> None:
        from . import writer

        def run(other: IndexStore, compact: bool) -> None:
            # in a writer process at the lowest priority where one can start: a merge sorts for seconds
            # and would take the cores (and the interpreter) from the generations of this process
            if writer.available():
                writer.merge(self.path, compact=compact, stop=self._stop, policy=self.policy,
                             flush_tokens=self.flush_tokens, sort_depth=self.sort_depth)
            elif compact:
                other.compact(stop=self._stop)
            else:
                other.merge_pending(stop=self._stop)

        try:
            with IndexStore(self.path, self.sort_depth, auto_merge=False, policy=self.policy,
                            flush_tokens=self.flush_tokens) as other:
                if other.pending_merges():
                    run(other, compact=False)
                idle = self.policy.idle_compact_s
                # a read-mostly corpus: once no write came for ``idle`` seconds, compact (readers keep
                # reading the old segments until the new ones commit; a write meanwhile restarts the wait)
                while idle is not None and other.compaction():
                    version = other.docs_version()
                    if self._stop.wait(idle):
                        return
                    if other.docs_version() == version:
                        run(other, compact=True)
                        return
                    if other.pending_merges():
                        run(other, compact=False)
        except Exception as e:  # never take the process down; the merges are planned again after the next write
            log.warning("%s: background merge failed: %s", self.path, e)

    @contextmanager
    def _build_guard(self) -> Iterator[None]:
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
            keep.update(f"{name}{ext}" for ext in (".tok", ".sa", ".starts.npy", ".buckets.npy", ".docids.npy"))
            if dead:
                keep.add(dead)
        return keep

    def _collect_garbage(self) -> None:
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

    # ----- output history --------------------------------------------------------------------------
    def history_append(self, fingerprint: str, ids: Sequence[int], budget_tokens: int | None = None) -> None:
        """Persist one finished output; drop the oldest outputs beyond ``budget_tokens``."""
        self.history_append_many(fingerprint, [ids], budget_tokens)

    def history_append_many(self, fingerprint: str, outputs: Sequence[Sequence[int]],
                            budget_tokens: int | None = None, timeout_s: float | None = None) -> None:
        """Persist finished outputs in one transaction. With ``timeout_s``, wait at most that long for
        another writer (a long ``index add``) and raise ``sqlite3.OperationalError`` instead of blocking."""
        if timeout_s is not None:
            self.db.execute(f"PRAGMA busy_timeout = {max(0, int(timeout_s * 1000))}")
        try:
            with self._write_txn():
                for ids in outputs:
                    blob = np.asarray(ids, dtype="<u4").tobytes()
                    self.db.execute("INSERT INTO history (fingerprint, n_tokens, ids, created_at) VALUES (?, ?, ?, ?)",
                                    [fingerprint, len(ids), blob, time.time()])
                if budget_tokens is not None:
                    self._history_trim(fingerprint, budget_tokens)
        finally:
            if timeout_s is not None:
                self.db.execute("PRAGMA busy_timeout = 60000")

    def _history_trim(self, fingerprint: str, budget_tokens: int) -> None:
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

    def history_load(self, fingerprint: str, budget_tokens: int | None = None) -> list[np.ndarray]:
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

    def history_clear(self, fingerprint: str | None = None) -> None:
        if fingerprint is None:
            self.db.execute("DELETE FROM history")
        else:
            self.db.execute("DELETE FROM history WHERE fingerprint = ?", [fingerprint])

    # ----- stats -------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counts, segments, pending merges, sizes on disk and an estimate of the memory the arrays map."""
        n_docs, n_bytes = self.db.execute("SELECT count(*), coalesce(sum(n_bytes), 0) FROM documents").fetchone()
        pending = self.pending_merges()
        compaction = self.compaction()
        per_fp = {}
        for fp, name in self.db.execute("SELECT fingerprint, name FROM tokenizers"):
            n_tok, n_tok_docs, n_unindexed = self.db.execute(
                "SELECT coalesce(sum(n_tokens), 0), count(*), coalesce(sum(segment IS NULL), 0) FROM doc_tokens "
                "WHERE fingerprint = ?", [fp]).fetchone()
            h_tok, h_n = self.db.execute("SELECT coalesce(sum(n_tokens), 0), count(*) FROM history "
                                         "WHERE fingerprint = ?", [fp]).fetchone()
            segs = self.segment_infos(fp)
            mapped = sum((s.width + 4) * (s.tokens + s.sequences) for s in segs)
            per_fp[fp] = {"tokenizer": name, "document_tokens": n_tok, "documents_tokenized": n_tok_docs - n_unindexed,
                          "history_outputs": h_n, "history_tokens": h_tok,
                          "arrays_current": n_unindexed == 0 and n_tok_docs - n_unindexed == n_docs,
                          "segments": [{"id": s.id, "tokens": s.tokens, "live_tokens": s.live_tokens,
                                        "documents": s.sequences - s.dead_sequences,
                                        "deleted_documents": s.dead_sequences, "bytes_per_token": s.width + 4}
                                       for s in segs],
                          "pending_merges": [{"segments": g} for g in pending.get(fp, [])],
                          "compaction": compaction.get(fp, []),
                          # tokens + suffix array, mapped; the token history lives in an incremental index
                          # of ~12 bytes per token plus dict entries
                          "memory_estimate_bytes": mapped + 16 * h_tok}
        disk = sum(p.stat().st_size for p in [self.path, Path(str(self.path) + "-wal"), Path(str(self.path) + "-shm")]
                   if p.exists())
        arrays = sum(p.stat().st_size for p in self.arrays_dir.iterdir()) if self.arrays_dir.exists() else 0
        return {"db": str(self.path), "documents": n_docs, "document_bytes": n_bytes,
                "tokens": {fp: v["document_tokens"] for fp, v in per_fp.items()},
                "segments": sum(len(v["segments"]) for v in per_fp.values()),
                "pending_merges": sum(len(v["pending_merges"]) for v in per_fp.values()),
                "bytes_on_disk": disk + arrays, "db_bytes": disk, "arrays_bytes": arrays,
                "memory_estimate_bytes": sum(v["memory_estimate_bytes"] for v in per_fp.values()),
                "tokenizers": per_fp}


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _save_synced(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, arr)
        f.flush()
        os.fsync(f.fileno())


def _unlink(paths: Iterable[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)
