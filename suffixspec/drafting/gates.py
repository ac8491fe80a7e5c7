"""The gates: which drafts a pass verifies (:func:`choose_drafts`, judged per request by :class:`DraftGate`)
and which proposers are called at all (:class:`ProposerGate`). The cost model they read is in
:mod:`.costs`; the package docstring gives the rule in one paragraph."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from suffixspec.drafting.costs import StepCost
from suffixspec.drafting.policy import DEFAULT, Policy


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
        are the ones that copy (docs/benchmarks.md, "Figures behind the policy's defaults")."""
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
        if self.calls == 1:  # its first call builds what it needs lazily (the suffix index builds its
            self.accepted = float(accepted)  # request's index, a thousand calls' worth): its time says nothing
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
    also holds back (``held_back``) proposers whose drafts carry no ``q`` while no such draft could pay
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
                    promised: float = 0.0, budget: int = 0, held_back: bool = False, own_judge: bool = False) -> bool:
        """``plain``: a row's plain step (``StepCost.plain()``, CPU seconds); ``copying``: the sources of
        the last draft when it was accepted to its end; ``promised``: accepted tokens the drafts made
        before this one promise, of a ``budget`` of nodes; ``held_back``: the engine holds it back;
        ``own_judge``: the proposer weighs its own cost against its yield per drafted token (a draft model:
        :class:`ModelDraftJudge`), so its calls' yields are not judged here, where one call that drafted
        one token the index also had, or whose draft another row's pushed out of the pass, counted as a
        fruitless call and switched a draft model agreeing on 94% of tokens off for the rest of a request."""
        if held_back:
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
    always_verify: bool = False  # verified whatever it costs (a non-adaptive request, a re-measured proposer)
    gate: DraftGate | None = None  # the row's gate (exploration), None when always verified
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
    of expected tokens per node, each against the pass as the drafts taken before it left it; drafts always
    verified go first. A draft that does not pay is still verified when its row's exploration is
    due (``DraftGate.explore_due``: cost-aware, with its backoff). With one row this is the one-request rule
    ``(1 + expected) * t(1) >= t(1 + nodes)``. Before a plain pass was measured only those always verified are.

    Worked example: 4 rows, t(4) = 10 ms, t(8) = 12 ms, t(16) = 20 ms, so F = 2.5 ms; drafts of planned
    size 4 (expecting 3 tokens) and 8 (expecting 1): the first: 3 x 2.5 = 7.5 >= t(8) - t(4) = 2 ->
    verified; the second: 1 x 2.5 = 2.5 < t(16) - t(8) = 8 -> skipped.
    """
    step = StepCost(cost, len(rows))
    inputs = len(rows)  # every row's root
    for r in rows:
        if r.size and r.always_verify:
            r.verified = True
            inputs += r.size
    plain = step.plain()
    optional = sorted((r for r in rows if r.size and not r.always_verify), key=lambda r: -r.expected / r.size)
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
