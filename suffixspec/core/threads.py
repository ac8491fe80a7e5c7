"""How many threads torch runs the target's passes on, on a CPU: measured, not inherited.

torch starts one OpenMP thread per core. Whether that is fastest depends on what else the machine
runs, and that changes: on an idle 2-core machine two threads decoded SmolLM2 1.5x as fast as one;
with one other busy process two threads decoded at 0.2-0.4x of one, because every parallel region ends
with its threads waiting (spinning, under OpenMP's default wait) for whichever of them the kernel
preempted. So the CLI, the Python API and the server share one policy:

1. :meth:`ThreadTuner.calibrate` times a pass at one thread and at the core count, interleaved, when
   the engine starts (``Engine.warm_up``), and keeps the faster; more threads must be ``margin``
   faster to be chosen. A round where more threads are ``collapse`` times slower ends it at once (and
   no round runs when the untimed first passes already differ twice as much).
2. While decoding, :meth:`ThreadTuner.before_pass` now and then runs a few real passes at the other
   count, alternating with the chosen one, and the choice moves when the other count is ``margin``
   faster. Each pass's wall time is divided by its size's share of the cost curve (``shape``: a pass of
   9 inputs costing 1.1 plain passes counts as 1.1 passes), so passes of any size compare. The next
   re-check waits twice as long while the choice holds, and at least ``recheck_cost`` times what the
   last one lost (re-checking costs at most a few percent of the time). A pass at the other count that
   takes ``collapse`` times the chosen count's latest passes ends the re-check there (on a busy machine
   a second thread's pass can take 20 plain passes).
3. Load that arrives while more threads than one are chosen starts a re-check at once: when
   ``slow_passes`` of the latest ``slow_window`` passes take ``collapse`` times the median of the
   ``baseline_passes`` before them (per plain pass), the re-check runs now instead of minutes later.
   So OpenMP's own wait (threads spin briefly, then sleep) stays: it is what makes two threads pay on
   an idle machine (a passive wait loses most of that gain to waking threads), and its worst case, a
   busy neighbour, lasts a few passes.

A count the user gives (``--threads N``, ``SuffixSpec(threads=N)``, or ``OMP_NUM_THREADS`` in the
environment) is used as given and never measured; on a GPU torch's count is kept. ``OMP_WAIT_POLICY``
in the environment is OpenMP's to read (``PASSIVE`` for a fixed count of several threads on a shared
machine).

Worked example (2 cores): at start, passes of 8 inputs take 31, 30, 32 ms at two threads and 44, 45,
43 ms at one -> two threads. Decoding, the passes take about 20 ms per plain pass; a build starts on
the machine and of the next four passes three take 95, 120, 88 ms (over 1.5 times the median of the 16
before them) -> a re-check now: the passes alternate 1, 2, 1, 2, 1, 2 threads and take 46, 95, 47,
120, 45, 88 ms -> one thread from then on (the three passes at two threads lost about 0.16 s, so the next re-check comes
at least 3.2 s of passes later, and after ``recheck_s`` at the earliest).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

WAIT_POLICY = "OMP_WAIT_POLICY"


def wait_policy() -> str:
    """The OpenMP wait policy in effect, as the statement at start-up names it."""
    value = os.environ.get(WAIT_POLICY)
    if not value:
        return "OpenMP's default wait"
    return f"{WAIT_POLICY}={value} (from the environment)"


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity: ``taskset`` and cpusets count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ThreadPolicy:
    """The constants of the thread choice."""

    probe_inputs: int = 8  # tokens of the pass timed at start (a typical verified draft plus its root)
    probe_context: int = 32  # cached tokens before it (a scratch cache)
    probe_rounds: int = 3  # timed passes per count at start, interleaved (the median is read)
    margin: float = 0.1  # more threads must be this much faster at start; the other count this much at a re-check
    recheck_s: float = 15.0  # seconds of passes before the first re-check, and after one that switched
    max_recheck_s: float = 240.0  # the interval doubles while the choice holds, up to this
    recheck_passes: int = 6  # passes of one re-check, alternating the two counts (the other count first)
    recheck_cost: float = 20.0  # the next re-check waits at least this many times what the last one lost
    collapse: float = 1.5  # a pass this many times slower than the recent median (a start-up round: than one thread)
    slow_window: int = 4  # the latest passes looked at for slow ones
    slow_passes: int = 3  # that many slow passes among them, at more threads than one, start a re-check at once
    baseline_passes: int = 16  # the passes before the window, whose median a slow one is measured against

    def __post_init__(self) -> None:
        if self.probe_inputs < 1 or self.probe_rounds < 1 or self.probe_context < 1:
            raise ValueError("ThreadPolicy.probe_inputs, probe_context and probe_rounds must be >= 1")
        if self.recheck_passes < 2 or self.recheck_passes % 2:
            raise ValueError("ThreadPolicy.recheck_passes must be even and >= 2 (both counts alternate)")
        if not 0.0 <= self.margin < 1.0 or not 0.0 < self.recheck_s <= self.max_recheck_s:
            raise ValueError("need 0 <= margin < 1 and 0 < recheck_s <= max_recheck_s")
        if self.collapse <= 1.0 or not 1 <= self.slow_passes <= self.slow_window or self.baseline_passes < 1:
            raise ValueError("need ThreadPolicy.collapse > 1, 1 <= slow_passes <= slow_window and baseline_passes >= 1")


@dataclass
class ThreadTuner:
    """The thread count of every target pass (see the module docstring).

    ``threads``: a count to use as given (``None``: choose; ``OMP_NUM_THREADS`` in the environment counts
    as given); ``device``: the target's (nothing is measured off the CPU); ``cores``: the count to try
    besides one (default: :func:`available_cores`); ``clock``: wall seconds for the start-up probe."""

    threads: int | None = None
    device: str = "cpu"
    cores: int | None = None
    policy: ThreadPolicy = field(default_factory=ThreadPolicy)
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ValueError(f"threads must be a positive integer (or None to measure), got {self.threads!r}")
        env = os.environ.get("OMP_NUM_THREADS", "").strip()
        cores = self.cores or available_cores()
        self.how = "measured"  # how the count was chosen: measured / given / OMP_NUM_THREADS / device / one core
        if self.threads is not None:
            self.counts, self.how = (self.threads,), "given"
        elif env.isdigit() and int(env) > 0:
            self.counts, self.how = (int(env),), "OMP_NUM_THREADS"
        elif not self.device.startswith("cpu"):
            self.counts, self.how = (), "device"
        elif cores <= 1:
            self.counts, self.how = (1,), "one core"
        else:
            self.counts = (1, cores)
        self.current: int | None = self.counts[0] if self.counts else None  # None: torch's own (a GPU)
        self.measured_ms: dict[int, float] = {}  # count -> median milliseconds of the start-up probe's passes
        self.rechecks = 0  # re-checks done
        self.switches = 0  # re-checks that changed the count
        self._interval = self.policy.recheck_s  # seconds of passes between re-checks
        self._until_recheck = self._interval
        self._plan: list[int] = []  # counts of the re-check's remaining passes
        self._samples: dict[int, list[float]] = {}  # count -> plain-pass-equivalent seconds in this re-check
        # plain-pass-equivalent seconds of the latest passes at the chosen count since the last decision
        self._recent: deque[float] = deque(maxlen=self.policy.baseline_passes + self.policy.slow_window)
        if self.current is not None and self.how != "measured":
            self._set(self.current)

    def hold(self) -> None:
        """Keep the count chosen so far and stop re-checking (a benchmark compares systems at one count)."""
        if self.current is not None and self.measuring:
            self.counts, self._plan = (self.current,), []

    @property
    def measuring(self) -> bool:
        """Whether the count is chosen by measurement (two candidates)."""
        return len(self.counts) > 1

    # -- start-up ------------------------------------------------------------------------------------
    def calibrate(self, run: Callable[[], None]) -> None:
        """Choose the count from ``run`` (one pass on a scratch cache), timed at each count, interleaved.

        The first pass at each count is not timed: it starts that count's threads and pays one-time kernel
        set-up (the warm-up the first request would otherwise pay). Ties go to fewer threads."""
        if not self.measuring:
            if self.current is not None:
                self._set(self.current)
                run()  # the warm-up alone
            return
        warm: dict[int, float] = {}
        for n in self.counts:
            self._set(n)
            t = self.clock()
            run()
            warm[n] = self.clock() - t
        times: dict[int, list[float]] = {n: [] for n in self.counts}
        fewest, most = self.counts
        # the warm-ups pay one-time set-up (the first most), so only a wide gap decides on them: on a busy
        # machine a pass at two spinning threads took 1.8 s against 70 ms at one, seconds of start-up each
        rounds = 0 if warm[most] > 2 * self.policy.collapse * warm[fewest] else self.policy.probe_rounds
        if not rounds:
            times = {n: [w] for n, w in warm.items()}
        for r in range(rounds):
            for n in self.counts if r % 2 == 0 else reversed(self.counts):
                self._set(n)
                t = self.clock()
                run()
                times[n].append(self.clock() - t)
            if times[most][-1] > self.policy.collapse * times[fewest][-1]:
                break  # more threads collapsed (a busy machine): more rounds would only lose time
        medians = {n: statistics.median(v) for n, v in times.items()}
        self.measured_ms = {n: round(1000 * m, 1) for n, m in medians.items()}
        self.current = most if medians[most] * (1 + self.policy.margin) < medians[fewest] else fewest
        self._set(self.current)
        log.debug("torch threads: %s", self.describe())  # SuffixSpec states it at INFO

    # -- around every pass ---------------------------------------------------------------------------
    def before_pass(self) -> int | None:
        """Set and return the count for the next pass (a re-check's, or the chosen one); None: torch's own.

        Set in the calling thread every time: OpenMP's count is per thread, and the callers that step the
        decode loop take turns."""
        if self.current is None:
            return None
        n = self._plan[0] if self._plan else self.current
        self._set(n)
        return n

    def after_pass(self, threads: int | None, wall: float, shape: float | None) -> None:
        """A pass ran at ``threads`` and took ``wall`` seconds; ``shape``: its cost in plain passes
        (``PassCost.estimate(inputs) / estimate(1)``), None when it is not comparable (it fed a prompt)."""
        if not self.measuring or threads is None:
            return
        if not self._plan:
            self._until_recheck -= wall
            if self._until_recheck <= 0 or (shape is not None and self._collapsing(wall / max(shape, 1e-9))):
                other = next(n for n in self.counts if n != self.current)
                self._plan = [other, self.current] * (self.policy.recheck_passes // 2)
                self._samples = {other: [], self.current: []}
            return
        if shape is None or threads != self._plan[0]:
            return  # the same count runs the next pass again
        per_pass = wall / max(shape, 1e-9)
        self._samples[threads].append(per_pass)
        self._plan.pop(0)
        if threads != self.current and self._recent and per_pass > self.policy.collapse * self._latest():
            self._plan = []  # the other count collapses (a busy machine): its remaining passes would only lose time
        if not self._plan:
            self._decide()

    def _collapsing(self, per_pass: float) -> bool:
        """Record a pass at the chosen count (``per_pass``: seconds per plain pass); True when ``slow_passes``
        of the latest ``slow_window`` took ``collapse`` times the median of the ``baseline_passes`` before
        them, at more threads than one (one thread has no partner to wait for: a slower pass there is the
        machine, and the periodic re-check is enough). Spinning threads that wait for a preempted partner
        make passes erratic (SmolLM2 at two threads: 32 ms idle, then 37-275 ms, median 64, with a busy
        process), so most of them, not all, must be slow; one or two slow passes are a hiccup."""
        p = self.policy
        self._recent.append(per_pass)
        if self.current == min(self.counts) or len(self._recent) < self._recent.maxlen:
            return False
        recent = list(self._recent)
        base = statistics.median(recent[:p.baseline_passes])
        if sum(x > p.collapse * base for x in recent[p.baseline_passes:]) < p.slow_passes:
            return False
        log.info("torch threads: passes at %d threads slowed from %.0f to %.0f ms per plain pass; re-checking",
                 self.current, 1000 * base, 1000 * statistics.median(recent[p.baseline_passes:]))
        return True

    def _latest(self) -> float:
        """Seconds per plain pass at the chosen count now: the median of its latest ``slow_window`` passes."""
        return statistics.median(list(self._recent)[-self.policy.slow_window:])

    def _decide(self) -> None:
        """End a re-check: move to the other count if it was ``margin`` faster; schedule the next one."""
        other = next(n for n in self.counts if n != self.current)
        mine = statistics.median(self._samples[self.current]) if self._samples[self.current] else self._latest()
        theirs = statistics.median(self._samples[other])
        lost = max(0.0, sum(self._samples[other]) - mine * len(self._samples[other]))
        self.rechecks += 1
        if theirs * (1 + self.policy.margin) < mine:
            log.info("torch threads: %d -> %d (re-check: %.0f ms against %.0f ms per plain pass)",
                     self.current, other, 1000 * theirs, 1000 * mine)
            self.current, self.switches = other, self.switches + 1
            self._interval = self.policy.recheck_s
        else:
            self._interval = min(self.policy.max_recheck_s, 2 * self._interval)
        self._until_recheck = max(self._interval, self.policy.recheck_cost * lost)
        self._samples = {}
        self._recent.clear()  # a new baseline at the count chosen now

    @staticmethod
    def _set(n: int) -> None:
        import torch

        if torch.get_num_threads() != n:
            torch.set_num_threads(n)

    # -- the statement -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """``{"threads", "how", "device", "measured_ms", "wait_policy", "rechecks", "switches"}`` (JSON-ready;
        ``measured_ms``: the start-up probe's median pass at each count)."""
        import torch

        return {"threads": self.current if self.current is not None else torch.get_num_threads(), "how": self.how,
                "device": self.device, "measured_ms": {str(n): ms for n, ms in self.measured_ms.items()},
                "wait_policy": wait_policy(), "rechecks": self.rechecks, "switches": self.switches}

    def describe(self) -> str:
        """:func:`describe` of :meth:`to_dict`."""
        return describe(self.to_dict())


def describe(d: dict) -> str:
    """A ``ThreadTuner.to_dict()`` in one line: the count, how it was chosen, the wait policy.

    >>> describe({"threads": 2, "how": "measured", "device": "cpu", "measured_ms": {"1": 44.0, "2": 31.0},
    ...           "wait_policy": "OpenMP's default wait", "rechecks": 0, "switches": 0})
    "2 threads (measured at start: a pass took 31 ms at 2 threads, 44 ms at 1; re-checked while decoding; --threads N fixes it); OpenMP's default wait"
    """
    n = d["threads"]
    head = f"{n} thread{'s' if n != 1 else ''}"
    if d["how"] == "measured":
        took = sorted(((int(c), ms) for c, ms in d["measured_ms"].items()), reverse=True)
        took_s = ", ".join(f"{ms:.0f} ms at {c}" + (" threads" if i == 0 else "") for i, (c, ms) in enumerate(took))
        why = (f"measured at start: a pass took {took_s}; " if took_s else "") + \
            "re-checked while decoding; --threads N fixes it"
        if d["switches"]:
            why += f"; switched {d['switches']} time{'s' if d['switches'] != 1 else ''} since"
    else:
        why = {"given": "as given", "OMP_NUM_THREADS": "from OMP_NUM_THREADS",
               "device": f"torch's count on {d['device']}", "one core": "one core available",
               "llama.cpp default": "llama-cpp-python's default: the physical cores; --threads N fixes it"}[d["how"]]
    return f"{head} ({why}); {d['wait_policy']}"
