"""Continuous batching: every request in a batch gets exactly the tokens it gets alone.

The scheduler is driven step by step (``Scheduler.step``), so a test composes batches exactly:
requests join after a given step, leave when done or cancelled, and run side by side with other
temperatures, penalties, stop rules and drafts. The reference is the request run alone (plain
decoding, a batch of one).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Sequence

import pytest
import torch
from doubles import OracleProposer, RandomTreeProposer
from test_draft_model_proposer import _chi_square_z, _exact_pairs

from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.core.lean import PassRow
from suffixspec.core.runner import Runner
from suffixspec.core.scheduler import Scheduler
from suffixspec.drafting.draft import SOURCE_DRAFT_MODEL, Draft
from suffixspec.drafting.proposers import Proposer, RequestContext, make_proposer
from suffixspec.drafting.proposers.draft_model import DraftModelProposer
from suffixspec.loading import load_model
from suffixspec.runtimes.engine import Engine

pytestmark = pytest.mark.slow

EVERY_DRAFT = SpeculationConfig(adaptive=False)
PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):\n\t", "class Point:", "import os"]


@pytest.fixture(scope="module")
def engines(tiny_model_dirs, tmp_path_factory, bpe_tokenizer_dir) -> dict[str, Engine]:
    """float32 per architecture, the exact int8 format (``ARCH-int8``) of the lean families, and where the block
    kernel builds the gguf formats of tiny GGUF files (``llama-gguf16``: Q4_1 at ~15-bit activations,
    ``qwen2-gguf``: Q4_K with q/k/v biases), whose decode and verify passes run every layer in one native call and
    whose prompt passes run layer by layer."""
    from test_models import write_tiny_gguf

    from suffixspec.core import blockq, exact_attention

    out = {arch: Engine(load_model(str(path))) for arch, path in tiny_model_dirs.items()}
    for arch in ("llama", "qwen2"):
        out[f"{arch}-int8"] = Engine(load_model(str(tiny_model_dirs[arch]), weights="int8"))
    if blockq.kernel() is not None and exact_attention.kernel() is not None:  # (loaded before the cache moves)
        root = tmp_path_factory.mktemp("batch-gguf")
        with pytest.MonkeyPatch.context() as mp:  # the conversions in a cache of the test's own
            mp.setenv("SUFFIXSPEC_CACHE", str(root / "cache"))
            for name, arch, quant, hidden, weights in (("llama-gguf16", "llama", "Q4_1", 64, "gguf16"),
                                                       ("qwen2-gguf", "qwen2", "Q4_K", 256, "gguf")):
                path = write_tiny_gguf(root / f"{name}.gguf", bpe_tokenizer_dir, hidden=hidden, arch=arch,
                                       quant=quant)
                engine = out[name] = Engine(load_model(str(path), weights=weights))
                engine.warm_up()  # its lean forward built (from the file) while the cache is there
                assert engine.scheduler.runner.lean.stack is not None
    return out


class PromptOracle(OracleProposer):
    """An oracle that knows the plain output of every prompt (each request gets its own fork)."""

    def __init__(self, outputs: dict[tuple[int, ...], list[int]], vocab_size: int, **kw) -> None:
        super().__init__([], vocab_size, **kw)
        self.outputs = outputs

    def begin(self, request: RequestContext) -> None:
        super().begin(request)
        self.expected = self.outputs.get(tuple(request.prompt_ids), [])


def _alone(engine: Engine, prompt: str, sp: SamplingParams):
    engine.proposers = []
    return engine.generate(prompt, sp, speculation=False)


def _scheduler(engine: Engine, rows: int) -> Scheduler:
    """A scheduler of ``rows`` rows over the engine's model and proposers (the engine's own runs one)."""
    return Scheduler(Runner(engine.model, rows, engine.prefix_store, weights=engine.target.lean_kind),
                     lambda: engine.proposers, rows, engine.policy)


def _submit(engine: Engine, sched: Scheduler, prompt: str, sp: SamplingParams, spec=None,
            cancel: threading.Event | None = None):
    request, spc = engine.prepare(prompt, sp, spec)
    return sched.submit(engine.state_maker(request, spc, cancel), cancel)


def _result(handle):
    events = []
    while not handle.events.empty():
        events.append(handle.events.get())
    assert events and not isinstance(events[-1], BaseException), events[-1:]
    assert events[-1].result is not None
    streamed = [t for ev in events for t in ev.token_ids]
    assert streamed == events[-1].result.token_ids  # the stream carries every token once
    return events[-1].result


def _drain(sched: Scheduler, limit: int = 2000) -> list[int]:
    sizes = []
    while (sched.running or sched.waiting) and limit:
        sched.step()
        sizes.append(sched.running)
        limit -= 1
    return sizes


# Side by side in one batch: greedy, seeded with top-p / top-k / penalties / bias, a stop string,
# logprobs; each with its own max_tokens.
CASES = [
    dict(max_tokens=40, ignore_eos=True),
    dict(max_tokens=33, ignore_eos=True, temperature=1.0, seed=1),
    dict(max_tokens=25, ignore_eos=True, temperature=0.7, top_p=0.9, seed=2),
    dict(max_tokens=37, ignore_eos=True, temperature=1.3, top_k=20, seed=3, logprobs=2),
    dict(max_tokens=30, ignore_eos=True, temperature=1.0, presence_penalty=0.8, frequency_penalty=0.5, seed=4),
    dict(max_tokens=28, ignore_eos=True, presence_penalty=1.0, logit_bias={5: 3.0}, stop=["\n"]),
]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "llama-int8", "qwen2-int8", "llama-gguf16", "qwen2-gguf"])
@pytest.mark.parametrize("drafter", ["oracle-tree", "random-tree", "suffix", "suffix+model"])
def test_batched_outputs_equal_alone(engines, arch, drafter):
    """Greedy and seeded requests, joining at different steps, equal their plain runs alone. ``suffix+model``:
    the suffix index and a draft model drafting its argmax (no q) merge by node probability, the model
    vetting the index's surest chain. At the gguf formats a request joining mid-generation puts a prompt into
    a pass of the others' drafts: that pass runs layer by layer, the rest in one native call, one numerics."""
    if arch not in engines:
        pytest.skip("no C compiler: the block kernel cannot be built")
    engine = engines[arch]
    assert engine.batchable
    reqs = [(PROMPTS[i % len(PROMPTS)], SamplingParams(**case)) for i, case in enumerate(CASES)]
    alone = [_alone(engine, p, sp) for p, sp in reqs]
    outputs = {tuple(engine.encode(p)): a.token_ids for (p, _), a in zip(reqs, alone, strict=True)}
    engine.proposers = {
        "oracle-tree": lambda: [PromptOracle(outputs, engine.vocab_size, corrupt_every=4, branch=True)],
        "random-tree": lambda: [RandomTreeProposer(list(range(3, 60)), seed=5)],
        "suffix": lambda: [make_proposer("suffix", db=None, tokenizer=engine.tokenizer)],
        "suffix+model": lambda: [make_proposer("suffix", db=None, tokenizer=engine.tokenizer),
                                 DraftModelProposer(engine.target, sample=False)],
    }[drafter]()
    try:
        sched = _scheduler(engine, 4)
        handles = [_submit(engine, sched, p, sp, EVERY_DRAFT if i % 2 else None)
                   for i, (p, sp) in enumerate(reqs[:3])]
        sched.step()  # one step: with good drafts a request may finish within three, and the batch never fills
        handles += [_submit(engine, sched, p, sp) for p, sp in reqs[3:]]  # join mid-generation
        sizes = _drain(sched)
    finally:
        engine.proposers = []
    assert max(sizes) == 4 and min(sizes) < 4  # the batch was full, then drained as requests left
    results = [_result(h) for h in handles]
    for (prompt, sp), ref, res in zip(reqs, alone, results, strict=True):
        assert res.token_ids == ref.token_ids, (prompt, sp)
        assert res.text == ref.text and res.finish_reason == ref.finish_reason
        if sp.logprobs is not None:
            for a, b in zip(res.logprobs, ref.logprobs, strict=True):
                assert a["token"] == b["token"] and abs(a["logprob"] - b["logprob"]) < 1e-4
    if drafter == "oracle-tree":
        assert sum(r.stats.accepted_tokens for r in results) > 0


@pytest.mark.parametrize("arch", ["llama", "llama-int8"])
def test_batched_drafts_cut_at_a_stop_token_equal_alone(engines, arch, monkeypatch):
    """Drafts that run past a request's stop token (an oracle of the outputs without the stop, so every draft
    crosses it) are cut there in a batch as alone (``Draft.ending_at``): each request, greedy or seeded, with a
    stop token or without, equals its plain run alone and ends on its stop; cuts happened."""
    engine = engines[arch]
    free = [_alone(engine, p, SamplingParams(max_tokens=40, ignore_eos=True, **kw))
            for p, kw in zip(PROMPTS[:3], [{}, {"temperature": 1.0, "seed": 7}, {}], strict=True)]
    reqs = [(PROMPTS[0], SamplingParams(max_tokens=40, stop_token_ids=[free[0].token_ids[9]])),
            (PROMPTS[1], SamplingParams(max_tokens=40, temperature=1.0, seed=7, stop_token_ids=[free[1].token_ids[11]])),
            (PROMPTS[2], SamplingParams(max_tokens=40, ignore_eos=True))]
    alone = [_alone(engine, p, sp) for p, sp in reqs]
    assert [a.finish_reason for a in alone] == ["stop", "stop", "length"]
    outputs = {tuple(engine.encode(p)): f.token_ids for p, f in zip(PROMPTS[:3], free, strict=True)}
    cuts = []
    real = Draft.ending_at

    def counting(draft, stop_ids):
        out = real(draft, stop_ids)
        cuts.append(len(out.tokens) < len(draft.tokens))
        return out

    monkeypatch.setattr(Draft, "ending_at", counting)
    engine.proposers = [PromptOracle(outputs, engine.vocab_size, branch=True)]
    try:
        sched = _scheduler(engine, 3)
        handles = [_submit(engine, sched, p, sp, EVERY_DRAFT) for p, sp in reqs]
        assert max(_drain(sched)) == 3
    finally:
        engine.proposers = []
    for (prompt, sp), ref, res in zip(reqs, alone, [_result(h) for h in handles], strict=True):
        assert res.token_ids == ref.token_ids and res.finish_reason == ref.finish_reason, (prompt, sp)
    assert any(cuts)


def test_cancel_and_leave_mid_generation(engines):
    """A cancelled request leaves at once (a prefix of its output alone); the others are unchanged."""
    engine = engines["llama"]
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    alone = {p: _alone(engine, p, sp) for p in PROMPTS[:4]}
    engine.proposers = [make_proposer("suffix", db=None, tokenizer=engine.tokenizer)]
    try:
        sched = _scheduler(engine, 3)
        cancels = [threading.Event() for _ in range(4)]
        handles = [_submit(engine, sched, p, sp, cancel=c) for p, c in zip(PROMPTS[:4], cancels, strict=True)]
        cancels[3].set()  # gone while waiting: never prefilled, finishes "cancelled" with nothing
        for _ in range(4):
            sched.step()
        cancels[1].set()
        sched.step()
        assert sched.running == 2  # it left at the step after the cancel
        _drain(sched)
    finally:
        engine.proposers = []
    results = [_result(h) for h in handles]
    assert results[1].finish_reason == "cancelled"
    assert 0 < len(results[1].token_ids) < 40
    assert results[1].token_ids == alone[PROMPTS[1]].token_ids[: len(results[1].token_ids)]
    assert results[3].finish_reason == "cancelled" and results[3].token_ids == []
    for i in (0, 2):
        assert results[i].token_ids == alone[PROMPTS[i]].token_ids


class FixedQDraft(Proposer):
    """Draws a 2-token chain from a fixed, adversarial q (uniform over a few ids, zero where the
    target's likely tokens are), per request seeded: a known-q draft for the distribution test."""

    name = "fixed-q"

    def __init__(self, vocab: int, support: list[int]) -> None:
        self.q = torch.zeros(vocab)
        self.q[support] = 1.0 / len(support)
        self.gen = torch.Generator()

    def begin(self, request: RequestContext) -> None:
        self.gen = torch.Generator().manual_seed(1000 + (request.sampling.seed or 0))

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        k = min(2, budget)
        toks = torch.multinomial(self.q, k, replacement=True, generator=self.gen).tolist()
        return Draft(toks, list(range(-1, k - 1)), [SOURCE_DRAFT_MODEL] * k, q=self.q.expand(k, -1).clone(),
                     score=1.0, planned=k)  # its length is fixed before sampling


def test_batched_known_q_rows_keep_the_target_distribution(engines):
    """Sampled rows verified in a batch with known-q drafts: (t0, t1) follows plain sampling."""
    engine = engines["llama"]
    sp_kw = dict(temperature=1.0, top_k=4, max_tokens=2, ignore_eos=True)
    ids = engine.encode(PROMPTS[0])
    expected = _exact_pairs(engine.target, ids, SamplingParams(**sp_kw))
    likely = sorted({t for pair in expected for t in pair})
    support = likely[:2] + [t for t in range(3, 40) if t not in likely][:2]  # half overlap, half wrong
    engine.proposers = [FixedQDraft(engine.vocab_size, support)]
    n, seen, drafted, accepted = 240, Counter(), 0, 0
    try:
        sched = _scheduler(engine, 6)
        for start in range(0, n, 6):
            handles = [_submit(engine, sched, PROMPTS[0], SamplingParams(seed=s, **sp_kw), EVERY_DRAFT)
                       for s in range(start, start + 6)]
            # other rows (greedy, other prompts) share every pass
            others = [_submit(engine, sched, PROMPTS[2], SamplingParams(max_tokens=3))]
            _drain(sched)
            for h in handles:
                res = _result(h)
                seen[tuple(res.token_ids)] += 1
                drafted += res.stats.drafted_tokens
                accepted += res.stats.accepted_tokens
            _result(others[0])
    finally:
        engine.proposers = []
    assert drafted > 0 and 0 < accepted < drafted
    z = _chi_square_z(seen, expected, n)
    assert z < 3.5, (z, seen.most_common(5))


@pytest.mark.parametrize("packed", [False, True])
def test_cache_rows_match_fresh_forward(engines, packed):
    """After passes with rejected branches, rows of other lengths and a removed row, each row's
    cache gives a fresh forward's logits (the model's own padded pass with prompts prefilled one by
    one, and the packed lean pass with the prompts in one pass)."""
    engine = engines["llama"]
    runner = Runner(engine.model, 3, lean=packed)
    assert (runner.lean is not None) == packed
    runner.cache.capacity = 8  # small: the buffers grow on the way
    seqs = [engine.encode(p) for p in PROMPTS[:3]]
    rows = [runner.add_row() for _ in seqs]
    if packed:
        out = runner.forward([PassRow(r, s[:-1], None, 0, "none") for r, s in zip(rows, seqs, strict=True)])
        assert out == [None] * 3
        for r, s in zip(rows, seqs, strict=True):
            runner.set_length(r, len(s) - 1)
    else:
        for r, s in zip(rows, seqs, strict=True):
            runner.prefill(r, s[:-1])
    tree = Draft([5, 6, 7, 8], [-1, -1, 1, 2], ["prompt"] * 4)  # 5 | 6 -> 7 -> 8
    for step in range(4):
        order = [2, 0, 1] if packed else [0, 1, 2]  # the packed pass takes rows in any order
        drafts = {r: tree if r != 1 else Draft() for r in order}
        out = runner.forward([PassRow(r, [seqs[r][-1], *drafts[r].tokens], drafts[r].parents, runner.length(r))
                              for r in order])
        assert [len(o) for o in out] == [1 if r == 1 else 5 for r in order]
        for r, s in enumerate(seqs):
            path = [] if r == 1 else [1, 2, 3][: (step + r) % 4]  # accepted nodes: 6, 6 7, 6 7 8 or none
            runner.keep(r, runner.length(r), [0] + [k + 1 for k in path])
            s.extend([tree.tokens[k] for k in path] + [9 + r])
    runner.remove_row(0)
    seqs[0] = seqs.pop()  # the last row moved into row 0
    rows = list(range(len(seqs)))
    got = runner.forward([PassRow(r, [seqs[r][-1]], [], runner.length(r)) for r in rows])
    for r, s in enumerate(seqs):
        assert runner.length(r) == len(s) - 1
        with torch.inference_mode():
            fresh = engine.model(input_ids=torch.tensor([s])).logits[0, -1].float()
        torch.testing.assert_close(got[r][0], fresh, atol=1e-4, rtol=1e-4)


def test_padded_inputs_mask_positions(engines):
    """Two rows: a tree after 2 cached tokens, and a lone root after 1 (padded to width 3)."""
    runner = Runner(engines["gpt2"].model, 2)
    ids, mask, pos = runner._padded_inputs([PassRow(0, [9, 5, 6], [-1, -1], 2), PassRow(1, [4], [], 1)], 3, 5)
    allowed = (mask[:, 0] == 0).int().tolist()
    assert allowed[0] == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]
    assert allowed[1] == [[1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0]]  # pads see only themselves
    assert pos.tolist() == [[2, 3, 3], [1, 1, 1]]
    assert ids.tolist() == [[9, 5, 6], [4, 4, 4]]


def test_a_closed_batching_engine_exits_cleanly():
    """A script that batches, closes the engine and exits returns 0, not 134 ("terminate called without
    an active exception": a thread still stepping while the interpreter finalizes). The embedded target:
    its passes are large enough for torch's intra-op threads, which the tiny fixtures' are not."""
    script = ("import sys, threading\n"
              "from suffixspec.runtimes.engine import Engine\n"
              "from suffixspec.config import SamplingParams\n"
              "from suffixspec.loading import load_model\n"
              "engine = Engine(load_model(sys.argv[1]), max_num_seqs=2)\n"
              "ts = [threading.Thread(target=engine.generate, args=('def f(x):', SamplingParams(max_tokens=4)))"
              " for _ in range(2)]\n"
              "[t.start() for t in ts]; [t.join() for t in ts]\n"
              "engine.close()\n")
    done = subprocess.run([sys.executable, "-c", script, "suffixspec/demo-target"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_sliding_window_models_batch(tiny_dir, bpe_tokenizer_dir, arch):
    """Models with a 16-token window (Mistral: every layer, the lean pass; Gemma 2: alternating sliding
    and full layers, the model's own padded pass with a mask per layer type) pass the batching probe
    and run in a batch well past the window; every output equals the request alone."""
    from test_sliding_window import _build

    path = _build(arch, bpe_tokenizer_dir, tiny_dir / f"tiny-{arch}-window-batch")
    engine = Engine(load_model(str(path), device="cpu"), max_num_seqs=4)
    assert engine.batchable and engine.scheduler.max_num_seqs == 4
    assert (engine.scheduler.runner.lean is not None) == (arch == "mistral")
    reqs = [(PROMPTS[i % len(PROMPTS)], SamplingParams(**case)) for i, case in enumerate(CASES[:5])]
    alone = [_alone(engine, p, sp).token_ids for p, sp in reqs]
    engine.proposers = [RandomTreeProposer(list(range(3, 60)), seed=3)]
    try:
        sched = _scheduler(engine, 4)
        handles = [_submit(engine, sched, p, sp, EVERY_DRAFT) for p, sp in reqs]
        sizes = _drain(sched)
    finally:
        engine.proposers = []
    assert max(sizes) == 4
    assert [_result(h).token_ids for h in handles] == alone


def test_threaded_engine_concurrent_generate(engines, tiny_model_dirs):
    """Engine.generate from several threads with max_num_seqs > 1 shares passes; outputs equal alone."""
    engine = Engine(load_model(str(tiny_model_dirs["llama"])), max_num_seqs=4)
    reqs = [(PROMPTS[i % 5], SamplingParams(**CASES[i % len(CASES)])) for i in range(6)]
    alone = [_alone(engines["llama"], p, sp) for p, sp in reqs]
    rows: list[int] = []
    engine.step_observer = lambda record: rows.append(record.rows) if record.rows else None
    out: list = [None] * len(reqs)
    gate = threading.Barrier(len(reqs))

    def run(i: int) -> None:
        gate.wait()
        out[i] = engine.generate(reqs[i][0], reqs[i][1])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    assert [r.token_ids for r in out] == [a.token_ids for a in alone]
    assert rows and max(rows) <= 4
