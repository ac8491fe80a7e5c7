"""The SQLite store: add / re-add / change / remove, tokenizer fingerprints, persistence, crash safety."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from index.fingerprint import tokenizer_fingerprint
from index.history import OutputHistory
from index.store import DB_ENV, DocInput, IndexStore, default_db_path

ROOT = Path(__file__).resolve().parents[1]


class ByteTok:
    """A tokenizer stand-in: one id per UTF-8 byte (plus an offset, to tell two tokenizers apart)."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self.fingerprint = f"bytes+{offset}"

    def encode(self, text: str) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]


def ids(text: str, offset: int = 0) -> list[int]:
    return ByteTok(offset).encode(text)


@pytest.fixture
def store(tmp_path):
    s = IndexStore(tmp_path / "index.db")
    yield s
    s.close()


def test_default_db_location(monkeypatch, tmp_path):
    monkeypatch.setenv(DB_ENV, str(tmp_path / "x.db"))
    assert default_db_path() == tmp_path / "x.db"
    monkeypatch.delenv(DB_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_db_path() == tmp_path / "suffixspec" / "index.db"


def test_wal_mode(store):
    assert store.db.journal_mode == "wal"


@pytest.mark.parametrize("second_batch, expect", [
    ([("a.txt", "alpha beta"), ("b.txt", "gamma delta")], (0, 0, 2)),           # re-add: nothing changes
    ([("a.txt", "alpha BETA"), ("b.txt", "gamma delta")], (0, 1, 1)),           # a changed
    ([("c.txt", "epsilon"), ("a.txt", "alpha beta")], (1, 0, 1)),               # c new
])
def test_add_readd_change_counts(store, second_batch, expect):
    tok = ByteTok()
    first = store.add_documents([DocInput("alpha beta", "a.txt"), DocInput("gamma delta", "b.txt")], tok)
    assert (first.added, first.updated, first.unchanged) == (2, 0, 0)
    assert first.tokens == len("alpha beta") + len("gamma delta")
    version = store.docs_version()
    s = store.add_documents([DocInput(t, p) for p, t in second_batch], tok)
    assert (s.added, s.updated, s.unchanged) == expect
    assert store.docs_version() == (version if expect[:2] == (0, 0) else version + 1)
    docs = {d["path"]: d for d in store.list_documents()}
    sa = store.document_index(tok.fingerprint)
    for path, text in second_batch:
        assert sa.count(ids(text)) >= 1
        assert docs[path]["tokens"] == {tok.fingerprint: len(text.encode())}
    if expect == (0, 1, 1):  # the old version is gone
        assert sa.count(ids("alpha beta")) == 0
        assert len(docs) == 2


def test_remove_by_id_and_path(store):
    tok = ByteTok()
    store.add_documents([DocInput("one two", "1.txt"), DocInput("three", "2.txt"), DocInput("four", "3.txt")], tok)
    docs = store.list_documents()
    assert store.remove([str(docs[0]["id"]), "3.txt", "missing.txt"]) == 2
    assert [d["path"] for d in store.list_documents()] == ["2.txt"]
    sa = store.document_index(tok.fingerprint)
    assert sa.count(ids("three")) == 1 and sa.count(ids("one")) == 0 and sa.count(ids("four")) == 0
    assert store.remove(["2.txt"]) == 1
    assert store.document_index(tok.fingerprint) is None
    assert store.stats()["documents"] == 0


def test_text_documents_are_idempotent_by_content_hash(store):
    tok = ByteTok()
    a = store.add_documents([DocInput("a retrieved chunk", metadata={"source": "rag"})], tok)
    b = store.add_documents([DocInput("a retrieved chunk")], tok)
    assert (a.added, b.added, b.unchanged) == (1, 0, 1)
    (doc,) = store.list_documents()
    assert doc["path"].startswith("text:") and doc["metadata"] == {"source": "rag"}
    assert store.get_document(doc["id"])["text"] == "a retrieved chunk"


def test_one_corpus_serves_two_tokenizers(store):
    a, b = ByteTok(0), ByteTok(1000)
    store.add_documents([DocInput("shared corpus text", "doc.txt")], a)
    assert store.document_index(a.fingerprint).count(ids("corpus")) == 1
    # the other tokenizer's ids are made on first use, then served from its own arrays
    sa_b = store.document_index(b)
    assert sa_b.count(ids("corpus", 1000)) == 1 and sa_b.count(ids("corpus")) == 0
    st = store.stats()
    assert st["tokens"] == {a.fingerprint: 18, b.fingerprint: 18}
    # adding with one tokenizer leaves the other's arrays stale until a process with it loads them
    store.add_documents([DocInput("more", "more.txt")], a)
    assert store.stats()["tokenizers"][b.fingerprint]["arrays_current"] is False
    assert store.document_index(b).count(ids("more", 1000)) == 1


def test_persistence_round_trip_loads_arrays_without_rebuild(tmp_path):
    path = tmp_path / "index.db"
    tok = ByteTok()
    with IndexStore(path) as s:
        s.add_documents([DocInput("persistent words here", "p.txt")], tok)
        name = json.loads(s._meta(f"arrays:{tok.fingerprint}"))["name"]
        hist = OutputHistory(budget_tokens=100, store=s, fingerprint=tok.fingerprint)
        hist.add([5, 6, 7, 8])
        hist.add([5, 6, 9])
    files_before = _array_files(tmp_path)
    with IndexStore(path) as s:
        sa = s.document_index(tok)  # with the tokenizer: still no rebuild, the arrays are current
        assert json.loads(s._meta(f"arrays:{tok.fingerprint}"))["name"] == name
        assert sa.count(ids("words")) == 1
        hist = OutputHistory(budget_tokens=100, store=s, fingerprint=tok.fingerprint)
        assert hist.num_outputs == 2 and hist.index.continuations([5, 6]) == [(7, 1), (9, 1)]
    assert _array_files(tmp_path) == files_before


def test_history_budget_is_persisted(store):
    for i in range(5):
        store.history_append("fp", [i] * 4, budget_tokens=10)
    assert [a.tolist() for a in store.history_load("fp")] == [[3] * 4, [4] * 4]
    assert store.history_load("other") == []


def test_fingerprint_of_a_real_tokenizer(bpe_tokenizer_dir, unigram_tokenizer_dir):
    from transformers import AutoTokenizer

    a = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    a2 = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    b = AutoTokenizer.from_pretrained(unigram_tokenizer_dir)
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(a2) != tokenizer_fingerprint(b)
    assert len(tokenizer_fingerprint(a)) == 32


# ----- crash safety -----------------------------------------------------------------------------------
_WRITER = textwrap.dedent("""
    import sys
    from index.store import DocInput, IndexStore

    class Tok:
        fingerprint = "bytes+0"
        calls = 0
        def encode(self, text):
            Tok.calls += 1
            if MODE == "tokenize" and Tok.calls == 3:   # part-way through tokenizing
                print("PAUSED", flush=True)
                sys.stdin.readline()
            return list(text.encode())

    MODE = sys.argv[2]
    if MODE == "transaction":   # rows inserted and new arrays written, COMMIT not yet reached
        original = IndexStore._rebuild_arrays_locked
        def paused(self, written, *args, **kwargs):
            original(self, written, *args, **kwargs)
            print("PAUSED", flush=True)
            sys.stdin.readline()
        IndexStore._rebuild_arrays_locked = paused
    store = IndexStore(sys.argv[1])
    docs = [DocInput(f"new document number {i} " * 20, f"new{i}.txt") for i in range(10)]
    docs.append(DocInput("old zero was changed", "old0.txt"))
    print(store.add_documents(docs, Tok()), flush=True)
""")


def _snapshot(path: Path) -> tuple:
    with IndexStore(path) as s:
        docs = [(d["id"], d["path"], d["content_hash"], d["tokens"]) for d in s.list_documents()]
        sa = s.document_index("bytes+0")
        return docs, sa.num_tokens, sa.count(ids("old zero")), sa.count(ids("new document"))


def _old_index(tmp_path: Path) -> tuple[Path, tuple, list[str]]:
    """An index of two old documents: (db path, its snapshot, its array files)."""
    db = tmp_path / "index.db"
    with IndexStore(db) as s:
        s.add_documents([DocInput("old zero text", "old0.txt"), DocInput("old one text", "old1.txt")], ByteTok())
    return db, _snapshot(db), _array_files(tmp_path)


def _array_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "index.db.arrays").iterdir())


@contextlib.contextmanager
def _paused_writer(tmp_path: Path, source: str, db: Path, mode: str):
    """Runs ``source`` (a writer script) in a subprocess on ``db`` and yields it once it printed
    PAUSED; a writer still alive at the end is killed."""
    script = tmp_path / "writer.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(db), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "PAUSED", proc.stderr.read()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("mode, sig", [
    ("transaction", signal.SIGKILL),
    ("tokenize", signal.SIGKILL),
    ("transaction", signal.SIGINT),   # Ctrl-C: rolled back and cleaned up
])
def test_killed_add_leaves_old_state_intact(tmp_path, mode, sig):
    db, before, files_before = _old_index(tmp_path)
    with _paused_writer(tmp_path, _WRITER, db, mode) as proc:
        # while the writer holds its transaction, readers still see the old corpus (WAL)
        assert _snapshot(db) == before
        proc.send_signal(sig)
        proc.wait(timeout=60)
    assert proc.returncode != 0
    with IndexStore(db) as s:
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert s.db.execute("PRAGMA foreign_key_check").fetchall() == []
    assert _snapshot(db) == before
    if sig == signal.SIGINT or mode == "tokenize":
        assert _array_files(tmp_path) == files_before  # nothing left behind
    # the next successful write collects any leftovers of the killed writer
    with IndexStore(db) as s:
        s.add_documents([DocInput("after the crash", "after.txt")], ByteTok())
        keep = s._referenced_names()
        assert {p.name.split(".", 1)[0] for p in (tmp_path / "index.db.arrays").iterdir()} == keep
        assert s.document_index("bytes+0").count(ids("old zero")) == 1


def test_history_write_does_not_wait_for_a_long_add(tmp_path):
    import sqlite3

    db = tmp_path / "index.db"
    with IndexStore(db) as s:
        hist = OutputHistory(budget_tokens=100, store=s, fingerprint="fp")
        blocker = sqlite3.connect(str(db), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process in the middle of `index add`
        hist.add([1, 2, 3])
        assert hist.index.count([1, 2]) == 1 and hist._pending  # usable now, written later
        blocker.execute("ROLLBACK")
        blocker.close()
        hist.add([4, 5])
        assert not hist._pending
        assert [a.tolist() for a in s.history_load("fp")] == [[1, 2, 3], [4, 5]]


# ----- arrays built outside the write lock ------------------------------------------------------------
def _assert_consistent(s: IndexStore, fp: str) -> None:
    """The committed arrays exist, list the committed documents in id order, and nothing else is left."""
    info = json.loads(s._meta(f"arrays:{fp}"))
    assert info["docs_version"] == s.docs_version()
    import numpy as np

    doc_ids = np.load(s.arrays_dir / f"{info['name']}.docids.npy").tolist()
    assert doc_ids == [d["id"] for d in s.list_documents()]
    assert {p.name.split(".", 1)[0] for p in s.arrays_dir.iterdir()} == s._referenced_names()


def test_write_lock_is_free_while_the_arrays_are_built(tmp_path, monkeypatch):
    db = tmp_path / "index.db"
    tok = ByteTok()
    seen = []
    with IndexStore(db) as s, IndexStore(db) as other:
        s.add_documents([DocInput("first text", "a.txt")], tok)
        original = IndexStore._build_arrays

        def build(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            if self is s:  # another writer (history of a serving process) gets the lock at once
                other.history_append_many("fp", [[1, 2, 3]], timeout_s=0.2)
                seen.append(other.list_documents())  # and readers still see the old corpus
            return out

        monkeypatch.setattr(IndexStore, "_build_arrays", build)
        s.add_documents([DocInput("second text", "b.txt")], tok)
        assert [d["path"] for d in seen[0]] == ["a.txt"]
        assert s.remove(["a.txt"]) == 1
        assert len(seen) == 2 and [a.tolist() for a in s.history_load("fp")] == [[1, 2, 3]] * 2
        assert s.document_index(tok.fingerprint).count(ids("second")) == 1
        _assert_consistent(s, tok.fingerprint)


@pytest.mark.parametrize("attempts", [2, 1])  # 1: the retry is planned and built under the write lock
def test_a_writer_committing_during_the_build_is_not_lost(tmp_path, monkeypatch, attempts):
    db = tmp_path / "index.db"
    tok = ByteTok()
    monkeypatch.setattr(IndexStore, "OPTIMISTIC_ATTEMPTS", attempts)
    with IndexStore(db) as s, IndexStore(db) as other:
        s.add_documents([DocInput("old text", "old.txt"), DocInput("doomed text", "doomed.txt")], tok)
        original = IndexStore._build_arrays
        calls = []

        def build(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            calls.append(self is s)
            if self is s and calls.count(True) == 1:
                # while s's new arrays wait for the lock, another writer commits (and collects garbage:
                # it must not delete s's uncommitted files)
                other.add_documents([DocInput("concurrent text", "concurrent.txt")], tok)
                other.remove(["doomed.txt"])
            return out

        monkeypatch.setattr(IndexStore, "_build_arrays", build)
        summary = s.add_documents([DocInput("mine text", "mine.txt"), DocInput("old text", "old.txt")], tok)
        assert (summary.added, summary.unchanged) == (1, 1)
        assert calls.count(True) == 2  # the first build was discarded, the second committed
        paths = [d["path"] for d in s.list_documents()]
        assert paths == ["old.txt", "concurrent.txt", "mine.txt"]
        assert summary.ids == [s.list_documents()[-1]["id"]]
        sa = s.document_index(tok.fingerprint)
        assert [sa.count(ids(t)) for t in ("old text", "concurrent", "mine", "doomed")] == [1, 1, 1, 0]
        _assert_consistent(s, tok.fingerprint)


def test_garbage_collection_waits_for_uncommitted_builds(store):
    tok = ByteTok()
    store.add_documents([DocInput("some text", "a.txt")], tok)
    stray = store.arrays_dir / "0123456789abcdef-9-1-00000000.tokens.npy"
    stray.write_bytes(b"")
    with store._build_guard():  # a writer with uncommitted files
        store._collect_garbage()
        assert stray.exists()
    store._collect_garbage()
    assert not stray.exists()
    _assert_consistent(store, tok.fingerprint)


def test_encode_batched_matches_encode_texts_with_progress(bpe_tokenizer_dir):
    from transformers import AutoTokenizer

    from index.fingerprint import encode_texts
    from index.store import encode_batched

    texts = [f"def f{i}(x):\n    return x * {i}  # comment {'é' * i}\n" for i in range(40)] + ["", "x"]
    for tok in (AutoTokenizer.from_pretrained(bpe_tokenizer_dir), ByteTok()):
        calls = []
        out = encode_batched(tok, texts, progress=calls.append, batch_chars=200)
        ref = encode_texts(tok, texts)
        assert len(out) == len(ref) and all((a == b).all() and a.dtype == b.dtype for a, b in zip(out, ref, strict=True))
        assert sum(calls) == len(texts) and len(calls) > 5


_BUILDER = textwrap.dedent("""
    import sys
    from index.store import DocInput, IndexStore

    class Tok:
        fingerprint = "bytes+0"
        def encode(self, text):
            return list(text.encode())

    original = IndexStore._build_arrays
    def paused(self, *args, **kwargs):   # new arrays written, no lock held, nothing committed
        out = original(self, *args, **kwargs)
        print("PAUSED", flush=True)
        sys.stdin.readline()
        return out
    IndexStore._build_arrays = paused
    store = IndexStore(sys.argv[1])
    docs = [DocInput(f"new document number {i} " * 20, f"new{i}.txt") for i in range(10)]
    docs.append(DocInput("old zero was changed", "old0.txt"))
    print(store.add_documents(docs, Tok()), flush=True)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_while_building_outside_the_lock(tmp_path, sig):
    db, before, files_before = _old_index(tmp_path)
    with _paused_writer(tmp_path, _BUILDER, db, "x") as proc:
        with IndexStore(db) as other:  # no write lock is held: other writers go ahead at once
            other.history_append_many("fp", [[1, 2]], timeout_s=0.5)
            other._collect_garbage()  # and must not delete the builder's files (it holds the flock)
        assert len(list((tmp_path / "index.db.arrays").iterdir())) > len(files_before)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    assert proc.returncode != 0
    assert _snapshot(db) == before
    if sig == signal.SIGINT:
        assert _array_files(tmp_path) == files_before
    with IndexStore(db) as s:  # the next writer collects what a killed builder left
        s.add_documents([DocInput("after the crash", "after.txt")], ByteTok())
        _assert_consistent(s, "bytes+0")
        assert s.document_index("bytes+0").count(ids("old zero")) == 1
