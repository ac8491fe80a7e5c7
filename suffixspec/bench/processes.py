"""Child processes of the benchmarks: a free port, a server process on loopback, how to stop one, its
resident memory, and the CPU time of the children that finished.

The end-to-end benchmarks (``bench_servers``, ``bench_concurrency``, ``bench_ttft``, ``bench_startup``,
``bench_index``'s busy-add) each start real processes; they share these pieces so that every one of them
waits for a server, stops it and counts its CPU time the same way.

Example: ``cpu = children_cpu(); subprocess.run(cmd); children_cpu() - cpu`` is the CPU seconds (user +
system) that ``cmd``'s process used, its own children included once they were waited for.
"""

from __future__ import annotations

import http.client
import json
import resource
import socket
import subprocess
import time
from pathlib import Path
from typing import Any


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Stop ``proc`` as a user would stop a server: SIGTERM (it shuts down cleanly), SIGKILL after
    ``timeout_s`` seconds, then wait for it (no zombie left). A process that already ended is only reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from ``/proc/PID/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return out


def resident_memory(pid: int) -> dict[str, float]:
    """Resident memory of ``pid`` and its children, GiB: ``rss`` (``VmRSS``), and its ``anon`` and ``file`` parts
    (``RssAnon``, ``RssFile``: a mapped model file counts in ``file``)."""
    got = {"rss": 0, "anon": 0, "file": 0}
    keys = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file"}
    for p in descendants(pid):
        try:
            lines = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            k, *rest = line.split()
            if k in keys:
                got[keys[k]] += int(rest[0])  # kB
    return {k: round(v / 2**20, 3) for k, v in got.items()}


class ServerProcess:
    """A server subprocess on 127.0.0.1 speaking the OpenAI API; ready once ``/health`` answers 200. Its output
    goes to ``log_path``; :meth:`stop` ends it (:func:`stop_process`) and closes the log."""

    def __init__(
        self,
        cmd: list[str],
        port: int,
        log_path: Path,
        env: dict[str, str] | None = None,
        timeout_s: float = 1800.0,
    ) -> None:
        self.port = port
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.log_path = log_path
        t = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        while True:
            if self.proc.poll() is not None:
                self.log.flush()
                raise RuntimeError(
                    f"{cmd[0]} exited with {self.proc.returncode} before it was ready: "
                    f"{log_path.read_text()[-1500:]}"
                )
            if time.perf_counter() - t > timeout_s:
                self.stop()
                raise RuntimeError(f"{cmd[0]} was not ready within {timeout_s:.0f} s; see {log_path}")
            try:
                status, self.health = self.get("/health")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.25)  # a server loading its model: poll, as a client would
        self.ready_s = time.perf_counter() - t

    def get(self, path: str) -> tuple[int, Any]:
        """GET ``path``: the status and the body, parsed where it is JSON (``/health``), else its text
        (``/metrics``)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read().decode()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(body)
        except ValueError:
            return resp.status, body

    def post(self, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """POST ``body`` as JSON to ``path``: the response and the client's wall seconds (connect to last byte);
        a status other than 200 raises ``RuntimeError`` with the start of the body."""
        t = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read().decode()
        finally:
            conn.close()
        seconds = time.perf_counter() - t
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data[:500]}")
        return json.loads(data), seconds

    def chat(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """POST ``/v1/chat/completions``: the response and the client's wall seconds."""
        return self.post("/v1/chat/completions", body)

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()
