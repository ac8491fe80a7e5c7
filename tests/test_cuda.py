"""The decode path on a CUDA GPU: lossless there as on the CPU (skipped without CUDA; ``pytest -m cuda``).

The tiny models of the fixtures on ``cuda``: greedy speculation equals plain decoding, seeded sampling
with speculation on equals off, tree drafts, batches against each row alone, the draft models (same
vocabulary, text bridge, intersection with a known ``q``), the lean forward against ``transformers``, and
the sampling helpers on device logits (the noise made on the CPU from the seed, so a seeded request draws
the same tokens on either device). float32 is held to token equality; bfloat16, the default on a GPU, to
differences only at near-ties (``test_precision._check``: rounding of a multi-token pass against a
one-token step, as on the CPU).
"""

from __future__ import annotations

import pytest
import torch
from doubles import OracleProposer, RandomTreeProposer

from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.drafting.draft import SOURCE_DRAFT_MODEL, Draft
from suffixspec.loading import load_model
from suffixspec.runtimes.engine import Engine

pytestmark = [pytest.mark.cuda, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (pytest -m cuda runs these)")]

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n\t", "class Point:"]
SEEDED = [dict(temperature=1.0, seed=1), dict(temperature=0.7, top_p=0.9, seed=2, logprobs=2),
          dict(temperature=1.0, presence_penalty=0.8, frequency_penalty=0.5, logit_bias={5: 3.0}, seed=4)]
EVERY_DRAFT = SpeculationConfig(adaptive=False)


@pytest.fixture(scope="module")
def engines(tiny_model_dirs) -> dict[tuple[str, str], Engine]:
    return {(arch, dt): Engine(load_model(str(tiny_model_dirs[arch]), device="cuda", dtype=dt))
            for arch in ("llama", "qwen2", "gpt2") for dt in ("float32", "bfloat16")}


def _generate(engine: Engine, proposers, prompt: str, sp: SamplingParams, spec=None):
    engine.proposers = list(proposers)
    try:
        return engine.generate(prompt, sp, spec)
    finally:
        engine.proposers = []


def _same(engine: Engine, dtype: str, runs: list[tuple[str, list[int], list[int], int | None]]) -> None:
    """(prompt, plain tokens, other tokens, seed) per run: token for token in float32; in bfloat16, every
    difference a near-tie and few of them (test_precision._check)."""
    if dtype == "float32":
        assert [got for _, _, got, _ in runs] == [want for _, want, _, _ in runs]
    else:
        from test_precision import _check

        _check([(engine.encode(p), want, got, seed) for p, want, got, seed in runs], engine, f"cuda {dtype}")


def test_sampling_helpers_follow_the_logits_device():
    """The race, the inverse CDF, penalties and bias, and the known-q rule on CUDA logits give the CPU's
    tokens (noise made on the CPU from the seed; the division and argmax are exact on both)."""
    from suffixspec.core.sampling import LogitsProcessor, PositionRNG, sample_inverse_cdf, sample_race
    from suffixspec.core.verify import verify_tree

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 300, generator=gen) * 3
    q = torch.softmax(torch.randn(4, 300, generator=gen).double(), -1)
    draft = Draft([int(q[i].argmax()) for i in range(4)], [-1, 0, 1, 2], [SOURCE_DRAFT_MODEL] * 4,
                  q=q, planned=4)
    params = SamplingParams(temperature=0.9, top_p=0.95, presence_penalty=0.5, logit_bias={7: 2.0}, seed=3)
    for seed in range(20):
        rng = PositionRNG(seed)
        out = {}
        for device in ("cpu", "cuda"):
            proc = LogitsProcessor(params, 300, device)
            proc.observe(11)
            p = proc.probs(proc.process(logits.to(device)[:1], [[3, 4]]))[0]
            assert p.device.type == device
            walk = verify_tree(draft, logits[:5].to(device), proc, rng, position=seed)
            out[device] = (sample_race(p, rng.race(seed, 300)), sample_inverse_cdf(p, 0.37), walk.accepted, walk.token)
        assert out["cpu"] == out["cuda"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_greedy_and_seeded_speculation_on_cuda(engines, arch, dtype):
    """Oracle chain, partly wrong oracle tree (gates on), random tree: greedy and seeded, on = off."""
    engine = engines[(arch, dtype)]
    assert engine.batchable and (engine.scheduler.runner.lean is not None) == (arch != "gpt2")
    runs = []
    for i, prompt in enumerate(PROMPTS):
        for case in [dict()] + SEEDED:
            sp = SamplingParams(max_tokens=32, ignore_eos=True, **case)
            plain = _generate(engine, [], prompt, sp, False)
            for proposer, spec in ((OracleProposer(plain.token_ids, engine.vocab_size), EVERY_DRAFT),
                                   (OracleProposer(plain.token_ids, engine.vocab_size, corrupt_every=3, branch=True),
                                    None),
                                   (RandomTreeProposer(sorted(set(plain.token_ids)), seed=i), None)):
                res = _generate(engine, [proposer], prompt, sp, spec)
                runs.append((prompt, plain.token_ids, res.token_ids, sp.seed))
    _same(engine, dtype, runs)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_seeded_request_draws_the_same_tokens_on_cpu_and_cuda(engines, tiny_model_dirs, arch):
    """float32: the seed's noise is made on the CPU, so the device does not change the tokens."""
    cpu = Engine(load_model(str(tiny_model_dirs[arch]), device="cpu"))
    for case in SEEDED:
        sp = SamplingParams(max_tokens=32, ignore_eos=True, **case)
        want = _generate(cpu, [], PROMPTS[0], sp, False).token_ids
        got = _generate(engines[(arch, "float32")], [], PROMPTS[0], sp, False).token_ids
        assert got == want


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_batched_rows_on_cuda_equal_each_alone(engines, arch, dtype):
    """Four rows per pass, joining and leaving, greedy and seeded, with random-tree drafts."""
    from test_precision import _batched

    engine = engines[(arch, dtype)]
    reqs = [(p, SamplingParams(max_tokens=32, ignore_eos=True, **case))
            for p, case in zip(PROMPTS + PROMPTS[:2], [dict()] + SEEDED + [dict(), SEEDED[0]], strict=True)]
    alone = [_generate(engine, [], p, sp, False).token_ids for p, sp in reqs]
    results, sizes = _batched(engine, reqs, 4)
    assert max(sizes) == 4
    runs = [(p, want, got, sp.seed) for (p, sp), want, got in zip(reqs, alone, results, strict=True)]
    _same(engine, dtype, runs)


@pytest.mark.parametrize("mode", ["same", "text", "intersection"])
def test_draft_models_on_cuda(engines, tiny_model_dirs, tiny_draft_dir, mode):
    """A same-vocabulary draft (argmax, and sampling with q) and the bridged draft (text, intersection with
    q) on CUDA: greedy equals plain; a seeded request with a sampling draft gives the same tokens twice."""
    from suffixspec.drafting.proposers.draft_model import make_draft_proposer

    engine = engines[("llama", "float32")]
    draft_dir = tiny_model_dirs["qwen2"] if mode == "same" else tiny_draft_dir
    draft = load_model(str(draft_dir), device="cuda")
    for sp in (SamplingParams(max_tokens=32, ignore_eos=True), SamplingParams(max_tokens=32, ignore_eos=True, **SEEDED[0])):
        plain = _generate(engine, [], PROMPTS[1], sp, False)
        proposer = make_draft_proposer(draft, engine.target, mode=mode, min_confidence=0.0)
        first = _generate(engine, [proposer], PROMPTS[1], sp, EVERY_DRAFT)
        assert first.stats.drafted_tokens > 0
        if sp.greedy or not proposer.drafts_with_q():
            assert first.token_ids == plain.token_ids
        else:  # a known q: the same law, other tokens than plain; the draft's randomness is seeded too
            again = _generate(engine, [make_draft_proposer(draft, engine.target, mode=mode, min_confidence=0.0)],
                              PROMPTS[1], sp, EVERY_DRAFT)
            assert again.token_ids == first.token_ids


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral", "gemma3_text"])
def test_lean_forward_on_cuda_equals_transformers(model_type):
    """A prompt, then a tree after it, against the model's own forward over each node's path (float32)."""
    from test_lean import _path_logits, _tiny

    from suffixspec.core.kv import SlotCache
    from suffixspec.core.lean import LeanForward, PassRow

    model = _tiny(model_type).to("cuda")
    lean = LeanForward(model)
    cache = SlotCache(1, capacity=16)
    cache.add_row()
    prompt = [(7 * i + 3) % 300 for i in range(20)]
    tokens, parents = [5, 6, 7, 8], [-1, 0, 0, 2]
    lean([PassRow(0, prompt[:-1], None, 0, "none")], cache)
    cache.lengths[0] = len(prompt) - 1
    got = lean([PassRow(0, [prompt[-1], *tokens], parents, len(prompt) - 1)], cache)[0]
    assert got.device.type == "cuda"
    for k, want in enumerate(_path_logits(model, prompt, tokens, parents)):
        assert float((got[k] - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max())), k
