"""The lossless claims in reduced precision (bfloat16, float16) on the CPU, on the tiny models.

No kernel here is batch-invariant: a verify pass over ``1 + k`` tokens, a batch of rows and
``transformers``' own forward each round the same logits differently, by about one epsilon of the
dtype times the largest logit (bf16: 2^-7, fp16: 2^-10). So in reduced precision "identical" cannot
be token for token everywhere: a greedy or seeded output may change where the target's two best
choices are that close. What these tests hold every path to, in each dtype:

- the lean forward is as close to float32 as ``transformers``' own forward in that dtype (it runs
  on plain matrices there: oneDNN packing is float32 only), and the start-up probe accepts it;
- speculation on (oracle chains and trees, random trees) against off, ours against ``generate``,
  a batch against each row alone, greedy and seeded: wherever two outputs first differ, the two
  tokens are within a few epsilons of a tie in the model's own forward (``GAP``: a wrong mask, a
  wrong position or a verification bug moves them by a large part of the logits' range), and the
  share of outputs that differ stays under ``MAX_DIFFER``.

Measured rates: docs/lossless.md ("Reduced precision"); ``suffixspec/bench/bench_precision.py`` measures the
real model. Marked ``bf16`` (and slow): CI runs them.
"""

from __future__ import annotations

import pytest
import torch
from doubles import OracleProposer, RandomTreeProposer

from suffixspec.bench.bench_precision import first_difference, gap, generate_hf
from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.core.lean import LeanForward, PassRow
from suffixspec.core.runner import Runner
from suffixspec.core.scheduler import Scheduler
from suffixspec.core.weights import packs
from suffixspec.loading import load_model
from suffixspec.runtimes.engine import Engine

pytestmark = [pytest.mark.bf16, pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

DTYPES = ("bfloat16", "float16")
GAP = 8.0  # the largest gap (in epsilons of the largest logit) rounding may flip; measured: under 2
MAX_DIFFER = 0.5  # the share of outputs that may differ at such near-ties (measured: see the tests' sums)
PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n\t", "class Point:", "import os",
           "if x is None:"]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def engines(tiny_model_dirs) -> dict[tuple[str, str], Engine]:
    """Llama and Qwen2 (lean forward), GPT-2 (the model's own forward), in each reduced dtype."""
    return {(arch, dt): Engine(load_model(str(tiny_model_dirs[arch]), device="cpu", dtype=dt))
            for arch in ("llama", "qwen2", "gpt2") for dt in DTYPES}


def _tiny_lean_models(dtype: torch.dtype):
    from test_lean import _tiny

    return {mt: (_tiny(mt), _tiny(mt).to(dtype)) for mt in ("llama", "qwen2", "mistral", "gemma3_text")}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_lean_forward_in_reduced_precision_is_as_close_to_float32_as_transformers(dtype):
    """Every lean family in bf16/fp16: unpacked weights (oneDNN packing is float32 only), logits no further
    from the float32 model's than ``transformers``' own forward in that dtype is (plus one epsilon)."""
    import numpy as np
    from test_lean import VOCAB

    from suffixspec.core.kv import SlotCache

    assert not packs("cpu", dtype)
    prompt = [int(t) for t in np.random.RandomState(1).randint(3, VOCAB, size=20)]
    for mt, (full, reduced) in _tiny_lean_models(dtype).items():
        lean = LeanForward(reduced)
        assert not lean.onednn and lean.layers[0].plain is None, mt
        cache = SlotCache(1, capacity=16)
        cache.add_row()
        with torch.inference_mode():
            want = full(input_ids=torch.tensor([prompt])).logits[0].float()
            own = reduced(input_ids=torch.tensor([prompt])).logits[0].float()
        got = lean([PassRow(0, prompt, None, 0, "all")], cache)[0]
        scale = float(want.abs().max())
        eps = torch.finfo(dtype).eps
        assert float((got - want).abs().max()) <= float((own - want).abs().max()) + eps * scale, mt


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_batching_probe_accepts_reduced_precision(engines, arch, dtype):
    """The start-up probe's tolerance follows the dtype: the lean forward stays on and rows batch."""
    engine = engines[(arch, dtype)]
    runner = Runner(engine.model, rows=2)
    assert (runner.lean is not None) == (arch == "llama")
    assert runner.batch_problem() is None


def _check(pairs: list[tuple[list[int], list[int], list[int], int | None]], engine: Engine, what: str) -> int:
    """(prompt, reference, other, seed) per run: every first difference is a near-tie; returns how many differ."""
    differ = tokens = 0
    for prompt, ref, other, seed in pairs:
        at = first_difference(ref, other)
        tokens += len(ref) if at is None else at + 1
        if at is None:
            continue
        differ += 1
        g = gap(engine.model, prompt, ref, other, at, seed, engine.vocab_size)
        assert g <= GAP, f"{what}: outputs differ at {at} by {g:.1f} epsilons, more than rounding explains"
    print(f"{what}: {differ} of {len(pairs)} outputs differ, {tokens} tokens compared")  # the rates (pytest -s)
    assert differ <= MAX_DIFFER * len(pairs), f"{what}: {differ} of {len(pairs)} outputs differ"
    return differ


def _generate(engine: Engine, proposers, prompt: str, sp: SamplingParams, spec) -> list[int]:
    engine.proposers = list(proposers)
    try:
        return engine.generate(prompt, sp, spec).token_ids
    finally:
        engine.proposers = []


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_greedy_and_seeded_speculation_in_reduced_precision(engines, arch, dtype):
    """Speculation on (oracle chain, oracle tree, random tree; gates on and off) against off, greedy and
    seeded, and ours against ``generate``: differences only at near-ties."""
    engine = engines[(arch, dtype)]
    runs: dict[str, list] = {"ours vs generate": [], "spec vs plain": [], "seeded spec vs plain": []}
    accepted = 0
    for i, prompt in enumerate(PROMPTS):
        ids = engine.encode(prompt)
        greedy = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
        plain = _generate(engine, [], prompt, greedy, False)
        hf = generate_hf(engine.model, ids, MAX_TOKENS, eos=None)
        runs["ours vs generate"].append((ids, hf, plain, None))
        seeded = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=1.0, seed=i)
        s_plain = _generate(engine, [], prompt, seeded, False)
        for sp, ref, key in ((greedy, plain, "spec vs plain"), (seeded, s_plain, "seeded spec vs plain")):
            for proposer, spec in ((OracleProposer(ref, engine.vocab_size), SpeculationConfig(adaptive=False)),
                                   (OracleProposer(ref, engine.vocab_size, corrupt_every=3, branch=True), None),
                                   (RandomTreeProposer(sorted(set(ref)), seed=i), None)):
                engine.proposers = [proposer]
                try:
                    res = engine.generate(prompt, sp, spec)
                finally:
                    engine.proposers = []
                accepted += res.stats.accepted_tokens
                runs[key].append((ids, ref, res.token_ids, sp.seed))
    assert accepted > len(PROMPTS) * MAX_TOKENS  # verify passes over long drafts were exercised
    for what, pairs in runs.items():
        _check(pairs, engine, f"{arch} {dtype} {what}")


def _batched(engine: Engine, reqs: list[tuple[str, SamplingParams]], rows: int) -> tuple[list[list[int]], list[int]]:
    """Each request's tokens served ``rows`` at a time (random-tree drafts), joining as rows free up; and the
    batch size after each step."""
    engine.proposers = [RandomTreeProposer(list(range(3, 60)), seed=5)]
    try:
        sched = Scheduler(Runner(engine.model, rows, engine.prefix_store), lambda: engine.proposers, rows,
                          engine.policy)
        handles = []
        for p, sp in reqs:
            request, spc = engine.prepare(p, sp, None)
            handles.append(sched.submit(engine.state_maker(request, spc, None)))
        sizes = []
        while sched.running or sched.waiting:
            sched.step()
            sizes.append(sched.running)
    finally:
        engine.proposers = []
    results = []
    for h in handles:
        events = []
        while not h.events.empty():
            events.append(h.events.get())
        assert not isinstance(events[-1], BaseException), events[-1]
        results.append(events[-1].result.token_ids)
    return results, sizes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_batched_rows_in_reduced_precision(engines, arch, dtype):
    """Four rows in one pass (greedy and seeded, with drafts) against each alone: differences only at near-ties."""
    engine = engines[(arch, dtype)]
    cases = [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, **kw) for kw in
             ({}, {"temperature": 1.0, "seed": 1}, {}, {"temperature": 0.8, "seed": 2}, {}, {"temperature": 1.0, "seed": 3})]
    reqs = list(zip(PROMPTS, cases, strict=True))
    alone = [_generate(engine, [], p, sp, False) for p, sp in reqs]
    results, sizes = _batched(engine, reqs, 4)
    assert max(sizes) == 4
    _check([(engine.encode(p), a, b, sp.seed) for (p, sp), a, b in zip(reqs, alone, results, strict=True)],
           engine, f"{arch} {dtype} batched vs alone")


def test_the_near_tie_check_catches_a_real_difference(engines):
    """The control: two outputs that differ for a reason (a logit bias that moves one token by 3 logits, far
    more than rounding) fail the check that every other test here relies on."""
    engine = engines[("llama", "bfloat16")]
    sp = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    plain = _generate(engine, [], PROMPTS[0], sp, False)
    biased = _generate(engine, [], PROMPTS[0], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True,
                                                              logit_bias={plain[5]: -3.0}), False)
    assert first_difference(plain, biased) == 5
    with pytest.raises(AssertionError, match="more than rounding explains"):
        _check([(engine.encode(PROMPTS[0]), plain, biased, None)], engine, "control")
