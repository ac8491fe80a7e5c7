"""budget.py: the verify-cost model and the draft gate."""

from __future__ import annotations

import pytest

from suffixspec.budget import DraftGate, ProposerGate, VerifyCost


def test_cost_interpolates_and_extrapolates():
    cost = VerifyCost()
    assert cost.estimate(5) is None
    cost.observe(1, 4.0)
    assert cost.estimate(11) == pytest.approx(4.0 * (1 + 0.05 * 10))  # prior slope
    cost.observe(9, 6.0)
    assert cost.estimate(5) == pytest.approx(5.0)
    assert cost.estimate(17) == pytest.approx(8.0)


@pytest.mark.parametrize(
    "calibration,score,nodes,worth",
    [(0.3, 1.0, 8, False), (0.8, 1.0, 8, True), (1.0, 0.0, 1, False), (1.0, 5.0, 8, True)],
)
def test_gate_follows_the_docstring_rule(calibration, score, nodes, worth):
    cost = VerifyCost()
    cost.observe(1, 4.0)
    cost.observe(1 + nodes, 4.0 + 0.25 * nodes)  # t(9) = 6 as in the worked example
    gate = DraftGate(cost, explore_every=100)
    gate.calibration = calibration
    assert gate.worth(nodes, score) is worth


def test_gate_measures_a_plain_step_first_and_explores():
    cost = VerifyCost()
    gate = DraftGate(cost, explore_every=3)
    assert gate.worth(4, 10.0) is False  # nothing measured yet
    cost.observe(1, 1.0)
    cost.observe(5, 10.0)
    assert [gate.worth(4, 0.1) for _ in range(6)] == [False, False, True, False, False, True]


def test_calibration_tracks_acceptance():
    gate = DraftGate(VerifyCost())
    for _ in range(30):
        gate.observe(score=4.0, accepted=1)
    assert gate.calibration == pytest.approx(0.25, abs=0.01)


def test_proposer_gate_skips_a_slow_unhelpful_proposer_and_keeps_a_cheap_one():
    from suffixspec.budget import ProposerGate

    cost = VerifyCost()
    cost.observe(1, 0.004)
    gate = ProposerGate(cost, explore_every=4)
    gate.observe(0, seconds=0.006, accepted=0)  # a draft model whose tokens are never accepted
    gate.observe(1, seconds=0.0001, accepted=1)  # the suffix index
    assert [gate.should_call(0) for _ in range(8)] == [False, False, False, True] * 2
    assert all(gate.should_call(1) for _ in range(8))


def test_proposer_gate_never_skips_a_cheap_proposer_after_a_miss():
    from suffixspec.budget import ProposerGate

    cost = VerifyCost()
    cost.observe(1, 0.004)
    gate = ProposerGate(cost, explore_every=4)
    gate.observe(0, seconds=0.0001, accepted=0)  # the suffix index missed once (2.5% of a step)
    gate.observe(1, seconds=0.0004, accepted=0)  # 10% of a step, never accepted: skipped
    assert all(gate.should_call(0) for _ in range(8))
    assert [gate.should_call(1) for _ in range(4)] == [False, False, False, True]


def test_proposer_gate_calls_only_cheap_proposers_while_copying():
    from suffixspec.budget import ProposerGate

    cost = VerifyCost()
    cost.observe(1, 0.004)
    gate = ProposerGate(cost, explore_every=4)
    gate.observe(0, seconds=0.0001, accepted=0, sources={"prompt"})  # the suffix index
    gate.observe(1, seconds=0.002, accepted=3, sources={"draft_model"})  # a draft model that pays for itself
    copy = {"prompt"}  # the last draft, all from the prompt, was accepted to its end
    assert gate.should_call(0, copy) and gate.should_call(1) and not gate.should_call(1, copy)
    assert gate.should_call(1, {"prompt", "draft_model"})  # the draft model's own draft is being copied
    assert gate.should_call(2, copy)  # not measured yet: called


def test_gate_explores_less_after_fruitless_explorations_and_resets_on_a_hit():
    cost = VerifyCost()
    cost.observe(1, 1.0)
    cost.observe(5, 10.0)  # no draft of 4 nodes is worth a pass: only explorations verify
    gate = DraftGate(cost, explore_every=2, max_explore_every=8)

    def passes(steps: int, accepted: int = 0) -> list[int]:
        out = []
        for step in range(steps):
            if gate.worth(4, 0.1):
                out.append(step)
                gate.observe(0.1, accepted)
        return out

    assert passes(14) == [1, 5, 13]  # after 2 skips, then 4, then 8 (the cap)
    assert passes(16) == [7, 15]
    assert passes(8, accepted=1) == [7]  # an exploration that was accepted...
    assert passes(8) == [1, 5]  # ...resets the interval to 2 (then 4 after this miss)


def test_calibration_learns_fast_at_first():
    gate = DraftGate(VerifyCost())
    gate.observe(score=4.0, accepted=0)
    assert gate.calibration == pytest.approx(0.5)  # a running mean of 1.0 (prior) and 0.0
    gate.observe(score=4.0, accepted=0)
    assert gate.calibration == pytest.approx(1 / 3)


def test_proposer_gate_explores_a_useless_proposer_less_and_less():
    from suffixspec.budget import ProposerGate

    cost = VerifyCost()
    cost.observe(1, 0.004)
    gate = ProposerGate(cost, explore_every=2)
    gate.observe(0, seconds=0.006, accepted=0)
    calls = []
    for step in range(16):
        if gate.should_call(0):
            calls.append(step)
            gate.observe(0, seconds=0.006, accepted=0)
    assert calls == [1, 5, 13]  # intervals 2, 4, 8
    gate.observe(0, seconds=0.006, accepted=2)  # accepted again: back to every 2 (16 without the reset)
    calls = []
    for step in range(8):
        if gate.should_call(0):
            calls.append(step)
            gate.observe(0, seconds=0.006, accepted=0)
    assert calls == [0, 4]  # two skips were pending; then 4 after this miss


def test_proposer_gate_skips_a_costly_proposer_when_earlier_drafts_fill_the_budget():
    cost = VerifyCost()
    cost.observe(1, 0.010)
    gate = ProposerGate(cost)
    assert not gate.should_call(1, promised=16.0, budget=32)  # cost unknown, half the budget promised
    assert gate.should_call(1, promised=15.0, budget=32)  # less promised: called (and measured)
    gate.observe(1, 0.004, 0)  # 4 ms a call: not cheap
    assert not gate.should_call(1, promised=20.0, budget=32)
    gate.observe(2, 0.0001, 0)  # 0.1 ms: cheap (under 5% of a 10 ms step), never skipped
    assert gate.should_call(2, promised=32.0, budget=32)


def _linear_cost(slope: float, sizes: int = 40) -> VerifyCost:
    cost = VerifyCost()
    for n in range(1, sizes + 1):
        cost.observe(n, 1.0 + slope * (n - 1))
    return cost


def test_ceiling_caps_a_deterministic_draft_by_the_targets_sharpness():
    """The docstring's worked example: top-1 mass 0.2, a chain of 8 scoring 5, t(9) = 1.8 t(1)."""
    gate = DraftGate(_linear_cost(0.1), explore_every=100)
    assert gate.ceiling(1, 1, 8) is None  # nothing sampled yet: no ceiling
    assert gate.worth(8, 5.0, (1, 1, 8))
    gate.top_mass = [0.2, 0.3, 0.35, 0.4, 0.42, 0.44, 0.46, 0.48]  # as averaged over many positions
    assert gate.ceiling(1, 1, 8) == pytest.approx(0.2 * (1 - 0.2**8) / 0.8)  # 0.25
    assert gate.ceiling(2, 1, 1) == pytest.approx(0.3)  # two first branches: the top-2 mass
    assert gate.ceiling(9, 1, 1) == pytest.approx(1.0)  # wider than the masses kept: no bound
    assert not gate.worth(8, 5.0, (1, 1, 8))  # (1 + 0.25) < 1.8
    assert gate.worth(8, 5.0)  # a draft with q (no shape): judged by its score alone, 1 + 5 >= 1.8


def test_sharpness_is_a_moving_average_of_sampled_positions():
    gate = DraftGate(VerifyCost())
    gate.observe_target(())  # a greedy step reports nothing
    assert gate.top_mass is None
    gate.observe_target([0.2, 0.4])  # from a prior of 1 (the target may be sure), weight 0.3
    assert gate.top_mass == pytest.approx([0.76, 0.82])
    gate.observe_target([1.0, 0.5])
    assert gate.top_mass == pytest.approx([0.832, 0.724])


def test_hopeless_when_no_draft_shape_can_pay_for_its_nodes():
    flat = [0.2, 0.3, 0.35, 0.4, 0.42, 0.44, 0.46, 0.48]
    gate = DraftGate(_linear_cost(0.45))  # t(2) = 1.45 t(1), as measured for one node on this CPU
    assert not gate.hopeless(32)  # sharpness unknown
    gate.top_mass = flat
    assert gate.hopeless(32)  # one node would need top-1 mass 0.45; every wider or deeper draft costs more
    sharp = DraftGate(_linear_cost(0.45))
    sharp.top_mass = [0.5] + flat[1:]
    assert not sharp.hopeless(32)  # (1 + 0.5) t(1) >= t(2)
    # concave costs (as measured: 4 nodes cost little more than one): four first branches holding
    # 0.6 of the mass pay for t(5) = 1.53 even though no single node does
    concave = VerifyCost()
    for n, t in {1: 1.0, 2: 1.45, 5: 1.53, 17: 2.18, 33: 2.82}.items():
        concave.observe(n, t)
    wide = DraftGate(concave)
    wide.top_mass = [0.2, 0.35, 0.45, 0.6, 0.62, 0.64, 0.66, 0.68]
    assert wide.hopeless(32)  # no draft with more than two first branches seen yet
    wide.worth(4, 1.0, (4, 1, 1))  # a draft with four: the shape is possible
    assert not wide.hopeless(32)
    assert wide.hopeless(3)  # a budget of 3 allows three branches at most: 1 + 0.45 < t(4) = 1.50


def test_proposer_gate_holds_back_a_held_proposer_even_when_cheap():
    cost = VerifyCost()
    cost.observe(1, 0.010)
    gate = ProposerGate(cost)
    assert not gate.should_call(0, held=True) and gate.should_call(0)  # unmeasured
    gate.observe(0, 0.0001, 0)  # measured cheap
    assert not gate.should_call(0, held=True) and gate.should_call(0)
