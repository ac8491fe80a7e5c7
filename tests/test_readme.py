"""Every command and Python snippet in README.md and docs/*.md runs as written in a fresh checkout.

Each page runs on its own, its code blocks in order, in a copy of the files git tracks (nothing
untracked can make a command pass here and fail for a new user), with `suffixspec` and `python`
from this environment importing the copy's code, and a temporary SUFFIXSPEC_DB. A ```bash block
is split into commands; a ```python block runs as one script. ``suffixspec serve`` starts in the
background (``--port N`` becomes ``--port 0``, and ``127.0.0.1:N`` in later blocks the port it
reports) and is stopped with SIGTERM at the end of the page. A curl answer must be JSON without an
``error`` (or a stream ending in ``[DONE]``). SKIP names what cannot run in a test, and why; a new
block runs by default. The pages run the real model they name (``real_model``); the docs/ pages'
test is tests/test_docs_pages.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import start_server_process

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 900  # per command: a hang fails; a 2-core machine shared by many jobs took 3 min for a 16-token real-model run

# (pattern on the command or snippet, why it does not run here)
SKIP = [
    (r"^pip install\b", "installs packages: the tests run in the installed environment"),
    (r"^python -m venv\b|^vllm-env/", "builds vLLM's environment (3.4 GB); tests/test_vllm.py runs vLLM's CPU build"),
    (r"^python -m pytest\b", "the test suite itself"),
    (r"^suffixspec bench\b(?!.*--help)", "benchmarks take minutes (--quick too); tests/test_bench.py runs one on tiny models"),
    (r"^python -m bench\.|^python -m suffixspec\.bench\.", "benchmarks take minutes"),
    (r"^python examples/\w+_rag\.py", "the RAG examples are measurements (about 10 minutes each); "
                                       "tests/test_integrations_*.py run the same pipelines on tiny models"),
    (r"^python -m vllm\b|^from vllm\b", "needs a vLLM environment; tests/test_vllm.py runs vLLM's CPU build"),
    (r"train_default_models", "retrains the embedded models (an hour or more)"),
    (r"gemma-3-270m", "Gemma 3 270M is the gemma tier's (minutes of CPU): tests/test_real_models.py runs it"),
    (r"qwen2\.5-coder", "the Qwen coder pair is the qwen tier's (7 GB of float32 weights): tests/test_qwen.py runs it"),
    (r"get_paths\(\)\[.(purelib|stdlib).\]", "indexes the standard library or every package of the environment "
                                             "(millions of tokens: a quarter of an hour at a low priority on a busy "
                                             "machine); the same page indexes one package and a folder"),
]


def code_blocks(markdown: str) -> list[tuple[int, str, str]]:
    """(line number of the first line, language, text) of each fenced block, in order."""
    out, lang, start, buf = [], None, 0, []
    for no, line in enumerate(markdown.splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, start, buf = line.strip("`").strip(), no + 1, []
            else:
                out.append((start, lang, "\n".join(buf)))
                lang = None
            continue
        if lang is not None:
            buf.append(line)
    return out


def shell_commands(text: str, first_line: int = 1) -> list[tuple[int, str]]:
    """(line number, command) for each command of a shell block.

    A command ends at a line that closes every quote and does not end in a backslash, so a curl
    with a multi-line JSON body is one command. Comment lines and blank lines are dropped.
    """
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for no, line in enumerate(text.splitlines(), first_line):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            start = no
        pending += line + "\n"
        if line.endswith("\\"):
            continue
        try:
            shlex.split(pending)
        except ValueError:  # an open quote: the command goes on
            continue
        out.append((start, pending.strip()))
        pending = ""
    return out


def units(markdown: str) -> list[tuple[int, str, str]]:
    """(line, "sh" or "python", code): the shell commands and Python snippets of a page, in order."""
    out: list[tuple[int, str, str]] = []
    for line, lang, text in code_blocks(markdown):
        if lang in ("bash", "sh", "shell", "console"):
            out += [(no, "sh", cmd) for no, cmd in shell_commands(text, line)]
        elif lang == "python":
            out.append((line, "python", text))
    return out


def _skip_reason(code: str) -> str | None:
    return next((why for pat, why in SKIP if re.search(pat, code, re.M)), None)


def _fresh_checkout(dst: Path) -> Path:
    """The files git tracks (with this worktree's uncommitted edits), as a fresh clone has them."""
    try:
        files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def _check_curl(where: str, stdout: str) -> None:
    if stdout.startswith("data: "):  # a stream: events, then [DONE]
        # each event parsed: a streamed token whose text is "error" is no error event
        events = [line.removeprefix("data: ") for line in stdout.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", f"{where}\n{stdout[-2000:]}"
        for event in events[:-1]:
            assert "error" not in json.loads(event), f"{where}\n{event[:2000]}"
        return
    body = json.loads(stdout)
    assert "error" not in body, f"{where}\n{stdout[:2000]}"


def run_page(page: Path, tmp_path: Path) -> tuple[list[str], list[str]]:
    """Run a page's commands and snippets in a fresh checkout; (what ran, what was skipped and why)."""
    checkout = _fresh_checkout(tmp_path / "clone")
    name = page.relative_to(ROOT).as_posix()
    env = {k: v for k, v in os.environ.items() if k not in ("SUFFIXSPEC_API_KEY",)}
    env.update(SUFFIXSPEC_DB=str(tmp_path / "docs.db"), HF_HUB_OFFLINE="1", PYTHONPATH=str(checkout),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    server: subprocess.Popen | None = None
    ports: dict[str, str] = {}  # port written on the page -> the port the server got
    ran, skipped = [], []
    try:
        for line_no, kind, code in units(page.read_text()):
            why = _skip_reason(code)
            where = f"{name}:{line_no}: {code.splitlines()[0]}"
            if why:
                skipped.append(f"{where} ({why})")
                continue
            if kind == "sh" and re.match(r"^(\w+=\S+ )*suffixspec serve\b", code):
                assert server is None, f"{where}: a second server on one page"
                m = re.search(r"--port[ =](\d+)", code)
                port = m.group(1) if m else "8000"
                run_cmd = re.sub(r"--port[ =]\d+", "--port 0", code) if m else code + " --port 0"
                server, url = start_server_process(["bash", "-c", "exec " + run_cmd], checkout, env, TIMEOUT_S, where)
                ports[port] = url.rsplit(":", 1)[1]
                ran.append(where)
                continue
            for written, real in ports.items():
                code = code.replace(f"127.0.0.1:{written}", f"127.0.0.1:{real}").replace(
                    f"localhost:{written}", f"localhost:{real}")
            if re.search(r"(127\.0\.0\.1|localhost):\d+", code) and server is None:
                raise AssertionError(f"{where}: needs the server, but no command before it on the page starts one")
            if kind == "python":
                script = tmp_path / f"snippet_{line_no}.py"
                script.write_text(code + "\n")
                argv = [sys.executable, str(script)]
            else:
                argv = ["bash", "-c", code]
            res = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            assert res.returncode == 0, f"{where}\nexit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
            if kind == "sh" and code.startswith("curl"):
                _check_curl(where, res.stdout)
            ran.append(where)
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return ran, skipped


# -- the parser, on text made here (fast) ------------------------------------------------------------

def test_blocks_are_split_into_commands_and_snippets():
    page = ("text\n```bash\n# a comment\nsuffixspec index add docs/ \\\n  --glob '*.md'\n\n"
            "curl -s http://127.0.0.1:8000/x -d '{\n  \"a\": 1}'\n```\n"
            "```python\nimport os\nprint(os.sep)\n```\n```json\n{\"error\": {}}\n```\n")
    got = units(page)
    assert [(kind, code.splitlines()[0]) for _, kind, code in got] == [
        ("sh", "suffixspec index add docs/ \\"), ("sh", "curl -s http://127.0.0.1:8000/x -d '{"),
        ("python", "import os")]
    assert got[1][2].endswith("}'") and got[0][0] == 4 and got[2][0] == 11
    assert _skip_reason("from vllm import LLM\nllm = 1") and _skip_reason("pip install x")
    assert _skip_reason("suffixspec bench --help") is None and _skip_reason("suffixspec generate x") is None


def test_every_block_says_its_language():
    """A command cannot hide from the run below in an unlabelled block: each block is run or says it is data
    (a ``diff`` shows a change to the reader's own code)."""
    for page in PAGES:
        for line, lang, _ in code_blocks(page.read_text()):
            assert lang in ("bash", "python", "json", "text", "diff"), \
                f"{page.name}:{line}: a ``` block without bash/python/json/text/diff"


def test_readme_links_resolve():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).resolve().is_file(), (page.name, target)


# -- the pages, run -------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.real_model
def test_readme_runs_as_written(tmp_path):
    """README.md (docs/*.md: tests/test_docs_pages.py, a module of its own so that pytest -n runs the
    pages beside the README)."""
    ran, skipped = run_page(README, tmp_path)
    print("ran:", *ran, "skipped:", *skipped, sep="\n  ")
