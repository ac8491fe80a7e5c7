"""Engine: speculative output == plain output (greedy and seeded sampling), stops, KV integrity."""

from __future__ import annotations

import pytest
import torch

from suffixspec.budget import VerifyCost
from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.draft import Draft
from suffixspec.engine import Engine
from suffixspec.kv import keep_accepted, tree_inputs
from suffixspec.loading import load_model
from suffixspec.proposers.testing import OracleProposer, RandomTreeProposer, WrongProposer

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n\t"]
# Tests that assert on acceptance statistics switch the engine's cost gates off (they depend on
# measured times); the random-tree cases and the penalty test keep the default adaptive path.
EVERY_DRAFT = SpeculationConfig(adaptive=False)


@pytest.fixture(scope="module")
def engines(tiny_model_dirs) -> dict[str, Engine]:
    return {arch: Engine(load_model(str(path))) for arch, path in tiny_model_dirs.items()}


def _proposers(kind: str, plain: list[int], vocab: int):
    return {
        "oracle-chain": lambda: OracleProposer(plain, vocab),
        "oracle-partial-tree": lambda: OracleProposer(plain, vocab, corrupt_every=3, branch=True),
        "wrong": lambda: WrongProposer(plain, vocab),
        "random-tree": lambda: RandomTreeProposer(sorted(set(plain)), seed=7),
    }[kind]()


def _generate(engine: Engine, proposers, prompt, sampling, speculation=None):
    engine.proposers = list(proposers)
    try:
        return engine.generate(prompt, sampling, speculation)
    finally:
        engine.proposers = []


@pytest.mark.slow  # 4 drafters x 3 architectures, 5-25 CPU s each
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("kind", ["oracle-chain", "oracle-partial-tree", "wrong", "random-tree"])
def test_greedy_equals_plain(engines, arch, kind):
    engine = engines[arch]
    sp = SamplingParams(max_tokens=48, ignore_eos=True)
    for prompt in PROMPTS:
        plain = _generate(engine, [], prompt, sp, speculation=False)
        mode = None if kind == "random-tree" else EVERY_DRAFT
        spec = _generate(engine, [_proposers(kind, plain.token_ids, engine.vocab_size)], prompt, sp, mode)
        assert spec.token_ids == plain.token_ids
        assert spec.text == plain.text
        assert len(spec.token_ids) == 48
        if kind.startswith("oracle"):
            assert spec.stats.accepted_tokens > 0 and spec.stats.steps < plain.stats.steps
        if kind == "wrong":
            assert spec.stats.accepted_tokens == 0 and spec.stats.drafted_tokens > 0


SAMPLING_CASES = [
    dict(temperature=1.0, seed=1),
    dict(temperature=0.7, top_p=0.9, seed=2),
    dict(temperature=1.3, top_k=20, seed=3),
    dict(temperature=1.0, presence_penalty=0.8, frequency_penalty=0.5, seed=4),
    dict(temperature=0.9, logit_bias={5: 3.0, 17: -100.0}, seed=5),
]


@pytest.mark.slow  # a sweep of sampling settings x drafters x architectures
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("case", SAMPLING_CASES, ids=lambda c: ",".join(c))
@pytest.mark.parametrize("kind", ["oracle-partial-tree", "random-tree"])
def test_seeded_sampling_equals_plain(engines, arch, case, kind):
    engine = engines[arch]
    sp = SamplingParams(max_tokens=40, ignore_eos=True, **case)
    plain = _generate(engine, [], PROMPTS[0], sp, speculation=False)
    again = _generate(engine, [], PROMPTS[0], sp, speculation=False)
    assert again.token_ids == plain.token_ids  # the seed fixes the output
    mode = None if kind == "random-tree" else EVERY_DRAFT
    spec = _generate(engine, [_proposers(kind, plain.token_ids, engine.vocab_size)], PROMPTS[0], sp, mode)
    assert spec.token_ids == plain.token_ids
    if kind == "oracle-partial-tree":
        assert spec.stats.accepted_tokens > 0


def test_greedy_with_penalties_and_bias_equals_plain(engines):
    engine = engines["qwen2"]
    sp = SamplingParams(max_tokens=40, ignore_eos=True, presence_penalty=1.0, frequency_penalty=0.7,
                        logit_bias={3: 2.0})
    plain = _generate(engine, [], PROMPTS[1], sp, speculation=False)
    spec = _generate(engine, [OracleProposer(plain.token_ids, engine.vocab_size, corrupt_every=5, branch=True)],
                     PROMPTS[1], sp)
    assert spec.token_ids == plain.token_ids
    unpenalized = _generate(engine, [], PROMPTS[1], SamplingParams(max_tokens=40, ignore_eos=True), False)
    assert unpenalized.token_ids != plain.token_ids  # the penalties really act


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 33])
def test_max_tokens_exact_with_long_drafts(engines, max_tokens):
    engine = engines["llama"]
    sp = SamplingParams(max_tokens=60, ignore_eos=True)
    full = _generate(engine, [], PROMPTS[0], sp, speculation=False)
    short = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    spec = _generate(engine, [OracleProposer(full.token_ids, engine.vocab_size)], PROMPTS[0], short)
    assert spec.token_ids == full.token_ids[:max_tokens]
    assert spec.finish_reason == "length"


def test_end_token_inside_accepted_draft(engines):
    engine = engines["llama"]
    sp = SamplingParams(max_tokens=60, ignore_eos=True)
    full = _generate(engine, [], PROMPTS[2], sp, speculation=False)
    end = full.token_ids[12]
    first = full.token_ids.index(end)
    stop_sp = SamplingParams(max_tokens=60, stop_token_ids=[end])
    plain = _generate(engine, [], PROMPTS[2], stop_sp, speculation=False)
    spec = _generate(engine, [OracleProposer(full.token_ids, engine.vocab_size)], PROMPTS[2], stop_sp, EVERY_DRAFT)
    assert plain.token_ids == full.token_ids[: first + 1]
    assert spec.token_ids == plain.token_ids and spec.finish_reason == plain.finish_reason == "stop"
    assert spec.stats.accepted_tokens >= first  # the end token arrived inside an accepted draft


def test_stop_string_spanning_tokens(engines):
    engine = engines["gpt2"]
    sp = SamplingParams(max_tokens=60, ignore_eos=True)
    full = _generate(engine, [], PROMPTS[0], sp, speculation=False)
    # a stop string made of the text of tokens 20..22 (several tokens long)
    tok = engine.tokenizer
    before = tok.decode(full.token_ids[:20])
    stop = tok.decode(full.token_ids[:23])[len(before):]
    assert len(stop) >= 2
    stop_sp = SamplingParams(max_tokens=60, ignore_eos=True, stop=[stop])
    plain = _generate(engine, [], PROMPTS[0], stop_sp, speculation=False)
    spec = _generate(engine, [OracleProposer(full.token_ids, engine.vocab_size)], PROMPTS[0], stop_sp)
    assert plain.finish_reason == "stop" and spec.finish_reason == "stop"
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    assert stop not in spec.text and spec.text == tok.decode(full.token_ids)[: len(spec.text)]
    assert tok.decode(full.token_ids).startswith(spec.text + stop)


def test_stream_pieces_concatenate_to_text_with_sources(engines):
    engine = engines["llama"]
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    plain = _generate(engine, [], PROMPTS[0], sp, speculation=False)
    engine.proposers = [OracleProposer(plain.token_ids, engine.vocab_size, corrupt_every=4)]
    try:
        events = list(engine.stream(PROMPTS[0], sp, EVERY_DRAFT))
    finally:
        engine.proposers = []
    result = events[-1].result
    assert result is not None and result.token_ids == plain.token_ids
    assert "".join(e.text for e in events) == result.text
    assert all("".join(t for t, _ in e.pieces) == e.text for e in events)
    assert {s for e in events for _, s in e.pieces} >= {"target", "draft_model"}
    assert sum(len(e.token_ids) for e in events) == len(result.token_ids)


def test_cancel_stops_generation(engines):
    import threading

    engine = engines["llama"]
    cancel = threading.Event()
    stream = engine.stream(PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True), cancel=cancel)
    next(stream)
    cancel.set()
    last = list(stream)[-1].result
    assert last.finish_reason == "cancelled" and len(last.token_ids) < 200


def test_logprobs_match_between_paths(engines):
    engine = engines["llama"]
    sp = SamplingParams(max_tokens=20, ignore_eos=True, logprobs=3)
    plain = _generate(engine, [], PROMPTS[0], sp, speculation=False)
    spec = _generate(engine, [OracleProposer(plain.token_ids, engine.vocab_size)], PROMPTS[0], sp)
    assert len(spec.logprobs) == len(plain.logprobs) == 20
    engine.proposers = [OracleProposer(plain.token_ids, engine.vocab_size)]
    try:
        streamed = [e for ev in engine.stream(PROMPTS[0], sp) for e in (ev.logprobs or [])]
    finally:
        engine.proposers = []
    assert [e["token"] for e in streamed] == plain.token_ids
    for a, b in zip(spec.logprobs, plain.logprobs, strict=True):
        assert a["token"] == b["token"] and abs(a["logprob"] - b["logprob"]) < 1e-4
        assert [t for t, _ in a["top"]] == [t for t, _ in b["top"]]
        assert a["top"][0][1] >= a["logprob"] - 1e-9


def test_prompt_too_long_is_a_clear_error(engines):
    engine = engines["llama"]
    with pytest.raises(ValueError, match="context"):
        engine.generate([1] * (engine.max_context + 5), SamplingParams(max_tokens=2))


def test_speculation_config_validation():
    with pytest.raises(ValueError, match="unknown drafter"):
        SpeculationConfig(drafters=("prompt", "telepathy"))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_kv_cache_after_rejections_matches_fresh_forward(tiny_model_dirs, arch):
    """After tree passes with non-prefix accepted paths, the cache equals a fresh full forward."""
    from transformers import DynamicCache

    engine = Engine(load_model(str(tiny_model_dirs[arch])))
    model = engine.model
    seq = [5, 9, 13, 44, 61, 70]
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([seq[:-1]]), use_cache=True, **{engine._cache_kw: cache})
    committed = list(seq)
    past = len(seq) - 1
    trees = [  # (draft tokens, parents, accepted nodes)
        ([100, 101, 102, 103], [-1, -1, 1, 1], [1, 3]),  # accepted path skips nodes 0 and 2
        ([7, 8, 9], [-1, 0, 1], []),  # everything rejected
        ([30, 31, 32, 33, 34], [-1, 0, -1, 2, 3], [2, 3, 4]),
    ]
    for tokens, parents, accepted in trees:
        engine._forward([committed[-1], *tokens], cache, parents, past)
        keep_accepted(cache, past, [0] + [i + 1 for i in accepted])
        past += 1 + len(accepted)
        committed += [tokens[i] for i in accepted] + [3]  # 3 = the "target's token" of this step
    assert cache.get_seq_length() == len(committed) - 1
    cached = engine._forward([committed[-1]], cache, [], past)[-1]
    with torch.inference_mode():
        fresh = model(input_ids=torch.tensor([committed])).logits[0, -1].float()
    torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)


def test_tree_inputs_mask_and_positions():
    mask, pos = tree_inputs([-1, 0, 0], past=2, dtype=torch.float32, device="cpu")
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]]
    assert pos.tolist() == [[2, 3, 4, 4]]


class _SilentThenOracle(OracleProposer):
    """Drafts nothing for the first ``quiet`` output tokens, then the plain output; records budgets."""

    def __init__(self, expected, vocab_size, quiet: int) -> None:
        super().__init__(expected, vocab_size)
        self.quiet = quiet
        self.calls: list[tuple[int, int]] = []  # (output length, budget) per propose call

    def propose(self, context, budget):
        done = len(context) - self._prompt_len
        self.calls.append((done, budget))
        return super().propose(context, budget) if done >= self.quiet else Draft()


class _FlatCost(VerifyCost):
    """A verify pass costs the same at every size and measurements are ignored: the cost gates then
    pass every draft, whatever the machine's load (the budget rule is tested alone)."""

    def __init__(self) -> None:
        super().__init__(prior_slope=0.0)
        self.times = {1: 1.0}

    def observe(self, inputs: int, seconds: float) -> None:
        pass


@pytest.mark.slow  # long generations, ~6 CPU s
def test_budget_doubles_while_drafts_are_fully_accepted(engines, monkeypatch):
    engine = engines["llama"]
    sp = SamplingParams(max_tokens=200, ignore_eos=True)
    plain = _generate(engine, [], PROMPTS[0], sp, speculation=False)
    monkeypatch.setattr(engine, "verify_cost", _FlatCost())
    proposer = _SilentThenOracle(plain.token_ids, engine.vocab_size, quiet=20)
    spec = _generate(engine, [proposer], PROMPTS[0], sp, SpeculationConfig(max_draft_tokens=64))
    assert spec.token_ids == plain.token_ids
    copying = [b for done, b in proposer.calls if done >= 20]
    assert copying[0] <= 6  # 20 empty steps pulled the running mean down
    # each fully accepted draft doubles the next budget (slow start) up to the cap
    k = copying.index(64)
    assert k <= 5 and all(b < c for b, c in zip(copying[:k], copying[1:k + 1], strict=True))
