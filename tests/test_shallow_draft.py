"""The shallow draft (suffixspec/proposers/shallow_draft.py): a few trained layers on the target's own
embedding and head rows. Saved and loaded back onto its target (the embedding shared, never copied;
another target refused), its logits cover the target vocabulary (-inf outside its head's tokens), and
with the engine's gates on: greedy output equals plain decoding, seeded sampling with argmax drafts
equals plain sampling, and sampled drafts (``q`` with zeros where ``p > 0``) keep the target's law.
"""

from __future__ import annotations

import pytest
import test_lossless_gates
import torch

from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.engine import Engine
from suffixspec.loading import load_model
from suffixspec.proposers.shallow_draft import (
    ShallowDraftProposer,
    build_draft_model,
    is_shallow_draft,
    load_shallow_draft,
    save_shallow_draft,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

toys = pytest.fixture(scope="module")(test_lossless_gates.toys.__wrapped__)  # the Markov toy, shared

PROMPTS = ["def add(a, b):\n", "The quick brown fox", "for i in range(10):\n\tprint("]


def _shallow(target, layers: int = 1, keep: float = 0.6, seed: int = 0):
    """A shallow draft on ``target``: ``layers`` layers copied from the target's first ones (noise
    added so it is not the target), its head the target's rows for a random ``keep`` of the vocabulary."""
    vocab = target.model.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(seed)
    head = torch.sort(torch.randperm(vocab, generator=g)[: int(keep * vocab)]).values
    cfg = target.model.config.__class__.from_dict({**target.model.config.to_dict(), "num_hidden_layers": layers})
    model = build_draft_model(cfg, target.model, head)
    with torch.no_grad():
        for mine, theirs in zip(model.model.layers, target.model.model.layers, strict=False):
            mine.load_state_dict(theirs.state_dict())
            for p in mine.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.1 * p.std())
        model.model.norm.load_state_dict(target.model.model.norm.state_dict())
    return model.eval()


@pytest.fixture(scope="module")
def target(tiny_model_dirs):
    return load_model(str(tiny_model_dirs["llama"]), device="cpu")


@pytest.fixture(scope="module")
def draft_dir(target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("shallow") / "draft"
    save_shallow_draft(_shallow(target), folder, "tiny-llama", {"note": "test"})
    return folder


def test_save_load_shares_the_embedding(target, draft_dir, tiny_model_dirs):
    assert is_shallow_draft(draft_dir) and not is_shallow_draft(tiny_model_dirs["llama"])
    names = set(__import__("safetensors.torch", fromlist=["load_file"]).load_file(str(draft_dir / "model.safetensors")))
    assert "head_tokens" in names and not any("embed" in n or "lm_head" in n for n in names)
    draft = load_shallow_draft(draft_dir, target)
    embed = target.model.get_input_embeddings().weight
    assert draft.model.get_input_embeddings().weight.data_ptr() == embed.data_ptr()
    head = draft.model.head_tokens
    torch.testing.assert_close(draft.model.get_output_embeddings().weight,
                               target.model.get_output_embeddings().weight[head])
    other = load_model(str(tiny_model_dirs["qwen2"]), device="cpu")  # same vocabulary and width, other weights
    with pytest.raises(ValueError, match="trained for"):
        load_shallow_draft(draft_dir, other)


def test_runner_logits_cover_the_target_vocabulary(target, draft_dir):
    draft = load_shallow_draft(draft_dir, target)
    proposer = ShallowDraftProposer(draft)
    ids = target.tokenizer.encode(PROMPTS[0])
    got = proposer.runner.logits_after(ids)  # lean forward, scattered to full width
    vocab = target.model.get_input_embeddings().weight.shape[0]
    head = draft.model.head_tokens
    assert got.shape == (vocab,)
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[head] = False
    assert torch.isinf(got[outside]).all() and torch.isfinite(got[head]).all()
    with torch.no_grad():
        ref = draft.model(input_ids=torch.tensor([ids])).logits[0, -1]  # transformers forward, [len(head)]
    torch.testing.assert_close(got[head], ref, atol=1e-4, rtol=1e-4)
    assert int(torch.argmax(got)) in set(head.tolist())


@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_equals_plain(target, draft_dir, adaptive):
    engine = Engine(target)
    proposer = ShallowDraftProposer(load_shallow_draft(draft_dir, target), min_confidence=0.0)
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    drafted = 0
    for prompt in PROMPTS:
        engine.proposers = []
        plain = engine.generate(prompt, sp, SpeculationConfig(enabled=False))
        engine.proposers = [proposer]
        spec = engine.generate(prompt, sp, SpeculationConfig(adaptive=adaptive))
        assert spec.token_ids == plain.token_ids, prompt
        drafted += spec.stats.drafted_tokens
    assert drafted > 0


def test_seeded_sampling_with_argmax_drafts_equals_plain(target, draft_dir):
    engine = Engine(target)
    proposer = ShallowDraftProposer(load_shallow_draft(draft_dir, target), sample=False, min_confidence=0.0)
    for seed in range(3):
        sp = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.8, seed=seed)
        engine.proposers = []
        plain = engine.generate(PROMPTS[seed], sp, SpeculationConfig(enabled=False))
        engine.proposers = [proposer]
        assert engine.generate(PROMPTS[seed], sp, SpeculationConfig(adaptive=False)).token_ids == plain.token_ids


@pytest.mark.slow
def test_sampled_drafts_keep_the_target_law_with_gates_on(toys):
    """The Markov toy of test_lossless_gates: the draft's layer is the toy's own (attention and MLP
    outputs zeroed), its head keeps 60% of the vocabulary, so ``q`` is ``p`` restricted and renormalized:
    zeros where ``p > 0``, the residual distribution carries the rest. Verify costs pinned so the gate
    skips some drafts and passes others."""
    from test_lossless_gates import SEEDS, PinnedCost, _run_seeds

    target = toys["target"]
    vocab = toys["T"].shape[0]
    head = torch.sort(torch.randperm(vocab, generator=torch.Generator().manual_seed(1))[: int(0.6 * vocab)]).values
    cfg = target.model.config.__class__.from_dict(target.model.config.to_dict())
    model = build_draft_model(cfg, target.model, head)
    model.model.layers[0].load_state_dict(target.model.model.layers[0].state_dict())
    model.model.norm.load_state_dict(target.model.model.norm.state_dict())
    from suffixspec.loading import LoadedModel

    draft = LoadedModel(model.eval(), target.tokenizer, "shallow-markov", "cpu", torch.float32)
    proposer = ShallowDraftProposer(draft, target_vocab_size=vocab)
    proposer.judges_own_cost = False  # the engine's gates judge it at these costs (as test_lossless_gates does)
    pvalues, counts = _run_seeds(toys, [proposer], PinnedCost(0.45))
    assert counts["passed"] > 0 and counts["skipped"] > 0, counts
    assert counts["accepted"] > 0.1 * SEEDS, counts
    assert min(pvalues) > 1e-3, (pvalues, counts)

