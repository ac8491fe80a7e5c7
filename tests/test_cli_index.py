"""`suffixspec index add/list/remove/stats` on a temporary tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from suffixspec.cli.index import index_group

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
    assert len(rows) == 3 and all(r["num_tokens"] > 0 and sum(r["tokens"].values()) == r["num_tokens"] for r in rows)

    stats = json.loads(run(["stats", "--json"], db).output)
    assert stats["documents"] == 3 and stats["bytes_on_disk"] > 0 and stats["memory_estimate_bytes"] > 0
    assert "memory estimate" in run(["stats"], db).output

    # re-adding is a no-op; a changed file is an update
    (tree / "pkg" / "mod.py").write_text("def add(a, b):\n    return b + a\n")
    res = run(["add", str(tree), "--tokenizer", str(bpe_tokenizer_dir), "--max-bytes", "4096", "-q"], db)
    assert "added 0, updated 1, unchanged 2, skipped 3" in res.output

    mod = next(r for r in rows if r["source"].endswith("mod.py"))
    res = run(["remove", str(mod["id"]), str(tree / "readme.md")], db)
    assert "removed 2 document(s)" in res.output
    assert [r["source"].endswith("deep.py") for r in map(json.loads, run(["list", "--json"], db).output.splitlines())] \
        == [True]


def test_glob_filters_names(tree, tmp_path, bpe_tokenizer_dir):
    db = tmp_path / "g.db"
    res = run(["add", str(tree), "--glob", "*.py", "--tokenizer", str(bpe_tokenizer_dir), "-q"], db)
    assert "added 2, updated 0, unchanged 0, skipped 0" in res.output


def test_exclude_leaves_directories_and_files_out_and_the_summary_says_time_size_memory(tree, tmp_path,
                                                                                       bpe_tokenizer_dir):
    (tree / "pkg" / "tests").mkdir()
    (tree / "pkg" / "tests" / "test_mod.py").write_text("def test_add():\n    assert add(1, 2) == 3\n")
    (tree / "pkg" / "test_utils.py").write_text("def helper():\n    return 1\n")
    db = tmp_path / "x.db"
    res = run(["add", str(tree), "--glob", "*.py", "--exclude", "test*", "--exclude", "sub",
               "--tokenizer", str(bpe_tokenizer_dir), "-q"], db)
    assert res.exit_code == 0, res.output
    assert "added 1, updated 0, unchanged 0, skipped 0" in res.output  # pkg/mod.py alone
    sources = [json.loads(line)["source"] for line in run(["list", "--json"], db).output.splitlines()]
    assert [Path(s).name for s in sources] == ["mod.py"]
    line = next(x for x in res.output.splitlines() if x.startswith("took "))
    on_disk = sum(p.stat().st_size for p in [db, *db.parent.glob(db.name + "-*"), *Path(f"{db}.arrays").iterdir()]
                  if p.is_file())
    assert " s; on disk " in line and "written by this add); peak memory " in line
    assert on_disk > 0 and "0 B written" not in line


def test_exclude_through_the_python_api(tree, tmp_path, bpe_tokenizer_dir):
    from suffixspec.index import DocumentIndex
    from suffixspec.loading import load_tokenizer

    (tree / "pkg" / "tests").mkdir()
    (tree / "pkg" / "tests" / "test_mod.py").write_text("def test_add():\n    assert add(1, 2) == 3\n")
    with DocumentIndex(tmp_path / "api.db", tokenizer=load_tokenizer(str(bpe_tokenizer_dir))) as index:
        kept = index.find_files([tree], ["*.py"], exclude=["tests"])
        assert sorted(c.path.name for c in kept.candidates) == ["deep.py", "mod.py"]
        summary = index.add_paths([tree], ["*.py"], exclude=["tests", "sub"])
        assert summary.added == 1


@pytest.mark.slow  # starts a writer process
def test_add_in_this_process_or_a_writer_process_gives_the_same_index(tree, tmp_path, bpe_tokenizer_dir,
                                                                       monkeypatch):
    """--nice 0 adds in the CLI's process; by default an add of 1 MiB of text or more hands tokenizing and
    sorting to a writer process (here: of 1 byte or more)."""
    from suffixspec.index import document_index

    monkeypatch.setattr(document_index, "WRITER_PROCESS_CHARS", 1)
    dumps = []
    for nice in ("0", "10"):
        db = tmp_path / f"n{nice}.db"
        res = run(["add", str(tree), "--glob", "*.py", "--tokenizer", str(bpe_tokenizer_dir), "-q", "--nice", nice], db)
        assert "added 2, updated 0, unchanged 0, skipped 0" in res.output
        rows = [json.loads(line) for line in run(["list", "--json"], db).output.splitlines()]
        dumps.append([(r["source"], r["content_hash"], r["tokens"]) for r in rows])
    assert dumps[0] == dumps[1]


def test_env_selects_database(tree, tmp_path, bpe_tokenizer_dir, monkeypatch):
    monkeypatch.setenv("SUFFIXSPEC_DB", str(tmp_path / "env.db"))
    res = CliRunner().invoke(index_group, ["add", str(tree / "readme.md"), "--tokenizer", str(bpe_tokenizer_dir)])
    assert res.exit_code == 0 and (tmp_path / "env.db").exists()


def test_bad_tokenizer_is_a_clear_error(tree, tmp_path):
    res = CliRunner().invoke(index_group, ["add", str(tree), "--db", str(tmp_path / "x.db"),
                                           "--tokenizer", str(tmp_path / "no-such-model")])
    assert res.exit_code != 0 and "cannot load the tokenizer of" in res.output and "--model" in res.output


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


# --- what the walk skips, and saying so ---------------------------------------------------------------------


def test_links_out_of_the_tree_are_skipped_unless_asked(tmp_path, bpe_tokenizer_dir):
    outside = tmp_path / "outside"
    (outside / "private").mkdir(parents=True)
    (outside / "secret.txt").write_text("TOP SECRET password\n")
    (outside / "private" / "key.txt").write_text("another secret\n")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    (docs / "secret.txt").symlink_to(outside / "secret.txt")  # a file link out of the tree
    (docs / "private").symlink_to(outside / "private")  # a directory link out of the tree
    (docs / "alias.md").symlink_to(docs / "a.md")  # inside the tree: the same file, indexed once
    db = tmp_path / "l.db"
    res = run(["add", str(docs), "--tokenizer", str(bpe_tokenizer_dir)], db)
    assert res.exit_code == 0, res.output
    assert "added 1, updated 0, unchanged 0, skipped 2" in res.output
    assert f"skipped {docs / 'secret.txt'}: symlink outside the given paths (-> {outside / 'secret.txt'})" in res.output
    assert f"skipped {docs / 'private'}: symlink outside the given paths" in res.output and "--follow-links" in res.output
    assert "skipped: 2 symlink outside the given paths" in res.output
    paths = [json.loads(line)["source"] for line in run(["list", "--json"], db).output.splitlines()]
    assert paths == [str(docs / "a.md")]

    res = run(["add", str(docs), "--follow-links", "--tokenizer", str(bpe_tokenizer_dir)], db)
    assert res.exit_code == 0 and "added 2, updated 0, unchanged 1, skipped 0" in res.output, res.output
    paths = {json.loads(line)["source"] for line in run(["list", "--json"], db).output.splitlines()}
    assert paths == {str(docs / "a.md"), str(outside / "secret.txt"), str(outside / "private" / "key.txt")}


def test_fifos_loops_and_dangling_links_are_named(tmp_path, bpe_tokenizer_dir):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "ok.txt").write_text("fine\n")
    os.mkfifo(docs / "pipe")  # opening it would block the walk forever
    (docs / "gone.md").symlink_to(docs / "no-such-file.md")
    (docs / "loop1").symlink_to(docs / "loop2")
    (docs / "loop2").symlink_to(docs / "loop1")
    (docs / "sub" / "up").symlink_to(docs)  # a directory link to an ancestor
    res = run(["add", str(docs), "--tokenizer", str(bpe_tokenizer_dir)], tmp_path / "f.db")
    assert res.exit_code == 0, res.output
    assert "added 1, updated 0, unchanged 0, skipped 5" in res.output
    for line in (f"{docs / 'pipe'}: not a regular file (FIFO)", f"{docs / 'gone.md'}: dangling symlink",
                 f"{docs / 'loop1'}: symlink loop", f"{docs / 'loop2'}: symlink loop",
                 f"{docs / 'sub' / 'up'}: symlink loop"):
        assert f"warning: skipped {line}" in res.output
    assert "skipped: 3 symlink loop, 1 dangling symlink, 1 not a regular file" in res.output
    # even following links, the ancestor loop ends
    res = run(["add", str(docs), "--follow-links", "--tokenizer", str(bpe_tokenizer_dir), "-q"], tmp_path / "f.db")
    assert "added 0, updated 0, unchanged 1, skipped 5" in res.output


def test_binary_is_judged_before_size(tmp_path, bpe_tokenizer_dir):
    lib = tmp_path / "lib"
    lib.mkdir()
    # a 3.4 MB shared library: binary, though it is also over the 2 MiB text limit
    (lib / "_ext.so").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(56) + os.urandom(3_400_000))
    (lib / "dump.sql").write_text("INSERT INTO t VALUES (1);\n" * 100_000)  # 2.6 MB of text: too large
    (lib / "mod.py").write_text("x = 1\n")
    res = run(["add", str(lib), "--tokenizer", str(bpe_tokenizer_dir)], tmp_path / "b.db")
    assert res.exit_code == 0, res.output
    assert f"skipped {lib / '_ext.so'}: binary\n" in res.output
    assert f"skipped {lib / 'dump.sql'}: too large (2600000 bytes > 2097152)" in res.output
    assert "skipped: 1 binary, 1 too large" in res.output


def test_binary_sniff_reads_only_the_first_bytes(tmp_path):
    import tracemalloc

    from suffixspec.index.files import FileCandidate, read_text

    big = tmp_path / "disk.img"
    with open(big, "wb") as f:  # 64 MiB, sparse: a NUL in the first bytes makes it binary
        f.truncate(64 * 1024 * 1024)
    tracemalloc.start()
    try:
        ft = read_text(FileCandidate(big, big.stat().st_size), max_bytes=1 << 40)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ft.text is None and ft.skip_kind == "binary"
    assert peak < 1024 * 1024  # the whole file would be 64 MiB


def test_a_file_swapped_for_a_fifo_after_the_walk_does_not_hang(tmp_path):
    from suffixspec.index.files import FileCandidate, read_text

    fifo = tmp_path / "was-a-file.txt"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    ft = read_text(FileCandidate(fifo, 10))
    assert ft.text is None and ft.skip_kind == "not a regular file" and "FIFO" in ft.skip_reason


def test_nothing_to_index_is_an_error_with_a_hint(tmp_path, bpe_tokenizer_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / ".hidden").mkdir()
    (empty / ".hidden" / "x.md").write_text("not walked\n")
    db = tmp_path / "n.db"
    res = run(["add", str(empty), "--tokenizer", str(bpe_tokenizer_dir)], db)
    assert res.exit_code == 1
    assert f"Error: nothing to index: no files found under {empty} (hidden directories" in res.output

    (empty / "notes.txt").write_text("words\n")
    res = run(["add", str(empty), "--glob", "*.md", "--tokenizer", str(bpe_tokenizer_dir)], db)
    assert res.exit_code == 1
    assert f"no files found under {empty} matching '*.md'" in res.output and "--glob matches file names" in res.output

    (empty / "a.bin").write_bytes(b"\x00\x01")
    (empty / "b.bin").write_bytes(b"\xff\xfe\x00")
    res = run(["add", str(empty), "--glob", "*.bin", "--tokenizer", str(bpe_tokenizer_dir)], db)
    assert res.exit_code == 1
    assert "nothing to index: all 2 file(s) under" in res.output and "were skipped (2 binary)" in res.output
    assert not db.exists()  # nothing was created

    res = run(["add", str(empty), "--tokenizer", str(bpe_tokenizer_dir), "-q"], db)  # notes.txt: indexed
    assert res.exit_code == 0 and "added 1" in res.output
    res = run(["add", str(empty), "--tokenizer", str(bpe_tokenizer_dir), "-q"], db)  # unchanged is no error
    assert res.exit_code == 0 and "added 0, updated 0, unchanged 1, skipped 2" in res.output


def test_stats_shows_segments_and_pending_merges_and_merge_runs_them(tree, tmp_path, bpe_tokenizer_dir):
    db = tmp_path / "index.db"
    tok = ["--tokenizer", str(bpe_tokenizer_dir), "-q"]
    for i in range(4):  # four adds: four small segments (the CLI merges at the end unless --no-merge)
        (tree / f"new{i}.md").write_text(f"note number {i}\n")
        assert run(["add", str(tree / f"new{i}.md"), *tok, "--no-merge"], db).exit_code == 0
    out = run(["stats"], db).output
    assert "segments:      4" in out and "pending merges: 1" in out and "suffixspec index merge" in out
    stats = json.loads(run(["stats", "--json"], db).output)
    assert stats["segments"] == 4 and stats["pending_merges"] == 1
    assert "1 merge(s) done" in run(["merge"], db).output
    out = run(["stats"], db).output
    assert "segments:      1" in out and "pending merges: 0" in out
    # an add merges by itself: progress and summary stay on one line each
    (tree / "more.md").write_text("more words\n")
    res = run(["add", str(tree), "--tokenizer", str(bpe_tokenizer_dir)], db)
    assert res.exit_code == 0 and "added 5, updated 0, unchanged 4" in res.output


def test_merge_compacts_and_stats_says_when_it_would(tree, tmp_path, bpe_tokenizer_dir):
    db = tmp_path / "index.db"
    tok = ["--tokenizer", str(bpe_tokenizer_dir), "-q"]
    for i in range(2):  # two small segments: no merge is due, a compaction would make one
        (tree / f"part{i}.md").write_text(f"part number {i}\n")
        assert run(["add", str(tree / f"part{i}.md"), *tok, "--no-merge"], db).exit_code == 0
    out = run(["stats"], db).output
    assert "segments:      2" in out and "pending merges: 0" in out and "compaction:    2 segments" in out
    assert "0 merge(s) done" in run(["merge", "--no-compact"], db).output
    assert "1 merge(s) done" in run(["merge"], db).output
    out = run(["stats"], db).output
    assert "segments:      1" in out and "compaction" not in out


# --- which tokenizer documents are indexed for --------------------------------------------------------------


def test_add_defaults_to_the_tokenizer_the_store_was_served_with_and_needs_no_transformers(tmp_path,
                                                                                          bpe_tokenizer_dir):
    """The store keeps the tokenizer it was served or indexed with: the next `index add` without --model
    indexes for it, loaded with the `tokenizers` library alone (transformers imports torch: seconds)."""
    db = tmp_path / "t.db"
    (tmp_path / "a.md").write_text("first note\n")
    (tmp_path / "b.md").write_text("second note\n")
    res = run(["add", str(tmp_path / "a.md"), "--tokenizer", str(bpe_tokenizer_dir)], db)
    assert res.exit_code == 0 and f"indexing for {bpe_tokenizer_dir} (tokenizer " in res.output, res.output
    code = ("import sys; from suffixspec.cli import main; "
            "main(['index', 'add', sys.argv[2], '--db', sys.argv[1]], standalone_mode=False); "
            "print('HEAVY', [m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code, str(db), str(tmp_path / "b.md")], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout and "added 1, updated 0, unchanged 0, skipped 0, tokens " in out.stdout
    assert "the one this store was last served or indexed with" in out.stderr
    rows = [json.loads(line) for line in run(["list", "--json"], db).output.splitlines()]
    assert len(rows) == 2 and len({fp for r in rows for fp in r["tokens"]}) == 1  # one tokenizer for both
    assert f"tokenizer:       {bpe_tokenizer_dir} (" in run(["stats"], db).output


def test_model_comes_from_the_environment(tmp_path, bpe_tokenizer_dir, monkeypatch):
    monkeypatch.setenv("SUFFIXSPEC_MODEL", str(bpe_tokenizer_dir))
    (tmp_path / "a.md").write_text("a note\n")
    res = run(["add", str(tmp_path / "a.md")], tmp_path / "e.db")
    assert res.exit_code == 0 and f"indexing for {bpe_tokenizer_dir} (tokenizer" in res.output
    assert "$SUFFIXSPEC_MODEL)" in res.output and f" for {bpe_tokenizer_dir}  (" in res.output


def test_empty_files_are_skipped_and_counted(tmp_path, bpe_tokenizer_dir):
    pkg = tmp_path / "site-packages" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VERSION = 1\n")
    (pkg / "py.typed").write_text("")
    (pkg / "REQUESTED").write_text("")
    res = run(["add", str(pkg), "--tokenizer", str(bpe_tokenizer_dir)], tmp_path / "p.db")
    assert res.exit_code == 0, res.output
    assert "added 1, updated 0, unchanged 0, skipped 2" in res.output and "skipped: 2 empty" in res.output
    assert f"warning: skipped {pkg / 'py.typed'}: empty" in res.output


def test_list_pages_and_searches_as_the_api_does(tmp_path, bpe_tokenizer_dir):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(5):
        (docs / f"n{i}.md").write_text(f"note {i} about {'cats' if i % 2 else 'dogs'}\n")
    db = tmp_path / "l.db"
    assert run(["add", str(docs), "--tokenizer", str(bpe_tokenizer_dir), "-q"], db).exit_code == 0
    out = run(["list", "--limit", "2", "--offset", "1"], db).output
    assert out.count(".md") == 2 and "2-3 of 5 (--limit / --offset for more)" in out
    rows = [json.loads(line) for line in run(["list", "--query", "cats", "--json"], db).output.splitlines()]
    assert sorted(Path(r["source"]).name for r in rows) == ["n1.md", "n3.md"]
    assert "no documents matching 'birds'" in run(["list", "--query", "birds"], db).output
