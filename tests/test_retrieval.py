"""index.retrieval: ranked retrieval from the documents (minimum match by corpus size, smoothed counts)."""

from __future__ import annotations

import pytest

from suffixspec.index.retrieval import DocumentRetrieval, RetrievalParams, min_match_length
from suffixspec.index.segments import SegmentSet
from suffixspec.index.speculate import SpecParams, speculate_from
from suffixspec.index.suffix_array import SuffixArray

TREE = SpecParams(max_spec_tokens=8, max_spec_factor=4.0, min_token_prob=0.0, use_tree_spec=True)


@pytest.mark.parametrize("tokens, expected", [
    (0, 1), (8, 1), (1000, 2), (50_000, 3), (1_000_000, 4), (3_400_000, 5), (100_000_000, 6), (10**9, 7),
])
def test_min_match_grows_with_the_corpus(tokens, expected):
    assert min_match_length(tokens) == expected


def test_min_match_never_shrinks_as_the_corpus_grows():
    sizes = [2**k for k in range(1, 40)]
    lengths = [min_match_length(n) for n in sizes]
    assert lengths == sorted(lengths) and lengths[0] == 1 and lengths[-1] > 6


def test_worked_example_smooths_the_match_and_keeps_its_run():
    docs = DocumentRetrieval(SuffixArray.build([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 9]]))
    assert docs.min_match == 1  # 11 tokens: one occurrence of anything means something
    res = docs.speculate([1, 5, 6], TREE)
    assert (res.token_ids, res.parents) == ([7, 8, 9], [-1, 0, -1])
    assert res.probs == pytest.approx([2 / 4, 2 / 4, 1 / 4]) and res.score == pytest.approx(1.25)
    assert res.match_len == 2


def test_without_smoothing_it_drafts_what_the_index_drafts():
    arr = SuffixArray.build([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 9], [1, 2, 3, 4, 5, 6, 7]])
    docs = DocumentRetrieval(arr, RetrievalParams(pseudo_count=0.0, min_count=1))
    for ctx in ([1, 5, 6], [9, 1, 2], [2, 3, 4, 5], [3, 7]):
        want = arr.speculate(ctx, TREE)
        got = docs.speculate(ctx, TREE)
        assert (got.token_ids, got.parents, got.probs) == (want.token_ids, want.parents, want.probs)


def test_a_match_found_once_must_be_long_in_a_large_corpus():
    """The same once-found 2-token match drafts in a tiny corpus and not where the corpus is large
    (min_match set as a corpus of a million tokens would have it); twice found, it drafts anyway."""
    arr = SuffixArray.build([[40, 41, 42, 43], [1, 2, 3]])
    small = DocumentRetrieval(arr)
    large = DocumentRetrieval(arr, RetrievalParams(min_match=min_match_length(1_000_000)))
    assert small.speculate([9, 40, 41], TREE).token_ids == [42, 43]
    res = large.speculate([9, 40, 41], TREE)
    assert len(res) == 0 and res.match_len == 2  # the length still feeds the next step's hint
    assert large.speculate([40, 41, 42, 43][:3], TREE).token_ids == []  # 3 tokens: still under 4
    twice = DocumentRetrieval(SuffixArray.build([[40, 41, 42, 43], [40, 41, 42, 43]]),
                              RetrievalParams(min_match=4))
    assert twice.speculate([9, 40, 41], TREE).token_ids == [42, 43]  # found twice: evidence enough


def test_segments_and_one_array_give_the_same_drafts(tmp_path):
    seqs = [[5, 6, 7, 8], [5, 6, 9], [5, 6, 7, 8, 1], [2, 5, 6, 7]]
    one = DocumentRetrieval(SuffixArray.build(seqs))
    parts = SegmentSet([SuffixArray.build(seqs[:2]), SuffixArray.build(seqs[2:])])
    split = DocumentRetrieval(parts)
    assert split.num_tokens == one.num_tokens == sum(map(len, seqs))
    for ctx in ([1, 5, 6], [5, 6, 7], [2, 5]):
        a, b = one.speculate(ctx, TREE), split.speculate(ctx, TREE)
        assert (a.token_ids, a.parents) == (b.token_ids, b.parents)
        assert a.probs == pytest.approx(b.probs)


def test_path_speculation_takes_the_smoothed_most_frequent_child():
    docs = DocumentRetrieval(SuffixArray.build([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 9]]))
    res = docs.speculate([5, 6], SpecParams(8, 4.0, 0.0, 0.3, use_tree_spec=False))
    assert res.token_ids == [7, 8] and res.probs == pytest.approx([0.5, 0.5])
    # below min_token_prob after smoothing: a match found once at 0.5 is cut at 0.6
    once = DocumentRetrieval(SuffixArray.build([[5, 6, 7, 8]]))
    assert once.speculate([5, 6], SpecParams(8, 4.0, 0.0, 0.6, use_tree_spec=False)).token_ids == []
    plain = speculate_from(SuffixArray.build([[5, 6, 7, 8]]).node([5, 6])[1], 2,
                           SpecParams(8, 4.0, 0.0, 0.6, use_tree_spec=False))
    assert plain.token_ids == [7, 8]  # the plain ratio says certain


@pytest.mark.parametrize("kwargs, message", [
    ({"pseudo_count": -1}, "pseudo_count"), ({"min_count": 0}, "min_count"), ({"min_match": 0}, "min_match"),
    ({"bits_per_token": 0}, "bits_per_token"),
])
def test_bad_parameters_say_what_to_change(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RetrievalParams(**kwargs)
