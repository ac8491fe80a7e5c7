"""Shared fixtures: tiny real tokenizers and tiny random models built once per session (no network)."""

from __future__ import annotations

import ast
import itertools
import os
import re
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


def _module_marks(path: Path) -> set[str]:
    """The marks a test file's module-level ``pytestmark`` gives each of its tests, read from the source
    (not imported): ``pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("x")]`` -> ``{"slow"}``."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            return {v.attr for v in values if isinstance(v, ast.Attribute) and ast.unparse(v.value) == "pytest.mark"}
    return set()


def _matches_none(markexpr: str, marks: set[str]) -> bool:
    """Whether no test carrying ``marks`` (and any others) can match the ``-m`` expression: it is false for
    every combination of the expression's other names. ``"not slow"`` and ``{"slow"}`` -> True."""
    keywords = {"and", "or", "not"}
    if set(re.findall(r"([A-Za-z_][\w.]*)\s*\(", markexpr)) - keywords:  # ``mark(key=value)``: not judged
        return False
    try:
        from _pytest.mark.expression import Expression

        expr = Expression.compile(markexpr)
    except Exception:  # noqa: BLE001 (pytest's own parse reports a bad expression)
        return False
    others = sorted(set(re.findall(r"[A-Za-z_][\w.]*", markexpr)) - keywords - marks)
    for held in itertools.product((False, True), repeat=len(others)):
        names = marks | {name for name, on in zip(others, held, strict=True) if on}
        if expr.evaluate(names.__contains__):
            return False
    return True


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A test file whose module-level marks no test of it could match under ``-m`` is not imported at all
    (``-m "not slow"`` and ``pytestmark = pytest.mark.slow``): deselecting its tests after importing it
    cost every xdist worker the imports of the fuzzers, the bench and the framework integrations."""
    markexpr = config.getoption("markexpr", default="")
    if markexpr and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        marks = _module_marks(collection_path)
        if marks and _matches_none(markexpr, marks):
            return True
    return None


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
