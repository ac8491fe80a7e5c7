"""The batching probe's passing verdict, remembered in a converted model's folder (suffixspec/core/probe_cache.py).

Real files in a temporary folder, tiny real models: the probe's passes are counted by wrapping the
runner's real lean forward, so a test sees whether a start probed or read the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from suffixspec.core import probe_cache
from suffixspec.core.runner import Runner
from suffixspec.core.weights import packs
from suffixspec.loading import LoadedModel, load_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def llama(tiny_model_dirs) -> LoadedModel:
    return load_model(str(tiny_model_dirs["llama"]), device="cpu")


def counted(model, lean: bool = True) -> tuple[Runner, list[int]]:
    """A runner whose lean passes are counted (``calls[0]``); the probe runs some, reading the file none."""
    runner = Runner(model, rows=2, lean=lean)
    calls = [0]
    inner = runner.lean
    if inner is not None:
        def lean_pass(rows, cache):
            calls[0] += 1
            return inner(rows, cache)

        lean_pass.family, lean_pass.onednn = inner.family, inner.onednn  # what the key names the forward by
        runner.lean = lean_pass
    return runner, calls


# the entry of the tiny Llama's lean forward: its weights packed for oneDNN where that works (lean.packed)
LEAN_SLOT = "cpu torch.float32 lean llama" + (" onednn" if packs("cpu", torch.float32) else "")


def entries(folder: Path) -> dict:
    return json.loads((folder / probe_cache.FILE).read_text())


def test_a_pass_is_remembered_and_the_next_start_does_not_probe(llama, tmp_path):
    runner, calls = counted(llama.model)
    assert probe_cache.batch_problem(runner, tmp_path) is None
    assert calls[0] > 0
    slot, key = probe_cache.probe_key(runner)
    assert entries(tmp_path) == {slot: key}
    assert slot == LEAN_SLOT
    assert not list(tmp_path.glob(".*tmp*"))  # written through a temporary file, renamed into place

    again, calls = counted(llama.model)
    assert probe_cache.batch_problem(again, tmp_path) is None
    assert calls[0] == 0


@pytest.mark.parametrize("field", ["torch", "transformers", "code", "config", "attention", "version"])
def test_a_verdict_under_another_key_is_probed_again_and_replaced(llama, tmp_path, field):
    """An upgrade of torch or transformers, an edit of the forward code, another config or attention
    implementation, another layout of the file: the entry no longer holds."""
    runner, _ = counted(llama.model)
    slot, key = probe_cache.probe_key(runner)
    (tmp_path / probe_cache.FILE).write_text(json.dumps({slot: {**key, field: "written by another version"}}))
    runner, calls = counted(llama.model)
    assert probe_cache.batch_problem(runner, tmp_path) is None
    assert calls[0] > 0
    assert entries(tmp_path) == {slot: key}


@pytest.mark.parametrize("content", [b"", b"{not json", b"[1, 2]", b'{"cpu torch.float32 lean llama": "yes"}',
                                     b"\xff\xfe\x00", b'"a string"'])
def test_a_corrupt_file_is_ignored_and_rewritten(llama, tmp_path, content):
    (tmp_path / probe_cache.FILE).write_bytes(content)
    runner, calls = counted(llama.model)
    assert probe_cache.batch_problem(runner, tmp_path) is None
    assert calls[0] > 0
    slot, key = probe_cache.probe_key(runner)
    assert entries(tmp_path) == {slot: key}


def test_a_failing_verdict_is_not_remembered(llama, tmp_path):
    """A lean forward off by a little fails the probe at every start (its warning said each time)."""
    runner, _ = counted(llama.model)
    inner = runner.lean

    def off(rows, cache):
        out = inner(rows, cache)
        if len(rows) == 2 and rows[1].ids:  # the probe's batched pass
            out[0] = out[0].clone()
            out[0][0] += 0.5
        return out

    off.family, off.onednn = inner.family, inner.onednn
    runner.lean = off
    for _ in range(2):
        assert "differ from the model's own" in probe_cache.batch_problem(runner, tmp_path)
        assert not (tmp_path / probe_cache.FILE).exists()


def test_the_lean_and_the_padded_forward_are_remembered_apart(llama, tmp_path):
    lean, _ = counted(llama.model)
    padded, _ = counted(llama.model, lean=False)
    assert probe_cache.batch_problem(lean, tmp_path) is None
    assert probe_cache.batch_problem(padded, tmp_path) is None
    assert sorted(entries(tmp_path)) == [LEAN_SLOT, "cpu torch.float32 padded"]


def test_without_a_folder_every_start_probes(llama, tmp_path):
    for _ in range(2):
        runner, calls = counted(llama.model)
        assert probe_cache.batch_problem(runner, None) is None
        assert calls[0] > 0


def test_an_engine_on_a_converted_folder_remembers_and_generates_the_same(llama, tmp_path):
    """The engine reads and writes the file of its target's ``cache_folder``; a second engine on the same
    folder (no probe) generates exactly what an engine that probed generated."""
    from suffixspec.runtimes.engine import Engine

    folder = tmp_path / "converted"
    folder.mkdir()
    target = LoadedModel(llama.model, llama.tokenizer, "tiny", "cpu", llama.dtype, cache_folder=str(folder))
    first = Engine(target, max_num_seqs=2).generate(PROMPT)
    assert list(entries(folder)) == [LEAN_SLOT]
    second = Engine(target, max_num_seqs=2)
    assert second.generate(PROMPT).token_ids == first.token_ids
    assert second.batchable
    assert Engine(llama, max_num_seqs=2).generate(PROMPT).token_ids == first.token_ids  # no folder: probed


def test_without_the_forward_code_to_key_by_nothing_is_remembered(llama, tmp_path, monkeypatch):
    """An install whose sources cannot be read (only compiled files): every start probes."""
    monkeypatch.setattr(probe_cache, "_CODE", (*probe_cache._CODE, "not_a_module_here.py"))
    for _ in range(2):
        runner, calls = counted(llama.model)
        assert probe_cache.batch_problem(runner, tmp_path) is None
        assert calls[0] > 0
    assert not (tmp_path / probe_cache.FILE).exists()
