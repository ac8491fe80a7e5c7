"""Merge several proposers' drafts into one tree under a node budget.

Drafts are inserted best score first; a node is keyed by (merged parent, token), so shared prefixes
merge. A merged node keeps the source of the first draft that proposed it. The known-q rule stays
valid only where a node's children all come from one draft (they are then that draft's own
samples); elsewhere ``q_known`` is cleared and the always-lossless one-hot rule applies.

Nothing here may look at what a draft with ``q`` sampled (docs/design.md, "Gates and cuts"): drafts are
ordered by their scores, which such drafts fix before sampling; the budget cut of a sampled chain
then depends only on the nodes before the cut (a node shared with an earlier draft costs no budget,
but it is shared, so it is verified one-hot); and the merged draft's ``planned`` size, which the
engine's gate judges, adds the drafts' planned sizes, not what they sampled.

Worked example: A = chain [5, 6, 7] (score 2), B = chain [5, 9] (score 1), budget 4
-> tokens [5, 6, 7, 9], parents [-1, 0, 1, 0] (9 becomes a sibling of 6 under 5).
"""

from __future__ import annotations

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
            mpar = -1 if par < 0 else local[par]
            node = None if mpar == _CUT else self._node.get((mpar, tok))
            created = node is None and mpar != _CUT and (budget is None or len(self.tokens) < budget)
            if created:
                node = len(self.tokens)
                self._node[(mpar, tok)] = node
                self.tokens.append(tok)
                self.parents.append(mpar)
            local.append(_CUT if node is None else node)
            if node is not None:
                kept.append((i, node, created))
        return kept


def merge_drafts(drafts: list[Draft], budget: int) -> Draft:
    drafts = [d for d in drafts if len(d)]
    if not drafts or budget <= 0:
        return Draft()
    if len(drafts) == 1:
        return drafts[0].truncated(budget)
    planned = min(budget, sum(d.gate_size() for d in drafts)) if any(d.q is not None for d in drafts) else None
    drafts.sort(key=lambda d: d.score, reverse=True)
    union = TreeUnion()
    sources: list[str] = []
    origin: list[tuple[int, int]] = []  # (draft index, node index) that created each merged node
    shared: list[bool] = []  # proposed by more than one draft
    for di, d in enumerate(drafts):
        for i, node, created in union.add(d.tokens, d.parents, budget):
            if created:
                sources.append(d.sources[i])
                origin.append((di, i))
                shared.append(False)
            else:
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
    return Draft(tokens, parents, sources, q, known if q is not None else None,
                 score=sum(d.score for d in drafts), planned=planned)
