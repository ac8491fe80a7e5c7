"""Products with weights kept in GGUF's own quantized block formats (Q4_K, Q6_K, Q8_0, Q4_1, Q5_0), exactly.

A CPU decode step is bound by reading the weights: a Q4_K matrix is read at 4.6 bits per weight where the int8
format reads 8 and float32 32. ``blockq.c`` (compiled on first use, ``native.py``) multiplies float32
activations by the stored blocks without ever expanding the matrix:

- each activation row is quantized on its own, per block of 32 values (scale = the block's largest |x| / 127,
  int8 values rounded to nearest, plus their sum for the types with an offset term);
- a block's int8 x weight-integer products are summed in int32 (exact, no saturation possible);
- the integer sums are combined with the float scales in one fixed order per (row, output), whatever the number
  of rows in the call, the row's place among them or the number of threads (threads split the outputs), and
  on every SIMD path (VNNI, AVX2, scalar) the same float operations are done.

So row r of ``mm``'s result is bit-identical whatever else the call holds: the lossless promise of the
project's exact formats. The values multiplied are exactly those ``gguf.quants.dequantize`` gives.

``planes=2`` (the ``gguf16`` format): each activation row is quantized to about 15 bits per block of 32 instead
(n = rint(x / s), |n| <= 32512, s = the block's max |x| / 32512), stored as two int8 rows n = 255 h + l whose
products the kernel adds: twice the integer arithmetic, the same weight bytes, an activation error 256 times
smaller, still exact per row.

Worked example (one Q8_0 block, K = 32, one output): weights d = 0.5, q_w = [2, -1, 0, ...]; activation row
x = [1.0, 2.0, 0, ...] -> x scale 2/127, q_x = [64, 127, 0, ...]; int sum 2*64 - 127 = 1; result
1 * (0.5 * 2/127) = 0.00787 (exact: 0.0, the 8-bit activations' rounding).

Example: ``BlockWeight("Q4_K", raw_rows, shape=(8960, 1536)).mm(x)`` ~ ``x @ W.T``."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from suffixspec.core import native

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("blockq.c")
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-ffp-contract=off", "-pthread")
SCALAR_FLAGS = (*FLAGS, "-DBLOCKQ_SCALAR")
# ggml type name -> (the kernel's code, values per block, GGUF bytes per block)
_TYPES = {"Q4_K": (0, 256, 144), "Q6_K": (1, 256, 210), "Q8_0": (2, 32, 34), "Q4_1": (3, 32, 20),
          "Q5_0": (4, 32, 22)}
TYPES = tuple(_TYPES)
# How long the pool's idle worker spins for the next product inside :func:`pass_threads` before it sleeps: longer
# than the glue between one layer's products (tens of microseconds at decode), so a pass wakes it once. Measured on
# the 2-core EPYC, Qwen2.5-1.5B Q4_K_M, plain decode at 2 threads: 0 us 42.2 ms a token, 100 us 40.3, 400 us 39.7.
PASS_SPIN_US = 200
_local = threading.local()  # this thread's pass_threads count (None outside one)


class _Part(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("pad", ctypes.c_int32), ("N", ctypes.c_int64),
                ("row_bytes", ctypes.c_int64), ("w", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("col0", ctypes.c_int64)]


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.bq_mm.argtypes = [ptr, i32, i64, ptr, i64, i64, ptr, i64, i32, i32]
    lib.bq_mm.restype = i32
    lib.bq_mm_norm.argtypes = [ptr, i32, i64, ptr, i64, i64, ptr, i64, i32, ptr, ctypes.c_float, i32]
    lib.bq_mm_norm.restype = i32
    lib.bq_sumsq.argtypes = [ptr, i64, i64, i64, ptr]
    lib.bq_sumsq.restype = None
    lib.bq_silu_mul.argtypes = [ptr, i64, i64, ptr]
    lib.bq_silu_mul.restype = None
    lib.bq_layers.argtypes = [ptr, ptr, i32, ptr, ptr, ptr]
    lib.bq_layers.restype = i32
    lib.bq_dequantize_rows.argtypes = [i32, ptr, i64, i64, ptr, i64, ptr]
    lib.bq_dequantize_rows.restype = i32
    lib.bq_repack.argtypes = [i32, ptr, i64, i64, ptr, i32]
    lib.bq_repack.restype = i32
    lib.bq_path.argtypes = []
    lib.bq_path.restype = i32
    lib.bq_rope_store.argtypes = [i64, ptr, i64, i64, i64, i64, i64, ptr, ptr, i64, ptr, ptr, i64, i64, ptr, ptr, i64,
                                  i64, i64, ptr, ptr]
    lib.bq_rope_store.restype = None
    lib.bq_parallel.argtypes = [ptr, ptr, i64, i32]
    lib.bq_parallel.restype = None
    lib.bq_set_spin_us.argtypes = [ctypes.c_long]
    lib.bq_set_spin_us.restype = None
    lib.bq_set_amx_min_rows.argtypes = [i32]
    lib.bq_set_amx_min_rows.restype = i32
    lib.bq_amx.argtypes = []
    lib.bq_amx.restype = i32
    return lib


@functools.cache
def layout_version() -> str:
    """What a stored repacked matrix must have been made with: a hash of this kernel's source (the layout is
    blockq.c's; any change of the file makes stored copies be made again, as it rebuilds the library)."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


@functools.cache
def library(flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL:
    """``blockq.c`` compiled with ``flags`` and loaded (RuntimeError/OSError where it does not build). Tests load
    ``SCALAR_FLAGS`` too: the portable path, which must give the same bits."""
    return _bind(native.load(SOURCE, flags))


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The loaded library, or None where it does not build here (logged once, with the compiler's message)."""
    try:
        return library()
    except (RuntimeError, OSError) as e:
        log.warning("block-quantized products are unavailable (no native kernel): %s", e)
        return None


@contextlib.contextmanager
def pass_threads(n: int):
    """Inside, this thread's products run on ``n`` threads of the kernel's own pool whatever torch's count, and
    the pool's idle worker spins :data:`PASS_SPIN_US` between products instead of sleeping after each (a sleeping
    worker took 30-160 us to wake on this VM, for products of 40-400 us). For a pass whose products are all
    blockq's (``LeanForward``), run with torch's own ops on one thread: torch's OpenMP worker spins after every
    parallel region, and then it and this pool's worker share the second core."""
    lib = kernel()
    prev = getattr(_local, "threads", None)
    _local.threads = n
    spin = lib is not None and n > 1 and prev is None
    if spin:
        lib.bq_set_spin_us(PASS_SPIN_US)
    try:
        yield
    finally:
        _local.threads = prev
        if spin:
            lib.bq_set_spin_us(0)


def pool() -> tuple[int, int] | None:
    """Inside :func:`pass_threads` of two threads or more: (the address of the kernel's ``bq_parallel``, the
    thread count), for another native kernel to share this pool (``exact_attention``); else None."""
    n = getattr(_local, "threads", None)
    lib = kernel() if n is not None and n > 1 else None
    return None if lib is None else (ctypes.cast(lib.bq_parallel, ctypes.c_void_p).value, n)


def _need_kernel(lib: ctypes.CDLL | None) -> ctypes.CDLL:
    lib = lib or kernel()
    if lib is None:
        raise RuntimeError("the block-quantized kernel could not be compiled here (see the log)")
    return lib


def _check_x(x: torch.Tensor, K: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise ValueError(f"x must be a float32 torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 1 or x.shape[-1] != K:
        raise ValueError(f"x must be [M, {K}], got {list(x.shape)}")
    if x.device.type != "cpu":
        raise ValueError(f"x must be on the CPU, got {x.device}")
    return x.reshape(-1, K).contiguous()


def _parts(parts: Sequence[tuple[BlockWeight, int]], b: torch.Tensor | None) -> ctypes.Array:
    """The kernel's part records for ``parts`` and bias ``b``."""
    arr = (_Part * len(parts))()
    for i, (w, col0) in enumerate(parts):
        arr[i].type, arr[i].N, arr[i].row_bytes = w._code, w.shape[0], w._row_bytes
        arr[i].w = w._data.ctypes.data
        arr[i].bias = None if b is None else b.data_ptr() + 4 * col0
        arr[i].col0 = col0
    return arr


def _run(lib: ctypes.CDLL, parts: Sequence[tuple[BlockWeight, int]], N: int, K: int, x: torch.Tensor,
         b: torch.Tensor | None, owner: BlockWeight | BlockConcat | None = None,
         norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
    """``owner``: the weight whose last part records (``_last``, by bias address) are reused: a decode step
    makes 115 calls, and building the records took a quarter of a small call's Python. ``norm``: (weight [K], eps):
    multiply the RMS-normed rows ``weight * (x * rsqrt(mean(x ** 2) + eps))`` instead, the same bits as those
    torch ops (``bq_mm_norm``)."""
    if (type(x) is torch.Tensor and x.dtype is torch.float32 and x.dim() == 2 and x.shape[1] == K
            and x.is_contiguous() and x.device.type == "cpu"):  # a lean pass's rows, as they come: no copy, no views
        lead, x2 = None, x
    else:
        lead = x.shape[:-1]
        x2 = _check_x(x, K)
    if b is not None:
        if not isinstance(b, torch.Tensor) or b.dtype != torch.float32 or tuple(b.shape) != (N,):
            raise ValueError(f"b must be a float32 tensor of shape [{N}], got "
                             f"{getattr(b, 'dtype', type(b).__name__)} {list(getattr(b, 'shape', []))}")
        b = b.contiguous()
    out = torch.empty(x2.shape[0], N, dtype=torch.float32)
    key = 0 if b is None else b.data_ptr()
    last = owner._last if owner is not None else None
    if last is not None and last[0] == key:
        arr = last[1]
    else:
        arr = _parts(parts, b)
        if owner is not None:
            owner._last = (key, arr)
    threads = max(1, getattr(_local, "threads", None) or torch.get_num_threads())
    planes = owner.planes if owner is not None else 1
    if norm is None:
        rc = lib.bq_mm(arr, len(parts), K, x2.data_ptr(), x2.shape[0], K, out.data_ptr(), N, threads, planes)
    else:
        w, eps = norm
        if not isinstance(w, torch.Tensor) or w.dtype != torch.float32 or w.shape != (K,) or not w.is_contiguous():
            raise ValueError(f"the norm's weight must be a contiguous float32 tensor of shape [{K}]")
        rc = lib.bq_mm_norm(arr, len(parts), K, x2.data_ptr(), x2.shape[0], K, out.data_ptr(), N, threads,
                            w.data_ptr(), eps, planes)
    if rc != 0:
        raise (MemoryError if rc == -1 else ValueError)(f"bq_mm failed ({rc})")
    return out if lead is None else out.reshape(*lead, N)


def rope_store(lib: ctypes.CDLL, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, v: torch.Tensor,
               kbuf: torch.Tensor, vbuf: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
               h_q: int) -> torch.Tensor:
    """``qk * cos + rotate_half(qk) * sin`` for ``qk`` [T, h_q + h_kv, d] (``cos``/``sin`` [T, 1, d]), the same bits
    as torch's ops, with the keys (its last h_kv heads) and ``v`` [T, h_kv, d] written into the cache
    ``kbuf``/``vbuf`` [rows, h_kv, capacity, d] at (``rows[t]``, ``slots[t]``): the lean forward's rotary and cache
    writes in one native call (seven torch ops a layer). float32 on the CPU, last dimensions contiguous."""
    T, nh, d = qk.shape
    h_kv = nh - h_q
    # the layouts the lean forward makes (a cheap check: this runs once per layer of every pass)
    if (qk.dtype != torch.float32 or v.dtype != torch.float32 or cos.dtype != torch.float32 or qk.stride(-1) != 1
            or v.shape != (T, h_kv, d) or cos.shape != (T, 1, d) or kbuf.shape[1] != h_kv):
        raise ValueError(f"rope_store: qk [T, heads, d], v [T, {h_kv}, d] and cos/sin [T, 1, d], float32; got "
                         f"{list(qk.shape)} {list(v.shape)} {list(cos.shape)}")
    out = torch.empty((T, nh, d), dtype=torch.float32)
    lib.bq_rope_store(T, qk.data_ptr(), qk.stride(0), qk.stride(1), h_q, h_kv, d, cos.data_ptr(), sin.data_ptr(),
                      cos.stride(0), out.data_ptr(), v.data_ptr(), v.stride(0), v.stride(1), kbuf.data_ptr(),
                      vbuf.data_ptr(), kbuf.stride(0), kbuf.stride(1), kbuf.stride(2), rows.data_ptr(),
                      slots.data_ptr())
    return out


def silu_mul(lib: ctypes.CDLL, gu: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gu`` [T, 2 I] (gate then up, as a fused gate/up product gives them): [T, I], the
    bits of torch's ``silu(gate) * up`` (``bq_silu_mul``: SLEEF's exp, as torch's vectorized silu), computed the
    same way on every machine, so that a pass through :class:`LayerStack` and one op by op agree."""
    if gu.dtype != torch.float32 or gu.dim() != 2 or gu.shape[1] % 2 or not gu.is_contiguous():
        raise ValueError(f"silu_mul: gu must be a contiguous float32 [T, 2 I], got {gu.dtype} {list(gu.shape)}")
    out = torch.empty(gu.shape[0], gu.shape[1] // 2, dtype=torch.float32)
    lib.bq_silu_mul(gu.data_ptr(), gu.shape[0], gu.shape[1] // 2, out.data_ptr())
    return out


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", ctypes.c_void_p), ("o", ctypes.c_void_p), ("gu", ctypes.c_void_p), ("down", ctypes.c_void_p),
                ("n_qkv", ctypes.c_int32), ("n_o", ctypes.c_int32), ("n_gu", ctypes.c_int32),
                ("n_down", ctypes.c_int32), ("norm_in", ctypes.c_void_p), ("norm_mlp", ctypes.c_void_p),
                ("window", ctypes.c_int64)]


class _Pass(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_int64) for name in ("T", "hidden", "h_q", "h_kv", "d", "inter", "c_row", "c_head",
                                                       "c_pos")),
                *((name, ctypes.c_void_p) for name in ("cos", "sin", "rows", "slots")),
                ("nq", ctypes.c_int64), ("meta", ctypes.c_void_p), ("path", ctypes.c_void_p),
                ("attend", ctypes.c_void_p), ("eps", ctypes.c_float), ("scale", ctypes.c_float),
                ("planes", ctypes.c_int32), ("nthreads", ctypes.c_int32)]


class LayerStack:
    """Every layer of a Llama-family lean forward whose products are all blockq's, run in one native call a pass
    (``bq_layers``): per layer the same kernel calls, in the same order, as the forward's op-by-op path with
    blockq's glue (the normed q/k/v product, rotary and cache writes, exact attention, the residual adds, the
    normed gate/up product, :func:`silu_mul`, the down product), so the same bits, without a dozen Python calls
    and torch ops a layer (a third of SmolLM2's 10 ms step at gguf16).

    ``layers``: per layer (norm_in, w_qkv, b_qkv, wo, bo, norm_mlp, w_gu, wd, window); ``attend``: the compiled
    exact attention (``exact_attention.kernel()``). Raises ValueError for weights it cannot run (not blockq's,
    a gate/up of unequal halves, mixed activation precisions)."""

    def __init__(self, lib: ctypes.CDLL, layers: Sequence[tuple], shape: tuple[int, int, int, int], eps: float,
                 scale: float, attend: ctypes._CFuncPtr) -> None:
        self.lib = lib
        self.hidden, self.h_q, self.h_kv, self.d = shape
        self._keep = []  # the records' arrays and the tensors they point into
        self.records = (_Layer * len(layers))()
        planes = set()
        self.inter = None
        for rec, (norm_in, w_qkv, b_qkv, wo, bo, norm_mlp, w_gu, wd, window) in zip(self.records, layers, strict=True):
            for w in (w_qkv, wo, w_gu, wd):
                if not isinstance(w, (BlockWeight, BlockConcat)):
                    raise ValueError(f"LayerStack runs blockq's weights only, got {type(w).__name__}")
                planes.add(w.planes)
            inter = w_gu.shape[0] // 2
            if (w_gu.shape[0] % 2 or wd.shape[1] != inter or (self.inter or inter) != inter
                    or w_qkv.shape != ((self.h_q + 2 * self.h_kv) * self.d, self.hidden)
                    or wo.shape != (self.hidden, self.h_q * self.d) or w_gu.shape[1] != self.hidden):
                raise ValueError(f"LayerStack: shapes do not fit a Llama layer: {w_qkv.shape} {wo.shape} "
                                 f"{w_gu.shape} {wd.shape}")
            self.inter = inter
            for field, (w, b) in zip(("qkv", "o", "gu", "down"), ((w_qkv, b_qkv), (wo, bo), (w_gu, None), (wd, None)),
                                     strict=True):
                placed = w._placed if isinstance(w, BlockConcat) else [(w, 0)]
                if b is not None:  # (copies: a model's own parameters may be given other storage later)
                    b = b.detach().clone()
                    if b.dtype != torch.float32 or tuple(b.shape) != (w.shape[0],):
                        raise ValueError(f"LayerStack: a bias must be float32 [{w.shape[0]}]")
                arr = _parts(placed, b)
                self._keep += [arr, b]
                setattr(rec, field, ctypes.addressof(arr))
                setattr(rec, "n_" + field, len(placed))
            for field, t in (("norm_in", norm_in), ("norm_mlp", norm_mlp)):
                t = t.detach().clone()
                if t.dtype != torch.float32 or tuple(t.shape) != (self.hidden,):
                    raise ValueError(f"LayerStack: norm weights must be float32 [{self.hidden}]")
                self._keep.append(t)
                setattr(rec, field, t.data_ptr())
            rec.window = window or 0
        if len(planes) != 1:
            raise ValueError(f"LayerStack needs one activation precision, got planes {sorted(planes)}")
        self.planes = planes.pop()
        self.eps, self.scale = float(eps), float(scale)
        self.attend = ctypes.cast(attend, ctypes.c_void_p).value

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor,
                 slots: torch.Tensor, meta: np.ndarray, path: np.ndarray, keys: Sequence[torch.Tensor],
                 values: Sequence[torch.Tensor]) -> torch.Tensor:
        """``x`` [T, hidden] (float32, contiguous; changed in place and returned) through every layer: ``cos``/``sin``
        [T, d] contiguous, ``rows``/``slots`` [T] int64 (where each token's keys/values go), ``meta``/``path``
        (exact_attention.plan of every query), ``keys``/``values`` the cache's per-layer buffers
        [rows, h_kv, capacity, d], all of one layout."""
        T = x.shape[0]
        for name, t in (("cos", cos), ("sin", sin)):
            if t.dtype != torch.float32 or not t.is_contiguous() or t.numel() != T * self.d:
                raise ValueError(f"LayerStack: {name} must be contiguous float32 [T, {self.d}]")
        if (x.dtype != torch.float32 or not x.is_contiguous() or tuple(x.shape) != (T, self.hidden)
                or rows.dtype != torch.int64 or slots.dtype != torch.int64 or not rows.is_contiguous()
                or not slots.is_contiguous() or len(keys) != len(self.records) or len(values) != len(keys)):
            raise ValueError("LayerStack: x must be a contiguous float32 [T, hidden]; rows/slots int64 [T]; "
                             "one key and value buffer a layer")
        stride = keys[0].stride()
        for k, v in zip(keys, values, strict=True):
            if k.stride() != stride or v.stride() != stride or k.dtype != torch.float32 or v.dtype != torch.float32:
                raise ValueError("LayerStack: the cache's buffers must share one float32 layout")
        # the caches' addresses per call (the records stay as built: a forward's passes may use other caches)
        kbufs = (ctypes.c_void_p * len(keys))(*(k.data_ptr() for k in keys))
        vbufs = (ctypes.c_void_p * len(values))(*(v.data_ptr() for v in values))
        threads = max(1, getattr(_local, "threads", None) or torch.get_num_threads())
        p = _Pass(T, self.hidden, self.h_q, self.h_kv, self.d, self.inter, stride[0], stride[1], stride[2],
                  cos.data_ptr(), sin.data_ptr(), rows.data_ptr(), slots.data_ptr(), len(meta), meta.ctypes.data,
                  path.ctypes.data, self.attend, self.eps, self.scale, self.planes, threads)
        rc = self.lib.bq_layers(ctypes.byref(p), self.records, len(self.records), x.data_ptr(), kbufs, vbufs)
        if rc != 0:
            raise (MemoryError if rc == -1 else ValueError)(f"bq_layers failed ({rc})")
        return x

class BlockWeight:
    """A matrix [N, K] kept in a GGUF block format (``TYPES``): ``raw`` is its GGUF rows as uint8 [N, row_bytes]
    (a read-only memmap of the file is fine: the bytes are copied, rearranged for the kernel: as many bytes, but
    Q4_K's 6-bit scales unpacked, 148 bytes a block of 256 against 144).

    - ``mm(x, b=None)``: ``x @ W.T + b`` for float32 x [M, K] (any strides), exact per row (module docstring);
    - ``rows(ids)``: rows of W dequantized exactly (embedding lookups); ``dequantize()``: all of W;
    - ``BlockWeight.concat([wq, wk, wv])``: one product for matrices that share their input (any types).

    Example: ``BlockWeight("Q8_0", raw, shape=(2, 32)).mm(torch.ones(1, 32))`` -> a [1, 2] tensor."""

    is_mkldnn = False  # (read where weights are told apart)
    kernel = "blockq"  # the integer product (``Engine.numerics``), as ``RowInt8Weight.kernel`` names its own

    def __init__(self, ggml_type: str, raw: np.ndarray, shape: tuple[int, int], planes: int = 1,
                 layout: np.ndarray | None = None) -> None:
        if planes not in (1, 2):
            raise ValueError(f"planes must be 1 (8-bit activations) or 2 (about 15 bits), got {planes!r}")
        if ggml_type not in _TYPES:
            raise ValueError(f"unsupported ggml type {ggml_type!r}; supported: {', '.join(TYPES)}")
        N, K = (int(v) for v in shape)
        code, bs, nbytes = _TYPES[ggml_type]
        if N <= 0 or K <= 0 or K % bs:
            raise ValueError(f"{ggml_type} needs K a multiple of {bs} (and N, K > 0), got shape {(N, K)}")
        raw = np.asarray(raw)
        if raw.dtype != np.uint8:
            raise ValueError(f"raw must be uint8 GGUF bytes, got {raw.dtype}")
        row_bytes = K // bs * nbytes
        if raw.size != N * row_bytes:
            raise ValueError(f"raw holds {raw.size} bytes; {ggml_type} {N}x{K} needs {N} rows of {row_bytes}")
        raw = raw.reshape(N, row_bytes)
        self.ggml_type, self.shape, self._code, self.planes = ggml_type, (N, K), code, planes
        self._row_bytes = row_bytes + (K // 256 * 4 if ggml_type == "Q4_K" else 0)
        if layout is not None:  # raw already repacked (a stored copy: lean_weights' store), raw itself not read
            if not isinstance(layout, np.ndarray) or layout.dtype != np.uint8 \
                    or layout.shape != (N, self._row_bytes) or not layout.flags["C_CONTIGUOUS"]:
                raise ValueError(f"layout must be contiguous uint8 [{N}, {self._row_bytes}] for {ggml_type} {N}x{K}, "
                                 f"got {getattr(layout, 'dtype', type(layout).__name__)} "
                                 f"{list(getattr(layout, 'shape', ()))}")
            self._data = layout
        else:
            self._data = np.empty((N, self._row_bytes), dtype=np.uint8)  # the kernel's layout (blockq.c)
            raw = np.ascontiguousarray(raw)
            if _need_kernel(None).bq_repack(code, raw.ctypes.data, N, K, self._data.ctypes.data,
                                            torch.get_num_threads()) != 0:
                raise ValueError(f"bq_repack refused {ggml_type} {N}x{K}")
        self._last: tuple[int, ctypes.Array] | None = None  # (bias address, part records) of the last product
        assert self._data.shape == (N, self._row_bytes), (self._data.shape, self._row_bytes)

    @property
    def nbytes(self) -> int:
        return int(self._data.nbytes)

    def __repr__(self) -> str:
        return f"BlockWeight({self.ggml_type}, {self.shape[0]}x{self.shape[1]})"

    def mm(self, x: torch.Tensor, b: torch.Tensor | None = None,
           norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """``x @ W.T + b``: x float32 [M, K] -> [M, N] float32 (row r depends on x[r] alone, bit for bit).
        ``norm`` (weight, eps): of x's RMS-normed rows, as ``_run`` says."""
        return self._mm(x, b, norm=norm)

    def _mm(self, x: torch.Tensor, b: torch.Tensor | None = None, lib: ctypes.CDLL | None = None,
            norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        return _run(_need_kernel(lib), [(self, 0)], self.shape[0], self.shape[1], x, b, self, norm)

    def rows(self, ids: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
        """Rows ``ids`` (integer tensor [T]) of W, dequantized exactly: [T, K] float32."""
        lib = _need_kernel(lib)
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"ids must be an integer tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
        idx = np.ascontiguousarray(ids.reshape(-1).cpu().numpy().astype(np.int64))
        if idx.size and (idx.min() < 0 or idx.max() >= self.shape[0]):
            raise ValueError(f"row ids out of range [0, {self.shape[0]}): {idx.min()}..{idx.max()}")
        out = torch.empty(idx.size, self.shape[1], dtype=torch.float32)
        rc = lib.bq_dequantize_rows(self._code, self._data.ctypes.data, self._row_bytes, self.shape[1],
                                    idx.ctypes.data, idx.size, out.data_ptr())
        if rc != 0:
            raise ValueError(f"bq_dequantize_rows failed ({rc})")
        return out.reshape(*ids.shape, self.shape[1])

    def dequantize(self) -> torch.Tensor:
        """All of W as float32 [N, K], exactly the values ``gguf.quants.dequantize`` gives."""
        return self.rows(torch.arange(self.shape[0]))

    @staticmethod
    def concat(parts: Sequence[BlockWeight]) -> BlockConcat:
        """One product for matrices sharing their input (q/k/v, gate/up): outputs side by side along N."""
        return BlockConcat(parts)


class BlockConcat:
    """Several :class:`BlockWeight` of the same K as one [sum N, K] matrix: ``mm`` quantizes the activations
    once and writes each part's columns into one output, bit-identical to the parts' own products side by
    side. ``splits``: each part's N (for ``torch.split``)."""

    is_mkldnn = False
    kernel = BlockWeight.kernel

    def __init__(self, parts: Sequence[BlockWeight]) -> None:
        parts = list(parts)
        if not parts or not all(isinstance(p, BlockWeight) for p in parts):
            raise ValueError("concat needs one or more BlockWeight")
        K = parts[0].shape[1]
        if any(p.shape[1] != K for p in parts):
            raise ValueError(f"concat needs one K, got {[p.shape for p in parts]}")
        if len({p.planes for p in parts}) != 1:
            raise ValueError(f"concat needs one activation precision, got planes {[p.planes for p in parts]}")
        self.planes = parts[0].planes
        self.parts = parts
        self.splits = tuple(p.shape[0] for p in parts)
        self.shape = (sum(self.splits), K)
        self.ggml_type = "+".join(p.ggml_type for p in parts)
        # each part with its first output column, as the kernel's records take them
        self._placed = list(zip(parts, np.cumsum((0, *self.splits[:-1])).tolist(), strict=True))
        self._last: tuple[int, ctypes.Array] | None = None  # as BlockWeight's

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def mm(self, x: torch.Tensor, b: torch.Tensor | None = None,
           norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """``x @ W.T + b`` with W the parts stacked along N: [M, sum N]; ``norm`` as ``BlockWeight.mm``'s."""
        return self._mm(x, b, norm=norm)

    def _mm(self, x: torch.Tensor, b: torch.Tensor | None = None, lib: ctypes.CDLL | None = None,
            norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        return _run(_need_kernel(lib), self._placed, self.shape[0], self.shape[1], x, b, self, norm)

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])
