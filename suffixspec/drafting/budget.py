"""How many nodes a request may draft this step: :func:`draft_budget` (the engine),
:func:`momentum_budget` (its first bound, alone where no cost curve is read) and
:func:`best_chain_prefix` (a runtime that verifies one chain: llama.cpp)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from suffixspec.drafting.costs import StepCost
from suffixspec.drafting.policy import DEFAULT, Policy


def momentum_budget(cap: int, mean_accepted: float, copy_run: int, policy: Policy = DEFAULT) -> int:
    """:func:`draft_budget`'s first bound: ``floor + 2 x`` the running mean of accepted tokens per step, or
    twice the last step's accepted run plus 2 when it accepted its whole draft, at most ``cap``.
    Example: cap 32, mean 1.5 -> 7; a copy that accepted all 8 tokens of the last draft -> 18."""
    momentum = max(policy.budget_floor, round(policy.budget_floor + policy.budget_per_accepted * mean_accepted),
                   2 * copy_run + 2)
    return min(cap, momentum)


def best_chain_prefix(probs: Sequence[float], calibration: float, cost: Any) -> int:
    """How many nodes of a chain draft to verify, for a runtime that verifies one chain alone in its pass
    (llama.cpp): the prefix with the most tokens per second, at least 1 (0 for an empty chain).

    Node ``i`` has path probability ``probs[i]`` (non-increasing along the chain); verifying the first ``k``
    promises ``calibration x (p1 + ... + pk)`` accepted tokens plus the target's own, for a pass of
    ``1 + k`` inputs: ``(1 + calibration x sum) / t(1 + k)`` tokens per second. Unlike
    :func:`draft_budget`'s geometric guess, this reads the draft's own probabilities: where a pass grows
    steeply with its inputs (llama.cpp on one CPU thread), only the sure head of a draft
    pays, and a copy at 0.98 per token pays far down. Whether even the best prefix pays is
    :func:`choose_drafts`' call. Before any pass was measured: the whole chain.

    Example: t(2), t(3), t(4), t(5) = 14, 19.5, 25, 30.5 ms; probs 0.95, 0.9, 0.5, 0.2, calibration 1:
    k = 1: 1.95 / 14 = 0.139, k = 2: 2.85 / 19.5 = 0.146, k = 3: 3.35 / 25 = 0.134 -> 2."""
    best_k, best_rate, promised = min(1, len(probs)), 0.0, 0.0
    for k, p in enumerate(probs, 1):
        promised += calibration * p
        t = cost.estimate(1 + k)
        if t is None:
            return len(probs)
        if (1.0 + promised) / t > best_rate:
            best_k, best_rate = k, (1.0 + promised) / t
    return best_k


def draft_budget(cap: int, mean_accepted: float, copy_run: int, acceptance: float, step: StepCost,
                 policy: Policy = DEFAULT) -> int:
    """The nodes a request may draft this step (adaptive requests), at most ``cap``.

    Two bounds, the smaller wins. (1) Momentum: ``floor + 2 x`` the running mean of accepted tokens
    per step, or twice the last step's accepted run plus 2 when it accepted its whole draft (a copy
    doubles, as a slow start does). (2) The cost curve: with per-token acceptance ``a`` along a draft,
    a draft of ``k`` expects ``a + a^2 + ... + a^k`` tokens, and the row's step costs
    ``F + extra(k)``; the budget is the ``k`` (of ``Policy.budget_steps``) with the most tokens per
    second. Where a CPU step is memory-bound the curve rises slowly and then steeply, so the budget grows
    with ``a`` but stays far below what a GPU's flat curve would allow (docs/benchmarks.md has measured
    curves). Before any pass was measured only (1) applies.

    Example: cap 32, mean 1.5 -> momentum 7; a = 0.9 and t(1 + k) = 70, 71, 72, 73, 75, 77, 82, 95 ms
    for k = 1, 2, 3, 4, 6, 8, 12, 16 -> the cost curve's best is 8 or 12; the budget is 7."""
    budget = momentum_budget(cap, mean_accepted, copy_run, policy)
    plain = step.plain()
    if not plain or budget <= 1:
        return budget
    a = min(acceptance, 0.995)
    best_k, best_rate = 1, 0.0
    gain = 0.0  # a + ... + a^k
    term = 1.0
    k_prev = 0
    for k in policy.budget_steps:
        if k > budget:
            break
        for _ in range(k - k_prev):
            term *= a
            gain += term
        k_prev = k
        extra = step.extra(k)
        if extra is None:
            return budget
        rate = (1.0 + gain) / (plain + extra)
        if rate > best_rate:
            best_k, best_rate = k, rate
    if best_k == k_prev or k_prev == 0:  # the curve still pays at the largest size compared: momentum decides
        return budget
    return max(1, min(budget, best_k))
