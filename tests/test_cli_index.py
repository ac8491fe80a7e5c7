"""`suffixspec index add/list/remove/stats` on a temporary tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from suffixspec.cli_index import index_group

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "docs"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "readme.md").write_text("# Title\n\nSome words about the project.\n")
    (root / "pkg" / "mod.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "pkg" / "sub" / "deep.py").write_text("class Point:\n    def __init__(self, x, y):\n        self.x = x\n")
    (root / "pkg" / "sub" / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(100))
    (root / "pkg" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))  # not UTF-8: skipped as binary
    (root / "big.txt").write_text("x" * 5000)
    (root / ".git" / "config").write_text("[core]\n")  # hidden directories are not walked
    return root


def run(args, db):
    res = CliRunner().invoke(index_group, [*args, "--db", str(db)], catch_exceptions=False)
    return res


def test_add_list_stats_remove(tree, tmp_path, bpe_tokenizer_dir):
    db = tmp_path / "index.db"
    res = run(["add", str(tree), "--tokenizer", str(bpe_tokenizer_dir), "--max-bytes", "4096"], db)
    assert res.exit_code == 0, res.output
    assert "added 3, updated 0, unchanged 0, skipped 3, tokens " in res.output
    for name in ("image.png: binary", "latin1.txt: binary", "big.txt: too large"):
        assert name in res.output
    assert ".git" not in res.output

    listed = run(["list"], db)
    assert listed.exit_code == 0
    assert "readme.md" in listed.output and "deep.py" in listed.output and "image.png" not in listed.output
    rows = [json.loads(line) for line in run(["list", "--json"], db).output.splitlines()]
    assert len(rows) == 3 and all(sum(r["tokens"].values()) > 0 for r in rows)

    stats = json.loads(run(["stats", "--json"], db).output)
    assert stats["documents"] == 3 and stats["bytes_on_disk"] > 0 and stats["memory_estimate_bytes"] > 0
    assert "memory estimate" in run(["stats"], db).output

    # re-adding is a no-op; a changed file is an update
    (tree / "pkg" / "mod.py").write_text("def add(a, b):\n    return b + a\n")
    res = run(["add", str(tree), "--tokenizer", str(bpe_tokenizer_dir), "--max-bytes", "4096", "-q"], db)
    assert "added 0, updated 1, unchanged 2, skipped 3" in res.output

    mod = next(r for r in rows if r["path"].endswith("mod.py"))
    res = run(["remove", str(mod["id"]), str(tree / "readme.md")], db)
    assert "removed 2 document(s)" in res.output
    assert [r["path"].endswith("deep.py") for r in map(json.loads, run(["list", "--json"], db).output.splitlines())] \
        == [True]


def test_glob_filters_names(tree, tmp_path, bpe_tokenizer_dir):
    db = tmp_path / "g.db"
    res = run(["add", str(tree), "--glob", "*.py", "--tokenizer", str(bpe_tokenizer_dir), "-q"], db)
    assert "added 2, updated 0, unchanged 0, skipped 0" in res.output


def test_env_selects_database(tree, tmp_path, bpe_tokenizer_dir, monkeypatch):
    monkeypatch.setenv("SUFFIXSPEC_DB", str(tmp_path / "env.db"))
    res = CliRunner().invoke(index_group, ["add", str(tree / "readme.md"), "--tokenizer", str(bpe_tokenizer_dir)])
    assert res.exit_code == 0 and (tmp_path / "env.db").exists()


def test_bad_tokenizer_is_a_clear_error(tree, tmp_path):
    res = CliRunner().invoke(index_group, ["add", str(tree), "--db", str(tmp_path / "x.db"),
                                           "--tokenizer", str(tmp_path / "no-such-model")])
    assert res.exit_code != 0 and "cannot load tokenizer" in res.output


def test_help_has_examples():
    out = CliRunner().invoke(index_group, ["add", "--help"]).output
    assert "Examples:" in out and "--glob" in out and "--tokenizer" in out


def test_list_does_not_import_torch(tmp_path):
    code = ("import sys; from suffixspec.cli import main; "
            "main(['index', 'list', '--db', sys.argv[1]], standalone_mode=False); "
            "print('HEAVY', [m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "l.db")], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
