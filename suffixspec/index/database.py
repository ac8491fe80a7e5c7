"""The SQLite database of an index store (sqlite-utils, WAL): where it lives, its tables, write
transactions and the version counter readers poll.

Tables::

    documents   id, path (unique), content_hash, text, metadata (JSON), n_bytes, added_at
    doc_tokens  (doc_id, fingerprint) -> n_tokens, segment (the segment holding the live version);
                ids (uint32 blob) only in databases of earlier versions, until their first load
    segments    id, fingerprint, name, width, n_tokens, n_seqs, dead (tombstone file), dead_seqs,
                dead_tokens, created_at
    tokenizers  fingerprint -> name (its name_or_path), added_at, model (the model it was served or added
                for, as the user named it), used_at (last served or indexed for), source (what it was
                loaded from), backend (its serialized fast tokenizer), see :mod:`index.tokenizer_table`
    history     id, fingerprint, n_tokens, ids (blob), created_at      (finished outputs, oldest first)
    meta        key -> value: "docs_version" (bumped by every change of the document index)

Opening refuses a file that is not a suffixspec index (another program's database, a corrupt file)
with :class:`~index.errors.UnusableDatabase`, and adds what earlier versions lacked (columns, indexes).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils

from .errors import UnusableDatabase

DB_ENV = "SUFFIXSPEC_DB"
BUSY_TIMEOUT_MS = 60_000  # a writer waits this long for another one's transaction

# table -> columns this store needs; a file with other tables but not these is someone else's database
_REQUIRED = {"documents": {"id", "path", "content_hash", "text", "metadata", "n_bytes", "added_at"},
             "doc_tokens": {"doc_id", "fingerprint", "n_tokens", "ids"},
             "tokenizers": {"fingerprint", "name", "added_at"},
             "history": {"id", "fingerprint", "n_tokens", "ids", "created_at"},
             "meta": {"key", "value"}}
# columns added since the first version: (table, column, SQL type), added on open
_ADDED_COLUMNS = [("doc_tokens", "segment", "INTEGER"), ("tokenizers", "model", "TEXT"),
                  ("tokenizers", "used_at", "FLOAT"), ("tokenizers", "source", "TEXT"), ("tokenizers", "backend", "TEXT")]


def default_db_path() -> Path:
    """``$SUFFIXSPEC_DB``, else ``$XDG_DATA_HOME/suffixspec/index.db`` (``~/.local/share/suffixspec/index.db``)."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "suffixspec" / "index.db"


def connect(path: Path, readonly: bool = False) -> sqlite_utils.Database:
    """Open (creating unless ``readonly``) the index database at ``path``: WAL, schema checked and brought
    up to date. Raises :class:`UnusableDatabase` for a file that is not (or cannot be) a suffixspec index."""
    if readonly:
        if not path.exists():
            raise UnusableDatabase(f"no index database at {path}")
        uri = f"file:{path}?mode=ro"
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        uri = str(path)
    try:
        conn = sqlite3.connect(uri, timeout=60.0, check_same_thread=False, isolation_level=None, uri=readonly)
    except sqlite3.Error as e:
        raise UnusableDatabase(f"cannot open the index database {path}: {e}") from None
    db = sqlite_utils.Database(conn)
    try:
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _check_schema(db, path)
        if not readonly:
            if db.journal_mode != "wal":
                db.enable_wal()
            # a segment commit writes its text to the WAL; once checkpointed, the file shrinks back
            db.execute(f"PRAGMA journal_size_limit = {4 << 20}")
            db.execute("PRAGMA foreign_keys = ON")
            try:
                _create_schema(db)
            except sqlite3.OperationalError as e:
                if not refused_write(e) or not db.table_names():
                    raise
                # an existing index in a file that refuses writes: readable as it is; writes say why they fail
    except sqlite3.DatabaseError as e:  # "file is not a database", "database disk image is malformed"
        conn.close()
        raise UnusableDatabase(f"{path} is not a usable suffixspec index database ({e}); "
                               "point --db / $SUFFIXSPEC_DB at another file or move this one away") from None
    except UnusableDatabase:
        conn.close()
        raise
    return db


def _check_schema(db: sqlite_utils.Database, path: Path) -> None:
    """Refuse another program's database instead of adding tables to it or failing later."""
    tables = set(db.table_names())
    if not tables:
        return  # a new (or empty) file: ours to create
    if not tables & _REQUIRED.keys():
        raise UnusableDatabase(f"{path} is a SQLite database of another program (tables: "
                               f"{', '.join(sorted(tables)[:5])}), not a suffixspec index; "
                               "point --db / $SUFFIXSPEC_DB at another file")
    for table, cols in _REQUIRED.items():
        if table in tables:
            missing = cols - {c.name for c in db[table].columns}
            if missing:
                raise UnusableDatabase(f"{path} has a '{table}' table without the column(s) {sorted(missing)}: "
                                       "not a suffixspec index (or one from an incompatible version); "
                                       "point --db / $SUFFIXSPEC_DB at another file")


def _create_schema(db: sqlite_utils.Database) -> None:
    names = db.table_names()
    if "documents" not in names:
        db["documents"].create({"id": int, "path": str, "content_hash": str, "text": str, "metadata": str,
                                "n_bytes": int, "added_at": float}, pk="id", if_not_exists=True)
        db["documents"].create_index(["path"], unique=True, if_not_exists=True)
        db["documents"].create_index(["content_hash"], if_not_exists=True)
    if "doc_tokens" not in names:
        db["doc_tokens"].create({"doc_id": int, "fingerprint": str, "n_tokens": int, "ids": bytes,
                                 "segment": int},
                                pk=("doc_id", "fingerprint"), foreign_keys=[("doc_id", "documents", "id")],
                                if_not_exists=True)
    if "tokenizers" not in names:
        db["tokenizers"].create({"fingerprint": str, "name": str, "added_at": float, "model": str, "used_at": float,
                                 "source": str, "backend": str}, pk="fingerprint", if_not_exists=True)
    if "history" not in names:
        db["history"].create({"id": int, "fingerprint": str, "n_tokens": int, "ids": bytes, "created_at": float},
                             pk="id", if_not_exists=True)
        db["history"].create_index(["fingerprint", "id"], if_not_exists=True)
    if "meta" not in names:
        db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    if "segments" not in names:
        db["segments"].create({"id": int, "fingerprint": str, "name": str, "width": int, "n_tokens": int,
                               "n_seqs": int, "dead": str, "dead_seqs": int, "dead_tokens": int,
                               "created_at": float}, pk="id", if_not_exists=True)
        db["segments"].create_index(["fingerprint"], if_not_exists=True)
    for table, column, sql_type in _ADDED_COLUMNS:  # a database of an earlier version
        if column not in {c.name for c in db[table].columns}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
    db["doc_tokens"].create_index(["segment"], if_not_exists=True)
    # counting documents and summing their sizes from an index: the table's rows hold the texts
    db["documents"].create_index(["n_bytes"], if_not_exists=True)


def refused_write(e: sqlite3.Error) -> bool:
    """Whether ``e`` is the database refusing a write (read-only file or folder, full disk, I/O error)."""
    msg = str(e)
    return any(w in msg for w in ("readonly", "read-only", "full", "unable to open", "disk I/O"))


def has_column(db: sqlite_utils.Database, table: str, column: str) -> bool:
    """Whether ``table`` has ``column`` (a database of an earlier version opened read-only may lack it)."""
    return table in db.table_names() and column in {c.name for c in db[table].columns}


@contextmanager
def write_txn(db: sqlite_utils.Database) -> Iterator[list[Path]]:
    """One write transaction (BEGIN IMMEDIATE ... COMMIT). Yields a list the body fills with the array
    files it wrote: on any exception (Ctrl-C included) the transaction rolls back and they are deleted."""
    conn = db.conn
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


def get_meta(db: sqlite_utils.Database, key: str, default: str | None = None) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return row[0] if row else default


def set_meta(db: sqlite_utils.Database, key: str, value: str) -> None:
    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [key, value])


def docs_version(db: sqlite_utils.Database) -> int:
    """The document index's version: readers reload their segments when it changed."""
    return int(get_meta(db, "docs_version", "0"))


def bump_docs_version(db: sqlite_utils.Database) -> None:
    """Inside a write transaction that changed documents or segments."""
    set_meta(db, "docs_version", str(docs_version(db) + 1))


def checkpoint(db: sqlite_utils.Database) -> None:
    """Copy the WAL into the database (a large add would otherwise keep its text there twice);
    PASSIVE: it never waits for readers or writers, and what it cannot copy now goes later."""
    try:
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except sqlite3.OperationalError:
        pass


@contextmanager
def busy_timeout(db: sqlite_utils.Database, timeout_s: float | None) -> Iterator[None]:
    """With ``timeout_s``, wait at most that long for another writer (then ``sqlite3.OperationalError``)."""
    if timeout_s is None:
        yield
        return
    db.execute(f"PRAGMA busy_timeout = {max(0, int(timeout_s * 1000))}")
    try:
        yield
    finally:
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
