"""When is a draft worth verifying? A cost model of the verify pass and a calibration of drafts.

A step that verifies ``n`` draft nodes costs ``t(1 + n)`` (one forward over the last token and the
nodes) and yields ``1 + accepted`` tokens; a plain step costs ``t(1)`` and yields one. A draft is
worth it when ``(1 + expected) / t(1 + n) >= 1 / t(1)``. ``expected`` is the proposer's score
(expected accepted tokens) times a per-request calibration: the running ratio of tokens actually
accepted to tokens the scores promised.

Worked example: t(1) = 4 ms, t(9) = 6 ms (measured); a draft of 8 nodes with score 1.0 and
calibration 0.3 promises 0.3 tokens: (1 + 0.3) / 6 = 0.217 < 1 / 4 = 0.25 -> skip it; with
calibration 0.8: 1.8 / 6 = 0.3 -> verify it.

On a GPU, t(n) is nearly flat in n and nearly every draft passes; on a CPU it grows with n and
weak drafts are skipped, so text with little repetition is not slowed down.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any


class VerifyCost:
    """Running estimates of the forward time by number of input tokens (kept for the engine's life)."""

    def __init__(self, prior_slope: float = 0.05) -> None:
        self.times: dict[int, float] = {}  # inputs -> exponential moving average of seconds
        self.prior_slope = prior_slope  # before a size is measured: t(n) ~ t(1) * (1 + slope * (n - 1))

    def observe(self, inputs: int, seconds: float) -> None:
        old = self.times.get(inputs)
        self.times[inputs] = seconds if old is None else 0.8 * old + 0.2 * seconds

    def estimate(self, inputs: int) -> float | None:
        if inputs in self.times:
            return self.times[inputs]
        if 1 not in self.times:
            return None
        sizes = sorted(self.times)
        i = bisect.bisect_left(sizes, inputs)
        base = self.times[1]
        if i < len(sizes) and i > 0:  # interpolate between measured neighbours
            lo, hi = sizes[i - 1], sizes[i]
            w = (inputs - lo) / (hi - lo)
            return (1 - w) * self.times[lo] + w * self.times[hi]
        largest = sizes[-1]
        if largest > 1:  # extrapolate the measured slope
            slope = max(0.0, (self.times[largest] - base) / (largest - 1))
            return self.times[largest] + slope * (inputs - largest)
        return base * (1 + self.prior_slope * (inputs - 1))


class DraftGate:
    """Per-request decision to verify or skip a draft, with occasional exploration.

    ``expected = score x calibration``; ``calibration`` is the mean ratio of accepted to promised
    tokens (score) per verified draft, starting at 1 (trust the scores until told otherwise): a plain
    running mean over the first drafts (weights 1/2, 1/3, 1/4), a moving average (weight ``rate``)
    after. A draft promising 4 tokens that gets none moves it from 1.0 to 0.5 at once, where the
    moving average alone needed three such drafts; at temperature 1.0 those were verify passes each
    costing about 0.6 of a plain step on this CPU.

    A skipped-looking draft is still verified every ``explore`` skipped steps, so the estimate can
    recover when the text starts repeating; an exploration that accepts nothing doubles that interval
    (up to ``max_explore_every``) and any accepted token resets it. With a fixed interval of 8,
    exploring alone cost about 0.6 / 9 = 7% of the plain speed where nothing can be drafted; with
    the doubling it falls under 1% after a few misses.

    On sampled requests the gate also knows how sharp the target is at the request's temperature:
    ``top_mass`` holds moving averages of the mass of the target's 1, 2, ..., 8 likeliest tokens at
    the positions it sampled. A *deterministic* draft (no ``q``: the one-hot rule) moves from a node
    with ``c`` children to one of them only when the target's sample lands on one of those ``c``
    tokens, at most the mass of its ``c`` likeliest; so such a draft can expect no more than
    :meth:`ceiling` tokens, whatever its score says (a suffix match scores what the text repeated,
    not what a temperature-1.5 sampler will repeat). :meth:`hopeless` says when no deterministic draft
    can pay for its verify pass at all; the engine then does not even ask for one.
    Worked example: top-1 mass 0.2 (temperature 1.5), a chain of 8 nodes scoring 5: expected
    ``min(5 x calibration, 0.2 + 0.04 + ...) = 0.25`` tokens; t(9) = 1.8 t(1) -> skipped.

    Lossless only if the decision ignores what a draft with ``q`` sampled: the engine passes
    ``Draft.gate_size()`` (the size planned before sampling) and a score fixed before sampling, and
    the ceiling (which reads a draft's shape) only for drafts without ``q``; the target's sharpness
    comes from positions already sampled.
    Judging the sampled length would verify, say, only chains that stopped after one unlikely
    token, and those tokens are not distributed as ``q`` (issue 19: first-token chi-square
    p = 1e-30 on a toy, tests/test_lossless_gates.py). Past outcomes (calibration, costs, how long
    since the last exploration) are fair.
    """

    def __init__(self, cost: VerifyCost, explore_every: int = 8, max_explore_every: int = 64,
                 rate: float = 0.2, sharpness_rate: float = 0.3) -> None:
        self.cost = cost
        self.calibration = 1.0  # accepted tokens per promised token (score), moving average per draft
        self.explore_every = explore_every  # verify a skipped-looking draft after this many skips...
        self.max_explore_every = max_explore_every  # ...doubling after each fruitless try, up to this
        self.rate = rate  # weight of a new draft in the moving average, once a few are in
        self._observed = 0  # drafts observed
        self._interval = explore_every  # skips before the next exploration
        self._skipped = 0
        self._explored = False  # the last draft passed only to explore
        # sampled requests: moving averages of the mass of the target's k likeliest tokens (k = 1..8)
        # at the positions it sampled, from a prior of 1; None until one is seen (greedy: always None)
        self.top_mass: list[float] | None = None
        self.sharpness_rate = sharpness_rate  # weight of a new position in those averages
        self.widest = 2  # the most first-position branches of a deterministic draft judged so far (hopeless)

    def observe_target(self, top_mass: Sequence[float]) -> None:
        """The mass of the target's likeliest tokens where it just sampled (``VerifyOutcome.top_mass``)."""
        if not top_mass:
            return
        if self.top_mass is None or len(self.top_mass) != len(top_mass):
            # the prior: the target may be sure (as calibration starts at 1), so one unsure first
            # token (an answer's first word) does not hold back the drafts of the next steps, which
            # on a copying request are the ones that copy. (Taking the first position at its word,
            # and holding every unmeasured proposer on the first step, agentic at temperature 0.7
            # fell from 10.5 to 8.4 tokens per forward; 11.0 with this prior, 11.3 without the gate.)
            self.top_mass = [1.0] * len(top_mass)
        r = self.sharpness_rate
        self.top_mass = [(1 - r) * old + r * new for old, new in zip(self.top_mass, top_mass, strict=True)]

    def ceiling(self, root_width: int, width: int, depth: int) -> float | None:
        """The most accepted tokens a deterministic draft can expect at the target's sharpness: with
        ``root_width`` first-position branches, at most ``width`` children per deeper node and
        ``depth`` levels, ``a1 * (1 + a + ... + a^(depth - 1))`` where ``a1`` and ``a`` are the mass
        of the target's ``root_width`` and ``width`` likeliest tokens. None: sharpness not known."""
        m = self.top_mass
        if m is None or depth <= 0:
            return None
        a1 = m[root_width - 1] if 1 <= root_width <= len(m) else 1.0
        a = m[width - 1] if 1 <= width <= len(m) else 1.0
        return a1 * (depth if a >= 1.0 else (1.0 - a ** depth) / (1.0 - a))

    def hopeless(self, budget: int) -> bool:
        """No deterministic draft can pay for its verify pass at the target's current sharpness.

        Checked over the drafts that get the most out of a flat target for their size: ``c`` first
        branches and one path ``d`` deep below one of them (d = 1, 2, 4, ... up to the budget),
        ``c + d - 1`` nodes: hopeless when ``(1 + ceiling) * t(1) < t(c + d)`` for all. ``c`` runs up
        to the widest first level of this request's deterministic drafts so far (``widest``, at least
        2): the ceiling assumes the branches are the target's likeliest tokens, and 8 of those hold
        0.5-0.7 of the mass even at temperature 1.5, which would keep a never-drafted shape "worth it".
        Never before the sharpness and a plain step's time are known."""
        m = self.top_mass
        t1 = self.cost.estimate(1)
        if m is None or t1 is None:
            return False
        d = 1
        while d <= max(1, budget):
            for c in range(1, min(len(m), self.widest, budget - d + 1) + 1):
                ceiling = self.ceiling(c, 1, d)
                tn = self.cost.estimate(c + d)
                if ceiling is not None and tn is not None and (1.0 + ceiling) * t1 >= tn:
                    return False
            d *= 2
        return True

    def shape_of(self, draft: Any) -> tuple[int, int, int] | None:
        """The shape :meth:`expected` caps ``draft`` by: ``draft.gate_shape()`` once the target's
        sharpness is known (sampled requests), else None (greedy requests skip the walk over the draft)."""
        return draft.gate_shape() if self.top_mass is not None else None

    def expected(self, score: float, shape: tuple[int, int, int] | None = None) -> float:
        """Accepted tokens a draft promises: its score times the calibration, capped by :meth:`ceiling`
        for a draft without ``q`` (``shape``: ``Draft.gate_shape()``, None for a draft with ``q``).
        Also what the batched scheduler judges a row's draft by (``batch.choose_drafts``)."""
        expected = max(0.0, score) * self.calibration
        if shape is not None and self.top_mass is not None:
            self.widest = max(self.widest, shape[0])
            ceiling = self.ceiling(*shape)
            if ceiling is not None:
                expected = min(expected, ceiling)
        return expected

    def worth(self, nodes: int, score: float, shape: tuple[int, int, int] | None = None) -> bool:
        """``shape``: (first branches, widest deeper node, depth) of a draft without ``q``, capped by
        :meth:`ceiling`; None for a draft with ``q`` (its shape is what it sampled)."""
        t1, tn = self.cost.estimate(1), self.cost.estimate(1 + nodes)
        if t1 is None or tn is None:
            return False  # the engine's first step: measure a plain step before judging drafts
        if (1.0 + self.expected(score, shape)) * t1 >= tn:
            self._skipped = 0
            self._explored = False
            return True
        self._skipped += 1
        if self._skipped >= self._interval:
            self._skipped = 0
            self._explored = True
            return True
        return False

    def observe(self, score: float, accepted: int) -> None:
        """A verified draft's score and the tokens of it the target accepted."""
        if accepted > 0:
            self._interval = self.explore_every
        elif self._explored:
            self._interval = min(self.max_explore_every, 2 * self._interval)
        self._explored = False
        if score > 0:
            rate = max(self.rate, 1.0 / (2 + self._observed))  # a running mean first, then a moving one
            self.calibration = (1 - rate) * self.calibration + rate * min(4.0, accepted / score)
            self._observed += 1


class ProposerGate:
    """Per request: is a proposer worth its own time? (A draft model's forward passes are not free.)

    A proposer that took ``s`` seconds per call and got ``a`` tokens accepted per call saves about
    ``a * t(1)`` (plain steps avoided); it is skipped while ``a * t(1) < s``, and tried again every
    ``explore_every`` skipped steps. Worked example: t(1) = 4 ms; a draft model taking 6 ms per call
    with 0.5 accepted tokens saves 2 ms < 6 ms -> skipped; the suffix index at 0.1 ms with 0.5
    accepted -> kept. An exploration that gets nothing accepted doubles that proposer's interval (up
    to 8x); an accepted token resets it.

    A proposer cheaper than ``cheap_fraction`` of a plain step is never skipped: skipping it saves
    almost nothing, while one unlucky call (0 accepted) would otherwise switch it off for
    ``explore_every`` steps, and those are often the first steps of a copy (the suffix index on a
    looping or copying output lost 7 of every 8 steps that way). Whether its draft is worth a
    verify pass is :class:`DraftGate`'s call.

    While the output is copying another proposer's draft (the last draft was accepted to its end and
    none of its tokens came from this proposer's sources) a proposer that is not cheap is not
    called: the copy fills the budget on its own, and a draft model's forward passes would only
    add their time (~1.5 ms of a ~30 ms step on the demo models). Likewise when the drafts of the
    proposers called before it promise half the budget (score x calibration; a suffix draft at a
    text seam, an answer start, a long match): then a proposer not known to be cheap (a draft model
    on its first step, whose lazy prefill of the prompt is then never paid) is not called.
    Worked example: budget 32, the suffix draft scores 20, calibration 0.9 -> 18 >= 16: the draft
    model is skipped; calibration 0.5 -> 10: it is called.

    On sampled requests the engine also holds back (``held``) proposers whose drafts are
    deterministic (no ``q``) while :meth:`DraftGate.hopeless` says no such draft could pay for its
    verify pass (cheap or not, their drafts would only be dropped), and, on the request's first step,
    before the target's sharpness is known, those whose next call pays a one-off setup
    (``Proposer.setup_pending``): a draft model's first call feeds it the whole prompt, which at a
    high temperature (nothing accepted) cost about 1.5% of a 128-token request.
    """

    def __init__(self, cost: VerifyCost, explore_every: int = 8, cheap_fraction: float = 0.05,
                 filled_fraction: float = 0.5) -> None:
        self.cost = cost
        self.explore_every = explore_every
        self.cheap_fraction = cheap_fraction  # a proposer costing under this fraction of t(1) always runs
        # a proposer not known to be cheap is not called when the drafts already made promise this
        # fraction of the budget in accepted tokens (their scores times the request's calibration)
        self.filled_fraction = filled_fraction
        self.accepted: dict[int, float] = {}  # proposer index -> running mean of accepted tokens per call
        self.seconds: dict[int, float] = {}  # proposer index -> running mean of seconds per call
        self._skipped: dict[int, int] = {}
        self._interval: dict[int, int] = {}  # skips before the next exploration, doubled after a fruitless one
        self._explored: set[int] = set()  # proposers called this step only to re-measure them
        self.sources: dict[int, set[str]] = {}  # proposer index -> node sources it has drafted
        self.exploring = False  # a proposer was called this step only to re-measure it: verify its draft

    def should_call(self, i: int, copying: frozenset[str] | set[str] = frozenset(), promised: float = 0.0,
                    budget: int = 0, held: bool = False) -> bool:
        """``copying``: the sources of the last step's draft when it was accepted to its end;
        ``promised``: accepted tokens the drafts of the proposers called before this one promise
        (their scores times the request's calibration), of a ``budget`` of draft nodes;
        ``held``: the engine holds this proposer back this step (see the class docstring)."""
        if held:
            return False
        t1 = self.cost.estimate(1)
        measured = t1 is not None and i in self.seconds
        known_cheap = measured and self.seconds[i] <= self.cheap_fraction * t1
        if budget and not known_cheap and promised >= self.filled_fraction * budget:
            return False  # the budget is as good as filled: a costly proposer would add its time only
        cheap = known_cheap or not measured  # unmeasured counts as cheap until its first call is timed
        if copying and not cheap and not copying & self.sources.get(i, set()):
            return False
        if cheap or self.accepted[i] * t1 >= self.seconds[i]:
            self._skipped[i] = 0
            return True
        self._skipped[i] = self._skipped.get(i, 0) + 1
        if self._skipped[i] >= self._interval.get(i, self.explore_every):
            self._skipped[i] = 0
            self.exploring = True
            self._explored.add(i)
            return True
        return False

    def observe(self, i: int, seconds: float, accepted: int, sources: set[str] | None = None) -> None:
        if sources:
            self.sources.setdefault(i, set()).update(sources)
        if accepted > 0:
            self._interval.pop(i, None)
        elif i in self._explored:
            self._interval[i] = min(8 * self.explore_every, 2 * self._interval.get(i, self.explore_every))
        self._explored.discard(i)
        if i not in self.seconds:
            self.seconds[i], self.accepted[i] = seconds, float(accepted)
        else:
            self.seconds[i] = 0.8 * self.seconds[i] + 0.2 * seconds
            self.accepted[i] = 0.8 * self.accepted[i] + 0.2 * accepted
