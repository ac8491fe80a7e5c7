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
