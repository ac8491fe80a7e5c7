"""The document corpus as every front end uses it: ``SuffixSpec``'s document methods, the server's
``/v1/index`` routes and ``suffixspec index`` all go through :class:`DocumentIndex`, so they add, list,
remove and count the same way, with the same option names.

Model-free: it takes a tokenizer object (or a function that loads one, called on the first add only)
and imports neither torch nor transformers, so ``suffixspec index list`` starts in a fraction of a
second.

Where the work runs is decided here, once (:meth:`DocumentIndex._in_writer`): an add of less than
``WRITER_PROCESS_CHARS`` of text (1 MiB), and a merge of less than that much, run in this process at its
own priority, so that a small add never waits behind the scheduler; larger ones run in a writer process
at a low priority (``nice``; :mod:`index.writer`), so that generations in this process or on this
machine keep their pace. A server's index (``background_merges``) runs the merges an add makes due in a
background thread, and compacts once no write came for ``MergePolicy.idle_compact_s``.

Documents are indexed per tokenizer. The statistics single out the tokenizer this index serves (the
one given, else the one the store served or indexed for last) and list the others under
``also_indexed_for``.

Example::

    index = DocumentIndex("index.db", tokenizer=tok)
    index.add_documents(["def area(r):\\n    return 3.14159 * r * r\\n"])   # [{"id": 1, "status": "added", ...}]
    index.add_paths(["docs/"], globs=["*.md"])                             # an AddSummary
    index.list_documents(limit=20)                                         # {"data": [...], "total": 2}
    index.remove_documents([1])                                            # 1
    index.stats()["documents"]                                             # 1
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .database import busy_timeout, default_db_path, refused_write
from .documents import FLUSH_TOKENS
from .errors import InvalidDocument, ReadOnlyStore
from .files import DEFAULT_MAX_BYTES, FileCandidate, read_text, walk
from .fingerprint import BackendTokenizer
from .records import AddSummary, DocInput, ProgressFn
from .segments import MergePolicy
from .store import IndexStore
from .suffix_array_build import DEFAULT_SORT_DEPTH
from .tokenizer_table import TokenizerInfo, by_source, last_used, source_key
from .tokenizer_table import load as load_kept_tokenizer
from .writer import WRITER_NICE, WRITER_PROCESS_CHARS
from .writer import add_documents as add_in_writer
from .writer import available as writer_available
from .writer import merge as merge_in_writer

CHARS_PER_TOKEN = 4  # about this much text per token: a merge's size in the units of an add's
MARK_TIMEOUT_S = 0.5  # recording the served tokenizer waits at most this long for another writer
log = logging.getLogger("suffixspec.index")


@dataclass
class TokenizerChoice:
    """The tokenizer documents are added for, and what to remember of it in the store."""

    tokenizer: Any  # a transformers tokenizer, a BackendTokenizer, or anything index.fingerprint accepts
    name: str  # what to call it: the model name or folder the user gave
    source: str | None = None  # index.tokenizer_table.source_key of the folder it was loaded from


@dataclass
class FileSet:
    """Files found under the paths of an add, before any is read (see :meth:`DocumentIndex.find_files`)."""

    candidates: list[FileCandidate]  # every entry the walk found, skipped ones included
    max_bytes: int = DEFAULT_MAX_BYTES  # larger files are skipped
    total_bytes: int = field(init=False)  # what reading them all takes: the size of a progress bar

    def __post_init__(self) -> None:
        self.total_bytes = sum(min(c.size, self.max_bytes) for c in self.candidates)


class DocumentIndex:
    """The document corpus of one store: add texts or files, list, remove, statistics, merges.

    Args:
        db: the SQLite store (default: ``$SUFFIXSPEC_DB``, else ``~/.local/share/suffixspec/index.db``);
            opened on first use, so an add with nothing to index creates nothing.
        tokenizer: the tokenizer documents are indexed for (the served model's), or None.
        load_tokenizer: called with this index on the first add when ``tokenizer`` is None; returns a
            :class:`TokenizerChoice` (``suffixspec index add`` loads ``--model``'s tokenizer this way).
        model: the name of ``tokenizer``'s model, as the store shows it.
        background_merges: run the merges an add makes due, and the idle compaction, in a background
            thread (a server); else they wait for :meth:`merge`.
        nice: the niceness of the writer process large adds and merges run in (0: always in this process).
        own_group: start the writer process in a scheduler group of its own (a command in another
            terminal than the server it must not slow down).
        writer_chars: adds (and merges) of at least this much text run in the writer process (default
            ``WRITER_PROCESS_CHARS``, 1 MiB).
        policy, flush_tokens, sort_depth: the store's (see :class:`~index.store.IndexStore`).
    """

    def __init__(self, db: str | os.PathLike | None = None, *, tokenizer: Any = None,
                 load_tokenizer: Callable[[DocumentIndex], TokenizerChoice] | None = None,
                 model: str | None = None, background_merges: bool = False, nice: int = WRITER_NICE,
                 own_group: bool = False, writer_chars: int | None = None, policy: MergePolicy | None = None,
                 flush_tokens: int = FLUSH_TOKENS, sort_depth: int = DEFAULT_SORT_DEPTH) -> None:
        if nice < 0:
            raise ValueError(f"nice must be >= 0 (0: in this process), got {nice}")
        self.path = Path(db).expanduser() if db else default_db_path()
        self.policy = policy or MergePolicy()
        self.flush_tokens = flush_tokens
        self.sort_depth = sort_depth
        self.background_merges = background_merges
        self.nice = nice
        self.own_group = own_group
        self.writer_chars = writer_chars  # work on this much text or more goes to the writer (None: WRITER_PROCESS_CHARS)
        self._choice = TokenizerChoice(tokenizer, model or "") if tokenizer is not None else None
        self._load_tokenizer = load_tokenizer
        self._served: str | None = None  # fingerprint of the tokenizer served with this index (see serve)
        self._store: IndexStore | None = None  # the connection writes go through (opened on first use)
        self._lock = threading.RLock()  # one write at a time through it
        self._readers = threading.local()  # listings and statistics: a connection per thread, never waiting
        self._reader_stores: list[IndexStore] = []  # every thread's, to close them
        self._readers_lock = threading.Lock()  # guards that list (never held during a write)
        self._merger: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False

    # ----- connections --------------------------------------------------------------------------------
    @property
    def write_lock(self) -> threading.RLock:
        """Held by every write through this index: hold it to write to :attr:`store` directly."""
        return self._lock

    @property
    def store(self) -> IndexStore:
        """The store writes go through (raises :class:`~index.errors.UnusableDatabase` for a bad file)."""
        with self._lock:
            if self._store is None:
                self._store = self._open()
            return self._store

    def _open(self) -> IndexStore:
        return IndexStore(self.path, self.sort_depth, policy=self.policy, flush_tokens=self.flush_tokens)

    def _reader(self) -> IndexStore:
        """This thread's read connection: it reads a WAL snapshot and never waits for a writer (an add holds
        the write connection while it tokenizes and sorts)."""
        store = getattr(self._readers, "store", None)
        if store is None:
            store = self._readers.store = self._open()
            with self._readers_lock:
                self._reader_stores.append(store)
        return store

    def close(self) -> None:
        """Stop the background merges (at a safe point: the current merge is dropped) and close. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            merger = self._merger
        if merger is not None:
            merger.join()
        with self._readers_lock:
            stores = [self._store, *self._reader_stores]
        for s in stores:
            if s is not None:
                s.close()

    def __enter__(self) -> DocumentIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- tokenizers ----------------------------------------------------------------------------------
    def tokenizer(self) -> TokenizerChoice:
        """The tokenizer documents are added for (loaded now if it is loaded on demand)."""
        if self._choice is None:
            if self._load_tokenizer is None:  # how it was built, not a document: a programming error
                raise TypeError("this DocumentIndex has no tokenizer to index documents for: give it tokenizer= "
                                "or load_tokenizer=")
            self._choice = self._load_tokenizer(self)
        return self._choice

    def last_tokenizer(self) -> TokenizerInfo | None:
        """The tokenizer the store served or indexed for last (None: the store knows none)."""
        return last_used(self._reader().db)

    def stored_tokenizer(self, fingerprint: str | None = None, source: str | None = None) -> BackendTokenizer | None:
        """A tokenizer the store keeps, by fingerprint or by what it was loaded from (a
        :func:`~index.tokenizer_table.source_key`): loads without transformers. None: not kept."""
        db = self._reader().db
        fp = fingerprint or (by_source(db, source) if source else None)
        return load_kept_tokenizer(db, fp) if fp else None

    def serve(self, tokenizer: Any, name: str | None = None, fingerprint: str | None = None) -> None:
        """Make ``tokenizer`` (a served model's) the one listings and statistics are for, and record it in
        the store as the one last served, so that ``index add`` defaults to it (``fingerprint``: its
        fingerprint when already known: hashing a large vocabulary takes up to a second). Recording is
        best effort: a store that refuses writes (read-only, busy for long) is left as it is."""
        store = self.store
        self._served = fingerprint or store.fingerprint(tokenizer)
        source = source_key(getattr(tokenizer, "name_or_path", "") or "")
        try:
            with self._lock, busy_timeout(store.db, MARK_TIMEOUT_S):
                store.register_tokenizer(tokenizer, model=name, source=source, used=True, fingerprint=self._served)
        except sqlite3.Error as e:
            log.info("%s: the served tokenizer is not recorded (%s)", self.path, e)

    # ----- adding --------------------------------------------------------------------------------------
    def add_documents(self, documents: Iterable[str | Mapping[str, Any] | DocInput], *,
                      progress: ProgressFn | None = None, status: Callable[[str], None] | None = None) -> list[dict]:
        """Add texts, ``{"text", "source", "metadata"}`` mappings or :class:`DocInput`\\ s.

        A document's identity is its ``source`` (a path or name) or, without one, its content hash:
        re-adding the same text changes nothing, a new text under the same source replaces the old.
        Returns one record per document (``id``, ``status`` = added / updated / unchanged, sizes); raises
        :class:`~index.errors.InvalidDocument` for a document without text (nothing is added then).
        """
        docs = [_as_doc(d, i) for i, d in enumerate(documents)]
        summary = self._add(iter(docs), sum(len(d.text) for d in docs), progress, status)
        return self.records(summary, [d.key() for d in docs])

    def find_files(self, paths: Sequence[str | os.PathLike], globs: Sequence[str] = (), follow_links: bool = False,
                   max_bytes: int | None = None, exclude: Sequence[str] = ()) -> FileSet:
        """The files under ``paths`` (directories walked, names filtered by ``globs`` such as ``"*.py"``,
        directories and files whose name matches one of ``exclude`` such as ``"tests"`` left out), not read
        yet. A path that does not exist raises FileNotFoundError."""
        return FileSet(list(walk(paths, tuple(globs), follow_links=follow_links, exclude=tuple(exclude))),
                       max_bytes or DEFAULT_MAX_BYTES)

    def add_paths(self, paths: Sequence[str | os.PathLike], globs: Sequence[str] = (), follow_links: bool = False,
                  max_bytes: int | None = None, exclude: Sequence[str] = (), *, progress: ProgressFn | None = None,
                  status: Callable[[str], None] | None = None,
                  on_skip: Callable[[str, str, str], None] | None = None) -> AddSummary:
        """Add text files (:meth:`find_files`, then :meth:`add_files`)."""
        return self.add_files(self.find_files(paths, globs, follow_links, max_bytes, exclude), progress=progress,
                              status=status, on_skip=on_skip)

    def add_files(self, files: FileSet, *, progress: ProgressFn | None = None,
                  status: Callable[[str], None] | None = None,
                  on_skip: Callable[[str, str, str], None] | None = None) -> AddSummary:
        """Read and add ``files`` as they are streamed into the index (memory stays bounded whatever their
        size). Skips what cannot be drafted from (binary, empty, too large, FIFOs and devices, dangling or
        looping symlinks, symlinks out of the paths): each is passed to ``on_skip(path, kind, reason)``
        and counted in ``AddSummary.skipped_files``. Nothing is opened or loaded (store, tokenizer) before
        the first file to index is read: with none, the summary only counts the skipped files."""
        skipped: list[tuple[str, str, str]] = []

        def read() -> Iterator[DocInput]:
            for cand in files.candidates:
                ft = read_text(cand, files.max_bytes)
                if ft.text is None:
                    skipped.append((str(ft.path), ft.skip_kind or "unreadable", ft.skip_reason or ""))
                    if on_skip:
                        on_skip(*skipped[-1])
                    if progress:
                        progress(0, 0, min(cand.size, files.max_bytes))
                    continue
                yield DocInput(ft.text, str(ft.path), {"size": cand.size})

        docs = read()
        first = next(docs, None)
        if first is None:
            summary = AddSummary()
        else:
            summary = self._add(_chain(first, docs), files.total_bytes, progress, status)
        summary.skipped, summary.skipped_files = len(skipped), skipped
        return summary

    def _add(self, docs: Iterator[DocInput], size_chars: int, progress: ProgressFn | None,
             status: Callable[[str], None] | None) -> AddSummary:
        with self._lock, self._writing():
            choice = self.tokenizer()
            store = self.store
            if self._in_writer(size_chars):
                # tokenizing and sorting take the cores for seconds: a child at a low priority does it, so
                # that generations keep their pace (suffixspec/index/writer.py)
                summary = add_in_writer(self.path, docs, choice.tokenizer, progress=progress, status=status,
                                               nice=self.nice, own_group=self.own_group, **self._store_options())
            else:
                summary = store.add_documents(docs, choice.tokenizer, progress=progress, status=status)
            store.register_tokenizer(choice.tokenizer, model=choice.name or None, source=choice.source, used=True)
        self._kick_merges()
        return summary

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A write: the database refusing it (read-only file or folder, full disk) is a ReadOnlyStore."""
        try:
            yield
        except sqlite3.OperationalError as e:
            if not refused_write(e):
                raise
            raise ReadOnlyStore(f"the index database {self.path} refused a write ({e}); make the file and its folder "
                                "writable, free disk space, or pass --db / db= with another file") from None

    def _in_writer(self, work_chars: int) -> bool:
        """Whether work on about ``work_chars`` of text runs in a writer process (else in this one): the
        one place this is decided (see the module docstring)."""
        limit = WRITER_PROCESS_CHARS if self.writer_chars is None else self.writer_chars
        return self.nice > 0 and work_chars >= limit and writer_available()

    def _store_options(self) -> dict[str, Any]:
        return {"policy": self.policy, "flush_tokens": self.flush_tokens, "sort_depth": self.sort_depth}

    # ----- removing, listing, statistics ----------------------------------------------------------------
    def remove_documents(self, keys: Sequence[int | str]) -> int:
        """Remove documents by id or source path; returns how many were removed (unknown keys are not
        an error: they are already gone)."""
        with self._lock, self._writing():
            n = self.store.remove(list(keys))
        self._kick_merges()
        return n

    def list_documents(self, limit: int = 20, offset: int = 0, query: str | None = None) -> dict[str, Any]:
        """``{"data": [records], "total": N}``, newest first; ``query`` filters by source, text or metadata."""
        total, rows = self._reader().documents.page(limit, offset, query)
        fp = self._shown_fingerprint()
        return {"data": [_record(r, fp) for r in rows], "total": total}

    def records(self, summary: AddSummary, keys: Sequence[str] | None = None) -> list[dict]:
        """One record per document key of an add (default: every document it settled), with its status."""
        keys = list(summary.outcomes) if keys is None else keys
        outcomes = [summary.outcomes[k] for k in keys if k in summary.outcomes]
        rows = {r["id"]: r for r in self._reader().documents.summaries(list(dict.fromkeys(i for i, _ in outcomes)))}
        fp = self._shown_fingerprint()
        return [{**_record(rows[i], fp), "status": st} for i, st in outcomes if i in rows]

    def stats(self) -> dict[str, Any]:
        """Documents (each counted once), sizes on disk, and the figures of the tokenizer this index serves
        (segments, pending merges, whether its arrays are current); the other tokenizers the store indexed
        for under ``also_indexed_for`` (see :meth:`IndexStore.stats`)."""
        return self._reader().stats(self._shown_fingerprint())

    def _shown_fingerprint(self) -> str | None:
        """The tokenizer listings and statistics are for: the one served, the one given, else the store's
        last used."""
        if self._served is not None:
            return self._served
        if self._choice is not None:
            return self._reader().fingerprint(self._choice.tokenizer)
        last = self.last_tokenizer()
        return last.fingerprint if last is not None else None

    # ----- merges --------------------------------------------------------------------------------------
    def merge(self, compact: bool = True, progress: Callable[[int], None] | None = None,
              status: Callable[[str], None] | None = None) -> int:
        """Run the pending merges, then (``compact``) the compaction; returns how many were done."""
        with self._lock, self._writing():
            return self._run_merges(self.store, compact, progress, status)

    def pending_work(self, compact: bool = True) -> bool:
        """Whether :meth:`merge` has anything to do."""
        store = self._reader()
        return bool(store.pending_merges() or (compact and store.compaction()))

    def _run_merges(self, store: IndexStore, compact: bool, progress: Callable[[int], None] | None = None,
                    status: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> int:
        if self._in_writer(store.merges.pending_tokens(compact) * CHARS_PER_TOKEN):
            return merge_in_writer(store.path, compact=compact, progress=progress, status=status, stop=stop,
                                nice=self.nice, own_group=self.own_group, **self._store_options())
        done = store.merge_pending(progress, status, stop)
        if compact and not (stop is not None and stop.is_set()):
            done += store.compact(progress, status, stop)
        return done

    def _kick_merges(self) -> None:
        """Start the background merge thread when merges are due (``background_merges``)."""
        if not self.background_merges or self._closed or (self._merger is not None and self._merger.is_alive()):
            return
        store = self._reader()
        if not store.pending_merges() and not (self.policy.idle_compact_s is not None and store.compaction()):
            return
        self._merger = threading.Thread(target=self._merge_in_background, name="suffixspec-merge", daemon=True)
        self._merger.start()

    def _merge_in_background(self) -> None:
        try:
            with self._open() as other:
                if other.pending_merges():
                    self._run_merges(other, False, stop=self._stop)
                idle = self.policy.idle_compact_s
                # a read-mostly corpus: once no write came for ``idle`` seconds, compact (readers keep
                # reading the old segments until the new ones commit; a write meanwhile restarts the wait)
                while idle is not None and other.compaction():
                    version = other.docs_version()
                    if self._stop.wait(idle):
                        return
                    if other.docs_version() == version:
                        self._run_merges(other, True, stop=self._stop)
                        return
                    if other.pending_merges():
                        self._run_merges(other, False, stop=self._stop)
        except Exception as e:  # never take the process down; the merges are planned again after the next write
            log.warning("%s: background merge failed: %s", self.path, e)


def _chain(first: DocInput, rest: Iterator[DocInput]) -> Iterator[DocInput]:
    yield first
    yield from rest


def _as_doc(d: str | Mapping[str, Any] | DocInput, i: int) -> DocInput:
    """A text, a ``{"text", "source", "metadata"}`` mapping or a DocInput as a DocInput, checked."""
    if isinstance(d, DocInput):
        return d
    if isinstance(d, str):
        d = {"text": d}
    if not isinstance(d, Mapping):
        raise InvalidDocument(f"document {i} must be a string or a {{\"text\", \"source\", \"metadata\"}} mapping, "
                              f"got {type(d).__name__}")
    text, source, meta = d.get("text"), d.get("source"), d.get("metadata")
    if not isinstance(text, str):
        raise InvalidDocument(f"document {i} has no 'text' string" + (f" (got {type(text).__name__})" if text is not None
                                                                      else ""))
    if not text:
        raise InvalidDocument(f"document {i} has an empty 'text'")
    if source is not None and not isinstance(source, str):
        raise InvalidDocument(f"document {i}: 'source' must be a string, got {type(source).__name__}")
    if meta is not None and not isinstance(meta, Mapping):
        raise InvalidDocument(f"document {i}: 'metadata' must be an object, got {type(meta).__name__}")
    return DocInput(text, source or None, dict(meta or {}))


def _record(row: dict[str, Any], fingerprint: str | None) -> dict[str, Any]:
    """A document as listings and adds show it. ``num_tokens``: its tokens for ``fingerprint`` (None: not
    indexed for it yet); ``tokens``: per tokenizer fingerprint."""
    path, meta = row["path"], row["metadata"]
    text_only = path.startswith("text:")
    return {"id": row["id"], "object": "document", "source": None if text_only else path,
            "name": meta.get("name") or ("" if text_only else Path(path).name),
            "num_tokens": row["tokens"].get(fingerprint) if fingerprint else None, "tokens": row["tokens"],
            "num_chars": row["num_chars"], "n_bytes": row["n_bytes"], "content_hash": row["content_hash"],
            "added_at": row["added_at"], "metadata": meta, "preview": row["preview"]}
