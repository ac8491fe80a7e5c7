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
    model_draft = Draft.chain([5, 6], "draft_model", q=q, score=3)
    suffix_draft = Draft.chain([5, 9], "history", score=1)
    merged = merge_drafts([model_draft, suffix_draft], 8)
    assert merged.tokens == [5, 6, 9]
    # node 0 (5) was proposed by both drafts: one-hot; its children 6 and 9 come from two drafts: one-hot
    assert [merged.has_q(i) for i in range(3)] == [False, False, False]
    alone = merge_drafts([model_draft, Draft.chain([7], "history", score=1)], 8)
    assert alone.tokens == [5, 6, 7] and [alone.has_q(i) for i in range(3)] == [False, True, False]
