"""merge.py: drafts merge into one tree under a budget; q stays only where it is still valid."""

from __future__ import annotations

import pytest
import torch

from suffixspec.draft import Draft
from suffixspec.merge import merge_drafts


@pytest.mark.parametrize(
    "drafts,budget,tokens,parents",
    [
        ([Draft.chain([5, 6, 7], "prompt", score=2), Draft.chain([5, 9], "history", score=1)], 4,
         [5, 6, 7, 9], [-1, 0, 1, 0]),  # the docstring's worked example
        ([Draft.chain([5, 9], "history", score=1), Draft.chain([5, 6, 7], "prompt", score=2)], 3,
         [5, 6, 7], [-1, 0, 1]),  # best score first; the budget cuts the rest
        ([Draft.chain([1, 2], "prompt", score=1), Draft.chain([3], "documents", score=0.5)], 8,
         [1, 2, 3], [-1, 0, -1]),  # two roots
        ([Draft(), Draft.chain([4], "prompt")], 8, [4], [-1]),
        ([Draft.chain([1, 2, 3], "prompt")], 2, [1, 2], [-1, 0]),
        ([], 8, [], []),
    ],
)
def test_merge_table(drafts, budget, tokens, parents):
    merged = merge_drafts(drafts, budget)
    assert merged.tokens == tokens and merged.parents == parents


def test_merge_keeps_source_of_best_draft():
    merged = merge_drafts([Draft.chain([5, 6], "prompt", score=2), Draft.chain([5, 9], "history", score=1)], 8)
    assert merged.sources == ["prompt", "prompt", "history"]


def test_q_kept_only_where_children_come_from_one_draft():
    q = torch.full((2, 10), 0.1)
    model_draft = Draft.chain([5, 6], "draft_model", q=q, score=3, planned=2)
    suffix_draft = Draft.chain([5, 9], "history", score=1)
    merged = merge_drafts([model_draft, suffix_draft], 8)
    assert merged.tokens == [5, 6, 9]
    # node 0 (5) was proposed by both drafts: one-hot; its children 6 and 9 come from two drafts: one-hot
    assert [merged.has_q(i) for i in range(3)] == [False, False, False]
    alone = merge_drafts([model_draft, Draft.chain([7], "history", score=1)], 8)
    assert alone.tokens == [5, 6, 7] and [alone.has_q(i) for i in range(3)] == [False, True, False]


def test_merged_size_for_the_gate_is_planned_not_sampled():
    """The gate judges a sampled draft by the size its drafter planned before sampling: a chain
    that stopped after one of its planned four tokens counts four, whatever it sampled."""
    q = torch.full((1, 10), 0.1)
    sampled = Draft.chain([5], "draft_model", q=q, score=2, planned=4)
    assert sampled.gate_size() == 4 and len(sampled) == 1
    assert merge_drafts([sampled], 3).gate_size() == 3  # cut to the budget, which is known before sampling
    merged = merge_drafts([sampled, Draft.chain([5, 9], "history", score=1)], 8)
    assert len(merged) == 2 and merged.gate_size() == 6  # planned 4 + the deterministic draft's 2 nodes
    assert merge_drafts([Draft.chain([5, 9], "history", score=1), Draft.chain([7], "prompt")], 8).gate_size() == 3
    with pytest.raises(ValueError, match="planned"):
        Draft.chain([5], "draft_model", q=q).gate_size()  # a sampled draft must say what it planned
    with pytest.raises(ValueError, match="planned"):
        Draft.chain([5, 6], "draft_model", q=torch.full((2, 10), 0.1), planned=1)


def test_drafts_with_probabilities_merge_most_probable_nodes_first():
    """A suffix tree whose nodes are unlikely no longer fills the budget before a sure model chain gets a
    node (the docstring's second example), and a weight (how a proposer's promises came true) reorders."""
    suffix = Draft.chain([5, 6, 7], "prompt", score=1.0, probs=[0.5, 0.3, 0.2])
    model = Draft.chain([8, 9], "draft_model", score=1.7, probs=[0.9, 0.8])
    merged = merge_drafts([suffix, model], 3)
    assert merged.tokens == [8, 9, 5] and merged.parents == [-1, 0, -1]
    assert merged.sources == ["draft_model", "draft_model", "prompt"] and merged.probs == [0.9, 0.8, 0.5]
    trusted = merge_drafts([suffix, model], 3, weights=[2.0, 0.5])  # 1.0, 0.6, 0.4 against 0.45, 0.4
    assert trusted.tokens == [5, 6, 8] and trusted.parents == [-1, 0, -1]
    # a shared prefix costs one node; the child ranks under its parent even where its own probability is higher
    tree = merge_drafts([Draft.chain([5, 6], "prompt", score=1, probs=[0.4, 0.4]),
                         Draft.chain([5, 9], "draft_model", score=1, probs=[0.3, 0.9])], 8)
    assert tree.tokens == [5, 6, 9] and tree.parents == [-1, 0, 0] and tree.sources == ["prompt"] * 2 + ["draft_model"]


def test_a_draft_without_probabilities_merges_whole_drafts_by_score():
    with_probs = Draft.chain([5, 6, 7], "prompt", score=1.0, probs=[0.5, 0.3, 0.2])
    merged = merge_drafts([with_probs, Draft.chain([8, 9], "draft_model", score=0.5)], 3)
    assert merged.tokens == [5, 6, 7] and merged.probs is None
    assert merge_drafts([with_probs, Draft.chain([8, 9], "draft_model", score=0.5)], 8, min_prob=2.0).tokens == \
        [5, 6, 7, 8, 9]  # no probabilities to rank by: no floor either


def test_probabilities_are_per_node_and_never_on_a_sampled_draft():
    with pytest.raises(ValueError, match="probability per node"):
        Draft.chain([5, 6], "prompt", probs=[0.5])
    with pytest.raises(ValueError, match="sampled"):
        Draft.chain([5], "draft_model", q=torch.full((1, 10), 0.1), planned=1, probs=[0.5])
    assert Draft.chain([5, 6, 7], "prompt", probs=[0.5, 0.3, 0.2]).truncated(2).probs == [0.5, 0.3]


def test_nodes_below_the_floor_are_left_out_but_the_best_stays():
    suffix = Draft.chain([5, 6], "prompt", score=0.1, probs=[0.06, 0.04])
    model = Draft.chain([8, 9, 10], "draft_model", score=2.0, probs=[0.9, 0.5, 0.05])
    merged = merge_drafts([suffix, model], 8, min_prob=0.07)
    assert merged.tokens == [8, 9] and merged.sources == ["draft_model"] * 2
    weak = merge_drafts([suffix, Draft.chain([7], "draft_model", score=0.01, probs=[0.01])], 8, min_prob=0.07)
    assert weak.tokens == [5]  # nothing reaches the floor: the most probable node is still verified
