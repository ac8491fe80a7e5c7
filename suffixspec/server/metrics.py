"""Prometheus metrics for ``GET /metrics`` (one registry per app, so several apps can live in one process).

Completion tokens are counted step by step as the engine commits them (``record_step``), so their
rate follows a long generation while it runs; the other per-request figures are added when it ends.
Per-step latency comes as a pair of counters (``suffixspec_steps_total`` and
``suffixspec_step_seconds_total``): their rate ratio is the mean time per decode step. The mean
accepted length is kept exact over all requests (step-weighted), not as a last-value gauge.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

MAX_POSITION_LABELS = 64  # accepted-per-position counters stop here (deeper positions add to the last)


class Metrics:
    """The counters the server exports."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, queue_length: Any = None) -> None:
        r = self.registry = CollectorRegistry()
        self.http_requests = Counter("suffixspec_http_requests", "HTTP requests by route and status",
                                     ["route", "status"], registry=r)
        self.generations = Counter("suffixspec_generations", "Finished generations by endpoint and finish reason",
                                   ["endpoint", "finish_reason"], registry=r)
        self.prompt_tokens = Counter("suffixspec_prompt_tokens", "Prompt tokens processed", registry=r)
        self.completion_tokens = Counter("suffixspec_completion_tokens", "Completion tokens generated", registry=r)
        self.drafted = Counter("suffixspec_drafted_tokens", "Draft tokens verified, by source", ["source"],
                               registry=r)
        self.accepted = Counter("suffixspec_accepted_tokens", "Draft tokens accepted, by source", ["source"],
                                registry=r)
        self.accepted_position = Counter("suffixspec_accepted_tokens_by_position",
                                         "Draft tokens accepted at each draft depth (1 = first drafted token)",
                                         ["position"], registry=r)
        self.drafted_position = Counter("suffixspec_draft_depth_steps_by_position",
                                        "Decode steps whose draft reached each depth (1 = a first token drafted)",
                                        ["position"], registry=r)
        self.steps = Counter("suffixspec_steps", "Decode steps (target forward passes)", registry=r)
        self.step_seconds = Counter("suffixspec_step_seconds", "Seconds spent in decode steps (prefill excluded)",
                                    registry=r)
        self.step_latency = Histogram("suffixspec_mean_step_seconds", "Mean decode-step time per request",
                                      buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
                                      registry=r)
        self.request_latency = Histogram("suffixspec_generation_seconds", "Generation time per request",
                                         buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=r)
        self.queue_wait = Histogram("suffixspec_queue_wait_seconds", "Time a request waited for the engine",
                                    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60), registry=r)
        self.mean_accepted_length = Gauge("suffixspec_mean_accepted_length",
                                          "Mean tokens emitted per decode step over all requests", registry=r)
        self.rejected = Counter("suffixspec_rejected_requests", "Requests refused before generation, by reason",
                                ["reason"], registry=r)
        self.queue_length = Gauge("suffixspec_queue_length", "Requests waiting for the engine", registry=r)
        self.batch_size = Histogram("suffixspec_batch_size", "Requests verified together in each target forward pass",
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64), registry=r)
        self.batch_inputs = Histogram("suffixspec_batch_input_tokens",
                                      "Input tokens of each target forward pass (rows x padded width)",
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), registry=r)
        self.pass_cpu_seconds = Counter("suffixspec_pass_cpu_seconds",
                                        "CPU seconds of target forward passes, by whether they fed prompt tokens "
                                        "(kind=prompt: a prefill, or a decode pass a joining prompt rode in) or "
                                        "only decoded (kind=decode)", ["kind"], registry=r)
        self.pass_prompt_tokens = Counter("suffixspec_pass_prompt_tokens",
                                          "Prompt tokens fed to the target (past reused prefixes)", registry=r)
        if queue_length is not None:
            self.queue_length.set_function(queue_length)
        self._lock = threading.Lock()
        self._weighted_len = 0.0  # sum over requests of mean_accepted_length * steps
        self._all_steps = 0

    def record_generation(self, endpoint: str, result: Any, queue_wait_s: float | None = None) -> None:
        """Add one finished GenerationResult to the counters."""
        stats = result.stats.to_dict() if hasattr(result.stats, "to_dict") else dict(result.stats)
        self.generations.labels(endpoint, result.finish_reason).inc()
        self.prompt_tokens.inc(len(result.prompt_token_ids))  # completion tokens: record_step, as they come
        for src, d in (stats.get("per_source") or {}).items():
            self.drafted.labels(src).inc(d.get("drafted", 0))
            self.accepted.labels(src).inc(d.get("accepted", 0))
        for pos, n in enumerate(stats.get("accepted_per_position") or [], start=1):
            if n:
                self.accepted_position.labels(str(min(pos, MAX_POSITION_LABELS))).inc(n)
        for pos, n in enumerate(stats.get("drafted_per_position") or [], start=1):
            if n:
                self.drafted_position.labels(str(min(pos, MAX_POSITION_LABELS))).inc(n)
        steps = int(stats.get("steps") or 0)
        total = float(stats.get("time_total_s") or 0.0)
        decode = max(0.0, total - float(stats.get("time_prefill_s") or 0.0))  # prefill is not a decode step
        if steps:
            self.steps.inc(steps)
            self.step_seconds.inc(decode)
            self.step_latency.observe(decode / steps)
            with self._lock:
                self._weighted_len += float(stats.get("mean_accepted_length") or 0.0) * steps
                self._all_steps += steps
                self.mean_accepted_length.set(self._weighted_len / self._all_steps)
        self.request_latency.observe(total)
        if queue_wait_s is not None:
            self.queue_wait.observe(queue_wait_s)

    def record_step(self, event: Any) -> None:
        """One decode step's StreamEvent: its committed tokens count as generated now (a cancelled request's
        tokens too: they were generated). The final event carries none, so nothing is counted twice."""
        n = len(getattr(event, "token_ids", None) or ())
        if n:
            self.completion_tokens.inc(n)

    def record_pass(self, record: Any) -> None:
        """One target forward pass (a ``scheduler.PassRecord``; the engine calls this): its decoding rows
        and their input tokens in the batch histograms, its CPU time by kind."""
        if record.rows:
            self.batch_size.observe(record.rows)
            self.batch_inputs.observe(record.inputs)
        self.pass_cpu_seconds.labels("prompt" if record.prompt_tokens else "decode").inc(record.cpu_seconds)
        self.pass_prompt_tokens.inc(record.prompt_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
