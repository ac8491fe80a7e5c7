"""The SQLite store: add / re-add / change / remove, tokenizer fingerprints, persistence, crash safety."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from suffixspec.index.database import DB_ENV, default_db_path
from suffixspec.index.fingerprint import tokenizer_fingerprint
from suffixspec.index.history import OutputHistory
from suffixspec.index.records import DocInput
from suffixspec.index.segments import SegmentWriter
from suffixspec.index.store import IndexStore

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
    st = store.stats(a.fingerprint)  # the documents counted once; the figures of one tokenizer, the other folded
    assert st["documents"] == 1 and st["tokens"] == 18 and st["tokenizer"]["document_tokens"] == 18
    assert [(o["fingerprint"], o["document_tokens"]) for o in st["also_indexed_for"]] == [(b.fingerprint, 18)]
    # adding with one tokenizer leaves the other's arrays stale until a process with it loads them
    store.add_documents([DocInput("more", "more.txt")], a)
    assert store.stats(b.fingerprint)["tokenizer"]["arrays_current"] is False
    assert store.stats()["fingerprint"] == a.fingerprint  # by default: the tokenizer last indexed for
    assert store.document_index(b).count(ids("more", 1000)) == 1


def test_persistence_round_trip_loads_arrays_without_rebuild(tmp_path):
    path = tmp_path / "index.db"
    tok = ByteTok()
    with IndexStore(path) as s:
        s.add_documents([DocInput("persistent words here", "p.txt")], tok)
        names = [i.name for i in s.segment_infos(tok.fingerprint)]
        hist = OutputHistory(budget_tokens=100, store=s, fingerprint=tok.fingerprint)
        hist.add([5, 6, 7, 8])
        hist.add([5, 6, 9])
    files_before = _array_files(tmp_path)
    with IndexStore(path) as s:
        sa = s.document_index(tok)  # with the tokenizer: still no rebuild, the arrays are current
        assert [i.name for i in s.segment_infos(tok.fingerprint)] == names
        assert sa.count(ids("words")) == 1
        hist = OutputHistory(budget_tokens=100, store=s, fingerprint=tok.fingerprint)
        assert hist.num_outputs == 2 and hist.index.continuations([5, 6]) == [(7, 1), (9, 1)]
    assert _array_files(tmp_path) == files_before


def test_history_budget_is_persisted(store):
    for i in range(5):
        store.history.append_many("fp", [[i] * 4], budget_tokens=10)
    assert [a.tolist() for a in store.history.load("fp")] == [[3] * 4, [4] * 4]
    assert store.history.load("other") == []


def test_a_reopened_history_indexes_what_was_appended(store):
    """The history a start loads from the store (indexed in one pass) equals the one that appended the
    outputs one by one: the same tokens, matches and continuations."""
    from suffixspec.index.incremental import IncrementalIndex

    outputs = [[(7 * i + j * j) % 13 for j in range(5 + i % 70)] for i in range(40)]  # runs past 64 tokens
    live = OutputHistory(10_000, store, "fp", max_candidates=10**6)
    for out in outputs:
        live.add(out)
    live.flush()
    reopened = OutputHistory(10_000, store, "fp", max_candidates=10**6)
    appended = IncrementalIndex(max_candidates=10**6)
    for out in outputs:
        appended.add_sequence(out)
    assert reopened.index.tokens() == live.index.tokens() == appended.tokens()
    for ctx in ([3, 8], [1, 4, 9], [0], [12, 12, 3], [5, 6, 7, 8]):
        assert reopened.index.match(ctx) == appended.match(ctx)
        assert reopened.index.continuations(ctx) == appended.continuations(ctx)


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
    from suffixspec.index.store import DocInput, IndexStore

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
    if MODE == "transaction":   # rows inserted, segment and tombstones written, COMMIT not yet reached
        from suffixspec.index import catalogue
        original = catalogue.bump_docs_version
        def paused(db):
            original(db)
            print("PAUSED", flush=True)
            sys.stdin.readline()
        catalogue.bump_docs_version = paused
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


@pytest.mark.slow  # a writer process per case, killed
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
        proc.wait(timeout=180)  # a loaded 2-core machine can take a while to unwind
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
        assert {p.name for p in (tmp_path / "index.db.arrays").iterdir()} == s.referenced_files()
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
        assert [a.tolist() for a in s.history.load("fp")] == [[1, 2, 3], [4, 5]]


# ----- arrays built outside the write lock ------------------------------------------------------------
def _assert_consistent(s: IndexStore, fp: str) -> None:
    """The committed segments hold each committed document once (live), and no other file is left."""
    import numpy as np

    live = []
    for info in s.segment_infos(fp):
        docids = np.load(s.arrays_dir / f"{info.name}.docids.npy")
        dead = set(s.catalogue.tombstones(info.dead_file)[1].tolist())
        live += [int(d) for k, d in enumerate(docids) if k not in dead]
    assert sorted(live) == [d["id"] for d in s.list_documents()]
    assert {p.name for p in s.arrays_dir.iterdir()} == s.referenced_files()


def test_write_lock_is_free_while_the_arrays_are_built(tmp_path, monkeypatch):
    db = tmp_path / "index.db"
    tok = ByteTok()
    seen = []
    with IndexStore(db) as s, IndexStore(db) as other:
        s.add_documents([DocInput("first text", "a.txt")], tok)
        original = SegmentWriter.finish

        def build(self, *args, **kwargs):
            out = original(self, *args, **kwargs)  # the suffixes are sorted with no lock held:
            other.history.append_many("fp", [[1, 2, 3]], timeout_s=0.2)  # another writer goes ahead at once
            seen.append(other.list_documents())  # and readers still see the old corpus
            return out

        monkeypatch.setattr(SegmentWriter, "finish", build)
        s.add_documents([DocInput("second text", "b.txt")], tok)
        assert [d["path"] for d in seen[0]] == ["a.txt"]
        assert s.remove(["a.txt"]) == 1
        assert len(seen) == 1 and [a.tolist() for a in s.history.load("fp")] == [[1, 2, 3]]
        assert s.document_index(tok.fingerprint).count(ids("second")) == 1
        _assert_consistent(s, tok.fingerprint)


def test_a_writer_committing_during_the_build_is_not_lost(tmp_path, monkeypatch):
    db = tmp_path / "index.db"
    tok = ByteTok()
    with IndexStore(db) as s, IndexStore(db) as other:
        s.add_documents([DocInput("old text", "old.txt"), DocInput("doomed text", "doomed.txt")], tok)
        original = SegmentWriter.finish
        calls = []

        def build(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            calls.append(self.prefix)
            if len(calls) == 1:
                # while s's new segment waits for the lock, another writer commits (and collects garbage:
                # it must not delete s's uncommitted files); it adds "mine text" too
                other.add_documents([DocInput("concurrent text", "concurrent.txt"),
                                     DocInput("mine text", "mine.txt")], tok)
                other.remove(["doomed.txt"])
            return out

        monkeypatch.setattr(SegmentWriter, "finish", build)
        summary = s.add_documents([DocInput("mine text", "mine.txt"), DocInput("old text", "old.txt"),
                                   DocInput("new text", "new.txt")], tok)
        # the commit re-checked the rows under the lock: "mine" arrived meanwhile with the same content
        assert (summary.added, summary.unchanged) == (1, 2)
        paths = [d["path"] for d in s.list_documents()]
        assert paths == ["old.txt", "concurrent.txt", "mine.txt", "new.txt"]
        assert summary.ids == [s.list_documents()[-1]["id"]]
        sa = s.document_index(tok.fingerprint)
        # "mine text" is in two segments but live in one: counted once (a tombstone in s's segment)
        assert [sa.count(ids(t)) for t in ("old text", "concurrent", "mine", "doomed", "new")] == [1, 1, 1, 0, 1]
        _assert_consistent(s, tok.fingerprint)


def test_garbage_collection_waits_for_uncommitted_builds(store):
    tok = ByteTok()
    store.add_documents([DocInput("some text", "a.txt")], tok)
    stray = store.arrays_dir / "0123456789ab-9-1-00000000.tok"
    stray.write_bytes(b"")
    with store.catalogue.build_guard():  # a writer with uncommitted files
        store.catalogue.collect_garbage()
        assert stray.exists()
    store.catalogue.collect_garbage()
    assert not stray.exists()
    _assert_consistent(store, tok.fingerprint)


def test_encode_batched_matches_encode_texts_with_progress(bpe_tokenizer_dir):
    from transformers import AutoTokenizer

    from suffixspec.index.fingerprint import encode_batched, encode_texts

    texts = [f"def f{i}(x):\n    return x * {i}  # comment {'é' * i}\n" for i in range(40)] + ["", "x"]
    for tok in (AutoTokenizer.from_pretrained(bpe_tokenizer_dir), ByteTok()):
        calls = []
        out = encode_batched(tok, texts, progress=calls.append, batch_chars=200)
        ref = encode_texts(tok, texts)
        assert len(out) == len(ref) and all((a == b).all() and a.dtype == b.dtype for a, b in zip(out, ref, strict=True))
        assert sum(calls) == len(texts) and len(calls) > 5


_BUILDER = textwrap.dedent("""
    import sys
    from suffixspec.index.store import DocInput, IndexStore

    class Tok:
        fingerprint = "bytes+0"
        def encode(self, text):
            return list(text.encode())

    from suffixspec.index.segments import SegmentWriter
    original = SegmentWriter.finish
    def paused(self, *args, **kwargs):   # new segment written, no lock held, nothing committed
        out = original(self, *args, **kwargs)
        print("PAUSED", flush=True)
        sys.stdin.readline()
        return out
    SegmentWriter.finish = paused
    store = IndexStore(sys.argv[1])
    docs = [DocInput(f"new document number {i} " * 20, f"new{i}.txt") for i in range(10)]
    docs.append(DocInput("old zero was changed", "old0.txt"))
    print(store.add_documents(docs, Tok()), flush=True)
""")


@pytest.mark.slow  # a writer process per case, killed
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_while_building_outside_the_lock(tmp_path, sig):
    db, before, files_before = _old_index(tmp_path)
    with _paused_writer(tmp_path, _BUILDER, db, "x") as proc:
        with IndexStore(db) as other:  # no write lock is held: other writers go ahead at once
            other.history.append_many("fp", [[1, 2]], timeout_s=0.5)
            other.catalogue.collect_garbage()  # and must not delete the builder's files (it holds the flock)
        assert len(list((tmp_path / "index.db.arrays").iterdir())) > len(files_before)
        proc.send_signal(sig)
        proc.wait(timeout=180)  # a loaded 2-core machine can take a while to unwind
    assert proc.returncode != 0
    assert _snapshot(db) == before
    if sig == signal.SIGINT:
        assert _array_files(tmp_path) == files_before
    with IndexStore(db) as s:  # the next writer collects what a killed builder left
        s.add_documents([DocInput("after the crash", "after.txt")], ByteTok())
        _assert_consistent(s, "bytes+0")
        assert s.document_index("bytes+0").count(ids("old zero")) == 1


# ----- segments --------------------------------------------------------------------------------------
def test_adds_make_segments_deletes_make_tombstones_merges_drop_them(tmp_path):
    from suffixspec.index.segments import MergePolicy

    tok = ByteTok()
    with IndexStore(tmp_path / "index.db",
                    policy=MergePolicy(fanout=3, floor_tokens=1000, max_tokens=10000)) as s:
        s.add_documents([DocInput("document 0 about segments", "0.txt"),
                         DocInput("document 1 about segments", "1.txt")], tok)
        for i in (2, 3):
            s.add_documents([DocInput(f"document {i} about segments", f"{i}.txt")], tok)
        assert len(s.segment_infos(tok.fingerprint)) == 3  # one fresh segment per add
        assert s.stats()["pending_merges"] == 1
        s.add_documents([DocInput("document 1 was rewritten", "1.txt")], tok)
        assert s.remove(["2.txt"]) == 1
        infos = s.segment_infos(tok.fingerprint)
        # 2.txt's segment had nothing else: dropped; 1.txt's old version is a tombstone in the first one
        assert len(infos) == 3 and [i.dead_sequences for i in infos] == [1, 0, 0]
        idx = s.document_index(tok)
        assert idx.count(ids("document 1 about")) == 0 and idx.count(ids("document 1 was")) == 1
        assert idx.count(ids("document ")) == 3 and idx.num_tokens == 2 * len("document 0 about segments") + len(
            "document 1 was rewritten")
        assert s.merge_pending() == 1
        (merged,) = s.segment_infos(tok.fingerprint)
        assert (merged.sequences, merged.dead_sequences) == (3, 0)  # the tombstoned version is gone
        assert s.document_index(tok).count(ids("document ")) == 3
        assert {p.name for p in s.arrays_dir.iterdir()} == s.referenced_files()
        st = s.stats()
        assert st["segments"] == 1 and st["pending_merges"] == 0


def test_sixteen_bit_tokens_widen_when_an_id_does_not_fit(tmp_path):
    tok = ByteTok(offset=70000)  # ids above 65535: the segment stores 4 bytes per token
    small = ByteTok()
    with IndexStore(tmp_path / "index.db") as s:
        s.add_documents([DocInput("wide ids", "w.txt")], tok)
        s.add_documents([DocInput("narrow ids", "n.txt")], small)
        assert [i.width for i in s.segment_infos(tok.fingerprint)] == [4]
        assert [i.width for i in s.segment_infos(small.fingerprint)] == [2]
        assert s.document_index(tok).count(ids("ids", 70000)) == 2  # the other document indexed for it now
        assert s.document_index(small).count(ids("ids")) == 2
        assert sorted(i.width for i in s.segment_infos(tok.fingerprint)) == [4, 4]


def test_database_copied_without_its_arrays_is_rebuilt_with_a_message(tmp_path, caplog):
    import shutil

    tok = ByteTok()
    src = tmp_path / "src" / "index.db"
    with IndexStore(src) as s:
        s.add_documents([DocInput("copied corpus text", "a.txt"), DocInput("more text", "b.txt")], tok)
        s.remove(["b.txt"])
    dst = tmp_path / "dst" / "index.db"
    dst.parent.mkdir()
    shutil.copy(src, dst)  # the database alone, as a user copies it
    with IndexStore(dst) as s, caplog.at_level("WARNING", logger="suffixspec.index"):
        assert s.document_index(tok.fingerprint) is None  # ids gone with the arrays: needs the tokenizer
        idx = s.document_index(tok)  # with it: rebuilt from the text in the database
        assert idx.count(ids("copied corpus")) == 1 and idx.count(ids("more text")) == 0
        assert "missing" in caplog.text and "rebuilding them from the database" in caplog.text
        assert {p.name for p in s.arrays_dir.iterdir()} == s.referenced_files()
    with IndexStore(dst) as s:  # and it stays rebuilt
        assert s.document_index(tok.fingerprint).count(ids("copied corpus")) == 1


def test_database_of_the_previous_version_is_indexed_from_its_token_ids(tmp_path, caplog):
    """Earlier versions kept the ids in ``doc_tokens.ids`` and one array set: served without the tokenizer."""
    import sqlite3

    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.executescript("""
        CREATE TABLE documents (id INTEGER PRIMARY KEY, path TEXT, content_hash TEXT, text TEXT, metadata TEXT,
                                n_bytes INTEGER, added_at FLOAT);
        CREATE TABLE doc_tokens (doc_id INTEGER, fingerprint TEXT, n_tokens INTEGER, ids BLOB,
                                 PRIMARY KEY (doc_id, fingerprint));
        CREATE TABLE tokenizers (fingerprint TEXT PRIMARY KEY, name TEXT, added_at FLOAT);
        CREATE TABLE history (id INTEGER PRIMARY KEY, fingerprint TEXT, n_tokens INTEGER, ids BLOB, created_at FLOAT);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
        INSERT INTO tokenizers VALUES ('bytes+0', 'bytes', 0);
        INSERT INTO documents VALUES (1, 'a.txt', 'h', 'old format words', '{}', 16, 0);
    """)
    import numpy as np

    conn.execute("INSERT INTO doc_tokens VALUES (1, 'bytes+0', 16, ?)",
                 [np.asarray(ids("old format words"), dtype="<u4").tobytes()])
    conn.commit()
    conn.close()
    with IndexStore(db) as s:
        assert s.document_index("bytes+0").count(ids("format")) == 1


def test_read_only_store_never_writes(tmp_path):
    tok = ByteTok()
    db = tmp_path / "index.db"
    with IndexStore(db) as s:
        s.add_documents([DocInput("read only please", "r.txt")], tok)
    os.chmod(tmp_path, 0o555)
    try:
        with IndexStore(db, readonly=True) as r:
            assert r.document_index(tok.fingerprint).count(ids("only")) == 1
            with pytest.raises(Exception, match="read-only"):
                r.add_documents([DocInput("x", "x.txt")], tok)
    finally:
        os.chmod(tmp_path, 0o755)


def test_listing_and_stats_do_not_wait_for_an_add(tmp_path, tiny_model_dirs, monkeypatch):
    """GET /v1/index/documents and /v1/index/stats read while a long POST (an add) holds the writer."""
    import threading

    from suffixspec.api import SuffixSpec

    with SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=None, db=tmp_path / "index.db") as spec:
        spec.add_documents([{"text": "already here", "source": "here.txt"}])
        entered, release = threading.Event(), threading.Event()
        original = SegmentWriter.finish

        def slow_finish(self, *a, **kw):  # the add is sorting its segment: hold it there
            entered.set()
            release.wait(60)
            return original(self, *a, **kw)

        monkeypatch.setattr(SegmentWriter, "finish", slow_finish)
        adder = threading.Thread(target=spec.add_documents, args=([{"text": "a big new document"}],))
        adder.start()
        try:
            assert entered.wait(60)
            got = {}
            reader = threading.Thread(target=lambda: got.update(page=spec.list_documents(), stats=spec.index_stats()))
            reader.start()
            reader.join(20)
            assert not reader.is_alive(), "the listing waited for the add"
            assert got["page"]["total"] == 1 and got["stats"]["documents"] == 1
        finally:
            release.set()
            adder.join(60)
        assert spec.list_documents()["total"] == 2


def _full_scans(db: Path, statements: list[str]) -> list[str]:
    """The traced SELECTs whose query plan reads the whole documents table (its rows hold the texts)."""
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        out = []
        for sql in statements:
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql)]
            if any(p.startswith("SCAN") and "documents" in p or p in ("SCAN d",) for p in plan
                   if "COVERING INDEX" not in p):
                out.append(sql)
        return out
    finally:
        conn.close()


def test_adding_one_document_and_reloading_read_no_whole_table(tmp_path):
    """Adding one document to a large corpus used to read every (path, hash) row, and each reload of the
    index joined every document to find unindexed ones: both read the whole documents table (texts
    included; 0.26 s + 0.15 s at 44k documents). Now both go through indexes and segment totals."""
    tok = ByteTok()
    db = tmp_path / "index.db"
    with IndexStore(db) as writer, IndexStore(db) as reader:
        writer.add_documents([DocInput(f"document number {i}", f"{i}.txt") for i in range(20)], tok)
        reader.document_index(tok)
        traced: list[str] = []
        for s in (writer, reader):
            s.db.conn.set_trace_callback(traced.append)
        writer.add_documents([DocInput("one more document", "new.txt"),
                              DocInput("document number 3", "3.txt")], tok)  # new + unchanged
        assert reader.document_index(tok).count(ids("one more")) == 1
        assert writer.remove(["new.txt"]) == 1
        assert reader.document_index(tok).count(ids("one more")) == 0
        for s in (writer, reader):
            s.db.conn.set_trace_callback(None)
    assert traced and _full_scans(db, traced) == []


def test_reload_still_indexes_documents_missing_from_the_segments(tmp_path):
    """The cheap check (live sequences of the segments == documents) does not hide a document that has
    no segment for a tokenizer: added under another one, or whose segment row was lost."""
    a, b = ByteTok(0), ByteTok(1000)
    with IndexStore(tmp_path / "index.db") as s:
        s.add_documents([DocInput("first text", "1.txt"), DocInput("second text", "2.txt")], a)
        assert s.documents.all_indexed(a.fingerprint) and not s.documents.all_indexed(b.fingerprint)
        s.add_documents([DocInput("third text", "3.txt")], b)  # a does not know 3.txt yet
        assert not s.documents.all_indexed(a.fingerprint)
        assert s.document_index(a).count(ids("third")) == 1 and s.documents.all_indexed(a.fingerprint)
        s.db.execute("DELETE FROM segments WHERE id = (SELECT min(id) FROM segments WHERE fingerprint = ?)",
                     [a.fingerprint])
        s.db.execute("UPDATE doc_tokens SET segment = NULL WHERE fingerprint = ? AND segment NOT IN "
                     "(SELECT id FROM segments)", [a.fingerprint])
        assert not s.documents.all_indexed(a.fingerprint)
        assert s.document_index(a).count(ids(" text")) == 3


def test_tokenizer_fingerprint_is_remembered_until_the_vocabulary_grows(tmp_path, bpe_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bpe_tokenizer_dir))
    with IndexStore(tmp_path / "index.db") as s:
        fp = s.fingerprint(tok)
        assert fp == tokenizer_fingerprint(tok) and s.fingerprint(tok) is fp
        tok.add_tokens(["<brand_new_token>"])
        assert s.fingerprint(tok) == tokenizer_fingerprint(tok) != fp


def test_compaction_plan_leaves_full_segments_alone():
    from suffixspec.index.segments import MergePolicy, SegmentInfo

    M = 1 << 20
    policy = MergePolicy(max_tokens=128 * M)
    segs = [SegmentInfo(1, "a", 69 * M), SegmentInfo(2, "b", 68 * M), SegmentInfo(3, "c", 63 * M)]
    assert policy.compaction(segs) == [1, 2, 3]  # 200M fit in 2 segments: all three are rewritten
    segs = [SegmentInfo(4, "d", 128 * M), SegmentInfo(5, "e", 72 * M), SegmentInfo(6, "f", M)]
    assert policy.compaction(segs) == [5, 6]  # the full one stays
    assert policy.compaction(segs[:2]) == []  # already the fewest
    segs = [SegmentInfo(4, "d", 128 * M, dead_tokens=100 * M), SegmentInfo(5, "e", 72 * M)]
    assert policy.compaction(segs) == [4, 5]  # a full segment that is mostly tombstones is not full


def test_compact_splits_into_full_segments_and_answers_as_before(tmp_path):
    from suffixspec.index.segments import MergePolicy

    tok = ByteTok()
    texts = {f"{i}.txt": f"document {i} says {'ab' * i}" for i in range(12)}
    with IndexStore(tmp_path / "index.db", policy=MergePolicy(max_tokens=100)) as s:
        for path, text in texts.items():
            s.add_documents([DocInput(text, path)], tok)  # one segment each
        s.remove(["3.txt"])
        del texts["3.txt"]
        before = s.document_index(tok)
        ctxs = [ids(t[:k]) for t in texts.values() for k in (3, 9, 14)]
        drafts = [before.continuations(c) for c in ctxs]
        assert len(s.segment_infos(tok.fingerprint)) == 11 and s.stats()["tokenizers"][tok.fingerprint]["compaction"]
        assert s.compact() == 1 and s.compact() == 0
        infos = s.segment_infos(tok.fingerprint)
        live = sum(len(t.encode()) for t in texts.values())
        assert len(infos) == -(-live // 100) and all(i.tokens <= 100 for i in infos)
        assert [i.dead_sequences for i in infos] == [0] * len(infos)
        after = s.document_index(tok)
        assert sorted(after.sequences()) == sorted(ids(t) for t in texts.values())
        assert [after.continuations(c) for c in ctxs] == drafts
        assert {p.name for p in s.arrays_dir.iterdir()} == s.referenced_files()


def test_the_last_version_of_a_path_repeated_in_one_add_wins_even_if_it_is_the_stored_one(store):
    """Found by the segment fuzz test: ``b`` stored, then one add of ``b`` = "ab" and ``b`` = the stored text
    again kept "ab" (the second was judged unchanged before the first had been tokenized)."""
    tok = ByteTok()
    store.add_documents([DocInput("the stored text", "b")], tok)
    summary = store.add_documents([DocInput("ab", "b"), DocInput("the stored text", "b")], tok)
    assert summary.updated == 0 and summary.unchanged == 1
    assert store.document_index(tok).sequences() == [ids("the stored text")]
    assert store.get_document(store.list_documents()[0]["id"])["text"] == "the stored text"


@pytest.mark.parametrize("n_dead", [1, 3, 9])
def test_tombstone_ranks_from_the_file_equal_those_from_the_mapping(tmp_path, monkeypatch, n_dead):
    """Tombstones are located by reading the segment's ``.sa`` in chunks (no mapped pages left resident):
    the same ranks as a scan of the mapped array, and exactly the suffixes of the dead documents."""
    import random

    import numpy as np

    import suffixspec.index.segments as segments

    monkeypatch.setattr(segments, "_SCAN_CHUNK", 7)  # many chunks, boundaries inside documents
    rng = random.Random(n_dead)
    writer = SegmentWriter(tmp_path / "seg")
    docs = [[rng.randrange(5) for _ in range(rng.randrange(1, 12))] for _ in range(15)]
    for d in docs:
        writer.add(np.asarray(d))
    sa = writer.finish()
    dead = sorted(rng.sample(range(len(docs)), n_dead))
    starts, ends = segments.sequence_bounds(sa.starts, sa.num_suffixes)
    want = [r for r in range(sa.num_suffixes) if any(starts[k] <= sa.sa[r] < ends[k] for k in dead)]
    from_file = segments.tombstone_ranks(sa, np.asarray(dead), tmp_path / "seg.sa")
    assert from_file.tolist() == want == segments.tombstone_ranks(sa, np.asarray(dead)).tolist()
