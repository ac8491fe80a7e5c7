"""The engine's decisions in one place: which drafts a pass verifies, which proposers run, how long
a draft may be. Every constant is a named, commented field of :class:`Policy`.

A pass over ``R`` rows feeds every row's root (its last committed token) plus the nodes of the
drafts it verifies, ``inputs`` tokens in all, and costs ``t(inputs)`` (:class:`PassCost`, measured
in the calling thread's CPU time (:func:`cpu_clock`) and read as low quantiles, so a busy machine's
wall clock and slow passes do not swing the decisions). A
row's plain step costs its share ``F = t(R) / R`` and yields one token; a draft of ``n`` nodes adds
``t(inputs + n) - t(inputs)`` to the pass and promises ``expected`` tokens, each sparing the row
about ``F`` later. So a draft is verified when ``expected * F >= t(inputs + n) - t(inputs)``
(:func:`choose_drafts`); with one row that is ``(1 + expected) * t(1) >= t(1 + n)``.

Worked example (one row, as measured for SmolLM2-135M at one thread, context ~400):
t(1) = 70 ms, t(9) = 85 ms; a chain of 8 nodes scoring 1.0 with calibration 0.3 promises 0.3
tokens: 0.3 x 70 = 21 ms >= 15 ms -> verified; calibration 0.15: 10.5 ms < 15 ms -> skipped.

Lossless (docs/lossless.md, "Gates and cuts"): every decision here reads what was known before a draft's
tokens were sampled: costs, past outcomes (calibration, acceptance, exploration counters), the
target's sharpness at positions already sampled, a draft's planned size and a score fixed before
sampling (``Draft.gate_size``), and the shape only of drafts without ``q``. Nothing of one row
reaches another's tokens: a row's draft may be skipped because of other rows' drafts (the pass is
shared), which only changes how many passes the row takes, never its tokens. Proposer costs and
yields are shared across requests only for proposers whose drafts carry no ``q`` (their drafts never
change what is sampled).
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


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


def cpu_clock() -> float:
    """Seconds of this thread's CPU time, to measure a pass or a proposer call with: what it would take on
    a machine with nothing else running. Preemption does not move it, and neither do the other OpenMP
    threads of a pass: the calling thread works through its share of every parallel region (and spins
    briefly at its end, which is where a preempted partner shows: the thread tuner then moves to one
    thread within a few passes, ``threads.ThreadTuner``, and the cost curves are kept per count). The
    process's CPU time, read before with more than one thread, also counted the other threads spinning
    for a preempted partner (on a busy machine a pass of 2 inputs read 3.5x one of 1, and drafting stopped).
    Example: a pass at 2 threads taking 31 ms of wall time on an idle machine reads about 30 ms."""
    return time.thread_time()


class PassCost:
    """Time of a target pass by its total inputs (every row's root plus the verified nodes), kept for the
    engine's life. Passes are pooled in buckets of sizes 1, 2, 3-4, 5-8, 9-16, ... (the last
    ``cost_window`` of each); a bucket's point is the median size and the median time of its passes, or
    the size and time of its fastest pass, at most what the prior slope says from the smallest bucket,
    while it holds fewer than ``Policy.cost_min_passes`` (the noise of a CPU clock only adds: a pass slowed
    by another process's use of the caches and memory, a thread that waited for a preempted one; so one
    slow pass in a bucket of one or two says nothing, and the slope it would give is extrapolated to
    every larger draft). The curve through the
    points is made non-decreasing
    and subadditive (a pass of ``m + k`` inputs costs at most a pass of ``m`` plus ``k`` plain passes:
    it never pays to split a pass), interpolated between them, extrapolated with the measured slope above
    the largest and flat below the smallest (a smaller pass still reads every weight). Pooling matters: a
    draft's cost is a difference of two estimates, ``t(inputs + n) - t(inputs)``, and per-size medians of
    a few noisy passes each made decisions swing between runs.

    Example: passes of 1 input took 70, 71, 90 ms (one slowed), of 9 inputs 85 ms: t(1) = 71 ms,
    t(5) = 78 ms, t(17) = 99 ms. A lone pass of 2 inputs reading 250 ms counts as the prior's 74.6 ms
    until two more passes of 2 are measured; their median then, at most t(1) + t(1) = 142 ms."""

    def __init__(self, policy: Policy = DEFAULT) -> None:
        self.policy = policy
        self._buckets: dict[int, deque[tuple[int, float]]] = {}  # (inputs - 1).bit_length() -> (inputs, seconds)
        self._points_of: dict[int, tuple[float, float, int]] = {}  # bucket -> (its point's size, seconds; passes)
        self._stale: set[int] = set()  # buckets observed since their points were taken
        self._points: tuple[list[float], list[float]] | None = None  # (sizes, times), None: recompute

    def observe(self, inputs: int, seconds: float) -> None:
        key = (inputs - 1).bit_length()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = deque(maxlen=self.policy.cost_window)
        bucket.append((inputs, seconds))
        self._stale.add(key)  # points when next read, of the buckets that changed only (a pass every ~10 ms
        self._points = None  # on llama.cpp, and most steps there read no estimate)

    def _curve(self) -> tuple[list[float], list[float]]:
        if self._points is None:
            for key in self._stale:  # only the buckets that changed since the curve was last read
                bucket = self._buckets[key]
                self._points_of[key] = (*_bucket_point(bucket, self.policy.cost_min_passes), len(bucket))
            self._stale.clear()
            sizes: list[float] = []
            times: list[float] = []
            for key in sorted(self._points_of):
                size, t, passes = self._points_of[key]
                if times and passes < self.policy.cost_min_passes:  # a bucket of one or two passes claims
                    t = min(t, times[0] * (1 + self.policy.prior_slope * (size - sizes[0])))  # no more than the prior
                if times:  # a larger pass never costs less (noise between neighbours), nor more than the
                    #        smaller one plus its extra inputs as plain passes (subadditive)
                    t = min(max(t, times[-1]), times[-1] + (size - sizes[-1]) * times[0])
                sizes.append(size)
                times.append(t)
            self._points = sizes, times
        return self._points

    def estimate(self, inputs: int) -> float | None:
        """Seconds of a pass over ``inputs`` inputs, or None before any pass was measured."""
        sizes, curve = self._curve()
        if not sizes:
            return None
        i = bisect.bisect_left(sizes, inputs)
        if i < len(sizes) and sizes[i] == inputs:
            return curve[i]
        if 0 < i < len(sizes):  # interpolate between measured neighbours
            lo, hi = sizes[i - 1], sizes[i]
            w = (inputs - lo) / (hi - lo)
            return (1 - w) * curve[i - 1] + w * curve[i]
        if i == 0:  # below the smallest measured pass: as much (the weights' read does not shrink)
            return curve[0]
        if len(sizes) > 1:  # above the largest: extrapolate the measured slope
            slope = (curve[-1] - curve[0]) / (sizes[-1] - sizes[0])
        else:
            slope = curve[0] * self.policy.prior_slope
        return curve[-1] + slope * (inputs - sizes[-1])


def _bucket_point(bucket: Sequence[tuple[int, float]], min_passes: int) -> tuple[float, float]:
    """A bucket's (size, seconds): the medians of its passes, or its fastest pass while it holds fewer than
    ``min_passes`` (a slow pass is noise more often than a fast one).

    >>> _bucket_point([(17, 0.095), (25, 0.150)], 3), _bucket_point([(9, 0.08), (9, 0.09), (12, 0.5)], 3)
    ((17.0, 0.095), (9.0, 0.09))
    """
    if len(bucket) < min_passes:
        n, t = min(bucket, key=lambda p: p[1])
        return float(n), t
    return float(statistics.median(n for n, _ in bucket)), statistics.median(t for _, t in bucket)


@dataclass
class StepCost:
    """The pass cost as one row of a step of ``rows`` rows sees it."""

    cost: Any  # PassCost (or any object with estimate(inputs) -> seconds | None)
    rows: int = 1  # rows decoding in this step

    def plain(self) -> float | None:
        """A row's share of a pass with no drafts: ``F = t(rows) / rows`` (None: nothing measured yet)."""
        t = self.cost.estimate(self.rows)
        return None if t is None else t / self.rows

    def extra(self, nodes: int, inputs: int | None = None) -> float | None:
        """What ``nodes`` more inputs add to a pass of ``inputs`` (default: every row's root alone)."""
        base = self.rows if inputs is None else inputs
        lo, hi = self.cost.estimate(base), self.cost.estimate(base + nodes)
        return None if lo is None or hi is None else max(0.0, hi - lo)

    def per_node(self, nodes: int) -> float | None:
        """One more verified node's share of what ``nodes`` nodes add (None: not measured yet)."""
        if nodes <= 0 or self.plain() is None:
            return None
        extra = self.extra(nodes)
        return None if extra is None else extra / nodes


class DraftGate:
    """One request's judgement of its drafts: calibration, exploration, the target's sharpness.

    ``expected = score x calibration``; ``calibration`` is the mean ratio of accepted to promised tokens
    (score) per verified draft, starting at 1 (trust the scores until told otherwise): a plain running
    mean over the first drafts (weights 1/2, 1/3, ...), a moving average (``calibration_rate``) after. A
    draft promising 4 tokens that gets none moves it from 1.0 to 0.5 at once.

    Exploration: a draft :func:`choose_drafts` would skip is verified anyway once the plain row steps
    since the last verified draft add up to ``interval`` times what the draft adds to the pass
    (:meth:`explore_due`), so the calibration can recover at a bounded cost; an exploration that accepts
    nothing doubles the interval (up to ``max_explore_every``), any accepted token resets it. Worked
    example: F = 70 ms, a draft adding 35 ms, interval 16: explored after 8 skipped steps, then 16, ...

    Sharpness (sampled requests): ``top_mass`` holds moving averages of the mass of the target's 1, 2, ...,
    8 likeliest tokens at the positions it sampled. A *deterministic* draft (no ``q``: the one-hot rule)
    moves from a node with ``c`` children to one of them only when the target's sample lands on one of
    them, at most the mass of its ``c`` likeliest; so it can expect no more than :meth:`ceiling` tokens,
    whatever its score says, and :meth:`hopeless` says when no such draft can pay at all (the engine then
    does not ask for one). Worked example: top-1 mass 0.2 (temperature 1.5), a chain of 8 scoring 5:
    ``min(5 x calibration, 0.2 + 0.04 + ...) = 0.25`` tokens; t(9) = 1.8 t(1) -> skipped.

    Queries (:meth:`expected`, :meth:`ceiling`, :meth:`hopeless`, :meth:`explore_due`) change nothing;
    :meth:`judged`, :meth:`observe` and :meth:`observe_target` record what happened.
    """

    def __init__(self, policy: Policy = DEFAULT) -> None:
        self.policy = policy
        self.calibration = 1.0  # accepted tokens per promised token (score), averaged over verified drafts
        self._observed = 0  # drafts observed
        self._interval = policy.explore_every  # exploration interval, in multiples of the draft's cost
        self._idle = 0.0  # seconds of plain row steps (F each) since the last verified draft
        self._explored = False  # the last verified draft passed only to explore
        # sampled requests: moving averages of the mass of the target's k likeliest tokens (k = 1..8) at the
        # positions it sampled, from a prior of 1; None until one is seen (greedy: always None)
        self.top_mass: list[float] | None = None
        self.widest = 2  # the most first-position branches of a deterministic draft judged so far (hopeless)

    # -- queries -------------------------------------------------------------------------------------------------
    def expected(self, score: float, shape: tuple[int, int, int] | None = None) -> float:
        """Accepted tokens a draft promises: its score times the calibration, capped by :meth:`ceiling` for
        a draft without ``q`` (``shape``: ``Draft.gate_shape()``; None for a draft with ``q``)."""
        expected = max(0.0, score) * self.calibration
        if shape is not None:
            ceiling = self.ceiling(*shape)
            if ceiling is not None:
                expected = min(expected, ceiling)
        return expected

    def shape_of(self, draft: Any) -> tuple[int, int, int] | None:
        """The shape :meth:`expected` caps ``draft`` by: ``draft.gate_shape()`` once the target's sharpness
        is known (sampled requests), else None (greedy requests skip the walk over the draft)."""
        return draft.gate_shape() if self.top_mass is not None else None

    def ceiling(self, root_width: int, width: int, depth: int) -> float | None:
        """The most accepted tokens a deterministic draft can expect at the target's sharpness: with
        ``root_width`` first-position branches, at most ``width`` children per deeper node and ``depth``
        levels, ``a1 * (1 + a + ... + a^(depth - 1))`` where ``a1`` and ``a`` are the mass of the target's
        ``root_width`` and ``width`` likeliest tokens. None: sharpness not known."""
        m = self.top_mass
        if m is None or depth <= 0:
            return None
        a1 = m[root_width - 1] if 1 <= root_width <= len(m) else 1.0
        a = m[width - 1] if 1 <= width <= len(m) else 1.0
        return a1 * (depth if a >= 1.0 else (1.0 - a ** depth) / (1.0 - a))

    def hopeless(self, budget: int, step: StepCost) -> bool:
        """No deterministic draft can pay for its nodes at the target's current sharpness.

        Checked over the drafts that get the most out of a flat target for their size: ``c`` first branches
        and one path ``d`` deep below one of them (d = 1, 2, 4, ... up to the budget), ``c + d - 1`` nodes:
        hopeless when ``ceiling x F < extra(c + d - 1)`` for all. ``c`` runs up to the widest first level of
        this request's deterministic drafts so far (``widest``, at least 2): 8 of the target's likeliest
        tokens hold 0.5-0.7 of the mass even at temperature 1.5, which would keep a never-drafted shape
        "worth it". Never before the sharpness and a plain step's time are known."""
        m, plain = self.top_mass, step.plain()
        if m is None or plain is None:
            return False
        d = 1
        while d <= max(1, budget):
            for c in range(1, min(len(m), self.widest, budget - d + 1) + 1):
                ceiling = self.ceiling(c, 1, d)
                extra = step.extra(c + d - 1)
                if ceiling is not None and extra is not None and ceiling * plain >= extra:
                    return False
            d *= 2
        return True

    def explore_due(self, extra: float, plain: float) -> bool:
        """Whether a draft adding ``extra`` seconds to the pass, which looks not worth it, is verified
        anyway this step (exploration); ``plain``: this step's plain row step (F), which skipping it costs."""
        return self._idle + plain >= self._interval * extra

    # -- records -------------------------------------------------------------------------------------------------
    def judged(self, verified: bool, explored: bool = False, shape: tuple[int, int, int] | None = None,
               plain: float = 0.0) -> None:
        """A draft of this request was judged: verified (``explored``: only because exploration was due)
        or skipped, its row making a plain step of ``plain`` seconds. ``shape``: a deterministic draft's
        shape (it widens what :meth:`hopeless` considers)."""
        if shape is not None:
            self.widest = max(self.widest, shape[0])
        if verified:
            self._idle = 0.0
            self._explored = explored
        else:
            self._idle += plain

    def observe(self, score: float, accepted: int) -> None:
        """A verified draft's score and the tokens of it the target accepted."""
        if accepted > 0:
            self._interval = self.policy.explore_every
        elif self._explored:
            self._interval = min(self.policy.max_explore_every, 2 * self._interval)
        self._explored = False
        if score > 0:
            rate = max(self.policy.calibration_rate, 1.0 / (2 + self._observed))  # running mean, then moving
            self.calibration = (1 - rate) * self.calibration + rate * min(self.policy.calibration_cap, accepted / score)
            self._observed += 1

    def observe_target(self, top_mass: Sequence[float]) -> None:
        """The mass of the target's likeliest tokens where it just sampled (``VerifyOutcome.top_mass``).

        The prior is 1 (the target may be sure, as calibration starts at 1), so one unsure first token (an
        answer's first word) does not hold back the drafts of the next steps, which on a copying request
        are the ones that copy (taken at its word, agentic at temperature 0.7 fell from 10.5 to 8.4 tokens
        per forward; 11.0 with this prior)."""
        if not top_mass:
            return
        if self.top_mass is None or len(self.top_mass) != len(top_mass):
            self.top_mass = [1.0] * len(top_mass)
        r = self.policy.sharpness_rate
        self.top_mass = [(1 - r) * old + r * new for old, new in zip(self.top_mass, top_mass, strict=True)]


@dataclass
class ProposerRecord:
    """What one proposer's calls cost and yielded (per request, or shared across requests)."""

    seconds: float | None = None  # moving average of CPU seconds per call (setup excluded); None: never timed
    accepted: float = 0.0  # moving average of accepted tokens per call (0 for a call whose draft was skipped)
    setup: float = 0.0  # CPU seconds of its last one-off request setup (a draft model's prompt prefill)
    interval: float = 0.0  # exploration interval in multiples of its call cost (0: the policy's start value)
    idle: float = 0.0  # row-seconds of plain steps it sat out since it last ran
    sources: set[str] = field(default_factory=set)  # node sources it has drafted
    calls: int = 0  # calls observed (the first one's time is not taken: lazy set-up)

    def observe(self, seconds: float, accepted: int, rate: float) -> None:
        self.calls += 1
        if self.calls == 1:  # its first call builds what it needs lazily (the suffix index: 345 ms once, 0.2
            self.accepted = float(accepted)  # ms a call after, on SmolLM2's prompts): its time says nothing
            return
        if self.seconds is None:
            self.seconds, self.accepted = seconds, float(accepted)
        else:
            self.seconds = (1 - rate) * self.seconds + rate * seconds
            self.accepted = (1 - rate) * self.accepted + rate * accepted


class ProposerGate:
    """Per request: is a proposer worth its own time? (A draft model's forward passes are not free.)

    A call costing ``s`` CPU seconds that gets ``a`` tokens accepted saves about ``a x F`` (plain row steps
    avoided, ``F`` as in :class:`StepCost`); the proposer is skipped while ``a x F < s``. A call whose draft
    was not verified yielded nothing (``a`` counts 0 for it): the draft model costs its time even when the
    draft gate drops its drafts, so a proposer whose drafts are not verified stops being called. A skipped
    proposer is explored again once the plain steps it sat out add up to ``interval`` times its call cost
    (its prompt setup included), the interval doubling after a fruitless exploration (see :class:`Policy`):
    exploring costs at most ``1 / interval`` of the time. Worked example: F = 70 ms; a draft model taking
    60 ms per call with 0.5 accepted tokens saves 35 ms < 60 ms -> skipped, explored after 8 x 60 / 70 ~ 7
    steps, then 14, 28, ...; the suffix index at 0.2 ms (cheap: under 5% of F) always runs.

    A proposer that is not known to be cheap is not called while the output copies another proposer's
    draft (the last draft was accepted to its end, none of it from this proposer's sources), nor when
    the drafts made before it promise ``filled_fraction`` of the budget (score x its proposer's trust). The engine
    also holds back (``held``) proposers whose drafts carry no ``q`` while no such draft could pay
    (``DraftGate.hopeless``), and, on a sampled request's first step, those with a setup pending.

    ``shared``: records by proposer index shared by every request of the engine, used for proposers
    whose drafts carry no ``q`` (``deterministic``): what one request learned about a draft model's cost
    and yield, the next need not pay to learn again. Drafts with ``q`` are judged on this request alone.
    """

    def __init__(self, policy: Policy = DEFAULT, shared: dict[int, ProposerRecord] | None = None,
                 deterministic: Sequence[bool] = ()) -> None:
        self.policy = policy
        self.records: dict[int, ProposerRecord] = {}
        for i, det in enumerate(deterministic):
            if det and shared is not None:
                self.records[i] = shared.setdefault(i, ProposerRecord())
        self.exploring = False  # a proposer was called this step only to re-measure it: verify its draft
        self._explored: set[int] = set()

    def record(self, i: int) -> ProposerRecord:
        rec = self.records.get(i)
        if rec is None:
            rec = self.records[i] = ProposerRecord()
        return rec

    def begin_step(self) -> None:
        self.exploring = False

    def should_call(self, i: int, plain: float | None, copying: frozenset[str] | set[str] = frozenset(),
                    promised: float = 0.0, budget: int = 0, held: bool = False, own_judge: bool = False) -> bool:
        """``plain``: a row's plain step (``StepCost.plain()``, CPU seconds); ``copying``: the sources of
        the last draft when it was accepted to its end; ``promised``: accepted tokens the drafts made
        before this one promise, of a ``budget`` of nodes; ``held``: the engine holds it back;
        ``own_judge``: the proposer weighs its own cost against its yield per drafted token (a draft model:
        :class:`ModelDraftJudge`), so its calls' yields are not judged here, where one call that drafted
        one token the index also had, or whose draft another row's pushed out of the pass, counted as a
        fruitless call and switched a draft model agreeing on 94% of tokens off for the rest of a request."""
        if held:
            return False
        rec = self.record(i)
        measured = plain is not None and rec.seconds is not None
        known_cheap = measured and rec.seconds <= self.policy.cheap_fraction * plain
        if budget and not known_cheap and promised >= self.policy.filled_fraction * budget:
            return False  # the budget is as good as filled: a costly proposer would add its time only
        if not measured or known_cheap:
            return True  # unmeasured counts as cheap until its first call is timed
        if copying and not copying & rec.sources:
            return False
        if own_judge:
            return True
        if rec.accepted * plain >= rec.seconds:
            rec.idle = 0.0
            return True
        rec.idle += plain
        interval = rec.interval or self.policy.proposer_explore
        if rec.idle >= interval * (rec.seconds + rec.setup):
            rec.idle = 0.0
            self.exploring = True
            self._explored.add(i)
            return True
        return False

    def observe(self, i: int, seconds: float, accepted: int, sources: set[str], setup: float = 0.0) -> None:
        """Proposer ``i``'s call took ``seconds`` (CPU, setup excluded) and ``accepted`` of its tokens were
        accepted (0 if its draft was not verified); ``setup``: its one-off setup this call, if any."""
        rec = self.record(i)
        rec.sources |= sources
        if setup:
            rec.setup = setup
        if accepted > 0:
            rec.interval = 0.0
        elif i in self._explored:
            rec.interval = min(self.policy.max_proposer_explore, 2 * (rec.interval or self.policy.proposer_explore))
        self._explored.discard(i)
        rec.observe(seconds, accepted, self.policy.proposer_rate)


@dataclass
class RowDraft:
    """One row's draft for the next pass, as :func:`choose_drafts` judges it."""

    size: int  # planned nodes (``Draft.gate_size()``); 0: no draft
    expected: float  # accepted tokens it promises (``DraftGate.expected``)
    must: bool = False  # verified whatever it costs (a non-adaptive request)
    gate: DraftGate | None = None  # the row's gate (exploration), None for a must
    shape: tuple[int, int, int] | None = None  # a deterministic draft's shape (DraftGate.judged)
    verified: bool = False  # the decision
    explored: bool = False  # verified only because the row's exploration was due


def choose_drafts(rows: list[RowDraft], cost: Any) -> None:
    """Decide which rows' drafts one pass verifies (sets ``verified``/``explored``); the one rule for a
    request alone and for a batch.

    A pass costs ``t(inputs)``: every row feeds its root, a verified draft adds its planned nodes. A
    row's plain step costs ``F = t(R) / R`` (its root through the matmuls, and its own attention over its
    cache, which no other row shares) and yields one token; a draft adds ``t(inputs + size) - t(inputs)``
    and promises ``expected`` tokens, each sparing the row about ``F`` later. Drafts are judged in order
    of expected tokens per node, each against the pass as the drafts taken before it left it; drafts that
    must be verified go first. A draft that does not pay is still verified when its row's exploration is
    due (``DraftGate.explore_due``: cost-aware, with its backoff). With one row this is the one-request rule
    ``(1 + expected) * t(1) >= t(1 + nodes)``. Before a plain pass was measured only musts are verified.

    Worked example: 4 rows, t(4) = 10 ms, t(8) = 12 ms, t(16) = 20 ms, so F = 2.5 ms; drafts of planned
    size 4 (expecting 3 tokens) and 8 (expecting 1): the first: 3 x 2.5 = 7.5 >= t(8) - t(4) = 2 ->
    verified; the second: 1 x 2.5 = 2.5 < t(16) - t(8) = 8 -> skipped.
    """
    step = StepCost(cost, len(rows))
    inputs = len(rows)  # every row's root
    for r in rows:
        if r.size and r.must:
            r.verified = True
            inputs += r.size
    plain = step.plain()
    optional = sorted((r for r in rows if r.size and not r.must), key=lambda r: -r.expected / r.size)
    for r in optional:  # stable: equal rates keep the rows' order
        extra = step.extra(r.size, inputs) if plain else None
        if extra is not None and r.expected * plain >= extra:
            r.verified = True
        elif extra is not None and r.gate is not None and r.gate.explore_due(extra, plain):
            r.verified = r.explored = True
        if r.verified:
            inputs += r.size
        if r.gate is not None:
            r.gate.judged(r.verified, r.explored, r.shape, plain or 0.0)


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
    steeply with its inputs (llama.cpp on one CPU thread: t(2) ~ 1.8 t(1)), only the sure head of a draft
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
    second. On this CPU a SmolLM2 step is memory-bound: t(5) is ~7% over t(1), t(17) ~1.7x, t(33)
    3-4x; so at ``a = 0.6`` it picks 4 nodes, at 0.9 about 12, while copying (0.98) 16-24, never the 64
    a GPU's flat curve would allow. Before any pass was measured only (1) applies.

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


# -- model drafts (a draft model judging its own drafts: ModelDraftJudge, model_draft_length) ------------------


class ModelDraftJudge:
    """One request's judgement of a draft model's drafts, from measured costs: whether to draft at all, how
    far, and which runner-up tokens to add as branches.

    Unlike a suffix draft (microseconds), every token of a model draft costs a draft forward pass of
    ``c`` CPU seconds (``step_s``, measured by the drafter), and the value of an accepted token is the plain
    row step ``F`` it spares (:class:`StepCost`). So:

    - **draft at all** (:meth:`worth`) when the draft's first token is accepted often enough to pay for its
      forward and its verification: ``first x F >= c + extra(1)``, ``first`` being the moving average of
      the first token's acceptance in this request (from the drafter's prior over earlier requests). A
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
    yields ``1 + s`` tokens without it, so a token it adds comes only that much sooner. Measured on the Qwen
    pair's whole code edits before this rule: each accepted 0.5B token saved 16 ms of verification and cost 36
    ms to draft, because the suffix index's copy would have drafted most of them a pass later.

    Worked example (Qwen2.5-Coder-1.5B target, F = 230 ms, its 0.5B sibling in int8, c = 30 ms, a verify
    pass of 1 + 8 tokens costing 1.13 F): ``first = 0.8`` -> 184 >= 30 + ~0 ms: draft; after tokens with
    probabilities 0.9, 0.8, 0.5 the reach is 0.36 -> 83 >= 30 + ~4 ms: draft a fourth token; a runner-up
    of probability 0.3 after the first token (reach 0.3 x 1) -> 69 ms >= 4 ms: a branch. The same draft
    model in float32 (c = 85 ms) stops once the reach drops under about 0.4.

    Lossless (docs/lossless.md, "Gates and cuts"): every decision reads costs, past outcomes, and the
    probabilities of tokens already drawn (a node's own token never decides whether that node exists)."""

    def __init__(self, policy: Policy = DEFAULT, first: float = 0.7) -> None:
        self.policy = policy
        self.first = first  # moving average of "the draft's first token was accepted" in this request
        self.step_s: float | None = None  # CPU seconds of one draft forward (the drafter's measure)
        self.interval = policy.proposer_explore  # exploration interval, in one-token drafts' costs
        self.idle = 0.0  # row-seconds of plain steps sat out since the last draft
        self.explored = False  # the last draft was made only to re-measure
        # accepted tokens per token the draft's own probabilities promised (the sum of the reaches along its
        # chains), a moving average from 1: a draft sure of tokens the target rejects drafts less far
        self.calibration = 1.0
        self.others = 0.0  # accepted tokens the drafts before this one promise this step (observe_promise)

    def _costs(self, step: StepCost) -> tuple[float, float] | None:
        """(what an accepted token is worth, a one-node pass's extra cost), or None while not measured."""
        plain, extra = step.plain(), step.extra(1)
        if plain is None or extra is None or self.step_s is None:
            return None
        if self.policy.model_value_shared:
            plain /= 1.0 + max(0.0, self.others)
        return plain, extra

    def worth(self, step: StepCost) -> bool:
        """Whether to draft this step (True while the costs are not measured yet)."""
        costs = self._costs(step)
        if costs is None:
            return True
        plain, extra = costs
        if self.first * plain >= self.step_s + extra:
            self.idle, self.explored = 0.0, False
            return True
        self.idle += step.plain() or 0.0  # the plain steps sat out (their full cost, whatever a token is worth)
        if self.idle >= self.interval * (self.step_s + extra):
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
        return self.calibration * reach * costs[0] >= self.step_s + max(0.0, (hi or 0.0) - (lo or 0.0))

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
