"""Prompt-prefix reuse (suffixspec/prefix.py): outputs equal the prompt prefilled in full, on the
batch-1 path and in a batch, and the store keeps whole blocks within its budget."""

from __future__ import annotations

import pytest
import torch

from suffixspec.config import SamplingParams
from suffixspec.drafting.policy import Policy
from suffixspec.engine import Engine
from suffixspec.loading import load_model
from suffixspec.prefix import PrefixStore

HEAD = ("# Tools: read_file(path), write_file(path, text), run_tests()\n"
        "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n")
TASKS = ["# Step 1: add type hints\n", "# Step 2: fix the docstring\n", "# Step 3: add logging\n",
         "# Step 4: handle errors\n"]
CASES = [dict(max_tokens=24, ignore_eos=True), dict(max_tokens=20, ignore_eos=True, temperature=1.0, seed=7),
         dict(max_tokens=22, ignore_eos=True, temperature=0.8, top_k=30, seed=3),
         dict(max_tokens=18, ignore_eos=True, presence_penalty=0.5)]


def _block(n: int, fill: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [torch.full((2, n, 4), float(fill))], [torch.full((2, n, 4), -float(fill))]


def test_store_worked_example():
    """The module docstring's example, and the budget: least recently used blocks leave first."""
    store = PrefixStore(block=4, max_bytes=3 * 2 * 2 * 4 * 4 * 4)  # room for three blocks
    a = list(range(10))
    assert store.wanted(a, 0) == [4, 8]
    for end in (4, 8):
        store.put(a, end, *_block(4, end))
    n, blocks = store.lookup(a[:8] + [50, 51])
    assert n == 8 and [float(b[0][0][0, 0, 0]) for b in blocks] == [4.0, 8.0]
    assert store.lookup([0, 1, 2, 3, 4, 5, 60])[0] == 4
    assert store.lookup([9, 1, 2, 3, 4])[0] == 0
    assert store.wanted(a[:8] + [50, 51, 52, 53], 0) == [12]
    store.lookup(a[:4])  # block "0123" is now the most recently used
    store.put([7] * 8, 4, *_block(4, 1))
    store.put([7] * 8, 8, *_block(4, 2))  # a fourth block: "01234567" (least recently used) leaves
    assert len(store) == 3 and store.lookup(a)[0] == 4
    assert store.bytes == 3 * 2 * 2 * 4 * 4 * 4


@pytest.fixture(scope="module")
def targets(tiny_model_dirs):
    return {arch: load_model(str(path)) for arch, path in tiny_model_dirs.items()}


@pytest.mark.slow  # prefills per architecture, ~5 CPU s each
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_batch_1_reuse_equals_full_prefill(targets, arch):
    """Prompts sharing a long head, one after another: the later ones copy it, and every output
    (greedy, seeded, penalties) equals the prompt prefilled in full."""
    full = Engine(targets[arch], prefix_cache_mb=0)
    reusing = Engine(targets[arch])
    prompts = [HEAD + t for t in TASKS]
    assert len(full.encode(HEAD)) >= 2 * reusing.prefix_store.block
    for prompt, case in zip(prompts, CASES, strict=True):
        sp = SamplingParams(**case)
        want = full.generate(prompt, sp, speculation=False)
        got = reusing.generate(prompt, sp, speculation=False)
        assert got.token_ids == want.token_ids, (prompt, case)
    assert reusing.prefix_store.hits >= 3 * 2 * reusing.prefix_store.block  # three prompts copied the head


@pytest.mark.slow  # batched prefills, ~10 CPU s each
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_batched_joiners_reuse_equals_full_prefill(targets, arch):
    """Joiners sharing a head, some in the same step (the store is empty), some later (they copy it):
    every output equals the request alone with its prompt prefilled in full."""
    full = Engine(targets[arch], prefix_cache_mb=0)
    engine = Engine(targets[arch], max_num_seqs=4)
    reqs = [(HEAD + TASKS[i % 4] + "#" * (i // 4), SamplingParams(**CASES[i % 4])) for i in range(6)]
    alone = [full.generate(p, sp, speculation=False).token_ids for p, sp in reqs]
    sched = engine.scheduler
    assert sched.runner.lean is not None and sched.max_num_seqs == 4
    handles = []
    for i, (p, sp) in enumerate(reqs):
        request, spec = engine.prepare(p, sp, False)
        handles.append(sched.submit(engine.state_maker(request, spec, None)))
        if i in (1, 3):
            sched.step()
    while sched.running or sched.waiting:
        sched.step()
    assert engine.prefix_store.hits > 0
    for h, want, (p, sp) in zip(handles, alone, reqs, strict=True):
        events = []
        while not h.events.empty():
            events.append(h.events.get())
        assert events[-1].result is not None, events[-1]
        assert events[-1].result.token_ids == want, (p, sp)


def test_joiners_sharing_a_head_compute_it_once(targets, monkeypatch):
    """Four requests sharing a head join the batch together: one computes the head, the others wait
    one step and copy it (the store holds it then), so the head's tokens are fed once; every output
    equals the request alone with its prompt prefilled in full."""
    full = Engine(targets["llama"], prefix_cache_mb=0)
    engine = Engine(targets["llama"], max_num_seqs=4, policy=Policy(shared_prefill_min=16))
    reqs = [(HEAD + TASKS[i], SamplingParams(**CASES[i])) for i in range(4)]
    alone = [full.generate(p, sp, speculation=False).token_ids for p, sp in reqs]
    sched = engine.scheduler
    fed: list[int] = []  # prompt tokens computed per pass
    forward = sched.runner.forward
    monkeypatch.setattr(sched.runner, "forward", lambda rows: fed.append(
        sum(len(r.ids) for r in rows if r.logits == "none")) or forward(rows))
    handles = []
    for p, sp in reqs:
        request, spec = engine.prepare(p, sp, False)
        handles.append(sched.submit(engine.state_maker(request, spec, None), None, request.prompt_ids))
    while sched.running or sched.waiting:
        sched.step()
    head = len(engine.encode(HEAD))
    prompts = [len(engine.encode(p)) - 1 for p, _ in reqs]
    assert head >= 32
    assert sum(fed) <= sum(prompts) - 3 * (head - head % 16 - 16)  # the head (whole blocks) computed once
    assert fed[0] < prompts[0] + 16 and fed[1] > 0  # one joiner first, the others a step later
    for h, want in zip(handles, alone, strict=True):
        events = []
        while not h.events.empty():
            events.append(h.events.get())
        assert events[-1].result.token_ids == want


def test_prefix_cache_size_reaches_the_engine_from_every_entry_point(tiny_model_dirs):
    """`serve --prefix-cache-mb`, ServerConfig and SuffixSpec(prefix_cache_mb=) size (or switch off) the store."""
    from click.testing import CliRunner

    from suffixspec import SuffixSpec
    from suffixspec.cli import main
    from suffixspec.server.config import ServerConfig

    with SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=None, db=False, prefix_cache_mb=0) as off:
        assert off.engine.prefix_store is None
    with SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=None, db=False, prefix_cache_mb=1) as on:
        assert on.engine.prefix_store is not None and on.engine.prefix_store.max_bytes == 2**20
    for bad in (-1, "64", float("inf"), True):
        with pytest.raises(ValueError, match="prefix_cache_mb"):
            ServerConfig(prefix_cache_mb=bad)
    res = CliRunner().invoke(main, ["serve", "--help"])
    assert res.exit_code == 0 and "--prefix-cache-mb" in res.output
    res = CliRunner().invoke(main, ["serve", "--prefix-cache-mb", "-5"])
    assert res.exit_code == 2 and "prefix-cache-mb" in res.output
