"""The constants of every drafting decision, in one frozen, validated dataclass (:class:`Policy`).

The engine, the llama.cpp drafter and the benchmarks (``bench_policy``) read them from here; a field's
comment says which decision it moves.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    """The constants of every decision (defaults measured on the embedded models and SmolLM2, one CPU thread)."""

    # -- the draft gate (DraftGate, choose_drafts) ----------------------------------------------------------------
    # a draft that looks not worth its nodes is still verified once the plain steps its row made since the
    # last verified draft cost this many times what the draft adds to the pass, so the request's
    # calibration can recover when the text starts repeating (explorations cost at most 1/this of the
    # time: a fixed count of 8 skips cost ~7% where nothing can be drafted on the embedded model, and on
    # SmolLM2 here, where a pass of 5 costs 2.3 plain steps, a count would cost 2-3x as much)...
    explore_every: int = 16
    # ...and the interval doubles after each exploration that accepted nothing, up to this
    max_explore_every: int = 128
    calibration_rate: float = 0.2  # weight of a new draft in the calibration's moving average (after a running mean)
    calibration_cap: float = 4.0  # the most one draft's accepted / promised ratio counts for
    sharpness_rate: float = 0.3  # weight of a sampled position in the averages of the target's top masses
    # -- the proposer gate (ProposerGate) -------------------------------------------------------------------------
    # a proposer costing under this fraction of a row's plain step always runs (skipping it saves almost
    # nothing, and one unlucky call would switch the suffix index off for the first steps of a copy)
    cheap_fraction: float = 0.05
    # a proposer not known to be cheap is not called once the drafts made before it promise this fraction of
    # the budget (a suffix draft at a text seam, a long match: the draft model would only add its time)
    filled_fraction: float = 0.5
    proposer_rate: float = 0.2  # weight of a new call in a proposer's averages of seconds and accepted tokens
    # a skipped costly proposer is tried again once the steps it sat out cost the rows this many times its own
    # call (its prompt setup included): explorations then cost at most 1/this of the time, and this doubles
    # after each fruitless one, up to max_proposer_explore
    proposer_explore: float = 8.0
    max_proposer_explore: float = 64.0
    # a draft model's accepted token is worth a plain step over (1 + the tokens the drafts before it promise this
    # step): where the suffix index already drafts, the model's tokens replace tokens that would come as cheaply
    # a pass later (ModelDraftJudge); False: a plain step wherever it drafts
    model_value_shared: bool = True
    # -- the draft budget (draft_budget) ---------------------------------------------------------------------------
    budget_floor: int = 4  # the adaptive budget never drops below this many nodes
    budget_per_accepted: float = 2.0  # budget = floor + this x the running mean of accepted tokens per step...
    accepted_rate: float = 0.3  # ...whose weight for a new step is this
    # the per-token acceptance along a draft (for the cost-curve budget) starts here, moving with weight
    # accepted_rate per step
    acceptance_prior: float = 0.6
    # draft lengths the cost-curve budget compares (the cost curve is read at these sizes only; empty: no cost
    # curve, the momentum bound alone)
    budget_steps: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    # -- prefills ---------------------------------------------------------------------------------------------------
    # a request joining while another joiner's prompt (not computed yet) shares at least this many more tokens
    # with it than the prefix store holds waits one step, then copies them instead of computing them again
    # (agents send the same system prompt and tool list; at ~9 ms a token for SmolLM2 on this CPU, 64 tokens
    # are worth more than the one step it waits)
    shared_prefill_min: int = 64
    # -- the cost model (PassCost) ----------------------------------------------------------------------------------
    cost_window: int = 32  # passes kept per bucket of input counts (1, 2, 3-4, 5-8, ...); medians are read
    prior_slope: float = 0.05  # before a second size is measured: t(n) ~ t(1) x (1 + slope x (n - 1))
    cost_min_passes: int = 3  # a bucket's time is the median of its passes from this many, the shortest before

    def __post_init__(self) -> None:
        if not 1 <= self.explore_every <= self.max_explore_every:
            raise ValueError("need 1 <= explore_every <= max_explore_every")
        for name in ("calibration_rate", "sharpness_rate", "proposer_rate", "accepted_rate"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"Policy.{name} must be in (0, 1]")
        if not 0.0 <= self.acceptance_prior < 1.0:
            raise ValueError("Policy.acceptance_prior must be in [0, 1)")
        if not 1.0 <= self.proposer_explore <= self.max_proposer_explore:
            raise ValueError("need 1 <= proposer_explore <= max_proposer_explore")
        if self.cost_window < 1 or self.budget_floor < 1 or self.cost_min_passes < 1:
            raise ValueError("Policy.cost_window, budget_floor and cost_min_passes must be >= 1")


DEFAULT = Policy()
