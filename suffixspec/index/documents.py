"""The documents table and the segments their token ids go to: add, replace, remove, list, and
index stored documents for a tokenizer that has not seen them.

An add streams its documents (tokenized in batches) into a fresh segment file, sorts it with no lock
held, then commits the document rows and the segment in one short transaction
(:meth:`~index.catalogue.SegmentCatalogue.commit`); a large add commits a segment every ``flush_tokens``
tokens, so memory stays bounded. Replaced documents get tombstones in their old segments (one pass over
that segment's suffix array); a remove deletes the rows and writes tombstones, in one transaction.

Every step costs what the add holds, not what the store holds: a document's stored version is found by
its indexed path, never by reading the table (an add of one document to 20,000 costs what it costs
beside 100, see ``python -m suffixspec.bench.bench_index --sections add``).

Example: adding ``a.txt`` = "alpha" to an empty store commits one segment ``[alpha-ids SEP]`` with
``docids = [1]``; adding ``a.txt`` = "beta" later commits ``[beta-ids SEP]`` and tombstones the first
segment's only sequence (that segment is then dropped: no live document is left in it).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sqlite_utils

from .catalogue import SegmentCatalogue
from .database import bump_docs_version, write_txn
from .errors import InvalidDocument
from .fingerprint import TOKENIZE_BATCH_CHARS, TOKENIZE_BATCH_DOCS, encode_batched
from .records import (
    ADDED,
    UNCHANGED,
    UPDATED,
    AddSummary,
    DocInput,
    ProgressFn,
    content_hash,
    text_bytes,
)
from .segments import SegmentWriter
from .tokenizer_table import known as tokenizer_known
from .tokenizer_table import register as register_tokenizer

FLUSH_TOKENS = 16 << 20  # an add commits a segment at least every this many tokens (~10 bytes/token to sort)
PREVIEW_CHARS = 160  # the start of a document's text that a listing shows
log = logging.getLogger("suffixspec.index")


@dataclass
class _Staged:
    """A document tokenized into the segment being written, waiting for its commit."""

    doc: DocInput
    hash: str
    n_tokens: int
    superseded: bool = False  # a later document of this add has the same key


class DocumentTable:
    """Documents of one store and their token ids in the segments of each tokenizer."""

    def __init__(self, db: sqlite_utils.Database, catalogue: SegmentCatalogue, flush_tokens: int = FLUSH_TOKENS,
                 where: str = "index") -> None:
        self.db = db
        self.where = where  # the database's path, for messages
        self.catalogue = catalogue
        self.flush_tokens = flush_tokens  # an add commits a segment at least every this many tokens

    # ----- adding ------------------------------------------------------------------------------------
    def add(self, docs: Iterable[DocInput], tokenizer: Any, fingerprint: str, progress: ProgressFn | None = None,
            status: Callable[[str], None] | None = None) -> AddSummary:
        """Add or replace documents; unchanged ones (same key, same hash) are left alone.

        ``docs`` may be a generator: documents are tokenized in batches of about ``TOKENIZE_BATCH_CHARS``
        characters (in parallel by a fast tokenizer) and streamed into a segment file, committed every
        ``flush_tokens`` tokens and at the end, so memory is bounded by one segment, not the corpus.
        An add that fits one segment is atomic; a larger one that is interrupted keeps the segments it
        committed (whole documents; a rerun skips them as unchanged). ``progress(docs, tokens, bytes)``
        is called as documents are read and tokenized; ``status(text)`` when a segment is sorted.
        """
        summary = AddSummary()
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
                writer = SegmentWriter(self.catalogue.new_prefix(fingerprint))
            for (d, h), arr in zip(batch, ids, strict=True):
                writer.add(arr)
                st = _Staged(d, h, len(arr))
                old = by_key.get(d.key())
                if old is not None:
                    old.superseded = True  # the last version of a repeated path wins
                by_key[d.key()] = st
                staged.append(st)
            if progress:
                progress(len(batch), int(sum(len(a) for a in ids)), sum(text_bytes(d.text) for d, _ in batch))
            batch, batch_chars = [], 0

        with self.catalogue.build_guard():
            try:
                for d in docs:
                    _check(d)
                    h = content_hash(d.text)
                    # a path repeated in this add: its last version wins, even one equal to the stored text
                    stored = None if d.key() in pending else self._stored(d.key())
                    if stored is not None and stored[1] == h:
                        summary.unchanged += 1
                        summary.settle(d.key(), stored[0], UNCHANGED)
                        if progress:
                            progress(1, 0, text_bytes(d.text))
                        continue
                    batch.append((d, h))
                    pending.add(d.key())
                    batch_chars += len(d.text)
                    if batch_chars >= TOKENIZE_BATCH_CHARS or len(batch) >= TOKENIZE_BATCH_DOCS:
                        tokenize_batch()
                        if writer is not None and writer.num_tokens >= self.flush_tokens:
                            self._commit_new_segment(fingerprint, writer, staged, summary, status)
                            writer, staged, by_key, pending = None, [], {}, set()
                tokenize_batch()
                if writer is not None:
                    self._commit_new_segment(fingerprint, writer, staged, summary, status)
                    writer = None
            except BaseException:
                if writer is not None:
                    writer.abort()
                raise
        self.catalogue.collect_garbage()
        return summary

    def _stored(self, key: str) -> tuple[int, str] | None:
        """(id, content hash) of the stored document ``key``: one indexed lookup (reading every (path, hash)
        row scans the whole table, texts included: 0.26 s at 44k documents / 630 MB of text)."""
        row = self.db.execute("SELECT id, content_hash FROM documents WHERE path = ?", [key]).fetchone()
        return (row[0], row[1]) if row else None

    def _commit_new_segment(self, fp: str, writer: SegmentWriter, staged: list[_Staged], summary: AddSummary,
                            status: Callable[[str], None] | None = None) -> None:
        """Commit the documents of an add with their segment."""

        def rows(conn: sqlite3.Connection, seg_ids: list[int]) -> tuple[list[np.ndarray], set[int]]:
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
                    summary.settle(key, row[0], UNCHANGED)
                    continue
                meta = json.dumps(d.metadata, ensure_ascii=False, default=str)
                if row is not None:
                    doc_id = row[0]
                    touched.update(r[0] for r in conn.execute(
                        "SELECT segment FROM doc_tokens WHERE doc_id = ? AND segment IS NOT NULL", [doc_id]))
                    conn.execute("DELETE FROM doc_tokens WHERE doc_id = ?", [doc_id])
                    conn.execute("UPDATE documents SET content_hash = ?, text = ?, metadata = ?, n_bytes = ?, "
                                 "added_at = ? WHERE id = ?", [st.hash, d.text, meta, text_bytes(d.text), now, doc_id])
                    summary.updated += 1
                    summary.settle(key, doc_id, UPDATED)
                else:
                    doc_id = conn.execute("INSERT INTO documents (path, content_hash, text, metadata, n_bytes, "
                                          "added_at) VALUES (?, ?, ?, ?, ?, ?)",
                                          [key, st.hash, d.text, meta, text_bytes(d.text), now]).lastrowid
                    summary.added += 1
                    summary.settle(key, doc_id, ADDED)
                conn.execute("INSERT INTO doc_tokens (doc_id, fingerprint, n_tokens, segment) VALUES (?, ?, ?, ?)",
                             [doc_id, fp, st.n_tokens, seg_ids[0]])
                docids[k] = doc_id
                summary.tokens += st.n_tokens
                summary.ids.append(doc_id)
            return [docids], touched

        self.catalogue.commit(fp, [writer], rows, status)

    # ----- removing ----------------------------------------------------------------------------------
    def remove(self, keys: Sequence[int | str]) -> int:
        """Remove documents by id or exact path; returns how many were removed. Their tokens become
        tombstones (a segment left with no live document is dropped at once)."""
        with self.catalogue.build_guard(), write_txn(self.db) as written:
            conn = self.db.conn
            ids: list[int] = []
            for k in keys:
                doc_id = self._find(conn, k)
                if doc_id is not None and doc_id not in ids:
                    ids.append(doc_id)
            if not ids:
                return 0
            touched: set[int] = set()
            for doc_id in ids:
                touched.update(r[0] for r in conn.execute(
                    "SELECT segment FROM doc_tokens WHERE doc_id = ? AND segment IS NOT NULL", [doc_id]))
                conn.execute("DELETE FROM doc_tokens WHERE doc_id = ?", [doc_id])
                conn.execute("DELETE FROM documents WHERE id = ?", [doc_id])
            for sid in sorted(touched):
                self.catalogue.update_tombstones(conn, sid, written)
            bump_docs_version(self.db)
        self.catalogue.collect_garbage()
        return len(ids)

    @staticmethod
    def _find(conn: sqlite3.Connection, key: int | str) -> int | None:
        """The id of the document ``key`` names: an id, a stored path, or a file path that resolves to one."""
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise InvalidDocument(f"a document is named by its id (an integer) or its path (a string), got {key!r}")
        row = None
        if isinstance(key, int) or (key.isascii() and key.isdigit()):
            if 0 <= int(key) < 2**63:  # beyond SQLite's INTEGER no document can have that id
                row = conn.execute("SELECT id FROM documents WHERE id = ?", [int(key)]).fetchone()
        if row is None:
            row = conn.execute("SELECT id FROM documents WHERE path = ?", [str(key)]).fetchone()
        if row is None and os.path.exists(str(key)):
            row = conn.execute("SELECT id FROM documents WHERE path = ?", [str(Path(key).resolve())]).fetchone()
        return row[0] if row else None

    # ----- reading -----------------------------------------------------------------------------------
    def count(self) -> tuple[int, int]:
        """(documents, bytes of text), from the index on ``n_bytes`` (the table's rows hold the texts)."""
        return self.db.execute("SELECT count(*), coalesce(sum(n_bytes), 0) FROM documents").fetchone()

    def list_all(self) -> list[dict[str, Any]]:
        """id, path, content_hash, n_bytes, added_at, metadata, and tokens per fingerprint of every document."""
        toks: dict[int, dict[str, int]] = {}
        for doc_id, fp, n in self.db.execute("SELECT doc_id, fingerprint, n_tokens FROM doc_tokens"):
            toks.setdefault(doc_id, {})[fp] = n
        out = []
        for row in self.db.execute("SELECT id, path, content_hash, n_bytes, added_at, metadata FROM documents "
                                   "ORDER BY id"):
            out.append({"id": row[0], "path": row[1], "content_hash": row[2], "n_bytes": row[3],
                        "added_at": row[4], "metadata": json.loads(row[5] or "{}"), "tokens": toks.get(row[0], {})})
        return out

    def get(self, doc_id: int) -> dict[str, Any] | None:
        row = self.db.execute("SELECT id, path, content_hash, text, metadata, n_bytes, added_at FROM documents "
                              "WHERE id = ?", [doc_id]).fetchone()
        if row is None:
            return None
        return {"id": row[0], "path": row[1], "content_hash": row[2], "text": row[3],
                "metadata": json.loads(row[4] or "{}"), "n_bytes": row[5], "added_at": row[6]}

    def page(self, limit: int, offset: int = 0, query: str | None = None) -> tuple[int, list[dict[str, Any]]]:
        """(matching documents, the ``limit`` newest from ``offset``) without their texts: a preview, the
        length, and tokens per fingerprint. ``query`` matches the path, the text or the metadata."""
        where, args = "", []
        if query:
            where, args = "WHERE path LIKE ? OR text LIKE ? OR metadata LIKE ?", [f"%{query}%"] * 3
        total = self.db.execute(f"SELECT count(*) FROM documents {where}", args).fetchone()[0]
        ids = [r[0] for r in self.db.execute(f"SELECT id FROM documents {where} ORDER BY id DESC LIMIT ? OFFSET ?",
                                             [*args, limit, offset])]
        return total, self.summaries(ids)

    def summaries(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        """The documents ``ids`` (in that order, missing ones left out) as listings show them: id, path,
        content_hash, n_bytes, added_at, metadata, num_chars, preview, tokens per fingerprint."""
        out: dict[int, dict[str, Any]] = {}
        for i in range(0, len(ids), 500):  # SQLite caps the number of ? in one statement
            part = list(ids[i:i + 500])
            marks = ",".join("?" * len(part))
            for row in self.db.execute(f"SELECT id, path, content_hash, n_bytes, added_at, metadata, length(text), "
                                       f"substr(text, 1, {PREVIEW_CHARS}) FROM documents WHERE id IN ({marks})", part):
                out[row[0]] = {"id": row[0], "path": row[1], "content_hash": row[2], "n_bytes": row[3],
                               "added_at": row[4], "metadata": json.loads(row[5] or "{}"), "num_chars": row[6],
                               "preview": row[7], "tokens": {}}
            for doc_id, fp, n in self.db.execute(f"SELECT doc_id, fingerprint, n_tokens FROM doc_tokens "
                                                 f"WHERE doc_id IN ({marks})", part):
                out[doc_id]["tokens"][fp] = n
        return [out[i] for i in ids if i in out]

    # ----- documents a tokenizer has not indexed -----------------------------------------------------
    def all_indexed(self, fingerprint: str) -> bool:
        """Whether every document has a live version in a segment of ``fingerprint``: the live sequences of
        the segments (each committed document is live in exactly one, and every other sequence is a
        tombstone) add up to the documents. Two small queries (~2 ms at 44k documents) instead of the join
        that lists the unindexed ones, which reads the whole documents table (0.15 s per reload)."""
        return self.catalogue.live_sequences(fingerprint) == self.count()[0]

    def index_missing(self, fp: str, tokenizer: Any, quiet: bool = False) -> None:
        """Index the documents that have no live segment for ``fp`` (documents added under another tokenizer,
        segments dropped because their files were missing, a database of an earlier version with token ids
        in it): from stored token ids when there are some, else from the text with ``tokenizer`` (None: such
        documents are left out, with a warning)."""
        rows = self.db.execute(
            "SELECT d.id, d.content_hash, t.ids IS NOT NULL FROM documents d LEFT JOIN doc_tokens t "
            "ON t.doc_id = d.id AND t.fingerprint = ? WHERE t.segment IS NULL ORDER BY d.id", [fp]).fetchall()
        if not rows:
            return
        need_text = [r[0] for r in rows if not r[2]]
        if need_text and tokenizer is None:
            if not getattr(self, "_warned_untokenized", False):
                self._warned_untokenized = True
                log.warning("%s: %d document(s) have no token ids for tokenizer %s; open the index with the "
                            "tokenizer itself to index them", self.where, len(need_text), fp[:12])
            rows = [r for r in rows if r[2]]
            if not rows:
                return
        if tokenizer is not None:
            if not tokenizer_known(self.db, fp):
                register_tokenizer(self.db, tokenizer, fp)
        elif not tokenizer_known(self.db, fp):
            return
        if not quiet:
            log.info("%s: indexing %d document(s) for tokenizer %s", self.where, len(rows), fp[:12])
        with self.catalogue.build_guard():
            self._index_existing(fp, tokenizer, [(r[0], r[1]) for r in rows])
        self.catalogue.collect_garbage()

    def _index_existing(self, fp: str, tokenizer: Any, docs: list[tuple[int, str]]) -> None:
        """Build segments (``flush_tokens`` at most each) for stored documents ``(id, content_hash)``,
        from their stored ids or their text; commit each, skipping documents changed meanwhile."""
        i = 0
        while i < len(docs):
            writer = SegmentWriter(self.catalogue.new_prefix(fp))
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

            def rows(conn: sqlite3.Connection, seg_ids: list[int], part=part) -> tuple[list[np.ndarray], set[int]]:
                docids = np.full(len(part), -1, dtype=np.int64)
                for k, (doc_id, h, n) in enumerate(part):
                    row = conn.execute("SELECT content_hash FROM documents WHERE id = ?", [doc_id]).fetchone()
                    seg = conn.execute("SELECT segment FROM doc_tokens WHERE doc_id = ? AND fingerprint = ?",
                                       [doc_id, fp]).fetchone()
                    if row is None or row[0] != h or (seg is not None and seg[0] is not None):
                        continue  # removed, changed or indexed by another process meanwhile
                    conn.execute("INSERT OR REPLACE INTO doc_tokens (doc_id, fingerprint, n_tokens, ids, segment) "
                                 "VALUES (?, ?, ?, NULL, ?)", [doc_id, fp, n, seg_ids[0]])
                    docids[k] = doc_id
                return [docids], set()

            self.catalogue.commit(fp, [writer], rows)


def _check(d: DocInput) -> None:
    """Refuse what the index cannot store, before anything is written."""
    if not isinstance(d, DocInput):
        raise InvalidDocument(f"expected a DocInput, got {type(d).__name__}")
    if not isinstance(d.text, str):
        raise InvalidDocument(f"a document's text must be a string, got {type(d.text).__name__}"
                              + (f" (document {d.path})" if isinstance(d.path, str) else ""))
    if d.path is not None and not isinstance(d.path, str):
        raise InvalidDocument(f"a document's source must be a string, got {type(d.path).__name__}")
    if not isinstance(d.metadata, dict):
        raise InvalidDocument(f"a document's metadata must be an object (dict), got {type(d.metadata).__name__}")
