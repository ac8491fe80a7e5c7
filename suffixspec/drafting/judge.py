"""A draft model judging its own drafts from measured costs (:class:`ModelDraftJudge`), and the length of a
draft whose size must be fixed before sampling (:func:`model_draft_length`)."""

from __future__ import annotations

from suffixspec.drafting.costs import StepCost
from suffixspec.drafting.policy import DEFAULT, Policy


class ModelDraftJudge:
    """One request's judgement of a draft model's drafts, from measured costs: whether to draft at all, how
    far, and which runner-up tokens to add as branches.

    Unlike a suffix draft (microseconds), every token of a model draft costs a draft forward pass of
    ``c`` CPU seconds (``step_s``, measured by the drafter), and the value of an accepted token is the plain
    row step ``F`` it spares (:class:`StepCost`). So:

    - **draft at all** (:meth:`worth`) when the draft's first token is accepted often enough to pay for its
      forward and its verification: ``first x F >= c x f + extra(1)``, ``first`` being the moving average of
      the first token's acceptance in this request (from the drafter's prior over earlier requests), ``f``
      the first forward in one-token forwards (``t(n) / t(1)`` where it first feeds ``n`` tokens the draft's
      cache lacks: the prompt at the request's first draft, the tokens accepted while it sat out). A
      drafter that does not pay now explores again once the plain steps it sat out cost ``interval`` times
      a one-token draft (``Policy.proposer_explore``, doubling after each fruitless exploration up to
      ``max_proposer_explore``), so a request whose answer turns from prose into code gets its draft model
      back within a bounded cost;
    - **draft further** (:meth:`further`) while the chance that every drafted token so far is accepted
      (``reach``: the product of the draft's own probabilities of its tokens, times ``calibration``, the
      accepted tokens per token those reaches promised so far) still pays for one more forward and node:
      ``calibration x reach x F >= c + (extra(n + 1) - extra(n))``, as llama.cpp's ``--spec-draft-p-min``
      stops on the draft's confidence, but with the threshold taken from the costs;
    - **branch** (:meth:`branch`): add the draft's runner-up at a position as a sibling when its chance
      pays for the node alone (no forward: it is not drafted further): ``reach' x F >= extra(n + 1) - extra(n)``.

    Where drafters before it (the suffix index) already promise ``s`` accepted tokens this step, an accepted
    token of the model's is worth ``F / (1 + s)`` instead of ``F`` (``Policy.model_value_shared``): the pass
    yields ``1 + s`` tokens without it, so a token it adds comes only that much sooner. (docs/benchmarks.md, the Qwen
    pair's whole code edits, has the measurement behind this rule.)

    Worked example (F = 230 ms, a draft forward c = 30 ms, a verify pass of 1 + 8 tokens costing 1.13 F):
    ``first = 0.8`` -> 184 >= 30 + ~0 ms: draft; after tokens with
    probabilities 0.9, 0.8, 0.5 the reach is 0.36 -> 83 >= 30 + ~4 ms: draft a fourth token; a runner-up
    of probability 0.3 after the first token (reach 0.3 x 1) -> 69 ms >= 4 ms: a branch. A draft model three
    times as slow (c = 85 ms) stops once the reach drops under about 0.4.

    Lossless (docs/lossless.md, "Gates and cuts"): every decision reads costs, past outcomes, and the
    probabilities of tokens already drawn (a node's own token never decides whether that node exists)."""

    def __init__(self, policy: Policy = DEFAULT, first: float = 0.7, step_ratio: float | None = None) -> None:
        self.policy = policy
        self.first = first  # moving average of "the draft's first token was accepted" in this request
        self.step_s: float | None = None  # CPU seconds of one draft forward (the drafter's measure)
        # until step_s is measured: a draft forward as this share of the target's plain step (the bytes each reads
        # a step: ModelDrafter.estimate_cost), so that a draft model is not run before anything says it pays
        self.step_ratio = step_ratio
        self.interval = policy.proposer_explore  # exploration interval, in one-token drafts' costs
        self.idle = 0.0  # row-seconds of plain steps sat out since the last draft
        self.explored = False  # the last draft was made only to re-measure
        # accepted tokens per token the draft's own probabilities promised (the sum of the reaches along its
        # chains), a moving average from 1: a draft sure of tokens the target rejects drafts less far
        self.calibration = 1.0
        self.promised_before = 0.0  # accepted tokens the drafts before this one promise this step (observe_promise)

    def _costs(self, step: StepCost) -> tuple[float, float, float] | None:
        """(what an accepted token is worth, a one-node pass's extra cost, a draft forward's seconds), or None
        while not measured (a draft forward: ``step_s``, else ``step_ratio`` times the plain step)."""
        plain, extra = step.plain(), step.extra(1)
        draft = self.step_s
        if draft is None and self.step_ratio is not None and plain is not None:
            draft = self.step_ratio * plain
        if plain is None or extra is None or draft is None:
            return None
        if self.policy.model_value_shared:
            plain /= 1.0 + max(0.0, self.promised_before)
        return plain, extra, draft

    def worth(self, step: StepCost, forwards: float = 1.0) -> bool:
        """Whether to draft this step (True while the costs are not measured yet; with a ``step_ratio``, False
        until the target's plain step is: one step's wait, where a first draft would feed the whole prompt).
        ``forwards``: what the draft's first forward costs in one-token forwards (more than 1 where it first
        feeds the tokens its cache lacks: the prompt, at a request's first draft, or the tokens accepted while it
        sat out)."""
        costs = self._costs(step)
        if costs is None:
            return self.step_ratio is None or step.plain() is not None
        plain, extra, draft = costs
        cost = draft * forwards + extra
        if self.first * plain >= cost:
            self.idle, self.explored = 0.0, False
            return True
        self.idle += step.plain() or 0.0  # the plain steps sat out (their full cost, whatever a token is worth)
        if self.idle >= self.interval * cost:
            self.idle, self.explored = 0.0, True
            return True
        return False

    def further(self, reach: float, nodes: int, step: StepCost) -> bool:
        """Whether a draft of ``nodes`` nodes whose tokens so far all come true with chance ``reach``
        should draft one more token (True while the costs are not measured)."""
        costs = self._costs(step)
        if costs is None:
            return True
        lo, hi = step.extra(nodes), step.extra(nodes + 1)
        return self.calibration * reach * costs[0] >= costs[2] + max(0.0, (hi or 0.0) - (lo or 0.0))

    def branch(self, reach: float, nodes: int, step: StepCost) -> bool:
        """Whether a runner-up reached with chance ``reach`` is worth one more node of a draft of ``nodes``
        (False while the costs are not measured: no branches on a guess)."""
        costs = self._costs(step)
        if costs is None:
            return False
        lo, hi = step.extra(nodes), step.extra(nodes + 1)
        return self.calibration * reach * costs[0] >= max(0.0, (hi or 0.0) - (lo or 0.0))

    def observe(self, first_accepted: bool, promised: float = 0.0, accepted: int = 0) -> None:
        """The target's verdict on the draft's first token (a draft that was not verified counts too: for
        greedy requests the target's token says whether it would have been accepted), and on the chain:
        ``accepted`` of its tokens where its reaches added up to ``promised`` (over the tokens judged)."""
        rate = self.policy.accepted_rate
        self.first = (1 - rate) * self.first + rate * float(first_accepted)
        if promised > 0:
            ratio = min(self.policy.calibration_cap, accepted / promised)
            self.calibration = min(2.0, max(0.25, (1 - rate) * self.calibration + rate * ratio))
        if first_accepted:
            self.interval = self.policy.proposer_explore
        elif self.explored:
            self.interval = min(self.policy.max_proposer_explore, 2 * self.interval)
        self.explored = False


def model_draft_length(acceptance: float, step_s: float | None, step: StepCost, cap: int) -> int:
    """The most tokens a model draft whose length must be fixed before sampling (a sampled request's
    draft with ``q``, judged at its planned size) should plan: the ``k`` of 1..``cap`` with the most tokens
    per second, ``(1 + a + ... + a^k) / (F + extra(k) + k c)``, ``a`` the per-token acceptance, ``c`` a draft
    forward's CPU seconds; ``cap`` while the costs are not measured.

    Example: F = 230 ms, c = 30 ms, extra(k) ~ 4 ms per node: a = 0.8 -> 5, a = 0.9 -> 8, a = 0.5 -> 2."""
    plain = step.plain()
    if plain is None or step_s is None or cap <= 1:
        return max(1, cap)
    a = min(max(acceptance, 0.0), 0.995)
    best_k, best_rate, gain, term = 1, 0.0, 0.0, 1.0
    for k in range(1, cap + 1):
        term *= a
        gain += term
        extra = step.extra(k)
        if extra is None:
            return cap
        rate = (1.0 + gain) / (plain + extra + k * step_s)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k
