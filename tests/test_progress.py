"""Progress where stderr is no terminal (a log file, CI, a pipe): plain lines, no carriage return, no escape
code (suffixspec/progress.py). The conversion runs for real in a subprocess whose stderr is a pipe, with
``transformers`` drawing its own bars underneath."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_models import write_tiny_gguf

from suffixspec.progress import LineProgress, progress_bar

ROOT = Path(__file__).resolve().parents[1]


def _plain(text: str) -> None:
    assert "\r" not in text and "\x1b" not in text, repr(text[-2000:])


def test_off_a_terminal_each_status_is_one_plain_line():
    out = io.StringIO()  # no terminal
    bar = progress_bar(stream=out, total=4, desc="converting x (once)", unit="step", bar_format="{desc}")
    assert isinstance(bar, LineProgress)
    bar.set_postfix_str("reading the file")
    bar.update()
    bar.set_postfix_str("building the tokenizer")
    bar.set_postfix_str("building the tokenizer")  # no change: no line
    bar.update(3)
    bar.close()
    bar.close()  # once
    _plain(out.getvalue())
    assert out.getvalue().splitlines() == ["converting x (once): 0/4 reading the file",
                                           "converting x (once): 1/4 building the tokenizer",
                                           "converting x (once): 4/4 done"]


def test_off_a_terminal_a_moving_count_writes_at_most_every_few_seconds():
    out = io.StringIO()
    with LineProgress(total=2_000_000, desc="indexing", stream=out, unit="B", unit_scale=True, every_s=3600) as bar:
        for _ in range(1000):
            bar.update(2000)
            bar.set_postfix_str("some tokens", refresh=False)  # tqdm's quiet update: no line
    assert out.getvalue().splitlines() == ["indexing: 2.0MB/2.0MB done"]
    silent = io.StringIO()
    with LineProgress(total=1, desc="x", stream=silent, disable=True) as bar:  # tqdm's disable=True
        bar.set_postfix_str("a")
    assert silent.getvalue() == ""


@pytest.mark.slow  # a subprocess that imports transformers and converts a model
def test_a_conversion_into_a_pipe_writes_plain_lines(tmp_path, bpe_tokenizer_dir):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", bpe_tokenizer_dir)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SUFFIXSPEC_CACHE": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-m", "suffixspec", "models", "--convert", str(gguf)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    _plain(res.stderr)
    lines = [line for line in res.stderr.splitlines() if "converting" in line or "de-quantizing" in line]
    assert lines[0] == "converting tiny.gguf (once): 0/4 reading the file", res.stderr[-3000:]
    assert lines[-1] == "converting tiny.gguf (once): 4/4 done", res.stderr[-3000:]
    assert not [line for line in lines if "de-quantizing" in line]  # transformers' own bar stayed off


def test_an_index_add_into_a_pipe_writes_plain_lines(tmp_path, bpe_tokenizer_dir):
    from click.testing import CliRunner

    from suffixspec.cli import main

    for n in range(3):
        (tmp_path / "docs" / f"note{n}.md").parent.mkdir(exist_ok=True)
        (tmp_path / "docs" / f"note{n}.md").write_text(f"note {n}: " + "some words to index " * 50)
    res = CliRunner().invoke(main, ["index", "add", str(tmp_path / "docs"), "--db", str(tmp_path / "t.db"),
                                    "--tokenizer", str(bpe_tokenizer_dir), "--nice", "0"])
    assert res.exit_code == 0, res.output
    _plain(res.output)
    assert any(line.startswith("indexing: ") and line.endswith(" done") for line in res.output.splitlines()), \
        res.output
