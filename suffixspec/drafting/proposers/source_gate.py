"""Whether one source of the suffix proposer drafts this step: its measured yield against its cost.

A source such as the document corpus pays only where the output copies from it; elsewhere its nodes
make every verify pass longer and its lookups take time. So its value is measured step by step, by
what the draft would have been without it (the *counterfactual*: the same sources merged without its
drafts): its **gain** is the tokens the output accepted from the draft with it beyond those it would
have accepted from the draft without it (negative when its nodes pushed better ones out of the
budget), its **cost** the nodes it added times the cost of a verified node, plus its lookup time,
both in plain decoding steps (``node_s / plain_s`` per node, ``lookup_s / plain_s``): a step is worth
``gain - cost`` steps saved. The engine tells the proposer what a plain step and a verified node cost
(``Proposer.observe_costs``); without it a node counts ``default_node_cost`` steps and a lookup nothing.

Drafts of a deterministic source may be judged on anything (docs/design.md, "Gates and cuts"), so the
value is averaged per request (moving, weight ``rate``) and per corpus across requests (weight
``shared_rate``); a request starts from the corpus' average. While the request's average is negative
the source is left out of the draft. It is then looked up in the *shadow* every ``interval`` steps
(its draft merged only in the counterfactual, to be measured: the draft with it against the one the
engine verified), the interval doubling after each shadow that gained nothing, up to
``max_interval``, and back to ``min_interval`` when one gained. A shadow can only see as far as the
output went: its gain is at most the tokens the step produced beyond the verified draft's, a lower
bound, so a source that would pay comes back on.

Worked example (plain step 70 ms, a node 5 ms, a lookup 0.1 ms): a step where the draft with the
documents accepted 3 tokens, without them 1, and the documents added 4 nodes: value ``2 - 4 x 5 / 70 -
0.1 / 70 = 1.71``; a step where they added 4 nodes for nothing: ``-0.29``. After a run of such steps the
average turns negative: the documents step aside; a shadow 4 steps later shows a gain of 1 (the
output went on as the corpus does): value ``1 - 0.29 = 0.71`` brings the average back up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR = 0.25  # a source's value before it is measured, in plain steps per step: it pays a little


@dataclass
class SourceYield:
    """A source's measured value per step (plain steps saved), as a moving average from a prior."""

    value: float = PRIOR  # moving average of gain - cost per step, in plain steps
    steps: int = 0  # steps measured

    def observe(self, value: float, rate: float) -> None:
        self.value += rate * (value - self.value)
        self.steps += 1

    def forget(self) -> None:
        """Back to the prior: what was measured is about a corpus that has changed since (documents
        added or removed may hold what the next outputs copy). In place: forks share the object."""
        self.value, self.steps = PRIOR, 0


@dataclass
class SourceGate:
    """Per request: does the source draft this step? (See the module docstring.)

    ``shared``: the corpus' record across requests (forks of one proposer share it).
    """

    shared: SourceYield = field(default_factory=SourceYield)  # this corpus across requests
    # weight of a step in the request's average: a source's gains come in runs (the output copies a passage,
    # then writes its own), so the average must outlast a few dozen steps without one
    rate: float = 0.05
    shared_rate: float = 0.01  # weight of a step in the corpus' average
    min_interval: int = 4  # steps between shadow lookups while the source is left out...
    max_interval: int = 64  # ...doubling after a fruitless one, up to this
    default_node_cost: float = 0.05  # plain steps a verified node costs when the engine has not said
    request: SourceYield = field(init=False)  # this request
    interval: int = field(init=False)  # current shadow interval
    idle: int = field(init=False)  # steps left out since the last lookup

    def __post_init__(self) -> None:
        self.begin()

    def begin(self) -> None:
        """A request starts: its average from the corpus' (it pays where it has been paying)."""
        self.request = SourceYield(self.shared.value)
        self.interval, self.idle = self.min_interval, 0

    @property
    def on(self) -> bool:
        """Whether the source's drafts go into this step's draft (its average is not negative)."""
        return self.request.value >= 0.0

    def look_up(self) -> bool:
        """Whether to look the source up this step: when on, always; when left out, every ``interval``
        steps (a shadow lookup). Counts the step."""
        if self.on:
            self.idle = 0
            return True
        self.idle += 1
        if self.idle >= self.interval:
            self.idle = 0
            return True
        return False

    def observe(self, gain: int, nodes: int, lookup_s: float, plain_s: float | None, node_s: float | None,
                shadow: bool) -> float:
        """One measured step: the source's ``gain`` in accepted tokens (counterfactual), the ``nodes`` it
        added to the draft and its lookup's CPU seconds; ``plain_s``/``node_s``: what a plain step and a
        verified node cost (None: not known). Returns the step's value in plain steps."""
        if plain_s and plain_s > 0 and node_s is not None:
            cost = nodes * node_s / plain_s + lookup_s / plain_s
        else:
            cost = nodes * self.default_node_cost
        value = gain - cost
        self.request.observe(value, self.rate)
        self.shared.observe(value, self.shared_rate)
        if shadow:
            self.interval = self.min_interval if gain > 0 else min(self.max_interval, 2 * self.interval)
        return value
