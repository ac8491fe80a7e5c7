"""Speculation from a matched suffix: path or tree, best-first, as SuffixDecoding does.

Every index (the static suffix array, the incremental chained index) finds the occurrences of the
longest suffix of the context it holds, then exposes them as a *match node* that knows its
occurrence count and can list its children (next token -> count, child node). This module turns such
a node into a draft:

- a node's probability is the product of child/parent count ratios along its path from the match,
  times, with ``SpecParams.rates``, the continuation rate of each token on the path: the chance that
  a token predicted by a match of ``l`` context tokens is right, given its parent was (learned by
  :class:`AcceptanceRates`; a node at depth ``d`` below a match of ``L`` tokens has ``l = L + d - 1``);
- expansion stops below ``min_token_prob``;
- at most ``min(max_spec_tokens, match_len * max_spec_factor + max_spec_offset)`` nodes;
- the draft's score is the sum of node probabilities (= expected accepted tokens).

Worked example: the index holds ``1 2 3 | 1 2 3 | 1 2 4`` (``|`` separates sequences) and the context
ends with ``1 2``. The match ``1 2`` occurs 3 times (count 3); its children are ``3`` (count 2) and
``4`` (count 1). With ``min_token_prob=0.1``:

- path speculation follows the most frequent child: ``3`` (prob 2/3), and ``3`` has no continuation
  inside a sequence, so the draft is ``[3]``, parents ``[-1]``, score 0.667;
- tree speculation pops nodes best-first: ``3`` (0.667), ``4`` (0.333): tokens ``[3, 4]``, parents
  ``[-1, -1]``, score 1.0;
- with rates 0.45 for a 2-token match: ``3`` (0.667 x 0.45 = 0.3), ``4`` (0.15); a match of 1 token
  at rate 0.18 would give 0.12 and 0.06, and ``4`` falls under ``min_token_prob``.
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
    """How long and how wide a draft may grow (SuffixDecoding's knobs), and how likely its tokens are."""

    max_spec_tokens: int = 32  # node budget of one draft
    max_spec_factor: float = 1.0  # a draft has at most match_len * factor + offset nodes
    max_spec_offset: float = 0.0  # see max_spec_factor
    min_token_prob: float = 0.1  # do not propose a node whose path probability is below this
    use_tree_spec: bool = True  # best-first tree (True) or the single most likely path (False)
    # Continuation rates: ``rates[l]`` = P(a drafted token is accepted | its parent was), for a token
    # that a context match of ``l`` tokens predicts (a node at depth d below a match of L tokens has
    # l = L + d - 1: each accepted token lengthens the match); index min(l, len - 1). A node's
    # probability is its count ratio times the rates along its path, so a draft from a 1-token match
    # stays short and one from a long match may run on. None: rate 1 (counts alone, as SuffixDecoding).
    rates: Sequence[float] | None = None

    def __post_init__(self) -> None:
        if self.max_spec_tokens < 0:
            raise ValueError(f"max_spec_tokens must be >= 0, got {self.max_spec_tokens}")
        if self.max_spec_factor < 0:
            raise ValueError(f"max_spec_factor must be >= 0, got {self.max_spec_factor}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {self.min_token_prob}")
        # min/max, not a loop: params are built at every propose call, each with a 65-entry table
        if self.rates is not None and (not len(self.rates) or not 0.0 <= min(self.rates) <= max(self.rates) <= 1.0):
            raise ValueError("rates must be a non-empty sequence of probabilities in [0, 1]")

    def limit(self, match_len: int) -> int:
        """Node budget for a match of ``match_len`` tokens."""
        cap = int(match_len * self.max_spec_factor + self.max_spec_offset + 1e-6)
        return max(0, min(self.max_spec_tokens, cap))

    def rate(self, ell: int) -> float:
        """The continuation rate of a token predicted by an ``ell``-token match (1.0 without rates)."""
        rates = self.rates
        if rates is None:
            return 1.0
        return rates[ell if ell < len(rates) else -1]


@dataclass
class SpecResult:
    """A draft from one index: a tree of tokens with per-node path probabilities."""

    token_ids: list[int] = field(default_factory=list)  # token per node
    parents: list[int] = field(default_factory=list)  # parent node per node, -1 = child of the context
    probs: list[float] = field(default_factory=list)  # path probability per node (non-increasing along a path)
    score: float = 0.0  # sum of probs: expected number of accepted tokens
    match_len: int = 0  # tokens of the context that matched
    kind: str = ""  # whose continuation rates it learns (a proposer's own kinds of draft); "" = its source's

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
        res = _tree(node, limit, params, match_len)
    else:
        res = _path(node, limit, params, match_len)
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
    if prob <= 0.0:
        return count + 1  # no child can reach min_prob
    need = min_prob * count / prob
    c = int(need)
    if c < need - 1e-9:
        c += 1
    return max(1, c)


def _path(node: MatchNode, limit: int, params: SpecParams, match_len: int) -> SpecResult:
    """The most likely path: the shared run of every occurrence, then the most frequent child, and
    so on; the node at depth ``d`` has the match's count ratios times ``rate(match_len + d - 1)``."""
    res = SpecResult()
    min_prob = params.min_token_prob
    prob = 1.0
    tokens, parents, probs = res.token_ids, res.parents, res.probs
    while len(tokens) < limit:
        run, node = node.chain(limit - len(tokens))
        for tok in run:
            p = prob * params.rate(match_len + len(tokens))
            if p < min_prob:  # the run's remaining tokens (and what follows them) are less likely still
                res.score = sum(probs)
                return res
            parents.append(len(tokens) - 1)
            tokens.append(tok)
            probs.append(p)
            prob = p
        if len(tokens) >= limit:
            break
        r = params.rate(match_len + len(tokens))
        kids = node.children(_min_count(node.count, prob * r, min_prob))
        if not kids:
            break
        tok, cnt, child = max(kids, key=lambda k: k[1])
        p = prob * r * cnt / node.count
        if p < min_prob:
            break
        parents.append(len(tokens) - 1)
        tokens.append(tok)
        probs.append(p)
        prob, node = p, child
    res.score = sum(probs)
    return res


def _tree(node: MatchNode, limit: int, params: SpecParams, match_len: int) -> SpecResult:
    """Best-first: the most probable node of the frontier next (probabilities as in :func:`_path`)."""
    res = SpecResult()
    min_prob = params.min_token_prob
    tokens, parents, probs = res.token_ids, res.parents, res.probs
    depth: list[int] = []  # per node
    # heap of (-prob, tie, token, parent index, node); tie keeps insertion order among equal probs
    heap: list[tuple[float, int, int, int, MatchNode]] = []
    tie = 0

    def grow(start: MatchNode, prob: float, idx: int) -> None:
        """Emit ``start``'s shared run at once while it stays the most probable (without rates its
        nodes keep ``prob``, the heap's maximum; with rates each is a little less likely than the
        one before, and the run stops where another branch of the frontier is likelier), push the
        children of the run's end."""
        nonlocal tie
        d = depth[idx] if idx >= 0 else 0
        run, end = start.chain(limit - len(tokens))
        for k, tok in enumerate(run):
            p = prob * params.rate(match_len + d)
            if p < min_prob or (heap and p < -heap[0][0]):
                if p >= min_prob:  # the rest of the run competes from the heap
                    heapq.heappush(heap, (-p, tie, tok, idx, RestOfRun(run[k + 1:], end)))
                    tie += 1
                return
            parents.append(idx)
            tokens.append(tok)
            probs.append(p)
            d += 1
            depth.append(d)
            idx, prob = len(tokens) - 1, p
            if len(tokens) >= limit:
                return
        r = params.rate(match_len + d)
        for tok, cnt, child in end.children(_min_count(end.count, prob * r, min_prob)):
            p = prob * r * cnt / end.count
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
        depth.append(depth[par] + 1 if par >= 0 else 1)
        if len(tokens) < limit:
            grow(child, -negp, idx)
    res.score = sum(probs)
    return res


class RestOfRun:
    """The untaken rest of a shared run (a compressed edge cut where another branch was likelier):
    a match node whose chain is ``run`` and whose children are those of ``end``."""

    def __init__(self, run: list[int], end: MatchNode) -> None:
        self.run, self.end = run, end
        self.count = end.count

    def chain(self, max_len: int) -> tuple[list[int], MatchNode]:
        if not self.run:
            return self.end.chain(max_len)
        if max_len >= len(self.run):
            return self.run, self.end
        return self.run[:max_len], RestOfRun(self.run[max_len:], self.end)

    def children(self, min_count: int) -> list[tuple[int, int, MatchNode]]:
        if not self.run:
            return self.end.children(min_count)
        return [(self.run[0], self.count, RestOfRun(self.run[1:], self.end))]


# Upper match length of each bucket of AcceptanceRates (the last bucket holds every longer match).
RATE_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Prior continuation rate per bucket: how often a token drafted from the request's own text came true
# in SmolLM2-135M-Instruct's greedy outputs on the benchmark's workloads (suffixspec/bench/bench_drafting.py,
# 5 x 8 requests: after a 1-token match 14-19% of the time, 2 tokens 45-53%, 3 tokens 63-83%, 9-16
# tokens 84-97%, longer 93-100%); rounded down a little, since RAG's references came true less often.
PRIOR_RATES = (0.18, 0.45, 0.65, 0.72, 0.82, 0.82, 0.9, 0.9, 0.94, 0.96, 0.97, 0.97)


class AcceptanceRates:
    """Continuation rates (``SpecParams.rates``) learned from what the output did with the drafts.

    Per bucket of match lengths (:data:`RATE_EDGES`) a Beta-binomial estimate around its prior:
    ``(hits + weight * prior) / (mass + weight)``, where a *trial* is one level of a verified draft
    path (its nodes' count ratios summed: the share of the index's continuations that were drafted)
    and a *hit* is the output continuing with one of them. Old trials fade (``decay`` per trial of
    the same bucket), so a request that stops copying lowers its rates within a few dozen tokens.

    Worked example (weight 8): the bucket of 3-token matches has prior 0.65; two trials of mass 1,
    one hit: ``(1 + 8 * 0.65) / (2 + 8) = 0.62``; twenty hits in twenty trials: ``(20 + 5.2) / 28 = 0.9``.
    """

    def __init__(self, prior: Sequence[float] = PRIOR_RATES, weight: float = 8.0, decay: float = 0.98,
                 max_len: int = 64) -> None:
        if len(prior) != len(RATE_EDGES):
            raise ValueError(f"prior needs {len(RATE_EDGES)} rates (one per bucket of RATE_EDGES), got {len(prior)}")
        if weight <= 0 or not 0 < decay <= 1:
            raise ValueError(f"weight must be > 0 and decay in (0, 1], got {weight}, {decay}")
        self.prior = tuple(prior)
        self.weight = weight
        self.decay = decay
        self.hits = [0.0] * len(RATE_EDGES)
        self.mass = [0.0] * len(RATE_EDGES)
        # bucket of each match length 0..max_len
        self._bucket = [next(b for b, e in enumerate(RATE_EDGES) if ell <= e) if ell <= RATE_EDGES[-1]
                        else len(RATE_EDGES) - 1 for ell in range(max_len + 1)]
        self._table: tuple[float, ...] | None = None

    def table(self) -> tuple[float, ...]:
        """The current rate of every match length 0..max_len (for ``SpecParams.rates``)."""
        if self._table is None:
            per = [min(1.0, (h + self.weight * p) / (m + self.weight))
                   for h, m, p in zip(self.hits, self.mass, self.prior, strict=True)]
            self._table = tuple(map(per.__getitem__, self._bucket))  # (C-level: rebuilt after every learned step)
        return self._table

    def observe(self, ell: int, hit: bool, mass: float = 1.0) -> None:
        """One level of a verified draft: predicted by an ``ell``-token match, ``mass`` of the
        continuations drafted, and whether the output took one of them."""
        b = self._bucket[min(max(0, ell), len(self._bucket) - 1)]
        self.hits[b] = self.decay * self.hits[b] + (1.0 if hit else 0.0)
        self.mass[b] = self.decay * self.mass[b] + max(mass, 1.0 if hit else 0.0)
        self._table = None
