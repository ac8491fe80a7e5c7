"""Merge several proposers' drafts into one tree under a node budget.

Drafts that carry their nodes' probabilities (deterministic drafts) merge node by node, the most
probable first (each draft's probabilities weighted by how its promises have come true); others go in
whole, best score first. A node is keyed by (merged parent, token), so shared prefixes merge. A
merged node keeps the source of the first draft that proposed it. The known-q rule stays valid only
where a node's children all come from one draft (they are then that draft's own samples); elsewhere
``q_known`` is cleared and the always-lossless one-hot rule applies.

Nothing here may look at what a draft with ``q`` sampled (docs/lossless.md, "Merged drafts"): before any
node is placed, each draft gets its share of the budget, in score order (scores of such drafts are
fixed before sampling): a draft with ``q`` is charged its planned size (``Draft.gate_size``), whatever it
sampled, a deterministic draft the nodes it adds to the deterministic drafts before it. A draft keeps
the nodes its share holds (a sampled chain: its first ``share`` nodes, a cut by position). Nodes then
merge, and a node shared by two drafts is no refund: the shares never move with what was sampled. So
whether another draft has a node beside a sampled node (which makes its parent's rule one-hot, shared
or not) depends on the other draft and on the sampled node's ancestors only, never on the node's own
token or on how far its chain went. The merged draft's ``planned`` size, which the engine's gate judges,
adds the drafts' planned sizes, not what they sampled.

Worked example: A = chain [5, 6, 7] (score 2), B = chain [5, 9] (score 1), budget 4
-> tokens [5, 6, 7, 9], parents [-1, 0, 1, 0] (9 becomes a sibling of 6 under 5). With probabilities,
A = [5, 6, 7] at (0.5, 0.3, 0.2), B = [8, 9] at (0.9, 0.8), budget 3 -> tokens [8, 9, 5]: B's chain,
then A's surest node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from suffixspec.drafting.draft import Draft

_CUT = -2  # a tree's node the budget left out (and so all its descendants)


class TreeUnion:
    """Trees merged into one, a node keyed by (merged parent, token): shared prefixes become one node.

    Both mergers build on it: :func:`merge_drafts` (proposers' drafts, first come first kept) and the
    suffix proposer's ``merge_tree`` (its sources' drafts, the most probable kept). Example: add chain
    ``[5, 6, 7]`` -> nodes 0, 1, 2 (all created); add chain ``[5, 9]`` -> 5 is node 0 again, 9 a new
    node 3 under it: ``tokens [5, 6, 7, 9]``, ``parents [-1, 0, 1, 0]``.
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []  # token per merged node
        self.parents: list[int] = []  # merged parent per merged node (-1: a child of the root)
        self._node: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node

    def add(self, tokens: Sequence[int], parents: Sequence[int], budget: int | None = None
            ) -> list[tuple[int, int, bool]]:
        """Merge one tree in (``parents`` as ``Draft.parents``: parents before children).

        Returns ``(node of the tree, merged node, created)`` for each of its nodes that was kept, in
        order. With a ``budget``, a node that would be new once the union holds ``budget`` nodes is cut,
        and its descendants with it; a node already there costs nothing and is kept."""
        local: list[int] = []  # the tree's node -> merged node, or _CUT
        kept: list[tuple[int, int, bool]] = []
        for i, (tok, par) in enumerate(zip(tokens, parents, strict=True)):
            node, created = self.add_node(-1 if par < 0 else local[par], tok, budget)
            local.append(node)
            if node != _CUT:
                kept.append((i, node, created))
        return kept

    def add_node(self, parent: int, token: int, budget: int | None = None) -> tuple[int, bool]:
        """``token`` under the merged node ``parent`` (-1: the root): ``(merged node, created)``, or
        ``(_CUT, False)`` when its parent was cut or it would be new with ``budget`` nodes already held."""
        if parent == _CUT:
            return _CUT, False
        node = self._node.get((parent, token))
        if node is not None:
            return node, False
        if budget is not None and len(self.tokens) >= budget:
            return _CUT, False
        node = self._node[(parent, token)] = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        return node, True


def merge_drafts(drafts: list[Draft], budget: int, weights: Sequence[float] | None = None,
                 min_prob: float = 0.0) -> Draft:
    """One tree of ``drafts`` under ``budget`` nodes (see the module's docstring).

    When every draft carries its nodes' probabilities (``Draft.probs``: deterministic drafts), the
    ``budget`` most probable nodes are kept, whichever draft they come from, each draft's probabilities
    times its ``weights`` entry (how its promises have been coming true, default 1): a suffix tree
    whose best nodes are at 0.4 no longer fills the budget before a draft model's chain at 0.9 gets a
    node. Nodes ranked below ``min_prob`` (where a node costs the pass more than it is expected to
    save) are left out, but the most probable node is always kept, so the weights go on learning.
    Otherwise whole drafts go in best score first, each with its share of the budget (:func:`_shares`: a
    draft with ``q`` is charged its planned size, not what it sampled)."""
    kept = [(d, 1.0 if weights is None else weights[i]) for i, d in enumerate(drafts) if len(d)]
    if not kept or budget <= 0:
        return Draft()
    if len(kept) == 1:
        return kept[0][0].truncated(budget)
    kept.sort(key=lambda dw: dw[0].score, reverse=True)
    drafts = [d for d, _ in kept]
    planned = min(budget, sum(d.gate_size() for d in drafts)) if any(d.q is not None for d in drafts) else None
    union = TreeUnion()
    sources: list[str] = []
    origin: list[tuple[int, int]] = []  # (draft index, node index) that created each merged node
    shared: list[bool] = []  # proposed by more than one draft
    ranked = all(d.probs is not None for d in drafts)  # never with a sampled draft: it carries no probs
    # the nodes in the order they go in: by rank (cut by the budget and min_prob as they come), or each draft's
    # share of the budget, drafts best score first (the budget already applied)
    order = _most_probable(kept) if ranked else _shares(drafts, budget)
    local: dict[tuple[int, int], int] = {}  # (draft index, node index) -> merged node, or _CUT
    for rank, di, i in order:
        if rank < min_prob and union.tokens:
            break
        d = drafts[di]
        par = d.parents[i]
        node, created = union.add_node(-1 if par < 0 else local[(di, par)], d.tokens[i],
                                       budget if ranked else None)
        local[(di, i)] = node
        if created:
            sources.append(d.sources[i])
            origin.append((di, i))
            shared.append(False)
        elif node != _CUT:
            shared[node] = True
    tokens, parents = union.tokens, union.parents
    q_rows = [drafts[di].q[i] if drafts[di].has_q(i) else None for di, i in origin]
    # a parent's children keep their q only when they are all one draft's own nodes (none shared with another
    # draft) carrying q: siblings from two drafts, or a shared one, mean the one-hot rule at that parent
    own = [row is not None and not shared[n] for n, row in enumerate(q_rows)]
    known = [False] * len(tokens)
    for kids in Draft(tokens, parents, sources).children().values():
        if len({origin[n][0] for n in kids}) == 1 and all(own[n] for n in kids):
            for n in kids:
                known[n] = True
    q = None
    if any(known):
        import torch

        first = next(row for row in q_rows if row is not None)
        q = torch.stack([row if row is not None else torch.zeros_like(first) for row in q_rows])
    probs = [drafts[di].probs[i] for di, i in origin] if ranked else None  # type: ignore[index]
    return Draft(tokens, parents, sources, q, known if q is not None else None,
                 score=sum(d.score for d in drafts), planned=planned, probs=probs)


def _most_probable(kept: list[tuple[Draft, float]]) -> list[tuple[float, int, int]]:
    """Every node of the drafts as ``(rank, draft index, node index)``, most probable first: a node's rank is its
    probability times its draft's weight, capped by its parent's rank, so a parent always comes before its
    children (ties: the better-scoring draft first, then node order)."""
    ranked: list[tuple[float, int, int]] = []
    for di, (d, weight) in enumerate(kept):
        rank: list[float] = []
        for i, par in enumerate(d.parents):
            r = d.probs[i] * weight  # type: ignore[index]
            rank.append(r if par < 0 else min(r, rank[par]))
            ranked.append((-rank[i], di, i))
    ranked.sort()
    return [(-r, di, i) for r, di, i in ranked]


def _shares(drafts: list[Draft], budget: int) -> list[tuple[float, int, int]]:
    """The nodes each draft's share of ``budget`` keeps, as ``(inf, draft index, node index)``, drafts in order
    (best score first), each draft's nodes in its order.

    Shares are fixed before anything a draft with ``q`` sampled is looked at: such a draft is charged its
    planned size (``Draft.gate_size``) and keeps its first ``share`` nodes (a cut by position); a deterministic
    draft is charged the nodes it adds to the deterministic drafts before it (a prefix they hold is free) and
    keeps what fits. Example, budget 3: a sampled chain planned at 2 that stopped after one token, then a
    deterministic chain [7, 8] -> the sampled node and 7; the sampled chain's unused second node is not
    lent to 8, or whether 8 came in would depend on where the sampled chain stopped."""
    deterministic = TreeUnion()
    left = budget
    out: list[tuple[float, int, int]] = []
    for di, d in enumerate(drafts):
        if d.q is not None:
            share = min(d.gate_size(), left)
            nodes: Sequence[int] = range(min(len(d), share))
        else:
            held = len(deterministic.tokens)
            nodes = [i for i, _, _ in deterministic.add(d.tokens, d.parents, held + left)]
            share = len(deterministic.tokens) - held
        left -= share
        out.extend((math.inf, di, i) for i in nodes)
    return out
