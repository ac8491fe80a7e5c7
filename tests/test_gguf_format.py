"""The ``gguf`` weight format: a converted model's matrices are its GGUF file's own blocks (core/gguf_weights.py),
multiplied by the block kernel (core/blockq.c).

Real GGUF files written with gguf-py (quantized with its quantizers, or random valid K-quant blocks) and converted
as a user's file is: the blocks read back must be exactly the float32 model's weights (llama's q/k rows put back in
order), the format must be exact (a row's logits bit-identical whatever shares its pass, at one and two threads;
generation identical with speculation on and off), close to float32, and refused with a clear error where there is
no GGUF to read.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_models import write_tiny_gguf
from test_weights import _pass_logits, _row_dependence, assert_speculation_on_equals_off

from suffixspec.config import SamplingParams
from suffixspec.core import blockq
from suffixspec.core.gguf_weights import FileRows, directory, read_matrices, source_file
from suffixspec.core.lean import LeanForward, lean_forward
from suffixspec.loading import load_model
from suffixspec.runtimes.engine import Engine

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(blockq.kernel() is None, reason="no C compiler: the block kernel cannot be built")]

# name -> (architecture, block type of the matrices, hidden size)
# (Q5_1: a type the block kernel lacks, multiplied as exact int8 rows of its values)
CASES = {"llama-Q4_1": ("llama", "Q4_1", 64), "llama-Q8_0": ("llama", "Q8_0", 64),
         "qwen2-Q4_K": ("qwen2", "Q4_K", 256), "qwen2-Q6_K": ("qwen2", "Q6_K", 256), "llama-Q5_1": ("llama", "Q5_1", 64)}
HF_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
            "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


@pytest.fixture(scope="module")
def files(tmp_path_factory, bpe_tokenizer_dir):
    """Each case's GGUF file, with the conversion cache in a folder of this module's own."""
    root = tmp_path_factory.mktemp("gguf-format")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SUFFIXSPEC_CACHE", str(root / "cache"))
        yield {name: write_tiny_gguf(root / f"{name}.gguf", bpe_tokenizer_dir, hidden=hidden, arch=arch, quant=quant)
               for name, (arch, quant, hidden) in CASES.items()}


@pytest.fixture(scope="module")
def models(files):
    """Each case loaded twice: float32 (the file's values dequantized) and gguf (its blocks)."""
    return {name: (load_model(str(path), weights="float32"), load_model(str(path), weights="gguf"))
            for name, path in files.items()}


def _dequantized(blocks) -> torch.Tensor:
    from gguf import GGMLQuantizationType, quants

    return torch.from_numpy(quants.dequantize(blocks.raw, GGMLQuantizationType[blocks.ggml_type]))


@pytest.mark.parametrize("case", CASES)
def test_the_files_blocks_are_the_converted_models_weights(models, case):
    """Every matrix read from the file dequantizes to exactly the float32 model's (llama's q and k rows
    put back in transformers' order), and the kernel's own dequantization agrees."""
    f32, _ = models[case]
    model = f32.model
    cfg = model.config
    blocks = read_matrices(source_file(f32.cache_folder), cfg.num_hidden_layers, cfg.num_attention_heads,
                           cfg.num_key_value_heads)
    assert {b.ggml_type for name, b in blocks.items() if name != "embed"} == {CASES[case][1]}
    params = dict(model.named_parameters())
    for name, b in blocks.items():
        if name == "embed":
            want = model.model.embed_tokens.weight
        elif name == "head":
            want = model.lm_head.weight
        else:
            layer, which = name.split(".")
            want = params[f"model.layers.{layer}.{HF_NAMES[which]}.weight"]
        assert b.shape == tuple(want.shape), name
        assert torch.equal(_dequantized(b), want.detach()), name
        if b.ggml_type in blockq.TYPES:
            assert torch.equal(blockq.BlockWeight(b.ggml_type, b.raw, b.shape).dequantize(), want.detach()), name
    ids = torch.tensor([[0, 7], [3, 7]])
    assert torch.equal(FileRows(blocks["embed"]).rows(ids), model.model.embed_tokens.weight.detach()[ids])


@pytest.mark.parametrize("case", CASES)
def test_a_rows_logits_do_not_depend_on_the_pass(models, case):
    """Bitwise, as for int8 (test_weights): a node's logits in packed passes of 1, 2, 8, 17 and 32 tokens, at one
    and two threads, equal its path fed alone, token by token."""
    _, gg = models[case]
    lean = lean_forward(gg.model, "gguf")
    assert lean is not None and lean.exact and lean.native is not None
    assert isinstance(lean.embed, FileRows)  # an untied table is read from the file at lookups
    assert _row_dependence(lean, threads=(1, 2)) == [], case


@pytest.mark.parametrize("case", CASES)
def test_gguf_logits_are_float32s_within_the_activations_rounding(models, case):
    """The same values as float32's weights; only the activations are rounded (8 bits per block of 32): the
    logits of a prompt stay within a few percent of float32's spread (the random models' logits spread widely:
    their larger differences are a fraction of it), and the greedy token is the same at nearly every position."""
    f32, gg = models[case]
    ids = torch.tensor([list(range(5, 45))])
    with torch.inference_mode():
        want = f32.model(input_ids=ids).logits[0].float()
    got = _logits(lean_forward(gg.model, "gguf"), ids[0].tolist())
    spread = float(want.std())
    print(case, float((got - want).abs().mean()) / spread, float((got - want).abs().max()) / spread,
          float((got.argmax(-1) == want.argmax(-1)).float().mean()))
    assert float((got - want).abs().mean()) < 0.02 * spread, case
    assert float((got - want).abs().max()) < 0.25 * spread, case
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("case", ["llama-Q4_1", "qwen2-Q4_K"])
def test_gguf_generation_is_identical_with_speculation_on_and_off(models, case):
    """Greedy and seeded, with the suffix drafter and a random tree, gates on and off: each request's tokens
    equal plain decoding's."""
    _, gg = models[case]
    engine = Engine(gg)
    assert engine.numerics == {"weights": "gguf", "kernel": "blockq", "attention": "native"}
    cases = [SamplingParams(max_tokens=24, ignore_eos=True),
             SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, seed=3)]
    assert_speculation_on_equals_off(engine, ["def add(a, b):\n    return a + b\ndef add(", "The quick brown fox"], cases)


# gguf16: the same blocks, ~15-bit activations (blockq's planes = 2)
CASES16 = ("llama-Q4_1", "qwen2-Q4_K", "qwen2-Q6_K")


@pytest.fixture(scope="module")
def models16(files):
    return {name: load_model(str(files[name]), weights="gguf16") for name in CASES16}


def _logits(lean, ids: list[int]) -> torch.Tensor:
    from suffixspec.core.kv import SlotCache
    from suffixspec.core.lean import PassRow

    cache = SlotCache(1, capacity=64)
    return lean([PassRow(cache.add_row(), ids, None, 0, "all")], cache)[0]


@pytest.mark.parametrize("case", CASES16)
def test_gguf16_rows_are_exact_and_far_closer_to_float32_than_ggufs(models, models16, case):
    """gguf16's matrices are the file's blocks at planes 2; a row's logits are bitwise independent of its pass (1
    and 2 threads); its logits are float32's to a small fraction of gguf's (8-bit activations) error."""
    f32, gg = models[case]
    g16 = models16[case]
    lean16 = lean_forward(g16.model, "gguf16")
    assert lean16 is not None and lean16.exact and lean16.blocks
    assert {w.planes for L in lean16.layers for w in (L.w_qkv, L.wo, L.w_gu, L.wd)} == {2}
    assert _row_dependence(lean16, threads=(1, 2)) == [], case
    ids = list(range(5, 45))
    with torch.inference_mode():
        want = f32.model(input_ids=torch.tensor([ids])).logits[0].float()
    err8 = float((_logits(lean_forward(gg.model, "gguf"), ids) - want).abs().mean())
    err16 = float((_logits(lean16, ids) - want).abs().mean())
    print(case, err8, err16)
    assert err16 < err8 / 30, (case, err8, err16)


def test_gguf16_generation_is_identical_with_speculation_on_and_off(models16):
    engine = Engine(models16["llama-Q4_1"])
    assert engine.numerics == {"weights": "gguf16", "kernel": "blockq", "attention": "native"}
    cases = [SamplingParams(max_tokens=24, ignore_eos=True),
             SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, seed=3)]
    assert_speculation_on_equals_off(engine, ["def add(a, b):\n    return a + b\ndef add(", "The quick brown fox"], cases)


@pytest.mark.parametrize("case,weights", [("llama-Q4_1", "gguf"), ("qwen2-Q4_K", "gguf"), ("qwen2-Q6_K", "gguf16")])
def test_a_pass_through_the_layer_stack_is_the_op_by_op_pass_bit_for_bit(models, models16, case, weights,
                                                                         monkeypatch):
    """A decode or verify pass runs every layer in one native call (blockq.LayerStack); a pass with a prompt chunk
    runs op by op, and the two must be one numerics (a request's tokens would otherwise depend on whether a prompt
    shared its pass). The same passes (trees, chains, lone roots, 1-32 tokens, other rows; q/k/v biases for Qwen2;
    8- and 15-bit activations) both ways, at one and two threads: logits and every layer's cache bit-identical. The
    stack built on the portable (scalar) kernel gives the same hidden states."""
    from test_weights import _compositions, _packed_pass

    from suffixspec.core.kv import SlotCache

    model = models[case][1].model if weights == "gguf" else models16[case].model
    lean = lean_forward(model, weights)
    stack = lean.stack
    assert stack is not None and stack.planes == (1 if weights == "gguf" else 2)
    calls = []
    stack_call = blockq.LayerStack.__call__
    monkeypatch.setattr(blockq.LayerStack, "__call__", lambda self, *a: calls.append(self) or stack_call(self, *a))
    rng = np.random.RandomState(2)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in _compositions(rng):
                seen = {}
                for mode in ("stack", "ops"):
                    lean.stack = stack if mode == "stack" else None
                    n = len(calls)
                    got, cache = _packed_pass(lean, rows)
                    assert len(calls) == n + (mode == "stack")  # prompts op by op; the pass as its mode says
                    seen[mode] = (got, [k.clone() for k in cache.keys], [v.clone() for v in cache.values])
                (a, ka, va), (b, kb, vb) = seen["stack"], seen["ops"]
                assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), (threads, len(rows))
                assert all(torch.equal(x, y) for x, y in zip(ka + va, kb + vb, strict=True))
    finally:
        lean.stack = stack
        torch.set_num_threads(before)
    scalar = blockq.LayerStack(blockq.library(blockq.SCALAR_FLAGS), [
        (L.norm_in, L.w_qkv, L.b_qkv, L.wo, L.bo, L.norm_mlp, L.w_gu, L.wd, L.window) for L in lean.layers],
        (stack.hidden, stack.h_q, stack.h_kv, stack.d), stack.eps, stack.scale, lean.native)
    T = 6
    x = torch.randn(T, stack.hidden)
    angles = torch.randn(T, stack.d // 2)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    from suffixspec.core import exact_attention

    meta, path = exact_attention.plan([(t, 0, 0, t + 1, list(range(t + 1))) for t in range(T)])
    outs = []
    for st in (stack, scalar):
        cache = SlotCache(1, capacity=16)
        cache.add_row()
        lean.allocate(cache, T)
        outs.append(st(x.clone(), cos, sin, torch.zeros(T, dtype=torch.int64), torch.arange(T), meta, path,
                       cache.keys, cache.values))
    assert torch.equal(outs[0], outs[1])


def test_a_pass_runs_its_products_on_blockqs_threads_and_torchs_ops_on_one(models, monkeypatch):
    """At two torch threads a pass whose products are all blockq's runs them on two of blockq's own threads with
    torch's ops on one (its idle OpenMP worker would otherwise spin on the core blockq's worker needs), and puts
    torch's count back afterwards, also when the pass fails; a forward with a product of another kind (Q5_1's int8
    rows, on torch's threads) is left on torch's count. The logits are the same bits either way (the test above)."""
    _, gg = models["qwen2-Q4_K"]
    lean = lean_forward(gg.model, "gguf")
    assert lean.blocks
    assert not lean_forward(models["llama-Q5_1"][1].model, "gguf").blocks
    from suffixspec.core.kv import SlotCache
    from suffixspec.core.lean import PassRow

    seen = []
    run = blockq._run

    def spy(*args, **kwargs):
        seen.append((getattr(blockq._local, "threads", None), torch.get_num_threads()))
        return run(*args, **kwargs)

    monkeypatch.setattr(blockq, "_run", spy)
    torch.set_num_threads(2)
    cache = SlotCache(1, capacity=64)
    lean([PassRow(cache.add_row(), [5, 6, 7], None, 0, "last")], cache)
    assert seen and set(seen) == {(2, 1)}
    assert torch.get_num_threads() == 2 and getattr(blockq._local, "threads", None) is None
    with pytest.raises(IndexError):  # a token id outside the vocabulary fails inside the pass
        lean([PassRow(cache.add_row(), [10 ** 9], None, 0, "last")], cache)
    assert torch.get_num_threads() == 2 and getattr(blockq._local, "threads", None) is None
    seen.clear()
    torch.set_num_threads(1)
    lean([PassRow(cache.add_row(), [5, 6], None, 0, "last")], cache)
    assert set(seen) == {(None, 1)}


def test_a_type_the_kernel_lacks_runs_as_int8_rows_and_stays_exact(models):
    """A matrix whose blocks the kernel lacks (Q5_1 here) is quantized from its dequantized values to int8 per
    output row (``RowInt8Weight``, the int8 format's product: a row's result depends on that row alone); the
    format stays exact: a row's logits do not depend on its pass, and generation is identical with speculation
    on and off."""
    from suffixspec.core.weights import RowInt8Weight

    f32, gg = models["llama-Q5_1"]
    lean = lean_forward(gg.model, "gguf")
    assert lean is not None and lean.exact
    layer = lean.layers[0]
    assert all(isinstance(w, RowInt8Weight) for w in (layer.w_qkv, layer.wo, layer.w_gu, layer.wd, lean.head))
    assert _row_dependence(lean, threads=(1, 2)) == []
    engine = Engine(gg)
    assert engine.numerics["weights"] == "gguf"
    assert_speculation_on_equals_off(engine, ["def add(a, b):\n    return a + b\ndef add("],
                                     [SamplingParams(max_tokens=16, ignore_eos=True),
                                      SamplingParams(max_tokens=16, ignore_eos=True, temperature=1.0, seed=5)])


@pytest.mark.parametrize("case", ["qwen2-Q4_K", "llama-Q4_1"])
def test_the_repacked_blocks_are_stored_and_mapped_back_bit_for_bit(files, case, tmp_path, monkeypatch):
    """The first gguf build repacks the file's blocks and keeps them beside the converted model; the next maps them
    (no repacking: the kernel's repack is made to fail) and gives the same logits bit for bit, at gguf and gguf16;
    a store made from another kernel source, damaged, or holding other shapes is made again."""
    from safetensors.torch import save_file

    from suffixspec.core import lean_weights

    monkeypatch.setenv("SUFFIXSPEC_CACHE", str(tmp_path / "cache"))  # a conversion (and store) of this test's own
    prompt = [int(t) for t in np.random.RandomState(6).randint(3, 50, size=19)]

    def build(weights="gguf"):
        return LeanForward(load_model(str(files[case]), weights=weights).model, weights=weights)

    first = build()
    assert first.stored == "written"
    want = _pass_logits(first, prompt)
    path = lean_weights.store_path(load_model(str(files[case]), weights="gguf").cache_folder, "gguf", "blockq")
    assert path.is_file()
    with monkeypatch.context() as mp:
        mp.setattr(blockq.kernel(), "bq_repack", None)  # a call would raise: every matrix must come from the store
        second = build()
        assert second.stored == "read"
        assert torch.equal(_pass_logits(second, prompt), want)
        sixteen = build("gguf16")
        assert sixteen.stored == "read"
    with monkeypatch.context() as mp:  # gguf16 repacked afresh, its store neither read nor written
        mp.setattr(lean_weights, "read_store", lambda *args: None)
        mp.setattr(lean_weights, "write_blocks", lambda *args: False)
        fresh16 = build("gguf16")
    assert fresh16.stored == ""
    assert torch.equal(_pass_logits(sixteen, prompt), _pass_logits(fresh16, prompt))
    with monkeypatch.context() as mp:
        mp.setattr(blockq, "layout_version", lambda: "another kernel")
        assert build().stored == "written"
    assert build().stored == "written"  # (the store above was made by "another kernel")
    path.write_bytes(b"damaged")
    assert build().stored == "written"
    save_file({"0.q": torch.zeros(1, 1, dtype=torch.uint8)}, str(path), metadata=lean_weights.blocks_key())
    rebuilt = build()
    assert rebuilt.stored == "written"
    assert torch.equal(_pass_logits(rebuilt, prompt), want)
    assert build().stored == "read"
    # a folder that cannot be written (here: the store's path in a folder that does not exist) keeps nothing and
    # the start goes on
    monkeypatch.setattr(lean_weights, "store_path", lambda *args: tmp_path / "missing" / "store.safetensors")
    unwritten = build()
    assert unwritten.stored == ""
    assert torch.equal(_pass_logits(unwritten, prompt), want)


def test_the_header_reader_finds_what_gguf_py_finds(files, tmp_path):
    """directory() (the tensors' types, dims, offsets and sizes, the architecture, read without decoding the
    metadata) agrees with gguf-py's GGUFReader on every case's file and the real SmolLM2 file where installed;
    a file that is not a GGUF, or is cut short, is refused saying so."""
    import gguf

    from suffixspec.models import KNOWN_MODELS, known_source

    paths = list(files.values())
    smol = known_source(KNOWN_MODELS["smollm2-135m-instruct"])
    if smol.path is not None and smol.path.is_file():
        paths.append(smol.path)
    for path in paths:
        arch, tensors, data = directory(path)
        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        assert arch == bytes(field.parts[field.data[0]]).decode()
        assert sorted(tensors) == sorted(t.name for t in reader.tensors)
        for t in reader.tensors:
            info = tensors[t.name]
            assert (info.ggml_type, info.dims, data + info.offset, info.nbytes) == (
                t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.data_offset), int(t.n_bytes)), t.name
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ValueError, match="is not a GGUF file"):
        directory(bad)
    cut = tmp_path / "cut.gguf"
    for path in paths:  # cut in the metadata (200 bytes) and in the middle of the header (a vocabulary's strings)
        for at in (200, directory(path)[2] // 2):
            cut.write_bytes(path.read_bytes()[:at])
            with pytest.raises(ValueError, match="ends early"):
                directory(cut)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        directory(empty)


def test_gguf_weights_need_a_model_converted_from_a_gguf(tiny_model_dirs):
    for fmt in ("gguf", "gguf16"):
        with pytest.raises(ValueError, match=f"{fmt} weights: they are the blocks of the GGUF"):
            load_model(str(tiny_model_dirs["llama"]), weights=fmt)


def test_the_smollm2_files_blocks_are_its_converted_weights():
    """The real default model (a Q4_1 file with a Q8_0 table, llama's interleaved q/k rows): its blocks are
    the converted float32 weights, and one layer's products through the kernel are float32's within 2%."""
    from suffixspec import gguf_cache, models

    try:
        folder = gguf_cache.cached_folder(models.gguf_source("smollm2-135m-instruct"), progress=False)
    except models.ModelNotInstalledError as e:
        pytest.skip(str(e))
    from safetensors import safe_open

    blocks = read_matrices(source_file(folder), 30, 9, 3)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for name in ("0.q", "0.k", "7.v", "29.down", "embed"):
            hf = "model.embed_tokens.weight" if name == "embed" else (
                f"model.layers.{name.split('.')[0]}.{HF_NAMES[name.split('.')[1]]}.weight")
            want = f.get_tensor(hf)
            assert torch.equal(_dequantized(blocks[name]), want), name
            w = blockq.BlockWeight(blocks[name].ggml_type, blocks[name].raw, blocks[name].shape)
            x = torch.from_numpy(np.random.default_rng(0).standard_normal((3, want.shape[1])).astype(np.float32))
            ref = x.double() @ want.double().t()
            assert float((w.mm(x).double() - ref).abs().max()) < 0.02 * float(ref.abs().max()), name
