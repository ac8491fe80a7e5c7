"""Prompt-prefix reuse (suffixspec/core/prefix.py): outputs equal the prompt prefilled in full, on the
batch-1 path and in a batch, and the store keeps whole blocks within its budget."""

from __future__ import annotations

import pytest
import torch

from suffixspec.config import SamplingParams
from suffixspec.core.prefix import PrefixStore
from suffixspec.drafting.policy import Policy
from suffixspec.loading import load_model
from suffixspec.runtimes.engine import Engine

HEAD = ("# Tools: read_file(path), write_file(path, text), run_tests()\n"
        "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n")
TASKS = ["# Step 1: add type hints\n", "# Step 2: fix the docstring\n", "# Step 3: add logging\n",
         "# Step 4: handle errors\n"]
CASES = [dict(max_tokens=24, ignore_eos=True), dict(max_tokens=20, ignore_eos=True, temperature=1.0, seed=7),
         dict(max_tokens=22, ignore_eos=True, temperature=0.8, top_k=30, seed=3),
         dict(max_tokens=18, ignore_eos=True, presence_penalty=0.5)]


def _block(n: int, fill: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer keys and values (two layers) of ``n`` positions, filled with ``fill`` (and ``-fill``)."""
    return [torch.full((2, n, 4), float(fill))] * 2, [torch.full((2, n, 4), -float(fill))] * 2


def _marker(ids) -> float:
    """A value naming a whole prefix: what its last block's tensors hold in these tests."""
    return float(hash(tuple(ids)) % 100_003)


def _fill(store: PrefixStore, ids) -> int:
    """Store ``ids``'s missing blocks, each holding the marker of the prefix up to its end."""
    return store.fill(ids, lambda start, end: _block(end - start, _marker(ids[:end])))


def _found(store: PrefixStore, ids) -> int:
    """Positions a lookup finds, checking each block is the one computed for this very prefix."""
    n, blocks = store.lookup(ids)
    for i, (keys, values) in enumerate(blocks):
        end = (i + 1) * store.block
        assert float(keys[0][0, 0, 0]) == _marker(ids[:end]) == -float(values[1][0, 0, 0])
    return n


def _block_bytes(block: int) -> int:
    """What one stored block of ``_block`` costs the store, keys included."""
    probe = PrefixStore(block=block)
    _fill(probe, list(range(block)))
    return probe.bytes


def test_store_worked_example():
    """The module docstring's example: whole blocks found, the rest fed; a tail evicted, never a head."""
    store = PrefixStore(block=4, max_bytes=2 * _block_bytes(4))  # room for two blocks
    a = list(range(10))
    assert _fill(store, a) == 2 and store.covered(a) == 8
    assert _found(store, a[:8] + [50, 51]) == 8
    assert _found(store, [0, 1, 2, 3, 4, 5, 60]) == 4
    assert _found(store, [9, 1, 2, 3, 4]) == 0
    assert _fill(store, a) == 0  # nothing missing
    assert _fill(store, [20, 21, 22, 23]) == 1  # a third block: "4567" (the least recently used tail) leaves
    assert len(store) == 2 and _found(store, a) == 4 and _found(store, [20, 21, 22, 23]) == 4
    assert store.bytes == 2 * _block_bytes(4) <= store.max_bytes


@pytest.mark.parametrize("touch", ["lookup", "covered", "none"])
def test_a_chain_survives_one_block_over_budget(touch):
    """A 128-token prompt's 8 blocks fill the budget; one more block from another prompt costs the chain its
    tail block only: 112 of its 128 positions are still found (evicting its head, the least recently
    touched block when a lookup touches head first, left 7 blocks stored and 0 positions reusable)."""
    per = _block_bytes(16)
    store = PrefixStore(block=16, max_bytes=8 * per)
    chain = list(range(1000, 1128))
    assert _fill(store, chain) == 8 and len(store) == 8
    if touch == "lookup":
        assert _found(store, chain) == 128
    elif touch == "covered":
        assert store.covered(chain) == 128
    assert _fill(store, list(range(5000, 5016))) == 1
    assert len(store) == 8 and store.bytes <= store.max_bytes
    assert _found(store, chain) == 112
    # more blocks: the other prompt's block goes first (the lookup just used the chain), then the chain
    # shrinks from its end, a block each
    for extra, left in ((2, 112), (3, 96), (4, 80)):
        _fill(store, list(range(1000 * extra, 1000 * extra + 16)))
        assert store.covered(chain) == left and len(store) == 8


def test_eviction_keeps_every_stored_block_reachable():
    """Prompts sharing heads (a tree of blocks), looked up and stored in a random order under a budget of 12
    blocks: the store never exceeds its budget, never holds a block whose parent is gone (stored but
    unreachable), and every lookup finds the blocks computed for that very prefix."""
    import random

    rng = random.Random(0)
    per = _block_bytes(4)
    store = PrefixStore(block=4, max_bytes=12 * per)
    heads = [[rng.randrange(50) for _ in range(4 * rng.randrange(1, 5))] for _ in range(5)]
    for _ in range(400):
        ids = rng.choice(heads) + [rng.randrange(50) for _ in range(4 * rng.randrange(0, 4) + rng.randrange(4))]
        if rng.random() < 0.5:
            _found(store, ids)
        else:
            _fill(store, ids)
        blocks = store._blocks
        assert store.bytes == sum(b.size for b in blocks.values()) == len(blocks) * per <= store.max_bytes
        assert all(b.parent is None or b.parent in blocks for b in blocks.values())
        assert all(b.children == sum(c.parent == k for c in blocks.values()) for k, b in blocks.items())


def test_keys_are_counted_and_constant_in_size(monkeypatch):
    """A block's key is its parent's key and its own tokens: every hash reads one block's tokens, however
    deep the block (whole-prefix keys held 2.1M token references for an 8k-token prompt), and the budget
    counts the keys: an 8192-token prompt's 512 blocks cost exactly 512 times one block's tensors and key."""
    import suffixspec.core.prefix as prefix

    hashed: list[int] = []

    def counting(parent, tokens):
        hashed.append(len(tokens))
        return hash((parent, tokens))

    monkeypatch.setattr(prefix, "block_key", counting)
    store = PrefixStore(block=16)
    ids = [(7919 * i) % 49152 for i in range(8192)]
    assert store.lookup(ids)[0] == 0 and len(hashed) == 1  # an empty store: one block hashed, then a miss
    assert store.covered(ids) == 0 and len(hashed) == 2
    hashed.clear()
    assert _fill(store, ids) == 512 and len(hashed) == 512  # each block hashed once
    tensors = 2 * 2 * (2 * 16 * 4 * 4)  # keys and values, two layers of [2, 16, 4] float32
    assert store.bytes == 512 * _block_bytes(16) and _block_bytes(16) - tensors < 512  # keys: a few hundred bytes
    hashed.clear()
    assert store.covered(ids) == 8192 and store.lookup(ids)[0] == 8192 and _fill(store, ids) == 0
    assert len(hashed) == 3 * 512 and set(hashed) == {8 * 16}  # one block's tokens per hash, at every depth


def test_a_hash_collision_is_a_miss_never_another_prompts_keys(monkeypatch):
    """Every key colliding: a block is found only under its own parent and tokens, else not at all."""
    import suffixspec.core.prefix as prefix

    monkeypatch.setattr(prefix, "block_key", lambda parent, tokens: 7)
    store = PrefixStore(block=4)
    a, b = list(range(12)), list(range(100, 112))
    assert _fill(store, a) == 1  # its second block's key is taken by its first: not stored
    assert _found(store, a) == 4 and _found(store, b) == 0 and _fill(store, b) == 0
    assert _found(store, a[:4] + b[4:]) == 4


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
