"""suffixspec/drafting (costs, gates, budget, judge): the pass-cost model, the draft gate, the proposer gate, choose_drafts and the budget."""

from __future__ import annotations

import pytest
import torch

from suffixspec.drafting.budget import best_chain_prefix, draft_budget, momentum_budget
from suffixspec.drafting.costs import PassCost, StepCost
from suffixspec.drafting.draft import SOURCE_DRAFT_MODEL, Draft
from suffixspec.drafting.gates import DraftGate, ProposerGate, ProposerRecord, RowDraft, choose_drafts
from suffixspec.drafting.judge import ModelDraftJudge, model_draft_length
from suffixspec.drafting.policy import Policy


def _cost(seconds: dict[int, float], times: int = 3) -> PassCost:
    """A pass cost measured at these input counts, each ``times`` times (3: every bucket reads its median;
    fewer: its fastest pass, at most the prior)."""
    cost = PassCost()
    for _ in range(times):
        for inputs, t in seconds.items():
            cost.observe(inputs, t)
    return cost


def _linear(slope: float, sizes: int = 40) -> PassCost:
    return _cost({n: 1.0 + slope * (n - 1) for n in range(1, sizes + 1)})


def test_cost_is_a_robust_monotone_curve():
    """The docstring's example: medians per size (a slowed pass does not move them; the shortest of a
    bucket's first passes), never decreasing with size, subadditive, interpolated and extrapolated."""
    cost = PassCost()
    assert cost.estimate(5) is None
    cost.observe(1, 4.0)
    assert cost.estimate(11) == pytest.approx(4.0 * (1 + 0.05 * 10))  # the prior slope
    cost = PassCost()
    for t in (0.070, 0.071, 0.090):
        cost.observe(1, t)
    cost.observe(9, 0.085)
    assert cost.estimate(1) == pytest.approx(0.071)
    assert cost.estimate(5) == pytest.approx(0.078)
    assert cost.estimate(17) == pytest.approx(0.099)
    cost.observe(4, 0.050)  # cheaper than one input: noise, lifted to the curve
    assert cost.estimate(4) == pytest.approx(0.071)
    cost.observe(2, 0.250)  # one pass of 2 slowed 3.5x (threads spinning on a busy machine): the prior
    assert cost.estimate(2) == pytest.approx(0.071 * 1.05)  # holds while the bucket has under 3 passes
    cost.observe(2, 0.0725)  # a second pass: the shorter one, within the prior
    assert cost.estimate(2) == pytest.approx(0.0725)
    cost.observe(2, 0.300)  # from 3 passes: their median, at most t(1) + t(1) (it never pays to split a pass)
    assert cost.estimate(2) == pytest.approx(0.142)
    for t in (0.073, 0.074):  # mostly fast passes: their median
        cost.observe(2, t)
    assert cost.estimate(2) == pytest.approx(0.074)


def _row(size: int, expected: float, gate: DraftGate | None = None, always_verify: bool = False) -> RowDraft:
    return RowDraft(size, expected, always_verify, None if always_verify else (gate or DraftGate()))


def test_choose_drafts_worked_example():
    """The docstring's example: 4 rows; a draft is verified when its expected tokens, at a row's share
    of a plain pass each, cover what its nodes add to the pass."""
    cost = _cost({4: 0.010, 8: 0.012, 16: 0.020})
    rows = [_row(4, 3.0), _row(8, 1.0), _row(0, 0.0), _row(0, 0.0)]
    choose_drafts(rows, cost)
    assert [r.verified for r in rows] == [True, False, False, False]
    # the better draft per node goes first, whatever the rows' order
    rows = [_row(8, 1.0), _row(4, 3.0), _row(0, 0.0), _row(0, 0.0)]
    choose_drafts(rows, cost)
    assert [r.verified for r in rows] == [False, True, False, False]
    # cheap wide passes (a GPU): both drafts go
    rows = [_row(4, 3.0), _row(8, 1.0)]
    choose_drafts(rows, _cost(dict.fromkeys((2, 6, 14), 0.010)))
    assert [r.verified for r in rows] == [True, True]
    # a draft that must be verified (a non-adaptive request) goes first; the others are judged after it
    rows = [_row(8, 0.0, always_verify=True), _row(2, 0.1), _row(0, 0.0), _row(0, 0.0)]
    choose_drafts(rows, cost)
    assert [r.verified for r in rows] == [True, False, False, False]
    # a draft worth its nodes is verified even when another row's draft makes the step's tokens per
    # second higher than this draft's (F = t(4) / 4 = 2.5 ms; the second adds t(12) - t(8) = 2 ms for 1 token)
    linear = _cost({4: 0.010, 8: 0.012, 12: 0.014})
    rows = [_row(4, 3.0), _row(4, 1.0), _row(0, 0.0), _row(0, 0.0)]
    choose_drafts(rows, linear)
    assert [r.verified for r in rows] == [True, True, False, False]
    rows = [_row(4, 3.0), _row(4, 0.7), _row(0, 0.0), _row(0, 0.0)]
    choose_drafts(rows, linear)  # 0.7 x 2.5 = 1.75 ms < 2 ms: skipped
    assert [r.verified for r in rows] == [True, False, False, False]


@pytest.mark.parametrize("calibration,score,nodes,verified",
                         [(0.3, 1.0, 8, False), (0.8, 1.0, 8, True), (1.0, 0.0, 1, False), (1.0, 5.0, 8, True)])
def test_one_row_is_the_one_request_rule(calibration, score, nodes, verified):
    """With one row, choose_drafts is ``(1 + expected) * t(1) >= t(1 + nodes)`` (t(1) = 4, t(9) = 6)."""
    cost = _cost({1: 4.0, 1 + nodes: 4.0 + 0.25 * nodes})
    gate = DraftGate(Policy(explore_every=100, max_explore_every=100))
    gate.calibration = calibration
    rows = [RowDraft(nodes, gate.expected(score), gate=gate)]
    choose_drafts(rows, cost)
    assert rows[0].verified is verified and not rows[0].explored


def test_nothing_optional_is_verified_before_a_plain_pass_was_measured():
    rows = [_row(4, 10.0), _row(4, 0.0, always_verify=True)]
    choose_drafts(rows, PassCost())
    assert [r.verified for r in rows] == [False, True]


def test_exploration_is_cost_aware_and_backs_off_alone_and_in_a_batch():
    """A draft that never pays is verified once the plain row steps skipped since the last verified
    draft cost ``interval`` times what it adds (F = 1 s a row, the draft adds 2 s: interval 2 -> after
    4 skips, then 8, 16 (the cap)), whether its row is alone or shares passes; an accepted token
    resets the interval (DraftGate.observe)."""
    policy = Policy(explore_every=2, max_explore_every=8)
    for rows_in_batch in (1, 4):
        gate = DraftGate(policy)
        cost = _cost({rows_in_batch: float(rows_in_batch), rows_in_batch + 4: rows_in_batch + 2.0})

        def steps(n: int, accepted: int = 0, gate=gate, cost=cost, rows_in_batch=rows_in_batch) -> list[int]:
            out = []
            for step in range(n):
                rows = [RowDraft(4, 0.1, gate=gate)] + [_row(0, 0.0) for _ in range(rows_in_batch - 1)]
                choose_drafts(rows, cost)
                if rows[0].verified:
                    assert rows[0].explored
                    out.append(step)
                    gate.observe(0.1, accepted)
            return out

        assert steps(30) == [3, 11, 27], rows_in_batch  # 4, 8, 16 steps apart
        assert steps(32) == [13, 29]  # 16 apart (the cap), counting the two steps skipped before
        assert steps(16, accepted=1) == [13]  # an exploration that was accepted...
        assert steps(16) == [1, 9]  # ...resets the interval to 2 (4 steps; then 8 after this miss)


def test_expected_is_a_query():
    """DraftGate.expected changes nothing (it used to widen the shapes hopeless considers)."""
    gate = DraftGate()
    gate.top_mass = [0.2, 0.3, 0.35, 0.4, 0.42, 0.44, 0.46, 0.48]
    before = dict(vars(gate))
    gate.expected(5.0, (6, 1, 3))
    gate.ceiling(6, 1, 3)
    gate.hopeless(32, StepCost(_linear(0.1)))
    gate.explore_due(0.01, 0.1)
    assert vars(gate) == before
    gate.judged(False, shape=(6, 1, 3))  # recording a judged draft widens them
    assert gate.widest == 6


def test_calibration_tracks_acceptance_and_learns_fast_at_first():
    gate = DraftGate()
    gate.observe(score=4.0, accepted=0)
    assert gate.calibration == pytest.approx(0.5)  # a running mean of 1.0 (prior) and 0.0
    gate.observe(score=4.0, accepted=0)
    assert gate.calibration == pytest.approx(1 / 3)
    gate = DraftGate()
    for _ in range(30):
        gate.observe(score=4.0, accepted=1)
    assert gate.calibration == pytest.approx(0.25, abs=0.01)


def test_ceiling_caps_a_deterministic_draft_by_the_targets_sharpness():
    """The docstring's worked example: top-1 mass 0.2, a chain of 8 scoring 5, t(9) = 1.8 t(1)."""
    gate = DraftGate()
    assert gate.ceiling(1, 1, 8) is None and gate.expected(5.0, (1, 1, 8)) == 5.0  # nothing sampled yet
    gate.top_mass = [0.2, 0.3, 0.35, 0.4, 0.42, 0.44, 0.46, 0.48]
    assert gate.ceiling(1, 1, 8) == pytest.approx(0.2 * (1 - 0.2**8) / 0.8)  # 0.25
    assert gate.ceiling(2, 1, 1) == pytest.approx(0.3)  # two first branches: the top-2 mass
    assert gate.ceiling(9, 1, 1) == pytest.approx(1.0)  # wider than the masses kept: no bound
    cost = _linear(0.1)
    capped = [RowDraft(8, gate.expected(5.0, (1, 1, 8)), gate=gate)]
    with_q = [RowDraft(8, gate.expected(5.0), gate=gate)]  # a draft with q: judged by its score alone
    choose_drafts(capped, cost)
    choose_drafts(with_q, cost)
    assert not capped[0].verified and with_q[0].verified


def test_sharpness_is_a_moving_average_of_sampled_positions():
    gate = DraftGate()
    gate.observe_target(())  # a greedy step reports nothing
    assert gate.top_mass is None
    gate.observe_target([0.2, 0.4])  # from a prior of 1 (the target may be sure), weight 0.3
    assert gate.top_mass == pytest.approx([0.76, 0.82])
    gate.observe_target([1.0, 0.5])
    assert gate.top_mass == pytest.approx([0.832, 0.724])


def test_hopeless_when_no_draft_shape_can_pay_for_its_nodes():
    flat = [0.2, 0.3, 0.35, 0.4, 0.42, 0.44, 0.46, 0.48]
    step = StepCost(_linear(0.45))  # t(2) = 1.45 t(1), as measured for one node on this CPU
    gate = DraftGate()
    assert not gate.hopeless(32, step)  # sharpness unknown
    gate.top_mass = flat
    assert gate.hopeless(32, step)  # one node would need top-1 mass 0.45; every wider or deeper draft costs more
    sharp = DraftGate()
    sharp.top_mass = [0.5] + flat[1:]
    assert not sharp.hopeless(32, step)  # 0.5 t(1) >= t(2) - t(1)
    # concave costs (as measured: 4 nodes cost little more than one): four first branches holding
    # 0.6 of the mass pay for t(5) = 1.53 even though no single node does
    concave = StepCost(_cost({1: 1.0, 2: 1.45, 5: 1.53, 17: 2.18, 33: 2.82}))
    wide = DraftGate()
    wide.top_mass = [0.2, 0.35, 0.45, 0.6, 0.62, 0.64, 0.66, 0.68]
    assert wide.hopeless(32, concave)  # no draft with more than two first branches seen yet
    wide.judged(False, shape=(4, 1, 1))  # a draft with four: the shape is possible
    assert not wide.hopeless(32, concave)
    assert wide.hopeless(3, concave)  # a budget of 3 allows three branches at most: 0.45 < t(4) - t(1) = 0.50


def test_choose_drafts_caps_deterministic_drafts_by_the_targets_sharpness():
    """A sampled row whose target spreads its mass cannot expect the tokens its suffix draft scores;
    the same draft on a row whose sharpness is not known is verified."""
    cost = _cost({2: 0.010, 10: 0.012, 18: 0.014})
    unsure, fresh = DraftGate(), DraftGate()
    for _ in range(30):  # the moving averages start from a prior of 1
        unsure.observe_target([0.2 + 0.05 * k for k in range(8)])
    assert unsure.expected(5.0, (1, 1, 8)) < 0.5 < fresh.expected(5.0, (1, 1, 8)) == 5.0
    draft = Draft.chain(list(range(10, 18)), "prompt", score=5.0)
    rows = [RowDraft(8, g.expected(5.0, g.shape_of(draft)), gate=g, shape=g.shape_of(draft)) for g in (unsure, fresh)]
    choose_drafts(rows, cost)
    assert [r.verified for r in rows] == [False, True]
    sampled = Draft.chain(list(range(10, 18)), SOURCE_DRAFT_MODEL, score=5.0)
    sampled.q, sampled.planned = torch.full((8, 32), 1 / 32), 8
    assert unsure.shape_of(sampled) is None  # a draft with q is never judged by its (sampled) shape


def _measured(gate: ProposerGate, i: int, seconds: float, accepted: int, sources: set[str]) -> ProposerGate:
    """Two calls observed (the first call's time is not taken: lazy set-up)."""
    for _ in range(2):
        gate.observe(i, seconds, accepted, sources)
    return gate


def _gate_with(seconds: float, accepted: float, policy: Policy = Policy()) -> ProposerGate:
    return _measured(ProposerGate(policy), 0, seconds, int(accepted), {"draft_model"})


def test_a_proposers_first_call_is_not_timed():
    """The suffix index's first call in a process built its index lazily (345 ms, then 0.2 ms a call):
    its time does not make the proposer look costly."""
    gate = ProposerGate()
    gate.observe(0, 0.345, 0, {"prompt"})
    assert gate.record(0).seconds is None and gate.should_call(0, 0.110)
    gate.observe(0, 0.0002, 0, {"prompt"})
    assert gate.record(0).seconds == pytest.approx(0.0002) and gate.should_call(0, 0.110)


def test_proposer_gate_skips_a_slow_unhelpful_proposer_and_keeps_a_cheap_one():
    """F = 4 ms: a draft model at 6 ms a call that gets nothing accepted is skipped and explored once the
    steps it sat out cost 8 x 6 ms (12 steps); the suffix index at 0.1 ms (cheap) always runs."""
    gate = _measured(ProposerGate(), 0, 0.006, 0, {"draft_model"})
    _measured(gate, 1, 0.0001, 0, {"prompt"})
    calls = [step for step in range(30) if gate.should_call(0, 0.004)]
    assert calls == [11, 23]
    assert all(gate.should_call(1, 0.004) for _ in range(8))
    gate.observe(0, 0.006, 3, {"draft_model"})  # it paid: accepted * F = 0.6 * 4 ms... and again
    for _ in range(10):
        gate.observe(0, 0.006, 3, {"draft_model"})
    assert gate.should_call(0, 0.004)


def test_proposer_explorations_back_off_and_count_the_setup():
    """Each fruitless exploration doubles the interval (8, 16, 32, 64 times the call's cost); a one-off
    setup (a draft model's prompt prefill) counts in what an exploration costs."""
    gate = _gate_with(0.004, 0)
    calls = []
    for step in range(200):
        if gate.should_call(0, 0.004):
            calls.append(step)
            gate.observe(0, 0.004, 0, {"draft_model"})
    assert calls[:4] == [7, 23, 55, 119]  # after 8, 16, 32, 64 plain steps of 4 ms
    gate = _gate_with(0.004, 0)
    gate.observe(0, 0.004, 0, {"draft_model"}, setup=0.012)  # its prompt prefill cost 3 calls
    assert [s for s in range(40) if gate.should_call(0, 0.004)][:1] == [31]  # 8 x (4 + 12) ms


def test_proposer_gate_charges_a_call_whose_draft_was_skipped():
    """The draft model costs its time even when its drafts are not verified: such calls count 0 accepted
    tokens, so a proposer whose drafts never reach a pass stops being called."""
    gate = ProposerGate()
    for _ in range(20):
        gate.observe(0, 0.006, 0, {"draft_model"})  # its drafts were skipped every time
    assert not gate.should_call(0, 0.010)


def test_proposer_gate_calls_only_cheap_proposers_while_copying():
    gate = _measured(ProposerGate(), 0, 0.0001, 0, {"prompt"})  # the suffix index
    _measured(gate, 1, 0.002, 3, {"draft_model"})  # a draft model that pays for itself
    copy = {"prompt"}  # the last draft, all from the prompt, was accepted to its end
    assert gate.should_call(0, 0.004, copy) and gate.should_call(1, 0.004) and not gate.should_call(1, 0.004, copy)
    assert gate.should_call(1, 0.004, {"prompt", "draft_model"})  # its own draft is being copied
    assert gate.should_call(2, 0.004, copy)  # not measured yet: called


def test_proposer_gate_skips_a_costly_proposer_when_earlier_drafts_fill_the_budget():
    gate = ProposerGate()
    assert not gate.should_call(1, 0.010, promised=16.0, budget=32)  # cost unknown, half the budget promised
    assert gate.should_call(1, 0.010, promised=15.0, budget=32)  # less promised: called (and measured)
    _measured(gate, 1, 0.004, 0, set())  # 4 ms a call: not cheap
    assert not gate.should_call(1, 0.010, promised=20.0, budget=32)
    _measured(gate, 2, 0.0001, 0, set())  # 0.1 ms: cheap (under 5% of a 10 ms step), never skipped
    assert gate.should_call(2, 0.010, promised=32.0, budget=32)


def test_proposer_gate_holds_back_a_held_proposer_even_when_cheap():
    gate = ProposerGate()
    assert not gate.should_call(0, 0.010, held_back=True) and gate.should_call(0, 0.010)  # unmeasured
    _measured(gate, 0, 0.0001, 0, set())  # measured cheap
    assert not gate.should_call(0, 0.010, held_back=True) and gate.should_call(0, 0.010)


def test_proposer_records_are_shared_across_requests_for_deterministic_drafts_only():
    """What one request learned of a deterministic drafter's cost, the next starts from; a drafter with
    q is judged on its own request."""
    shared: dict[int, ProposerRecord] = {}
    first = ProposerGate(shared=shared, deterministic=[True, False])
    _measured(first, 0, 0.006, 0, {"draft_model"})
    _measured(first, 1, 0.006, 0, {"draft_model"})
    second = ProposerGate(shared=shared, deterministic=[True, False])
    assert not second.should_call(0, 0.004)  # known costly and fruitless
    assert second.should_call(1, 0.004)  # unmeasured for this request: called


def test_draft_budget_follows_the_cost_curve():
    """Momentum bounds the budget; the cost curve bounds it where long drafts cost more than they bring
    (the docstring's example), and leaves momentum alone where the curve is flat (a GPU)."""
    curve = {1: 0.070, 2: 0.071, 3: 0.072, 4: 0.073, 5: 0.074, 7: 0.075, 9: 0.077, 13: 0.082, 17: 0.095,
             25: 0.150, 33: 0.230}
    step = StepCost(_cost(curve))
    assert draft_budget(32, 1.5, 0, 0.9, step) == 7  # momentum: 4 + 2 x 1.5
    unsure, sure, copying = (draft_budget(32, 20.0, 16, a, step) for a in (0.6, 0.9, 0.99))
    assert 4 <= unsure <= 6 and unsure < sure <= 12 and sure < copying < 32  # copying: longer, still not 32
    flat = StepCost(_cost({1: 0.01, 33: 0.01}))
    assert draft_budget(32, 20.0, 16, 0.6, flat) == 32
    assert draft_budget(32, 1.5, 0, 0.9, StepCost(PassCost())) == 7  # nothing measured: momentum
    # no sizes to compare (Policy.budget_steps empty): momentum alone, however steep the curve
    assert draft_budget(32, 20.0, 16, 0.6, step, Policy(budget_steps=())) == 32


def test_momentum_budget_is_draft_budgets_first_bound():
    assert momentum_budget(32, 1.5, 0) == 7  # 4 + 2 x 1.5
    assert momentum_budget(32, 0.0, 8) == 18  # a whole draft of 8 accepted: 2 x 8 + 2
    assert momentum_budget(5, 20.0, 16) == 5  # the cap
    assert momentum_budget(32, 0.0, 0) == 4  # the floor


def test_best_chain_prefix_reads_the_drafts_own_probabilities():
    """The docstring's example, a copy that pays far down a steep curve, and nothing measured yet."""
    steep = _cost({1: 0.008, 2: 0.014, 3: 0.0195, 4: 0.025, 5: 0.0305, 9: 0.0525, 17: 0.0965})
    assert best_chain_prefix([0.95, 0.9, 0.5, 0.2], 1.0, steep) == 2
    assert best_chain_prefix([0.98] * 16, 1.0, steep) == 16  # a sure copy: the whole chain
    assert best_chain_prefix([0.98] * 16, 0.3, steep) == 1  # scores not coming true: the head at most
    assert best_chain_prefix([], 1.0, steep) == 0
    assert best_chain_prefix([0.5, 0.4], 1.0, PassCost()) == 2  # nothing measured: the whole chain


def test_pass_cost_medians_follow_new_passes():
    """Medians are taken when read, for the buckets observed since: the curve moves with new passes."""
    cost = _cost({1: 0.010, 9: 0.050})
    assert cost.estimate(1) == pytest.approx(0.010) and cost.estimate(9) == pytest.approx(0.050)
    for _ in range(4):  # a majority of the bucket (3 passes at 50 ms): its median moves
        cost.observe(9, 0.030)
    assert cost.estimate(9) == pytest.approx(0.030) and cost.estimate(1) == pytest.approx(0.010)


def test_policy_validates():
    with pytest.raises(ValueError, match="explore_every"):
        Policy(explore_every=10, max_explore_every=5)
    with pytest.raises(ValueError, match="acceptance_prior"):
        Policy(acceptance_prior=1.0)


def test_a_copy_keeps_drafting_through_one_slow_pass():
    """The busy-machine trace (issue 38): plain passes of 250 ms, then one pass of 2 inputs read 873 ms.
    That one pass no longer makes every larger draft look dear: a 32-node history draft promising 30
    tokens is verified and the budget of a copying request stays long."""
    cost = _cost({1: 0.250}, times=20)
    cost.observe(2, 0.873)  # one pass of 2: a bucket of one
    row = _row(32, 30.0)
    choose_drafts([row], cost)
    assert row.verified and not row.explored
    assert draft_budget(32, 10.0, 8, 0.98, StepCost(cost)) >= 16


# -- a draft model judging its own drafts (ModelDraftJudge, model_draft_length) --------------------------------


def _judge(step_s: float = 0.03, first: float = 0.7) -> ModelDraftJudge:
    judge = ModelDraftJudge(first=first)
    judge.step_s = step_s
    return judge


QWEN = StepCost(_cost({1: 0.230, 2: 0.232, 3: 0.234, 5: 0.240, 9: 0.260, 17: 0.390, 33: 0.570}))  # measured shape


def test_model_draft_judge_follows_the_docstring_example():
    """F = 230 ms, an int8 0.5B draft at 30 ms a token: it drafts, goes on while the reach pays for a forward,
    takes a close runner-up as a branch; in float32 (85 ms) it stops sooner."""
    judge = _judge()
    assert judge.worth(QWEN)
    assert judge.further(0.9 * 0.8 * 0.5, 3, QWEN)  # 83 ms >= 30 + ~3 ms
    assert not judge.further(0.1, 3, QWEN)  # 23 ms < 33 ms
    assert judge.branch(0.3, 1, QWEN) and not judge.branch(0.005, 1, QWEN)
    slow = _judge(step_s=0.085)
    assert slow.further(0.45, 3, QWEN) and not slow.further(0.3, 3, QWEN)


def test_model_draft_judge_without_costs_drafts_and_never_branches():
    judge = ModelDraftJudge()  # step_s unknown
    assert judge.worth(QWEN) and judge.further(0.0, 5, QWEN) and not judge.branch(1.0, 1, QWEN)
    unmeasured = StepCost(PassCost())
    assert _judge().worth(unmeasured) and not _judge().branch(1.0, 1, unmeasured)


def test_model_draft_judge_estimates_an_unmeasured_draft_by_its_bytes():
    """Before its first forward a draft is judged at ``step_ratio`` (its weight bytes over the target's) of the
    plain step; until the target's plain step is measured it waits (no prompt prefill on a guess). A draft at
    0.6 of F with its first token accepted 70% of the time: worth a one-token forward (0.7 F >= 0.6 F + extra),
    not one that first feeds a prompt of 20 forwards; at 0.1 of F it is worth the forward; once measured, the
    measure rules."""
    judge = ModelDraftJudge(first=0.7, step_ratio=0.6)
    assert not judge.worth(StepCost(PassCost()))  # the target's step not measured yet: wait
    assert judge.worth(QWEN) and not judge.worth(QWEN, forwards=20.0)
    assert judge.further(0.95, 1, QWEN) and not judge.further(0.5, 1, QWEN)  # 0.5 x 230 < 138 ms + extra
    cheap = ModelDraftJudge(first=0.7, step_ratio=0.1)
    assert cheap.further(0.5, 1, QWEN)
    cheap.step_s = 0.2  # measured: 200 ms, more than 0.7 x 230 ms
    assert not cheap.worth(QWEN)
    assert ModelDraftJudge(first=0.7).worth(StepCost(PassCost()))  # no estimate, nothing measured: draft


def test_model_draft_judge_declines_then_explores_with_backoff():
    """A draft whose first token is rarely accepted does not pay for its forward: it sits out steps until
    they cost ``interval`` one-token drafts, and the interval doubles after a fruitless exploration and
    comes back after an accepted first token (prose turning into code)."""
    judge = _judge(step_s=0.1, first=0.2)  # 0.2 x 230 = 46 ms < 100 + 2 ms
    decisions = [judge.worth(QWEN) for _ in range(12)]
    assert decisions[:3] == [False] * 3 and True in decisions  # 8 x 102 ms of skipped 230 ms steps: the 4th
    first_explore = decisions.index(True)
    assert judge.explored
    judge.observe(False)  # fruitless: the interval doubles
    assert judge.interval == 16
    gaps = [judge.worth(QWEN) for _ in range(12)]
    assert gaps.index(True) > first_explore
    judge.observe(True)  # a hit: back to the start
    assert judge.interval == Policy().proposer_explore and judge.first > 0.2


def test_model_draft_judge_values_its_tokens_by_what_the_drafts_before_it_promise():
    """Where the suffix index already promises s tokens this step, a model token is worth F / (1 + s): with
    nothing promised the docstring's example stands; with 3 promised a first token accepted 7 times in 10
    (161 ms / 4 = 40 ms) still pays for a 30 ms forward, with 6 (23 ms) it does not, and the chain stops where
    its reach times F / 4 no longer covers a forward. Policy(model_value_shared=False): F everywhere."""
    judge = _judge()
    judge.promised_before = 0.0
    assert judge.worth(QWEN) and judge.further(0.36, 3, QWEN)
    judge.promised_before = 3.0
    assert judge.worth(QWEN) and judge.further(0.9, 3, QWEN) and not judge.further(0.36, 3, QWEN)
    judge.promised_before = 6.0
    assert not judge.worth(QWEN)
    plain_valued = ModelDraftJudge(Policy(model_value_shared=False), first=0.7)
    plain_valued.step_s, plain_valued.promised_before = 0.03, 6.0
    assert plain_valued.worth(QWEN) and plain_valued.further(0.36, 3, QWEN)


def test_model_draft_judge_calibrates_the_drafts_own_confidence():
    """A draft sure of tokens the target rejects (it promised 3 tokens, 1 came true) drafts less far."""
    judge = _judge()
    assert judge.further(0.2, 3, QWEN)
    for _ in range(6):
        judge.observe(True, promised=3.0, accepted=1)
    assert judge.calibration < 0.6 and not judge.further(0.2, 3, QWEN)
    for _ in range(30):
        judge.observe(True, promised=1.0, accepted=9)  # capped: never above 2
    assert judge.calibration == 2.0


def test_model_draft_length_follows_its_docstring_example():
    step = StepCost(_linear(0.004 / 0.230))  # F = 1 s, 4 ms per node at F = 230 ms
    c = 0.030 / 0.230
    assert [model_draft_length(a, c, step, 24) for a in (0.5, 0.8, 0.9)] == [2, 5, 8]
    assert model_draft_length(0.9, None, step, 24) == 24  # costs unknown: the cap
    assert model_draft_length(0.9, c, StepCost(PassCost()), 7) == 7


def test_proposer_gate_leaves_a_self_judging_proposer_to_itself():
    """A draft model whose calls yielded nothing is still called when it judges its own cost (the per-call
    yield switched the 0.5B draft off on HumanEval/2 after its first misses); the held, filled and copying
    rules still apply."""
    gate = _gate_with(0.05, 0.0)
    assert not gate.should_call(0, 0.01)
    assert gate.should_call(0, 0.01, own_judge=True)
    assert not gate.should_call(0, 0.01, own_judge=True, held_back=True)
    assert not gate.should_call(0, 0.01, promised=20.0, budget=32, own_judge=True)
    assert not gate.should_call(0, 0.01, copying={"prompt"}, own_judge=True)
