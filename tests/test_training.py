"""The default models' training pipeline (suffixspec/training): the held-out packages never reach the
training data, the corpus choice is deterministic, a stopped phase resumes to exactly the weights of
an uninterrupted one, and the loop metric counts repeats."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from suffixspec.training import data, evaluate
from suffixspec.training.train_default_models import Checkpointer, batcher, train_loop


def test_held_out_packages_are_never_trained_on():
    assert not set(data.TRAIN_PACKAGES) & set(data.EVAL_PACKAGES)
    train_paths = {p.resolve() for name, cap in data.TRAIN_PACKAGES.items() for p in data.package_files(name, cap)}
    held = [p.resolve() for name in data.EVAL_PACKAGES for p in data.package_files(name, None)]
    if not held:
        pytest.skip("none of the held-out packages is installed")
    assert not train_paths & set(held)
    for p in train_paths:  # no file of a held-out package inside a training package either
        assert not any(f"/{name}/" in p.as_posix().split("site-packages", 1)[-1] for name in data.EVAL_PACKAGES), p


def test_package_choice_is_deterministic_and_capped():
    a = data.package_files("click", 100_000)
    if not a:
        pytest.skip("click is not installed")
    assert a == data.package_files("click", 100_000)
    assert sum(p.stat().st_size for p in a) <= 100_000
    assert len(data.package_files("click", None)) > len(a)
    assert data.package_files("no_such_package_here", None) == []


def test_distinct_ngrams():
    assert evaluate.distinct_ngrams([1, 2, 3, 4, 1, 2, 3, 4, 1]) == pytest.approx(4 / 6)
    assert evaluate.distinct_ngrams(list(range(20))) == 1.0
    assert evaluate.distinct_ngrams([7] * 20) == pytest.approx(1 / 17)


class _Maker:
    """Random token windows from a seeded ``random.Random`` (what ``train_loop`` checkpoints)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def window(self):
        ids = np.array([self.rng.randrange(50) for _ in range(16)], dtype=np.int64)
        return ids, np.ones(16, dtype=bool)


def _tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def _run(steps: int, ckpt: Checkpointer | None):
    model, maker = _tiny_model(), _Maker(3)
    stats = train_loop(model, batcher(lambda p: [(maker.window, 2)]), lr=1e-2, minutes=60, max_steps=steps,
                       name="t", warmup=2, schedule="constant", maker=maker, ckpt=ckpt)
    return model, stats


def test_a_stopped_phase_resumes_to_the_same_weights(tmp_path):
    straight, _ = _run(6, None)
    ckpt = Checkpointer(tmp_path, "t")
    _, first = _run(3, ckpt)
    assert first["steps"] == 3 and ckpt.load()["done"]
    resumed, second = _run(6, ckpt)  # a larger budget goes on from step 3
    assert second["steps"] == 6
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    again, third = _run(6, ckpt)  # finished: nothing more is trained
    assert third["steps"] == 6
    assert all(torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), again.state_dict().values(),
                                                 strict=True))


def test_a_resume_with_another_recipe_is_refused(tmp_path):
    import argparse

    from suffixspec.training.train_default_models import RECIPE_FLAGS, check_recipe

    args = argparse.Namespace(**{k: 0 for k in RECIPE_FLAGS})
    args.code_rms, args.train_early = 64.0, True
    check_recipe(tmp_path, args)  # the first run records its recipe
    check_recipe(tmp_path, args)  # the same flags resume
    args.code_rms = 2.0
    with pytest.raises(ValueError, match="code_rms"):
        check_recipe(tmp_path, args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (gpu.sh's path)")
def test_a_phase_trained_on_a_gpu_resumes_on_the_cpu(tmp_path):
    ckpt = Checkpointer(tmp_path, "t")
    model, maker = _tiny_model().to("cuda"), _Maker(3)
    train_loop(model, batcher(lambda p: [(maker.window, 2)]), lr=1e-2, minutes=60, max_steps=3, name="t",
               warmup=2, schedule="constant", maker=maker, ckpt=ckpt)  # batches built on the CPU move to the GPU
    resumed, stats = _run(5, ckpt)  # the CPU model loads the GPU state and goes on
    assert stats["steps"] == 5
    assert all(torch.isfinite(p).all() for p in resumed.parameters())


# -- distillation of a shallow draft (suffixspec/training/distill.py) ------------------------------------


def test_acceptance_per_depth_worked_example():
    from suffixspec.training.distill import acceptance

    # agreement [1, 1, 0, 1]: chains from positions 0..3 reach depths 2, 1, 0, 1
    acc = acceptance([torch.tensor([1.0, 1.0, 0.0, 1.0])], depth=3)
    assert acc == pytest.approx([3 / 4, 1 / 3, 0 / 2])


def test_distillation_on_a_tiny_target(tiny_model_dirs, tmp_path, monkeypatch):
    """Teacher answers from batched generation (top-k log-probs per answer position), the head's
    vocabulary, KL training of a shallow draft that lowers its loss and resumes from its checkpoint,
    teacher-forced agreement, export and load onto the target."""
    from suffixspec.loading import load_model
    from suffixspec.proposers.shallow_draft import load_shallow_draft, save_shallow_draft
    from suffixspec.training import distill
    from suffixspec.training.train_default_models import Checkpointer

    torch.set_num_threads(1)
    target = load_model(str(tiny_model_dirs["llama"]), device="cpu")
    rows = distill.generate_batch(target.model, target.tokenizer, ["add two numbers", "a fox", "print it"],
                                  new_tokens=12, temperature=0.8, keep_top=8, seed=0)
    for r in rows:
        n = len(r["top_ids"])
        assert 1 <= n <= 12 and len(r["ids"]) == r["start"] + n and r["top_logp"].shape == (n, 8)
        assert torch.all(r["top_logp"][:, :-1] >= r["top_logp"][:, 1:])  # sorted, most likely first
    eos = target.tokenizer.eos_token_id
    head = distill.head_vocabulary(rows, 40, [eos])
    assert len(head) <= 40 and eos in head.tolist() and torch.all(head[1:] > head[:-1])
    batches = distill.TeacherBatches(rows, head, batch=3, max_len=64, seed=0)
    ids, targets, probs = batches()
    assert ids.shape[0] == 3 and torch.allclose(probs.sum(-1)[probs.sum(-1) > 0], torch.ones(1))

    model = distill.new_shallow(target.model, [0], head)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert model.get_input_embeddings().weight.requires_grad is False
    assert all(p.data_ptr() != target.model.get_input_embeddings().weight.data_ptr() for p in trained)
    with torch.no_grad():
        first = float(distill.kl_loss(model, distill.TeacherBatches(rows, head, 3, 64, seed=1)()))
    ckpt = Checkpointer(tmp_path, "train")
    from suffixspec.training.train_default_models import train_loop

    stats = train_loop(model, batches, 3e-3, minutes=60, max_steps=30, name="kd", warmup=2, maker=batches,
                       ckpt=ckpt, loss_fn=distill.kl_loss)
    assert stats["steps"] == 30 and ckpt.load()["done"]
    with torch.no_grad():
        after = float(distill.kl_loss(model, distill.TeacherBatches(rows, head, 3, 64, seed=1)()))
    assert after < first
    agree = distill.agreement(model.eval(), rows, model.head_tokens)
    assert [len(a) for a in agree] == [len(r["top_ids"]) for r in rows]

    save_shallow_draft(model, tmp_path / "draft", "tiny-llama")
    loaded = load_shallow_draft(tmp_path / "draft", target)
    x = rows[0]["ids"].long()[None]
    with torch.no_grad():  # float16 storage: close to the trained weights, not equal
        torch.testing.assert_close(loaded.model(input_ids=x).logits, model(input_ids=x).logits, atol=0.05, rtol=0.05)
