"""The tokenizers a store indexes documents for: their fingerprint and name, which one was served or
used last, and, for fast tokenizers, the tokenizer itself (its serialized backend).

Documents are indexed per tokenizer (token ids differ between vocabularies). A server records the
tokenizer it serves (:func:`mark_used`), ``index add`` the one it indexed for; so ``index add`` without a
``--model`` indexes for the tokenizer last served or used, loaded from here without ``transformers``
(:func:`load`), and the statistics single it out. Example: a server of SmolLM2 started on the store ->
``last_used(db) == fp`` and ``load(db, fp)`` is a :class:`~index.fingerprint.BackendTokenizer` that
gives the ids SmolLM2's tokenizer gives.

``source`` ties a row to what the tokenizer was loaded from (a folder and its files' sizes and times,
see :func:`source_key`), so naming the same model folder again finds it here too.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

from .database import has_column
from .fingerprint import BackendTokenizer, backend_only, tokenizer_name

# the files transformers reads a tokenizer from: a change to any of them may change the ids
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt")


@dataclass
class TokenizerInfo:
    """One row of the ``tokenizers`` table."""

    fingerprint: str  # tokenizer_fingerprint: the key of its token ids and segments
    name: str  # the tokenizer's name_or_path (the folder or hub id it was loaded from)
    model: str | None  # the model it was served or added for, as the user named it (None: not recorded)
    used_at: float | None  # when it was last served or indexed for (None: never recorded)
    loadable: bool  # its serialized backend is stored: load() rebuilds it without transformers

    @property
    def label(self) -> str:
        """What to call it: the model's name when known, else the tokenizer's."""
        return self.model or self.name


def source_key(folder: str | os.PathLike) -> str | None:
    """What a tokenizer loaded from ``folder`` is made of: the folder, its tokenizer files' sizes and
    modification times, and the ``transformers`` version that reads them (None: not a local folder).
    Cheap (a few ``stat`` calls): no file is read."""
    p = Path(folder).expanduser()
    if not p.is_dir():
        return None
    try:
        from importlib.metadata import version

        reader = version("transformers")
    except Exception:  # transformers not installed: the key still tells folders apart
        reader = "?"
    files = []
    for name in _TOKENIZER_FILES:
        try:
            st = (p / name).stat()
        except OSError:
            continue
        files.append([name, st.st_size, st.st_mtime_ns])
    if not files:
        return None
    return json.dumps({"folder": str(p.resolve()), "files": files, "transformers": reader})


def register(db: sqlite_utils.Database, tokenizer: Any, fingerprint: str, *, model: str | None = None,
             source: str | None = None, used: bool = False) -> None:
    """Record ``tokenizer`` (inside or outside a transaction): its row is created once; ``model`` (the model
    it serves, as the user named it) and ``source`` update it; ``used`` marks it as the one served or
    indexed for last. Its serialized backend is stored the first time a row is written for a fast
    tokenizer (a few MB, once)."""
    now = time.time()
    row = db.execute("SELECT backend IS NOT NULL, model, source, used_at IS NOT NULL AND used_at = "
                     "(SELECT max(used_at) FROM tokenizers) FROM tokenizers WHERE fingerprint = ?",
                     [fingerprint]).fetchone()
    if row is None:
        backend = backend_only(tokenizer)
        db.execute("INSERT OR IGNORE INTO tokenizers (fingerprint, name, added_at, model, used_at, source, backend) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?)",
                   [fingerprint, tokenizer_name(tokenizer), now, model, now if used else None, source,
                    backend.to_json() if backend is not None else None])
        return
    has_backend, old_model, old_source, is_last = row
    sets, args = [], []
    if model and model != old_model:
        sets.append("model = ?")
        args.append(model)
    if source and source != old_source:
        sets.append("source = ?")
        args.append(source)
    if used and not is_last:  # already the last used: no write (each is a transaction, a sync to disk)
        sets.append("used_at = ?")
        args.append(now)
    if not has_backend:
        backend = backend_only(tokenizer)
        if backend is not None:
            sets.append("backend = ?")
            args.append(backend.to_json())
    if sets:
        db.execute(f"UPDATE tokenizers SET {', '.join(sets)} WHERE fingerprint = ?", [*args, fingerprint])


def known(db: sqlite_utils.Database, fingerprint: str) -> bool:
    return db.execute("SELECT 1 FROM tokenizers WHERE fingerprint = ?", [fingerprint]).fetchone() is not None


def infos(db: sqlite_utils.Database) -> list[TokenizerInfo]:
    """Every tokenizer the store knows, the last used first (then in the order they were added)."""
    if "tokenizers" not in db.table_names():
        return []
    if not has_column(db, "tokenizers", "used_at"):  # a read-only database of an earlier version
        return [TokenizerInfo(fp, name, None, None, False)
                for fp, name in db.execute("SELECT fingerprint, name FROM tokenizers ORDER BY added_at")]
    return [TokenizerInfo(fp, name, model, used, bool(loadable)) for fp, name, model, used, loadable in db.execute(
        "SELECT fingerprint, name, model, used_at, backend IS NOT NULL FROM tokenizers "
        "ORDER BY used_at IS NULL, used_at DESC, added_at")]


def last_used(db: sqlite_utils.Database) -> TokenizerInfo | None:
    """The tokenizer served or indexed for last (else the first one added; None: the store knows none)."""
    rows = infos(db)
    return rows[0] if rows else None


def by_source(db: sqlite_utils.Database, source: str) -> str | None:
    """The fingerprint of the tokenizer loaded from ``source`` (a :func:`source_key`), if one was."""
    if not has_column(db, "tokenizers", "source"):
        return None
    row = db.execute("SELECT fingerprint FROM tokenizers WHERE source = ? AND backend IS NOT NULL "
                     "ORDER BY used_at DESC", [source]).fetchone()
    return row[0] if row else None


def load(db: sqlite_utils.Database, fingerprint: str) -> BackendTokenizer | None:
    """The stored tokenizer of ``fingerprint`` (None: not stored, e.g. a slow tokenizer)."""
    if not has_column(db, "tokenizers", "backend"):
        return None
    row = db.execute("SELECT backend, name FROM tokenizers WHERE fingerprint = ?", [fingerprint]).fetchone()
    if row is None or row[0] is None:
        return None
    return BackendTokenizer.from_json(row[0], fingerprint, row[1])
