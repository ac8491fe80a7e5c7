"""The suffix structures of suffixspec/index/: worked examples, and both indexes against a brute-force reference."""

from __future__ import annotations

import random

import numpy as np
import pytest

from suffixspec.index.history import OutputHistory
from suffixspec.index.incremental import IncrementalIndex
from suffixspec.index.speculate import SpecParams
from suffixspec.index.suffix_array import SuffixArray
from suffixspec.index.suffix_array_build import SEP, build_suffix_array


# ----- brute-force reference: counts by scanning every sequence -------------------------------------
def ref_count(seqs, pattern) -> int:
    k = len(pattern)
    return sum(1 for s in seqs for i in range(len(s) - k + 1) if list(s[i:i + k]) == list(pattern))


def ref_match_len(seqs, ctx, max_depth=64) -> int:
    best = 0
    for k in range(1, min(max_depth, len(ctx)) + 1):
        if ref_count(seqs, ctx[-k:]):
            best = k
        else:
            break
    return best


def ref_children(seqs, pattern) -> dict[int, int]:
    kids: dict[int, int] = {}
    k = len(pattern)
    for s in seqs:
        for i in range(len(s) - k):
            if list(s[i:i + k]) == list(pattern):
                kids[s[i + k]] = kids.get(s[i + k], 0) + 1
    return kids


def ref_tree(seqs, ctx, params: SpecParams) -> dict[tuple[int, ...], float]:
    """Every node (path below the match) with probability >= min_token_prob, ignoring the size limit:
    count ratios times the continuation rates (``params.rates``) along the path."""
    L = ref_match_len(seqs, ctx)
    if L == 0:
        return {}
    base = list(ctx[-L:])
    out: dict[tuple[int, ...], float] = {}
    frontier = [((), 1.0)]
    while frontier:
        path, prob = frontier.pop()
        parent_count = ref_count(seqs, base + list(path))
        for tok, c in ref_children(seqs, base + list(path)).items():
            p = prob * c / parent_count * params.rate(L + len(path))  # a node at depth d: rate(L + d - 1)
            if p >= params.min_token_prob:
                out[path + (tok,)] = p
                frontier.append((path + (tok,), p))
    return out


def draft_paths(res) -> dict[tuple[int, ...], float]:
    paths: list[tuple[int, ...]] = []
    for tok, par in zip(res.token_ids, res.parents, strict=True):
        assert par < len(paths)
        paths.append((paths[par] if par >= 0 else ()) + (tok,))
    return dict(zip(paths, res.probs, strict=True))


def build_both(seqs):
    return [SuffixArray.build(seqs), IncrementalIndex.from_sequences(seqs, max_candidates=10_000)]


# ----- worked examples ---------------------------------------------------------------------------------
SEQS = [[1, 2, 3], [1, 2, 3], [1, 2, 4], [5, 6, 7, 8, 9]]


@pytest.mark.parametrize("ctx, match_len", [
    ([9, 1, 2], 2),          # "9 1 2" is absent, "1 2" occurs 3 times
    ([1, 2], 2),
    ([3], 1),
    ([0, 0], 0),             # unknown tokens
    ([5, 6, 7, 8], 4),
    ([4, 5, 6, 7, 8], 4),    # "4 5" would cross a sequence boundary
    ([2, 3, 1], 1),          # "3 1" crosses the boundary between two sequences
])
def test_match_lengths(ctx, match_len):
    for idx in build_both(SEQS):
        got = idx.match(ctx)[0]
        assert got == match_len == ref_match_len(SEQS, ctx), type(idx).__name__


@pytest.mark.parametrize("pattern, count", [
    ([1, 2], 3), ([1, 2, 3], 2), ([2, 4], 1), ([3], 2), ([9], 1), ([3, 1], 0), ([7, 8, 9], 1),
])
def test_counts(pattern, count):
    sa = SuffixArray.build(SEQS)
    assert sa.count(pattern) == count == ref_count(SEQS, pattern)


@pytest.mark.parametrize("ctx, expected", [
    ([1, 2], [(3, 2), (4, 1)]),   # ranked by count
    ([6], [(7, 1)]),
    ([9], []),                    # end of a sequence: no continuation
])
def test_continuations_ranked_by_count(ctx, expected):
    for idx in build_both(SEQS):
        assert idx.continuations(ctx) == expected


@pytest.mark.parametrize("tree, factor, min_prob, tokens, parents, score", [
    # path: the most frequent child only
    (False, 1.0, 0.1, [3], [-1], 2 / 3),
    # tree: both children of "1 2"
    (True, 1.0, 0.1, [3, 4], [-1, -1], 1.0),
    # the rarer child falls under min_token_prob
    (True, 1.0, 0.5, [3], [-1], 2 / 3),
    # factor 0.5 * match_len 2 = 1 node
    (True, 0.5, 0.1, [3], [-1], 2 / 3),
])
def test_tree_shapes(tree, factor, min_prob, tokens, parents, score):
    params = SpecParams(max_spec_tokens=8, max_spec_factor=factor, min_token_prob=min_prob, use_tree_spec=tree)
    for idx in build_both(SEQS):
        res = idx.speculate([0, 1, 2], params)
        assert (res.token_ids, res.parents, res.match_len) == (tokens, parents, 2)
        assert res.score == pytest.approx(score)


def test_deep_tree_shape_and_probabilities():
    # "a b" continues as "c d" twice and "c e" once, "f" once
    seqs = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6]]
    params = SpecParams(max_spec_tokens=10, max_spec_factor=4, min_token_prob=0.1)
    for idx in build_both(seqs):
        res = idx.speculate([1, 2], params)
        assert draft_paths(res) == pytest.approx({(3,): 0.75, (3, 4): 0.5, (3, 5): 0.25, (6,): 0.25})
        assert res.score == pytest.approx(1.75)
        # best-first: probabilities never increase along the node order
        assert res.probs == sorted(res.probs, reverse=True)


def test_length_cap_follows_match_length_and_offset():
    seqs = [list(range(100, 140))]
    for idx in build_both(seqs):
        for ctx, factor, offset, expect in [([100, 101], 1.0, 0, 2), ([100, 101], 2.0, 1, 5),
                                            ([100], 1.0, 0, 1), ([100, 101, 102], 10.0, 0, 8)]:
            res = idx.speculate(ctx, SpecParams(max_spec_tokens=8, max_spec_factor=factor, max_spec_offset=offset))
            assert len(res) == expect
            assert res.token_ids == list(range(ctx[-1] + 1, ctx[-1] + 1 + expect))
            assert res.probs == [1.0] * expect


# ----- brute force on random data ------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_agree_with_brute_force(seed):
    rng = random.Random(seed)
    alphabet = rng.randint(2, 5)
    seqs = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 30))] for _ in range(rng.randint(1, 6))]
    indexes = build_both(seqs)
    for _ in range(40):
        ctx = [rng.randrange(alphabet + 1) for _ in range(rng.randint(1, 12))]
        L = ref_match_len(seqs, ctx)
        rates = rng.choice([None, tuple(rng.uniform(0.3, 1.0) for _ in range(rng.randint(1, 8)))])
        params = SpecParams(max_spec_tokens=200, max_spec_factor=50, min_token_prob=rng.choice([0.05, 0.2, 0.5]),
                            rates=rates)
        expected = ref_tree(seqs, ctx, params)
        for idx in indexes:
            assert idx.match(ctx)[0] == L
            if L:
                assert idx.count(ctx[-L:]) == ref_count(seqs, ctx[-L:])
            res = idx.speculate(ctx, params)
            if len(expected) <= params.limit(L):
                assert draft_paths(res) == pytest.approx(expected), (type(idx).__name__, seqs, ctx)
            else:  # cut by the size limit: the most probable nodes, all of them real tree nodes
                assert sorted(res.probs, reverse=True) == pytest.approx(
                    sorted(expected.values(), reverse=True)[:params.limit(L)])
                assert all(expected[k] == pytest.approx(v) for k, v in draft_paths(res).items())
            path = idx.speculate(ctx, SpecParams(200, 50, 0, params.min_token_prob, use_tree_spec=False, rates=rates))
            # the path is a chain through the tree, each step the most frequent child
            got = draft_paths(path)
            assert set(got) <= set(expected)
            assert path.parents == list(range(-1, len(path) - 1))


@pytest.mark.parametrize("tree", [True, False])
def test_rates_shorten_drafts_from_short_matches(tree):
    """A node at depth d below a match of L tokens gets rate(L + d - 1): the same text drafted from a
    1-token match stops early, from a 4-token match it runs on (min_token_prob 0.1)."""
    seqs = [list(range(100, 120))]
    rates = (0.0, 0.3, 0.5, 0.7, 0.9)  # rate by match length 0..4, 0.9 beyond
    params = SpecParams(max_spec_tokens=8, max_spec_factor=8, min_token_prob=0.1, use_tree_spec=tree, rates=rates)
    for idx in build_both(seqs):
        short = idx.speculate([7, 103], params)  # L = 1: 0.3, 0.3 * 0.5 = 0.15, 0.15 * 0.7 = 0.105, then 0.09
        assert short.token_ids == [104, 105, 106] and short.probs == pytest.approx([0.3, 0.15, 0.105])
        long = idx.speculate([100, 101, 102, 103], params)  # L = 4: 0.9, 0.81, ... eight nodes
        assert long.token_ids == list(range(104, 112))
        assert long.probs == pytest.approx([0.9 ** d for d in range(1, 9)])
        assert long.score == pytest.approx(sum(long.probs))


def test_tree_with_rates_interleaves_a_shared_run_with_likelier_branches():
    """Best-first with rates: a shared run (a compressed edge) is cut where another branch of the
    frontier is likelier, and goes on when its turn comes; the nodes come out in probability order."""
    seqs = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 20, 21]]
    params = SpecParams(max_spec_tokens=6, max_spec_factor=8, min_token_prob=0.01, rates=(0.6,))
    for idx in build_both(seqs):
        res = idx.speculate([1], params)
        # the run 2 3 4 ... at 2/3 * 0.6^d: 0.4, 0.24, 0.144, 0.086; the branch 20 21 at 1/3 * 0.6^d: 0.2, 0.12
        assert res.token_ids == [2, 3, 20, 4, 21, 5]
        assert res.probs == pytest.approx([0.4, 0.24, 0.2, 0.144, 0.12, 0.0864])
        assert draft_paths(res).keys() == {(2,), (2, 3), (20,), (2, 3, 4), (20, 21), (2, 3, 4, 5)}


def test_tree_under_budget_keeps_most_probable_nodes():
    rng = random.Random(7)
    seqs = [[rng.randrange(3) for _ in range(40)] for _ in range(5)]
    ctx = [0, 1]
    full = ref_tree(seqs, ctx, SpecParams(min_token_prob=0.05))
    for idx in build_both(seqs):
        res = idx.speculate(ctx, SpecParams(max_spec_tokens=6, max_spec_factor=10, min_token_prob=0.05))
        assert len(res) == 6
        assert sorted(res.probs, reverse=True) == pytest.approx(sorted(full.values(), reverse=True)[:6])
        assert all(p < i for i, p in enumerate(res.parents))


# ----- suffix array specifics --------------------------------------------------------------------------
def test_suffix_array_is_sorted():
    rng = np.random.default_rng(0)
    text = rng.integers(0, 4, size=500).astype(np.uint32)
    sa = build_suffix_array(text, sort_depth=1024)
    suffixes = [tuple(text[i:].tolist()) for i in sa]
    assert suffixes == sorted(suffixes)


def test_save_load_round_trip(tmp_path):
    seqs = [[1, 2, 3, 4], [2, 3, 5], [7]]
    sa = SuffixArray.build(seqs)
    paths = sa.save(tmp_path / "docs")
    assert all(p.exists() for p in paths)
    loaded = SuffixArray.load(tmp_path / "docs")
    assert loaded.num_tokens == 8 and loaded.num_sequences == 3
    for ctx in ([2, 3], [1, 2, 3], [7], [9, 2]):
        assert loaded.match(ctx) == sa.match(ctx)
        assert loaded.continuations(ctx) == sa.continuations(ctx)


def test_match_hint_gives_the_same_answer():
    rng = random.Random(3)
    seqs = [[rng.randrange(6) for _ in range(200)] for _ in range(3)]
    sa = SuffixArray.build(seqs)
    for _ in range(50):
        ctx = [rng.randrange(6) for _ in range(20)]
        want = sa.match(ctx)
        for hint in (1, 3, 7, 20, 64):
            assert sa.match(ctx, hint=hint) == want


def test_out_of_range_tokens_do_not_match():
    sa = SuffixArray.build([[1, 2, 3]])
    assert sa.match([1, 2, -5])[0] == 0
    assert sa.match([-5, 1, 2]) == sa.match([1, 2])
    with pytest.raises(ValueError):
        SuffixArray.build([[SEP]])


# ----- incremental index specifics ------------------------------------------------------------------------
def test_live_end_is_not_an_occurrence():
    # worked example of suffixspec/index/incremental.py
    idx = IncrementalIndex()
    idx.extend([1, 2, 3, 9, 1, 2, 3, 7, 1, 2])
    assert idx.match([5, 1, 2]) == (2, [6, 2])
    res = idx.speculate([5, 1, 2], SpecParams(max_spec_tokens=3, max_spec_factor=4))
    assert res.token_ids[0] == 3 and res.probs[0] == 1.0


@pytest.mark.parametrize("n", [10, 63, 64, 65, 300, 3000])  # 3000: the bucket tables grow
def test_append_one_by_one_equals_extend(n):
    rng = random.Random(n)
    toks = [rng.randrange(7) for _ in range(n)]
    a, b = IncrementalIndex(), IncrementalIndex()
    for t in toks[:5]:
        a.append(t)
        b.append(t)
    for t in toks:
        a.append(t)
    b.extend(toks)  # vectorised for runs >= 64
    assert a.tokens() == b.tokens()
    assert a._prev1 == b._prev1 and a._prev3 == b._prev3
    assert a._head1 == b._head1 and a._head3 == b._head3
    for _ in range(30):
        ctx = [rng.randrange(7) for _ in range(rng.randint(1, 10))]
        assert a.match(ctx) == b.match(ctx)
    a.append(3)
    b.append(3)
    assert a.match([1, 2, 3]) == b.match([1, 2, 3])


def test_bulk_build_equals_token_by_token_with_separators():
    rng = random.Random(11)
    seqs = [[rng.randrange(9) for _ in range(rng.randint(0, 400))] for _ in range(8)]
    a = IncrementalIndex()
    for s in seqs:
        for t in s:
            a.append(t)
        a.end_sequence()
    b = IncrementalIndex.from_sequences(seqs)
    assert a.tokens() == b.tokens() and a.num_tokens == b.num_tokens == sum(map(len, seqs))
    assert (a._prev1, a._prev3, a._head1, a._head3) == (b._prev1, b._prev3, b._head1, b._head3)


def test_max_candidates_bounds_the_counts_to_recent_occurrences():
    idx = IncrementalIndex(max_candidates=4)
    for tok in range(10):
        idx.add_sequence([1, 2, 100 + tok])
    res = idx.continuations([1, 2])
    assert [t for t, _ in res] == [106, 107, 108, 109]  # the 4 newest


# ----- output history ------------------------------------------------------------------------------
def test_history_evicts_oldest_by_token_budget():
    hist = OutputHistory(budget_tokens=10, evict_to=0.6)
    hist.add([1, 2, 3, 4])
    hist.add([5, 6, 7])
    assert hist.num_tokens == 7 and hist.index.count([1, 2]) == 1
    hist.add([8, 9, 10, 11])  # 11 > 10: evict oldest until <= 6
    assert hist.num_outputs == 1 and hist.num_tokens == 4
    assert hist.index.count([1, 2]) == 0 and hist.index.count([5, 6]) == 0
    assert hist.index.match([8, 9])[0] == 2
    hist.add(list(range(50, 80)))  # longer than the budget: its tail is kept
    assert hist.num_tokens == 10 and hist.index.count([70, 71]) == 1


def test_history_learns_across_requests():
    hist = OutputHistory(budget_tokens=1000)
    template = [40, 41, 42, 43, 44, 45]
    params = SpecParams(max_spec_tokens=8, max_spec_factor=4)
    assert len(hist.speculate([40, 41], params)) == 0
    hist.add(template + [1])
    hist.add(template + [2])
    res = hist.speculate([40, 41], params)
    assert res.token_ids[:4] == [42, 43, 44, 45]
