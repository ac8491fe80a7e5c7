"""threads.py: the thread count chosen by measurement, kept when given, re-checked while decoding."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from suffixspec.core.threads import ThreadPolicy, ThreadTuner, describe


@pytest.fixture
def measured(monkeypatch):
    """Tuners that measure (the test session pins OMP_NUM_THREADS=1, which would fix the count);
    torch's own count restored afterwards."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class FakeClock:
    """Wall seconds that advance by what a pass costs at the thread count torch is set to."""

    def __init__(self, seconds_at: dict[int, float]) -> None:
        self.now = 0.0
        self.seconds_at = seconds_at

    def __call__(self) -> float:
        return self.now

    def run(self) -> None:
        self.now += self.seconds_at[torch.get_num_threads()]


@pytest.mark.parametrize(("seconds_at", "chosen"), [
    ({1: 0.044, 2: 0.031}, 2),  # idle: two threads clearly faster
    ({1: 0.045, 2: 0.120}, 1),  # another busy process: the second thread waits for a preempted one
    ({1: 0.044, 2: 0.041}, 1),  # within the margin: fewer threads (they lose least when load comes)
])
def test_calibrate_keeps_the_faster_count(measured, seconds_at, chosen):
    clock = FakeClock(seconds_at)
    tuner = ThreadTuner(cores=2, clock=clock)
    assert tuner.measuring and tuner.counts == (1, 2)
    tuner.calibrate(clock.run)
    assert tuner.current == chosen and torch.get_num_threads() == chosen
    assert tuner.measured_ms == {1: seconds_at[1] * 1000, 2: seconds_at[2] * 1000}
    assert f"{chosen} thread" in tuner.describe() and "measured at start" in tuner.describe()


def test_a_given_count_is_kept(measured):
    tuner = ThreadTuner(threads=1, cores=2)
    assert not tuner.measuring and tuner.how == "given" and torch.get_num_threads() == 1
    ran = []
    tuner.calibrate(lambda: ran.append(torch.get_num_threads()))
    assert ran == [1]  # the warm-up pass alone, at the given count
    assert tuner.before_pass() == 1
    tuner.after_pass(1, 100.0, 1.0)  # no re-check ever
    assert tuner.before_pass() == 1 and tuner.rechecks == 0
    assert describe(tuner.to_dict()).startswith("1 thread (as given)")
    with pytest.raises(ValueError, match="positive integer"):
        ThreadTuner(threads=0)


def test_omp_num_threads_and_devices_fix_the_count(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert ThreadTuner(cores=4).how == "OMP_NUM_THREADS"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert ThreadTuner(cores=1).counts == (1,)
    gpu = ThreadTuner(device="cuda:0", cores=4)
    assert gpu.counts == () and gpu.before_pass() is None and "torch's count on cuda:0" in gpu.describe()


def _decode(tuner: ThreadTuner, wall_at: dict[int, float], passes: int, shape: float = 1.0) -> list[int]:
    """Run ``passes`` passes through the tuner, each taking ``wall_at[count] * shape``; the counts used."""
    used = []
    for _ in range(passes):
        n = tuner.before_pass()
        used.append(n)
        tuner.after_pass(n, wall_at[n] * shape, shape)
    return used


def test_recheck_moves_to_the_other_count_when_it_is_faster(measured):
    """The docstring's example: load arrives after a start on two threads; the re-check alternates the
    counts (the other first) and moves to one thread; the next re-check waits at least 20x its loss."""
    clock = FakeClock({1: 0.044, 2: 0.031})
    policy = ThreadPolicy(recheck_s=0.95)
    tuner = ThreadTuner(cores=2, clock=clock, policy=policy)
    tuner.calibrate(clock.run)
    assert tuner.current == 2
    busy = {1: 0.046, 2: 0.100}
    used = _decode(tuner, busy, 10 + 6)  # 10 passes of 0.1 s reach recheck_s, then 6 alternate
    assert used[10:] == [1, 2, 1, 2, 1, 2]
    assert tuner.current == 1 and tuner.switches == 1 and tuner.rechecks == 1
    # the passes after it run at the new count, until the next re-check (recheck_s again after a switch)
    assert _decode(tuner, busy, 5) == [1] * 5
    assert "switched 1 time since" in tuner.describe()


def test_recheck_keeps_the_count_and_backs_off(measured):
    """A re-check that finds the other count slower keeps the choice and doubles the interval; a pass
    that fed a prompt (shape None) is not compared, and the same count runs the next pass."""
    policy = ThreadPolicy(recheck_s=0.99, max_recheck_s=4.0, recheck_cost=1.0)
    tuner = ThreadTuner(cores=2, policy=policy)
    tuner.current = 1
    walls = {1: 0.05, 2: 0.07}  # slower, but not collapsing (a re-check runs all its passes)
    _decode(tuner, walls, 20)  # 1.0 s of passes at 0.05 s
    n = tuner.before_pass()
    assert n == 2  # the re-check starts with the other count
    tuner.after_pass(n, 5.0, None)  # a prompt rode in this pass: not comparable
    assert tuner.before_pass() == 2
    _decode(tuner, walls, 6)
    assert tuner.current == 1 and tuner.rechecks == 1 and tuner._interval == 1.98
    # the next re-check comes after 1.98 s of passes (40 at 0.05 s), not 0.99 s
    assert set(_decode(tuner, walls, 39)) == {1}
    assert _decode(tuner, walls, 2)[-1] == 2


def test_recheck_compares_passes_of_any_size(measured):
    """Wall times are divided by the pass's shape: big passes at the other count are not held against it."""
    tuner = ThreadTuner(cores=2, policy=ThreadPolicy(recheck_s=0.1))
    tuner.current = 1
    _decode(tuner, {1: 0.05, 2: 0.03}, 2)
    for n, wall, shape in ((2, 0.09, 3.0), (1, 0.05, 1.0), (2, 0.03, 1.0), (1, 0.15, 3.0), (2, 0.06, 2.0),
                           (1, 0.05, 1.0)):
        assert tuner.before_pass() == n
        tuner.after_pass(n, wall, shape)
    assert tuner.current == 2  # 0.03 per plain pass against 0.05


def test_hold_stops_rechecks(measured):
    tuner = ThreadTuner(cores=2, policy=ThreadPolicy(recheck_s=0.1))
    tuner.current = 2
    tuner.hold()
    assert not tuner.measuring and set(_decode(tuner, {2: 1.0}, 5)) == {2}


def test_load_that_arrives_starts_a_recheck_at_once(measured):
    """The docstring's example: two threads chosen, then passes at two threads slow down (spinning
    threads wait for a preempted one): three slow passes of the latest four start the re-check at once, long before
    recheck_s, and it moves to one thread; then the baseline starts again at the new count."""
    tuner = ThreadTuner(cores=2, policy=ThreadPolicy(recheck_s=240.0))
    tuner.current = 2
    assert set(_decode(tuner, {1: 0.030, 2: 0.020}, 17)) == {2}  # the baseline: 20 ms per plain pass
    busy = {1: 0.046, 2: 0.100}
    assert _decode(tuner, busy, 3) == [2, 2, 2]  # three slow passes (5x the median) among the latest four...
    assert _decode(tuner, busy, 6) == [1, 2, 1, 2, 1, 2]  # ...start the re-check now
    assert tuner.current == 1 and tuner.switches == 1
    assert set(_decode(tuner, {1: 0.046, 2: 0.100}, 40)) == {1}  # at one thread a slow pass starts nothing


def test_a_recheck_ends_at_the_first_collapsing_pass(measured):
    """One thread chosen on a busy machine: the periodic re-check's first pass at two threads takes 10x
    the recent median, so the re-check ends there (five more passes would lose as much again each)."""
    tuner = ThreadTuner(cores=2, policy=ThreadPolicy(recheck_s=0.48))
    tuner.current = 1
    assert set(_decode(tuner, {1: 0.05, 2: 0.5}, 10)) == {1}  # 0.5 s of passes: the re-check is due
    assert _decode(tuner, {1: 0.05, 2: 0.5}, 3) == [2, 1, 1]
    assert tuner.current == 1 and tuner.rechecks == 1 and tuner._until_recheck > 8  # 20x the 0.45 s lost, less 2 passes


@pytest.mark.parametrize(("walls", "rechecks"), [
    ([0.020] * 16 + [0.100, 0.100, 0.030], False),  # two slow passes, then a normal one: a hiccup
    ([0.020] * 16 + [0.028] * 4, False),  # slower, but less than 1.5x the median (shape noise, context growth)
    ([0.020] * 16 + [0.100, 0.020, 0.100, 0.020], False),  # two slow of the latest four
    ([0.020] * 16 + [0.100, 0.020, 0.100, 0.100], True),  # three of four: erratic, as spinning threads are
    ([0.020] * 10 + [0.100] * 3, False),  # too few passes for a baseline
])
def test_a_hiccup_starts_no_recheck(measured, walls, rechecks):
    tuner = ThreadTuner(cores=2, policy=ThreadPolicy(recheck_s=240.0))
    tuner.current = 2
    for w in walls:
        n = tuner.before_pass()
        assert n == 2
        tuner.after_pass(n, w, 1.0)
    assert (tuner.before_pass() == 1) is rechecks


@pytest.mark.parametrize(("seconds_at", "passes"), [
    ({1: 0.045, 2: 0.100}, [1, 2, 1, 2]),  # 2.2x in the first round: a warm-up at each count, then one round
    ({1: 0.045, 2: 0.900}, [1, 2]),  # 20x (spinning threads on a busy machine): the warm-ups decide
])
def test_a_collapsing_count_ends_the_start_up_probe_early(measured, seconds_at, passes):
    """Two threads much slower than one: no further rounds are run (they would only lose time on a busy
    machine), one thread is chosen."""
    clock = FakeClock(seconds_at)
    ran = []
    tuner = ThreadTuner(cores=2, clock=clock)
    tuner.calibrate(lambda: (ran.append(torch.get_num_threads()), clock.run()))
    assert ran == passes
    assert tuner.current == 1 and tuner.measured_ms == {n: 1000 * s for n, s in seconds_at.items()}


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "None OpenMP's default wait"),  # suffixspec leaves OpenMP's wait alone
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "PASSIVE OMP_WAIT_POLICY=PASSIVE (from the environment)"),
])
def test_the_wait_policy_is_openmps_and_stated(env, expected):
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = ("import suffixspec, os; from suffixspec.core.threads import wait_policy; "
            "print(os.environ.get('OMP_WAIT_POLICY'), wait_policy())")
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == expected


def test_switching_counts_while_decoding_keeps_the_output(measured, tiny_model_dirs):
    """A tuner that re-checks at every chance: the passes run at both counts, each count's passes feed a
    cost curve of their own, and the output is plain decoding's, token for token."""
    from doubles import OracleProposer

    from suffixspec.config import SamplingParams
    from suffixspec.loading import load_model
    from suffixspec.runtimes.engine import Engine

    target = load_model(str(tiny_model_dirs["llama"]))
    plain_engine = Engine(target, threads=1)
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = plain_engine.generate("def add(a, b):", sp, speculation=False)
    engine = Engine(target, [OracleProposer(plain.token_ids, plain_engine.vocab_size, corrupt_every=3)])
    engine.threads = ThreadTuner(cores=2, policy=ThreadPolicy(recheck_s=1e-9, recheck_passes=2, recheck_cost=0.0))
    engine.warm_up()
    assert engine.threads.measured_ms.keys() == {1, 2}
    out = engine.generate("def add(a, b):", sp)
    assert out.token_ids == plain.token_ids
    assert engine.threads.rechecks >= 3
    sched = engine.scheduler
    curves = {sched._cost_threads: sched.cost, **sched._costs}
    assert {n for n, c in curves.items() if c.estimate(1) is not None} == {1, 2}
