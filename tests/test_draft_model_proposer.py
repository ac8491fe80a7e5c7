"""Draft-model proposers: same vocabulary and bridged (text level, token-level intersection).

Engine output with every drafter equals plain decoding (greedy; seeded sampling for deterministic
drafts), the draft KV cache stays in step after rejections, the adaptive length moves, and the
intersection mode's sampled distribution matches plain sampling (chi-square, fixed seeds).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.drafting.costs import PassCost
from suffixspec.drafting.draft import SOURCE_DRAFT_MODEL, SOURCE_PROMPT, Draft
from suffixspec.drafting.proposers import Proposer, RequestContext
from suffixspec.drafting.proposers.bridged_draft import BridgedDraftProposer
from suffixspec.drafting.proposers.draft_model import DraftModelProposer, make_draft_proposer
from suffixspec.drafting.proposers.model_drafter import AdaptiveLength, DraftRunner
from suffixspec.loading import load_model

PROMPTS = ["def add(a, b):\n", "The quick brown fox", "for i in range(10):\n\tprint(", "你好 🙂 wörld"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models(tiny_model_dirs, tiny_draft_dir):
    return {"target": load_model(str(tiny_model_dirs["llama"]), device="cpu"),
            "same": load_model(str(tiny_model_dirs["qwen2"]), device="cpu"),
            "hetero": load_model(str(tiny_draft_dir), device="cpu")}


@pytest.fixture(scope="module")
def engine(models):
    from suffixspec.runtimes.engine import Engine

    return Engine(models["target"])


DRAFTERS = {
    # the target drafting for itself: everything is accepted under greedy (exercises long accepts;
    # no confidence cut-off, the random tiny model is never confident)
    "same-self": lambda m: DraftModelProposer(m["target"], min_confidence=0.0),
    "same-other": lambda m: make_draft_proposer(m["same"], m["target"], mode="same"),
    "same-argmax": lambda m: DraftModelProposer(m["same"], sample=False),
    "text": lambda m: make_draft_proposer(m["hetero"], m["target"]),
    "text-self": lambda m: BridgedDraftProposer(m["target"], m["target"].tokenizer, mode="text", min_confidence=0.0,
                                                first_confidence=0.0),
    "intersection": lambda m: make_draft_proposer(m["hetero"], m["target"], mode="intersection"),
    "intersection-self": lambda m: BridgedDraftProposer(m["target"], m["target"].tokenizer, mode="intersection",
                                                        min_confidence=0.0, first_confidence=0.0),
}
DETERMINISTIC = ("same-argmax", "text", "text-self")  # no q: seeded sampling gives identical tokens


def _run(engine, proposer, prompt, sampling, speculation=None):
    engine.proposers = [proposer] if proposer is not None else []
    try:
        return engine.generate(prompt, sampling, speculation)
    finally:
        engine.proposers = []


GREEDY = SamplingParams(max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def plain_greedy(engine) -> dict:
    """Each prompt's plain decoding under ``GREEDY`` (speculation off), decoded once for every drafter
    compared with it below (the plain path does not depend on the drafter)."""
    return {prompt: _run(engine, None, prompt, GREEDY, SpeculationConfig(enabled=False)) for prompt in PROMPTS}


@pytest.mark.parametrize("kind", list(DRAFTERS))
def test_greedy_equals_plain(models, engine, plain_greedy, kind):
    proposer = DRAFTERS[kind](models)
    sp = GREEDY
    for prompt in PROMPTS:
        plain = plain_greedy[prompt]
        # adaptive=False: the engine's cost gates would (rightly) skip a self-draft, which saves no
        # time; here every draft must reach verification
        spec = _run(engine, proposer, prompt, sp, SpeculationConfig(adaptive=False))
        assert spec.token_ids == plain.token_ids, (kind, prompt)
        assert spec.stats.drafted_tokens > 0
        if kind in ("same-self", "text-self", "intersection-self"):
            assert spec.stats.mean_accepted_length > 1.5 and spec.stats.steps < plain.stats.steps / 2


@pytest.mark.slow  # the greedy sweep above stays in the inner loop
@pytest.mark.parametrize("kind", DETERMINISTIC)
@pytest.mark.parametrize("params", [dict(temperature=1.0, seed=3), dict(temperature=0.7, top_p=0.9, seed=5)])
def test_seeded_sampling_equals_plain(models, engine, kind, params):
    proposer = DRAFTERS[kind](models)
    sp = SamplingParams(max_tokens=24, ignore_eos=True, **params)
    for prompt in PROMPTS[:3]:
        plain = _run(engine, None, prompt, sp, SpeculationConfig(enabled=False))
        spec = _run(engine, proposer, prompt, sp)
        assert spec.token_ids == plain.token_ids, (kind, prompt)


def test_drafters_respect_request(models, engine):
    """A request that does not allow the draft model gets no draft-model nodes."""
    proposer = DRAFTERS["text"](models)
    res = _run(engine, proposer, PROMPTS[0], SamplingParams(max_tokens=8, ignore_eos=True),
               SpeculationConfig(drafters=(SOURCE_PROMPT,)))
    assert res.stats.drafted_tokens == 0
    proposer.begin(RequestContext(prompt_ids=[1, 2, 3], drafters=(SOURCE_PROMPT,)))
    assert len(proposer.propose([1, 2, 3], 8)) == 0


def test_runner_cache_in_step(models):
    """After a rewrite of the last tokens the cached logits equal a fresh run's."""
    runner = DraftRunner(models["same"])
    ids = models["same"].tokenizer.encode("def add(a, b):\n    return a + b")
    runner.logits_after(ids)
    for t in (5, 6, 7):
        runner.extend(t)
    rewritten = ids[:-2] + [9, 10]
    got = runner.logits_after(rewritten)
    fresh = DraftRunner(models["same"]).logits_after(rewritten)
    torch.testing.assert_close(got, fresh, atol=1e-4, rtol=1e-4)
    assert runner.cache.get_seq_length() == len(rewritten)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lean_forward_matches_transformers(tiny_model_dirs, arch):
    """The lean draft forward (fused projections, preallocated cache) gives the transformers
    forward's logits: prefill, one token at a time, several at once, and after a rewrite
    (grouped-query attention; qwen2's q/k/v biases, made non-zero here)."""
    loaded = load_model(str(tiny_model_dirs[arch]), device="cpu")
    if arch == "qwen2":
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for layer in loaded.model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.copy_(torch.randn(proj.bias.shape, generator=g))
    lean, ref = DraftRunner(loaded), DraftRunner(loaded, lean=False)
    assert lean.lean is not None and ref.lean is None
    ids = loaded.tokenizer.encode("def add(a, b):\n    return a + b  # 你好 🙂")
    steps = [ids, ids + [5], ids + [5, 6], ids + [5, 6, 7, 8, 9], ids[:-3] + [11, 12], ids[:2], ids + [3]]
    for seq in steps:
        torch.testing.assert_close(lean.logits_after(seq), ref.logits_after(seq), atol=1e-4, rtol=1e-4)
    assert lean.cache.get_seq_length() == len(steps[-1]) == ref.cache.get_seq_length()


def test_adaptive_length():
    a = AdaptiveLength(start=4, low=1, high=6)
    a.observe(4, 4)
    assert a.value == 5
    a.observe(5, 5)
    a.observe(6, 6)
    a.observe(6, 6)
    assert a.value == 6
    a.observe(6, 1)
    assert a.value == 5
    a.observe(5, 3)  # more than half accepted: unchanged
    assert a.value == 5
    with pytest.raises(ValueError):
        AdaptiveLength(start=0)


def test_proposer_length_follows_acceptance(models):
    p = DraftModelProposer(models["same"], length=AdaptiveLength(start=4, high=8), min_confidence=0.0)
    p.begin(RequestContext(prompt_ids=[3, 4, 5]))
    d = p.propose([3, 4, 5], 16)
    assert len(d) == 4 and d.q is None  # greedy: no q
    p.update(d.tokens + [7])  # everything accepted
    assert p.length.value == 5
    d = p.propose([3, 4, 5, *d.tokens, 7], 16)
    p.update([(d.tokens[0] + 1) % 400])  # first token rejected
    assert p.length.value == 4


def test_sampling_q_rows(models):
    """Sampling requests report q: valid distributions over the target vocabulary, q(token) > 0."""
    target_vocab = int(models["target"].model.get_output_embeddings().weight.shape[0])
    sp = SamplingParams(temperature=0.9, top_k=50, seed=11)
    ids = models["target"].tokenizer.encode("def add(a, b):\n")
    for kind in ("same-other", "intersection"):
        p = DRAFTERS[kind](models)
        p.begin(RequestContext(prompt_ids=ids, sampling=sp))
        d = p.propose(ids, 6)
        assert len(d) > 0 and d.q is not None and d.q.shape == (len(d), target_vocab)
        torch.testing.assert_close(d.q.sum(-1).double(), torch.ones(len(d), dtype=torch.float64))
        assert all(float(d.q[i, t]) > 0 for i, t in enumerate(d.tokens))
        assert set(d.sources) == {SOURCE_DRAFT_MODEL}
        if kind == "intersection":
            inter = p.bridge.intersection
            outside = torch.ones(target_vocab, dtype=torch.bool)
            outside[torch.as_tensor(inter.target_ids)] = False
            assert float(d.q[:, outside].abs().sum()) == 0.0


def test_text_mode_siblings(models):
    """Text mode offers boundary-lattice siblings of the last drafted token."""
    p = BridgedDraftProposer(models["hetero"], models["target"].tokenizer, mode="text", siblings=3,
                             first_confidence=0.0)
    ids = models["target"].tokenizer.encode("def add(a, b):\n    return a")
    p.begin(RequestContext(prompt_ids=ids))
    d = p.propose(ids, 12)
    assert len(d) > 0
    chain = [i for i in range(len(d)) if i == 0 or d.parents[i] == i - 1]
    extra = [i for i in range(len(d)) if i not in chain]
    tv = p.bridge.target
    for i in extra:  # siblings start with the last chain token's spelling
        last = d.tokens[chain[-1]]
        assert d.parents[i] == d.parents[chain[-1]]
        assert tv.token_bytes[d.tokens[i]].startswith(tv.token_bytes[last])


def test_a_draft_is_estimated_at_its_share_of_the_targets_bytes(models):
    """``make_draft_proposer`` tells the drafter what a step of it reads against a step of its target (its
    judge's estimate until a draft forward is measured): the weight bytes of each, as the forwards run them."""
    from suffixspec.core.lean import lean_forward
    from suffixspec.core.weights import weight_bytes

    target = models["target"]
    theirs = weight_bytes(target.model, lean_forward(target.model, target.lean_kind))
    for name in ("same", "hetero"):
        p = make_draft_proposer(models[name], target)
        assert p.step_ratio == weight_bytes(models[name].model, p.runner.lean) / theirs
        assert 0 < p.step_ratio and p.judge.step_ratio == p.step_ratio
    assert DraftModelProposer(models["same"]).step_ratio is None  # built alone: nothing to compare with


def test_bad_mode(models):
    with pytest.raises(ValueError):
        make_draft_proposer(models["hetero"], models["target"], mode="nope")


def _chi_square_z(observed: Counter, expected: dict, n: int) -> float:
    """Wilson-Hilferty z-score of the chi-square statistic (cells with expected < 5 pooled)."""
    stat, pooled_o, pooled_e, cells = 0.0, 0, 0.0, 0
    for key, p in expected.items():
        e = p * n
        if e < 5:
            pooled_o += observed.get(key, 0)
            pooled_e += e
            continue
        stat += (observed.get(key, 0) - e) ** 2 / e
        cells += 1
    pooled_o += sum(c for k, c in observed.items() if k not in expected)
    pooled_e += n - sum(p * n for p in expected.values())
    if pooled_e >= 1:
        stat += (pooled_o - pooled_e) ** 2 / pooled_e
        cells += 1
    k = max(1, cells - 1)
    return ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))


@torch.inference_mode()
def _exact_pairs(target, ids: list[int], sp: SamplingParams) -> dict:
    """Exact distribution of the first two sampled tokens under the plain sampler."""
    from suffixspec.core.sampling import LogitsProcessor

    model = target.model
    vocab = int(model.get_output_embeddings().weight.shape[0])
    proc = LogitsProcessor(sp, vocab)
    p0 = proc.probs(proc.process(model(torch.tensor([ids])).logits[0, -1:].float()))[0]
    out = {}
    for t0 in torch.nonzero(p0 > 1e-6).flatten().tolist():
        p1 = proc.probs(proc.process(model(torch.tensor([ids + [t0]])).logits[0, -1:].float()))[0]
        for t1 in torch.nonzero(p1 > 1e-6).flatten().tolist():
            out[(t0, t1)] = float(p0[t0] * p1[t1])
    return out


class WideDraft(BridgedDraftProposer):
    """Drafts from the un-truncated distribution (the target keeps top-4): q has mass where p = 0."""

    def begin(self, request: RequestContext) -> None:
        super().begin(request)
        self.sampling = SamplingParams(temperature=1.0, seed=request.sampling.seed)


class FlatCost(PassCost):
    """A verify pass costs the same for any number of nodes (as on a GPU), whatever the machine's
    load: the gates stay on, and every draft of a request passes them."""

    def observe(self, inputs: int, seconds: float) -> None:
        pass

    def estimate(self, inputs: int) -> float:
        return 1.0


@pytest.mark.slow  # a chi-square test, ~7 CPU s each
@pytest.mark.parametrize("kind", ["hetero", "self-wide"])
def test_intersection_sampling_distribution(models, engine, kind, monkeypatch):
    """The bridged known-q drafter leaves the sampled distribution of (t0, t1) equal to plain.

    ``hetero``: the tiny random Unigram draft (its tokens are nearly always rejected: residual
    path); ``self-wide``: the target drafting for itself without top-k (partial
    acceptance: both the accept test and the residual are exercised). The verify cost is pinned
    flat, so how many drafts are verified does not follow the machine's load (gates with costs
    that bite: tests/test_lossless_gates.py).
    """
    monkeypatch.setattr(engine.scheduler, "cost", FlatCost())
    sp_kw = dict(temperature=1.0, top_k=4, max_tokens=2, ignore_eos=True)
    prompt = "def add(a, b):\n"
    ids = engine.encode(prompt)
    expected = _exact_pairs(models["target"], ids, SamplingParams(**sp_kw))
    if kind == "hetero":
        proposer = DRAFTERS["intersection"](models)
    else:
        proposer = WideDraft(models["target"], models["target"].tokenizer, mode="intersection")
    n = 300
    seen = Counter()
    drafted = accepted = 0
    for seed in range(n):
        res = _run(engine, proposer, ids, SamplingParams(seed=seed, **sp_kw))
        seen[tuple(res.token_ids)] += 1
        drafted += res.stats.drafted_tokens
        accepted += res.stats.accepted_tokens
    assert drafted > 0
    if kind == "self-wide":
        assert 0.1 * drafted < accepted < 0.9 * drafted
    z = _chi_square_z(seen, expected, n)
    assert z < 3.5, (z, seen.most_common(5))
    # the test can fail: a distribution shifted onto the most likely pair is rejected
    top = max(expected, key=expected.get)
    skewed = Counter({top: n})
    assert _chi_square_z(skewed, expected, n) > 3.5


def test_confidence_cut_off(models):
    """Drafting stops after a token the draft is unsure of; the first token is always drafted."""
    ids = models["target"].tokenizer.encode("def add(a, b):\n")
    for threshold, want in ((0.999, 1), (0.0, 6)):
        p = DraftModelProposer(models["same"], length=AdaptiveLength(start=6, high=8), min_confidence=threshold)
        p.begin(RequestContext(prompt_ids=ids))
        assert len(p.propose(ids, 16)) == want
    with pytest.raises(ValueError):
        DraftModelProposer(models["same"], min_confidence=1.0)


def test_context_window(models, engine):
    """A draft with a short context window sees a recent cut that moves in quarter-window steps."""
    p = DraftModelProposer(models["same"], context_window=32, length=AdaptiveLength(start=4, high=8))
    cuts = [p._window(list(range(n)), 4) for n in range(20, 120)]
    assert all(len(c) <= 32 - 8 - 1 for c in cuts)
    assert len({c[0] for c in cuts}) <= 100 // 8 + 2  # the start moves rarely (KV cache reuse)
    assert all(c[-1] == n - 1 for c, n in zip(cuts, range(20, 120), strict=True))
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    prompt = "def add(a, b):\n    return a + b\n" * 2
    plain = _run(engine, None, prompt, sp, SpeculationConfig(enabled=False))
    assert _run(engine, p, prompt, sp).token_ids == plain.token_ids


def test_token_healing_candidates(models):
    """Text mode backs up the draft context's last token and redraws it among its extensions."""
    p = BridgedDraftProposer(models["hetero"], models["target"].tokenizer, mode="text")
    dv = p.bridge.draft
    ids = [dv.by_bytes[b"r"], dv.by_bytes[b"e"]] if b"e" in dv.by_bytes else []
    cands = p._heal_candidates([*ids, dv.by_bytes[b" "]]) if ids else None
    if cands is not None:
        assert all(dv.token_bytes[int(c)].startswith(b" ") for c in cands)
    assert BridgedDraftProposer(models["hetero"], models["target"].tokenizer, heal=False)._heal_candidates(
        [1, 2, 3]) is None


def test_intersection_healing_twins(models):
    """Greedy intersection healing: each candidate extends the context's last draft token ``B`` and
    its remainder's target twin spells exactly the bytes after ``B`` (-1 only for ``B`` itself)."""
    p = BridgedDraftProposer(models["hetero"], models["target"].tokenizer, mode="intersection")
    dv, tv = p.bridge.draft, p.bridge.target
    checked = 0
    for last in range(dv.size):
        b = dv.token_bytes[last]
        if not b:
            continue
        hit = p._heal_twins([1, 5, last])
        if hit is None:
            continue
        cands, twins = hit
        for d, t in zip(cands.tolist(), twins, strict=True):
            assert dv.token_bytes[d].startswith(b)
            if t < 0:
                assert d == last
            else:
                assert tv.token_bytes[t] == dv.token_bytes[d][len(b):]
        checked += 1
        if checked >= 20:
            break
    assert checked > 0
    assert BridgedDraftProposer(models["hetero"], models["target"].tokenizer, mode="intersection",
                                heal=False)._heal_twins([1, 5, 7]) is None


@pytest.mark.parametrize("mode", ["text", "intersection"])
def test_runner_up_branch(models, mode):
    """The draft's runner-up first token is offered as a second first-position branch; without
    ``alternatives`` every greedy draft has a single first token."""
    tok = models["target"].tokenizer
    roots = {}
    for alternatives in (0, 1):
        p = BridgedDraftProposer(models["hetero"], tok, mode=mode, siblings=0, alternatives=alternatives,
                                 alt_confidence=0.0, first_confidence=0.0)
        n = 0
        for prompt in PROMPTS:
            ids = tok.encode(prompt)
            p.begin(RequestContext(prompt_ids=ids))
            d = p.propose(ids, 12)
            firsts = [t for t, par in zip(d.tokens, d.parents, strict=True) if par == -1]
            assert len(firsts) == len(set(firsts)) <= 1 + alternatives
            n += len(firsts) > 1
        roots[alternatives] = n
    assert roots[0] == 0 and roots[1] > 0
    with pytest.raises(ValueError):
        BridgedDraftProposer(models["hetero"], tok, alternatives=-1)


@pytest.mark.parametrize("mode", ["text", "intersection"])
def test_first_confidence(models, mode):
    """A draft whose first token the draft model gives less than ``first_confidence`` is not
    proposed (the tiny random draft is never 99.9% sure); 0 keeps every greedy draft."""
    tok = models["target"].tokenizer
    sure = BridgedDraftProposer(models["hetero"], tok, mode=mode, first_confidence=0.999)
    every = BridgedDraftProposer(models["hetero"], tok, mode=mode, first_confidence=0.0)
    proposed = 0
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        for p in (sure, every):
            p.begin(RequestContext(prompt_ids=ids))
        assert len(sure.propose(ids, 8)) == 0
        proposed += len(every.propose(ids, 8)) > 0
    assert proposed > 0
    with pytest.raises(ValueError):
        BridgedDraftProposer(models["hetero"], tok, first_confidence=1.0)


@pytest.mark.parametrize("kind", ["same-other", "text", "intersection"])
def test_draft_prefilled_at_the_first_propose(models, kind):
    """``begin`` feeds nothing; the request's first ``propose`` feeds the prompt to the draft model and
    reports that time as ``setup_s`` (the engine's proposer gate measures the drafter by its per-step
    cost without it); later calls run short forward passes and report no setup."""
    p = DRAFTERS[kind](models)
    ids = models["target"].tokenizer.encode("def add(a, b):\n    return a + b\n\nprint(add(1, 2))")
    before = list(p.runner.ids)
    p.begin(RequestContext(prompt_ids=ids))
    assert list(p.runner.ids) == before and p.setup_s == 0.0
    p.propose(ids, 4)
    assert p.setup_s > 0.0
    full = p.ctx.ids if hasattr(p, "ctx") else ids
    assert p.runner.ids[:len(full) - 1] == full[:len(full) - 1]
    p.update([ids[-1]])
    p.propose(ids + [ids[-1]], 4)
    assert p.setup_s == 0.0


def test_model_drafters_depend_one_way():
    """model_drafter <- bridged_draft <- draft_model: a fresh interpreter importing the bridged
    drafter loads neither draft_model nor anything that imports it back (issue 17, item 20)."""
    import subprocess
    import sys

    code = ("import sys; import suffixspec.drafting.proposers.bridged_draft; "
            "print('suffixspec.drafting.proposers.draft_model' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from suffixspec.drafting.proposers import bridged_draft, draft_model, model_drafter

    assert bridged_draft.ModelDrafter is model_drafter.ModelDrafter is draft_model.ModelDrafter


# -- the draft's own judgement from measured costs, int8 drafts ------------------------------------------------


def _costed(proposer, ids, step_s: float, slope: float):
    """``proposer`` begun on ``ids`` with its draft forward measured at ``step_s`` and a verify pass costing
    1 + slope x (inputs - 1) seconds (a plain step of 1 s)."""
    from suffixspec.drafting.costs import StepCost

    cost = PassCost()
    for n in range(1, 40):
        cost.observe(n, 1.0 + slope * (n - 1))
    proposer.begin(RequestContext(prompt_ids=ids))
    proposer.step_s = proposer.judge.step_s = step_s
    proposer.observe_costs(StepCost(cost))
    return proposer


def test_a_costed_draft_goes_as_far_as_its_reach_pays_and_branches_where_close(models):
    """Cheap draft steps and nodes: the self-draft (the target drafting for itself) drafts up to its cap and
    adds runner-ups as siblings; costly ones: it stops after the first token and adds none. Greedy: no q."""
    ids = models["target"].tokenizer.encode("def add(a, b):\n")
    cheap = _costed(DraftModelProposer(models["target"], max_length=6), ids, step_s=1e-12, slope=1e-12)
    d = cheap.propose(ids, 16)
    assert d.q is None and len(cheap._chain) == 6 and len(d) > 6  # six drafted, siblings besides
    assert sum(p == -1 for p in d.parents) == 2  # the first token's runner-up: a second root branch
    assert d.follow(cheap._chain) == (d.tokens.index(cheap._chain[-1]), 6) and d.score > 0
    costly = _costed(DraftModelProposer(models["target"], max_length=6), ids, step_s=0.6, slope=0.3)
    costly.judge.first = 1.0  # its first token pays (1 s >= 0.6 + 0.3 s), no second one can (reach < 0.9)
    costly.runner.logits_after(ids[:-1])  # its cache lacks only the last token: one forward's worth
    d = costly.propose(ids, 16)
    assert len(d) == 1


def test_a_draft_counts_the_tokens_its_cache_lacks(models):
    """The draft's first forward feeds what its cache lacks: the prompt at a request's first draft (the
    tokens accepted while it sat out later), costing t(n) / t(1) one-token forwards on the pass curve. The
    draft of the test above, its cache empty: 1 s < 0.6 x t(7) / t(1) + 0.3 s = 1.98 s, no draft and no
    prefill; and its forwards are timed by what they fed (a catch-up of n tokens is not one slow forward)."""
    ids = models["target"].tokenizer.encode("def add(a, b):\n")
    p = _costed(DraftModelProposer(models["target"], max_length=6), ids, step_s=0.6, slope=0.3)
    p.judge.first = 1.0
    assert p.forwards(1) == 1.0 and p.forwards(len(ids)) == pytest.approx(1 + 0.3 * (len(ids) - 1))
    assert len(p.propose(ids, 16)) == 0 and p.runner.ids == []
    p.runner.logits_after(ids[:-1])
    assert len(p.propose(ids, 16)) == 1
    # timing: a forward feeding the whole prompt counts as forwards(len(ids)) one-token forwards
    p.runner.reset()
    p._fwd_cpu, p._fwd_n = 0.0, 0
    p.logits(ids)
    assert p._fwd_n == 1 and p.forwards(len(ids)) > 1
    p.logits(ids)  # kept logits: no forward, nothing timed
    assert p._fwd_n == 1


def test_a_costed_draft_sits_out_steps_it_cannot_pay_for(models):
    ids = models["target"].tokenizer.encode("def add(a, b):\n")
    p = _costed(DraftModelProposer(models["target"]), ids, step_s=2.0, slope=0.5)
    p.judge.first = 0.5  # 0.5 x 1 s < 2 s + 0.5 s
    assert len(p.propose(ids, 16)) == 0 and p.runner.ids == []  # not even the prompt's prefill


def test_greedy_equals_plain_with_the_drafts_own_judgement_and_int8(models, engine, plain_greedy):
    """Inside the engine (adaptive: costs measured, the draft judging itself) and on int8 matrices, the
    output is plain decoding's; the int8 draft agrees with its float32 self on most tokens."""
    sp = GREEDY
    for kind, proposer in (("judged", DraftModelProposer(models["same"])),
                           ("int8", DraftModelProposer(models["target"], int8=True))):
        if kind == "int8":
            assert proposer.runner.int8
        for prompt in PROMPTS:
            spec = _run(engine, proposer, prompt, sp)
            assert spec.token_ids == plain_greedy[prompt].token_ids, (kind, prompt)
        assert proposer.step_s is not None and proposer.step_s > 0  # measured inside the engine


def test_an_int8_draft_runs_close_to_its_float_self(models):
    from suffixspec.core.weights import Int8Weight, int8_works, linear

    if not int8_works():
        pytest.skip("this torch has no int8 dynamic linear: drafts stay in float32")
    w = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    x = torch.randn(3, 48, generator=torch.Generator().manual_seed(1))
    want = x @ w.t()
    assert Int8Weight(w).shape == (64, 48)
    assert float((linear(x, Int8Weight(w)) - want).abs().max()) <= 0.03 * float(want.abs().max())
    ids = models["target"].tokenizer.encode("def add(a, b):\n    return a + b\n")
    f32, i8 = DraftRunner(models["target"]), DraftRunner(models["target"], int8=True)
    assert i8.int8 and not f32.int8 and i8.lean is not f32.lean
    a, b = f32.logits_after(ids), i8.logits_after(ids)
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.99


def test_a_request_that_leaves_the_draft_model_out_never_calls_it(models, engine):
    """speculation.drafters without draft_model: the draft model is not called (nor timed, so no record the
    engine shares across requests learns a no-op call's cost)."""
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    res = _run(engine, DraftModelProposer(models["same"]), PROMPTS[0], sp, SpeculationConfig(drafters=("prompt",)))
    assert "draft_model" not in res.stats.propose_calls
    res = _run(engine, DraftModelProposer(models["same"]), PROMPTS[0], sp)
    assert res.stats.propose_calls.get("draft_model", 0) > 0


@pytest.mark.parametrize("lean", [True, False])
def test_logits_along_a_chain_equal_one_token_at_a_time(models, lean):
    """The draft's logits at every position of another drafter's chain, in one forward, are the ones it
    gives feeding the chain token by token; the cache then holds the whole chain, and a rewrite after it
    (the draft disagreeing half-way) feeds only what changed."""
    loaded = models["same"]
    ids = loaded.tokenizer.encode("def add(a, b):\n    return a + b")
    chain = [5, 6, 7, 8]
    runner, ref = DraftRunner(loaded, lean=lean), DraftRunner(loaded, lean=lean)
    runner.logits_after(ids)
    rows = runner.logits_along(ids + chain, len(ids) - 1)
    assert rows.shape[0] == len(chain) + 1 and runner.ids == ids + chain
    for j in range(len(chain) + 1):
        torch.testing.assert_close(rows[j], ref.logits_after(ids + chain[:j]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(runner.logits_after(ids + chain[:2] + [9]), ref.logits_after(ids + chain[:2] + [9]),
                               atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="start"):
        runner.logits_along(ids, len(ids))


def test_a_vetted_lead_drafts_what_the_draft_would_draft_alone(models):
    """Told another drafter's chain (observe_lead), a greedy draft model checks it in one forward and
    drafts the same tokens as without it, whether the lead agrees with it all the way, half-way or not at all."""
    ids = models["target"].tokenizer.encode("def add(a, b):\n")
    alone = DraftModelProposer(models["target"], sample=False, min_confidence=0.0, max_length=8)
    alone.begin(RequestContext(prompt_ids=ids))
    want = alone.propose(ids, 8)
    for lead in (want.tokens[:6], want.tokens[:3] + [(want.tokens[3] + 1) % 100], [(want.tokens[0] + 1) % 100]):
        vetted = DraftModelProposer(models["target"], sample=False, min_confidence=0.0, max_length=8)
        vetted.begin(RequestContext(prompt_ids=ids))
        vetted.observe_lead(lead)
        calls: list[list[int]] = []
        vetted.vet = lambda i, c, calls=calls, vet=vetted.vet: calls.append(list(c)) or vet(i, c)
        got = vetted.propose(ids, 8)
        assert calls == [lead] and len(want) > 3
        assert got.tokens == want.tokens and got.parents == want.parents, lead
        assert got.probs == pytest.approx(want.probs, rel=1e-4, abs=1e-6)


def test_greedy_equals_plain_with_the_suffix_index_leading_the_draft_model(models, engine):
    """Suffix drafts and a draft model in one engine (merged trees, the model vetting the suffix index's
    surest chain): every output is plain decoding's."""
    from suffixspec.drafting.proposers.suffix import SuffixProposer

    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS:
        copy = prompt + " " + prompt  # text the suffix index can copy
        plain = _run(engine, None, copy, sp, SpeculationConfig(enabled=False))
        engine.proposers = [SuffixProposer(tokenizer=models["target"].tokenizer),
                            DraftModelProposer(models["same"], sample=False)]
        try:
            spec = engine.generate(copy, sp)
        finally:
            engine.proposers = []
        assert spec.token_ids == plain.token_ids, prompt


class _Promising(Proposer):
    """A deterministic drafter whose chain (a token the target never takes, say) promises ``score`` tokens."""

    name = "promising"

    def __init__(self, score: float) -> None:
        self.score = score

    def propose(self, context, budget):
        return Draft.chain([0], SOURCE_PROMPT, score=self.score)


class _FixedStep(DraftModelProposer):
    """The same-vocabulary draft model with its forward's cost pinned (``step_s``), so its judgement is a
    function of the run alone: the wiring under test, not the machine's clock, decides."""

    def learn_cost(self) -> None:
        self._fwd_cpu, self._fwd_n = 0.0, 0
        self.step_s = self.judge.step_s = 0.2


@pytest.mark.parametrize("shared", [True, False], ids=["shared-value", "plain-value"])
def test_the_drafts_before_a_draft_model_lower_what_its_tokens_are_worth(models, shared, monkeypatch):
    """The engine tells a draft model what the drafts before it promise this step (``observe_promise``: each
    draft's score times its proposer's trust, or the request's calibration), and with
    ``Policy.model_value_shared`` the model values its token at a plain step over (1 + that). Pinned costs:
    a pass F = 1 s, a node 0.001 s, a draft forward 0.2 s; the draft model is the target itself (its greedy
    tokens are accepted: its first-token acceptance starts at 0.6 and rises). Alone its draft pays
    (0.6 >= 0.201); after a drafter promising 6 tokens times the request's calibration it does not while
    that promise is above about 2 (0.6 / 3 < 0.201). Without the wiring (no promise told, or the policy not
    read) it would never decline here."""
    from suffixspec.drafting.judge import ModelDraftJudge
    from suffixspec.drafting.policy import Policy
    from suffixspec.runtimes.engine import Engine

    class Pinned(PassCost):
        def observe(self, inputs, seconds):
            pass

        def estimate(self, inputs):
            return 1.0 + 0.001 * (inputs - 1)

    seen: list[tuple[float, bool]] = []  # (the promise the judge was told, its verdict) per step
    worth = ModelDraftJudge.worth

    def recording(self, step, forwards=1.0):
        out = worth(self, step, forwards)
        seen.append((self.promised_before, out))
        return out

    monkeypatch.setattr(ModelDraftJudge, "worth", recording)
    engine = Engine(models["target"], policy=Policy(model_value_shared=shared))
    engine.scheduler.cost = Pinned()
    model = _FixedStep(models["target"])
    model.step_s = 0.2
    engine.proposers = [_Promising(6.0), model]
    engine.generate("def add(a, b):", SamplingParams(max_tokens=16), SpeculationConfig(max_draft_tokens=16))
    assert seen and all(0 < others <= 6.0 for others, _ in seen), seen  # told every step, at most the score
    declined = [others for others, ok in seen if not ok]
    if shared:
        assert declined and min(declined) > 1.0, seen  # declined, where the promise was large
    else:
        assert not declined, seen
