"""What a target pass costs: :class:`PassCost` (seconds by inputs, learned from measured passes) and
:class:`StepCost` (that cost as one row of a step sees it), measured with :func:`cpu_clock`."""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from suffixspec.drafting.policy import DEFAULT, Policy


def cpu_clock() -> float:
    """Seconds of this thread's CPU time, to measure a pass or a proposer call with: what it would take on
    a machine with nothing else running. Preemption does not move it, and neither do the other OpenMP
    threads of a pass: the calling thread works through its share of every parallel region (and spins
    briefly at its end, which is where a preempted partner shows: the thread tuner then moves to one
    thread within a few passes, ``threads.ThreadTuner``, and the cost curves are kept per count). The
    process's CPU time, read before with more than one thread, also counted the other threads spinning
    for a preempted partner (on a busy machine a pass of 2 inputs then read several times one of 1, and
    drafting stopped).
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
