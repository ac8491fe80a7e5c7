"""The Python facade `SuffixSpec` for RAG pipelines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tiny import copyable

from suffixspec import SuffixSpec
from suffixspec.config import SamplingParams


@pytest.fixture(scope="module")
def spec(tiny_model_dirs):
    with SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=None, db=":memory:") as s:
        yield s




def test_generate_is_lossless_and_reports_stats(spec):
    prompt, _, bias = copyable(spec, 24)
    plain = spec.generate(prompt, max_tokens=24, speculation=False, logit_bias=bias)
    assert plain.stats.drafted_tokens == 0 and len(plain.token_ids) <= 24
    fast = spec.generate(prompt, max_tokens=24, references=[plain.text], speculation={"drafters": ["references"]},
                         logit_bias=bias)
    assert fast.text == plain.text and fast.token_ids == plain.token_ids
    stats = fast.stats.to_dict()
    assert stats["per_source"]["references"]["accepted"] > 0
    assert stats["mean_accepted_length"] > plain.stats.mean_accepted_length


def test_stream_concatenates_to_generate(spec):
    res = spec.generate("import os", max_tokens=16)
    events = list(spec.stream("import os", max_tokens=16))
    assert "".join(e.text for e in events) == res.text
    assert events[-1].result is not None and events[-1].result.token_ids == res.token_ids
    for e in events:
        assert "".join(text for text, _ in e.pieces) == e.text


def test_chat_uses_the_template(spec):
    msgs = [{"role": "user", "content": "hi"}]
    assert spec.render_chat(msgs).startswith("<|im_start|>user\nhi<|im_end|>")
    res = spec.chat(msgs, max_tokens=5)
    assert res.prompt_token_ids == spec.encode_chat(msgs)


def test_bad_arguments_raise_the_request_error(spec):
    """The Python API refuses bad arguments with the server's 400 type, a ValueError that says what to change."""
    from suffixspec import RequestError

    cases = [(dict(prompt="x", top_p=0), "top_p", "top_p must be in (0, 1]"),
             (dict(), "prompt", "give exactly one of prompt= or messages="),
             (dict(prompt="x", messages=[{"role": "user", "content": "x"}]), "prompt", "give exactly one"),
             (dict(prompt=[5] * 5000), "prompt", "shorten the prompt"),
             (dict(prompt="x", speculation={"drafters": ["nope"]}), "drafters", "unknown drafter(s) ['nope']"),
             # a lone surrogate reaches no tokenizer (it raised the tokenizer's TypeError)
             (dict(prompt="a\ud800"), "prompt", "lone UTF-16 surrogate ('\\ud800' at character 1)"),
             (dict(messages=[{"role": "user", "content": "\udfff"}]), "messages", "lone UTF-16 surrogate"),
             (dict(prompt="x", references=["ok", "\udc00"]), "references", "lone UTF-16 surrogate"),
             (dict(prompt="x", prediction="p\ud800q"), "prediction", "give valid Unicode text")]
    for kwargs, param, says in cases:
        with pytest.raises(RequestError, match=re.escape(says)) as err:
            spec.generate(**kwargs)
        assert isinstance(err.value, ValueError) and err.value.param == param, kwargs


def test_a_proposer_bug_is_no_request_error(tiny_model_dirs):
    from suffixspec import RequestError
    from suffixspec.drafting.draft import Draft
    from suffixspec.drafting.proposers import Proposer
    from suffixspec.errors import RequestFailed
    from suffixspec.loading import load_model
    from suffixspec.runtimes.engine import Engine

    class Broken(Proposer):
        name = "broken"

        def propose(self, context, budget):
            return Draft([1, 2], [-1], ["prompt", "prompt"])  # two tokens, one parent

    with SuffixSpec(engine=Engine(load_model(str(tiny_model_dirs["llama"])), [Broken()]), db=False) as s:
        with pytest.raises(RequestFailed, match="while drafting") as err:
            s.generate("x", max_tokens=2)
    assert not isinstance(err.value, RequestError)  # the server's 500, not a 400: the request was not at fault
    assert isinstance(err.value.__cause__, ValueError) and "Draft needs one parent" in str(err.value.__cause__)


def test_sampling_object_and_keywords_agree(spec):
    a = spec.generate("for i in", sampling=SamplingParams(max_tokens=8, temperature=0.8, seed=3))
    b = spec.generate("for i in", max_tokens=8, temperature=0.8, seed=3)
    assert a.token_ids == b.token_ids


def test_documents_feed_the_next_generation(spec):
    prompt, _, bias = copyable(spec, 24)
    plain = spec.generate(prompt, max_tokens=24, speculation=False, logit_bias=bias)
    recs = spec.add_documents([{"text": prompt + plain.text, "source": "point.py"}, "other text"])
    assert [r["status"] for r in recs] == ["added", "added"] and recs[0]["source"] == "point.py"
    assert spec.add_documents(["other text"])[0]["status"] == "unchanged"
    # the statistics say the drafter has not loaded them yet (the web page showed "0 loaded" without why)
    assert spec.index_stats()["served"]["documents_pending"] is True
    # not adaptive: the cost gates judge from measured pass times, and on a loaded machine they may skip
    # every draft of a 24-token request (this test is about the documents reaching the drafter)
    res = spec.generate(prompt, max_tokens=24, speculation={"drafters": ["documents"], "adaptive": False},
                        logit_bias=bias)
    served = spec.index_stats()["served"]
    assert served["documents_pending"] is False and served["documents_loaded_tokens"] > 0
    assert res.text == plain.text and res.stats.per_source["documents"]["accepted"] > 0
    listing = spec.list_documents(limit=10)
    assert listing["total"] == 2 and {d["id"] for d in listing["data"]} == {r["id"] for r in recs}
    assert spec.list_documents(query="point.py")["total"] == 1
    assert spec.index_stats()["documents"] == 2
    assert spec.remove_documents([recs[1]["id"]]) == 1 and spec.list_documents()["total"] == 1


def test_bad_arguments(spec):
    with pytest.raises(ValueError, match="exactly one"):
        spec.generate("x", messages=[{"role": "user", "content": "y"}])
    with pytest.raises(ValueError, match="drafter"):
        spec.generate("x", speculation={"drafters": ["magic"]})


def test_without_a_store(tiny_model_dirs):
    s = SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=None, db=False)
    assert s.generate("x", max_tokens=2).finish_reason in ("stop", "length")
    with pytest.raises(RuntimeError, match="db=False"):
        s.add_documents(["text"])
    s.close()
    s.close()  # idempotent


def test_a_draft_that_tokenizes_alike_shares_the_targets_tokenizer(tiny_model_dirs, tiny_draft_dir):
    """A draft whose tokenizer files are the target's bytes takes the target's tokenizer (one ~140 MB table
    for Qwen's pair, not two); another tokenizer's draft loads its own; outputs stay plain decoding's."""
    from suffixspec.loading import load_model, tokenizer_files

    a = load_model(str(tiny_model_dirs["llama"]), device="cpu")
    assert a.tokenizer_files == tokenizer_files(str(tiny_model_dirs["qwen2"])) is not None
    assert load_model(str(tiny_model_dirs["qwen2"]), device="cpu", share_tokenizer=a).tokenizer is a.tokenizer
    assert load_model(str(tiny_model_dirs["qwen2"]), device="cpu").tokenizer is not a.tokenizer
    other = load_model(str(tiny_draft_dir), device="cpu", share_tokenizer=a)
    assert other.tokenizer_files != a.tokenizer_files and other.tokenizer is not a.tokenizer
    with SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=str(tiny_model_dirs["qwen2"]), db=False) as s:
        drafter = next(p for p in s.proposers if getattr(p, "name", "") == "draft_model")
        assert drafter.draft.tokenizer is s.tokenizer
        plain = s.generate("def add(a, b):", max_tokens=12, speculation=False)
        fast = s.generate("def add(a, b):", max_tokens=12, speculation={"drafters": ["draft_model"]})
        assert fast.token_ids == plain.token_ids


def test_draft_model_with_another_tokenizer_is_lossless(tiny_model_dirs, tiny_draft_dir):
    """The draft model's proposer is built for a different vocabulary (bridged) and keeps outputs equal."""
    with SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=str(tiny_draft_dir), db=False) as s:
        assert any(getattr(p, "name", "") != "suffix" for p in s.proposers)
        plain = s.generate("def add(a, b):", max_tokens=12, speculation=False)
        fast = s.generate("def add(a, b):", max_tokens=12, speculation={"drafters": ["draft_model"]})
        assert fast.token_ids == plain.token_ids
        assert fast.stats.drafted_tokens > 0


def test_add_paths_reports_what_it_skipped(spec, tmp_path):
    """add_paths skips what `index add` skips, says so per file, and follows links out only when asked."""
    docs, outside = tmp_path / "docs", tmp_path / "outside"
    docs.mkdir()
    outside.mkdir()
    (docs / "a.py").write_text("def a():\n    return 1\n")
    (docs / "blob.bin").write_bytes(b"\x00\x01binary")
    (docs / "big.txt").write_text("x" * 5000)
    (outside / "secret.txt").write_text("not under docs")
    (docs / "link.txt").symlink_to(outside / "secret.txt")
    recs = spec.add_paths([docs], max_bytes=4096)
    by_name = {Path(r["source"]).name: r for r in recs}
    assert by_name["a.py"]["status"] == "added" and by_name["a.py"]["id"] is not None
    assert by_name["blob.bin"]["status"] == "skipped" and "binary" in by_name["blob.bin"]["reason"]
    assert by_name["big.txt"]["status"] == "skipped" and "too large" in by_name["big.txt"]["reason"]
    assert by_name["link.txt"]["status"] == "skipped" and "outside" in by_name["link.txt"]["reason"]
    assert spec.list_documents(query="secret")["total"] == 0
    followed = spec.add_paths([docs], globs=["*.txt"], follow_links=True, max_bytes=4096)
    assert {r["status"] for r in followed if r["source"].endswith("secret.txt")} == {"added"}
    with pytest.raises(FileNotFoundError):
        spec.add_paths([tmp_path / "missing"])
