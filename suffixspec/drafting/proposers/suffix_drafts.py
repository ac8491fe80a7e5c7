"""Shaping and merging the suffix sources' drafts (:class:`~suffixspec.index.speculate.SpecResult`).

The steps :class:`~suffixspec.drafting.proposers.suffix.SuffixProposer` takes between its indexes' drafts
and the one it proposes: whether the output confirmed the last draft to its end (:func:`confirmed_run`),
a chain continued periodically past the request's live end (:func:`extend_periodic`), the probabilities
of a chain drafted outside the index (:func:`chain_probs`), the match length behind each node
(:func:`node_match_lengths`), and the sources' drafts merged into one tree cut to the budget
(:func:`merge_tree`).
"""

from __future__ import annotations

from collections.abc import Sequence

from suffixspec.drafting.draft import Draft, node_depths
from suffixspec.drafting.merge import TreeUnion
from suffixspec.index.speculate import SpecParams, SpecResult


def confirmed_run(draft: Draft, new_tokens: Sequence[int]) -> tuple[int, str | None]:
    """How many tokens of ``draft`` the output confirmed, if it confirmed a whole path, and the source
    of the path's last node; else ``(0, None)``.

    The path is followed by token from the root. It counts as confirmed to its end when it reached a
    leaf, or when every new token was on it (the engine verified only a prefix of a longer draft).
    Example: draft chain ``[4, 5, 6]``, new tokens ``[4, 5, 6, 9]`` -> 3; ``[4, 5, 8]`` -> 0.
    """
    cur, hit = draft.follow(new_tokens)
    if hit and (cur not in draft.parents or hit == len(new_tokens)):  # a leaf, or every new token on it
        return hit, draft.sources[cur]
    return 0, None


def extend_periodic(context: Sequence[int], res: SpecResult, limit: int, params: SpecParams | None = None) -> None:
    """Continue a chain draft that is a copy of the context's last ``m`` tokens with period ``m``.

    The request's own index cannot draft past its live end: when the output repeats itself (its
    matched occurrence ends ``m`` tokens back), the draft stops after ``m`` tokens although the copy
    goes on with the draft itself. Example: context ``... 7 8 9 7 8``, match ``7 8`` -> draft ``[9, 7,
    8]`` (= the last 3 tokens) -> with ``limit`` 7: ``[9, 7, 8, 9, 7, 8, 9]``, each at the last node's
    probability.
    """
    m, n = len(res), len(context)
    if m == 0 or m >= limit or m > n or any(par != i - 1 for i, par in enumerate(res.parents)):
        return
    if list(context[n - m:]) != res.token_ids:
        return
    prob = res.probs[-1]
    while len(res.token_ids) < limit:
        if params is not None:  # each token one more of the match's continuation rates
            prob *= params.rate(res.match_len + len(res.token_ids))
            if prob < params.min_token_prob:
                break
        res.parents.append(len(res.token_ids) - 1)
        res.token_ids.append(res.token_ids[-m])
        res.probs.append(prob)
    res.score = sum(res.probs)


def chain_probs(res: SpecResult, params: SpecParams, first: float) -> None:
    """Probabilities of a chain drafted outside the index (a text match, a resumed copy): the first
    node ``first``, each next one the previous times ``params.rate(match_len + depth - 1)``; cut where
    they fall below ``params.min_token_prob`` (in place). Without rates every node keeps ``first``.
    Example: rates 0.9 from 9 tokens on, ``match_len`` 8, first 1.0 -> 1.0, 0.9, 0.81, ..."""
    prob, keep = first, 0
    probs = []
    for d in range(len(res)):
        if d:
            prob *= params.rate(res.match_len + d)
        if prob < params.min_token_prob:
            break
        probs.append(prob)
        keep += 1
    res.token_ids, res.parents, res.probs = res.token_ids[:keep], res.parents[:keep], probs
    res.score = sum(probs)


def node_match_lengths(res: SpecResult) -> list[int]:
    """The match length that predicts each node: ``match_len + depth - 1`` (depth 1 below the match)."""
    return [res.match_len + d - 1 for d in node_depths(res.parents)]


def merge_by_probability(results: list[tuple[str, SpecResult]], budget: int, prefer: str | None = None) -> Draft:
    """The merged draft of :func:`merge_tree`."""
    return merge_tree(results, budget, prefer)[0]


def merge_tree(results: list[tuple[str, SpecResult]], budget: int, prefer: str | None = None
               ) -> tuple[Draft, list[float], list[int], list[str]]:
    """One tree from several sources' drafts: shared token paths merge, a node keeps its highest
    probability (and that source); the ``budget`` most probable nodes are kept.

    ``prefer``: the source the output is copying from (its last draft was confirmed to the end): its
    nodes rank before every other source's, so its path gets the budget's depth instead of sharing it
    with equally "certain" single-occurrence paths of other sources (each at probability 1).

    A node's rank never exceeds its parent's (probabilities do not grow along a draft's path, and the
    preference bonus is capped by the parent's rank), so sorting by (rank desc, depth asc) lists
    parents before their children.

    Returns the draft and, per node, its probability, the match length that predicted it
    (:func:`node_match_lengths`) and whose continuation rates it feeds (the result's ``kind``, else its source).
    """
    union = TreeUnion()
    probs: list[float] = []
    sources: list[str] = []
    preferred: list[bool] = []  # the preferred source proposed this node (whichever source keeps it)
    matched_lengths: list[int] = []  # the match length behind each node (of the source that gave its probability)
    keys: list[str] = []  # and whose rates it learns (the result's kind, else its source)
    for source, res in results:
        key, res_match_lengths = res.kind or source, node_match_lengths(res)
        for i, node, created in union.add(res.token_ids, res.parents):
            p = res.probs[i]
            if created:
                probs.append(p)
                sources.append(source)
                preferred.append(source == prefer)
                matched_lengths.append(res_match_lengths[i])
                keys.append(key)
            elif p > probs[node]:
                probs[node], sources[node], matched_lengths[node], keys[node] = p, source, res_match_lengths[i], key
            if source == prefer:
                preferred[node] = True
    tokens, parents, depths = union.tokens, union.parents, node_depths(union.parents)
    rank: list[float] = []  # probability, + 1 on the preferred source's nodes, capped by the parent's rank
    for i, p in enumerate(probs):
        r = p + 1.0 if preferred[i] else p
        rank.append(r if parents[i] < 0 else min(r, rank[parents[i]]))
    order = sorted(range(len(tokens)), key=lambda i: (-rank[i], depths[i], i))[:budget]
    new_index = {old: new for new, old in enumerate(order)}
    draft = Draft([tokens[i] for i in order], [-1 if parents[i] < 0 else new_index[parents[i]] for i in order],
                  [sources[i] for i in order], score=sum(probs[i] for i in order))
    return draft, [probs[i] for i in order], [matched_lengths[i] for i in order], [keys[i] for i in order]
