"""Weight formats (suffixspec/core/weights.py): the exact int8 product, the probe, the option, batch invariance.

The int8 format is offered as exact: a token's logits must not depend on what else shares the pass. The
tests below compare, bit for bit, one row's logits from a pass of its own (its tokens fed one at a time,
as plain decoding feeds them) with the same row inside packed passes of 1, 2, 8, 17 and 32 tokens next
to other rows, tree drafts and prompts, on every lean family; then whole generations with speculation on
and off, alone and batched, greedy and seeded. A control runs the same comparison on the float32 lean
forward, which is not batch-invariant (its grouped SDPA rounds differently), so the check is shown to bite.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from test_lean import VOCAB, _tiny

import suffixspec.core.formats as P
import suffixspec.core.weights as W
from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.core import exact_attention
from suffixspec.core.kv import SlotCache
from suffixspec.core.lean import LeanForward, PassRow, lean_forward
from suffixspec.loading import load_model
from suffixspec.runtimes.engine import Engine

FAMILIES = ("llama", "qwen2", "mistral", "gemma3_text")


def _kernels() -> list[str]:
    out = []
    if W.int8_works():
        out.append("fbgemm")
    try:
        torch._int_mm(torch.ones(1, 8, dtype=torch.int8), torch.ones(8, 8, dtype=torch.int8))
        out.append("int_mm")
    except (RuntimeError, AttributeError):
        pass
    return out


# -- the product ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", _kernels())
def test_a_row_of_the_int8_product_is_the_same_alone_and_among_any_rows(kernel):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 72, generator=gen)
    x = torch.randn(33, 72, generator=gen) * torch.rand(33, 1, generator=gen) * 10  # rows of very different sizes
    x[5] = 0.0  # an all-zero row (scale 1, not a division by zero)
    weight = W.RowInt8Weight(w, kernel)
    b = torch.randn(96, generator=gen)
    whole = weight.mm(x, b)
    for rows in ([0], [5], [3, 4], list(range(8)), list(range(9, 26)), list(range(1, 33))):
        part = weight.mm(x[rows], b)
        for j, i in enumerate(rows):
            assert torch.equal(part[j], whole[i]), (kernel, rows, i)
    want = x @ w.t() + b
    assert float((whole - want).abs().max()) <= 0.04 * float(want.abs().max())  # close to float32
    assert torch.equal(whole[5], b.expand(1, -1)[0])


def test_the_int_mm_kernel_is_the_integer_product_scaled():
    if "int_mm" not in _kernels():
        pytest.skip("torch._int_mm does not run here")
    w = torch.tensor([[0.5, -1.0, 0.25], [2.0, 0.0, -2.0]])
    x = torch.tensor([[1.0, 2.0, -4.0]])
    weight = W.RowInt8Weight(w, "int_mm")
    assert weight.q.tolist() == [[64, -127, 32], [127, 0, -127]]  # the module docstring's worked example
    got = weight.mm(x)
    assert torch.allclose(got, torch.tensor([[-10144 * 4 / 127 / 127, 20193 * 4 / 127 * 2 / 127]]), rtol=1e-6)


def test_int8_rows_dequantize_a_lookup_and_a_tied_head_shares_them():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(50, 24, generator=gen)
    rows = W.Int8Rows(w)
    got = rows.rows(torch.tensor([3, 3, 49]))
    assert got.shape == (3, 24) and torch.equal(got[0], got[1])
    assert float((got[2] - w[49]).abs().max()) <= float(w[49].abs().max()) / 127
    for kernel in _kernels():
        shared = W.RowInt8Weight(w, kernel).as_rows()
        assert float((shared.rows(torch.tensor([7]))[0] - w[7]).abs().max()) <= 2 * float(w[7].abs().max()) / 127


# -- the probe and the option --------------------------------------------------------------------------------
def test_the_probe_verdict_is_remembered_per_machine_and_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SUFFIXSPEC_INT8", raising=False)
    P.int8_verdict.cache_clear()
    try:
        verdict = P.int8_verdict()
        assert set(verdict) >= {"use", "kernel", "why", "float32_ms"}
        assert verdict["kernel"] in (*W.KERNELS, None) and (verdict["kernel"] is not None or not verdict["use"])
        stored = json.loads((tmp_path / "suffixspec" / "formats.json").read_text())
        (key, entry), = stored.items()
        assert "torch" in key and entry == verdict
        # a remembered verdict is read, not probed again (here: one written by hand)
        stored[key] = {**entry, "use": not entry["use"], "why": "remembered"}
        (tmp_path / "suffixspec" / "formats.json").write_text(json.dumps(stored))
        P.int8_verdict.cache_clear()
        assert P.int8_verdict()["why"] == "remembered"
    finally:
        P.int8_verdict.cache_clear()


def test_the_int8_kernel_can_be_named(monkeypatch):
    for kernel in W.KERNELS:
        monkeypatch.setenv("SUFFIXSPEC_INT8_KERNEL", kernel)
        assert P.int8_kernel() == kernel
    monkeypatch.setenv("SUFFIXSPEC_INT8_KERNEL", "vnni")
    with pytest.raises(ValueError, match="set it to one of int_mm, fbgemm, or unset it"):
        P.int8_kernel()


@pytest.mark.parametrize("forced, want", [("1", "int8"), ("0", "float32")])
def test_auto_is_int8_on_a_cpu_where_the_probe_says_so(monkeypatch, forced, want):
    monkeypatch.setenv("SUFFIXSPEC_INT8", forced)
    P.int8_verdict.cache_clear()
    try:
        assert P.resolve("auto", "cpu") == want
        assert P.resolve(None, "cpu") == want
    finally:
        P.int8_verdict.cache_clear()


def test_the_option_names_and_the_older_dtype():
    assert P.resolve("int8", "cpu") == "int8"
    assert P.resolve("bf16", "cpu") == "bfloat16"
    assert P.resolve("auto", "cpu", dtype="float16") == "float16"  # --dtype alone still chooses
    assert P.resolve("float32", "cpu", dtype="fp32") == "float32"
    with pytest.raises(ValueError, match="disagree"):
        P.resolve("int8", "cpu", dtype="bfloat16")
    with pytest.raises(ValueError, match="unknown weights format 'int4'"):
        P.resolve("int4", "cpu")
    with pytest.raises(ValueError, match="a CPU format"):
        P.resolve("int8", "cuda")


# -- the lean forward: one row's logits whatever shares the pass ---------------------------------------------
def _alone(lean: LeanForward, prompt: list[int], tokens: list[int], parents: list[int]) -> dict[int, torch.Tensor]:
    """Logits after ``prompt`` and after each node's path (node -1: the prompt alone), as plain decoding gets
    them: the prompt prefilled, then the path's tokens fed one at a time. One decode per leaf gives every node
    on its path (a node's logits do not depend on the tokens fed after it), not one decode per node."""
    children = {parent for parent in parents}
    leaves = [k for k in range(len(tokens)) if k not in children] or [-1]
    out: dict[int, torch.Tensor] = {}
    for leaf in leaves:
        path, node = [], leaf
        while node >= 0:
            path.append(node)
            node = parents[node]
        cache = SlotCache(1, capacity=64)
        row = cache.add_row()
        lean([PassRow(row, prompt[:-1], None, 0, "none")], cache)
        for j, k in enumerate([-1, *path[::-1]]):
            t = prompt[-1] if k < 0 else tokens[k]
            out.setdefault(k, lean([PassRow(row, [t], None, len(prompt) - 1 + j)], cache)[0][0].clone())
    return out


def _compositions(rng: np.random.RandomState) -> list[list[tuple[list[int], list[int], list[int]]]]:
    """Passes of 1, 2, 8, 17 and 32 tokens: rows of (prompt, draft tokens, parents)."""
    def row(prompt_len: int, nodes: int, tree: bool) -> tuple[list[int], list[int], list[int]]:
        prompt = [int(t) for t in rng.randint(3, VOCAB, size=prompt_len)]
        tokens = [int(t) for t in rng.randint(3, VOCAB, size=nodes)]
        parents = [int(rng.randint(-1, k)) if tree else k - 1 for k in range(nodes)]
        return prompt, tokens, parents

    return [
        [row(7, 0, False)],  # 1 token
        [row(5, 0, False), row(11, 0, False)],  # 2 lone roots
        [row(9, 3, True), row(4, 0, False), row(12, 2, False)],  # 8 tokens: a tree, a root, a chain
        [row(6, 7, True), row(10, 8, False)],  # 17
        [row(13, 15, True), row(8, 9, False), row(3, 0, False), row(20, 4, True)],  # 32
    ]


def _packed_pass(lean: LeanForward, rows: list[tuple[list[int], list[int], list[int]]]) -> tuple[list, SlotCache]:
    """``rows`` (prompt, draft tokens, parents) in one packed pass, after each prompt but its last token was fed
    alone: the pass's logits per row and the cache it wrote."""
    cache = SlotCache(len(rows), capacity=64)
    slots = [cache.add_row() for _ in rows]
    for r, (prompt, _, _) in zip(slots, rows, strict=True):
        lean([PassRow(r, prompt[:-1], None, 0, "none")], cache)
    got = lean([PassRow(r, [prompt[-1], *tokens], parents, len(prompt) - 1)
                for r, (prompt, tokens, parents) in zip(slots, rows, strict=True)], cache)
    return got, cache


def _row_dependence(lean: LeanForward, threads: tuple[int, ...] = (1,), seed: int = 0) -> list[str]:
    """Where a node's logits in a packed pass differ from its path fed alone (empty: nowhere): the paths
    fed alone at ``threads[0]`` torch threads, the packed passes at each of ``threads``."""
    rng = np.random.RandomState(seed)
    found = []
    before = torch.get_num_threads()
    try:
        for rows in _compositions(rng):
            torch.set_num_threads(threads[0])
            alone = [_alone(lean, prompt, tokens, parents) for prompt, tokens, parents in rows]
            total = sum(1 + len(t) for _, t, _ in rows)
            for n in threads:
                torch.set_num_threads(n)
                got, _ = _packed_pass(lean, rows)
                for b, (_, tokens, _) in enumerate(rows):
                    for k in range(-1, len(tokens)):
                        if not torch.equal(alone[b][k], got[b][k + 1]):
                            diff = float((alone[b][k] - got[b][k + 1]).abs().max())
                            found.append(f"{n} threads, {total} tokens, row {b}, node {k}: {diff:.3g}")
    finally:
        torch.set_num_threads(before)
    return found


@pytest.mark.parametrize("attention", exact_attention.MODES)
@pytest.mark.parametrize("model_type", FAMILIES)
def test_int8_logits_of_a_row_do_not_depend_on_the_pass(model_type, attention, monkeypatch):
    """Bitwise: a node's logits in packed passes of 1, 2, 8, 17, 32 tokens (other rows, trees, chains,
    prompts of other lengths; sliding windows for Mistral and Gemma 3), at one and at two torch threads,
    equal its path fed alone, token by token, at one thread (attention runs on one either way; the decode
    may switch thread counts, see test_threads). Both attentions of an exact format: the compiled kernel
    (every node in one call) and the per-node SDPA calls (where no compiler is found)."""
    monkeypatch.setenv("SUFFIXSPEC_EXACT_ATTENTION", attention)
    exact_attention.kernel.cache_clear()
    try:
        lean = LeanForward(_tiny(model_type), weights="int8")
    finally:
        exact_attention.kernel.cache_clear()
    assert lean.exact and lean.released > 0
    assert (lean.native is not None) == (attention == "native")
    assert _row_dependence(lean, threads=(1, 2)) == [], model_type


def test_the_check_bites_on_a_forward_that_is_not_batch_invariant():
    """The same comparison on the float32 lean forward (grouped attention, oneDNN matmuls) finds rows whose
    logits change with the pass: the test above could fail."""
    assert _row_dependence(LeanForward(_tiny("llama"))) != []


def test_a_prompt_prefix_computes_the_same_keys_in_any_longer_prompt():
    """Prompt chunks sit at fixed positions (EXACT_CHUNK), so a prefix's keys/values are the same whatever
    the prompt's length: prefix reuse stays exact."""
    lean = LeanForward(_tiny("llama"), weights="int8")
    prompt = [int(t) for t in np.random.RandomState(3).randint(3, VOCAB, size=40)]
    keys = []
    for n in (16, 33, 40):
        cache = SlotCache(1, capacity=64)
        row = cache.add_row()
        lean([PassRow(row, prompt[:n], None, 0, "none")], cache)
        keys.append([k[row, :, :16].clone() for k in cache.keys])
    assert all(torch.equal(a, b) for other in keys[1:] for a, b in zip(keys[0], other, strict=True))


# -- the store: a converted model's quantized matrices on disk ------------------------------------------------
def _converted(tmp_path, model_type: str):
    """A tiny model as a converted folder loads (memory-mapped safetensors), with what load_model leaves on it
    at a quantized format (the calibration ids and the folder)."""
    from safetensors.torch import load_file

    model = _tiny(model_type)
    model.save_pretrained(tmp_path)
    model.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False, assign=True)
    model.tie_weights()
    model._suffixspec_calibration = [int(t) for t in np.random.RandomState(9).randint(3, VOCAB, size=48)]
    model._suffixspec_folder = str(tmp_path)
    return model


def _pass_logits(lean, prompt: list[int]) -> torch.Tensor:
    cache = SlotCache(1, capacity=64)
    return lean([PassRow(cache.add_row(), prompt, None, 0, "all")], cache)[0]


@pytest.mark.parametrize("kind, model_type", [("int8", "qwen2"), ("int8", "gemma3_text"), ("fbgemm", "llama")])
def test_a_converted_models_quantized_matrices_are_stored_and_read_back_bit_for_bit(tmp_path, kind, model_type,
                                                                                   monkeypatch):
    """The first build quantizes the float weights and writes the store; the next reads it (the float
    weights untouched) and gives the same logits bit for bit; a store made otherwise is made again."""
    from suffixspec.core import lean_weights

    if kind == "fbgemm" and not W.int8_works():
        pytest.skip("this torch has no fbgemm int8 linear")
    prompt = [int(t) for t in np.random.RandomState(4).randint(3, VOCAB, size=21)]
    first = LeanForward(_converted(tmp_path, model_type), weights=kind)
    assert first.stored == "written" and first.smoothed == (kind == "int8")
    want = _pass_logits(first, prompt)
    kernel = lean_weights._kernel(kind)
    path = lean_weights.store_path(tmp_path, kind, kernel)
    assert path.is_file()
    again = _converted(tmp_path, model_type)
    float_weights = [p for p in again.parameters() if p.dim() == 2]
    for p in float_weights:  # the store's read must not touch the float weights: make them garbage
        p.data = torch.full_like(p.data, float("nan"))
    second = LeanForward(again, weights=kind)
    assert second.stored == "read" and second.smoothed == first.smoothed
    assert torch.equal(_pass_logits(second, prompt), want)
    # a store made with another calibration (the exact kind smooths with it) or version is not used: made again
    if kind == "int8":
        other = _converted(tmp_path, model_type)
        other._suffixspec_calibration = other._suffixspec_calibration[:-1]
        assert LeanForward(other, weights=kind).stored == "written"
    monkeypatch.setattr(lean_weights, "STORE_VERSION", lean_weights.STORE_VERSION + 1)
    assert LeanForward(_converted(tmp_path, model_type), weights=kind).stored == "written"
    path.write_bytes(b"damaged")
    assert LeanForward(_converted(tmp_path, model_type), weights=kind).stored == "written"


def test_a_model_that_is_not_a_converted_one_stores_nothing():
    lean = LeanForward(_tiny("llama"), weights="int8")
    assert lean.stored == ""


# -- memory and failures -------------------------------------------------------------------------------------
def test_a_quantized_model_releases_its_float_weights_and_refuses_its_own_forward():
    model = _tiny("qwen2")
    lean = lean_forward(model, "int8")
    assert lean is not None and lean.released > 0
    assert all(p.untyped_storage().nbytes() <= 8 for n, p in model.named_parameters()
               if p.dim() == 2)  # the matrices and embeddings: one element each
    assert model.get_output_embeddings().weight.shape[0] == VOCAB  # shapes kept for whoever reads them
    with pytest.raises(RuntimeError, match="weights='float32'"):
        model(input_ids=torch.tensor([[5, 6]]))
    assert lean_forward(model, "float") is lean  # the float weights are gone: the int8 forward is the one left


def test_a_failing_int8_build_leaves_the_float_lean_forward_on(monkeypatch):
    """Issue 45, item 5: a draft whose int8 build fails still runs the float lean forward."""
    import suffixspec.core.lean_weights as lean_weights

    model = _tiny("llama")

    def broken(*_a, **_k):
        raise RuntimeError("no int8 kernel")

    monkeypatch.setattr(lean_weights, "RowInt8Weight", broken)
    monkeypatch.setattr(lean_weights, "Int8Weight", broken)
    assert lean_forward(model, "int8") is None and lean_forward(model, "fbgemm") is None
    float_lean = lean_forward(model, "float")
    assert float_lean is not None and not float_lean.int8
    model(input_ids=torch.tensor([[5, 6]]))  # its own forward still has its weights


# -- the engine: speculation on and off, alone and batched, at int8 ------------------------------------------
@pytest.fixture(scope="module")
def int8_engines(tiny_model_dirs) -> dict[str, Engine]:
    return {arch: Engine(load_model(str(tiny_model_dirs[arch]), weights="int8")) for arch in ("llama", "qwen2")}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_int8_generation_is_identical_with_speculation_on_and_off(int8_engines, arch):
    """Greedy and seeded, with the suffix drafter and a random tree, gates on (adaptive) and off: each
    request's tokens equal plain decoding's, bit for bit by construction (no tolerance)."""
    engine = int8_engines[arch]
    assert engine.target.weights == "int8" and engine.batchable
    assert engine.numerics == {"weights": "int8", "kernel": P.int8_kernel(), "attention": "native"}
    cases = [SamplingParams(max_tokens=40, ignore_eos=True),
             SamplingParams(max_tokens=40, ignore_eos=True, temperature=1.0, seed=3),
             SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.8, top_p=0.9, seed=5)]
    prompts = ["def add(a, b):\n    return a + b\ndef add(", "The quick brown fox", "for i in range(10):\n\t"]
    assert_speculation_on_equals_off(engine, prompts, cases)


def assert_speculation_on_equals_off(engine: Engine, prompts: list[str], cases: list[SamplingParams]) -> None:
    """Each prompt and sampling case: the tokens with the suffix drafter and with a random tree, gates on
    (adaptive) and off, equal plain decoding's."""
    from doubles import RandomTreeProposer

    from suffixspec.drafting.proposers import make_proposer

    for prompt in prompts:
        for sp in cases:
            engine.proposers = []
            plain = engine.generate(prompt, sp, speculation=False).token_ids
            for proposers in ([make_proposer("suffix", db=None, tokenizer=engine.tokenizer)],
                              [RandomTreeProposer(list(range(3, 60)), seed=7)]):
                engine.proposers = proposers
                for spec in (SpeculationConfig(), SpeculationConfig(adaptive=False)):
                    assert engine.generate(prompt, sp, speculation=spec).token_ids == plain, (prompt, sp, spec)
    engine.proposers = []


# -- smoothing -----------------------------------------------------------------------------------------------
def test_smoothing_factors_follow_the_worked_example():
    s = W.smoothing(torch.tensor([60.0, 1.0]), [torch.tensor([[0.1, 0.1], [-0.05, 0.02]])])
    assert torch.allclose(s, torch.tensor([60.0 ** 0.5 / 0.1 ** 0.5, 1.0 / 0.1 ** 0.5]))


def test_smoothing_brings_an_outlier_channel_model_closer_to_float32():
    """A model whose norms feed one channel 40x larger than the rest (the outliers real models have): the
    int8 forward smoothed from a calibration forward is closer to float32 than the unsmoothed one."""
    model = _tiny("llama")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.input_layernorm.weight[3] *= 40
            layer.post_attention_layernorm.weight[5] *= 40
    prompt = [int(t) for t in np.random.RandomState(4).randint(3, VOCAB, size=24)]
    with torch.inference_mode():
        ref = model(input_ids=torch.tensor([prompt])).logits[0].float()
    errors = {}
    for smoothed in (False, True):
        copy = _tiny("llama")
        copy.load_state_dict(model.state_dict())
        if smoothed:
            copy._suffixspec_calibration = [int(t) for t in np.random.RandomState(5).randint(3, VOCAB, size=64)]
        lean = LeanForward(copy, weights="int8")
        assert lean.smoothed == smoothed
        cache = SlotCache(1, capacity=32)
        row = cache.add_row()
        got = lean([PassRow(row, prompt, None, 0, "all")], cache)[0]
        errors[smoothed] = float((got - ref).abs().max())
    assert errors[True] < errors[False], errors


def test_auto_is_gguf_for_a_model_named_by_its_gguf_else_the_int8_rules(monkeypatch):
    """``auto`` on a CPU: a model named by its GGUF (a known name, a ``.gguf`` path) runs the file's own blocks
    where the block kernel builds and its gguf is not measured below INT8_MIN_AGREEMENT, else gguf16 where that is
    measured at or above it (SmolLM2: gguf 98.4%, gguf16 100%); otherwise the fastest exact int8 kernel, unless
    the named model's int8 is measured to agree with float32 below INT8_MIN_AGREEMENT (SmolLM2: 94.6%): then
    float32. An explicit format is honoured; a folder follows the machine's probe."""
    from suffixspec.core.formats import INT8_MIN_AGREEMENT, draft_weights, gguf_works, resolve
    from suffixspec.models import KNOWN_MODELS

    smol = KNOWN_MODELS["smollm2-135m-instruct"]
    assert gguf_works()  # this machine has a C compiler
    for name in ("qwen2.5-coder-1.5b-instruct", "gemma-3-270m", "/models/Some-Model.Q4_K_M.GGUF"):
        assert resolve("auto", "cpu", model=name) == "gguf" and resolve(None, "cpu", model=name) == "gguf"
    # SmolLM2's gguf is measured below the agreement asked (98.4%), its gguf16 not (100%): gguf16
    assert smol.gguf_agreement is not None and smol.gguf_agreement < INT8_MIN_AGREEMENT <= smol.gguf16_agreement
    assert resolve("auto", "cpu", model=smol.name) == "gguf16"
    assert resolve("gguf", "cpu", model=smol.name) == "gguf" and resolve("int8", "cpu", model=smol.name) == "int8"
    assert resolve("gguf16", "cpu", model="qwen2.5-coder-1.5b-instruct") == "gguf16"
    # a gguf16 measured below the bar (or not measured) is not chosen: then the int8 rules (SmolLM2: float32)
    for low in (0.97, None):
        monkeypatch.setitem(KNOWN_MODELS, smol.name, dataclasses.replace(smol, gguf16_agreement=low))
        assert resolve("auto", "cpu", model=smol.name) == "float32"
    monkeypatch.setitem(KNOWN_MODELS, smol.name, smol)
    assert resolve("auto", "cpu", model="/models/some-folder") == resolve("auto", "cpu") != "gguf"
    assert resolve("auto", "cpu", model="qwen2.5-coder-0.5b-instruct", draft=True) == "gguf"  # a draft's too
    monkeypatch.setattr(P, "gguf_works", lambda: False)  # where no compiler builds the block kernel
    assert smol.int8_agreement is not None and smol.int8_agreement < INT8_MIN_AGREEMENT
    assert resolve("auto", "cpu", model=smol.name) == "float32"
    assert resolve("auto", "cpu", model=smol.name, draft=True) == resolve("auto", "cpu")  # no agreement weighed
    assert resolve("auto", "cpu", model="qwen2.5-coder-1.5b-instruct") == resolve("auto", "cpu")
    assert all(m.int8_agreement is None or 0 < m.int8_agreement <= 1 for m in KNOWN_MODELS.values())
    assert all(m.gguf_agreement is None or 0 < m.gguf_agreement <= 1 for m in KNOWN_MODELS.values())
    assert all(m.gguf16_agreement is None or 0 < m.gguf16_agreement <= 1 for m in KNOWN_MODELS.values())
    # a draft follows its target's format (auto at a quantized one: gguf where it is named by its GGUF, else int8
    # where that pays)
    assert draft_weights("int8") == draft_weights("gguf") == draft_weights("gguf16") == "auto"
    assert draft_weights("float32") == "float32"
    assert resolve(draft_weights("gguf"), "cpu", model=None) == resolve("auto", "cpu")
