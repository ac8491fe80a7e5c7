"""What goes into the document index and what an add reports: :class:`DocInput`, :class:`AddSummary`.

A document's identity is its key: its source path, or ``text:<hash prefix>`` for a text without one, so
re-adding the same text changes nothing and a new text under the same path replaces the old one.
Example: ``DocInput("x = 1\\n").key() == "text:" + content_hash("x = 1\\n")[:16]``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ProgressFn = Callable[[int, int, int], None]  # (documents, tokens, bytes) done since the last call

ADDED, UPDATED, UNCHANGED = "added", "updated", "unchanged"  # what an add did to one document


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def text_bytes(text: str) -> int:
    """UTF-8 size of ``text`` (lone surrogates counted as 3 bytes each, as they are stored)."""
    return len(text.encode("utf-8", "surrogatepass"))


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
    skipped: int = 0  # files not indexed (binary, empty, too large, unreadable)
    tokens: int = 0  # tokens of the added and updated documents
    ids: list[int] = field(default_factory=list)  # document ids added or updated
    # document key -> (document id, ADDED / UPDATED / UNCHANGED), in the order the add settled them
    outcomes: dict[str, tuple[int, str]] = field(default_factory=dict)
    # files not indexed: (path, kind such as "binary" or "empty", the reason in words)
    skipped_files: list[tuple[str, str, str]] = field(default_factory=list)

    def settle(self, key: str, doc_id: int, status: str) -> None:
        """Record what became of document ``key``; a key added earlier in this add stays "added"."""
        if self.outcomes.get(key, (0, ""))[1] != ADDED:
            self.outcomes[key] = (doc_id, status)

    def to_dict(self) -> dict[str, Any]:
        return {"added": self.added, "updated": self.updated, "unchanged": self.unchanged,
                "skipped": self.skipped, "tokens": self.tokens, "ids": self.ids}
