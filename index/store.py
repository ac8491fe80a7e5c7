"""The SQLite store (sqlite-utils, WAL) behind the document corpus and the output history.

Tables::

    documents   id, path (unique), content_hash, text, metadata (JSON), n_bytes, added_at
    doc_tokens  (doc_id, fingerprint) -> n_tokens, ids (uint32 little-endian blob)
    tokenizers  fingerprint -> name, added_at
    history     id, fingerprint, n_tokens, ids (blob), created_at      (finished outputs, oldest first)
    meta        key -> value: "docs_version"; "arrays:<fingerprint>" -> JSON of the current arrays

Beside ``index.db`` lives ``index.db.arrays/``: per fingerprint, the suffix array of all documents
(``<fp>-<gen>.tokens.npy``, ``.sa.npy``, ``.starts.npy``, ``.docids.npy``), memory-mapped at start-up.

Atomic writes, short write lock: an add / remove first reads a snapshot of the store (a read
transaction: it blocks nobody), tokenizes, and builds the new arrays under a fresh generation name
*outside* the write lock; then, in one ``BEGIN IMMEDIATE`` transaction, it checks that ``docs_version``
is still the snapshot's, writes the rows and points ``meta`` at the new arrays, and COMMITs. If another
writer committed in between, the built files are deleted and the work is planned again on the new
state (after ``OPTIMISTIC_ATTEMPTS`` tries it is done under the write lock, as a plain transaction).
A crash or Ctrl-C before COMMIT leaves the database as it was; the unreferenced array files are
deleted (Ctrl-C) or removed by the next writer (kill -9). Writers hold a shared ``flock`` on the arrays
directory while their uncommitted files exist; garbage collection runs only when it can take it
exclusively, so it never deletes a generation that is about to be committed. Readers are never
blocked (WAL) and keep the arrays they mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
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
from .suffix_array import DEFAULT_SORT_DEPTH, SuffixArray

DB_ENV = "SUFFIXSPEC_DB"
TOKENIZE_BATCH_CHARS = 2_000_000  # text per tokenizer batch: parallel enough, memory bounded
TOKENIZE_BATCH_DOCS = 512


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
class _Plan:
    """One write, planned on a snapshot: the documents after it, the sequences to index per fingerprint,
    and the row changes to run under the write lock (``apply`` None: nothing to write)."""

    result: Any = None
    doc_ids: list[int] = field(default_factory=list)
    seqs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    apply: Callable[[sqlite3.Connection], None] | None = None


def _insert_tokens(conn: sqlite3.Connection, doc_id: int, fp: str, ids: np.ndarray) -> None:
    conn.execute("INSERT INTO doc_tokens (doc_id, fingerprint, n_tokens, ids) VALUES (?, ?, ?, ?)",
                 [doc_id, fp, len(ids), np.asarray(ids, dtype="<u4").tobytes()])


def _insert_extra(conn: sqlite3.Connection, extra: dict[str, dict[int, np.ndarray]]) -> None:
    for fp, per_doc in extra.items():
        for doc_id, ids in per_doc.items():
            _insert_tokens(conn, doc_id, fp, ids)


def _unlink(paths: Iterable[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


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


class IndexStore:
    """Documents, their token ids per tokenizer fingerprint, and the output history, in one SQLite file."""

    OPTIMISTIC_ATTEMPTS = 2  # plans built outside the write lock before one is built under it

    def __init__(self, path: str | os.PathLike | None = None, sort_depth: int = DEFAULT_SORT_DEPTH) -> None:
        self.path = Path(path).expanduser() if path else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.arrays_dir = Path(str(self.path) + ".arrays")
        self.sort_depth = sort_depth
        try:
            conn = sqlite3.connect(str(self.path), timeout=60.0, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the index database {self.path}: {e}") from None
        self.db = sqlite_utils.Database(conn)
        try:
            self.db.execute("PRAGMA busy_timeout = 60000")
            self._check_schema()
            if self.db.journal_mode != "wal":
                self.db.enable_wal()
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
            db["doc_tokens"].create({"doc_id": int, "fingerprint": str, "n_tokens": int, "ids": bytes},
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

    def register_tokenizer(self, tokenizer: Any) -> str:
        fp = tokenizer_fingerprint(tokenizer)
        if self.db.execute("SELECT 1 FROM tokenizers WHERE fingerprint = ?", [fp]).fetchone():
            return fp  # known: no write, so no wait behind another writer
        self.db.execute("INSERT OR IGNORE INTO tokenizers (fingerprint, name, added_at) VALUES (?, ?, ?)",
                        [fp, tokenizer_name(tokenizer), time.time()])
        return fp

    # ----- documents -----------------------------------------------------------------------------
    def add_documents(self, docs: Iterable[DocInput], tokenizer: Any,
                      progress: Callable[[int], None] | None = None) -> AddSummary:
        """Add or replace documents atomically; unchanged ones (same path, same hash) are left alone.

        ``progress(n)`` is called as documents are tokenized (batches of about ``TOKENIZE_BATCH_CHARS``
        characters, encoded in parallel by a fast tokenizer). Returns counts of what happened.
        """
        docs = list(docs)
        base = AddSummary()
        fp = self.register_tokenizer(tokenizer)
        existing = {row[0]: row[1] for row in self.db.execute("SELECT path, content_hash FROM documents")}
        todo: dict[str, tuple[DocInput, str]] = {}
        for d in docs:
            h = content_hash(d.text)
            if existing.get(d.key()) == h:
                base.unchanged += 1
                if progress:
                    progress(1)
            else:
                todo[d.key()] = (d, h)  # the last version of a repeated path wins
        if not todo:
            return base
        # tokenize before any transaction: nothing is locked, Ctrl-C changes nothing
        keys = list(todo)
        token_ids = dict(zip(keys, encode_batched(tokenizer, [todo[k][0].text for k in keys], progress),
                             strict=True))

        def plan(conn: sqlite3.Connection) -> _Plan:
            summary = AddSummary(unchanged=base.unchanged)
            current = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT path, id, content_hash FROM documents")}
            doc_ids = {r[0] for r in current.values()}
            next_id = max(doc_ids, default=0) + 1  # what INTEGER PRIMARY KEY would pick
            rows: list[tuple[int | None, str, DocInput, str]] = []  # (id to update or None, key, doc, hash)
            mine: dict[int, np.ndarray] = {}
            for key in keys:
                d, h = todo[key]
                old = current.get(key)
                if old is not None and old[1] == h:  # another writer added this very content meanwhile
                    summary.unchanged += 1
                    continue
                if old is not None:
                    doc_id = old[0]
                    rows.append((doc_id, key, d, h))
                    summary.updated += 1
                else:
                    doc_id, next_id = next_id, next_id + 1
                    rows.append((None, key, d, h))
                    summary.added += 1
                doc_ids.add(doc_id)
                mine[doc_id] = token_ids[key]
                summary.tokens += len(token_ids[key])
                summary.ids.append(doc_id)
            if not rows:
                return _Plan(result=summary)
            ordered = sorted(doc_ids)
            replaced = {r[0] for r in rows if r[0] is not None}
            seqs, extra = self._plan_arrays(conn, ordered, {fp: mine}, replaced, {fp: tokenizer})

            def apply(conn: sqlite3.Connection) -> None:
                now = time.time()
                for (old_id, key, d, h), doc_id in zip(rows, summary.ids, strict=True):
                    meta = json.dumps(d.metadata, ensure_ascii=False, default=str)
                    nbytes = len(d.text.encode("utf-8"))
                    if old_id is not None:
                        conn.execute("DELETE FROM doc_tokens WHERE doc_id = ?", [doc_id])
                        conn.execute("UPDATE documents SET content_hash = ?, text = ?, metadata = ?, n_bytes = ?, "
                                     "added_at = ? WHERE id = ?", [h, d.text, meta, nbytes, now, doc_id])
                    else:
                        conn.execute("INSERT INTO documents (id, path, content_hash, text, metadata, n_bytes, "
                                     "added_at) VALUES (?, ?, ?, ?, ?, ?, ?)", [doc_id, key, h, d.text, meta, nbytes, now])
                    _insert_tokens(conn, doc_id, fp, mine[doc_id])
                _insert_extra(conn, extra)

            return _Plan(result=summary, doc_ids=ordered, seqs=seqs, apply=apply)

        return self._mutate(plan)

    def remove(self, keys: Sequence[int | str]) -> int:
        """Remove documents by id or exact path; returns how many were removed."""

        def plan(conn: sqlite3.Connection) -> _Plan:
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
                return _Plan(result=0)
            gone = set(ids)
            ordered = [r[0] for r in conn.execute("SELECT id FROM documents ORDER BY id") if r[0] not in gone]
            seqs, _ = self._plan_arrays(conn, ordered, {}, set(), {})

            def apply(conn: sqlite3.Connection) -> None:
                for doc_id in ids:
                    conn.execute("DELETE FROM doc_tokens WHERE doc_id = ?", [doc_id])
                    conn.execute("DELETE FROM documents WHERE id = ?", [doc_id])

            return _Plan(result=len(ids), doc_ids=ordered, seqs=seqs, apply=apply)

        return self._mutate(plan)

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

    # ----- arrays ----------------------------------------------------------------------------------
    def _plan_arrays(self, conn: sqlite3.Connection, doc_ids: list[int], new_tokens: dict[str, dict[int, np.ndarray]],
                     replaced: set[int], complete_with: dict[str, Any]
                     ) -> tuple[dict[str, list[np.ndarray]], dict[str, dict[int, np.ndarray]]]:
        """The token sequences (in ``doc_ids`` order) of every fingerprint whose ids will be complete once
        ``new_tokens`` are written; documents missing ids for a fingerprint in ``complete_with`` are
        tokenized now with that tokenizer (returned as the second value, to be written too). ``replaced``:
        documents whose stored ids are about to be deleted. Fingerprints still incomplete are left out:
        their arrays stay stale until a process with that tokenizer completes them (``document_index``)."""
        seqs: dict[str, list[np.ndarray]] = {}
        extra: dict[str, dict[int, np.ndarray]] = {}
        for (fp,) in conn.execute("SELECT fingerprint FROM tokenizers ORDER BY added_at").fetchall():
            mine = new_tokens.get(fp, {})
            have = {d: b for d, b in conn.execute("SELECT doc_id, ids FROM doc_tokens WHERE fingerprint = ?", [fp])
                    if d not in replaced}
            missing = [d for d in doc_ids if d not in mine and d not in have]
            if missing and fp in complete_with:
                texts = [conn.execute("SELECT text FROM documents WHERE id = ?", [d]).fetchone()[0] for d in missing]
                extra[fp] = dict(zip(missing, encode_batched(complete_with[fp], texts), strict=True))
                missing = []
            if missing:
                continue
            more = extra.get(fp, {})
            seqs[fp] = [mine[d] if d in mine else more[d] if d in more else np.frombuffer(have[d], dtype="<u4")
                        for d in doc_ids]
        return seqs, extra

    def _mutate(self, make_plan: Callable[[sqlite3.Connection], _Plan]) -> Any:
        """Plan on a read snapshot, build the arrays with no lock held, then commit in a short write
        transaction if no other writer committed meanwhile; else plan again (see the module docstring)."""
        conn = self.db.conn
        for _ in range(self.OPTIMISTIC_ATTEMPTS):
            conn.execute("BEGIN")  # deferred: a read snapshot (WAL), blocks no writer
            try:
                base_version = self.docs_version()
                plan = make_plan(conn)
            finally:
                conn.execute("COMMIT")
            if plan.apply is None:
                return plan.result
            files: list[Path] = []
            try:
                with self._build_guard():
                    built = self._build_arrays(plan, base_version + 1, files)
                    with self._write_txn() as written:
                        fresh = self.docs_version() == base_version
                        if fresh:
                            written.extend(files)
                            plan.apply(conn)
                            self._rebuild_arrays_locked(written, plan, built)
            except BaseException:
                _unlink(files)
                raise
            if fresh:
                self._collect_garbage()
                return plan.result
            _unlink(files)  # another writer got in first: plan again on its state
        # contended: plan, build and commit under the write lock
        with self._build_guard(), self._write_txn() as written:
            plan = make_plan(conn)
            if plan.apply is not None:
                plan.apply(conn)
                self._rebuild_arrays_locked(written, plan)
        self._collect_garbage()
        return plan.result

    def _build_arrays(self, plan: _Plan, version: int, files: list[Path]) -> dict[str, dict[str, Any]]:
        """Build and write (fsync'ed) the arrays of ``plan`` under fresh generation names; every path is
        appended to ``files`` before it is created, so the caller can delete them. Returns the ``meta``
        value per fingerprint."""
        self.arrays_dir.mkdir(parents=True, exist_ok=True)
        out = {}
        for fp, seqs in plan.seqs.items():
            sa = SuffixArray.build(seqs, self.sort_depth)
            name = f"{fp[:16]}-{version}-{os.getpid()}-{secrets.token_hex(4)}"
            prefix = self.arrays_dir / name
            paths = [Path(str(prefix) + ext) for ext in (".tokens.npy", ".sa.npy", ".starts.npy", ".docids.npy")]
            files.extend(paths)
            sa.save(prefix)
            np.save(paths[-1], np.asarray(plan.doc_ids, dtype=np.int64))
            for p in paths:
                with open(p, "rb+") as f:
                    os.fsync(f.fileno())
            out[fp] = {"name": name, "docs_version": version, "n_tokens": sa.num_tokens, "n_docs": len(plan.doc_ids)}
        return out

    def _rebuild_arrays_locked(self, written: list[Path], plan: _Plan,
                               built: dict[str, dict[str, Any]] | None = None) -> None:
        """Inside the write transaction: bump ``docs_version`` and point ``meta`` at the arrays of ``plan``,
        those already ``built`` outside the lock, or built now (their files go to ``written`` first, so a
        rollback deletes them)."""
        version = self.docs_version() + 1
        self._set_meta("docs_version", str(version))
        if built is None:
            built = self._build_arrays(plan, version, written)
        for fp, info in built.items():
            assert info["docs_version"] == version
            self._set_meta(f"arrays:{fp}", json.dumps(info))

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

    def _referenced_names(self) -> set[str]:
        names = set()
        for (value,) in self.db.execute("SELECT value FROM meta WHERE key LIKE 'arrays:%'"):
            names.add(json.loads(value)["name"])
        return names

    def _collect_garbage(self) -> None:
        """Delete array files no generation refers to (old versions, leftovers of a killed writer).
        Skipped while another writer holds uncommitted files (it or a later writer collects them)."""
        if not self.arrays_dir.exists():
            return
        fd = os.open(self.arrays_dir, os.O_RDONLY) if fcntl is not None else None
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return
            keep = self._referenced_names()
            for p in self.arrays_dir.iterdir():
                if p.name.split(".", 1)[0] not in keep:
                    p.unlink(missing_ok=True)
        finally:
            if fd is not None:
                os.close(fd)

    def document_index(self, fingerprint_or_tokenizer: str | Any) -> SuffixArray | None:
        """The memory-mapped suffix array over all documents for this tokenizer (None if no documents).

        Given a tokenizer (not just a fingerprint), documents added under another tokenizer are
        tokenized now and the arrays rebuilt once; given a fingerprint, the latest arrays are used.
        """
        if isinstance(fingerprint_or_tokenizer, str):
            fp, tokenizer = fingerprint_or_tokenizer, None
        else:
            tokenizer = fingerprint_or_tokenizer
            fp = tokenizer_fingerprint(tokenizer)
        n_docs = self.db.execute("SELECT count(*) FROM documents").fetchone()[0]
        if n_docs == 0:
            return None
        info = self._meta(f"arrays:{fp}")
        if self._stale(info) and tokenizer is not None:
            self.register_tokenizer(tokenizer)

            def plan(conn: sqlite3.Connection) -> _Plan:
                if not self._stale(self._meta(f"arrays:{fp}")):
                    return _Plan(result=None)  # another process rebuilt them meanwhile
                ordered = [r[0] for r in conn.execute("SELECT id FROM documents ORDER BY id")]
                seqs, extra = self._plan_arrays(conn, ordered, {}, set(), {fp: tokenizer})
                return _Plan(result=None, doc_ids=ordered, seqs=seqs, apply=lambda c: _insert_extra(c, extra))

            self._mutate(plan)
            info = self._meta(f"arrays:{fp}")
        if info is None:
            return None
        for _ in range(5):  # a writer may replace the files between reading meta and opening them
            name = json.loads(info)["name"]
            try:
                return SuffixArray.load(self.arrays_dir / name, self.sort_depth)
            except FileNotFoundError:
                info = self._meta(f"arrays:{fp}")
                if info is None:
                    return None
        raise RuntimeError(f"could not open the arrays of {self.path}; is a writer stuck?")

    def _stale(self, info: str | None) -> bool:
        return info is None or json.loads(info)["docs_version"] != self.docs_version()

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
        """Counts, sizes on disk and an estimate of the memory the arrays take when loaded."""
        n_docs, n_bytes = self.db.execute("SELECT count(*), coalesce(sum(n_bytes), 0) FROM documents").fetchone()
        per_fp = {}
        for fp, name in self.db.execute("SELECT fingerprint, name FROM tokenizers"):
            n_tok, n_tok_docs = self.db.execute("SELECT coalesce(sum(n_tokens), 0), count(*) FROM doc_tokens "
                                                "WHERE fingerprint = ?", [fp]).fetchone()
            h_tok, h_n = self.db.execute("SELECT coalesce(sum(n_tokens), 0), count(*) FROM history "
                                         "WHERE fingerprint = ?", [fp]).fetchone()
            info = self._meta(f"arrays:{fp}")
            fresh = info is not None and json.loads(info)["docs_version"] == self.docs_version()
            per_fp[fp] = {"tokenizer": name, "document_tokens": n_tok, "documents_tokenized": n_tok_docs,
                          "history_outputs": h_n, "history_tokens": h_tok, "arrays_current": fresh,
                          # tokens + suffix array (4 + 4 bytes per token, separators included); the token
                          # history lives in an incremental index of ~12 bytes per token plus dict entries
                          "memory_estimate_bytes": 8 * (n_tok + n_tok_docs) + 16 * h_tok}
        disk = sum(p.stat().st_size for p in [self.path, Path(str(self.path) + "-wal"), Path(str(self.path) + "-shm")]
                   if p.exists())
        arrays = sum(p.stat().st_size for p in self.arrays_dir.iterdir()) if self.arrays_dir.exists() else 0
        return {"db": str(self.path), "documents": n_docs, "document_bytes": n_bytes,
                "tokens": {fp: v["document_tokens"] for fp, v in per_fp.items()},
                "bytes_on_disk": disk + arrays, "db_bytes": disk, "arrays_bytes": arrays,
                "memory_estimate_bytes": sum(v["memory_estimate_bytes"] for v in per_fp.values()),
                "tokenizers": per_fp}
