"""Merge several proposers' drafts into one tree under a node budget.

Drafts that carry their nodes' probabilities (deterministic drafts) merge node by node, the most
probable first (each draft's probabilities weighted by how its promises have come true); others go in
whole, best score first. A node is keyed by (merged parent, token), so shared prefixes merge. A
merged node keeps the source of the first draft that proposed it. The known-q rule stays valid only
where a node's children all come from one draft (they are then that draft's own samples); elsewhere
``q_known`` is cleared and the always-lossless one-hot rule applies.

Nothing here may look at what a draft with ``q`` sampled (docs/design.md, "Gates and cuts"): drafts are
ordered by their scores, which such drafts fix before sampling; the budget cut of a sampled chain
then depends only on the nodes before the cut (a node shared with an earlier draft costs no budget,
but it is shared, so it is verified one-hot); and the merged draft's ``planned`` size, which the
engine's gate judges, adds the drafts' planned sizes, not what they sampled.

Worked example: A = chain [5, 6, 7] (score 2), B = chain [5, 9] (score 1), budget 4
-> tokens [5, 6, 7, 9], parents [-1, 0, 1, 0] (9 becomes a sibling of 6 under 5). With probabilities,
A = [5, 6, 7] at (0.5, 0.3, 0.2), B = [8, 9] at (0.9, 0.8), budget 3 -> tokens [8, 9, 5]: B's chain,
then A's surest node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .draft import Draft

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
    Otherwise whole drafts go in best score first, the budget cutting the last."""
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
    ranked = all(d.probs is not None for d in drafts)
    # the nodes in the order they go in: by rank, or each draft whole, best score first (never cut by min_prob)
    order = _most_probable(kept) if ranked else [(math.inf, di, i) for di, d in enumerate(drafts)
                                                 for i in range(len(d))]
    local: dict[tuple[int, int], int] = {}  # (draft index, node index) -> merged node, or _CUT
    for rank, di, i in order:
        if rank < min_prob and union.tokens:
            break
        d = drafts[di]
        par = d.parents[i]
        node, created = union.add_node(-1 if par < 0 else local[(di, par)], d.tokens[i], budget)
        local[(di, i)] = node
        if created:
            sources.append(d.sources[i])
            origin.append((di, i))
            shared.append(False)
        elif node != _CUT:
            shared[node] = True
    tokens, parents = union.tokens, union.parents
    q_rows = [drafts[di].q[i] if drafts[di].has_q(i) else None for di, i in origin]
    known = [row is not None and not shared[n] for n, row in enumerate(q_rows)]
    by_parent: dict[int, set[int]] = {}
    for n, par in enumerate(parents):
        by_parent.setdefault(par, set()).add(origin[n][0])
    for n, par in enumerate(parents):
        if len(by_parent[par]) > 1:
            known[n] = False
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
