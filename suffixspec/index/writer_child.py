"""The writer process (started by :mod:`index.writer`): lowers its priority, opens the store, runs the
add or the merges it is sent and answers with the result, streaming progress meanwhile.

Run as ``python -m suffixspec.index.writer_child FD`` with one end of a socket pair as ``FD``; the
protocol is :mod:`index.writer`'s: the job, then ``("more",)`` -> a chunk of documents (None: the
end), ``("progress", ...)``, ``("status", text)``, and last ``("done", result)`` or ``("error", exc)``.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from .errors import StoreError
from .records import DocInput
from .store import IndexStore


def _lower_priority(nice: int, autogroup: bool, idle: bool) -> None:
    if idle and hasattr(os, "SCHED_IDLE"):
        # SCHED_IDLE: a thread waking in the same group preempts this process at once (a niced one may
        # finish its time slice first: torch's threads wake hundreds of times per generation); the
        # tokenizer's threads, started later, inherit it
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass
    if nice <= 0:
        return
    if autogroup:  # alone in a new session: its autogroup is this process
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(nice))
        except OSError:
            pass
    try:
        os.nice(max(0, nice - os.nice(0)))
    except OSError:
        pass


def _child(fd: int) -> int:
    conn = Connection(fd)
    try:
        job = conn.recv()
    except EOFError:
        return 1
    _lower_priority(job["nice"], job["autogroup"], job["idle"])

    def docs() -> Iterator[DocInput]:
        while True:
            conn.send(("more",))
            chunk = conn.recv()  # EOFError when the parent died: the add aborts, nothing is committed
            if chunk is None:
                return
            yield from chunk

    def progress(*counts: int) -> None:  # an add's (docs, tokens, bytes), a merge's tokens
        conn.send(("progress", *counts))

    def status(text: str) -> None:
        conn.send(("status", text))

    try:
        with IndexStore(job["path"], **job["store"]) as store:
            if job["kind"] == "add":
                result: Any = store.add_documents(docs(), job["tokenizer"], progress=progress, status=status)
            else:
                result = store.merge_pending(progress=progress, status=status)
                if job["compact"]:
                    result += store.compact(progress=progress, status=status)
        conn.send(("done", result))
        return 0
    except BaseException as e:  # the parent re-raises it (KeyboardInterrupt included)
        try:
            pickle.dumps(e)
        except Exception:
            e = StoreError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        try:
            conn.send(("error", e))
        except OSError:
            pass
        return 130 if isinstance(e, KeyboardInterrupt) else 1


if __name__ == "__main__":
    sys.exit(_child(int(sys.argv[1])))
