"""Token-sequence suffix index and its SQLite store. numpy and sqlite-utils only: no torch, no flask.

- :mod:`index.suffix_array`: static suffix array over a corpus (documents), memory-mapped.
- :mod:`index.incremental`: O(1)-append index for growing sources (a request, the output history).
- :mod:`index.speculate`: path / tree speculation from a match (SuffixDecoding's rules).
- :mod:`index.history`: the output history with a token budget.
- :mod:`index.store`: SQLite store (documents, token ids per tokenizer fingerprint, history).
"""

from .incremental import IncrementalIndex
from .speculate import SpecParams, SpecResult
from .suffix_array import SEP, SuffixArray

__all__ = ["SEP", "IncrementalIndex", "SpecParams", "SpecResult", "SuffixArray"]
