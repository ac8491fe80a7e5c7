"""merge.py: drafts merge into one tree under a budget; q stays only where it is still valid."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from suffixspec.drafting.draft import Draft
from suffixspec.drafting.merge import merge_drafts


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


# The issue-45 case: a sampled chain planned at 2 nodes that stops after a token its draft gave under
# 0.3 (a stopping time), merged with a one-token deterministic draft of token 3
ISSUE_Q = (0.5, 0.25, 0.1, 0.1, 0.05, 0.0)
ISSUE_P = (0.1, 0.1, 0.2, 0.2, 0.2, 0.2)


def _issue_chain(tokens: list[int], score: float) -> Draft:
    q = torch.tensor(ISSUE_Q, dtype=torch.float64)
    return Draft.chain(tokens, "draft_model", q=q.expand(len(tokens), len(q)).clone(), score=score, planned=2)


def _issue_chains() -> list[list[int]]:
    """Every chain the issue's drafter can sample: one token under 0.3 of q, or two tokens."""
    return [[x] if ISSUE_Q[x] < 0.3 else [x, y] for x in range(6) if ISSUE_Q[x] > 0
            for y in (range(6) if ISSUE_Q[x] >= 0.3 else [None]) if y is None or ISSUE_Q[y] > 0]


def _rule(draft: Draft, parent: int) -> str | None:
    """How verification treats ``parent``'s children: "q" (the known-q rule), "one-hot", or None (no children)."""
    kids = draft.children().get(parent)
    return None if not kids else "q" if all(draft.has_q(c) for c in kids) else "one-hot"


@pytest.mark.parametrize("budget", [1, 2, 3, 4])
@pytest.mark.parametrize("sampled_first", [True, False], ids=["sampled-first", "deterministic-first"])
def test_a_sampled_nodes_rule_and_cut_do_not_depend_on_what_it_sampled(budget, sampled_first):
    """Over every chain the sampled draft can draw: the rule at the root is one and the same, and the rule
    and cut of the second node depend on the first token (its ancestor) only, never on the second token
    (docs/lossless.md, "Merged drafts"). The merge of issue 45 gave the root the known-q rule when the
    chain ran to its planned length and the one-hot rule when it stopped early (the deterministic node then
    fitting in as a sibling), and at budget 1 the one-hot rule exactly when the sample equalled token 3."""
    root: set[str | None] = set()
    below: dict[int, set[tuple[str | None, int]]] = {}
    for tokens in _issue_chains():
        merged = merge_drafts([_issue_chain(tokens, 2.0 if sampled_first else 0.5),
                               Draft.chain([3], "prompt", score=1.0)], budget)
        assert len(merged) <= budget
        root.add(_rule(merged, -1))
        first = merged.child_with(merged.children().get(-1, []), tokens[0])
        if first is not None:
            below.setdefault(tokens[0], set()).add((_rule(merged, first), len(merged.children().get(first, []))))
    assert len(root) == 1, (budget, sampled_first, root)
    assert all(len(rules) == 1 for rules in below.values()), (budget, sampled_first, below)


@pytest.mark.slow  # 2000 verified trials per case, about 2 s each
@pytest.mark.parametrize("budget", [1, 2, 3, 4])
@pytest.mark.parametrize("sampled_first", [True, False], ids=["sampled-first", "deterministic-first"])
def test_merged_sampled_and_deterministic_drafts_keep_p(budget, sampled_first):
    """The issue's numbers through the real merge and verification: the first token's distribution is
    ``p`` at every budget, in either order. The merge of issue 45 gave [.149, .049, .169, .175, .210, .248]
    at budget 2 and [.110, .106, .221, .119, .223, .221] at budget 1 with the sampled draft first (20k trials)."""
    from suffixspec.config import SamplingParams
    from suffixspec.core.sampling import LogitsProcessor, PositionRNG
    from suffixspec.core.verify import verify_tree

    p = torch.tensor(ISSUE_P, dtype=torch.float64)
    logits = torch.log(p).float().expand(4, 6).clone()  # every row: p (only the first token is counted)
    proc = LogitsProcessor(SamplingParams(temperature=1.0), 6)
    draws = np.random.default_rng(budget * 10 + sampled_first)
    counts = np.zeros(6)
    trials = 2000
    for trial in range(trials):
        tokens = [int(draws.choice(6, p=ISSUE_Q))]
        if ISSUE_Q[tokens[0]] >= 0.3:  # a sure token: the chain goes on to its planned 2
            tokens.append(int(draws.choice(6, p=ISSUE_Q)))
        merged = merge_drafts([_issue_chain(tokens, 2.0 if sampled_first else 0.5),
                               Draft.chain([3], "prompt", score=1.0)], budget)
        out = verify_tree(merged, logits[: len(merged) + 1], proc, PositionRNG(trial), 0)
        counts[merged.tokens[out.accepted[0]] if out.accepted else out.token] += 1
    expected = p.numpy() * trials
    stat = float(((counts - expected) ** 2 / expected).sum())
    pvalue = float(torch.special.gammaincc(torch.tensor(2.5, dtype=torch.float64),
                                           torch.tensor(stat / 2, dtype=torch.float64)))
    assert pvalue > 1e-3, (budget, sampled_first, (counts / trials).round(3), pvalue)


def test_a_sampled_draft_is_charged_its_planned_size_not_what_it_sampled():
    """``_shares``' worked example: budget 3, a sampled chain planned at 2 that stopped after one token, then a
    deterministic chain [7, 8]: the sampled node and 7 (its unused second node is not lent to 8); a shared
    node is no refund either (the deterministic 5 under the root is charged though the sampled chain drew 5)."""
    stopped = Draft.chain([5], "draft_model", q=torch.full((1, 10), 0.1), score=2, planned=2)
    merged = merge_drafts([stopped, Draft.chain([7, 8], "prompt", score=1)], 3)
    assert merged.tokens == [5, 7] and merged.parents == [-1, -1] and merged.gate_size() == 3
    same = merge_drafts([stopped, Draft.chain([5, 8], "prompt", score=1)], 3)
    assert same.tokens == [5] and not same.has_q(0)  # 5 shared (one-hot); 8 did not fit in the share left


def test_nodes_below_a_stop_token_are_dropped():
    """A request that accepts a stop token ends there: ``ending_at`` drops what hangs below one (the stop node
    stays), re-indexes the parents, and takes the dropped nodes' probabilities out of the score."""
    EOS = 2
    # 5 -> EOS -> 7 and 5 -> 8 -> EOS -> 9 -> 4
    d = Draft([5, EOS, 7, 8, EOS, 9, 4], [-1, 0, 1, 0, 3, 4, 5], ["prompt"] * 7, score=3.9,
              probs=[0.9, 0.8, 0.7, 0.5, 0.4, 0.35, 0.25])
    cut = d.ending_at({EOS})
    assert cut.tokens == [5, EOS, 8, EOS] and cut.parents == [-1, 0, 0, 2]
    assert cut.probs == [0.9, 0.8, 0.5, 0.4] and cut.score == pytest.approx(3.9 - 0.7 - 0.35 - 0.25)
    assert d.ending_at(set()) is d and d.ending_at({99}) is d  # no stop token (ignore_eos), or none drafted
    assert Draft.chain([5, EOS], "prompt").ending_at({EOS}).tokens == [5, EOS]  # nothing below it
    no_probs = Draft.chain([EOS, 6, 7, 8], "prompt", score=2.0).ending_at({EOS})
    assert no_probs.tokens == [EOS] and no_probs.score == pytest.approx(0.5)  # its share, without probs
    # a sampled draft: its q rows follow their nodes; score and planned were fixed before sampling and stay
    q = torch.arange(4 * 10, dtype=torch.float32).reshape(4, 10)
    sampled = Draft.chain([5, EOS, 6, 7], "draft_model", q=q, score=2.5, planned=6).ending_at({EOS})
    assert sampled.tokens == [5, EOS] and torch.equal(sampled.q, q[:2])
    assert sampled.score == 2.5 and sampled.gate_size() == 6
