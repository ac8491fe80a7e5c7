"""The default models' training pipeline (tools/training, not installed): the held-out packages never reach the
training data, the corpus choice is deterministic, a stopped phase resumes to exactly the weights of
an uninterrupted one, and the loop metric counts repeats."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tools.training import data, evaluate
from tools.training.train_default_models import Checkpointer, batcher, train_loop


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

    from tools.training.train_default_models import RECIPE_FLAGS, check_recipe

    args = argparse.Namespace(**{k: 0 for k in RECIPE_FLAGS})
    args.code_rms, args.train_early = 64.0, True
    check_recipe(tmp_path, args)  # the first run records its recipe
    check_recipe(tmp_path, args)  # the same flags resume
    args.code_rms = 2.0
    with pytest.raises(ValueError, match="code_rms"):
        check_recipe(tmp_path, args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (--device cuda)")
def test_a_phase_trained_on_a_gpu_resumes_on_the_cpu(tmp_path):
    ckpt = Checkpointer(tmp_path, "t")
    model, maker = _tiny_model().to("cuda"), _Maker(3)
    train_loop(model, batcher(lambda p: [(maker.window, 2)]), lr=1e-2, minutes=60, max_steps=3, name="t",
               warmup=2, schedule="constant", maker=maker, ckpt=ckpt)  # batches built on the CPU move to the GPU
    resumed, stats = _run(5, ckpt)  # the CPU model loads the GPU state and goes on
    assert stats["steps"] == 5
    assert all(torch.isfinite(p).all() for p in resumed.parameters())

