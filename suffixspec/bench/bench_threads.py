"""The decode speed a user gets with default settings, against fixed thread counts, idle and busy.

Issue 38's bar: ``suffixspec generate`` with default settings decodes at least 0.9x the speed of
``OMP_NUM_THREADS=1``, on an idle machine (and there the faster of the two) and with one other busy
process. Each run is a fresh ``suffixspec generate --json`` process (a copy-heavy edit, the README's
quick start, history off so runs are independent); the settings alternate within every repeat, so a
change of load hits all of them, and the busy condition starts one ``python -c 'while True: pass'``
of its own (killed afterwards); "arrives" starts it while the request decodes (after its first
``ARRIVE_AFTER`` tokens, in one process that streams the README's open question, ``ignore_eos``), and
reports the speed from then on: what the re-check that load starts at once is for. Settings:

- ``default``: nothing set (suffixspec measures the thread count at start and re-checks it);
- ``one thread``: ``OMP_NUM_THREADS=1``;
- ``all cores, spinning``: ``OMP_NUM_THREADS=<cores>`` and ``OMP_WAIT_POLICY=`` (empty: OpenMP's own
  wait, which spins), what suffixspec ran on before it chose threads itself.

    python -m suffixspec.bench.bench_threads [--repeats 3] [--conditions idle,busy,arrives] [--json out.json]

Example (one run on 2 cores, 2026-12-03, decode tokens/s, medians of 3)::

    | condition | default | one thread | all cores, spinning | default / one thread |
    | idle | 520.6 | 337.9 | 531.3 | 1.54 |
    | busy | 297.9 | 301.1 | 120.7 | 0.99 |
    | arrives | 34.5 | 39.1 | 12.7 | 0.88 |
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

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "edit.txt"
BUSY = [sys.executable, "-c", "while True: pass"]
QUESTION = "What does a Python list comprehension do? Give one short example."
ARRIVE_AFTER = 48  # tokens decoded before the busy process starts, in the "arrives" condition
CONDITIONS = ("idle", "busy", "arrives")


def settings(cores: int) -> dict[str, dict[str, str | None]]:
    """Name -> environment changes (None: unset)."""
    return {"default": {"OMP_NUM_THREADS": None, "OMP_WAIT_POLICY": None},
            "one thread": {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": None},
            "all cores, spinning": {"OMP_NUM_THREADS": str(cores), "OMP_WAIT_POLICY": ""}}


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _child(cmd: list[str], env_changes: dict[str, str | None]) -> tuple[str, float]:
    """Run ``cmd`` with the environment changed (None: unset): its stdout and wall seconds."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {res.returncode}): {res.stderr[-800:]}")
    return res.stdout, wall


def generate(model: str, prompt_file: Path, max_tokens: int, db: Path, env_changes: dict[str, str | None]) -> dict:
    """One ``suffixspec generate --json`` process: its decode tokens/s, steps, wall seconds and threads."""
    cmd = [sys.executable, "-m", "suffixspec", "generate", "--prompt-file", str(prompt_file), "--chat",
           "--model", model, "--max-tokens", str(max_tokens), "--no-history", "--db", str(db), "--json"]
    stdout, wall = _child(cmd, env_changes)
    out = json.loads(stdout)
    return {"decode_tokens_per_s": out["timing"]["decode_tokens_per_s"], "steps": out["speculative_decoding"]["steps"],
            "wall_s": round(wall, 2), "threads": out["threads"]["threads"], "load": _load()}


def arrives(model: str, max_tokens: int, env_changes: dict[str, str | None]) -> dict:
    """One child process that streams :data:`QUESTION` and starts a busy process after ``ARRIVE_AFTER``
    tokens: decode tokens/s before and after, and the threads it ended on (with its switches)."""
    cmd = [sys.executable, "-m", "suffixspec.bench.bench_threads", "--arrives-child", "--model", model,
           "--max-tokens", str(max_tokens)]
    stdout, _ = _child(cmd, env_changes)
    return {**json.loads(stdout.splitlines()[-1]), "load": _load()}


def _arrives_child(model: str, max_tokens: int) -> None:
    """The "arrives" run, inside the child: prints one JSON line."""
    from suffixspec import SuffixSpec

    with tempfile.TemporaryDirectory(prefix="suffixspec-arrives-") as tmp:
        ss = SuffixSpec(model, db=Path(tmp) / "index.db", history=False)
        busy = None
        marks: list[tuple[int, float]] = []  # (tokens so far, time) at the first step, at arrival, at the end
        tokens = 0
        try:
            for ev in ss.stream(messages=[{"role": "user", "content": QUESTION}], max_tokens=max_tokens,
                                temperature=0.0, ignore_eos=True):
                tokens += len(ev.token_ids)
                if not marks:
                    marks.append((tokens, time.perf_counter()))
                elif busy is None and tokens >= ARRIVE_AFTER:
                    busy = subprocess.Popen(BUSY)
                    marks.append((tokens, time.perf_counter()))
                if ev.result is not None:
                    tokens = len(ev.result.token_ids)
            marks.append((tokens, time.perf_counter()))
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        threads = ss.threads
        ss.close()
    (t0, s0), (t1, s1), (t2, s2) = marks if len(marks) == 3 else (marks[0], marks[0], marks[-1])
    after = round((t2 - t1) / max(s2 - s1, 1e-9), 1)
    print(json.dumps({"before_tokens_per_s": round((t1 - t0) / max(s1 - s0, 1e-9), 1),
                      "after_tokens_per_s": after, "decode_tokens_per_s": after,  # the table's column: after
                      "tokens": t2, "threads": threads["threads"], "switches": threads["switches"],
                      "rechecks": threads["rechecks"]}))


def run(model: str = "smollm2-135m-instruct", repeats: int = 3, conditions: tuple[str, ...] = ("idle", "busy"),
        max_tokens: int = 128, prompt_file: Path = EXAMPLE, log=print) -> dict[str, Any]:
    """{condition: {setting: {"runs": [...], "median_tokens_per_s"}}, "ratio": default / one thread}."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    table = settings(cores)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="suffixspec-threads-") as tmp:
        db = Path(tmp) / "index.db"
        generate(model, prompt_file, 8, db, table["one thread"])  # untimed: converts the model if needed
        for cond in conditions:
            busy = subprocess.Popen(BUSY) if cond == "busy" else None
            try:
                runs: dict[str, list[dict]] = {name: [] for name in table}
                for i in range(repeats):
                    for name, changes in table.items():
                        if cond == "arrives":
                            r = arrives(model, max(max_tokens, 4 * ARRIVE_AFTER), changes)
                            log(f"  {cond} #{i + 1} {name}: {r['before_tokens_per_s']} tokens/s before the busy "
                                f"process, {r['after_tokens_per_s']} after; ended on {r['threads']} thread(s), "
                                f"{r['switches']} switch(es) (load {r['load']})")
                        else:
                            r = generate(model, prompt_file, max_tokens, db, changes)
                            log(f"  {cond} #{i + 1} {name}: {r['decode_tokens_per_s']} tokens/s, {r['threads']} "
                                f"thread(s), {r['steps']} steps, {r['wall_s']} s wall (load {r['load']})")
                        runs[name].append(r)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            med = {name: statistics.median(r["decode_tokens_per_s"] or 0.0 for r in rs) for name, rs in runs.items()}
            out[cond] = {name: {"runs": rs, "median_tokens_per_s": round(med[name], 1)} for name, rs in runs.items()}
            out[cond]["ratio"] = round(med["default"] / med["one thread"], 2) if med["one thread"] else None
    return out


def markdown(result: dict[str, Any]) -> str:
    names = list(settings(2))
    lines = ["| condition | " + " | ".join(names) + " | default / one thread | load (first-last) |",
             "|---|" + "---:|" * (len(names) + 2)]
    for cond, r in result.items():
        loads = [x["load"] for name in names for x in r[name]["runs"]]
        lines.append(f"| {cond} | " + " | ".join(f"{r[n]['median_tokens_per_s']:.1f}" for n in names)
                     + f" | {r['ratio']:.2f} | {min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--conditions", default="idle,busy", help="comma-separated: idle, busy, arrives")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-file", type=Path, default=EXAMPLE)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--arrives-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.arrives_child:
        _arrives_child(args.model, args.max_tokens)
        return
    if not args.prompt_file.is_file():  # examples/ is in a checkout, not in the installed package
        ap.error(f"no prompt file {args.prompt_file}; run from a checkout or give --prompt-file")
    conditions = tuple(c.strip() for c in args.conditions.split(",") if c.strip())
    if any(c not in CONDITIONS for c in conditions):
        ap.error(f"--conditions takes {', '.join(CONDITIONS)}")
    print(f"load average before: {_load()}")
    result = run(args.model, args.repeats, conditions, args.max_tokens, args.prompt_file)
    print(markdown(result) + f"load average after: {_load()}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": {"model": args.model, "repeats": args.repeats,
                                                  "max_tokens": args.max_tokens}, "results": result}, indent=2))


if __name__ == "__main__":
    main()
