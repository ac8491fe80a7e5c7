"""DocumentIndex (suffixspec/index/document_index.py): the facade SuffixSpec, the index routes and the CLI share: adds
with records, skipped files, invalid documents, where the work runs, the served tokenizer in the
statistics, the tokenizers the store keeps, background merges and the idle compaction."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from test_index_store import ByteTok, _full_scans, ids

from suffixspec.index import DocumentIndex, InvalidDocument, tokenizer_table
from suffixspec.index.document_index import TokenizerChoice
from suffixspec.index.records import DocInput
from suffixspec.index.segments import MergePolicy


@pytest.fixture(scope="module")
def tok(bpe_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(bpe_tokenizer_dir))


def test_add_documents_gives_a_record_per_document_in_order(tmp_path):
    with DocumentIndex(tmp_path / "i.db", tokenizer=ByteTok(), model="bytes") as index:
        recs = index.add_documents(["plain text", {"text": "a.py text", "source": "a.py", "metadata": {"k": 1}},
                                   DocInput("third", "c.txt"), "plain text"])
        assert [r["status"] for r in recs] == ["added", "added", "added", "added"]  # the repeat: the same document
        assert recs[0]["id"] == recs[3]["id"] and recs[0]["source"] is None and recs[1]["source"] == "a.py"
        assert recs[1]["num_tokens"] == len("a.py text") and recs[1]["metadata"] == {"k": 1}
        assert recs[1]["num_chars"] == 9 and recs[1]["preview"] == "a.py text" and recs[1]["name"] == "a.py"
        again = index.add_documents([{"text": "a.py text!", "source": "a.py"}, "plain text"])
        assert [(r["status"], r["id"]) for r in again] == [("updated", recs[1]["id"]), ("unchanged", recs[0]["id"])]
        page = index.list_documents(limit=2)
        newest = sorted({r["id"] for r in recs}, reverse=True)[:2]
        assert page["total"] == 3 and [r["id"] for r in page["data"]] == newest
        assert index.list_documents(query="third")["data"][0]["source"] == "c.txt"


@pytest.mark.parametrize("bad", [{"source": "x.txt"}, {"text": ""}, {"text": 3}, {"text": "x", "source": 4},
                                 {"text": "x", "metadata": [1]}, 7])
def test_an_invalid_document_adds_nothing(tmp_path, bad):
    with DocumentIndex(tmp_path / "i.db", tokenizer=ByteTok()) as index:
        with pytest.raises(InvalidDocument, match="document 1"):
            index.add_documents(["fine", bad])
        assert index.list_documents()["total"] == 0


def test_empty_files_are_skipped_and_nothing_is_created_without_a_file_to_index(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "py.typed").write_text("")
    (docs / "REQUESTED").write_text("")
    (docs / "blank.md").write_text("  \n\n")
    db = tmp_path / "i.db"
    loads = []
    index = DocumentIndex(db, load_tokenizer=lambda _i: loads.append(1) or TokenizerChoice(ByteTok(), "bytes"))
    summary = index.add_paths([docs])
    assert (summary.added, summary.skipped) == (0, 3) and not summary.outcomes
    assert sorted((Path(p).name, kind) for p, kind, _ in summary.skipped_files) == [
        ("REQUESTED", "empty"), ("blank.md", "empty"), ("py.typed", "empty")]
    assert not db.exists() and not loads  # neither the store nor the tokenizer was opened
    (docs / "mod.py").write_text("x = 1\n")
    summary = index.add_paths([docs])
    assert (summary.added, summary.skipped) == (1, 3) and loads == [1]
    index.close()


def _children() -> list[str]:
    """This process' child processes (any thread's)."""
    pid = os.getpid()
    return [k for t in os.listdir(f"/proc/{pid}/task") for k in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]


@pytest.mark.slow  # starts a writer process
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the writer process in /proc")
def test_small_adds_run_in_this_process_large_ones_in_a_writer_process(tmp_path, tok):
    """The one rule: below ``writer_chars`` of text (1 MiB by default) an add runs here at this priority (a
    child at a low priority may wait seconds for a core on a busy machine); at or above it, in the writer
    process, seen running while the add reports progress."""
    seen = []
    with DocumentIndex(tmp_path / "i.db", tokenizer=tok, writer_chars=1000) as index:
        index.add_documents(["x = 1\n" * 10], progress=lambda *_: seen.append(bool(_children())))  # 60 chars
        assert seen and not any(seen)
        seen.clear()
        index.add_documents(["y = 2\n" * 200], progress=lambda *_: seen.append(bool(_children())))  # 1,200 chars
        assert seen and all(seen)
        assert index.list_documents()["total"] == 2
    seen.clear()
    with DocumentIndex(tmp_path / "j.db", tokenizer=tok, writer_chars=1000, nice=0) as index:  # nice 0: always here
        index.add_documents(["y = 2\n" * 200], progress=lambda *_: seen.append(bool(_children())))
        assert seen and not any(seen)


def test_statistics_are_those_of_the_served_tokenizer_and_count_documents_once(tmp_path):
    a, b = ByteTok(0), ByteTok(1000)
    db = tmp_path / "i.db"
    with DocumentIndex(db, tokenizer=b, model="model-b") as other:
        other.add_documents([{"text": "shared corpus text", "source": "doc.txt"}])
    with DocumentIndex(db, tokenizer=a) as index:
        index.serve(a, "model-a")
        index.store.document_index(a)  # a server loads the documents: indexed for its tokenizer too
        st = index.stats()
        assert st["documents"] == 1 and st["fingerprint"] == a.fingerprint and st["tokens"] == 18
        assert st["tokenizer"]["model"] == "model-a" and st["tokenizer"]["arrays_current"] is True
        assert [(o["model"], o["document_tokens"]) for o in st["also_indexed_for"]] == [("model-b", 18)]
        assert index.list_documents()["data"][0]["num_tokens"] == 18
    with DocumentIndex(db) as cli:  # no tokenizer given (`index stats`): the one served last
        assert cli.stats()["fingerprint"] == a.fingerprint and cli.last_tokenizer().model == "model-a"


def test_the_store_keeps_a_served_fast_tokenizer_and_gives_it_back_without_transformers(tmp_path, tok,
                                                                                        bpe_tokenizer_dir):
    from suffixspec.index.fingerprint import encode_batched, tokenizer_fingerprint

    with DocumentIndex(tmp_path / "i.db") as index:
        index.serve(tok, "tiny-bpe")
        last = index.last_tokenizer()
        assert last.model == "tiny-bpe" and last.name == str(bpe_tokenizer_dir) and last.loadable
        assert last.fingerprint == tokenizer_fingerprint(tok)
        kept = index.stored_tokenizer(last.fingerprint)
        assert kept.fingerprint == last.fingerprint and tokenizer_fingerprint(kept) == last.fingerprint
        texts = ["def f(x):\n    return x + 1\n", "naïve café ☕", ""]
        assert [a.tolist() for a in encode_batched(kept, texts)] == [a.tolist() for a in encode_batched(tok, texts)]
        source = tokenizer_table.source_key(bpe_tokenizer_dir)
        assert source is not None and index.stored_tokenizer(source=source).fingerprint == last.fingerprint
        assert index.stored_tokenizer(source=tokenizer_table.source_key(tmp_path)) is None  # not a tokenizer folder


def test_source_key_changes_with_the_tokenizer_files(tmp_path, bpe_tokenizer_dir):
    import shutil

    copy = tmp_path / "tok"
    shutil.copytree(bpe_tokenizer_dir, copy)
    key = tokenizer_table.source_key(copy)
    assert key == tokenizer_table.source_key(copy) != tokenizer_table.source_key(bpe_tokenizer_dir)
    (copy / "tokenizer_config.json").write_text((copy / "tokenizer_config.json").read_text() + "\n")
    assert tokenizer_table.source_key(copy) != key


def test_adds_and_removes_read_no_whole_table(tmp_path):
    """Through the facade, as SuffixSpec and the routes call it: an add of one document to a store of many,
    its records and a remove go through indexes only (the documents table holds the texts)."""
    db = tmp_path / "i.db"
    with DocumentIndex(db, tokenizer=ByteTok()) as index:
        index.add_documents([{"text": f"document number {i}", "source": f"{i}.txt"} for i in range(30)])
        traced: list[str] = []
        for s in (index.store, index._reader()):
            s.db.conn.set_trace_callback(traced.append)
        recs = index.add_documents([{"text": "one more document", "source": "new.txt"}, "document number 3"])
        assert [r["status"] for r in recs] == ["added", "added"]
        assert index.remove_documents(["new.txt"]) == 1
        for s in (index.store, index._reader()):
            s.db.conn.set_trace_callback(None)
    assert traced and _full_scans(db, traced) == []


def test_background_merge_after_adds(tmp_path):
    with DocumentIndex(tmp_path / "i.db", tokenizer=ByteTok(), background_merges=True,
                       policy=MergePolicy(fanout=2, floor_tokens=10, max_tokens=1000)) as index:
        index.add_documents([{"text": "first of two", "source": "a.txt"}])
        index.add_documents([{"text": "second of two", "source": "b.txt"}])  # a merge is due: a thread runs it
        index._merger.join(timeout=60)
        fp = ByteTok().fingerprint
        assert len(index.store.segment_infos(fp)) == 1
        assert index.store.document_index(fp).count(ids(" of two")) == 2


def test_idle_compaction_in_the_background(tmp_path):
    """An index that merges in the background compacts once no write came for ``idle_compact_s``."""
    policy = MergePolicy(fanout=8, max_tokens=1000, idle_compact_s=0.3)
    fp = ByteTok().fingerprint
    with DocumentIndex(tmp_path / "i.db", tokenizer=ByteTok(), background_merges=True, policy=policy) as index:
        for i in range(3):
            index.add_documents([{"text": f"idle corpus text {i}", "source": f"{i}.txt"}])
        assert not index.store.pending_merges()  # no merge is due (fanout 8): only the compaction, once idle
        index._merger.join(timeout=60)  # it waits out the idle time, then compacts
        assert len(index.store.segment_infos(fp)) == 1
        assert index.store.document_index(fp).count(ids("idle corpus text ")) == 3


def test_close_stops_a_background_compaction_that_waits(tmp_path):
    index = DocumentIndex(tmp_path / "i.db", tokenizer=ByteTok(), background_merges=True,
                          policy=MergePolicy(fanout=8, max_tokens=1000, idle_compact_s=3600))
    index.add_documents(["one"])
    index.add_documents(["two"])
    assert index._merger is not None and index._merger.is_alive()  # waiting for an idle hour
    t = time.monotonic()
    index.close()
    assert time.monotonic() - t < 10 and not index._merger.is_alive()
