"""Fuzz the token bridge with random Unicode text against round-trip properties (derandomized).

Three real, different tokenizers (byte-level BPE, NFKC Metaspace/Unigram without byte fallback,
Llama-style Unigram with byte fallback). Properties, for any text:
- the byte-level vocabulary spells the tokenizer's ids back to the exact UTF-8 bytes, and
  ``encode_exact`` of those bytes gives the same ids;
- ``utf8_complete_prefix`` of any byte cut is the longest prefix that decodes;
- ``IncrementalEncoder`` fed the bytes in random chunks (cutting characters) always holds ids that,
  with its pending bytes, spell exactly what was fed;
- a draft's spelling of the rest of the text, translated at a random cut of the target's ids,
  completes the target's bytes exactly (``translate``);
- a ``DraftContext`` pushed one target token at a time equals the one built at once.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixspec.tokenizer_bridge import IncrementalEncoder, TokenBridge, utf8_complete_prefix, vocab_table

pytestmark = pytest.mark.slow

SETTINGS = settings(derandomize=True, deadline=None, database=None, print_blob=False, max_examples=80,
                    suppress_health_check=list(HealthCheck))
PIECES = ["def ", "return", " x", "\n", "\t", "  ", "é", "ß", "你好", "🙂", "🚀", "\u200b", "ﬁ", "Ａ", "a\u0301",
          "\r\n", "<|im_start|>", "</s>", "▁", "Ġ", "\x00", "\x7f", "\U0010ffff"]
texts = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=24),
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=10).map("".join),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=3)), min_size=1, max_size=8).map("".join),
).filter(lambda t: len(t) > 0)
TRIED = {"texts": 0, "cuts": 0, "translations": 0}


@pytest.fixture(scope="module")
def toks(bpe_tokenizer_dir, unigram_tokenizer_dir, tiny_dir):
    from test_bridge import train_bytefallback_tokenizer
    from transformers import AutoTokenizer

    fb_dir = tiny_dir / "bytefallback-tokenizer"
    fb = fb_dir if (fb_dir / "tokenizer.json").exists() else train_bytefallback_tokenizer(fb_dir)
    return {"bpe": AutoTokenizer.from_pretrained(bpe_tokenizer_dir),
            "unigram": AutoTokenizer.from_pretrained(unigram_tokenizer_dir),
            "bytefallback": AutoTokenizer.from_pretrained(fb)}


def plain(tok, text: str) -> list[int]:
    """The tokenizer's ids for ``text`` with special-token strings kept as text (as the bridge sees documents)."""
    return tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


@SETTINGS
@given(text=texts, seed=st.integers(0, 2**16))
def test_byte_level_round_trip_and_utf8_cuts(toks, text, seed):
    TRIED["texts"] += 1
    vt = vocab_table(toks["bpe"])
    data = text.encode("utf-8")
    ids = plain(toks["bpe"], text)
    assert vt.bytes_of(ids) == data
    assert vt.encode_exact(data) in (ids, None)  # None only when the text spells a special token
    if "<|" not in text:
        assert vt.encode_exact(data) == ids
    rng = random.Random(seed)
    for _ in range(4):
        cut = rng.randrange(len(data) + 1)
        k = utf8_complete_prefix(data[:cut])
        data[:k].decode("utf-8")  # decodes
        assert k <= cut and (k == cut or cut - k <= 3)
        if k < cut:
            with pytest.raises(UnicodeDecodeError):
                data[:cut].decode("utf-8")


@SETTINGS
@given(text=texts, seed=st.integers(0, 2**16))
def test_incremental_encoder_spells_what_it_was_fed(toks, text, seed):
    vt = vocab_table(toks["bpe"])
    data = text.encode("utf-8")
    rng = random.Random(seed)
    enc = IncrementalEncoder(vt)
    fed = b""
    i = 0
    while i < len(data):
        j = min(len(data), i + rng.randrange(1, 6))  # chunks cut characters anywhere
        before = list(enc.ids)
        keep = enc.append_bytes(data[i:j])
        fed += data[i:j]
        TRIED["cuts"] += 1
        assert enc.ids[:keep] == before[:keep]  # only the tail is rewritten
        assert vt.bytes_of(enc.ids) + enc.pending == fed
        assert utf8_complete_prefix(vt.bytes_of(enc.ids)) == len(vt.bytes_of(enc.ids))
        i = j
    assert enc.pending == b""


PAIRS = [("bpe", "unigram"), ("unigram", "bpe"), ("bpe", "bytefallback"), ("bytefallback", "bpe")]


@SETTINGS
@given(text=texts, pair=st.sampled_from(PAIRS), seed=st.integers(0, 2**16))
def test_translate_completes_the_target_bytes(toks, text, pair, seed):
    target, draft = pair
    bridge = TokenBridge.cached(toks[target], toks[draft])
    tv, dv = bridge.target, bridge.draft
    ids = plain(toks[target], text)
    if not ids or any(tv.token_bytes[i] is None for i in ids):
        return  # <unk> in the target: nothing exact to compare
    full = tv.bytes_of(ids)
    rng = random.Random(seed)
    for cut in sorted({rng.randrange(0, len(ids) + 1) for _ in range(3)}):
        head = tv.bytes_of(ids[:cut])
        tail = full[len(head):]
        if utf8_complete_prefix(head) != len(head) or not tail:
            continue
        enc = dv.encode_exact(tail)
        d_ids = enc if enc is not None else dv.split_longest(tail)
        if dv.bytes_of(d_ids) != tail:
            continue  # the draft cannot spell this text
        tr = bridge.translate(ids[:cut], d_ids)
        TRIED["translations"] += 1
        assert tv.bytes_of(ids[:cut] + tr.target_ids) + tr.rest == full, (cut, tr)
        assert not tr.eos and tr.draft_used == len(d_ids)


@SETTINGS
@given(text=texts, pair=st.sampled_from(PAIRS))
def test_draft_context_pushed_token_by_token_equals_at_once(toks, text, pair):
    target, draft = pair
    from test_bridge import assert_pushed_equals_whole, spellable_by_both

    bridge = TokenBridge.cached(toks[target], toks[draft])
    ids = plain(toks[target], text)
    if ids and spellable_by_both(bridge, ids):
        assert_pushed_equals_whole(bridge, ids)


def test_fuzz_bridge_summary():
    print("bridge fuzz:", TRIED)
    assert TRIED["texts"] >= 60 and TRIED["translations"] >= 40
