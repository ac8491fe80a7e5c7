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

from suffixspec.core.sampling import (
    LogitsProcessor,
    PositionRNG,
    greedy_token,
    sample_inverse_cdf,
    sample_race,
)
from suffixspec.drafting.draft import Draft, root_path

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
    walked: list[torch.Tensor] = []  # sampled requests: p of every walked row (their top masses, read at the end)
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
            walked.append(p)
            if children and all(draft.has_q(c) for c in children):
                nxt, emitted = _known_q_step(draft, children, p, rng, pos)
                if nxt is None:
                    return VerifyOutcome(root_path(draft.parents, cur), emitted, rows, processed_rows,
                                         _top_masses(walked))
            else:
                y = sample_race(p, rng.race(pos, p.shape[-1]))
                nxt = draft.child_with(children, y)
                if nxt is None:
                    return VerifyOutcome(root_path(draft.parents, cur), y, rows, processed_rows, _top_masses(walked))
        cur = nxt
        path.append(draft.tokens[nxt])


def _top_masses(ps: list[torch.Tensor], k: int = TOP_MASS) -> list[tuple[float, ...]]:
    """Per distribution ``p`` [vocab]: the cumulative mass of its ``k`` likeliest tokens (p1, p1 + p2, ...);
    read back in one transfer for the whole walk."""
    top = torch.topk(torch.stack(ps), min(k, ps[0].shape[-1]), dim=-1).values.cumsum(-1)  # [rows, k]
    return [tuple(row) for row in top.tolist()]


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
    """SpecInfer's multi-step rule. Returns (accepted child, -1) or (None, emitted token).

    Runs on ``p``'s device (the draft's ``q`` moves there); each attempt reads back two numbers,
    ``q(x)`` and ``p(x)``, with the mass ``q`` had left (one transfer)."""
    assert draft.q is not None
    q = draft.q[children[0]].to(device=p.device, dtype=torch.float64).clone()  # [vocab] shared by the siblings
    q = q / q.sum()
    p = p.clone()
    q_mass = q.new_ones(())  # the mass q had before the last renormalization (> 0: q is a distribution)
    for attempt, c in enumerate(children):
        x = draft.tokens[c]
        qx, px, left = torch.stack((q[x], p[x], q_mass)).tolist()
        if left <= 0.0:  # every token q could draw was tried
            break
        # accept with probability min(1, p(x)/q(x)); q(x) = 0 means x could not have been drawn
        if qx > 0.0 and rng.aux(pos, attempt) * qx < px:
            return c, -1
        residual = torch.clamp(p - q, min=0.0)
        mass = residual.sum()
        p = torch.where(mass > 0.0, residual / mass, p)
        q[x] = 0.0
        q_mass = q.sum()
        q = torch.where(q_mass > 0.0, q / q_mass, q)
    return None, sample_inverse_cdf(p, rng.aux(pos, len(children) + 1000))
