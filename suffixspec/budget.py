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
    """Per-request decision to verify or skip a draft, with occasional exploration."""

    def __init__(self, cost: VerifyCost, explore_every: int = 8) -> None:
        self.cost = cost
        self.calibration = 1.0  # accepted tokens per promised token, running average
        self.explore_every = explore_every  # verify a skipped-looking draft now and then, to keep learning
        self._skipped = 0

    def worth(self, nodes: int, score: float) -> bool:
        t1, tn = self.cost.estimate(1), self.cost.estimate(1 + nodes)
        if t1 is None or tn is None:
            return False  # the engine's first step: measure a plain step before judging drafts
        expected = max(0.0, score) * self.calibration
        if (1.0 + expected) * t1 >= tn:
            self._skipped = 0
            return True
        self._skipped += 1
        if self._skipped >= self.explore_every:
            self._skipped = 0
            return True
        return False

    def observe(self, score: float, accepted: int) -> None:
        if score > 0:
            self.calibration = 0.8 * self.calibration + 0.2 * min(4.0, accepted / score)
