"""Engine: speculative output == plain output (greedy and seeded sampling), stops, KV integrity, and
the one decode loop's behaviour for callers (a paused stream holds nobody up)."""

from __future__ import annotations

import pytest
import torch
from doubles import OracleProposer, RandomTreeProposer, WrongProposer

import suffixspec.core.scheduler as scheduler
from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.core.kv import tree_mask
from suffixspec.core.lean import PassRow
from suffixspec.core.runner import Runner
from suffixspec.drafting.costs import PassCost
from suffixspec.drafting.draft import Draft
from suffixspec.loading import load_model
from suffixspec.runtimes.engine import Engine

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


def test_no_node_below_a_stop_token_is_verified(engines, monkeypatch):
    """A draft that runs past a stop token (a copy of the prompt across the chat template's end of turn) is
    verified only up to it: what follows could never be output. With ``ignore_eos`` nothing is cut."""
    engine = engines["llama"]
    sp = SamplingParams(max_tokens=60, ignore_eos=True)
    full = _generate(engine, [], PROMPTS[2], sp, speculation=False)
    end = full.token_ids[12]
    verified: list[tuple[list[int], list[int]]] = []
    real = scheduler.verify_tree

    def spy(draft, *args, **kwargs):
        verified.append((list(draft.tokens), list(draft.parents)))
        return real(draft, *args, **kwargs)

    monkeypatch.setattr(scheduler, "verify_tree", spy)
    stop_sp = SamplingParams(max_tokens=60, stop_token_ids=[end])
    plain = _generate(engine, [], PROMPTS[2], stop_sp, speculation=False)
    spec = _generate(engine, [OracleProposer(full.token_ids, engine.vocab_size)], PROMPTS[2], stop_sp, EVERY_DRAFT)
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "stop"
    holding = [(t, p) for t, p in verified if end in t]
    assert holding  # the oracle drafted the stop token (and, before the cut, what follows it)
    for tokens, parents in verified:
        assert all(p < 0 or tokens[p] != end for p in parents), (tokens, parents)
    verified.clear()
    _generate(engine, [OracleProposer(full.token_ids, engine.vocab_size)], PROMPTS[2], sp, EVERY_DRAFT)
    assert any(p >= 0 and tokens[p] == end for tokens, parents in verified for p in parents)


def test_ignore_eos_still_stops_on_stop_token_ids(engines):
    """``ignore_eos`` passes the end-of-text tokens only (as vLLM's does): a token of ``stop_token_ids`` still
    ends the output, with speculation as without."""
    engine = engines["llama"]
    full = _generate(engine, [], PROMPTS[2], SamplingParams(max_tokens=60, ignore_eos=True), speculation=False)
    end = full.token_ids[12]
    sp = SamplingParams(max_tokens=60, ignore_eos=True, stop_token_ids=[end])
    plain = _generate(engine, [], PROMPTS[2], sp, speculation=False)
    spec = _generate(engine, [OracleProposer(full.token_ids, engine.vocab_size)], PROMPTS[2], sp, EVERY_DRAFT)
    assert plain.token_ids == full.token_ids[: full.token_ids.index(end) + 1] and plain.finish_reason == "stop"
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "stop"


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
    """After tree passes with non-prefix accepted paths, the row's cache gives a fresh full forward's
    logits (the lean pass for llama/qwen2, the model's own padded pass for gpt2)."""
    model = load_model(str(tiny_model_dirs[arch])).model
    runner = Runner(model)
    assert (runner.lean is not None) == (arch != "gpt2")
    row = runner.add_row()
    committed = [5, 9, 13, 44, 61, 70]
    runner.prefill(row, committed[:-1])
    trees = [  # (draft tokens, parents, accepted nodes)
        ([100, 101, 102, 103], [-1, -1, 1, 1], [1, 3]),  # accepted path skips nodes 0 and 2
        ([7, 8, 9], [-1, 0, 1], []),  # everything rejected
        ([30, 31, 32, 33, 34], [-1, 0, -1, 2, 3], [2, 3, 4]),
    ]
    for tokens, parents, accepted in trees:
        past = runner.length(row)
        runner.forward([PassRow(row, [committed[-1], *tokens], parents, past)])
        runner.keep(row, past, [0] + [i + 1 for i in accepted])
        committed += [tokens[i] for i in accepted] + [3]  # 3 = the "target's token" of this step
    assert runner.length(row) == len(committed) - 1
    cached = runner.forward([PassRow(row, [committed[-1]], [], runner.length(row))])[0][-1]
    with torch.inference_mode():
        fresh = model(input_ids=torch.tensor([committed])).logits[0, -1].float()
    torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)


def test_tree_mask_and_positions():
    """kv.tree_mask's worked example, a sliding window, and the cases that need no mask."""
    depth, masks = tree_mask([-1, 0, 0], past=2)
    assert depth.tolist() == [0, 1, 2, 2]
    assert masks[None].first == 0
    assert masks[None].allowed.astype(int).tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0],
                                                        [1, 1, 1, 1, 0, 1]]
    # window 2, past 3, a chain of 2 after the root: the root sees cached 2 and itself; node 1 the root
    # and itself; node 2 node 1 and itself (keys from position 2 on)
    depth, masks = tree_mask([-1, 0], past=3, windows=(2,))
    assert masks[2].first == 2
    assert masks[2].allowed.astype(int).tolist() == [[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    lone = tree_mask([], past=7, windows=(None, 4))[1]
    assert lone[None].allowed is None and lone[4].allowed is None and lone[4].first == 4
    prompt = tree_mask(None, past=0, windows=(None, 16), n=10)[1]
    assert prompt[None].causal and prompt[16].causal
    assert tree_mask(None, past=0, windows=(4,), n=10)[1][4].allowed is not None  # longer than the window


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


class _FlatCost(PassCost):
    """A pass costs the same at every size and measurements are ignored: the cost gates then pass every
    draft, whatever the machine's load (the budget rule is tested alone)."""

    def observe(self, inputs: int, seconds: float) -> None:
        pass

    def estimate(self, inputs: int) -> float:
        return 1.0


@pytest.mark.slow  # long generations, ~6 CPU s
def test_budget_doubles_while_drafts_are_fully_accepted(engines, monkeypatch):
    engine = engines["llama"]
    sp = SamplingParams(max_tokens=200, ignore_eos=True)
    plain = _generate(engine, [], PROMPTS[0], sp, speculation=False)
    monkeypatch.setattr(engine.scheduler, "cost", _FlatCost())
    proposer = _SilentThenOracle(plain.token_ids, engine.vocab_size, quiet=20)
    spec = _generate(engine, [proposer], PROMPTS[0], sp, SpeculationConfig(max_draft_tokens=64))
    assert spec.token_ids == plain.token_ids
    copying = [b for done, b in proposer.calls if done >= 20]
    assert copying[0] <= 6  # 20 empty steps pulled the running mean down
    # each fully accepted draft doubles the next budget (slow start) up to the cap
    k = copying.index(64)
    assert k <= 5 and all(b < c for b, c in zip(copying[:k], copying[1:k + 1], strict=True))


def test_a_paused_stream_holds_nobody_up(engines):
    """A caller reads one event of its stream and pauses; another request, on the same thread even,
    runs to its end meanwhile (the old engine held a lock across ``yield``: this deadlocked), and the
    paused stream then finishes with its own output."""
    engine = engines["llama"]
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    want = {p: engine.generate(p, sp, False).token_ids for p in PROMPTS[:2]}
    paused = engine.stream(PROMPTS[0], sp, False)
    first = next(paused)
    assert first.token_ids and first.result is None
    other = engine.generate(PROMPTS[1], sp, False)  # the engine runs one request at a time (max_num_seqs=1)
    assert other.token_ids == want[PROMPTS[1]]
    rest = list(paused)
    assert rest[-1].result.token_ids == want[PROMPTS[0]]
    assert first.token_ids + [t for ev in rest for t in ev.token_ids] == want[PROMPTS[0]]


def test_a_stream_left_unread_leaves_the_batch(engines):
    """A stream closed after its first event cancels its request at once: its row is free and its
    proposers are told it ended (with the tokens it got)."""
    engine = engines["llama"]
    ended: list[list[int]] = []

    class Recorder(WrongProposer):
        def end(self, output_ids):
            ended.append(list(output_ids))

    engine.proposers = [Recorder([], engine.vocab_size)]
    try:
        stream = engine.stream(PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True))
        first = next(stream)
        stream.close()
    finally:
        engine.proposers = []
    assert engine.scheduler.running == 0 and engine.scheduler.waiting == 0
    assert ended == [first.token_ids]


def test_generate_runs_on_the_callers_thread_without_a_thread_of_its_own(engines):
    import threading

    engine = engines["llama"]
    before = threading.active_count()
    engine.generate(PROMPTS[0], SamplingParams(max_tokens=5, ignore_eos=True))
    assert threading.active_count() == before


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_models_observers_see_every_pass(engines, arch):
    """A forward pre-hook on the target (a pass counter, a profiler) sees every pass of a request, the
    lean ones too (they do not go through ``model.forward``), and none of the batching probe's."""
    engine = engines[arch]
    calls: list[int] = []
    hook = engine.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        fresh = Engine(engine.target)
        res = fresh.generate(PROMPTS[0], SamplingParams(max_tokens=10, ignore_eos=True), False)
    finally:
        hook.remove()
    assert len(calls) == res.stats.steps + 1  # the prompt's pass, then one per step


def test_a_new_proposer_set_starts_with_empty_records(engines):
    """The records shared across requests belong to the proposer set itself: a set made after another was
    dropped starts empty even when Python puts its proposers at the dead ones' addresses (keyed by ``id()``,
    most of 50 fresh sets took a dead set's records), and a set still in use keeps its own."""
    from suffixspec.drafting.gates import ProposerRecord

    engine = engines["llama"]
    request, spec = engine.prepare("def add(a, b):")
    kept = [WrongProposer([1], 8)]
    engine.proposers = kept
    engine.state_maker(request, spec, None)(kept).shared[0] = ProposerRecord(seconds=9.0)
    addresses: set[int] = set()
    reused = 0
    for _ in range(50):
        engine.proposers = [WrongProposer([1], 8)]
        reused += id(engine.proposers[0]) in addresses
        addresses.add(id(engine.proposers[0]))
        shared = engine.state_maker(request, spec, None)(engine.proposers).shared
        assert shared == {}, shared  # nothing of a dead set's records
        shared[0] = ProposerRecord(seconds=1.0)
        engine.proposers = []  # the last reference: the set dies here (no gc.collect: 0.2-0.5 s a call)
    assert reused > 0  # Python did put new proposers at dead ones' addresses: the test can fail on id() keys
    engine.proposers = kept
    assert engine.state_maker(request, spec, None)(kept).shared[0].seconds == 9.0
    assert len(engine._shared) <= 2  # dropped sets' records went with them
    engine.proposers = []


def test_the_heap_is_trimmed_when_the_batch_empties(engines, monkeypatch):
    """glibc keeps the heap a pass's large temporaries freed (the Qwen 1.5B grew 0.7 GiB over six code edits):
    when its last request leaves, the scheduler gives it back, and never while a request is still in it."""
    engine = engines["llama"]
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr("suffixspec.core.scheduler.trim_heap",
                        lambda: seen.append((engine.scheduler.running, engine.scheduler.waiting)))
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    engine.generate(PROMPTS[0], sp, False)
    assert seen == [(0, 0)]
    paused = engine.stream(PROMPTS[0], sp, False)
    next(paused)
    engine.generate(PROMPTS[1], sp, False)  # ends while the paused stream's request is still in the engine
    list(paused)
    assert seen[-1] == (0, 0) and all(s == (0, 0) for s in seen) and len(seen) >= 2
