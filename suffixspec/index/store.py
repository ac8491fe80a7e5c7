"""The index store: one SQLite database (documents, tokenizers, output history) and, beside it, the
document index in segments per tokenizer. :class:`IndexStore` opens them and puts the parts together:

- :mod:`index.database`: the file, its schema, transactions, the version readers poll;
- :mod:`index.tokenizer_table`: the tokenizers documents are indexed for;
- :mod:`index.catalogue`: the segments, their files and tombstones, commits, garbage collection;
- :mod:`index.documents`: adding, replacing, removing and listing documents;
- :mod:`index.maintenance`: merges and compaction;
- :mod:`index.history`: the finished outputs (``history`` table).

Readers never wait: they read the segment list in one WAL snapshot and memory-map immutable files; a
new segment becomes visible when its transaction commits. Writers (adds, removes, merges, possibly in
several processes) commit in short transactions. Where writes run (in this process or a writer process
at a low priority) and when merges run is :class:`~index.document_index.DocumentIndex`'s choice.

A database whose arrays are missing (copied without its ``.arrays`` folder) or that an earlier version
wrote is repaired on load: the missing segments are rebuilt from the token ids still in the database,
or from the text with the tokenizer at hand, with a warning.

Example::

    with IndexStore("index.db") as store:
        store.add_documents([DocInput("def f(x):\\n    return x\\n", "f.py")], tokenizer)
        index = store.document_index(tokenizer)   # a SegmentSet: index.speculate(context, params)
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .catalogue import SegmentCatalogue
from .database import bump_docs_version, connect, default_db_path, docs_version, write_txn
from .documents import FLUSH_TOKENS, DocumentTable
from .errors import ReadOnlyStore, StoreError
from .fingerprint import FingerprintCache
from .history import HistoryTable
from .maintenance import Merges
from .records import AddSummary, DocInput, ProgressFn
from .segments import MergePolicy, SegmentInfo, SegmentSet
from .suffix_array_build import DEFAULT_SORT_DEPTH
from .tokenizer_table import TokenizerInfo, infos, known, register

__all__ = ["AddSummary", "DocInput", "IndexStore", "StoreError"]
log = logging.getLogger("suffixspec.index")


class IndexStore:
    """Documents, their segmented suffix index per tokenizer fingerprint, and the output history."""

    def __init__(self, path: str | os.PathLike | None = None, sort_depth: int = DEFAULT_SORT_DEPTH, *,
                 readonly: bool = False, policy: MergePolicy | None = None, flush_tokens: int = FLUSH_TOKENS) -> None:
        self.path = Path(path).expanduser() if path else default_db_path()
        self.arrays_dir = Path(str(self.path) + ".arrays")
        self.sort_depth = sort_depth
        self.readonly = readonly  # open without writing anything (a worker of another program, a copy)
        self.policy = policy or MergePolicy()
        self.flush_tokens = flush_tokens
        self.db = connect(self.path, readonly)
        self.catalogue = SegmentCatalogue(self.db, self.arrays_dir, sort_depth)
        self.documents = DocumentTable(self.db, self.catalogue, flush_tokens, where=str(self.path))
        self.merges = Merges(self.db, self.catalogue, self.policy)
        self.history = HistoryTable(self.db)
        self.fingerprint = FingerprintCache()  # tokenizer -> fingerprint, remembered per tokenizer object

    def close(self) -> None:
        self.db.conn.close()

    def __enter__(self) -> IndexStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- tokenizers --------------------------------------------------------------------------------
    def docs_version(self) -> int:
        return docs_version(self.db)

    def fingerprints(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT fingerprint FROM tokenizers ORDER BY added_at")]

    def register_tokenizer(self, tokenizer: Any, *, model: str | None = None, source: str | None = None,
                           used: bool = False, fingerprint: str | None = None) -> str:
        """``tokenizer``'s fingerprint (``fingerprint`` when the caller knows it), recorded in the store (see
        :func:`index.tokenizer_table.register`): ``used`` marks it as the tokenizer served or indexed for
        last. Writes only what changes."""
        fp = fingerprint or self.fingerprint(tokenizer)
        if self.readonly or (known(self.db, fp) and not (model or source or used)):
            return fp  # known: no write, so no wait behind another writer
        register(self.db, tokenizer, fp, model=model, source=source, used=used)
        return fp

    # ----- documents ---------------------------------------------------------------------------------
    def add_documents(self, docs: Iterable[DocInput], tokenizer: Any, progress: ProgressFn | None = None,
                      status: Callable[[str], None] | None = None) -> AddSummary:
        """Add or replace documents (see :meth:`index.documents.DocumentTable.add`)."""
        self._writable()
        fp = self.register_tokenizer(tokenizer)
        return self.documents.add(docs, tokenizer, fp, progress, status)

    def remove(self, keys: Sequence[int | str]) -> int:
        """Remove documents by id or exact path; returns how many were removed."""
        self._writable()
        return self.documents.remove(keys)

    def list_documents(self) -> list[dict[str, Any]]:
        return self.documents.list_all()

    def get_document(self, doc_id: int) -> dict[str, Any] | None:
        return self.documents.get(doc_id)

    def _writable(self) -> None:
        if self.readonly:
            raise ReadOnlyStore(f"{self.path} was opened read-only")

    # ----- the document index ------------------------------------------------------------------------
    def segment_infos(self, fingerprint: str) -> list[SegmentInfo]:
        return self.catalogue.infos(fingerprint)

    def referenced_files(self) -> set[str]:
        return self.catalogue.referenced_files()

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
            fp = self.fingerprint(tokenizer)
        if not self.readonly:
            self._repair(fp, tokenizer)
        for _ in range(5):  # a merge may replace the files between reading the list and opening them
            infos = self.catalogue.infos(fp)
            if not infos:
                return None
            try:
                return self.catalogue.segment_set(infos)
            except FileNotFoundError:
                self.catalogue.forget_mappings()
                if self.readonly:
                    log.warning("%s: segment files are missing from %s; documents are served without them",
                                self.path, self.arrays_dir)
                    return None
                self._repair(fp, tokenizer)
        raise StoreError(f"could not open the arrays of {self.path}: their files keep changing; is a writer stuck?")

    def _repair(self, fp: str, tokenizer: Any) -> None:
        """Index the documents that have no live segment for ``fp``: a copy without its arrays folder, a
        database of an earlier version (token ids in the database), documents added under another tokenizer."""
        missing = self.catalogue.missing(fp)
        if missing:
            log.warning("%s: %d segment(s) of the document index are missing from %s (copied without it?); "
                        "rebuilding them from the database", self.path, len(missing), self.arrays_dir)
            with write_txn(self.db):
                for info in missing:
                    self.db.execute("UPDATE doc_tokens SET segment = NULL WHERE segment = ?", [info.id])
                    self.db.execute("DELETE FROM segments WHERE id = ?", [info.id])
                bump_docs_version(self.db)
        elif self.documents.all_indexed(fp):
            return
        self.documents.index_missing(fp, tokenizer, quiet=bool(missing))

    # ----- merges -------------------------------------------------------------------------------------
    def pending_merges(self, fingerprint: str | None = None) -> dict[str, list[list[int]]]:
        return self.merges.pending(fingerprint)

    def compaction(self, fingerprint: str | None = None) -> dict[str, list[int]]:
        return self.merges.compaction(fingerprint)

    def merge_pending(self, progress: Callable[[int], None] | None = None,
                      status: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> int:
        self._writable()
        return self.merges.merge_pending(progress, status, stop)

    def compact(self, progress: Callable[[int], None] | None = None,
                status: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> int:
        self._writable()
        return self.merges.compact(progress, status, stop)

    # ----- statistics ---------------------------------------------------------------------------------
    def stats(self, fingerprint: str | None = None) -> dict[str, Any]:
        """Documents (each counted once), sizes on disk, and per tokenizer its tokens, segments, pending
        merges, whether its arrays are current and the memory they map.

        ``fingerprint``: the tokenizer the top-level figures (``tokens``, ``segments``, ``pending_merges``,
        ``memory_estimate_bytes``) are for, its entry also under ``tokenizer`` (default: the one served or
        indexed for last); the others are listed under ``also_indexed_for``.
        """
        n_docs, n_bytes = self.documents.count()
        pending, compaction = self.merges.pending(), self.merges.compaction()
        known = infos(self.db)
        if fingerprint is None and known:
            fingerprint = known[0].fingerprint
        per_fp = {info.fingerprint: self._tokenizer_stats(info, n_docs, pending, compaction) for info in known}
        if fingerprint is not None and fingerprint not in per_fp:  # served, but nothing indexed for it yet
            per_fp[fingerprint] = self._tokenizer_stats(TokenizerInfo(fingerprint, "", None, None, False),
                                                        n_docs, pending, compaction)
        current = per_fp.get(fingerprint) if fingerprint else None
        disk = sum(p.stat().st_size for p in [self.path, Path(str(self.path) + "-wal"), Path(str(self.path) + "-shm")]
                   if p.exists())
        arrays = self.catalogue.bytes_on_disk()
        return {"db": str(self.path), "documents": n_docs, "document_bytes": n_bytes,
                "fingerprint": fingerprint,
                "tokenizer": current,
                "tokens": current["document_tokens"] if current else 0,
                "segments": len(current["segments"]) if current else 0,
                "pending_merges": len(current["pending_merges"]) if current else 0,
                "memory_estimate_bytes": current["memory_estimate_bytes"] if current else 0,
                "also_indexed_for": [{"fingerprint": fp, "tokenizer": v["tokenizer"], "model": v["model"],
                                      "document_tokens": v["document_tokens"],
                                      "documents_tokenized": v["documents_tokenized"]}
                                     for fp, v in per_fp.items() if fp != fingerprint],
                "bytes_on_disk": disk + arrays, "db_bytes": disk, "arrays_bytes": arrays,
                "tokenizers": per_fp}

    def _tokenizer_stats(self, info: TokenizerInfo, n_docs: int, pending: dict, compaction: dict
                         ) -> dict[str, Any]:
        fp = info.fingerprint
        n_tok, n_tok_docs, n_unindexed = self.db.execute(
            "SELECT coalesce(sum(n_tokens), 0), count(*), coalesce(sum(segment IS NULL), 0) FROM doc_tokens "
            "WHERE fingerprint = ?", [fp]).fetchone()
        h_n, h_tok = self.history.counts(fp)
        segs = self.catalogue.infos(fp)
        mapped = sum((s.width + 4) * (s.tokens + s.sequences) for s in segs)
        return {"fingerprint": fp, "tokenizer": info.name, "model": info.model, "used_at": info.used_at,
                "document_tokens": n_tok, "documents_tokenized": n_tok_docs - n_unindexed,
                "history_outputs": h_n, "history_tokens": h_tok,
                "arrays_current": n_unindexed == 0 and n_tok_docs - n_unindexed == n_docs,
                "segments": [{"id": s.id, "tokens": s.tokens, "live_tokens": s.live_tokens,
                              "documents": s.sequences - s.dead_sequences, "deleted_documents": s.dead_sequences,
                              "bytes_per_token": s.width + 4} for s in segs],
                "pending_merges": [{"segments": g} for g in pending.get(fp, [])],
                "compaction": compaction.get(fp, []),
                # tokens + suffix array, mapped; the token history lives in an incremental index
                # of ~12 bytes per token plus dict entries
                "memory_estimate_bytes": mapped + 16 * h_tok}
