"""proposers.source_gate: a source drafts while its measured yield pays for its nodes and lookups."""

from __future__ import annotations

import pytest

from suffixspec.drafting.proposers.source_gate import SourceGate, SourceYield


def test_worked_example_values():
    gate = SourceGate()
    assert gate.observe(2, 4, 0.0001, 0.070, 0.005, shadow=False) == pytest.approx(2 - 4 * 5 / 70 - 0.1 / 70)
    assert gate.observe(0, 4, 0.0001, 0.070, 0.005, shadow=False) == pytest.approx(-4 * 5 / 70 - 0.1 / 70)
    # without the engine's costs a node counts default_node_cost steps and a lookup nothing
    assert gate.observe(1, 4, 0.5, None, None, shadow=False) == pytest.approx(1 - 4 * gate.default_node_cost)


def test_a_source_that_never_pays_steps_aside_and_is_shadowed_less_and_less():
    gate = SourceGate()
    assert gate.on and gate.look_up()
    steps = 0
    while gate.on:  # its nodes cost a little every step and never bring a token
        gate.observe(0, 3, 0.0, 0.07, 0.005, shadow=False)
        steps += 1
    assert 0 < steps < 100
    lookups = []
    for step in range(400):
        if gate.look_up():
            lookups.append(step)
            gate.observe(0, 3, 0.0, 0.07, 0.005, shadow=True)
    gaps = [b - a for a, b in zip(lookups, lookups[1:])]  # noqa: B905
    assert lookups[0] == gate.min_interval - 1  # the first shadow min_interval steps after stepping aside
    assert gaps[0] == 2 * gate.min_interval and gaps == sorted(gaps) and gaps[-1] == gate.max_interval
    assert not gate.on


def test_a_shadow_that_gains_brings_the_source_back():
    gate = SourceGate()
    while gate.on:
        gate.observe(0, 3, 0.0, 0.07, 0.005, shadow=False)
    for _ in range(3):  # fruitless shadows widen the interval
        while not gate.look_up():
            pass
        gate.observe(0, 3, 0.0, 0.07, 0.005, shadow=True)
    assert gate.interval == 8 * gate.min_interval
    rounds = 0
    while not gate.on:  # the output goes on as the corpus does: every shadow gains a token
        while not gate.look_up():
            pass
        gate.observe(1, 3, 0.0, 0.07, 0.005, shadow=True)
        rounds += 1
    assert gate.interval == gate.min_interval and rounds < 10


def test_requests_start_from_what_the_corpus_has_been_worth():
    shared = SourceYield()
    first = SourceGate(shared)
    for _ in range(300):
        first.observe(0, 4, 0.0, 0.07, 0.007, shadow=False)
    assert shared.value < 0 and shared.steps == 300
    second = SourceGate(shared)  # a later request of the same corpus
    assert not second.on and second.request.value == pytest.approx(shared.value)
    third = SourceGate(SourceYield())  # another corpus: the prior, which lets it draft
    assert third.on


def test_a_paying_source_stays_on_through_a_dry_spell():
    gate = SourceGate()
    for _ in range(20):  # a copied passage: 3 tokens a step for 2 nodes
        gate.observe(3, 2, 0.0, 0.07, 0.005, shadow=False)
    for _ in range(20):  # then the output writes its own text for a while
        gate.observe(0, 2, 0.0, 0.07, 0.005, shadow=False)
    assert gate.on
