"""Vocabulary translation between tokenizers (universal assisted generation). No model code, no flask.

- :class:`TokenBridge` -- the API a different-vocabulary drafter uses (see ``bridge.py``).
- :class:`VocabTable` -- the bytes each token spells, exact encoding (``vocab.py``).
- :func:`retokenize`, :func:`translate_tail`, :class:`IncrementalEncoder` -- look-behind
  re-encoding of the new tail (``text.py``).
- :class:`BoundaryLattice` -- Aho-Corasick lattice over target token spellings (``lattice.py``).
- :class:`VocabIntersection` -- token-level intersection and mapping of draft q (``intersection.py``).
"""

from suffixspec.tokenizer_bridge.bridge import DraftContext, TokenBridge, Translation, vocab_table
from suffixspec.tokenizer_bridge.intersection import Coverage, VocabIntersection
from suffixspec.tokenizer_bridge.lattice import BoundaryLattice
from suffixspec.tokenizer_bridge.text import (
    IncrementalEncoder,
    Retokenized,
    retokenize,
    translate_tail,
    window_start,
)
from suffixspec.tokenizer_bridge.vocab import VocabTable, utf8_complete_prefix

__all__ = [
    "BoundaryLattice", "Coverage", "DraftContext", "IncrementalEncoder", "Retokenized", "TokenBridge",
    "Translation", "VocabIntersection", "VocabTable", "retokenize", "translate_tail", "utf8_complete_prefix",
    "vocab_table", "window_start",
]
