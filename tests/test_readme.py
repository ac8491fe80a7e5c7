"""Every shell command in the README's ```bash blocks runs as written in a fresh checkout.

The commands run in order, in a copy of the files git tracks (nothing untracked, such as a local
docs/ folder, can make a command pass here and fail for a new user), with `suffixspec` from this
environment and a temporary SUFFIXSPEC_DB. ``suffixspec serve`` is started in the background (on a
free port: ``--port N`` becomes ``--port 0`` and ``127.0.0.1:N`` in later commands the port it
reports) and stopped with SIGTERM at the end; curl answers must be JSON without an ``error``.
A few commands cannot run in a unit test; SKIP names them and says why. A new README command is
run by default.
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
TIMEOUT_S = 300  # per command; a loaded 2-core machine takes ~20 s to start the CLI with the embedded models

# (pattern on the command, why it does not run here)
SKIP = [
    (r"^pip install\b", "installs packages: the tests run in the installed environment"),
    (r"^python -m pytest\b", "the test suite itself"),
    (r"^suffixspec bench\b(?!.*--help)", "benchmarks take minutes (--quick too); tests/test_bench.py runs one on tiny models"),
    (r"^python -m bench\.", "benchmarks take minutes"),
    (r"^python -m vllm\b", "needs a vLLM environment; tests/test_vllm.py runs vLLM's CPU build"),
    (r"train_default_models", "retrains the embedded models (an hour or more)"),
]


def shell_commands(markdown: str) -> list[tuple[int, str]]:
    """(line number, command) for each command of the ```bash / ```sh / ```shell blocks, in order.

    A command ends at a line that closes every quote and does not end in a backslash, so a curl
    with a multi-line JSON body is one command. Comment lines and blank lines are dropped.
    """
    out: list[tuple[int, str]] = []
    in_block, pending, start = False, "", 0
    for no, line in enumerate(markdown.splitlines(), 1):
        if line.startswith("```"):
            in_block = line.strip("`").strip() in ("bash", "sh", "shell", "console")
            pending = ""
            continue
        if not in_block or (not pending and (not line.strip() or line.lstrip().startswith("#"))):
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


def _skip_reason(cmd: str) -> str | None:
    return next((why for pat, why in SKIP if re.search(pat, cmd)), None)


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


def test_readme_shell_commands_are_found():
    cmds = [c for _, c in shell_commands(README.read_text())]
    assert any(c.startswith("suffixspec generate") for c in cmds)
    assert any(c.startswith("suffixspec serve") for c in cmds)
    curl = next(c for c in cmds if c.startswith("curl"))
    assert curl.rstrip().endswith("}'")  # the multi-line JSON body stays in its command


@pytest.mark.slow  # the README's commands run the default model, SmolLM2-135M-Instruct
@pytest.mark.real_model
def test_readme_commands_run_as_written(tmp_path):
    checkout = _fresh_checkout(tmp_path / "clone")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SUFFIXSPEC_API_KEY")}
    env.update(SUFFIXSPEC_DB=str(tmp_path / "readme.db"), HF_HUB_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    server: subprocess.Popen | None = None
    ports: dict[str, str] = {}  # port written in the README -> the port the server got
    ran, skipped = [], []
    try:
        for line_no, cmd in shell_commands(README.read_text()):
            why = _skip_reason(cmd)
            if why:
                skipped.append(f"README.md:{line_no} {cmd.splitlines()[0]} ({why})")
                continue
            where = f"README.md:{line_no}: {cmd}"
            if re.match(r"^(\w+=\S+ )*suffixspec serve\b", cmd):
                assert server is None, f"{where}: a second server"
                m = re.search(r"--port[ =](\d+)", cmd)
                port = m.group(1) if m else "8000"
                run_cmd = re.sub(r"--port[ =]\d+", "--port 0", cmd) if m else cmd + " --port 0"
                server, url = start_server_process(["bash", "-c", "exec " + run_cmd], checkout, env, TIMEOUT_S, where)
                ports[port] = url.rsplit(":", 1)[1]
                ran.append(where)
                continue
            for written, real in ports.items():
                cmd = cmd.replace(f"127.0.0.1:{written}", f"127.0.0.1:{real}").replace(
                    f"localhost:{written}", f"localhost:{real}")
            if re.search(r"(127\.0\.0\.1|localhost):\d+", cmd) and server is None:
                raise AssertionError(f"{where}: needs the server, but no README command before it starts one")
            res = subprocess.run(["bash", "-c", cmd], cwd=checkout, env=env, capture_output=True, text=True,
                                 timeout=TIMEOUT_S)
            assert res.returncode == 0, f"{where}\nexit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
            if cmd.startswith("curl"):
                body = json.loads(res.stdout)
                assert "error" not in body, f"{where}\n{res.stdout[:2000]}"
            ran.append(where)
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    print("ran:", *ran, "skipped:", *skipped, sep="\n  ")
    assert len(ran) >= 4, ran  # generate, serve, index add, index stats at least
