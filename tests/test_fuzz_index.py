"""Fuzz the suffix indexes against brute-force reference implementations (seeded, derandomized).

- ``IncrementalIndex``: random interleavings of append / extend (short, per-step path and long,
  vectorised path) / end_sequence / add_sequence / clear, with ids from a tiny alphabet (many
  repeats) and huge ids (hash folding), then every lookup (match, count, continuations, speculate)
  is compared with a scan of the token list.
- ``SuffixArray``: built from random sequences; match / count / continuations / speculate likewise.
- ``OutputHistory``: adds with eviction under a small budget, against a deque of kept outputs.
- ``IndexStore``: interleaved add / re-add / replace / remove of text documents against a dict, then
  the suffix array served from the store holds exactly the reference's token sequences, in order.
"""

from __future__ import annotations

import random
from collections import Counter, deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixspec.index import SEP, IncrementalIndex, SpecParams, SuffixArray
from suffixspec.index.history import OutputHistory

pytestmark = pytest.mark.slow  # hypothesis fuzzing

SETTINGS = settings(derandomize=True, deadline=None, database=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))
TRIED: Counter = Counter()

toks = st.one_of(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4),
                 st.sampled_from([2**21 - 1, 2**21, 2**21 + 1, 2**32 - 2, 7 + 2**21, 123456789]))
seqs = st.lists(toks, max_size=12)
op = st.one_of(
    st.tuples(st.just("append"), toks),
    st.tuples(st.just("extend"), seqs),
    st.tuples(st.just("extend_long"), st.lists(toks, min_size=64, max_size=90)),
    st.tuples(st.just("end"), st.none()),
    st.tuples(st.just("add_sequence"), seqs),
    st.tuples(st.just("clear"), st.none()),
)


# -- brute force ------------------------------------------------------------------------------------

def ref_match(buf: list[int], context: list[int], max_depth: int, live_end: bool) -> tuple[int, list[int]]:
    """(longest L, sorted end positions) of context[-L:] in buf; ``live_end``: an occurrence ending at
    len(buf) does not count (it has no continuation yet)."""
    n = len(buf)
    m = min(max_depth, len(context))
    for L in range(m, 0, -1):
        pat = context[-L:]
        ends = [e for e in range(L, n + 1) if buf[e - L:e] == pat and not (live_end and e == n)]
        if ends:
            return L, ends
    return 0, []


def ref_continuations(buf: list[int], ends: list[int]) -> list[tuple[int, int]]:
    c = Counter(buf[e] for e in ends if e < len(buf) and buf[e] != SEP)
    return sorted(c.items(), key=lambda tc: (-tc[1], tc[0]))


def check_draft(res, buf: list[int], context: list[int], params: SpecParams) -> None:
    """Every draft path continues an occurrence of the matched suffix; probabilities behave."""
    assert len(res) <= params.limit(res.match_len)
    L = res.match_len
    for i, (tok, parent, prob) in enumerate(zip(res.token_ids, res.parents, res.probs, strict=True)):
        assert -1 <= parent < i and tok != SEP
        assert params.min_token_prob - 1e-9 <= prob <= 1 + 1e-9
        if parent >= 0:
            assert prob <= res.probs[parent] + 1e-9
        path, j = [], i
        while j >= 0:
            path.append(res.token_ids[j])
            j = res.parents[j]
        pat = context[-L:] + path[::-1]
        assert any(buf[e - len(pat):e] == pat for e in range(len(pat), len(buf) + 1)), (pat, i)


def contexts(rng: random.Random, buf: list[int], k: int = 6) -> list[list[int]]:
    """Query contexts: random, and suffixes of real windows (long matches) with a random token before."""
    out = [[rng.randrange(5) for _ in range(rng.randrange(1, 8))] for _ in range(k // 2)]
    real = [t for t in buf if t != SEP]
    for _ in range(k - k // 2):
        if real:
            i = rng.randrange(len(real))
            j = rng.randrange(i, min(len(real), i + 10)) + 1
            out.append([rng.randrange(6)] * rng.randrange(2) + real[i:j])
    return out


# -- IncrementalIndex --------------------------------------------------------------------------------

@settings(SETTINGS, max_examples=150)
@given(ops=st.lists(op, max_size=14), seed=st.integers(0, 2**16))
def test_incremental_index_matches_brute_force(ops, seed):
    idx = IncrementalIndex(max_candidates=10**6)  # every occurrence examined: exact counts
    buf: list[int] = []
    rng = random.Random(seed)
    for name, arg in ops:
        TRIED["incremental ops"] += 1
        if name == "append":
            idx.append(arg)
            buf.append(arg)
        elif name in ("extend", "extend_long"):
            idx.extend(arg)
            buf += arg
        elif name == "end":
            idx.end_sequence()
            buf.append(SEP)
        elif name == "add_sequence":
            idx.add_sequence(arg)
            buf += arg + [SEP]
        else:
            idx.clear()
            buf = []
        assert len(idx) == len(buf) and idx.tokens() == buf
        assert idx.num_tokens == sum(t != SEP for t in buf)
    for ctx in contexts(rng, buf):
        TRIED["incremental lookups"] += 1
        depth = rng.choice([64, 3, 2, 1])
        L, ends = idx.match(ctx, depth)
        rL, rends = ref_match(buf, ctx, depth, live_end=True)
        assert (L, sorted(ends)) == (rL, rends), (ctx, depth)
        assert idx.continuations(ctx, depth) == ref_continuations(buf, rends)
        assert idx.count(ctx) == (len(ref_match(buf, ctx, len(ctx), True)[1])
                                  if ref_match(buf, ctx, len(ctx), True)[0] == len(ctx) else 0)
        params = SpecParams(max_spec_tokens=8, max_spec_factor=rng.choice([1.0, 4.0]), min_token_prob=0.1,
                            use_tree_spec=rng.random() < 0.5)
        check_draft(idx.speculate(ctx, params, depth), buf, ctx, params)


def test_incremental_from_sequences_equals_appends():
    rng = random.Random(7)
    for _ in range(30):
        ss = [[rng.choice([0, 1, 2, 3, 2**32 - 2]) for _ in range(rng.randrange(0, 40))] for _ in range(rng.randrange(6))]
        a = IncrementalIndex.from_sequences(ss, max_candidates=10**6)
        b = IncrementalIndex(max_candidates=10**6)
        for s in ss:
            b.add_sequence(s)
        assert a.tokens() == b.tokens()
        for ctx in contexts(rng, a.tokens()):
            assert a.match(ctx) == b.match(ctx) and a.continuations(ctx) == b.continuations(ctx)


def test_incremental_rejects_bad_ids_and_bad_contexts_do_not_crash():
    idx = IncrementalIndex()
    idx.extend([1, 2, 3, 1, 2])
    for bad in ([-1], [SEP], [2**40], [-1] * 70, [SEP] * 70):
        with pytest.raises(ValueError):
            idx.extend(bad)
    assert idx.tokens() == [1, 2, 3, 1, 2]  # a refused extend leaves the index as it was
    for ctx in ([], [-5], [2**40], [1, -1, 2], [SEP, 1, 2]):
        idx.match(ctx)
        idx.speculate(ctx, SpecParams())


# -- SuffixArray -------------------------------------------------------------------------------------

@settings(SETTINGS, max_examples=100)
@given(corpus=st.lists(seqs, max_size=8), seed=st.integers(0, 2**16))
def test_suffix_array_matches_brute_force(corpus, seed):
    sa = SuffixArray.build(corpus)
    buf = [t for s in corpus for t in [*s, SEP]]
    assert sa.num_tokens == sum(map(len, corpus)) and sa.num_sequences == len(corpus)
    rng = random.Random(seed)
    for ctx in contexts(rng, buf, 8):
        TRIED["suffix array lookups"] += 1
        depth = rng.choice([64, 2])
        L, lo, hi = sa.match(ctx, depth, hint=rng.choice([None, 1, 5]))
        rL, rends = ref_match(buf, ctx, depth, live_end=False)
        assert (L, hi - lo) == (rL, len(rends)), ctx
        assert sa.continuations(ctx, depth) == ref_continuations(buf, rends)
        if all(0 <= t < SEP for t in ctx):
            assert sa.count(ctx) == len([e for e in range(len(ctx), len(buf) + 1) if buf[e - len(ctx):e] == ctx])
        params = SpecParams(max_spec_tokens=8, max_spec_factor=4.0, use_tree_spec=rng.random() < 0.5)
        check_draft(sa.speculate(ctx, params, depth), buf, ctx, params)


# -- OutputHistory -----------------------------------------------------------------------------------

@settings(SETTINGS, max_examples=60)
@given(outputs=st.lists(st.lists(st.integers(0, 5), max_size=30), max_size=20), budget=st.integers(1, 60))
def test_history_eviction_against_a_deque(outputs, budget):
    hist = OutputHistory(budget_tokens=budget, max_candidates=10**6)
    kept: deque[list[int]] = deque()
    for out in outputs:
        TRIED["history adds"] += 1
        hist.add(out)
        if not out:
            continue
        kept.append(out[-budget:])
        if sum(map(len, kept)) > budget:  # evict oldest down to 90% of the budget, keeping the newest
            while len(kept) > 1 and sum(map(len, kept)) > int(budget * 0.9):
                kept.popleft()
        assert hist.num_outputs == len(kept) and hist.num_tokens == sum(map(len, kept))
        assert hist.num_tokens <= budget
        assert hist.index.tokens() == [t for s in kept for t in [*s, SEP]]


# -- IndexStore --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(bpe_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(bpe_tokenizer_dir))


WORDS = ["def ", "f(x)", ":\n", "    return ", "x + 1", "class ", "Point", " the ", "quick", "🙂", "é", "\n"]
store_op = st.one_of(
    st.tuples(st.just("add"), st.lists(st.tuples(st.sampled_from([None, "a.py", "b.py", "c.md"]),
                                                 st.lists(st.sampled_from(WORDS), min_size=1, max_size=6)),
                                       min_size=1, max_size=3)),
    st.tuples(st.just("remove"), st.lists(st.sampled_from(["a.py", "b.py", "zzz", "1", "2", "3", "999"]),
                                          min_size=1, max_size=2)),
)


@settings(SETTINGS, max_examples=12)
@given(ops=st.lists(store_op, min_size=1, max_size=6))
def test_store_add_remove_against_a_dict(ops, tokenizer, tmp_path_factory):
    from suffixspec.index.records import DocInput, content_hash
    from suffixspec.index.store import IndexStore

    store = IndexStore(tmp_path_factory.mktemp("fuzz-store") / "index.db")
    ref: dict[str, tuple[int, str]] = {}  # key -> (id, text)
    try:
        for name, arg in ops:
            TRIED["store ops"] += 1
            if name == "add":
                docs = [DocInput("".join(words), path) for path, words in arg]
                store.add_documents(docs, tokenizer)
                for d in docs:
                    old = ref.get(d.key())
                    row = store.db.execute("SELECT id FROM documents WHERE path = ?", [d.key()]).fetchone()
                    if old is not None and content_hash(old[1]) == content_hash(d.text):
                        assert row[0] == old[0]  # unchanged: same row
                    ref[d.key()] = (row[0], d.text)
            else:
                n = store.remove(arg)
                gone = {k for k, (i, _) in ref.items() if k in arg or str(i) in arg}
                assert n == len(gone)
                for k in gone:
                    del ref[k]
            rows = {r["path"]: r for r in store.list_documents()}
            assert {k: v[0] for k, v in ref.items()} == {k: r["id"] for k, r in rows.items()}
            sa = store.document_index(tokenizer)
            if not ref:
                assert sa is None
                continue
            expected = [tokenizer.encode(text, add_special_tokens=False) for _, text in sorted(ref.values())]
            assert sorted(sa.sequences()) == sorted(expected)
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        store.close()


# -- segments: tombstones and merges against one suffix array over the live documents ----------------------

class ByteTok:
    fingerprint = "bytes+0"

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


PIECES = ["ab", "abc", "b", "ca", " ", "x", "abab"]
seg_op = st.one_of(
    st.tuples(st.just("add"), st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", "e", None]),
                                                 st.lists(st.sampled_from(PIECES), min_size=1, max_size=8)),
                                       min_size=1, max_size=4)),
    st.tuples(st.just("remove"), st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1, max_size=2)),
    st.tuples(st.just("merge"), st.none()),
    st.tuples(st.just("compact"), st.none()),
)


@settings(SETTINGS, max_examples=60)
@given(ops=st.lists(seg_op, min_size=1, max_size=12), seed=st.integers(0, 2**16))
def test_segments_answer_as_one_array_over_the_live_documents(ops, seed, tmp_path_factory):
    """Adds (each a fresh segment, several when ``flush_tokens`` is tiny), replacements and deletes
    (tombstones), merges, compactions (split into segments of at most ``max_tokens``): every lookup equals
    that of one suffix array built over the live documents."""
    from suffixspec.index.segments import MergePolicy
    from suffixspec.index.store import DocInput, IndexStore

    tok = ByteTok()
    rng = random.Random(seed)
    store = IndexStore(tmp_path_factory.mktemp("fuzz-seg") / "index.db", flush_tokens=12,
                       policy=MergePolicy(fanout=2, floor_tokens=8, max_tokens=200))
    ref: dict[str, str] = {}
    try:
        for name, arg in ops:
            if name == "add":
                docs = [DocInput("".join(words), path) for path, words in arg]
                store.add_documents(docs, tok)
                ref.update((d.key(), d.text) for d in docs)
            elif name == "remove":
                assert store.remove(arg) == len({k for k in arg if k in ref})
                for k in arg:
                    ref.pop(k, None)
            elif name == "merge":
                store.merge_pending()
            else:  # compacted into segments of at most 40 tokens: several, split between documents
                store.policy.max_tokens = 40
                store.compact()
                store.policy.max_tokens = 200
                TRIED["compactions"] += 1
            idx = store.document_index(tok)
            if not ref:
                assert idx is None
                continue
            seqs = [list(t.encode()) for t in ref.values()]
            one = SuffixArray.build(seqs)
            assert sorted(idx.sequences()) == sorted(seqs)
            assert idx.num_tokens == one.num_tokens and idx.num_sequences == len(seqs)
            TRIED["segment sets"] += 1
            TRIED["sets of several segments"] += len(idx.segments) > 1
            TRIED["tombstones"] += sum(len(s.dead) > 0 for s in idx.segments)
            texts = list(ref.values())
            for _ in range(12):
                t = rng.choice(texts).encode()
                i = rng.randint(0, len(t))
                ctx = [rng.choice([120, 122, 97])] + list(t[max(0, i - rng.randint(0, 6)):i])
                params = SpecParams(max_spec_tokens=8, max_spec_factor=rng.choice([1.0, 4.0]),
                                    min_token_prob=rng.choice([0.0, 0.1, 0.34]), use_tree_spec=rng.random() < 0.5)
                a, b = idx.speculate(ctx, params), one.speculate(ctx, params)
                assert (a.token_ids, a.parents, a.probs, a.match_len) == (b.token_ids, b.parents, b.probs,
                                                                          b.match_len), ctx
                assert idx.continuations(ctx) == one.continuations(ctx)
                assert idx.count(ctx[1:]) == one.count(ctx[1:])
                TRIED["segment lookups"] += 1
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        store.close()


def test_fuzz_index_summary():
    print("index fuzz:", dict(TRIED))
    assert TRIED["incremental lookups"] >= 300 and TRIED["suffix array lookups"] >= 300
    # the segment fuzz reached the cases it exists for: several segments, tombstones
    assert TRIED["segment lookups"] >= 300 and TRIED["sets of several segments"] >= 20
    assert TRIED["tombstones"] >= 20 and TRIED["compactions"] >= 20


# -- lookup shortcuts: backward extension of few occurrences, galloping range ends -------------------------

@pytest.mark.parametrize("extend_max", [0, 2, 16, 10**6])
def test_longest_match_equal_with_and_without_backward_extension(extend_max, monkeypatch):
    """``SuffixArray._extend`` finds the longest match from the occurrences of a shorter one when they are
    at most ``_EXTEND_MAX``; with 0 it never does (binary search only). Every setting, on a corpus whose
    short suffixes occur dozens of times (tiny alphabet), with and without tombstones, equals brute force."""
    import suffixspec.index.suffix_array_search as sam

    monkeypatch.setattr(sam, "_EXTEND_MAX", extend_max)
    rng = random.Random(7)
    abc = [1, 2, 258]  # 2 = 0x0002 and 258 = 0x0102 differ in their high byte only
    corpus = [[rng.choice(abc) for _ in range(rng.randrange(0, 60))] for _ in range(12)]
    corpus += [[2, 1, 258, 2, 1] * 8]  # one long periodic document: suffixes occur many times
    sa = SuffixArray.build(corpus)
    buf = [t for s in corpus for t in [*s, SEP]]
    # tombstone the suffixes of the first document (as a delete would) against a reference without it
    first = len(corpus[0]) + 1
    dead = sorted(r for r in range(len(sa.sa)) if sa.sa[r] < first)
    live = sa.with_dead(dead)
    rest = buf[first:]
    for _ in range(150):
        s = rng.choice(corpus)
        i = rng.randint(0, len(s))
        ctx = [rng.choice(abc) for _ in range(rng.randrange(3))] + s[max(0, i - rng.randint(0, 20)):i]
        for depth in (64, 5):
            for hint in (None, 1, 7):
                for arr, ref in ((sa, buf), (live, rest)):
                    L, lo, hi = arr.match(ctx, depth, hint=hint)
                    rL, rends = ref_match(ref, ctx, depth, live_end=False)
                    assert (L, arr._live(lo, hi)) == (rL, len(rends)), (ctx, depth, hint)
                    if L:
                        assert arr.continuations(ctx, depth) == ref_continuations(ref, rends)
                    for at_least in (1, max(1, rL), rL + 1):
                        got = arr.match(ctx, depth, at_least=at_least)[0]
                        assert got == (rL if rL >= at_least else 0), (ctx, at_least)
                    TRIED["extension lookups"] += 1


def test_gallop_right_equals_bisect_right():
    from bisect import bisect_right

    from suffixspec.index.suffix_array_search import gallop_right

    rng = random.Random(3)
    for _ in range(300):
        keys = sorted(rng.randrange(6) for _ in range(rng.randrange(1, 700)))
        pat = rng.choice(keys)
        first, n_equal = keys.index(pat), keys.count(pat)
        lo = first + rng.randrange(n_equal)  # the entries from first to lo equal pat, as after a bisect_left
        hi = rng.randrange(lo + 1, len(keys) + 1)
        calls: list[int] = []

        def key(i, calls=calls, keys=keys):
            calls.append(i)
            return keys[i]

        assert gallop_right(range(len(keys)), pat, lo + 1, hi, key) == bisect_right(keys, pat, lo, hi)
        if hi - lo > 64 and first + n_equal - lo < 7:
            assert len(calls) <= 4  # a short run costs a few keys, not a bisect over [lo, hi)


@pytest.mark.parametrize("extend_max,pos_union", [(0, 0), (2, 3), (16, 48), (10**6, 10**6)])
def test_segment_set_of_both_widths_equals_one_array(extend_max, pos_union, monkeypatch):
    """Nodes made of occurrences (``PosNode``: a match extended backwards from few occurrences, and the
    union of the segments' occurrences when there are at most ``_POS_UNION``), ``sa`` ranges
    (``SANode``, ``_MultiNode``), and mixes of both (a union over the limit turns occurrence nodes into
    ranges) answer as one array over the live documents: segments of 16- and 32-bit ids (a large id in some
    documents), tombstones, a tiny alphabet so that short suffixes occur dozens of times. The reference is
    one array searched by bisection only (no backward extension: ranges only)."""
    import suffixspec.index.segments as segm
    import suffixspec.index.suffix_array_search as sam
    from suffixspec.index.segments import SegmentSet
    from suffixspec.index.suffix_array import PosNode

    rng = random.Random(11)
    abc = [1, 2, 258]
    docs = [[rng.choice(abc) for _ in range(rng.randrange(0, 50))] for _ in range(24)]
    docs += [[2, 1, 258, 2, 1] * 6, [2, 1, 258, 2, 1] * 5]
    for d in docs[1::6]:  # ids above 16 bits: that part's segment stores 4 bytes per token
        if d:
            d[rng.randrange(len(d))] = 70000
    parts = [docs[i::3] for i in range(3)]
    arrays = [SuffixArray.build(p, width=4 if i == 2 else None) for i, p in enumerate(parts)]
    assert sorted(a.width for a in arrays) == [2, 4, 4]
    # tombstone the first document of each part, as a delete would
    dead_docs = [p[0] for p in parts]
    live = []
    for a, p in zip(arrays, parts, strict=True):
        first = len(p[0]) + 1
        live.append(a.with_dead(sorted(r for r in range(len(a.sa)) if a.sa[r] < first)))
    ref_docs = [d for p in parts for d in p[1:]]
    monkeypatch.setattr(sam, "_EXTEND_MAX", 0)
    one = SuffixArray.build(ref_docs)
    contexts = []
    for _ in range(120):
        s = rng.choice(docs)
        i = rng.randint(0, len(s))
        contexts.append([rng.choice(abc) for _ in range(rng.randrange(3))] + s[max(0, i - rng.randint(0, 25)):i])
    params = [SpecParams(max_spec_tokens=12, max_spec_factor=rng.choice([1.0, 4.0]),
                         min_token_prob=rng.choice([0.0, 0.1, 0.34]), use_tree_spec=rng.random() < 0.5)
              for _ in contexts]
    want = [(one.speculate(c, p), one.continuations(c), one.count(c[-4:])) for c, p in zip(contexts, params, strict=True)]
    monkeypatch.setattr(sam, "_EXTEND_MAX", extend_max)
    monkeypatch.setattr(segm, "_POS_UNION", pos_union)
    idx = SegmentSet(live)
    kinds: Counter = Counter()
    for c, p, (w_draft, w_cont, w_count) in zip(contexts, params, want, strict=True):
        L, node = idx.node(c)
        kinds[type(node).__name__] += 1
        if isinstance(node, PosNode):
            kinds["positions in several segments"] += len({id(o) for o, _ in node.occ}) > 1
            kinds["positions of both widths"] += len({o.width for o, _ in node.occ}) > 1
        got = idx.speculate(c, p)
        assert (got.token_ids, got.parents, got.probs, got.match_len) == (
            w_draft.token_ids, w_draft.parents, w_draft.probs, w_draft.match_len), (c, p)
        assert idx.continuations(c) == w_cont and idx.count(c[-4:]) == w_count
    assert dead_docs  # the reference left them out
    if extend_max and pos_union >= 48:
        assert kinds["positions of both widths"] >= 5 and kinds["positions in several segments"] >= 10, kinds
    if pos_union == 0:
        assert kinds["_MultiNode"] >= 10 and kinds["PosNode"] == 0, kinds
