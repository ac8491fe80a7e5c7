"""detok.py: UTF-8-safe incremental text, stop strings held back and cut, provenance pieces."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from suffixspec.core.detok import TextTracker


@pytest.fixture(scope="module")
def tok(bpe_tokenizer_dir):
    return AutoTokenizer.from_pretrained(bpe_tokenizer_dir)


@pytest.mark.parametrize("text", ["Héllo wörld 🙂🚀", "你好，世界。", "def f(x):\n\treturn x  \n", "a  b   c"])
def test_incremental_text_equals_full_decode_and_never_splits_characters(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    tracker = TextTracker(tok, [])
    released = []
    for i, t in enumerate(ids):
        tracker.push(t, "target" if i % 2 else "prompt")
        piece = "".join(p for p, _ in tracker.release())
        assert "\ufffd" not in piece
        released.append(piece)
    released.append("".join(p for p, _ in tracker.release(final=True)))
    assert "".join(released) == tok.decode(ids) == text


def test_multibyte_emoji_waits_for_all_its_tokens(tok):
    ids = tok.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1  # byte-level pieces of one character
    tracker = TextTracker(tok, [])
    for t in ids[:-1]:
        tracker.push(t, "target")
        assert tracker.release() == []
    tracker.push(ids[-1], "target")
    assert tracker.release() == [("🙂", "target")]


@pytest.mark.parametrize(
    "text,stop,expected,stopped",
    [
        ("a\n\nb", ["\n\n"], "a", True),
        ("return x + y", ["x +", "zz"], "return ", True),
        ("hello world", ["nope"], "hello world", False),
        ("one two three", ["two", "one two"], "", True),  # the earliest occurrence wins
    ],
)
def test_stop_strings_cut_text(tok, text, stop, expected, stopped):
    tracker = TextTracker(tok, stop)
    hit = False
    for t in tok.encode(text, add_special_tokens=False):
        if tracker.push(t, "target"):
            hit = True
            break
    out = "".join(p for p, _ in tracker.release()) + "".join(p for p, _ in tracker.release(final=True))
    assert hit == stopped and out == expected == tracker.text


def test_text_that_may_start_a_stop_string_is_held_back(tok):
    tracker = TextTracker(tok, ["END"])
    for t in tok.encode("abc EN", add_special_tokens=False):
        tracker.push(t, "target")
    assert "".join(p for p, _ in tracker.release()) == "abc "
    for t in tok.encode("D", add_special_tokens=False):
        assert tracker.push(t, "target")
    assert tracker.text == "abc "


def test_pieces_keep_sources_and_merge_runs(tok):
    tracker = TextTracker(tok, [])
    for word, src in [("def", "prompt"), (" f", "prompt"), ("(x)", "target")]:
        for t in tok.encode(word, add_special_tokens=False):
            tracker.push(t, src)
    assert tracker.release() == [("def f", "prompt"), ("(x)", "target")]
