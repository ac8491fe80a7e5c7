"""Speculation from a matched suffix: path or tree, best-first, as SuffixDecoding does.

Every index (the static suffix array, the incremental chained index) finds the occurrences of the
longest suffix of the context it holds, then exposes them as a *match node* that knows its
occurrence count and can list its children (next token -> count, child node). This module turns such
a node into a draft:

- a node's probability is the product of child/parent count ratios along its path from the match;
- expansion stops below ``min_token_prob``;
- at most ``min(max_spec_tokens, match_len * max_spec_factor + max_spec_offset)`` nodes;
- the draft's score is the sum of node probabilities (= expected accepted tokens).

Worked example: the index holds ``1 2 3 | 1 2 3 | 1 2 4`` (``|`` separates sequences) and the context
ends with ``1 2``. The match ``1 2`` occurs 3 times (count 3); its children are ``3`` (count 2) and
``4`` (count 1). With ``min_token_prob=0.1``:

- path speculation follows the most frequent child: ``3`` (prob 2/3), and ``3`` has no continuation
  inside a sequence, so the draft is ``[3]``, parents ``[-1]``, score 0.667;
- tree speculation pops nodes best-first: ``3`` (0.667), ``4`` (0.333): tokens ``[3, 4]``, parents
  ``[-1, -1]``, score 1.0.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class MatchNode(Protocol):
    """A node of an (implicit) suffix tree below the matched context suffix."""

    count: int  # occurrences of the path from the root of the suffix tree to this node

    def children(self, min_count: int) -> list[tuple[int, int, MatchNode]]:
        """Children as ``(token, count, node)``; children with ``count < min_count`` may be left out."""
        ...

    def chain(self, max_len: int) -> tuple[list[int], MatchNode]:
        """Tokens that *every* occurrence continues with (at most ``max_len``), and the node after them.

        Along such a run every child/parent count ratio is 1, so the run keeps its parent's probability:
        a compressed edge of the suffix tree, walked in one step instead of token by token.
        """
        ...


@dataclass
class SpecParams:
    """How long and how wide a draft may grow (SuffixDecoding's knobs)."""

    max_spec_tokens: int = 32  # node budget of one draft
    max_spec_factor: float = 1.0  # a draft has at most match_len * factor + offset nodes
    max_spec_offset: float = 0.0  # see max_spec_factor
    min_token_prob: float = 0.1  # do not propose a node whose path probability is below this
    use_tree_spec: bool = True  # best-first tree (True) or the single most likely path (False)

    def __post_init__(self) -> None:
        if self.max_spec_tokens < 0:
            raise ValueError(f"max_spec_tokens must be >= 0, got {self.max_spec_tokens}")
        if self.max_spec_factor < 0:
            raise ValueError(f"max_spec_factor must be >= 0, got {self.max_spec_factor}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {self.min_token_prob}")

    def limit(self, match_len: int) -> int:
        """Node budget for a match of ``match_len`` tokens."""
        cap = int(match_len * self.max_spec_factor + self.max_spec_offset + 1e-6)
        return max(0, min(self.max_spec_tokens, cap))


@dataclass
class SpecResult:
    """A draft from one index: a tree of tokens with per-node path probabilities."""

    token_ids: list[int] = field(default_factory=list)  # token per node
    parents: list[int] = field(default_factory=list)  # parent node per node, -1 = child of the context
    probs: list[float] = field(default_factory=list)  # path probability per node (non-increasing along a path)
    score: float = 0.0  # sum of probs: expected number of accepted tokens
    match_len: int = 0  # tokens of the context that matched

    def __len__(self) -> int:
        return len(self.token_ids)


def speculate_from(node: MatchNode | None, match_len: int, params: SpecParams) -> SpecResult:
    """Build a draft below ``node`` (the match of ``match_len`` context tokens); empty if no node."""
    if node is None or match_len <= 0:
        return SpecResult(match_len=match_len if node is not None else 0)
    limit = params.limit(match_len)
    if limit <= 0:
        return SpecResult(match_len=match_len)
    if params.use_tree_spec:
        res = _tree(node, limit, params.min_token_prob)
    else:
        res = _path(node, limit, params.min_token_prob)
    res.match_len = match_len
    return res


class LongestMatchLookups:
    """``continuations`` and ``speculate`` for an index whose ``node(context, max_depth, hint)`` returns
    ``(match_len, node)`` of the longest suffix of ``context`` it holds (one suffix array, or a set of
    segments whose counts are combined).

    Example: the index holds ``a b c a b d``; ``node([x, a, b])`` is ``(2, node of "a b")`` with children
    ``c`` (1) and ``d`` (1), so ``continuations([x, a, b]) == [(c, 1), (d, 1)]`` (ties by token id).
    """

    def node(self, context: Sequence[int], max_depth: int = 64, hint: int | None = None
             ) -> tuple[int, MatchNode | None]:
        raise NotImplementedError

    def continuations(self, context: Sequence[int], max_depth: int = 64) -> list[tuple[int, int]]:
        """Next tokens after the longest matched suffix, as ``(token, count)`` ranked by count."""
        _, node = self.node(context, max_depth)
        if node is None:
            return []
        return sorted(((t, c) for t, c, _ in node.children(1)), key=lambda tc: (-tc[1], tc[0]))

    def speculate(self, context: Sequence[int], params: SpecParams, max_depth: int = 64,
                  hint: int | None = None) -> SpecResult:
        """Draft continuing ``context`` from its longest match (see :func:`speculate_from`)."""
        L, node = self.node(context, max_depth, hint)
        if node is None:
            return SpecResult()
        return speculate_from(node, L, params)


def speculate_lengths(found: list[tuple[int, int]], node_of: Callable[[list[int]], MatchNode],
                      params: SpecParams, end: int, tries: int = 2) -> SpecResult:
    """The best-scoring draft over the match lengths the occurrences ``found`` offer.

    ``found``: ``(match length, continuation position)`` per occurrence of a context suffix;
    ``node_of(positions)`` makes the match node of a set of continuation positions; ``end``: the
    index's length (no occurrence continues past it). The suffix of length ``L`` occurs wherever an
    occurrence matched ``L`` tokens or more, so each distinct length gives a node (longest first:
    fewest occurrences, longest cap) and a draft; the highest score (expected accepted tokens) wins,
    the longer match on ties.

    A draft's score is at most its node count (``params.limit(L)``) and at most its depth, which is
    at most the furthest any of its occurrences runs before ``end`` (each depth level's probabilities
    sum to at most 1). After the longest match, the lengths are tried in order of that bound
    (longest first among equals), at most ``tries`` of them, while the bound beats the best score:
    the occurrences the longest match misses matter when that match runs into the live end of a
    looping or copying output, and the shortest length that runs as far as its cap allows already
    has them. (SuffixDecoding tries every length; the bound keeps a lookup in the microseconds.)

    Worked example (factor 1, budget 8): ``found = [(9, 30), (9, 28), (4, 10)]``, ``end = 31``. The
    longest match (9 tokens, two occurrences) runs at most 3 tokens before the live end: a draft of
    score <= 3. The 4-token match adds the occurrence at 10, which runs 21 tokens: bound
    ``min(limit(4) = 4, 21) = 4``; when that beats the first draft's score it is tried, and kept if
    it scores more (the occurrences that stop early lower its later tokens' probabilities).
    """
    if not found:
        return SpecResult()
    found = sorted(found, key=lambda f: -f[0])
    lengths: list[tuple[int, int, int]] = []  # (length, occurrences with at least that length, reach)
    reach = 0
    for i, (length, pos) in enumerate(found):
        reach = max(reach, end - pos)
        if i + 1 == len(found) or found[i + 1][0] != length:
            lengths.append((length, i + 1, reach))
    length, count, _ = lengths[0]
    best = speculate_from(node_of([e for _, e in found[:count]]), length, params)
    ranked = sorted(lengths[1:], key=lambda x: -min(params.limit(x[0]), x[2]))  # stable: longer first on ties
    for length, count, reach in ranked[:tries]:
        if min(params.limit(length), reach) <= best.score + 1e-9:
            break
        res = speculate_from(node_of([e for _, e in found[:count]]), length, params)
        if res.score > best.score + 1e-9:
            best = res
    return best


def _min_count(count: int, prob: float, min_prob: float) -> int:
    """Smallest child count whose path probability ``prob * c / count`` reaches ``min_prob``."""
    if min_prob <= 0.0:
        return 1
    need = min_prob * count / prob
    c = int(need)
    if c < need - 1e-9:
        c += 1
    return max(1, c)


def _path(node: MatchNode, limit: int, min_prob: float) -> SpecResult:
    res = SpecResult()
    prob = 1.0
    tokens, parents, probs = res.token_ids, res.parents, res.probs
    while len(tokens) < limit:
        run, node = node.chain(limit - len(tokens))
        if run:
            parents.extend(range(len(tokens) - 1, len(tokens) - 1 + len(run)))
            tokens.extend(run)
            probs.extend([prob] * len(run))
        if len(tokens) >= limit:
            break
        kids = node.children(_min_count(node.count, prob, min_prob))
        if not kids:
            break
        tok, cnt, child = max(kids, key=lambda k: k[1])
        p = prob * cnt / node.count
        if p < min_prob:
            break
        parents.append(len(tokens) - 1)
        tokens.append(tok)
        probs.append(p)
        prob, node = p, child
    res.score = sum(probs)
    return res


def _tree(node: MatchNode, limit: int, min_prob: float) -> SpecResult:
    res = SpecResult()
    tokens, parents, probs = res.token_ids, res.parents, res.probs
    # heap of (-prob, tie, token, parent index, node); tie keeps insertion order among equal probs
    heap: list[tuple[float, int, int, int, MatchNode]] = []
    tie = 0

    def grow(start: MatchNode, prob: float, idx: int) -> None:
        """Emit ``start``'s shared run at once (its nodes have ``prob``, the heap's maximum), push its children."""
        nonlocal tie
        run, end = start.chain(limit - len(tokens))
        if run:
            first = len(tokens)
            parents.append(idx)
            parents.extend(range(first, first + len(run) - 1))
            tokens.extend(run)
            probs.extend([prob] * len(run))
            idx = len(tokens) - 1
        if len(tokens) >= limit:
            return
        for tok, cnt, child in end.children(_min_count(end.count, prob, min_prob)):
            p = prob * cnt / end.count
            if p >= min_prob:
                heapq.heappush(heap, (-p, tie, tok, idx, child))
                tie += 1

    grow(node, 1.0, -1)
    while heap and len(tokens) < limit:
        negp, _, tok, par, child = heapq.heappop(heap)
        idx = len(tokens)
        tokens.append(tok)
        parents.append(par)
        probs.append(-negp)
        if len(tokens) < limit:
            grow(child, -negp, idx)
    res.score = sum(probs)
    return res
