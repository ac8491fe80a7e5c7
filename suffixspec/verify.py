"""Lossless verification of a draft tree against the target's logits (docs/design.md, "The lossless contract").

Given the logits of one forward pass over ``[root] + draft nodes`` (row 0 is the distribution
after the last committed token, row ``i + 1`` the distribution after draft node ``i``), walk the
tree from the root and return the accepted nodes plus one token sampled by the target.

Rules at a node with children ``C`` (distinct tokens):
- greedy: ``y = argmax p``; descend into the child equal to ``y``, else emit ``y`` and stop;
- one-hot (children without a known ``q``): draw ``y ~ p`` with the position's noise (the
  exponential race of ``sampling.py``); descend
  if ``y`` is a child, else emit ``y`` and stop;
- known ``q`` (every child carries the same draft row, children drawn from it without
  replacement, in order): accept child ``x`` with probability ``min(1, p(x) / q(x))``; on
  rejection ``p <- norm(max(0, p - q))``, ``q <- q`` without ``x`` renormalized, try the next child;
  when every child is rejected, emit a sample of the final ``p``.

Worked example (greedy): tokens ``[5, 8, 9]``, parents ``[-1, 0, 0]``; argmax of row 0 is 5
(accept node 0), argmax of row 1 is 9 (accept node 2), argmax of row 3 is 4 (no child): the
accepted nodes are ``[0, 2]`` and the target emits 4 -> three new tokens ``5 9 4``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .draft import Draft, root_path
from .sampling import LogitsProcessor, PositionRNG, greedy_token, sample_inverse_cdf, sample_race

TOP_MASS = 8  # how many of the likeliest tokens' masses a sampled outcome reports


@dataclass
class VerifyOutcome:
    """The result of walking one draft tree."""

    accepted: list[int]  # accepted draft node indices, root to leaf
    token: int  # the token the target emitted after the accepted path (bonus or correction)
    rows: list[int]  # logits row that produced each new token (accepted tokens then ``token``)
    processed: list[torch.Tensor]  # processed logits row per new token (for logprobs), same order
    # sampled requests, per new token (same order): the mass of the 1, 2, ..., 8 likeliest tokens of
    # the target's distribution there (empty when greedy); the engine's DraftGate learns the target's
    # sharpness from it. Every walked row counts, accepted ones too: the rejecting rows alone would
    # say the target is less sure than it is
    top_mass: list[tuple[float, ...]] = field(default_factory=list)


def verify_tree(
    draft: Draft,
    logits: torch.Tensor,  # [1 + num_nodes, vocab] raw target logits, row 0 = root
    processor: LogitsProcessor,
    rng: PositionRNG,
    position: int,  # output position of the first new token
) -> VerifyOutcome:
    kids = draft.children()
    greedy = processor.params.greedy
    if greedy and not processor.uses_penalties:
        return _greedy_walk(draft, kids, processor.process(logits))
    cur = -1  # current node; -1 = root
    path: list[int] = []  # tokens accepted so far in this walk
    rows: list[int] = []
    processed_rows: list[torch.Tensor] = []
    masses: list[tuple[float, ...]] = []
    while True:
        row = cur + 1
        processed = processor.process(logits[row : row + 1], [path])[0]  # [vocab]
        rows.append(row)
        processed_rows.append(processed)
        children = kids.get(cur, [])
        pos = position + len(path)
        if greedy:
            y = greedy_token(processed)
            nxt = draft.child_with(children, y)
            if nxt is None:
                return VerifyOutcome(root_path(draft.parents, cur), y, rows, processed_rows)
        else:
            p = processor.probs(processed[None])[0]  # [vocab] float64
            masses.append(_top_mass(p))
            if children and all(draft.has_q(c) for c in children):
                nxt, emitted = _known_q_step(draft, children, p, rng, pos)
                if nxt is None:
                    return VerifyOutcome(root_path(draft.parents, cur), emitted, rows, processed_rows, masses)
            else:
                y = sample_race(p, rng.race(pos, p.shape[-1]))
                nxt = draft.child_with(children, y)
                if nxt is None:
                    return VerifyOutcome(root_path(draft.parents, cur), y, rows, processed_rows, masses)
        cur = nxt
        path.append(draft.tokens[nxt])


def _top_mass(p: torch.Tensor, k: int = TOP_MASS) -> tuple[float, ...]:
    """Cumulative mass of the ``k`` likeliest tokens of ``p``: (p1, p1 + p2, ...)."""
    return tuple(torch.topk(p, min(k, p.shape[-1])).values.cumsum(0).tolist())


def _greedy_walk(draft: Draft, kids: dict[int, list[int]], processed: torch.Tensor) -> VerifyOutcome:
    """The greedy walk when no row depends on its path (no penalties): one argmax over all rows.

    processed: [1 + num_nodes, vocab]; row ``i + 1`` belongs to node ``i``, as in :func:`verify_tree`.
    """
    best = processed.argmax(dim=-1).tolist()  # [1 + num_nodes]; ties -> lowest id, as greedy_token
    cur = -1
    rows: list[int] = []
    while True:
        rows.append(cur + 1)
        y = best[cur + 1]
        nxt = draft.child_with(kids.get(cur, []), y)
        if nxt is None:
            return VerifyOutcome(root_path(draft.parents, cur), y, rows, [processed[r] for r in rows])
        cur = nxt


def _known_q_step(
    draft: Draft, children: list[int], p: torch.Tensor, rng: PositionRNG, pos: int
) -> tuple[int | None, int]:
    """SpecInfer's multi-step rule. Returns (accepted child, -1) or (None, emitted token)."""
    assert draft.q is not None
    q = draft.q[children[0]].to(torch.float64).clone()  # [vocab] shared by the siblings
    q = q / q.sum()
    p = p.clone()
    for attempt, c in enumerate(children):
        x = draft.tokens[c]
        qx, px = float(q[x]), float(p[x])
        # accept with probability min(1, p(x)/q(x)); q(x) = 0 means x could not have been drawn
        if qx > 0.0 and rng.aux(pos, attempt) * qx < px:
            return c, -1
        residual = torch.clamp(p - q, min=0.0)
        mass = float(residual.sum())
        if mass > 0.0:
            p = residual / mass
        q[x] = 0.0
        q_mass = float(q.sum())
        if q_mass <= 0.0:
            break
        q = q / q_mass
    return None, sample_inverse_cdf(p, rng.aux(pos, len(children) + 1000))
