"""What the index benchmarks watch while they run: another writer's wait for the database's write lock
(:class:`WriteProbe`) and a process' peak resident and anonymous memory, sampled (:class:`PeakMemory`)."""

from __future__ import annotations

import os
import time
from pathlib import Path


class WriteProbe:
    """A thread that writes to the database every ``period_s`` (as a server persisting its output
    history would) and records the longest wait for the write lock."""

    def __init__(self, db: Path, period_s: float = 0.05) -> None:
        import threading

        self.db, self.period_s, self.max_wait = db, period_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import sqlite3

        conn = sqlite3.connect(str(self.db), timeout=600, isolation_level=None)
        conn.execute("CREATE TABLE IF NOT EXISTS bench_probe (t REAL)")
        while not self._stop.wait(self.period_s):
            t = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            self.max_wait = max(self.max_wait, time.perf_counter() - t)
            conn.execute("INSERT INTO bench_probe VALUES (?)", [t])
            conn.execute("COMMIT")
        conn.close()

    def __enter__(self) -> WriteProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class PeakMemory:
    """Peak resident memory of a process, sampled from ``/proc/<pid>/status`` every ``period_s`` in a
    thread: ``rss`` (VmRSS: what ``ru_maxrss`` peaks, mapped file pages included) and ``anon`` (RssAnon:
    the memory the process allocated itself; pages of memory-mapped arrays it touched are the page
    cache's, shared and dropped under pressure, and count in ``rss`` only)."""

    def __init__(self, pid: int | None = None, period_s: float = 0.02) -> None:
        import threading

        self.path = f"/proc/{pid or os.getpid()}/status"
        self.period_s, self.rss, self.anon = period_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        try:
            with open(self.path) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # the process ended, or no /proc
            return
        kb = {k: int(v.split()[0]) * 1024 for k, v in fields.items() if k in ("VmRSS", "RssAnon")}
        self.rss = max(self.rss, kb.get("VmRSS", 0))
        self.anon = max(self.anon, kb.get("RssAnon", 0))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> PeakMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
