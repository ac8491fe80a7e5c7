"""The document index's own exceptions: what went wrong, said so a caller can act on it.

Each carries a message written for the person who reads it (what happened, what to do). Callers answer
them by type: the HTTP server maps them to statuses (``suffixspec.server.errors``), the CLI prints the
message as one ``Error:`` line. Example: the writer process is killed while adding documents ->
``WriterDied("the index writer process exited (killed by SIGKILL) before finishing; the index keeps
what it committed before: retry the add ...")`` -> HTTP 503 with that message.
"""

from __future__ import annotations


class StoreError(RuntimeError):
    """The index store cannot do what was asked (the base of the store's failures)."""


class UnusableDatabase(StoreError):
    """The database file cannot be used as a suffixspec index (not SQLite, corrupt, another program's)."""


class ReadOnlyStore(StoreError):
    """A write to a store opened read-only, or to a database file that refuses writes (permissions, full disk)."""


class WriterDied(StoreError):
    """The writer process died before answering (killed, out of memory): the index keeps its previous state."""


class NoDocumentStore(StoreError):
    """Documents were asked of an object that runs without a store (``SuffixSpec(db=False)``)."""


class InvalidDocument(ValueError):
    """A document the index cannot take (no text, text that is not a string, metadata that is not an object)."""
