"""Lean forwards: a decoder's forward pass written with a handful of tensor operations.

One numerics path per architecture family, used by the target's verify pass (the scheduler's
packed pass over every request of a batch) and by draft models (one row, a causal chain). A
``transformers`` forward call spends milliseconds of CPU time in Python per pass (module hooks,
output classes, mask and cache bookkeeping: about 7 ms on the embedded 5-layer target, 2 ms on
the 2 x 96 draft), several times the compute of a pass over a few tokens; this pays almost none of
it. The numerics follow the family's ``modeling_*`` op for op (the norms in float32, rotary
embedding at the positions given, scaled dot-product attention with the row's mask), and the tests
compare the logits with ``transformers``' own forward per family (``tests/test_lean.py``).
Models of any other family run through their own forward (``runner.Runner``, ``DraftRunner``).

Families (:data:`FAMILIES`):

- ``llama``: Llama, Mistral, Qwen2 (q/k/v biases), their sliding windows per layer type;
  RMSNorm ``w * x / rms(x)``, SiLU-gated MLP.
- ``gemma3``: Gemma 3 text models; embeddings scaled by ``sqrt(hidden)``, RMSNorm ``(1 + w) * ...``,
  q/k norms per head, four norms per layer, GELU (tanh) gated MLP, one rotary table per layer type
  (local and global), sliding-window layers.

Rows are packed: the projections and the MLP run once over every row's real tokens (``sum(len(ids))``
of them, no padding to the widest row). Attention runs over each row's own keys (its cached length, or
only its window on a sliding layer), in one SDPA call per layer for each *group* of rows
(:meth:`LeanForward._grouping`): a group's rows are padded to its most queries and widest key range,
masked, which pays where a call's overhead costs more than the padding's arithmetic (on a GPU nearly
always; on a CPU only for rows of one shape: attention there is reading keys and values). Worked example (two rows: a tree
of 3 nodes after 2 cached tokens, a lone root after 5)::

    packed tokens   r0: root a b   r1: root        (4 tokens through every matmul)
    attention, apart     r0: 3 queries x (2 + 3) keys, tree mask    r1: 1 query x (5 + 1) keys, no mask
    attention, grouped   [r0, r1]: 2 x 3 queries x 6 keys, one mask (r1's padding queries see its root)

Masks are built on the device from each row's depths and ancestor block (``kv.tree_block``): the host
sends a few hundred numbers a pass, never a mask over every key. Grouped-query attention never copies
keys: a lone query or a causal prompt alone uses SDPA's ``enable_gqa``; masked rows stack the ``rep``
query heads that share a key head as ``rep * n`` queries of that head (mask rows repeated).
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from suffixspec.core.kv import SlotCache, key_span, layer_types, tree_block

log = logging.getLogger(__name__)

# model_type -> family
FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma3_text": "gemma3"}


@dataclass
class PassRow:
    """One row of a pass: what cache row ``row`` feeds after its ``past`` cached positions."""

    row: int  # cache row
    ids: list[int]  # the root (last committed token) then the draft nodes; or a prompt chunk
    parents: list[int] | None  # parents of ids[1:] as in Draft.parents (-1 = the root); None = a causal chain
    past: int  # cached positions before ids (where ids' keys/values are written)
    logits: str = "all"  # "all": a logits row per id; "last": the last id's; "none": keys/values only (a prompt)

    def __post_init__(self) -> None:
        if self.logits not in ("all", "last", "none"):
            raise ValueError(f"PassRow.logits is 'all', 'last' or 'none', got {self.logits!r}")
        if self.parents is not None and len(self.parents) != len(self.ids) - 1:
            raise ValueError(f"PassRow has {len(self.ids)} ids and {len(self.parents)} parents; give one per node")

    @property
    def wanted(self) -> int:
        """Logits rows this row returns (its last ``wanted`` ids)."""
        return {"all": len(self.ids), "last": 1, "none": 0}[self.logits]


_LEAN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its LeanForward (fused weights once)
_LEAN_INT8: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its int8 LeanForward (drafts)
_BROKEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> why its lean forward failed to build


def lean_forward(model: Any, int8: bool = False) -> LeanForward | None:
    """The lean forward of ``model`` (one per model, so its fused weights exist once however many
    runners use it), or None when it runs through its own forward: its family has none
    (:func:`unsupported` says why), or building it failed. ``int8``: its matrices quantized
    (:class:`Int8Weight`, a draft model's; None where :func:`int8_works` is false).

    Building reads ``transformers`` internals (the rotary module's ``inv_freq``, config fields, the
    module layout), which a release may rename. Then the model's own forward serves it, the same
    tokens at its speed, and one warning per model says why::

        lean forward of LlamaForCausalLM unavailable (AttributeError: 'LlamaConfig' object has no
        attribute 'rms_norm_eps'); running the model's own forward
    """
    if model in _BROKEN or (int8 and not int8_works()):
        return None
    table = _LEAN_INT8 if int8 else _LEAN
    lean = table.get(model)
    if lean is not None:
        return lean
    try:
        if unsupported(model) is not None:
            return None
        lean = table[model] = LeanForward(model, int8=int8)
    except Exception as e:  # noqa: BLE001 - any failure to read the model: its own forward still runs
        _BROKEN[model] = f"{type(e).__name__}: {e}"
        log.warning("lean forward of %s unavailable (%s); running the model's own forward",
                    type(model).__name__, _BROKEN[model])
        return None
    return lean


def linear(x: torch.Tensor, w: torch.Tensor | Int8Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, in] -> x @ w.T + b``. A weight :func:`packed` for oneDNN runs through oneDNN's matmul; an
    :class:`Int8Weight` (a draft model's) through fbgemm's int8 product; any other as ``(w @ x.T).T``, the
    same product, which MKL runs faster than ``torch.nn.functional.linear`` for the few rows of a decode
    pass (measured on this machine's AMD EPYC, one thread, SmolLM2's matrices: 8% faster at 1 row, 17-33%
    at 2-8). The result may be a transposed view: callers reshape (which copies) where they need rows."""
    if isinstance(w, Int8Weight):
        y = torch.ops.quantized.linear_dynamic(x.contiguous(), w.params, True)
        return y if b is None else y + b
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, b, "none", [], "")
    y = torch.mm(w, x.t()).t()
    return y if b is None else y + b


class Int8Weight:
    """A matrix ``w`` [out, in] quantized to int8 per output row, prepacked for fbgemm's dynamic linear
    (``torch.ops.quantized.linear_dynamic``: the input is quantized per pass, int8 products summed in
    int32, scaled back to float32). For draft models only (:func:`lean_forward` with ``int8=True``):
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


# Models up to this many parameters step one token on their own (unpacked) matrices when the others are
# packed, as measured for SmolLM2-135M (plain step 81 vs 93 ms, idle machine); larger ones step on the packed
# matrices, which is faster for them: Qwen2.5-Coder-0.5B-Instruct 85 vs 138 CPU ms per one-token pass (one
# thread, context 400, load 8), and needs no second copy of the weights (see LeanForward.paged_out).
PLAIN_ONE_TOKEN_MAX_PARAMS = 300_000_000


def page_out(tensors: list[torch.Tensor]) -> int:
    """Ask the kernel to drop the resident pages of ``tensors`` (``madvise(MADV_PAGEOUT)``, Linux 5.4+); the
    bytes asked for, 0 where the call is not available.

    Why: a converted folder's weights are memory-mapped from its safetensors file
    (``loading._load_converted``), so once the lean forward has packed its own copy of a matrix, the model's
    copy is clean file-backed memory that nothing reads. Paged out, it leaves the process's resident memory
    (Qwen2.5-Coder-1.5B: 12.1 GB resident with both copies, 6.9 GB after), and the model's own forward still
    works: a page it reads again faults back in from the file. Memory that no file backs (a model built in
    memory) has nothing to drop without swap, so the hint is safe on any tensor; it never changes a value.
    Example: a 48 MB matrix at 0x7f10_0000_0000 -> madvise(0x7f10_0000_0000, 48 MB, MADV_PAGEOUT)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        page = os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 0
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    done = 0
    for t in tensors:
        if t.device.type != "cpu" or t.is_mkldnn or not t.is_contiguous():
            continue
        start = -(-t.data_ptr() // page) * page  # whole pages inside the tensor only
        end = (t.data_ptr() + t.numel() * t.element_size()) // page * page
        if end > start and libc.madvise(start, end - start, 21) == 0:  # 21: MADV_PAGEOUT
            done += end - start
    return done


class paging_own_forward:
    """While inside, every decoder layer (and the LM head) of ``model`` pages its matrices out again right
    after running (:func:`page_out`), so a run of the model's own forward whose lean forward has paged them
    out (``LeanForward.paged_out``) adds one layer's weights to the resident memory, not all of them: the
    batching probe's three forwards at a first start would otherwise bring Qwen2.5-Coder-1.5B's 6.6 GB
    back beside the packed copy. Does nothing for a model whose matrices were not paged out."""

    def __init__(self, model: Any) -> None:
        paged = any(getattr(t.get(model), "paged_out", 0) for t in (_LEAN, _LEAN_INT8))
        self.modules = [*model.model.layers, model.get_output_embeddings()] if paged else []
        self.hooks: list[Any] = []

    def __enter__(self) -> None:
        for m in self.modules:
            own = [p.detach() for p in m.parameters() if p.dim() == 2]
            self.hooks.append(m.register_forward_hook(self._hook(own)))

    @staticmethod
    def _hook(own: list[torch.Tensor]) -> Any:
        def after(*_: Any) -> None:  # returns None: the layer's output stays as it is
            page_out(own)
        return after

    def __exit__(self, *exc: object) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []


def _stacked(x: torch.Tensor, ws: tuple[torch.Tensor, ...], b: torch.Tensor | None) -> torch.Tensor:
    """``x @ cat(ws).T + b`` from the separate matrices (q, k, v) without a fused copy of them."""
    y = torch.cat([torch.mm(w, x.t()) for w in ws]).t()
    return y if b is None else y + b


def family(model: Any) -> str | None:
    """The lean family of ``model``, or None when it runs through its own forward (and why not is
    in :func:`unsupported`)."""
    return None if unsupported(model) else FAMILIES[model.config.model_type]


def unsupported(model: Any) -> str | None:
    """Why ``model`` has no lean forward, or None when it has one."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in FAMILIES:
        return f"no lean forward for model type {kind!r}"
    text = cfg.get_text_config(decoder=True)
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "embed_tokens"):
        return "unexpected module layout"
    try:
        layer_types(text)
    except ValueError as e:
        return str(e)
    if getattr(text, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    if FAMILIES[kind] == "llama":
        if getattr(text, "hidden_act", None) != "silu" or getattr(text, "mlp_bias", False):
            return "an MLP other than SiLU-gated without bias"
        rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            return f"rope type {rope.get('rope_type')!r}"
    else:
        if getattr(text, "attn_logit_softcapping", None) is not None:
            return "attention logit soft-capping"
        if getattr(text, "use_bidirectional_attention", False):
            return "bidirectional attention"
        if getattr(text, "hidden_activation", None) not in ("gelu_pytorch_tanh", "gelu"):
            return f"activation {getattr(text, 'hidden_activation', None)!r}"
        params = getattr(text, "rope_parameters", None) or {}
        if any((p or {}).get("rope_type", "default") != "default" for p in params.values()):
            return "a rope type other than default"
    return None


def _rotary_table(inner: Any, kind: str | None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [d/2], attention scaling) of the model's rotary embedding; ``kind``: the layer
    type of a model with one table per type (Gemma 3 keeps them as ``{kind}_inv_freq`` and
    ``{kind}_attention_scaling``), None for one table. A layout without these names raises
    AttributeError, and :func:`lean_forward` falls back to the model's own forward."""
    rotary = inner.rotary_emb
    if kind is None:
        return rotary.inv_freq, getattr(rotary, "attention_scaling", 1.0)
    return getattr(rotary, f"{kind}_inv_freq"), getattr(rotary, f"{kind}_attention_scaling", 1.0)


# what one SDPA call costs beyond its arithmetic, in attention scores (query x key x head), above which rows
# share a call padded to one shape. On a CPU: 0, rows share a call only where padding adds nothing (the
# same queries and keys). Measured on SmolLM2-135M-Instruct (suffixspec/bench/bench_attention.py: one thread, 8 rows
# at 300-500 tokens of context, CPU time, load 8): attention is a third of the pass (25 ms of 71 for 8
# plain steps, 41 of 123 for drafts of 0-8 nodes) and it is reading keys and values, not calls: one call
# per layer for all 8 rows took as long for rows of one shape (26 vs 25 ms; 42 vs 40 for drafts of 4) and
# longer once padded (60 vs 41 ms for the mixed drafts, the pass 1.2x)
CALL_SCORES = 0
# on a GPU a call's launches cost tens of microseconds, in which it computes millions of scores: nearly
# every row shares the call (an estimate, not measured here: no GPU); a prompt chunk of thousands of tokens
# still gets its own
GPU_CALL_SCORES = 10_000_000


@dataclass
class _Group:
    """Rows whose attention runs in one call per layer (:meth:`LeanForward._grouping`)."""

    rows: slice | torch.Tensor  # their cache rows: a slice when consecutive (keys read in place), else an index
    offset: int  # one row: its first packed token (its queries are q[offset : offset + width]); else 0
    width: int  # queries per row (the most of any row in the group)
    index: torch.Tensor | None  # several rows: [B * width] packed token of each padded query; None: one row
    scatter: tuple[torch.Tensor, torch.Tensor] | None  # (padded outputs that are real, their packed tokens)
    spans: dict[int | None, tuple[int, int, torch.Tensor | None, bool]]  # window -> (first key, end, mask, causal)


@dataclass
class _Layer:
    """One decoder layer's weights, fused where the matmuls allow (q, k, v; gate and up)."""

    norm_in: torch.Tensor  # [hidden] input norm weight (as used: 1 + w for Gemma)
    w_qkv: torch.Tensor | Int8Weight  # [(h_q + 2 h_kv) d, hidden] (packed, plain or int8: see linear)
    b_qkv: torch.Tensor | None  # [(h_q + 2 h_kv) d] or None
    q_norm: torch.Tensor | None  # [d] per-head norm of queries (Gemma 3), as used
    k_norm: torch.Tensor | None  # [d] per-head norm of keys
    wo: torch.Tensor | Int8Weight  # [hidden, h_q d]
    bo: torch.Tensor | None
    norm_post_attn: torch.Tensor | None  # Gemma: norm of the attention output before the residual
    norm_mlp: torch.Tensor  # norm before the MLP (Llama: post_attention_layernorm; Gemma: pre_feedforward)
    norm_post_mlp: torch.Tensor | None  # Gemma: norm of the MLP output before the residual
    w_gu: torch.Tensor | Int8Weight  # [2 intermediate, hidden]
    wd: torch.Tensor | Int8Weight  # [hidden, intermediate]
    window: int | None  # sliding window of this layer, None: full attention
    rope: str  # key of the rotary table (layer type)
    # the model's own matrices, for a pass over one token when the ones above are packed for oneDNN
    # (q, k, v; o; gate, up; down), or None when they are not packed or the model is larger than
    # PLAIN_ONE_TOKEN_MAX_PARAMS: for SmolLM2 one row's matrix-vector product on the plain layout was
    # faster than oneDNN's on the packed one (plain step 81 vs 93 ms), and these cost no memory (the
    # model holds them)
    plain: tuple[tuple[torch.Tensor, ...], torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor] | None = None


class LeanForward:
    """The lean forward of ``model`` (see the module docstring); ``__call__`` runs one packed pass."""

    def __init__(self, model: Any, int8: bool = False) -> None:
        problem = unsupported(model)
        if problem is not None:
            raise ValueError(f"no lean forward for this model: {problem}")
        cfg = model.config.get_text_config(decoder=True)
        inner = model.model
        self.family = FAMILIES[model.config.model_type]
        gemma = self.family == "gemma3"
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.scale = float(cfg.query_pre_attn_scalar) ** -0.5 if gemma else self.head_dim ** -0.5
        self.eps = float(cfg.rms_norm_eps)
        self.embed = inner.embed_tokens.weight
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        # Gemma scales embeddings by sqrt(hidden), rounded to the weights' dtype as transformers does
        self.embed_scale = torch.tensor(cfg.hidden_size ** 0.5, dtype=self.dtype, device=self.device) if gemma else None
        self.final_softcap = getattr(cfg, "final_logit_softcapping", None) if gemma else None
        types = layer_types(cfg)
        self.windows = sorted({w for _, w in types}, key=lambda w: (w is not None, w or 0))  # None first
        self.rope: dict[str, tuple[torch.Tensor, float]] = {}  # table key -> (inv_freq [d/2], scaling)
        for kind, _ in types:
            key = kind if gemma else "all"
            if key not in self.rope:
                inv, scaling = _rotary_table(inner, kind if gemma else None)
                self.rope[key] = (inv.float().to(self.device), float(scaling))
        norm = (lambda w: 1.0 + w.float()) if gemma else (lambda w: w)  # Gemma's norms scale by 1 + w
        self.layers: list[_Layer] = []
        cat = torch.cat
        small = sum(p.numel() for p in model.parameters()) <= PLAIN_ONE_TOKEN_MAX_PARAMS and not int8
        self.int8 = int8  # matrices quantized to int8 (a draft model's lean forward; Int8Weight)
        pack = Int8Weight if int8 else packed
        self.paged_out = 0  # bytes of the model's own matrices paged out once packed (see page_out)
        for layer, (kind, window) in zip(inner.layers, types, strict=True):
            att, mlp = layer.self_attn, layer.mlp
            projs = (att.q_proj, att.k_proj, att.v_proj)
            bias = None
            if any(p.bias is not None for p in projs):
                bias = cat([p.bias if p.bias is not None else torch.zeros(p.weight.shape[0], dtype=self.dtype,
                                                                            device=self.device) for p in projs])
            self.layers.append(_Layer(
                norm_in=norm(layer.input_layernorm.weight), w_qkv=pack(cat([p.weight for p in projs])), b_qkv=bias,
                q_norm=norm(att.q_norm.weight) if gemma else None, k_norm=norm(att.k_norm.weight) if gemma else None,
                wo=pack(att.o_proj.weight), bo=att.o_proj.bias,
                norm_post_attn=norm(layer.post_attention_layernorm.weight) if gemma else None,
                norm_mlp=norm(layer.pre_feedforward_layernorm.weight if gemma else layer.post_attention_layernorm.weight),
                norm_post_mlp=norm(layer.post_feedforward_layernorm.weight) if gemma else None,
                w_gu=pack(cat([mlp.gate_proj.weight, mlp.up_proj.weight])), wd=pack(mlp.down_proj.weight),
                window=window, rope=kind if gemma else "all"))
            own = (*(p.weight for p in projs), att.o_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight,
                   mlp.down_proj.weight)
            if self.layers[-1].w_qkv.is_mkldnn and small:
                self.layers[-1].plain = (tuple(p.weight.detach() for p in projs), att.o_proj.weight.detach(),
                                         (mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()),
                                         mlp.down_proj.weight.detach())
            elif self.layers[-1].w_qkv.is_mkldnn or int8:  # layer by layer: two copies never coexist in full
                self.paged_out += page_out([w.detach() for w in own])
        self.norm = norm(inner.norm.weight)
        self.head = pack(model.get_output_embeddings().weight)
        if (self.head.is_mkldnn or int8) and not small:
            # the embedding lookups read a tied head's rows again (paged back in one by one, as used)
            self.paged_out += page_out([model.get_output_embeddings().weight.detach()])
        self.onednn = self.head.is_mkldnn  # whether this forward's weights are packed (they all are, or none)
        self._positions = torch.arange(0, device=self.device)  # key positions for the masks (_arange)
        self.gemma = gemma
        # Gemma's MLP activation: "gelu_pytorch_tanh" is GELU's tanh approximation; None: SiLU (Llama)
        self.gelu = ("tanh" if cfg.hidden_activation == "gelu_pytorch_tanh" else "none") if gemma else None

    # -- pieces --------------------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm as the family computes it: in float32, scaled by ``weight`` (Llama: after the cast
        back to the weights' dtype; Gemma: ``(1 + w)`` in float32, then cast)."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gemma:
            return (h * weight).type_as(x)
        return weight * h.to(x.dtype)

    def _act(self, gate: torch.Tensor) -> torch.Tensor:
        if self.gelu is not None:
            return torch.nn.functional.gelu(gate, approximate=self.gelu)
        return torch.nn.functional.silu(gate)

    def _rotary(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """cos, sin [T, 1, d] per rotary table at ``positions`` [T] (as the model's rotary embedding)."""
        out = {}
        for key, (inv, scaling) in self.rope.items():
            freqs = positions[:, None].float() * inv  # [T, d/2]
            emb = torch.cat((freqs, freqs), dim=-1)
            out[key] = ((emb.cos() * scaling).to(self.dtype)[:, None], (emb.sin() * scaling).to(self.dtype)[:, None])
        return out

    def allocate(self, cache: SlotCache, positions: int) -> None:
        """Room for ``positions`` positions in every row of ``cache`` (its buffers made on first use)."""
        if not cache.keys:
            cache.allocate(len(self.layers), self.n_kv, self.head_dim, self.dtype, self.device)
        cache.reserve(cache.size, positions)

    # -- the pass ------------------------------------------------------------------------------
    @torch.inference_mode()
    def __call__(self, rows: list[PassRow], cache: SlotCache) -> list[torch.Tensor | None]:
        """Per row: logits [wanted, vocab] (float32), or None for a row that wants none.

        Row ``rows[j]`` writes its keys/values into cache row ``rows[j].row`` at ``past ..``; the
        caller sets the rows' lengths afterwards (``SlotCache.keep`` or ``lengths[row] = ...``)."""
        lin = linear
        h_q, h_kv, d = self.n_heads, self.n_kv, self.head_dim
        half = d // 2
        device, dtype = self.device, self.dtype
        self.allocate(cache, max(r.past + len(r.ids) for r in rows))
        offsets, ids, positions, cache_rows, slots, blocks = [], [], [], [], [], []
        total = 0
        for r in rows:
            n = len(r.ids)
            offsets.append(total)
            total += n
            ids.extend(r.ids)
            depth, block = tree_block(r.parents, n)
            blocks.append((depth, block))
            positions.append(depth + r.past)
            cache_rows.append(np.full(n, r.row))
            slots.append(np.arange(r.past, r.past + n))
        # everything a pass needs from the host, in one copy: token ids, positions, and where each packed
        # token's keys/values go (cache row, then position past + offset: its slot in the block, not its
        # tree depth; one indexed write per layer for every row)
        host = np.stack([np.asarray(ids, dtype=np.int64), np.concatenate(positions), np.concatenate(cache_rows),
                         np.concatenate(slots)])
        ids_t, pos_t, row_t, slot_t = torch.from_numpy(host).to(device)
        groups = [self._group(rows, offsets, blocks, g) for g in self._grouping(rows, blocks)]
        pick = self._pick(rows, offsets)
        x = self.embed[ids_t]  # [T, hidden]
        if self.embed_scale is not None:
            x = x * self.embed_scale
        rotary = self._rotary(pos_t)
        attn = torch.empty((total, h_q * d), dtype=dtype, device=device)
        for i, L in enumerate(self.layers):
            h = self._rms(x, L.norm_in)
            plain = L.plain if total == 1 else None  # one token: the model's own matrices (see _Layer.plain)
            qkv = (lin(h, L.w_qkv, L.b_qkv) if plain is None else _stacked(h, plain[0], L.b_qkv)
                   ).reshape(total, h_q + 2 * h_kv, d)
            qk, v = qkv[:, : h_q + h_kv], qkv[:, h_q + h_kv:]
            if L.q_norm is not None:
                qk = torch.cat((self._rms(qk[:, :h_q], L.q_norm), self._rms(qk[:, h_q:], L.k_norm)), dim=1)
            cos, sin = rotary[L.rope]
            qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin  # rotary embedding
            kbuf, vbuf = cache.keys[i], cache.values[i]
            kbuf.transpose(1, 2)[row_t, slot_t] = qk[:, h_q:]  # [rows, positions, heads, d] view of the buffer
            vbuf.transpose(1, 2)[row_t, slot_t] = v
            q_all = qk[:, :h_q].transpose(0, 1)  # [heads, T, d]
            for g in groups:
                self._attend(g, L.window, q_all, kbuf, vbuf, attn)
            o = lin(attn, L.wo if plain is None else plain[1], L.bo)
            x = x + (self._rms(o, L.norm_post_attn) if L.norm_post_attn is not None else o)
            h = self._rms(x, L.norm_mlp)
            gate, up = lin(h, L.w_gu).chunk(2, dim=-1) if plain is None else (lin(h, w) for w in plain[2])
            m = lin(self._act(gate) * up, L.wd if plain is None else plain[3])
            x = x + (self._rms(m, L.norm_post_mlp) if L.norm_post_mlp is not None else m)
        return self._logits(rows, pick, x)

    # -- attention, one call per group of rows ---------------------------------------------------
    def _grouping(self, rows: list[PassRow], blocks: list[tuple[np.ndarray, np.ndarray | None]]) -> list[list[int]]:
        """Which rows share an attention call (indices into ``rows``), each group in one SDPA call per layer.

        A call over several rows pads each to the group's most queries and widest key range (masked), so
        grouping pays where a call costs more than the padding's arithmetic: on a GPU nearly always (launches
        dominate a decode pass; :data:`GPU_CALL_SCORES` keeps a long prompt chunk apart); on a CPU only where
        the padding adds nothing (:data:`CALL_SCORES`: rows of the same queries and keys), since attention
        there is reading keys and values, which no grouping saves. A prompt over an empty cache (causal)
        stays alone. Rows are grouped greedily in order of (queries, keys). Example (CPU): four plain steps at
        400, 400, 400 and 900 cached tokens -> [[0, 1, 2], [3]]; on a GPU, [[0, 1, 2, 3]].
        """
        cost_of_call = CALL_SCORES if self.device.type == "cpu" else GPU_CALL_SCORES
        alone, others = [], []
        for j, (r, (_, block)) in enumerate(zip(rows, blocks, strict=True)):
            (alone if block is None and r.past == 0 and len(r.ids) > 1 else others).append(j)
        others.sort(key=lambda j: (len(rows[j].ids), rows[j].past))
        def scores(group: list[int]) -> int:  # of one call over the group, padded to its widest row
            return (len(group) * max(len(rows[k].ids) for k in group) * self.n_heads
                    * max(rows[k].past + len(rows[k].ids) for k in group))

        groups: list[list[int]] = [[j] for j in alone]
        current: list[int] = []
        for j in others:
            if current and scores(current + [j]) - scores(current) - scores([j]) > cost_of_call:
                groups.append(current)  # padding row j into the call costs more than a call of its own
                current = []
            current.append(j)
        if current:
            groups.append(current)
        # each group in cache-row order: consecutive rows (the scheduler's decoding rows are) read their keys
        # and values in place, where others copy them
        return [sorted(g, key=lambda j: rows[j].row) for g in groups]

    def _group(self, rows: list[PassRow], offsets: list[int], blocks: list[tuple[np.ndarray, np.ndarray | None]],
               members: list[int]) -> _Group:
        """The index tensors and per-window masks (built on the device) of one attention call."""
        device, rep = self.device, self.n_heads // self.n_kv
        sel = [rows[j] for j in members]
        ns = [len(r.ids) for r in sel]
        width = max(ns)
        cache_rows = [r.row for r in sel]
        first = cache_rows[0]
        keys_rows: slice | torch.Tensor = (slice(first, first + len(sel)) if cache_rows == list(range(first, first + len(sel)))
                                           else torch.tensor(cache_rows, device=device))
        spans: dict[int | None, tuple[int, int, torch.Tensor | None, bool]] = {}
        if len(sel) == 1:  # one row: its own tokens and keys, a mask only where it needs one
            r, (depth, block) = sel[0], blocks[members[0]]
            for w in self.windows:
                start, free, causal = key_span(depth, r.past, w, r.parents is None)
                mask = None if free else self._masks([r], [(depth, block)], w, start, rep)
                spans[w] = (start, r.past + ns[0], mask, causal)
            return _Group(keys_rows, offsets[members[0]], ns[0], None, None, spans)
        # several rows: queries padded to ``width`` each (a padding query repeats its row's first token
        # and sees only that row's root), keys to the group's widest range
        index = [offsets[j] + min(i, len(rows[j].ids) - 1) for j in members for i in range(width)]
        real = [b * width + i for b, n in enumerate(ns) for i in range(n)]
        dest = [offsets[j] + i for j in members for i in range(len(rows[j].ids))]
        host = torch.tensor([index, real + [0] * (len(index) - len(real)), dest + [0] * (len(index) - len(dest))])
        index_t, real_t, dest_t = host.to(device)
        end = max(r.past + n for r, n in zip(sel, ns, strict=True))
        for w in self.windows:
            start = min(0 if w is None else max(0, r.past - w + 1) for r in sel)
            spans[w] = (start, end, self._masks(sel, [blocks[j] for j in members], w, start, rep, end, width), False)
        return _Group(keys_rows, 0, width, index_t, (real_t[: len(real)], dest_t[: len(dest)]), spans)

    def _masks(self, sel: list[PassRow], blocks: list[tuple[np.ndarray, np.ndarray | None]], window: int | None,
               start: int, rep: int, end: int | None = None, width: int | None = None) -> torch.Tensor:
        """[B, 1, rep * width, end - start] additive mask of rows ``sel`` over keys ``[start, end)``, built on
        the device from each row's depths and ancestor block (a few hundred numbers from the host, not a
        mask of every key), its rows repeated for the ``rep`` query heads of a key head. An input at
        position ``P = past + depth`` sees a cached key ``k < past`` iff ``P - k < window``, and a node of
        its own block iff it is an ancestor (or itself) within the window (``kv.tree_mask``'s rule)."""
        device = self.device
        width = width or len(sel[0].ids)
        end = end or sel[0].past + len(sel[0].ids)
        depth = np.zeros((len(sel), width), dtype=np.int64)
        anc = np.zeros((len(sel), width, width), dtype=bool)
        for b, (r, (dep, block)) in enumerate(zip(sel, blocks, strict=True)):
            n = len(r.ids)
            depth[b, :n] = dep
            anc[b, :n, :n] = np.tril(np.ones((n, n), dtype=bool)) if block is None else block
            anc[b, n:, 0] = True  # padding queries see their row's root
        past = torch.tensor([r.past for r in sel], device=device)[:, None, None]  # [B, 1, 1]
        depth_t = torch.from_numpy(depth).to(device)
        anc_t = torch.from_numpy(anc).to(device)
        keys = self._arange(end)[start:end][None, None, :]  # [1, 1, K] key positions
        rel = keys - past  # [B, 1, K] offset into the row's block (< 0: cached)
        allowed = torch.gather(anc_t, 2, rel.clamp(0, width - 1).expand(-1, width, -1))  # [B, width, K]
        allowed &= (rel >= 0) & (rel < torch.tensor([len(r.ids) for r in sel], device=device)[:, None, None])
        if window is not None:  # a block key's position is past + its depth
            allowed &= (depth_t[:, :, None] - torch.gather(depth_t[:, None, :].expand(-1, width, -1), 2,
                                                           rel.clamp(0, width - 1).expand(-1, width, -1))) < window
        cached = rel < 0
        if window is not None:
            cached = cached & ((past + depth_t[:, :, None]) - keys < window)
        allowed |= cached
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=device).masked_fill_(~allowed,
                                                                                         torch.finfo(self.dtype).min)
        return (mask.repeat(1, rep, 1) if rep > 1 else mask)[:, None]

    def _arange(self, n: int) -> torch.Tensor:
        """``0 .. n - 1`` on the device, kept between passes (grown by doubling)."""
        if self._positions.numel() < n:
            self._positions = torch.arange(max(n, 2 * self._positions.numel()), device=self.device)
        return self._positions

    def _attend(self, g: _Group, window: int | None, q_all: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor,
                attn: torch.Tensor) -> None:
        """One SDPA call for the group's rows at one layer; writes their outputs into ``attn`` [T, h_q d]."""
        h_q, h_kv, d = self.n_heads, self.n_kv, self.head_dim
        rep = h_q // h_kv
        start, end, mask, causal = g.spans[window]
        keys, values = kbuf[g.rows, :, start:end], vbuf[g.rows, :, start:end]  # [B, h_kv, K, d]
        if g.index is None:  # one row, its tokens in order
            n = g.width
            q = q_all[:, g.offset : g.offset + n]  # [h_q, n, d]
            if mask is None:  # a lone query, or a causal prompt: no key copies with enable_gqa
                a = torch.nn.functional.scaled_dot_product_attention(
                    q[None], keys, values, is_causal=causal, scale=self.scale, enable_gqa=rep > 1)[0]  # [h_q, n, d]
            else:  # the rep query heads of a key head as rep * n queries of that head
                a = torch.nn.functional.scaled_dot_product_attention(
                    q.reshape(h_kv, rep * n, d)[None], keys, values, attn_mask=mask, scale=self.scale)[0].view(h_q, n, d)
            attn[g.offset : g.offset + n] = a.transpose(0, 1).reshape(n, h_q * d)
            return
        batch, width = keys.shape[0], g.width
        q = q_all.index_select(1, g.index).view(h_q, batch, width, d).transpose(0, 1)  # [B, h_q, width, d]
        a = torch.nn.functional.scaled_dot_product_attention(
            q.reshape(batch, h_kv, rep * width, d), keys, values, attn_mask=mask, scale=self.scale)
        out = a.view(batch, h_q, width, d).transpose(1, 2).reshape(batch * width, h_q * d)
        real, dest = g.scatter
        attn.index_copy_(0, dest, out.index_select(0, real))

    def _pick(self, rows: list[PassRow], offsets: list[int]) -> torch.Tensor | None:
        """The packed tokens whose logits the rows want, on the device (made before the layers run, so no
        copy from the host waits for them on a GPU), or None when no row wants any."""
        pick = [offsets[j] + i for j, r in enumerate(rows) for i in range(len(r.ids) - r.wanted, len(r.ids))]
        return torch.tensor(pick, device=self.device) if pick else None

    def _logits(self, rows: list[PassRow], pick: torch.Tensor | None, x: torch.Tensor) -> list[torch.Tensor | None]:
        """The wanted rows' logits (the final norm and head run on those rows only)."""
        want = [j for j, r in enumerate(rows) if r.wanted]
        out: list[torch.Tensor | None] = [None] * len(rows)
        if pick is None:
            return out
        logits = linear(self._rms(x.index_select(0, pick), self.norm), self.head)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        logits = logits.float().contiguous()
        at = 0
        for j in want:
            out[j] = logits[at : at + rows[j].wanted]
            at += rows[j].wanted
        return out

