"""tokenizer_bridge: byte spellings, look-behind translation, boundary lattice, vocabulary intersection.

Three real, different tokenizers: byte-level BPE (GPT-2 style), Metaspace/Unigram (SentencePiece
style, NFKC, no byte fallback) and a Llama-style Unigram with byte fallback (built here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from suffixspec.tokenizer_bridge import (
    BoundaryLattice,
    IncrementalEncoder,
    TokenBridge,
    VocabTable,
    translate_tail,
    utf8_complete_prefix,
    vocab_table,
)

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n\tprint(i, i * i)\n\t\n",
    "Héllo wörld! naïve café",
    "你好，世界。 CJK 日本語",
    "emoji 🙂🚀 mid🙂word",
    "trailing spaces   ",
    "  leading spaces and\ttabs\t\t",
    "if x is None:\n        raise ValueError('x')\n",
]


def train_bytefallback_tokenizer(out_dir: Path) -> Path:
    """Llama-style SentencePiece: Unigram with <0xNN> byte fallback, Prepend/Replace normalizer."""
    from tiny import CORPUS
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    base = Tokenizer(models.Unigram())
    base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>")
    base.train_from_iterator(CORPUS, trainer=trainer)
    vocab = json.loads(base.to_str())["model"]["vocab"]
    vocab += [[f"<0x{b:02X}>", -20.0] for b in range(256)]
    tok = Tokenizer(models.Unigram(vocab=[tuple(v) for v in vocab], unk_id=0, byte_fallback=True))
    tok.normalizer = base.normalizer
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def toks(bpe_tokenizer_dir, unigram_tokenizer_dir, tiny_dir):
    from transformers import AutoTokenizer

    fb = train_bytefallback_tokenizer(tiny_dir / "bytefallback-tokenizer")
    return {"bpe": AutoTokenizer.from_pretrained(bpe_tokenizer_dir),
            "unigram": AutoTokenizer.from_pretrained(unigram_tokenizer_dir),
            "bytefallback": AutoTokenizer.from_pretrained(fb)}


PAIRS = [("bpe", "unigram"), ("unigram", "bpe"), ("bpe", "bytefallback"), ("bytefallback", "bpe"),
         ("unigram", "bytefallback")]


@pytest.mark.parametrize("data,expected", [
    (b"", 0), (b"abc", 3), ("a你".encode()[:-1], 1), ("a你".encode(), 4), ("🙂".encode()[:3], 0),
    ("é".encode()[:1], 0), (b"\x80\x80", 2),  # stray continuation bytes are not held back forever
])
def test_utf8_complete_prefix(data, expected):
    assert utf8_complete_prefix(data) == expected


@pytest.mark.parametrize("name,piece,expected", [
    ("bpe", "Ġ", b" "), ("bpe", "Ċ", b"\n"), ("bpe", "ĉ", b"\t"), ("bpe", "ä½ł", "你".encode()),
    ("unigram", "▁", b" "), ("bytefallback", "<0xE4>", b"\xe4"), ("bytefallback", "<0x0A>", b"\n"),
])
def test_token_bytes(toks, name, piece, expected):
    tok = toks[name]
    tid = tok.convert_tokens_to_ids(piece)
    assert vocab_table(tok).token_bytes[tid] == expected


def test_kinds_and_specials(toks):
    kinds = {n: (vocab_table(t).kind, vocab_table(t).prepends_space) for n, t in toks.items()}
    assert kinds == {"bpe": ("byte_level", False), "unigram": ("metaspace", True), "bytefallback": ("metaspace", True)}
    for tok in toks.values():
        vt = vocab_table(tok)
        assert all(vt.token_bytes[i] is None for i in tok.all_special_ids)


@pytest.mark.parametrize("name", ["bpe", "unigram", "bytefallback"])
@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(toks, name, text):
    """Token bytes spell the text (a prepending tokenizer adds one leading space) and encode_exact agrees."""
    tok = toks[name]
    vt = vocab_table(tok)
    ids = tok.encode(text, add_special_tokens=False)
    if vt.token_bytes[ids[0]] is None:  # <unk> for a character the tiny unigram never saw
        pytest.skip("no byte fallback for this text")
    spelled = vt.bytes_of(ids)
    if any(vt.token_bytes[i] is None for i in ids):
        return  # <unk> inside: nothing exact to check
    add = vt.prepends_always or (vt.prepends_space and not text.startswith(" "))
    want = b" " + text.encode() if add else text.encode()
    if name == "unigram":  # NFKC rewrites full-width punctuation
        import unicodedata

        want = unicodedata.normalize("NFKC", want.decode()).encode()
    assert spelled == want
    assert vt.encode_exact(spelled) == ids


def _tail_tokens(vocab: VocabTable, data: bytes) -> list[int]:
    """What a draft model would emit for ``data``: the draft tokenizer's own split of it."""
    enc = vocab.encode_exact(data)
    return enc if enc is not None else vocab.split_longest(data)


@pytest.mark.parametrize("target,draft", PAIRS)
@pytest.mark.parametrize("text", TEXTS)
def test_translate_every_cut(toks, target, draft, text):
    """Cut the target's tokens anywhere; the draft's spelling of the rest translates back exactly."""
    bridge = TokenBridge.cached(toks[target], toks[draft])
    tv, dv = bridge.target, bridge.draft
    ids = toks[target].encode(text, add_special_tokens=False)
    if any(tv.token_bytes[i] is None for i in ids):
        pytest.skip("target tokenizer has <unk> for this text")
    full = tv.bytes_of(ids)
    exact = tried = 0
    for cut in range(1, len(ids)):
        head = tv.bytes_of(ids[:cut])
        tail = full[len(head):]
        if utf8_complete_prefix(head) != len(head):
            continue  # the target stopped inside a character: covered by test_partial_utf8_context
        d_ids = _tail_tokens(dv, tail)
        if dv.bytes_of(d_ids) != tail:
            continue  # the draft cannot spell this text (no byte fallback)
        tr = bridge.translate(ids[:cut], d_ids)
        assert tv.bytes_of(ids[:cut] + tr.target_ids) + tr.rest == full, (cut, tr)
        exact += tr.target_ids == ids[cut:]
        tried += 1
    # the look-behind window reproduces the target's own tokenization at (nearly) every cut
    assert exact >= 0.8 * tried - 1


def test_boundary_mismatch_keeps_emitted_tokens(toks):
    """The target emitted "ret"; the draft continues "urn x": the emitted token stays, the tail follows it."""
    tv = vocab_table(toks["bpe"])
    ctx = tv.encode_exact(b"def f(x):\n\t")
    ret = tv.by_bytes[b"ret"]
    r = translate_tail(tv, ctx + [ret], b"urn x")
    assert r.keep == len(ctx) + 1
    assert tv.bytes_of(r.new_ids) == b"urn x"


def test_partial_utf8(toks):
    """Draft bytes ending inside a character are held back; a context ending inside one is completed."""
    bridge = TokenBridge.cached(toks["bpe"], toks["bytefallback"])
    tv, dv = bridge.target, bridge.draft
    ctx = tv.encode_exact(b"emoji ")
    emoji = "🙂".encode()
    d_half = [dv.by_bytes[bytes([b])] for b in emoji[:2]]
    tr = bridge.translate(ctx, d_half)
    assert tr.target_ids == [] or tv.bytes_of(tr.target_ids) + tr.rest == emoji[:2]
    assert tr.rest and utf8_complete_prefix(tv.bytes_of(tr.target_ids)) == len(tv.bytes_of(tr.target_ids))
    # the target context itself ends inside the emoji: the draft context holds the bytes back
    split = tv.split_longest(b"emoji " + emoji)
    assert utf8_complete_prefix(tv.bytes_of(split[:-1])) != len(tv.bytes_of(split[:-1]))
    dctx = bridge.draft_context(split[:-1])
    assert dctx.pending and emoji.startswith(dctx.pending)
    d_full = _tail_tokens(dv, emoji + b" ok")
    tr = bridge.translate(split[:-1], d_full, skip=dctx.pending)
    assert tv.bytes_of(split[:-1] + tr.target_ids) + tr.rest == b"emoji " + emoji + b" ok"
    assert bridge.translate(split[:-1], _tail_tokens(dv, b"no"), skip=dctx.pending).target_ids == []


@pytest.mark.parametrize("target,draft", PAIRS)
@pytest.mark.parametrize("text", TEXTS)
def test_draft_context_incremental(toks, target, draft, text):
    """Pushing target tokens one at a time gives the draft ids that spell the same text."""
    bridge = TokenBridge.cached(toks[target], toks[draft])
    ids = toks[target].encode(text, add_special_tokens=False)
    if not spellable_by_both(bridge, ids):
        pytest.skip("not spellable exactly by both tokenizers")
    assert_pushed_equals_whole(bridge, ids)


def spellable_by_both(bridge, ids: list[int]) -> bool:
    """Every target id has bytes, and the draft tokenizer spells those bytes exactly."""
    tv = bridge.target
    return all(tv.token_bytes[i] is not None for i in ids) and bridge.draft.encode_exact(tv.bytes_of(ids)) is not None


def assert_pushed_equals_whole(bridge, ids: list[int]) -> None:
    """A draft context fed target ids one by one equals one built from all of them, and spells them."""
    tv, dv = bridge.target, bridge.draft
    whole = bridge.draft_context(ids)
    step = bridge.draft_context(ids[:1])
    for t in ids[1:]:
        step.push_target([t])
    assert step.ids == whole.ids
    assert dv.bytes_of(step.ids) + step.pending in (tv.bytes_of(ids), b" " + tv.bytes_of(ids))


def test_incremental_encoder_rewrites_tail(toks):
    vt = vocab_table(toks["bpe"])
    enc = IncrementalEncoder(vt)
    enc.append_bytes(b"def f(x):\n    re")
    before = list(enc.ids)
    keep = enc.append_bytes(b"turn x\n")
    assert keep < len(before)  # "re" became part of "return"'s tokens
    assert enc.ids == vt.encode_exact(b"def f(x):\n    return x\n")


def test_special_tokens(toks):
    bridge = TokenBridge.cached(toks["bpe"], toks["unigram"])
    dv = bridge.draft
    t_eos, d_eos = toks["bpe"].eos_token_id, toks["unigram"].eos_token_id
    ctx = bridge.target.encode_exact(b"x = 1")
    tr = bridge.translate(ctx, dv.split_longest(b"\n") + [d_eos] + dv.split_longest(b"junk"))
    assert tr.eos and tr.target_ids[-1] == t_eos and tr.draft_used == 2
    # the draft's BOS starts its context; target EOS maps to the draft's EOS
    bos = toks["unigram"].bos_token_id
    assert bridge.draft_prefix_ids() in ([], [bos])
    d = bridge.draft_context(ctx + [t_eos])
    assert d.ids[-1] == d_eos
    # im_start has no draft counterpart: dropped, the text around it still arrives
    im = toks["bpe"].convert_tokens_to_ids("<|im_start|>")
    d2 = bridge.draft_context(ctx + [im] + bridge.target.encode_exact(b"ab"))
    assert dv.bytes_of(d2.ids).endswith(b"ab")


def test_lattice():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "b": 1, "a": 2, "r": 3, "s": 4, "e": 5, "ba": 6, "bar": 7, "base": 8, "ar": 9, "bark": 10, "k": 11}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    lat = BoundaryLattice(VocabTable(fast))
    assert lat.starts(b"bar!") == [7, 6, 1]
    assert lat.completions(b"ba", k=10) == [6, 7, 8, 10]
    assert lat.completions(b"ba", k=2, exclude=[6]) == [7, 8]
    scores = np.zeros(12)
    scores[10] = 0.9
    assert lat.completions(b"ba", k=1, exclude=[6], scores=scores) == [10]
    assert (0, 3, 7) in lat.spans(b"bar") and (1, 3, 9) in lat.spans(b"bar")
    assert lat.completions(b"zz") == []


def test_siblings(toks):
    bridge = TokenBridge.cached(toks["bpe"], toks["unigram"])
    tv = bridge.target
    last = tv.by_bytes[b" r"] if b" r" in tv.by_bytes else tv.by_bytes[b"r"]
    sib = bridge.siblings(last, b"", k=5)
    assert last not in sib and sib
    assert all(tv.token_bytes[s].startswith(tv.token_bytes[last]) for s in sib)


@pytest.mark.parametrize("target,draft", PAIRS)
def test_intersection(toks, target, draft):
    bridge = TokenBridge.cached(toks[target], toks[draft])
    inter = bridge.intersection
    cov = bridge.coverage()
    assert 0 < cov.draft_mapped <= cov.draft_size and 0 < cov.target_covered <= cov.target_size
    assert cov.to_dict()["draft_fraction"] == pytest.approx(cov.draft_mapped / cov.draft_size, abs=1e-4)
    for d, t in zip(inter.draft_ids, inter.target_ids, strict=True):
        db, tb = bridge.draft.token_bytes[d], bridge.target.token_bytes[t]
        assert db == tb or (db is None and tb is None)  # same spelling, or specials paired by role/text
    assert inter.to_target[toks[draft].eos_token_id] == toks[target].eos_token_id
    # " " in both spellings (Ġ / ▁) corresponds
    assert inter.to_target[bridge.draft.by_bytes[b" "]] == bridge.target.by_bytes[b" "]
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.ones(bridge.draft_size), size=3)
    qt = bridge.map_q(q)
    assert qt.shape == (3, bridge.target_size)
    np.testing.assert_allclose(qt.sum(-1), 1.0)
    outside = np.ones(bridge.target_size, bool)
    outside[inter.target_ids] = False
    assert (qt[:, outside] == 0).all()
    import torch

    qt2 = bridge.map_q(torch.tensor(q))
    np.testing.assert_allclose(qt2.numpy(), qt, atol=1e-12)
    assert bridge.map_q(np.zeros((1, bridge.draft_size))).sum() == 0  # no mass: all-zero row


def test_bytefallback_intersection(toks):
    """<0xE4> (byte fallback) corresponds to byte-level "ä" (0xE4)."""
    bridge = TokenBridge.cached(toks["bpe"], toks["bytefallback"])
    d = toks["bytefallback"].convert_tokens_to_ids("<0xE4>")
    t = bridge.intersection.to_target[d]
    assert bridge.target.token_bytes[t] == b"\xe4"


def test_cached(toks):
    a = TokenBridge.cached(toks["bpe"], toks["unigram"])
    assert TokenBridge.cached(toks["bpe"], toks["unigram"]) is a
    assert a.intersection is a.intersection and a.lattice is a.lattice
    assert vocab_table(toks["bpe"]) is a.target
    same = TokenBridge.cached(toks["bpe"], toks["bpe"])
    assert same.same_vocabulary and not a.same_vocabulary


def test_no_torch_at_import():
    code = "import sys, suffixspec.tokenizer_bridge; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
