"""The SQLite store (sqlite-utils, WAL) behind the document corpus and the output history.

Tables::

    documents   id, path (unique), content_hash, text, metadata (JSON), n_bytes, added_at
    doc_tokens  (doc_id, fingerprint) -> n_tokens, ids (uint32 little-endian blob)
    tokenizers  fingerprint -> name, added_at
    history     id, fingerprint, n_tokens, ids (blob), created_at      (finished outputs, oldest first)
    meta        key -> value: "docs_version"; "arrays:<fingerprint>" -> JSON of the current arrays

Beside ``index.db`` lives ``index.db.arrays/``: per fingerprint, the suffix array of all documents
(``<fp>-<gen>.tokens.npy``, ``.sa.npy``, ``.starts.npy``, ``.docids.npy``), memory-mapped at start-up.

Atomic add: everything happens inside one ``BEGIN IMMEDIATE`` transaction: rows are written, the new
arrays are built and written under a fresh generation name, ``meta`` points at them, then COMMIT.
A crash or Ctrl-C before COMMIT rolls the database back; the half-written arrays are unreferenced
files removed by the next writer. Readers are never blocked (WAL) and keep the arrays they mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sqlite_utils

from .fingerprint import encode_texts, tokenizer_fingerprint, tokenizer_name
from .suffix_array import DEFAULT_SORT_DEPTH, SuffixArray

DB_ENV = "SUFFIXSPEC_DB"


def default_db_path() -> Path:
    """``$SUFFIXSPEC_DB``, else ``$XDG_DATA_HOME/suffixspec/index.db`` (``~/.local/share/suffixspec/index.db``)."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "suffixspec" / "index.db"


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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

    def __init__(self, path: str | os.PathLike | None = None, sort_depth: int = DEFAULT_SORT_DEPTH) -> None:
        self.path = Path(path).expanduser() if path else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.arrays_dir = Path(str(self.path) + ".arrays")
        self.sort_depth = sort_depth
        conn = sqlite3.connect(str(self.path), timeout=60.0, check_same_thread=False, isolation_level=None)
        self.db = sqlite_utils.Database(conn)
        self.db.execute("PRAGMA busy_timeout = 60000")
        if self.db.journal_mode != "wal":
            self.db.enable_wal()
        self.db.execute("PRAGMA foreign_keys = ON")
        self._create_schema()

    def close(self) -> None:
        self.db.conn.close()

    def __enter__(self) -> IndexStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        self.db.execute("INSERT OR IGNORE INTO tokenizers (fingerprint, name, added_at) VALUES (?, ?, ?)",
                        [fp, tokenizer_name(tokenizer), time.time()])
        return fp

    # ----- documents -----------------------------------------------------------------------------
    def add_documents(self, docs: Iterable[DocInput], tokenizer: Any,
                      progress: Callable[[int], None] | None = None) -> AddSummary:
        """Add or replace documents atomically; unchanged ones (same path, same hash) are left alone.

        ``progress(n)`` is called as documents are tokenized. Returns counts of what happened.
        """
        docs = list(docs)
        summary = AddSummary()
        fp = self.register_tokenizer(tokenizer)
        existing = {row[0]: (row[1], row[2]) for row in
                    self.db.execute("SELECT path, id, content_hash FROM documents")}
        todo: dict[str, tuple[DocInput, str]] = {}
        for d in docs:
            h = content_hash(d.text)
            old = existing.get(d.key())
            if old is not None and old[1] == h:
                summary.unchanged += 1
                if progress:
                    progress(1)
            else:
                todo[d.key()] = (d, h)  # the last version of a repeated path wins
        if not todo:
            return summary
        batch = list(todo.items())
        ids_per_doc: list[np.ndarray] = []
        step = 64
        for i in range(0, len(batch), step):  # batched tokenization, progress per batch
            chunk = batch[i:i + step]
            ids_per_doc.extend(encode_texts(tokenizer, [d.text for _, (d, _) in chunk]))
            if progress:
                progress(len(chunk))
        conn = self.db.conn
        with self._write_txn() as written:
            now = time.time()
            for (key, (d, h)), ids in zip(batch, ids_per_doc, strict=True):
                old = conn.execute("SELECT id FROM documents WHERE path = ?", [key]).fetchone()
                meta = json.dumps(d.metadata, ensure_ascii=False, default=str)
                nbytes = len(d.text.encode("utf-8"))
                if old:
                    doc_id = old[0]
                    conn.execute("DELETE FROM doc_tokens WHERE doc_id = ?", [doc_id])
                    conn.execute("UPDATE documents SET content_hash = ?, text = ?, metadata = ?, n_bytes = ?, "
                                 "added_at = ? WHERE id = ?", [h, d.text, meta, nbytes, now, doc_id])
                    summary.updated += 1
                else:
                    cur = conn.execute("INSERT INTO documents (path, content_hash, text, metadata, n_bytes, added_at) "
                                       "VALUES (?, ?, ?, ?, ?, ?)", [key, h, d.text, meta, nbytes, now])
                    doc_id = cur.lastrowid
                    summary.added += 1
                conn.execute("INSERT INTO doc_tokens (doc_id, fingerprint, n_tokens, ids) VALUES (?, ?, ?, ?)",
                             [doc_id, fp, len(ids), ids.astype("<u4").tobytes()])
                summary.tokens += len(ids)
                summary.ids.append(doc_id)
            self._rebuild_arrays_locked(written, complete_with={fp: tokenizer})
        self._collect_garbage()
        return summary

    def remove(self, keys: Sequence[int | str]) -> int:
        """Remove documents by id or exact path; returns how many were removed."""
        conn = self.db.conn
        removed = 0
        with self._write_txn() as written:
            for k in keys:
                row = None
                if isinstance(k, int) or (isinstance(k, str) and k.isdigit()):
                    row = conn.execute("SELECT id FROM documents WHERE id = ?", [int(k)]).fetchone()
                if row is None:
                    row = conn.execute("SELECT id FROM documents WHERE path = ?", [str(k)]).fetchone()
                if row is None and os.path.exists(str(k)):
                    row = conn.execute("SELECT id FROM documents WHERE path = ?", [str(Path(k).resolve())]).fetchone()
                if row is None:
                    continue
                conn.execute("DELETE FROM doc_tokens WHERE doc_id = ?", [row[0]])
                conn.execute("DELETE FROM documents WHERE id = ?", [row[0]])
                removed += 1
            if removed:
                self._rebuild_arrays_locked(written)
        self._collect_garbage()
        return removed

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
    def _rebuild_arrays_locked(self, written: list[Path], complete_with: dict[str, Any] | None = None) -> None:
        """Inside a write transaction: rebuild and write the suffix arrays of every fingerprint whose
        token ids are complete (tokenizing missing documents with the tokenizers in ``complete_with``).
        Files are added to ``written`` before they are created, so a rollback can delete them."""
        conn = self.db.conn
        version = self.docs_version() + 1
        self._set_meta("docs_version", str(version))
        doc_ids = [r[0] for r in conn.execute("SELECT id FROM documents ORDER BY id")]
        self.arrays_dir.mkdir(parents=True, exist_ok=True)
        for fp in self.fingerprints():
            have = dict(conn.execute("SELECT doc_id, ids FROM doc_tokens WHERE fingerprint = ?", [fp]).fetchall())
            missing = [d for d in doc_ids if d not in have]
            if missing and complete_with and fp in complete_with:
                texts = [conn.execute("SELECT text FROM documents WHERE id = ?", [d]).fetchone()[0] for d in missing]
                for d, ids in zip(missing, encode_texts(complete_with[fp], texts), strict=True):
                    blob = ids.astype("<u4").tobytes()
                    conn.execute("INSERT INTO doc_tokens (doc_id, fingerprint, n_tokens, ids) VALUES (?, ?, ?, ?)",
                                 [d, fp, len(ids), blob])
                    have[d] = blob
                missing = []
            if missing:
                continue  # stale until a process with this tokenizer completes it (see document_index)
            seqs = [np.frombuffer(have[d], dtype="<u4") for d in doc_ids]
            sa = SuffixArray.build(seqs, self.sort_depth)
            name = f"{fp[:16]}-{version}-{os.getpid()}"
            prefix = self.arrays_dir / name
            paths = [Path(str(prefix) + ext) for ext in (".tokens.npy", ".sa.npy", ".starts.npy", ".docids.npy")]
            written.extend(paths)
            sa.save(prefix)
            np.save(paths[-1], np.asarray(doc_ids, dtype=np.int64))
            for p in paths:
                with open(p, "rb+") as f:
                    os.fsync(f.fileno())
            self._set_meta(f"arrays:{fp}", json.dumps({"name": name, "docs_version": version,
                                                       "n_tokens": sa.num_tokens, "n_docs": len(doc_ids)}))

    def _referenced_names(self) -> set[str]:
        names = set()
        for (value,) in self.db.execute("SELECT value FROM meta WHERE key LIKE 'arrays:%'"):
            names.add(json.loads(value)["name"])
        return names

    def _collect_garbage(self) -> None:
        """Delete array files no generation refers to (old versions, leftovers of a killed writer)."""
        if not self.arrays_dir.exists():
            return
        keep = self._referenced_names()
        for p in self.arrays_dir.iterdir():
            if p.name.split(".", 1)[0] not in keep:
                p.unlink(missing_ok=True)

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
        stale = info is None or json.loads(info)["docs_version"] != self.docs_version()
        if stale and tokenizer is not None:
            self.register_tokenizer(tokenizer)
            with self._write_txn() as written:
                self._rebuild_arrays_locked(written, complete_with={fp: tokenizer})
            self._collect_garbage()
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
