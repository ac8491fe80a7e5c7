"""The engine worker: one thread owns the model; requests wait in a bounded queue.

A route submits a ``Job`` (engine arguments + a cancel event) and reads the job's events: the
engine's StreamEvents, then ``DONE``, or a ``JobFailed``. A full queue raises ``QueueFull`` before
anything is sent (the route answers 503 with Retry-After). Setting ``job.cancel`` (the client
went away) stops the engine at its next step, or skips the job if it has not started.

Shutdown stops taking jobs, cancels the queued ones, lets the running one finish for up to
``timeout`` seconds, then cancels it and waits for the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

DONE = object()  # sentinel: the job's last event has been delivered


class QueueFull(Exception):
    """The engine queue is full; retry later."""


class ShuttingDown(Exception):
    """The server is shutting down and takes no more work."""


@dataclass
class JobFailed:
    """The engine raised; ``message`` is safe to show (no stack trace), ``exc`` is for the log."""

    message: str
    exc: BaseException | None = None
    shutdown: bool = False  # cancelled because the server is shutting down
    bad_request: bool = False  # the engine refused the request's arguments before generating (a 400)


@dataclass
class Job:
    """One generation request for the engine."""

    kwargs: dict[str, Any]  # engine.stream arguments (prompt, sampling, speculation, references, prediction)
    endpoint: str = "python"  # which route submitted it (metrics label)
    cancel: threading.Event = field(default_factory=threading.Event)  # set -> stop at the next step
    events: queue.Queue = field(default_factory=queue.Queue)  # StreamEvent..., then DONE or a JobFailed
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None  # when the worker picked it up
    result: Any = None  # the GenerationResult, once finished


class EngineWorker:
    """A daemon thread that runs jobs one at a time on ``engine.stream``."""

    def __init__(self, engine: Any, max_queue: int, on_result: Callable[[Job], None] | None = None) -> None:
        self.engine = engine
        self.on_result = on_result  # called in the worker thread with each finished job (metrics)
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max(1, max_queue))
        self._closing = threading.Event()
        self._current: Job | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="suffixspec-engine", daemon=True)
        self._thread.start()

    # -- client side ---------------------------------------------------------------------------

    def submit(self, job: Job) -> Job:
        if self._closing.is_set():
            raise ShuttingDown("the server is shutting down")
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"{self._queue.maxsize} requests are already waiting for the engine") from None
        return job

    def queue_length(self) -> int:
        """Jobs waiting (not counting the running one)."""
        return self._queue.qsize()

    def busy(self) -> bool:
        return self._current is not None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- worker side ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:  # shutdown sentinel
                return
            with self._lock:
                self._current = job
            try:
                self._run_job(job)
            finally:
                with self._lock:
                    self._current = None

    def _run_job(self, job: Job) -> None:
        if job.cancel.is_set():
            job.events.put(JobFailed("cancelled before it started", shutdown=self._closing.is_set()))
            return
        job.started_at = time.monotonic()
        delivered = False
        try:
            for ev in self.engine.stream(cancel=job.cancel, **job.kwargs):
                if getattr(ev, "result", None) is not None:
                    job.result = ev.result
                job.events.put(ev)
                delivered = True
        except ValueError as e:
            if delivered:  # mid-generation: a bug, not the client's fault
                log.exception("generation failed")
                job.events.put(JobFailed("the engine failed while generating; see the server log", e))
            else:  # the engine's own argument checks (they say what to change)
                job.events.put(JobFailed(str(e), e, bad_request=True))
            return
        except Exception as e:  # never let one request kill the worker
            log.exception("generation failed")
            job.events.put(JobFailed("the engine failed while generating; see the server log", e))
            return
        if job.result is not None and self.on_result is not None:
            try:
                self.on_result(job)
            except Exception:
                log.exception("recording metrics failed")
        job.events.put(DONE)

    # -- shutdown ------------------------------------------------------------------------------

    def shutdown(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, cancel the queued ones, give the running one ``timeout`` s, then cancel it."""
        if self._closing.is_set():
            self._thread.join(timeout)
            return
        self._closing.set()
        while True:  # drain the queue: the waiting clients get a 503 "shutting down"
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel.set()
                job.events.put(JobFailed("the server is shutting down", shutdown=True))
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._lock:
                if self._current is not None:
                    self._current.cancel.set()
            self._thread.join(timeout)
