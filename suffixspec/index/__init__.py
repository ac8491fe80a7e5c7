"""Token-sequence suffix index and its SQLite store. numpy and sqlite-utils only: no torch, no flask.

Lookups:

- :mod:`suffixspec.index.suffix_array`: static suffix array over token sequences (16- or 32-bit ids, tombstones),
  built with libdivsufsort, memory-mapped; its token layout and construction in
  :mod:`~suffixspec.index.suffix_array_build`, its longest-match search in :mod:`~suffixspec.index.suffix_array_search`.
- :mod:`suffixspec.index.segments`: the document index in segments (fresh segment per add, merges), looked up as one.
- :mod:`suffixspec.index.incremental`: O(1)-append index for growing sources (a request, the output history).
- :mod:`suffixspec.index.speculate`: path / tree speculation from a match (SuffixDecoding's rules).
- :mod:`suffixspec.index.history`: the output history with a token budget (and its table).

The store (one job per module):

- :mod:`suffixspec.index.document_index`: :class:`DocumentIndex`, the corpus as SuffixSpec, the server and
  ``suffixspec index`` use it (add, list, remove, stats, merges; where the work runs).
- :mod:`suffixspec.index.store`: :class:`IndexStore`, the database and the arrays beside it, put together.
- :mod:`suffixspec.index.database`, :mod:`~suffixspec.index.tokenizer_table`, :mod:`~suffixspec.index.catalogue`,
  :mod:`~suffixspec.index.documents`, :mod:`~suffixspec.index.maintenance`: its schema and transactions, the
  tokenizers, the segment files and tombstones, the documents, the merges.
- :mod:`suffixspec.index.writer` / :mod:`~suffixspec.index.writer_child`: large adds and merges in a writer
  process at a low CPU priority.
- :mod:`suffixspec.index.records`, :mod:`~suffixspec.index.errors`, :mod:`~suffixspec.index.fingerprint`,
  :mod:`~suffixspec.index.files`: documents in and summaries out, the exceptions, tokenizers, files to add.
"""

from .document_index import DocumentIndex
from .errors import (
           InvalidDocument,
           NoDocumentStore,
           ReadOnlyStore,
           StoreError,
           UnusableDatabase,
           WriterDied,
)
from .incremental import IncrementalIndex
from .speculate import SpecParams, SpecResult
from .suffix_array import SuffixArray
from .suffix_array_build import SEP

__all__ = ["SEP", "DocumentIndex", "IncrementalIndex", "InvalidDocument", "NoDocumentStore", "ReadOnlyStore",
           "SpecParams", "SpecResult", "StoreError", "SuffixArray", "UnusableDatabase", "WriterDied"]
