"""Adds and merges in a writer process (suffixspec/index/writer.py, suffixspec/index/writer_child.py): the same index as
in-process, and a killed or interrupted writer (or its parent) leaves the previous state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from suffixspec.index import WriterDied, writer
from suffixspec.index.segments import MergePolicy
from suffixspec.index.store import DocInput, IndexStore

pytestmark = pytest.mark.slow  # every test starts writer processes (and kills some)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok(bpe_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(bpe_tokenizer_dir))


def _docs(n: int, tag: str = "") -> list[DocInput]:
    return [DocInput(f"def f{i}(x{tag}):\n    return x * {i} + {i % 7}\n" * (1 + i % 3), f"m{i}{tag}.py",
                     {"i": i}) for i in range(n)]


def _state(db: Path, tok) -> tuple:
    with IndexStore(db) as s:
        docs = [(d["id"], d["path"], d["content_hash"], d["tokens"], d["metadata"]) for d in s.list_documents()]
        idx = s.document_index(tok)
        seqs = sorted(map(tuple, idx.sequences())) if idx is not None else []
        return docs, seqs


def _files(db: Path) -> set[str]:
    d = Path(str(db) + ".arrays")
    return {p.name for p in d.iterdir()} if d.exists() else set()


def test_writer_process_builds_the_same_index(tmp_path, tok):
    """Same documents, ids, token counts and suffix-array contents as an add in this process, several
    segments (small flush) and chunks; progress adds up to the whole add; an unchanged re-add is a no-op."""
    docs = _docs(700)  # > 512 documents: two chunks over the pipe
    here, there = tmp_path / "here.db", tmp_path / "there.db"
    with IndexStore(here, flush_tokens=3000) as s:
        want = s.add_documents(docs, tok)
    seen = []
    statuses = []
    got = writer.add_documents(there, iter(docs), tok, progress=lambda *a: seen.append(a),
                               status=statuses.append, flush_tokens=3000)
    assert got.to_dict() == want.to_dict() and got.added == 700
    assert sum(a[0] for a in seen) == 700 and sum(a[1] for a in seen) == want.tokens
    assert sum(a[2] for a in seen) == sum(len(d.text.encode()) for d in docs)
    assert statuses and all(s.startswith("sorting") for s in statuses)
    a, b = _state(here, tok), _state(there, tok)
    assert a[0] == [(*r[:4], r[4]) for r in b[0]] and a[1] == b[1] and len(a[1]) == 700
    with IndexStore(there) as s:
        assert len(s.segment_infos(s.fingerprints()[0])) > 1
        assert _files(there) == s.referenced_files()
    again = writer.add_documents(there, docs[:10], tok)
    assert again.unchanged == 10 and again.added == 0


def test_writer_process_merges_and_compacts(tmp_path, tok):
    db = tmp_path / "m.db"
    policy = MergePolicy(max_segments=1, idle_compact_s=None)
    for k in range(3):
        with IndexStore(db, policy=policy) as s:
            s.add_documents(_docs(30, f"_{k}"), tok)
    before = _state(db, tok)
    assert writer.merge(db, policy=policy) >= 1
    with IndexStore(db, policy=policy) as s:
        assert len(s.segment_infos(s.fingerprints()[0])) == 1 and _files(db) == s.referenced_files()
    assert _state(db, tok) == before
    stop = threading.Event()
    stop.set()  # a stopped merge changes nothing
    assert writer.merge(db, compact=True, stop=stop, policy=policy) == 0
    assert _state(db, tok) == before


def _kill_at_first_progress(tmp_path, tok, sig_or_exc):
    db = tmp_path / "k.db"
    with IndexStore(db) as s:
        s.add_documents(_docs(5, "_old"), tok)
    before, files_before = _state(db, tok), _files(db)

    def progress(*_a):
        # the child has tokenized its first chunk and waits for the second: find it among our children
        kids = Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children").read_text().split()
        assert len(kids) == 1
        if isinstance(sig_or_exc, int):
            os.kill(int(kids[0]), sig_or_exc)
        else:
            raise sig_or_exc

    return db, before, files_before, progress


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc to find the writer process")
def test_killed_writer_process_leaves_old_state(tmp_path, tok):
    db, before, files_before, progress = _kill_at_first_progress(tmp_path, tok, signal.SIGKILL)
    with pytest.raises(WriterDied, match="killed by SIGKILL"):
        writer.add_documents(db, _docs(1200, "_new"), tok, progress=progress)
    assert _state(db, tok) == before
    with IndexStore(db) as s:  # the next writer collects what the killed one left
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        s.add_documents([DocInput("after the crash", "after.txt")], tok)
        assert _files(db) == s.referenced_files()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc to find the writer process")
def test_interrupted_parent_interrupts_the_writer(tmp_path, tok):
    """Ctrl-C in the parent (here raised by its progress callback): the child is interrupted, rolls back
    and deletes its files before the KeyboardInterrupt goes on."""
    db, before, files_before, progress = _kill_at_first_progress(tmp_path, tok, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        writer.add_documents(db, _docs(1200, "_new"), tok, progress=progress)
    assert _state(db, tok) == before and _files(db) == files_before


_PARENT = textwrap.dedent("""
    import sys, time
    from transformers import AutoTokenizer
    from suffixspec.index import writer
    from suffixspec.index.store import DocInput

    tok = AutoTokenizer.from_pretrained(sys.argv[2])
    docs = [DocInput(f"x{i} = {i}\\n" * 3, f"p{i}.py") for i in range(1200)]
    def progress(*a):
        print("PAUSED", flush=True)
        time.sleep(600)
    writer.add_documents(sys.argv[1], docs, tok, progress=progress)
""")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc to find the writer process")
def test_killed_parent_stops_the_writer(tmp_path, tok, bpe_tokenizer_dir):
    """The parent dies (kill -9) mid-add: the child reads the end of its pipe, aborts, commits nothing."""
    db = tmp_path / "p.db"
    with IndexStore(db) as s:
        s.add_documents(_docs(5, "_old"), tok)
    before, files_before = _state(db, tok), _files(db)
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(db), str(bpe_tokenizer_dir)], stdout=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "PAUSED"
        kids = [int(k) for k in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(kids) == 1
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 120
        while _alive(kids[0]):  # the orphan exits on its own
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _state(db, tok) == before and _files(db) == files_before


def test_suffixspec_adds_large_batches_in_a_writer_process(tmp_path, tiny_model_dirs, monkeypatch):
    """Above WRITER_PROCESS_CHARS the facade's add goes through the writer: same records, and the next
    generation drafts from the documents."""
    from suffixspec import SuffixSpec
    from suffixspec.index import document_index

    calls = []
    real = document_index.add_in_writer
    monkeypatch.setattr(document_index, "WRITER_PROCESS_CHARS", 1)
    monkeypatch.setattr(document_index, "add_in_writer", lambda *a, **k: calls.append(1) or real(*a, **k))
    with SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=None, db=tmp_path / "s.db") as spec:
        text = "alpha beta gamma delta epsilon " * 20
        recs = spec.add_documents([{"text": text, "source": "a.txt"}, "other text"])
        assert calls == [1] and [r["status"] for r in recs] == ["added", "added"]
        assert spec.add_documents(["other text"])[0]["status"] == "unchanged"
        assert spec.list_documents()["total"] == 2
        idx = spec.store.document_index(spec.tokenizer)  # what the next generation drafts from
        assert idx is not None and idx.num_sequences == 2
        ids = spec.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert idx.count(ids[5:12]) >= 1


def test_writer_process_runs_this_code_on_a_relative_path(tmp_path, tok, monkeypatch):
    """The child starts in the folder that holds this ``suffixspec`` (``-m`` looks in the working directory
    first, where another checkout may be), so a database named relative to the caller's directory is
    made absolute first."""
    (tmp_path / "suffixspec").mkdir()  # a decoy package where the caller stands: never imported by the child
    (tmp_path / "suffixspec" / "__init__.py").write_text("raise SystemExit('the decoy was imported')\n")
    monkeypatch.chdir(tmp_path)
    got = writer.add_documents("rel.db", _docs(3), tok)
    assert got.added == 3 and (tmp_path / "rel.db").exists()
