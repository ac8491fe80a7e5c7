"""Weight formats: how a model's matrices are stored and multiplied, chosen with one option (``weights``).

A CPU decode step is bound by reading the weights, so bytes per weight decide plain speed. Formats
(``formats.FORMATS``; ``auto`` picks one, ``formats.resolve``):

- ``float32``: the model as ``transformers`` computes it (the lean forward packs it for oneDNN). The
  output is exactly ``transformers``' ``generate``'s.
- ``bfloat16``, ``float16``: half the bytes, rounded floating products whose summation order depends on
  how many rows share a pass; offered, documented as not exact (docs/formats.md), never a default on a CPU.
- ``int8``: every matrix (projections, MLP, LM head, embeddings) stored as int8 per output row with a
  float32 scale per row (:class:`RowInt8Weight`); at each product the activations are quantized to int8
  per token row (scale = the row's largest magnitude / 127), multiplied by ``torch._int_mm`` with int32
  accumulation and scaled back. Integer sums have no rounding, so a row's result depends on that row
  alone: with the lean forward's per-query attention (``lean.LeanForward``, exact formats) a token's
  logits are the same whatever else shares the pass, and speculation on and off give the same tokens.
  The output is the int8 model's own, not float32's.
- ``gguf``: the blocks of the GGUF file a converted model came from (Q4_K, Q6_K, Q5_0, Q4_1, Q8_0), read by
  ``gguf_weights`` and multiplied by ``blockq``'s native kernel (activations quantized per row and per block of
  32, integer sums, a fixed float order): exact as ``int8`` is, the file's own values, 4.5-8.5 bits a weight.

Worked example (one product, 1 token row, a 2 x 3 weight)::

    w = [[0.5, -1.0, 0.25], [2.0, 0.0, -2.0]]   row scales 1/127, 2/127 -> w_q = [[64, -127, 32], [127, 0, -127]]
    x = [[1.0, 2.0, -4.0]]                      row scale 4/127         -> x_q = [[32, 64, -127]]
    x_q @ w_q.T = [[2048 - 8128 - 4064, 4064 + 16129]] = [[-10144, 20193]]  (exact int32)
    y = [[-10144 * 4/127 * 1/127, 20193 * 4/127 * 2/127]] = [[-2.516, 10.017]]   (float: -2.5, 10.0)

The ``auto`` default on a CPU is ``gguf`` for a model named by its GGUF where the kernel builds, else the fastest
exact format measured on the machine (``formats.int8_verdict``: does ``torch._int_mm`` run here, is its result the
exact integer product, and is it faster than float32 on a decode-sized product; remembered per machine and torch
version); on a GPU, today's floating default (``formats.resolve``).
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any

import torch

log = logging.getLogger(__name__)

# -- the int8 format ------------------------------------------------------------------------------------
def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], float32 scale [N]) of ``w`` [N, K]: each row symmetric, scale = its largest |w| / 127
    (an all-zero row gets scale 1: its int8 entries are 0 either way). ``w ~ q * scale[:, None]``."""
    w = w.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [M, K], float32 scale [M, 1]) of activations ``x`` [M, K], one scale per token row (its largest
    |x| / 127). Every step is elementwise or a max along the row, so a row's int8 values depend on that row
    alone (a max has no rounding)."""
    x = x.float()
    scale = x.abs().amax(dim=1, keepdim=True) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / scale).clamp_(-127, 127).to(torch.int8), scale


class Int8Rows:
    """An embedding table as int8 rows with a float32 scale per row (:func:`quantize_rows`): a lookup
    dequantizes the rows it reads. SmolLM2-135M's 49152 x 576 table: 28 MB against 113 MB in float32."""

    def __init__(self, w: torch.Tensor | None = None, q: torch.Tensor | None = None,
                 scale: torch.Tensor | None = None) -> None:
        if w is not None:
            q, scale = quantize_rows(w)
        assert q is not None and scale is not None
        self.q, self.scale = q, scale
        self.shape = tuple(q.shape)

    def state(self) -> dict[str, torch.Tensor]:
        """The int8 rows and their scales (``q``, ``scale``): ``Int8Rows(q=..., scale=...)`` makes it again."""
        return {"q": self.q, "scale": self.scale}

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The dequantized rows ``ids`` [T] -> [T, in] float32."""
        return self.q[ids].float() * self.scale[ids][:, None]


KERNELS = ("int_mm", "fbgemm")  # the exact int8 products (RowInt8Weight), chosen by int8_verdict
PIN = 16  # fbgemm kernel: columns appended to each activation row (+1, -1, zeros), a multiple of 8 in all


class RowInt8Weight:
    """A matrix ``w`` [out, in] as int8 per output row, multiplied with activations quantized per token row,
    integer products summed in int32 (exact), then scaled back: a row of the result depends only on that
    row of ``x`` (the format's batch invariance). Two kernels (:data:`KERNELS`, ``int8_verdict`` picks the
    faster here):

    - ``int_mm``: ``torch._int_mm`` on int8 activations (scale = the row's largest |x| / 127), weights
      stored N x K and passed transposed (``w_q.t()``), the layout it runs fastest on: on a CPU with
      AVX512-VNNI, Qwen2.5-Coder-1.5B's 8960 x 1536 matrix took 1.07 / 1.39 / 2.13 / 3.26 ms for 1 / 8 / 16 /
      32 rows (one thread) against float32's 2.84 / 7.42 / 9.82 / 14.01; on an AVX2-only CPU (this project's
      AMD EPYC) it is several times slower than float32.
    - ``fbgemm``: fbgemm's dynamic int8 linear (AVX2), which quantizes its input with ONE scale and zero
      point for the whole tensor (from its min and max), so a row's result would depend on the other
      rows. Pinned: each row is divided by its own largest |x| and gets two more columns, +1 and -1 (the
      weight's are zero), so every tensor's min and max are exactly -1 and +1 whatever its rows: the
      tensor's scale is every row's, the integer sums are exact (7-bit activations, ``reduce_range``, so
      no 16-bit saturation), and the result times the row's |x| max is the row's alone.
      Worked example: rows [2, -4] and [0.5, 0.25] -> [0.5, -1, 1, -1] and [1, 0.5, 1, -1]: min -1, max 1
      in any batch.

    Example: ``RowInt8Weight(w, "fbgemm").mm(x)`` ~ ``x @ w.T`` within about 2% of its largest entry."""

    is_mkldnn = False  # (read where weights are told apart)

    def __init__(self, w: torch.Tensor, kernel: str) -> None:
        self.kernel = kernel
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown int8 kernel {self.kernel!r}; one of {KERNELS}")
        self.shape = tuple(w.shape)
        self.q: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None
        if self.kernel == "int_mm":
            self.q, self.scale = quantize_rows(w)
        else:

            wide = torch.cat([w.detach().float(), torch.zeros(w.shape[0], PIN, dtype=torch.float32,
                                                                device=w.device)], dim=1)
            scale = (wide.abs().amax(dim=1).clamp_min(1e-12) / 127.0).double()
            zero = torch.zeros(w.shape[0], dtype=torch.long)
            with warnings.catch_warnings():  # torch >= 2.12 calls quantized tensors deprecated
                warnings.filterwarnings("ignore", message=".*quantize_per_channel.*")
                quantized = torch.quantize_per_channel(wide, scale, zero, 0, torch.qint8)
            self.params = torch.ops.quantized.linear_prepack(quantized, None)
            self._pins: dict[int, torch.Tensor] = {}

    def state(self) -> dict[str, torch.Tensor]:
        """The integers and scales this matrix is made of (``q``, ``scale``), for :meth:`from_state`: kept on
        disk so that a start reads them instead of quantizing the float32 model again (``lean_weights``)."""
        if self.kernel == "int_mm":
            return {"q": self.q, "scale": self.scale}
        return _fbgemm_state(self.params)

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], kernel: str, shape: tuple[int, int]) -> RowInt8Weight:
        """The matrix :meth:`state` described: the same integers and scales, so the same products bit for bit.
        ``shape``: the float matrix's (out, in) (the fbgemm kernel's integers hold ``PIN`` more columns)."""
        self = cls.__new__(cls)
        self.kernel, self.shape, self.q, self.scale = kernel, tuple(shape), None, None
        if kernel == "int_mm":
            self.q, self.scale = state["q"], state["scale"]
        else:
            self.params, self._pins = _fbgemm_prepack(state), {}
        return self

    def mm(self, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """``x [M, in] -> x @ w.T + b`` (float32), row by row exactly as for ``x``'s rows alone."""
        if self.kernel == "int_mm":
            xq, sx = quantize_activations(x)
            y = torch._int_mm(xq, self.q.t()).float() * sx * self.scale  # [M, out] exact integer sums, scaled
        else:
            x = x.float()
            sx = x.abs().amax(dim=1, keepdim=True)
            sx = torch.where(sx > 0, sx, torch.ones_like(sx))
            y = torch.ops.quantized.linear_dynamic(torch.cat((x / sx, self._pin(x.shape[0])), dim=1),
                                                   self.params, True) * sx
        return y if b is None else y + b

    def _pin(self, m: int) -> torch.Tensor:
        """[m, PIN] columns +1, -1, then zeros (kept per row count)."""
        pin = self._pins.get(m)
        if pin is None:
            pin = torch.zeros(m, PIN)
            pin[:, 0], pin[:, 1] = 1.0, -1.0
            if len(self._pins) < 64:
                self._pins[m] = pin
        return pin

    def as_rows(self) -> Int8Rows:
        """The same matrix as an embedding table (shares the int8 copy where the kernel keeps one)."""
        if self.q is not None and self.scale is not None:
            return Int8Rows(q=self.q, scale=self.scale)
        w = torch.ops.quantized.linear_unpack(self.params)[0].dequantize()[:, : self.shape[1]]
        return Int8Rows(w)


# -- smoothing: activation outliers moved into the weights before quantizing -------------------------------
SMOOTH_ALPHA = 0.5  # SmoothQuant's migration strength: s_j = amax|x_j|^a / amax|w_j|^(1 - a)
# a fixed calibration text (code and prose, as the benchmarks' workloads): its tokens feed one float forward
# whose per-channel input ranges decide the smoothing (the same text, so the same int8 model, at every start)
CALIBRATION_TEXT = (
    "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
    '    """Merge two sorted lists into one sorted list."""\n'
    "    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
    "            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n"
    "            j += 1\n    return out + a[i:] + b[j:]\n\n"
    "The report summarizes the quarterly results. Revenue grew by 12 percent, driven by strong demand in "
    "Europe and Asia, while operating costs stayed flat. The board approved a new dividend policy and "
    "announced plans to expand the research team in the coming year.\n"
    "User: How do I reverse a string in Python?\nAssistant: Use slicing: `text[::-1]` returns the string "
    "reversed. For a list, `items.reverse()` reverses it in place.\n"
    "SELECT customer_id, SUM(total) AS spent FROM orders GROUP BY customer_id ORDER BY spent DESC LIMIT 10;\n"
)


def input_ranges(model: Any, ids: list[int]) -> dict[str, torch.Tensor]:
    """Per-channel largest |input| [in] of every ``nn.Linear`` of ``model`` over one float forward of ``ids``
    (module name -> tensor): what :func:`smoothing` balances against the weights."""
    ranges: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            def hook(_m: Any, args: tuple, name: str = name) -> None:
                amax = args[0].detach().float().abs().reshape(-1, args[0].shape[-1]).amax(dim=0)
                ranges[name] = torch.maximum(ranges[name], amax) if name in ranges else amax
            hooks.append(module.register_forward_pre_hook(hook))
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids], device=next(model.parameters()).device))
    finally:
        for h in hooks:
            h.remove()
    return ranges


def smoothing(x_amax: torch.Tensor, weights: list[torch.Tensor], alpha: float = SMOOTH_ALPHA) -> torch.Tensor:
    """SmoothQuant's per-input-channel factors ``s`` [in] for matrices ``weights`` sharing one input: the
    input divided by ``s`` and the matrices' columns multiplied by it compute the same product, with the
    activations' outlier channels shrunk so that a per-row int8 scale resolves the others (``x / s`` is
    folded into the norm or matrix before, so nothing runs at decode time). Example: channel ranges
    [60, 1] against weight ranges [0.1, 0.1] -> s = [24.5, 3.2]: x / s ranges [2.4, 0.3]."""
    w_amax = torch.stack([w.detach().float().abs().amax(dim=0) for w in weights]).amax(dim=0)
    s = x_amax.float().clamp_min(1e-5).pow(alpha) / w_amax.clamp_min(1e-5).pow(1 - alpha)
    return s.clamp(1e-2, 1e3)


def weight_bytes(model: Any, lean: Any = None) -> int:
    """Bytes a plain step reads: of a quantized lean forward (``lean.int8``), its integer matrices and LM head
    (and their scales); else every parameter once (``parameters()`` yields a tied one once), less an
    input embedding that is not also the LM head (a step reads one row of it: Qwen2.5-Coder-1.5B's 0.93 GB
    embedding is untied, so 6.2 of its 7.1 GB are read)."""
    if lean is not None and lean.int8:
        mats = [w for L in lean.layers for w in (L.w_qkv, L.wo, L.w_gu, L.wd)] + [lean.head]
        # a block matrix's own bytes (gguf: blockq.BlockWeight.nbytes); int8 entries and a float scale per row
        return sum(getattr(w, "nbytes", None) or int(w.shape[0]) * (int(w.shape[1]) + 4) for w in mats)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return total if embed.data_ptr() == head.data_ptr() else total - embed.numel() * embed.element_size()


# -- products: the float packed for oneDNN, fbgemm's dynamic int8 (drafts) ------------------------------
def linear(x: torch.Tensor, w: Any, b: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, in] -> x @ w.T + b``. A weight :func:`packed` for oneDNN runs through oneDNN's matmul; a
    :class:`~suffixspec.core.weights.RowInt8Weight` or a ``blockq.BlockWeight`` through its own ``mm`` (exact,
    row by row); an
    :class:`Int8Weight` (a draft model's) through fbgemm's int8 product; any other as ``(w @ x.T).T``, the
    same product, which MKL runs faster than ``torch.nn.functional.linear`` for the few rows of a decode
    pass (measured on this machine's AMD EPYC, one thread, SmolLM2's matrices: 8% faster at 1 row, 17-33%
    at 2-8). The result may be a transposed view: callers reshape (which copies) where they need rows."""
    if isinstance(w, Int8Weight):
        y = torch.ops.quantized.linear_dynamic(x.contiguous(), w.params, True)
        return y if b is None else y + b
    if not isinstance(w, torch.Tensor):  # RowInt8Weight, blockq's BlockWeight: their own exact product
        return w.mm(x, b)
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, b, "none", [], "")
    y = torch.mm(w, x.t()).t()
    return y if b is None else y + b


class Int8Weight:
    """A matrix ``w`` [out, in] quantized to int8 per output row, prepacked for fbgemm's dynamic linear
    (``torch.ops.quantized.linear_dynamic``: the input is quantized per pass, int8 products summed in
    int32, scaled back to float32). For draft models only (:func:`lean_forward` with ``weights="fbgemm"``):
    a draft's distribution is whatever its forward computes, so verification stays lossless, while a
    one-token step reads a quarter of the bytes. Measured on this CPU (one thread, matrices cycled so
    none stays in cache): Qwen2.5-Coder-0.5B's MLP matrices 0.39 / 0.17 ms against 1.13 / 0.60 ms packed
    in float32, its LM head 7.7 against 20.7 ms; relative error of a product about 1.7% of its largest
    entry (``reduce_range``: 7-bit inputs, as fbgemm needs on AVX2).

    Example: ``Int8Weight(w).shape == tuple(w.shape)``; ``linear(x, Int8Weight(w))`` ~ ``x @ w.T``."""

    is_mkldnn = False  # (read where weights are told apart)

    def __init__(self, w: torch.Tensor) -> None:
        w = w.detach().float()
        scale = (w.abs().amax(dim=1).clamp_min(1e-12) / 127.0).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # torch >= 2.12 calls quantized tensors deprecated: int8_works()
            warnings.filterwarnings("ignore", message=".*quantize_per_channel.*")  # says when they are gone
            quantized = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        self.params = torch.ops.quantized.linear_prepack(quantized, None)
        self.shape = tuple(w.shape)

    def state(self) -> dict[str, torch.Tensor]:
        """The integers and scales (``q``, ``scale``), for :meth:`from_state` (see ``RowInt8Weight.state``)."""
        return _fbgemm_state(self.params)

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> Int8Weight:
        """The matrix :meth:`state` described, prepacked again (the same products bit for bit)."""
        self = cls.__new__(cls)
        self.params, self.shape = _fbgemm_prepack(state), tuple(state["q"].shape)
        return self


def _fbgemm_state(params: Any) -> dict[str, torch.Tensor]:
    """(int8 [out, in], float64 scale [out]) of a matrix prepacked for fbgemm (zero points are 0)."""
    quantized = torch.ops.quantized.linear_unpack(params)[0]
    return {"q": quantized.int_repr().contiguous(), "scale": quantized.q_per_channel_scales().double().contiguous()}


def _fbgemm_prepack(state: dict[str, torch.Tensor]) -> Any:
    """fbgemm's prepacked matrix of integers and scales :func:`_fbgemm_state` gave."""
    q, scale = state["q"], state["scale"]
    zero = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch >= 2.12 calls quantized tensors deprecated (see int8_works)
        warnings.filterwarnings("ignore", message=".*per_channel_quantized.*")
        quantized = torch._make_per_channel_quantized_tensor(q, scale.double(), zero, 0)
    return torch.ops.quantized.linear_prepack(quantized, None)


@functools.cache
def int8_works() -> bool:
    """Whether this torch has fbgemm's int8 dynamic linear and it gives ``x @ w.T`` within 3% (checked
    once on a small random matrix)."""
    try:
        engines = torch.backends.quantized.supported_engines
        if not any(e in engines for e in ("x86", "fbgemm")):
            return False
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(48, 40, generator=gen), torch.randn(3, 40, generator=gen)
        want = x @ w.t()
        got = linear(x, Int8Weight(w))
        return bool((got - want).abs().max() <= 0.03 * want.abs().max())
    except (RuntimeError, AttributeError, TypeError):
        return False


PACK_ROWS = 4  # the row count oneDNN lays a packed weight out for (decode passes run 1 to a few dozen)


def packed(w: torch.Tensor) -> torch.Tensor:
    """``w`` [out, in] laid out in oneDNN's blocked format for :func:`linear`, or ``w`` itself where
    that is not available (another device or dtype, a torch without oneDNN) or not wanted
    (``SUFFIXSPEC_ONEDNN=0``, for the memory below).

    Why: on a CPU the BLAS behind ``torch.mm`` picks slow kernels for 2-16 rows (on AMD CPUs, MKL's
    generic path), which is exactly a verify pass. oneDNN's matmul on a pre-packed weight keeps a pass
    over a few rows near the cost of one row: measured on SmolLM2-135M-Instruct's lean forward (one
    thread, 400 tokens of context, CPU time), a pass over 1 + k tokens took the same time at k = 0
    and 1.3-1.4x less at k = 1..32 than ``(w @ x.T).T``. The packed copy is made once per model
    (:func:`lean_forward`); it replaces the fused q/k/v and gate/up copies and adds the size of the
    other matrices (the output and down projections and the LM head: +260 MB for SmolLM2-135M, +1 GB
    for Gemma 3 270M, whose head is 671 MB). Rounding differs from the unpacked product as any other
    summation order does (about 1e-6 relative), within the tolerance the lean tests and the batching
    probe hold every lean forward to."""
    if not packs(w.device, w.dtype):
        return w
    with torch.inference_mode():
        return torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)


def packs(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether :func:`packed` packs ``dtype`` weights on ``device`` (else it returns them as they are)."""
    kind = device if isinstance(device, str) else device.type
    return os.environ.get("SUFFIXSPEC_ONEDNN", "1") != "0" and _onednn_packs(kind, dtype)


@functools.cache
def _onednn_packs(device: str, dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and multiplies ``dtype`` weights on ``device`` and gives the product
    ``torch.mm`` gives (checked once on a small random matrix: the ops are torch's private ones, which
    can change between versions, and only float32 on a CPU is measured to pay)."""
    if device != "cpu" or dtype != torch.float32:
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        with torch.inference_mode():
            gen = torch.Generator().manual_seed(0)
            w, x, b = (torch.randn(*shape, generator=gen, dtype=dtype) for shape in ((48, 40), (3, 40), (48,)))
            got = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS), b,
                                                     "none", [], "")
        return bool(torch.allclose(got, x @ w.t() + b, rtol=1e-5, atol=1e-5))
    except (RuntimeError, AttributeError, TypeError):
        return False



# -- releasing the float weights once quantized -----------------------------------------------------------
def release(params: list[torch.Tensor], keep: Any = None) -> int:
    """Replace each parameter's data by one element broadcast to its shape (shape, dtype and device kept, so
    code that reads ``.shape`` still works; 4 bytes held): the float copy of a quantized matrix no longer
    stays resident. Returns the bytes released. The model's own forward then computes nonsense, so
    :func:`refuse_own_forward` makes it raise instead.

    ``keep``: the model, whose other parameters (norms, biases) get memory of their own: a converted
    model's weights are views of its memory-mapped safetensors file, which any one of them keeps mapped,
    with every page the quantization read still resident (SmolLM2 at int8: 632 MB of file pages after the
    build). Then freed heap memory goes back to the system (glibc's ``malloc_trim``)."""
    done = 0
    for p in params:
        if p.numel() > 1 and p.stride() != (0,) * p.dim():
            done += p.numel() * p.element_size()
            p.data = torch.zeros((), dtype=p.dtype, device=p.device).expand(p.shape)
    if keep is not None:
        gone = {id(p) for p in params}
        for p in keep.parameters():
            if id(p) not in gone and p.numel() > 1 and p.stride() != (0,) * p.dim():
                p.data = p.data.clone()
    trim_heap()
    return done


def trim_heap() -> None:
    """Return freed heap memory to the system (glibc's ``malloc_trim``; nothing elsewhere): glibc keeps what
    passes' large temporaries freed, so a server would grow request by request (docs/benchmarks.md)."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def refuse_own_forward(model: Any, fmt: str) -> None:
    """Make ``model``'s ``transformers`` forward (and so ``generate``) raise a clear error: its float weights
    were released when its lean forward quantized them to ``fmt`` (a lean weight kind)."""
    def forward(*_: Any, **__: Any) -> Any:
        raise RuntimeError(f"this model's weights are {fmt} (held by suffixspec's lean forward) and its float "
                           f"weights were released, so its transformers forward cannot run; load it with "
                           f"weights='float32' (--weights float32) to use transformers' own forward or generate")

    model.forward = forward
    model._suffixspec_weights = fmt  # read by released()


def released(model: Any) -> str | None:
    """The lean weight kind (``lean.KINDS``) whose forward holds ``model``'s weights (its float weights
    released), or None."""
    return getattr(model, "_suffixspec_weights", None)
