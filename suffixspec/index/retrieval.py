"""Ranked retrieval from the document corpus: drafts that continue the context as the corpus does, ranked
by how often each continuation follows, and none where a match is likely to be chance.

REST (retrieval-based speculative decoding) retrieves this way: the longest suffix of the context found
in a suffix array, the continuations of its hits merged into a trie weighted by how often each
continues, the most frequent nodes kept. The document index does the same without collecting hits:
the match node of :meth:`SegmentSet.node` covers every occurrence, its children are the hits' next
tokens with their counts, and :func:`~index.speculate.speculate_from` keeps the likeliest nodes of
that tree best-first under the draft budget. What a corpus adds that the request's own text does not:

- **Chance matches.** In a corpus of ``N`` tokens the context's last few tokens occur somewhere whether
  or not the output is about to copy anything, and a match found once continues one way only: its
  count ratio says "certain". How long a match must be before one occurrence means something grows
  with ``N``: an ``L``-token stretch of ordinary text, carrying about ``bits_per_token`` bits a token
  under the corpus' statistics, is expected by chance about ``N / 2 ** (L * bits_per_token)`` times.
  So a match found fewer than ``min_count`` times is drafted from only when it is at least
  :func:`min_match_length` tokens long (``log2 N / bits_per_token``, rounded): 3 tokens in a package
  of 50k tokens, 5 in the standard library (3.4M), 6 in 100M tokens. Measured on SmolLM2's greedy
  outputs (HumanEval against the standard library and against 100M tokens of installed Python
  source): the first token after a 3-token match found once came true 16% of the time in 3.4M tokens
  and 3% in 100M; after 5 tokens, 48% and 12%; after 6-7, 44-86% and 50-71%.
- **Few occurrences are weak evidence.** A match's children get ``count / (occurrences + pseudo_count)``
  instead of ``count / occurrences`` (additive smoothing at the match): one occurrence that continues
  with ``x`` says ``x`` at 1 / (1 + 1) = 0.5, twenty that all continue with it say 20 / 21 = 0.95.
  The run every occurrence shares below that (a compressed edge) keeps its parent's probability, as
  SuffixDecoding's rule gives it; the continuation rates of :class:`~index.speculate.AcceptanceRates`
  (by match length, learned from what the output did) discount each further token.

Worked example (``pseudo_count`` 1, no rates): the corpus holds ``5 6 7 8`` twice and ``5 6 9`` once;
the context ends with ``... 5 6`` (``L`` = 2, three occurrences: no minimum applies). Its children are
``7`` (2 / (3 + 1) = 0.5) and ``9`` (1 / 4 = 0.25); ``8`` follows every ``7`` (its run): 0.5. Tree
draft: ``7`` (0.5), ``8`` (0.5), ``9`` (0.25), score 1.25. A context ending ``... 6 9`` matches 2 tokens
found once: drafted from in a corpus of 8 tokens (minimum 1), not in one of a million (minimum 4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .speculate import MatchNode, RestOfRun, SpecParams, SpecResult, speculate_from

# Information per token of source code and prose under a large corpus' own statistics, in bits: an L-token
# stretch is expected by chance about once in 2 ** (L * BITS_PER_TOKEN) tokens. Fitted on the measurement in
# the module docstring: one occurrence of a match meant little below 5 tokens in 3.4M tokens and below 6
# in 100M (log2 3.4M / 4.5 = 4.8, log2 100M / 4.5 = 5.9).
BITS_PER_TOKEN = 4.5
_RUN_CAP = 64  # tokens of a shared run read at once (a draft is at most 32 nodes by default, 256 at most)


def min_match_length(num_tokens: int, bits_per_token: float = BITS_PER_TOKEN) -> int:
    """The shortest match a corpus of ``num_tokens`` tokens holds by more than chance when found once:
    ``round(log2 N / bits_per_token)``, at least 1.

    Examples (4.5 bits): 50k tokens -> 3, 3.4M -> 5, 100M -> 6, 1e9 -> 7.
    """
    if num_tokens <= 1:
        return 1
    return max(1, round(math.log2(num_tokens) / bits_per_token))


@dataclass
class RetrievalParams:
    """How the documents draft (see the module docstring)."""

    pseudo_count: float = 1.0  # added to a match's occurrences in its children's ratios (0: plain ratios)
    min_count: int = 2  # a match found fewer times than this must be at least min_match tokens long
    min_match: int | None = None  # that length; None: min_match_length(corpus tokens, bits_per_token)
    bits_per_token: float = BITS_PER_TOKEN  # of min_match_length

    def __post_init__(self) -> None:
        if self.pseudo_count < 0:
            raise ValueError(f"pseudo_count must be >= 0, got {self.pseudo_count}")
        if self.min_count < 1:
            raise ValueError(f"min_count must be >= 1 (1: no minimum match), got {self.min_count}")
        if self.min_match is not None and self.min_match < 1:
            raise ValueError(f"min_match must be >= 1 (or None: from the corpus size), got {self.min_match}")
        if self.bits_per_token <= 0:
            raise ValueError(f"bits_per_token must be > 0, got {self.bits_per_token}")


class _SmoothedRoot:
    """The match node seen through additive smoothing: its children (or the first token of the run every
    occurrence shares) at ``count / (occurrences + pseudo_count)``, the tree below them unchanged."""

    __slots__ = ("node", "count")

    def __init__(self, node: MatchNode, pseudo: float) -> None:
        self.node = node
        self.count = node.count + pseudo

    def chain(self, max_len: int) -> tuple[list[int], MatchNode]:
        return [], self  # no run at ratio 1 here: the first token is judged by the smoothed ratio

    def children(self, min_count: int) -> list[tuple[int, int, MatchNode]]:
        run, end = self.node.chain(_RUN_CAP)
        if run:  # every occurrence continues with the run: one child, all the occurrences
            return [(run[0], self.node.count, RestOfRun(run[1:], end))]
        return self.node.children(min_count)


class DocumentRetrieval:
    """Drafts from a document index (:class:`~index.segments.SegmentSet` or
    :class:`~index.suffix_array.SuffixArray`) by ranked retrieval (see the module docstring).

    Example::

        docs = DocumentRetrieval(store.document_index(tok))
        docs.min_match                                   # 5 for a corpus of 3.4M tokens
        docs.speculate(context, SpecParams(8), hint=5)   # a SpecResult; empty below the minimum match
    """

    def __init__(self, index, params: RetrievalParams | None = None) -> None:
        self.index = index
        self.params = params or RetrievalParams()
        p = self.params
        self.min_match = p.min_match if p.min_match is not None else min_match_length(index.num_tokens,
                                                                                     p.bits_per_token)

    @property
    def num_tokens(self) -> int:
        return self.index.num_tokens

    def speculate(self, context: Sequence[int], params: SpecParams, max_depth: int = 64,
                  hint: int | None = None) -> SpecResult:
        """A draft continuing ``context`` from its longest match in the corpus: empty when that match is
        found fewer than ``min_count`` times and is shorter than :attr:`min_match` (``match_len`` still says
        how long it was: the next step's hint)."""
        L, node = self.index.node(context, max_depth, hint)
        if node is None or node.count <= 0:
            return SpecResult()
        if L < self.min_match and node.count < self.params.min_count:
            return SpecResult(match_len=L)
        if self.params.pseudo_count > 0:
            node = _SmoothedRoot(node, self.params.pseudo_count)
        return speculate_from(node, L, params)
