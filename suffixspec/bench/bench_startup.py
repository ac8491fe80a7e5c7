"""Start-up of a second ``suffixspec generate``, beyond importing torch and transformers.

Issue 38's bar: a second ``suffixspec generate --model smollm2-135m-instruct --chat "Say hello."
--max-tokens 8`` ends within 5 s of wall time beyond ``python -c "import torch, transformers"``
(whole process, default settings, median of 3, idle). Both commands run as fresh processes,
interleaved (imports, generate, imports, generate, ...) so a change of load hits both; each gets its
wall seconds and CPU seconds (user + system, from the kernel's accounting of finished children: on a
loaded machine wall time mostly measures the other jobs). ``generate`` asks for 8 tokens (start-up,
the prompt, the first step and the steps after it: a first step that paid one-time set-up shows;
``--max-tokens 1`` never reached it) with the output history off, in a store of its own, after one
untimed run that converts the model if needed and makes the store: so every timed run is a "second"
one, as a user's is.

    python -m suffixspec.bench.bench_startup [--repeats 3] [--model smollm2-135m-instruct] [--json out.json]

Example (figures of one run)::

    | command | wall s (median, min-max) | CPU s (median) |
    | python -c "import torch, transformers" | 4.35 (4.30-4.41) | 4.28 |
    | suffixspec generate --max-tokens 8 | 8.30 (8.21-8.52) | 8.10 |
    | difference | 3.95 | 3.82 |
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from suffixspec.bench.processes import children_cpu

IMPORTS = [sys.executable, "-c", "import torch, transformers"]
PROMPT = "Say hello."
TOKENS = 8


def generate_cmd(model: str, db: Path) -> list[str]:
    """``suffixspec generate`` as this Python runs it (``-m``: the code on its path, a checkout's too)."""
    return [
        sys.executable,
        "-m",
        "suffixspec",
        "generate",
        PROMPT,
        "--chat",
        "--model",
        model,
        "--max-tokens",
        str(TOKENS),
        "--no-history",
        "--db",
        str(db),
    ]


def timed(cmd: list[str]) -> dict[str, float]:
    """Wall and CPU seconds of one process running ``cmd`` to its end (it must succeed)."""
    cpu = children_cpu()
    t = time.perf_counter()
    res = subprocess.run(
        cmd, capture_output=True, text=True, env=dict(os.environ, TOKENIZERS_PARALLELISM="false")
    )
    wall = time.perf_counter() - t
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {res.returncode}): {res.stderr[-800:]}")
    return {"wall_s": wall, "cpu_s": children_cpu() - cpu}


def _summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        k: {
            "median": round(statistics.median(r[k] for r in runs), 3),
            "min": round(min(r[k] for r in runs), 3),
            "max": round(max(r[k] for r in runs), 3),
        }
        for k in runs[0]
    }


def run(model: str = "smollm2-135m-instruct", repeats: int = 3, log=print) -> dict[str, Any]:
    """{"imports": {...}, "generate": {...}, "difference": {"wall_s", "cpu_s"}}: medians, min and max."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runs: dict[str, list[dict[str, float]]] = {"imports": [], "generate": []}
    with tempfile.TemporaryDirectory(prefix="suffixspec-startup-") as tmp:
        db = Path(tmp) / "index.db"
        timed(generate_cmd(model, db))  # untimed: converts the model if needed, makes the store
        for i in range(repeats):
            for kind, cmd in (("imports", IMPORTS), ("generate", generate_cmd(model, db))):
                r = timed(cmd)
                runs[kind].append(r)
                log(f"  {kind} #{i + 1}: wall {r['wall_s']:.2f} s, CPU {r['cpu_s']:.2f} s (load {_load()})")
    out: dict[str, Any] = {kind: _summary(rs) for kind, rs in runs.items()}
    out["difference"] = {
        k: round(out["generate"][k]["median"] - out["imports"][k]["median"], 3) for k in ("wall_s", "cpu_s")
    }
    return out


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def markdown(result: dict[str, Any], model: str) -> str:
    rows = [
        ('python -c "import torch, transformers"', result["imports"]),
        (f"suffixspec generate --model {model} --max-tokens {TOKENS}", result["generate"]),
    ]
    lines = ["| command | wall s (median, min-max) | CPU s (median) |", "|---|---:|---:|"]
    for name, r in rows:
        w = r["wall_s"]
        lines.append(
            f"| {name} | {w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | {r['cpu_s']['median']:.2f} |"
        )
    d = result["difference"]
    lines.append(f"| difference | {d['wall_s']:.2f} | {d['cpu_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    print(f"load average before: {_load()}")
    result = run(args.model, args.repeats)
    print(markdown(result, args.model) + f"load average after: {_load()}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"meta": {"model": args.model, "repeats": args.repeats}, "results": result}, indent=2)
        )


if __name__ == "__main__":
    main()
