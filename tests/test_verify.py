"""verify.py: exact rules on worked examples, and distribution tests with a fixed-logits toy model.

The toy target is Markov: p(y1) = softmax(L0), p(y2 | y1) = softmax(L[y1]). Each trial runs one
verification step over an adversarial draft, completes the second token by a plain step when the
draft did not reach it, and the empirical distribution of (y1, y2) is compared with the exact one
by a chi-square test (fixed seeds, so the test is deterministic).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from suffixspec.config import SamplingParams
from suffixspec.core.sampling import LogitsProcessor, PositionRNG, sample_inverse_cdf, sample_race
from suffixspec.core.verify import verify_tree
from suffixspec.drafting.draft import Draft

V = 5
L0 = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])
L = torch.tensor([[0.0, 1.0, 2.0, -0.5, 0.3],
                  [1.5, 0.0, -1.0, 0.2, 0.8],
                  [0.1, 0.1, 0.1, 2.0, -2.0],
                  [-1.0, 2.5, 0.0, 0.0, 1.0],
                  [0.7, -0.3, 1.1, 0.4, 0.0]])


def _p(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.double(), dim=-1)


EXACT = (_p(L0)[:, None] * _p(L)).flatten()  # [V*V] joint distribution of (y1, y2)


def _chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    stat = float(((counts - expected) ** 2 / expected).sum())
    dof = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def _draw_without_replacement(q: torch.Tensor, k: int, rng: np.random.Generator) -> list[int]:
    q = q.double().numpy().copy()
    out = []
    for _ in range(k):
        x = int(rng.choice(len(q), p=q / q.sum()))
        out.append(x)
        q[x] = 0.0
        if q.sum() <= 0:
            break
    return out


def _make_draft(case: str, rng: np.random.Generator) -> Draft:
    """An adversarial draft for one trial (drafts with q are really sampled from q)."""
    p0 = _p(L0)
    if case == "always-wrong":  # deterministic, never the likely token
        return Draft.chain([3, 3], "prompt")
    if case == "argmax-tree":  # deterministic tree: argmax plus a sibling, with grandchildren
        return Draft([0, 1, 2, 0], [-1, -1, 0, 1], ["prompt"] * 4)
    if case in ("q-equals-p", "q-zeros-where-p-positive", "q-disjoint-support", "q-multi-children",
                "q-chain"):
        if case == "q-equals-p":
            q0 = p0.clone()
        elif case == "q-zeros-where-p-positive":
            q0 = torch.tensor([0.0, 0.7, 0.0, 0.3, 0.0], dtype=torch.float64)
        elif case == "q-disjoint-support":
            q0 = torch.zeros(V, dtype=torch.float64)
            q0[3] = 1.0
            # make p's support exclude token 3 for this case by checking below (p(3) > 0 but small)
        else:
            q0 = torch.tensor([0.1, 0.4, 0.2, 0.2, 0.1], dtype=torch.float64)
        if case == "q-multi-children":
            kids = _draw_without_replacement(q0, 3, rng)
            return Draft(kids, [-1] * len(kids), ["draft_model"] * len(kids), q0.expand(len(kids), V).clone())
        x1 = _draw_without_replacement(q0, 1, rng)[0]
        if case == "q-chain":
            q1 = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(x1)).double(), -1)
            x2 = _draw_without_replacement(q1, 1, rng)[0]
            return Draft([x1, x2], [-1, 0], ["draft_model"] * 2, torch.stack([q0, q1]))
        return Draft([x1], [-1], ["draft_model"], q0[None].clone())
    raise ValueError(case)


def _logits_for(draft: Draft) -> torch.Tensor:
    rows = [L0] + [L[t] for t in draft.tokens]  # Markov toy: a node's row depends on its own token
    return torch.stack(rows).float()


CASES = ["always-wrong", "argmax-tree", "q-equals-p", "q-zeros-where-p-positive", "q-disjoint-support",
         "q-multi-children", "q-chain"]


@pytest.mark.slow  # chi-square over many sampled sequences, 3-4 CPU s per case; test_chi2_detects_a_wrong_rule stays
@pytest.mark.parametrize("case", CASES)
def test_sequence_distribution_matches_target(case):
    params = SamplingParams(temperature=1.0, max_tokens=2)
    proc = LogitsProcessor(params, V)
    draw_rng = np.random.default_rng(1234)
    counts = np.zeros(V * V)
    trials = 3000
    for trial in range(trials):
        draft = _make_draft(case, draw_rng)
        rng = PositionRNG(seed=trial)
        out = verify_tree(draft, _logits_for(draft), proc, rng, position=0)
        seq = [draft.tokens[i] for i in out.accepted] + [out.token]
        if len(seq) < 2:  # the next plain step, as the engine would run it
            seq.append(sample_race(_p(L[seq[0]]), rng.race(1, V)))
        counts[seq[0] * V + seq[1]] += 1
    pvalue = _chi2_pvalue(counts, EXACT.numpy())
    assert pvalue > 1e-3, f"{case}: distribution differs from the target (chi2 p={pvalue:.2e})"


def test_chi2_detects_a_wrong_rule():
    """The test above can fail: accepting q-drafts blindly gives a detectably wrong distribution."""
    draw_rng = np.random.default_rng(7)
    q0 = torch.tensor([0.1, 0.4, 0.2, 0.2, 0.1], dtype=torch.float64)
    counts = np.zeros(V * V)
    for trial in range(4000):
        x1 = _draw_without_replacement(q0, 1, draw_rng)[0]  # "accept everything" = sample from q
        rng = PositionRNG(seed=trial)
        counts[x1 * V + sample_race(_p(L[x1]), rng.race(1, V))] += 1
    assert _chi2_pvalue(counts, EXACT.numpy()) < 1e-6


def test_race_draws_from_p_and_keys_its_noise_by_seed_and_position():
    """The exponential race is a draw from p (zeros never drawn); the same (seed, position) gives the same token."""
    p = torch.tensor([0.05, 0.0, 0.5, 0.25, 0.2], dtype=torch.float64)
    counts = np.zeros(len(p))
    for seed in range(4000):
        counts[sample_race(p, PositionRNG(seed).race(3, len(p)))] += 1
    assert counts[1] == 0
    keep = p > 0
    assert _chi2_pvalue(counts[keep.numpy()], (p[keep] / p[keep].sum()).numpy()) > 1e-3
    same = [sample_race(p, PositionRNG(11).race(3, len(p))) for _ in range(3)]
    assert len(set(same)) == 1
    assert torch.equal(PositionRNG(11).race(3, 8), PositionRNG(11).race(3, 8))
    assert not torch.equal(PositionRNG(11).race(3, 8), PositionRNG(11).race(4, 8))
    assert not torch.equal(PositionRNG(11).race(3, 8), PositionRNG(12).race(3, 8))


def test_race_is_robust_to_rounding_where_the_inverse_cdf_is_not():
    """Why seeded sampling races: p from a multi-token pass differs from a one-token step by rounding.

    Perturb a code-model-like p (Zipf over 8192 tokens) by 1e-5 relative noise, as a verify pass
    does: the inverse CDF changes its token far more often (every one of the 8192 boundaries can
    move past the uniform) than the race (only a near tie between the two best scores can flip).
    """
    gen = torch.Generator().manual_seed(0)
    V, draws = 8192, 3000
    base = 1.0 / torch.arange(1, V + 1, dtype=torch.float64) ** 1.1
    base = base[torch.randperm(V, generator=gen)]
    p = base / base.sum()
    noisy = p * (1 + 1e-5 * torch.randn(V, generator=gen, dtype=torch.float64))
    noisy = noisy / noisy.sum()
    flips_icdf = flips_race = 0
    for pos in range(draws):
        rng = PositionRNG(5)
        u = float(np.random.default_rng([5, 9, pos]).random())
        flips_icdf += sample_inverse_cdf(p, u) != sample_inverse_cdf(noisy, u)
        noise = rng.race(pos, V)
        flips_race += sample_race(p, noise) != sample_race(noisy, noise)
    assert flips_icdf >= 5 and flips_race == 0, (flips_icdf, flips_race)


@pytest.mark.parametrize(
    "tokens,parents,argmaxes,accepted,emitted",
    [
        ([5, 8, 9], [-1, 0, 0], {0: 5, 1: 9, 3: 4}, [0, 2], 4),  # the docstring's worked example
        ([5, 6], [-1, 0], {0: 7}, [], 7),  # first token wrong: nothing accepted
        ([5, 6], [-1, 0], {0: 5, 1: 6, 2: 1}, [0, 1], 1),  # whole chain plus the bonus token
        ([], [], {0: 3}, [], 3),  # empty draft = a plain step
    ],
)
def test_greedy_walk_table(tokens, parents, argmaxes, accepted, emitted):
    vocab = 12
    logits = torch.zeros(len(tokens) + 1, vocab)
    for row, tok in argmaxes.items():
        logits[row, tok] = 5.0
    draft = Draft(tokens, parents, ["prompt"] * len(tokens))
    proc = LogitsProcessor(SamplingParams(), vocab)
    out = verify_tree(draft, logits, proc, PositionRNG(0), position=0)
    assert out.accepted == accepted and out.token == emitted


def test_greedy_ties_break_to_lowest_id():
    logits = torch.zeros(2, 6)
    logits[0, 2] = logits[0, 4] = 1.0
    proc = LogitsProcessor(SamplingParams(), 6)
    out = verify_tree(Draft.chain([4], "prompt"), logits, proc, PositionRNG(0), 0)
    assert out.accepted == [] and out.token == 2


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(logit_bias={1: 0.5, 3: -0.5}),
                                    SamplingParams(presence_penalty=0.9, frequency_penalty=0.4)],
                         ids=["plain", "bias", "penalties"])
def test_greedy_walk_equals_a_row_by_row_walk(params):
    from suffixspec.core.sampling import greedy_token

    rng = np.random.default_rng(3)
    vocab = 4  # few tokens and rounded logits: many ties and many accepted nodes
    for _ in range(200):
        n = int(rng.integers(0, 10))
        parents = [int(rng.integers(-1, i)) for i in range(n)]
        tokens = [int(rng.integers(0, vocab)) for _ in range(n)]
        seen, keep = set(), []
        for i, (tok, par) in enumerate(zip(tokens, parents, strict=True)):
            if (par, tok) not in seen and (par < 0 or par in keep):
                seen.add((par, tok))
                keep.append(i)
        remap = {old: new for new, old in enumerate(keep)}
        draft = Draft([tokens[i] for i in keep], [remap.get(parents[i], -1) for i in keep], ["prompt"] * len(keep))
        logits = torch.from_numpy(rng.normal(size=(len(keep) + 1, vocab)).round(0)).float()
        proc = LogitsProcessor(params, vocab)
        proc.observe(1)
        out = verify_tree(draft, logits, proc, PositionRNG(0), 0)
        cur, path, accepted = -1, [], []  # reference: process and argmax each row along its own path
        while True:
            y = greedy_token(proc.process(logits[cur + 1 : cur + 2], [path])[0])
            nxt = next((c for c, par in enumerate(draft.parents) if par == cur and draft.tokens[c] == y), None)
            if nxt is None:
                break
            cur = nxt
            path.append(y)
            accepted.append(nxt)
        assert (out.accepted, out.token) == (accepted, y)
        assert len(out.processed) == len(accepted) + 1
        ref_rows = [proc.process(logits[r : r + 1], [[draft.tokens[a] for a in accepted[:k]]])[0]
                    for k, r in enumerate(out.rows)]
        assert all(torch.equal(a, b) for a, b in zip(out.processed, ref_rows, strict=True))
