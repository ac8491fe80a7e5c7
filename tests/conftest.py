"""Shared fixtures: tiny real tokenizers and tiny random models built once per session (no network)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # run in the background by a non-interactive shell (`.ci/run &`): SIGINT is ignored, and every process
    # the tests start would inherit that; the tests that interrupt a writer with SIGINT need it back
    # (a handler here, unlike an ignored signal, is reset to the default in the children)
    signal.signal(signal.SIGINT, signal.default_int_handler)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n N: N workers share the cores, so each runs torch on one thread, and so do the CLI and
    # server processes its tests start (they inherit this); two-thread torch processes on cores that
    # are all busy spin-wait on each other and run several times slower.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"

from tiny import build_tiny_model, train_bpe_tokenizer, train_unigram_tokenizer  # noqa: E402

ARCHS = ("llama", "qwen2", "gpt2")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tiny_dir) -> Path:
    return train_bpe_tokenizer(tiny_dir / "bpe-tokenizer")


@pytest.fixture(scope="session")
def unigram_tokenizer_dir(tiny_dir) -> Path:
    return train_unigram_tokenizer(tiny_dir / "unigram-tokenizer")


@pytest.fixture(scope="session")
def tiny_model_dirs(tiny_dir, bpe_tokenizer_dir) -> dict[str, Path]:
    """One tiny random model directory per architecture, all sharing the BPE tokenizer."""
    return {arch: build_tiny_model(arch, bpe_tokenizer_dir, tiny_dir / f"tiny-{arch}") for arch in ARCHS}


@pytest.fixture(scope="session")
def tiny_draft_dir(tiny_dir, unigram_tokenizer_dir) -> Path:
    """A tiny random llama with a *different* (Unigram/Metaspace) tokenizer: a heterogeneous drafter."""
    return build_tiny_model("llama", unigram_tokenizer_dir, tiny_dir / "tiny-draft-unigram", seed=1, hidden=32)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run fastest on one thread, above all on a shared, busy machine (use per module:
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
