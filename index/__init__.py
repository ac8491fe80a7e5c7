"""Token-sequence suffix index and its SQLite store. numpy and sqlite-utils only: no torch, no flask.

- :mod:`suffixspec.index.suffix_array`: static suffix array over token sequences (16- or 32-bit ids, tombstones),
  built with libdivsufsort, memory-mapped.
- :mod:`suffixspec.index.segments`: the document index in segments (fresh segment per add, merges), looked up as one.
- :mod:`suffixspec.index.incremental`: O(1)-append index for growing sources (a request, the output history).
- :mod:`suffixspec.index.speculate`: path / tree speculation from a match (SuffixDecoding's rules).
- :mod:`suffixspec.index.history`: the output history with a token budget.
- :mod:`suffixspec.index.store`: SQLite store (documents, segments per tokenizer fingerprint, history).
- :mod:`suffixspec.index.writer`: large adds and merges in a writer process at the lowest CPU priority.
"""

from .incremental import IncrementalIndex
from .speculate import SpecParams, SpecResult
from .suffix_array import SEP, SuffixArray

__all__ = ["SEP", "IncrementalIndex", "SpecParams", "SpecResult", "SuffixArray"]
