"""Time to first token, whole process: ``suffixspec generate`` and a fresh ``suffixspec serve``.

- ``generate``: from spawning ``suffixspec generate PROMPT --stream`` to the first byte of generated
  text on its stdout, and to its exit (Python start, imports, model loading, prefill and decoding
  included).
- ``serve``: from spawning ``suffixspec serve`` to the first streamed token of a completion
  request sent as soon as the port accepts connections (the request waits for the model to load),
  and to the end of that first response.

Both also report the CPU seconds the process used (user + system, from the kernel's accounting of
finished children): on a loaded machine wall time mostly measures the other jobs, CPU time does not.

Each is run ``--repeats`` times (medians and ranges); the store is a fresh SQLite file in a
temporary folder, so no earlier output history is loaded.

    python -m suffixspec.bench.bench_ttft [--repeats 3] [--max-tokens 16] [--draft-model auto]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from suffixspec.bench.processes import children_cpu, free_port, stop_process

PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


def _cli() -> list[str]:
    """The ``suffixspec`` console script next to this Python (as a user runs it)."""
    script = Path(sys.executable).parent / "suffixspec"
    if not script.exists():
        raise RuntimeError(f"{script} not found: install suffixspec into this environment (pip install -e .)")
    return [str(script)]


def time_generate(max_tokens: int, draft_model: str, tmp: Path) -> dict[str, float]:
    """Seconds from spawn to the first text byte on stdout and to exit; CPU seconds of the process."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cpu = children_cpu()
    t = time.perf_counter()
    proc = subprocess.Popen(
        [
            *_cli(),
            "generate",
            PROMPT,
            "--max-tokens",
            str(max_tokens),
            "--stream",
            "--draft-model",
            draft_model,
            "--db",
            str(tmp / "gen.db"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    t_first = time.perf_counter() - t
    rest = proc.stdout.read()
    code = proc.wait()
    t_exit = time.perf_counter() - t
    if code != 0 or not first:
        raise RuntimeError(f"suffixspec generate failed (exit {code}): {(first + rest)[-500:]!r}")
    return {"first_token_s": t_first, "exit_s": t_exit, "cpu_s": children_cpu() - cpu}


def time_serve(max_tokens: int, draft_model: str, tmp: Path, timeout_s: float = 900.0) -> dict[str, float]:
    """Seconds from spawning the server to the first streamed token of the first request; CPU seconds of
    the server process (start, first request, shutdown)."""
    port = free_port()
    cpu = children_cpu()
    t = time.perf_counter()
    proc = subprocess.Popen(
        [*_cli(), "serve", "--port", str(port), "--draft-model", draft_model, "--db", str(tmp / "serve.db")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        body = json.dumps(
            {
                "model": "suffixspec",
                "prompt": PROMPT,
                "max_tokens": max_tokens,
                "stream": True,
                "temperature": 0,
            }
        )
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"suffixspec serve exited with {proc.returncode} before answering")
            if time.perf_counter() - t > timeout_s:
                raise RuntimeError(f"suffixspec serve did not answer within {timeout_s:.0f} s")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                break
            except OSError:  # not listening yet
                time.sleep(0.05)
        t_accept = time.perf_counter() - t
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"first request failed: HTTP {resp.status} {resp.read()[:300]!r}")
        t_first = None
        while True:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                chunk = json.loads(line[6:])
                if t_first is None and chunk["choices"][0].get("text"):
                    t_first = time.perf_counter() - t
        t_done = time.perf_counter() - t
        conn.close()
        out = {
            "port_open_s": t_accept,
            "first_token_s": t_first if t_first is not None else t_done,
            "response_done_s": t_done,
        }
    finally:
        stop_process(proc)
    out["cpu_s"] = children_cpu() - cpu
    return out


def run(repeats: int = 3, max_tokens: int = 16, draft_model: str = "auto", log=print) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {"generate": [], "serve": []}
    with tempfile.TemporaryDirectory(prefix="suffixspec-ttft-") as tmp:
        for i in range(repeats):  # interleaved, so load changes hit both
            for kind, fn in (("generate", time_generate), ("serve", time_serve)):
                d = Path(tmp) / f"{kind}-{i}"
                d.mkdir()
                r = fn(max_tokens, draft_model, d)
                runs[kind].append(r)
                log(f"  {kind} #{i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    out: dict[str, Any] = {}
    for kind, rs in runs.items():
        out[kind] = {
            k: {
                "median": round(statistics.median(r[k] for r in rs), 3),
                "min": round(min(r[k] for r in rs), 3),
                "max": round(max(r[k] for r in rs), 3),
            }
            for k in rs[0]
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    names = {
        "first_token_s": "first token",
        "exit_s": "process exit",
        "port_open_s": "port open",
        "response_done_s": "first response complete",
        "cpu_s": "CPU seconds used (user + system)",
    }
    lines = ["| command | event (seconds from spawn) | median | min–max |", "|---|---|---:|---:|"]
    for kind, rows in result.items():
        for k, r in rows.items():
            lines.append(
                f"| suffixspec {kind} | {names[k]} | {r['median']:.2f} | {r['min']:.2f}–{r['max']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--draft-model", default="auto")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = run(args.repeats, args.max_tokens, args.draft_model)
    print(markdown(result))
    if args.json:
        args.json.write_text(
            json.dumps({"meta": {k: str(v) for k, v in vars(args).items()}, "results": result}, indent=2)
        )


if __name__ == "__main__":
    main()
