"""The engine worker: runner threads feed the engine; requests wait in a bounded queue.

With ``max_num_seqs = N > 1`` (and a target that can batch) there are N runner threads: each
takes a job and streams it from the engine, which steps the running requests together in one
batch (continuous batching). With N = 1 one thread runs the jobs one at a time.

A route submits a ``Job`` (engine arguments + a cancel event) and reads the job's events: the
engine's StreamEvents, then ``DONE``, or a ``JobFailed``. Failures are told apart by kind: a
``RequestError`` before the first event is the request's own checks refusing it (a 400 showing its
message); anything else is a bug or a fault (a 500 that says to see the log, which has the traceback). A full queue raises ``QueueFull`` before
anything is sent (the route answers 503 with Retry-After). Setting ``job.cancel`` (the client
went away) stops the engine at its next step, or skips the job if it has not started.

Shutdown stops taking jobs, cancels the queued ones, lets the running ones finish for up to
``timeout`` seconds, then cancels them and waits for the threads.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from suffixspec.errors import RequestError, RequestFailed

log = logging.getLogger(__name__)

DONE = object()  # sentinel: the job's last event has been delivered
# what a client is told of a failure that is not its request's fault: nothing of the failure itself
ENGINE_FAILED = "the engine failed while generating; the server log has the details"


def engine_failed(e: BaseException) -> str:
    """What a client is told of a fault: the step of its request that failed when the scheduler names it
    (the other requests went on), nothing of the failure itself. Example: "the engine failed on this
    request while drafting (the other requests go on); the server log has the details"."""
    if isinstance(e, RequestFailed):
        return f"the engine failed on this request while {e.stage} (the other requests go on); the server log has the details"
    return ENGINE_FAILED


class QueueFull(Exception):
    """The engine queue is full; retry later."""


class ShuttingDown(Exception):
    """The server is shutting down and takes no more work."""


@dataclass
class JobFailed:
    """The engine raised; ``message`` is safe to show (no stack trace, no internals), ``exc`` is for the log."""

    message: str
    exc: BaseException | None = None
    shutdown: bool = False  # cancelled because the server is shutting down
    bad_request: bool = False  # the request's checks refused its arguments before generating (a 400)
    param: str | None = None  # bad_request: the argument to change, when the check named one


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
    # the client disconnected before its answer was complete, streaming or not: the access log says 499 for
    # both (a stream's 200 went out with its first chunk, before the client left)
    client_left: bool = False


class EngineWorker:
    """Daemon threads that run jobs on ``engine.stream``, as many at once as the engine batches."""

    def __init__(self, engine: Any, max_queue: int, on_result: Callable[[Job], None] | None = None,
                 on_step: Callable[[Any], None] | None = None) -> None:
        self.engine = engine
        self.on_result = on_result  # called in a worker thread with each finished job (metrics)
        self.on_step = on_step  # called in a worker thread with each StreamEvent as it comes (live metrics)
        self.max_queue = max(1, max_queue)  # jobs that may wait; more get QueueFull
        # unbounded underneath, so the shutdown sentinels (one per thread) never block; submit() bounds it
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._closing = threading.Event()
        self._current: list[Job] = []  # the running jobs
        self._lock = threading.Lock()
        batched = getattr(engine, "max_num_seqs", 1) > 1 and getattr(engine, "batchable", False)
        self.concurrency = engine.max_num_seqs if batched else 1  # jobs running at once
        self._threads = [threading.Thread(target=self._run, name=f"suffixspec-engine-{i}", daemon=True)
                         for i in range(self.concurrency)]
        for t in self._threads:
            t.start()

    # -- client side ---------------------------------------------------------------------------

    def submit(self, job: Job) -> Job:
        if self._closing.is_set():
            raise ShuttingDown("the server is shutting down")
        with self._lock:
            if self._queue.qsize() >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are already waiting for the engine")
            self._queue.put_nowait(job)
        return job

    def queue_length(self) -> int:
        """Jobs waiting (not counting the running ones)."""
        return self._queue.qsize()

    def busy(self) -> bool:
        return bool(self._current)

    def running(self) -> int:
        """Jobs running now."""
        return len(self._current)

    @property
    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads)

    # -- worker side ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:  # shutdown sentinel
                return
            with self._lock:
                self._current.append(job)
            try:
                self._run_job(job)
            finally:
                with self._lock:
                    self._current.remove(job)

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
                if self.on_step is not None:  # before the client sees the step, so metrics never lag it
                    self.on_step(ev)
                job.events.put(ev)
                delivered = True
        except Exception as e:  # never let one request kill the worker
            if isinstance(e, RequestError) and not delivered:  # the request's checks: they say what to change
                job.events.put(JobFailed(str(e), e, bad_request=True, param=e.param))
            else:  # a bug or a fault, never the client's to fix: the traceback goes to the log only
                log.exception("generation failed")
                job.events.put(JobFailed(engine_failed(e), e))
            return
        if job.result is not None and self.on_result is not None:
            try:
                self.on_result(job)
            except Exception:
                log.exception("recording metrics failed")
        job.events.put(DONE)

    # -- shutdown ------------------------------------------------------------------------------

    def shutdown(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, cancel the queued ones, give the running ones ``timeout`` s, then cancel them."""
        if self._closing.is_set():
            self._join(timeout)
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
        for _ in self._threads:
            self._queue.put(None)
        self._join(timeout)
        if any(t.is_alive() for t in self._threads):
            with self._lock:
                for job in self._current:
                    job.cancel.set()
            self._join(timeout)
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()

    def _join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
