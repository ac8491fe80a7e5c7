"""The lean forward's weights: a model's matrices fused, packed or quantized per weight kind, and a converted
model's quantized matrices kept on disk beside it.

:func:`build` turns a ``transformers`` decoder into :class:`LeanWeights` for one weight kind (``lean.KINDS``):

- ``float``: q/k/v and gate/up fused, every matrix packed for oneDNN where that pays (``weights.packed``).
- ``int8`` (exact): activation outliers moved into the weights first (``weights.smoothing``, from one float
  forward over ``weights.CALIBRATION_TEXT``), then every matrix as int8 rows (``weights.RowInt8Weight``).
- ``fbgemm`` (draft models): every matrix as ``weights.Int8Weight``.

The store. Quantizing is the slow part of a start: reading the float32 weights, the calibration forward and
the quantization come before packing (docs/formats.md has the figures). A model converted
into suffixspec's cache (``models.convert``; its folder is ``LoadedModel.cache_folder``) therefore keeps its
quantized matrices in one more file of that folder, ``lean-<kind>-<kernel>.safetensors``, written at the first
int8 start and read at the next ones: the same integers and scales, so the same logits bit for bit, and
the float32 file is never read. The file's metadata names what made it (:func:`store_key`: this module's
version, torch's, the kernel, the smoothing strength and the calibration's token ids); a file made
otherwise, damaged or unreadable is made again from the float weights. A new GGUF makes a new folder
(``models``), so a stored file never outlives its model. The ``gguf`` kinds keep the GGUF's blocks in the
kernel's layout (``lean-gguf-blockq.safetensors``, named by a hash of ``blockq.c``), which later starts map
rather than copy: the weights stay file pages, shared by every process of the model. Example::

    ~/.cache/suffixspec/models/qwen2.5-coder-1.5b-instruct/
        model.safetensors                     6.2 GB float32 (read at the first int8 start only)
        lean-int8-fbgemm.safetensors          1.8 GB int8 + scales + the smoothed norms
        lean-gguf-blockq.safetensors          1.0 GB the GGUF's blocks repacked (gguf, gguf16)
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from suffixspec.core.kv import layer_types
from suffixspec.core.weights import (
    PIN,
    SMOOTH_ALPHA,
    Int8Rows,
    Int8Weight,
    RowInt8Weight,
    input_ranges,
    packed,
    smoothing,
)

log = logging.getLogger(__name__)

# Models up to this many parameters step one token on their own (unpacked) matrices when the others are
# packed, as measured for SmolLM2-135M (plain step 81 vs 93 ms, idle machine); larger ones step on the packed
# matrices, which is faster for them: Qwen2.5-Coder-0.5B-Instruct 85 vs 138 CPU ms per one-token pass (one
# thread, context 400, load 8), and needs no second copy of the weights (see LeanWeights.paged_out).
PLAIN_ONE_TOKEN_MAX_PARAMS = 300_000_000
# model_type -> family
FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma3_text": "gemma3"}
MATRICES = ("w_qkv", "wo", "w_gu", "wd")  # a layer's matrices, as Layer names them
STORE_VERSION = 1  # bump when what the store holds or how build computes it changes


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
    out (``LeanWeights.paged_out``) adds one layer's weights to the resident memory, not all of them: the
    batching probe's three forwards at a first start would otherwise bring Qwen2.5-Coder-1.5B's 6.6 GB
    back beside the packed copy. Does nothing for a model whose matrices were not paged out."""

    def __init__(self, model: Any) -> None:
        paged = getattr(model, "_suffixspec_paged_out", 0)  # (set by build)
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


@dataclass
class Layer:
    """One decoder layer's weights, fused where the matmuls allow (q, k, v; gate and up)."""

    norm_in: torch.Tensor  # [hidden] input norm weight (as used: 1 + w for Gemma)
    w_qkv: torch.Tensor | Int8Weight | RowInt8Weight  # [(h_q + 2 h_kv) d, hidden] (packed, plain or int8: linear)
    b_qkv: torch.Tensor | None  # [(h_q + 2 h_kv) d] or None
    q_norm: torch.Tensor | None  # [d] per-head norm of queries (Gemma 3), as used
    k_norm: torch.Tensor | None  # [d] per-head norm of keys
    wo: torch.Tensor | Int8Weight | RowInt8Weight  # [hidden, h_q d]
    bo: torch.Tensor | None
    norm_post_attn: torch.Tensor | None  # Gemma: norm of the attention output before the residual
    norm_mlp: torch.Tensor  # norm before the MLP (Llama: post_attention_layernorm; Gemma: pre_feedforward)
    norm_post_mlp: torch.Tensor | None  # Gemma: norm of the MLP output before the residual
    w_gu: torch.Tensor | Int8Weight | RowInt8Weight  # [2 intermediate, hidden]
    wd: torch.Tensor | Int8Weight | RowInt8Weight  # [hidden, intermediate]
    window: int | None  # sliding window of this layer, None: full attention
    rope: str  # key of the rotary table (layer type)
    # the model's own matrices, for a pass over one token when the ones above are packed for oneDNN
    # (q, k, v; o; gate, up; down), or None when they are not packed or the model is larger than
    # PLAIN_ONE_TOKEN_MAX_PARAMS: for SmolLM2 one row's matrix-vector product on the plain layout was
    # faster than oneDNN's on the packed one (plain step 81 vs 93 ms), and these cost no memory (the
    # model holds them)
    plain: tuple[tuple[torch.Tensor, ...], torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor] | None = None


@dataclass
class LeanWeights:
    """What :func:`build` made of a model for one weight kind."""

    layers: list[Layer]
    norm: torch.Tensor  # [hidden] final norm weight (as used; divided by the LM head's smoothing at int8)
    head: torch.Tensor | Int8Weight | RowInt8Weight  # [vocab, hidden] LM head
    embed: torch.Tensor | Int8Rows  # [vocab, hidden] embedding table (int8 rows at a quantized kind)
    smoothed: bool  # activation outliers moved into the weights (the exact int8 kind, calibrated)
    paged_out: int  # bytes of the model's own matrices paged out once packed (see page_out)
    stored: str  # the store at this build: "read", "written", or "" (no store: not a converted model, or float)


@dataclass(frozen=True)
class Shape:
    """What :func:`build` reads of a model's config besides its modules."""

    n_heads: int  # query heads
    n_kv: int  # key-value heads
    head_dim: int
    gemma: bool  # Gemma 3's four norms per layer, (1 + w) norms, q/k norms
    types: list[tuple[str, int | None]]  # per layer: (rotary table kind, sliding window or None)


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


def rotary_table(inner: Any, kind: str | None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [d/2], attention scaling) of the model's rotary embedding; ``kind``: the layer
    type of a model with one table per type (Gemma 3 keeps them as ``{kind}_inv_freq`` and
    ``{kind}_attention_scaling``), None for one table. A layout without these names raises
    AttributeError, and :func:`lean.lean_forward` falls back to the model's own forward."""
    rotary = inner.rotary_emb
    if kind is None:
        return rotary.inv_freq, getattr(rotary, "attention_scaling", 1.0)
    return getattr(rotary, f"{kind}_inv_freq"), getattr(rotary, f"{kind}_attention_scaling", 1.0)


def build(model: Any, kind: str, shape: Shape) -> LeanWeights:
    """The lean forward's weights of ``model`` for the weight kind ``kind`` (see the module docstring): read
    from the store where a converted model has one for this kind, else made from the float weights (and
    stored for the next start where the model is a converted one)."""
    from suffixspec.core.formats import GGUF

    if kind in GGUF:
        return build_gguf(model, shape, planes=2 if kind == "gguf16" else 1)
    inner = model.model
    gemma = shape.gemma
    norm = (lambda w: 1.0 + w.float()) if gemma else (lambda w: w)  # Gemma's norms scale by 1 + w
    int8 = kind != "float"
    folder = getattr(model, "_suffixspec_folder", None) if int8 else None
    kernel = _kernel(kind) if int8 else ""
    calibration = getattr(model, "_suffixspec_calibration", None) if kind == "int8" else None
    key = store_key(kind, kernel, calibration)
    stored = read_store(folder, kind, kernel, key) if folder else None
    small = sum(p.numel() for p in model.parameters()) <= PLAIN_ONE_TOKEN_MAX_PARAMS and not int8
    pack: Callable[[torch.Tensor], Any] = {"float": packed, "int8": lambda w: RowInt8Weight(w, kernel),
                                           "fbgemm": Int8Weight}[kind]
    # the exact int8 kind moves activation outliers into the weights first, from one float forward over a
    # fixed calibration text (load_model leaves its ids on the model)
    ranges = input_ranges(model, calibration) if calibration and stored is None else None
    if stored is not None:  # the matrices prepacked again, on torch's threads (the slow part of a stored start)
        names = [f"{i}.{name}" for i in range(len(shape.types)) for name in MATRICES] + ["head"]
        stored.update(zip(names, prepack_all([lambda n=n: _unstate(stored, n, kind, kernel) for n in names]),
                          strict=True))
    layers: list[Layer] = []
    paged = 0
    for i, (layer, (rope, window)) in enumerate(zip(inner.layers, shape.types, strict=True)):
        att, mlp = layer.self_attn, layer.mlp
        projs = (att.q_proj, att.k_proj, att.v_proj)
        if stored is not None:
            m = {name: _kept(stored[f"{i}.{name}"]) for name in ("norm_in", "norm_mlp", "b_qkv")
                 if f"{i}.{name}" in stored}
            m.setdefault("b_qkv", None)
            m.update({name: stored[f"{i}.{name}"] for name in MATRICES})
        else:
            bias = None
            if any(p.bias is not None for p in projs):
                bias = torch.cat([p.bias if p.bias is not None else torch.zeros(p.weight.shape[0], dtype=p.weight.dtype,
                                                                                 device=p.weight.device) for p in projs])
            m = {"norm_in": norm(layer.input_layernorm.weight), "w_qkv": torch.cat([p.weight for p in projs]),
                 "b_qkv": bias, "wo": att.o_proj.weight,
                 "norm_mlp": norm(layer.pre_feedforward_layernorm.weight if gemma
                                  else layer.post_attention_layernorm.weight),
                 "w_gu": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), "wd": mlp.down_proj.weight}
            if ranges is not None:
                m = smooth_layer(m, ranges, f"model.layers.{i}.", mlp.up_proj.weight.shape[0], shape)
            m.update({name: pack(m[name]) for name in MATRICES})
        layers.append(Layer(
            norm_in=m["norm_in"], w_qkv=m["w_qkv"], b_qkv=m["b_qkv"],
            q_norm=norm(att.q_norm.weight) if gemma else None, k_norm=norm(att.k_norm.weight) if gemma else None,
            wo=m["wo"], bo=att.o_proj.bias,
            norm_post_attn=norm(layer.post_attention_layernorm.weight) if gemma else None,
            norm_mlp=m["norm_mlp"],
            norm_post_mlp=norm(layer.post_feedforward_layernorm.weight) if gemma else None,
            w_gu=m["w_gu"], wd=m["wd"], window=window, rope=rope if gemma else "all"))
        own = (*(p.weight for p in projs), att.o_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight,
               mlp.down_proj.weight)
        if layers[-1].w_qkv.is_mkldnn and small:
            layers[-1].plain = (tuple(p.weight.detach() for p in projs), att.o_proj.weight.detach(),
                                (mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()),
                                mlp.down_proj.weight.detach())
        elif (layers[-1].w_qkv.is_mkldnn or int8) and stored is None:  # layer by layer: two copies never coexist
            paged += page_out([w.detach() for w in own])
    embed: torch.Tensor | Int8Rows = inner.embed_tokens.weight
    head_weight = model.get_output_embeddings().weight
    if stored is not None:
        final = _kept(stored["norm"])
        head = stored["head"]
        embed = (Int8Rows(q=_kept(stored["embed.q"]), scale=_kept(stored["embed.scale"])) if "embed.q" in stored
                 else head.as_rows())
    else:
        final = norm(inner.norm.weight)
        if ranges is not None and "lm_head" in ranges:
            s_head = smoothing(ranges["lm_head"], [head_weight])
            final = final / s_head
            head = pack(head_weight.detach().float() * s_head)
        else:
            head = pack(head_weight)
        if int8:  # embeddings as int8 rows too (a tied head's own int8 copy where its kernel keeps one)
            tied = head_weight.data_ptr() == embed.data_ptr() and head_weight.shape == embed.shape
            embed = head.as_rows() if tied and isinstance(head, RowInt8Weight) and ranges is None else Int8Rows(embed)
        if (head.is_mkldnn or int8) and not small:
            # the embedding lookups read a tied head's rows again (paged back in one by one, as used)
            paged += page_out([head_weight.detach()])
    if paged:  # (read by paging_own_forward)
        model._suffixspec_paged_out = getattr(model, "_suffixspec_paged_out", 0) + paged
    smoothed = ranges is not None or (stored is not None and key["smoothing"] != "none")
    built = LeanWeights(layers=layers, norm=final, head=head, embed=embed, smoothed=smoothed, paged_out=paged,
                        stored="read" if stored is not None else "")
    if folder and stored is None:
        built.stored = "written" if write_store(folder, kind, kernel, key, built) else ""
    return built


def build_gguf(model: Any, shape: Shape, planes: int = 1) -> LeanWeights:
    """The ``gguf`` kind (``planes=2``: ``gguf16``, ~15-bit activations): the matrices are the blocks of the
    GGUF file the model was converted from (``gguf_weights``), multiplied by the block kernel (``blockq``); norms
    and biases are the model's own
    (float32, exactly the file's). A matrix of a type the kernel lacks (or q/k/v of mixed types with one
    such) is quantized from its dequantized values to int8 per output row (``RowInt8Weight``: exact per row, as
    at ``int8``), logged."""
    from suffixspec.core import blockq
    from suffixspec.core.gguf_weights import FileRows, read_matrices, source_file

    folder = getattr(model, "_suffixspec_folder", None)
    if folder is None:
        raise ValueError("weights 'gguf' needs a model converted from a GGUF file (a known name or a .gguf path)")
    inner = model.model
    gemma = shape.gemma
    norm = (lambda w: 1.0 + w.float()) if gemma else (lambda w: w)
    blocks = read_matrices(source_file(folder), len(shape.types), shape.n_heads, shape.n_kv)
    kernel = None
    key = blocks_key()
    stored = read_store(folder, "gguf", "blockq", key)
    made: dict[str, blockq.BlockWeight] = {}  # by the file's matrix names, for the store

    def block_weight(name: str) -> blockq.BlockWeight:
        nonlocal stored
        p = blocks[name]
        if stored is not None:
            try:  # the stored copy, mapped: neither repacked nor read from the GGUF
                made[name] = blockq.BlockWeight(p.ggml_type, p.raw, p.shape, planes, layout=stored[name].numpy())
                return made[name]
            except (KeyError, ValueError) as e:
                log.warning("the stored blocks in %s do not fit %s (%s); repacking the rest and storing them again",
                            store_path(folder, "gguf", "blockq"), name, e)
                stored = None
        made[name] = blockq.BlockWeight(p.ggml_type, p.raw, p.shape, planes)
        return made[name]

    def matrix(*names: str) -> Any:
        nonlocal kernel
        parts = [blocks[n] for n in names]
        if all(p.ggml_type in blockq.TYPES for p in parts):
            weights = [block_weight(n) for n in names]
            return weights[0] if len(weights) == 1 else blockq.BlockWeight.concat(weights)
        from gguf import GGMLQuantizationType, quants

        from suffixspec.core.formats import int8_kernel

        kernel = kernel or int8_kernel()
        log.info("%s: %s blocks requantized to int8 rows (the block kernel has %s)", "+".join(names),
                 "/".join(p.ggml_type for p in parts), ", ".join(blockq.TYPES))
        # (np.require: a float32 file's "dequantized" rows are its read-only mapping itself, which torch warns of)
        w = torch.cat([torch.from_numpy(np.require(quants.dequantize(p.raw, GGMLQuantizationType[p.ggml_type]),
                                                   requirements="W")) for p in parts])
        return RowInt8Weight(w, kernel)

    layers: list[Layer] = []
    for i, (layer, (rope, window)) in enumerate(zip(inner.layers, shape.types, strict=True)):
        att = layer.self_attn
        projs = (att.q_proj, att.k_proj, att.v_proj)
        bias = None
        if any(p.bias is not None for p in projs):
            bias = torch.cat([p.bias.detach().float() if p.bias is not None else torch.zeros(p.weight.shape[0])
                              for p in projs])
        layers.append(Layer(
            norm_in=norm(layer.input_layernorm.weight), w_qkv=matrix(f"{i}.q", f"{i}.k", f"{i}.v"), b_qkv=bias,
            q_norm=norm(att.q_norm.weight) if gemma else None, k_norm=norm(att.k_norm.weight) if gemma else None,
            wo=matrix(f"{i}.o"), bo=att.o_proj.bias,
            norm_post_attn=norm(layer.post_attention_layernorm.weight) if gemma else None,
            norm_mlp=norm(layer.pre_feedforward_layernorm.weight if gemma else layer.post_attention_layernorm.weight),
            norm_post_mlp=norm(layer.post_feedforward_layernorm.weight) if gemma else None,
            w_gu=matrix(f"{i}.gate", f"{i}.up"), wd=matrix(f"{i}.down"), window=window, rope=rope if gemma else "all"))
    tied = model.get_output_embeddings().weight.data_ptr() == inner.embed_tokens.weight.data_ptr()
    if "head" in blocks and not tied:  # the table is read only at lookups: from the file, where it is
        head = matrix("head")
        embed = FileRows(blocks["embed"])
    else:  # (a tied model's converted head is the table)
        head = embed = matrix("embed")
        if not hasattr(embed, "rows"):
            embed = embed.as_rows()
    # (stored is None: some matrix was repacked; the ones read from a store before it are written too)
    written = stored is None and bool(made) and write_blocks(folder, key, made)
    return LeanWeights(layers=layers, norm=norm(inner.norm.weight), head=head, embed=embed, smoothed=False,
                       paged_out=0, stored="written" if written else "read" if stored is not None else "")


def _kernel(kind: str) -> str:
    """The int8 kernel of a quantized kind: the exact one measured faster here, or fbgemm's plain one."""
    if kind == "fbgemm":
        return "fbgemm"
    from suffixspec.core.formats import int8_kernel

    return int8_kernel()


def smooth_layer(m: dict[str, Any], ranges: dict[str, torch.Tensor], prefix: str, inter: int, shape: Shape
                 ) -> dict[str, Any]:
    """One layer's norms and matrices with activation outliers moved into the weights (weights.smoothing):
    the q/k/v and gate/up inputs through their norms, the output projection's through v's rows (one
    factor per key-value head's channel, shared by the query heads that read it), the down
    projection's through up's rows. The same products in exact arithmetic; int8 rounds them better."""
    h_q, h_kv, d = shape.n_heads, shape.n_kv, shape.head_dim
    rep = h_q // h_kv
    out = dict(m)
    s_qkv = smoothing(ranges[prefix + "self_attn.q_proj"], [m["w_qkv"]])
    out["norm_in"] = m["norm_in"] / s_qkv
    w_qkv = m["w_qkv"].detach().float() * s_qkv
    s_o = smoothing(ranges[prefix + "self_attn.o_proj"], [m["wo"]])
    s_v = s_o.view(h_kv, rep, d).amax(dim=1).reshape(-1)  # [h_kv d]: query head h reads kv head h // rep
    out["wo"] = m["wo"].detach().float() * s_v.view(h_kv, 1, d).expand(h_kv, rep, d).reshape(-1)
    w_qkv[(h_q + h_kv) * d:] /= s_v[:, None]
    out["w_qkv"] = w_qkv
    if m["b_qkv"] is not None:
        b = m["b_qkv"].detach().float().clone()
        b[(h_q + h_kv) * d:] /= s_v
        out["b_qkv"] = b
    s_gu = smoothing(ranges[prefix + "mlp.gate_proj"], [m["w_gu"]])
    out["norm_mlp"] = m["norm_mlp"] / s_gu
    s_d = smoothing(ranges[prefix + "mlp.down_proj"], [m["wd"]])
    w_gu = m["w_gu"].detach().float() * s_gu
    w_gu[inter:] /= s_d[:, None]  # up's rows: the down projection's input is silu(gate) * up
    out["w_gu"] = w_gu
    out["wd"] = m["wd"].detach().float() * s_d
    return out


# -- the store ---------------------------------------------------------------------------------------------
def store_path(folder: str | Path, kind: str, kernel: str) -> Path:
    """Where a converted model's quantized matrices of ``kind`` on ``kernel`` are kept."""
    return Path(folder) / f"lean-{kind}-{kernel}.safetensors"


def store_key(kind: str, kernel: str, calibration: list[int] | None) -> dict[str, str]:
    """What a stored file must have been made with to be used (its safetensors metadata)."""
    ids = hashlib.sha256(",".join(map(str, calibration or [])).encode()).hexdigest()[:16]
    return {"store": str(STORE_VERSION), "torch": torch.__version__, "kind": kind, "kernel": kernel,
            "smoothing": f"{SMOOTH_ALPHA} {ids}" if calibration else "none"}


def blocks_key() -> dict[str, str]:
    """What a stored copy of the ``gguf`` kinds' repacked blocks must have been made with (one copy serves
    ``gguf`` and ``gguf16``: the weights' layout is the same)."""
    from suffixspec.core import blockq

    return {"store": str(STORE_VERSION), "kind": "gguf", "layout": blockq.layout_version()}


def read_store(folder: str | Path, kind: str, kernel: str, key: dict[str, str]) -> dict[str, Any] | None:
    """The stored tensors when the file exists and was made with ``key``, else None
    (a damaged or foreign file is logged and made again)."""
    path = store_path(folder, kind, kernel)
    if not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if {k: meta.get(k) for k in key} != key:
                log.info("the stored %s weights in %s were made otherwise (%s); making them again", kind, path, meta)
                return None
            # views of the file's mapping (read as used); what is kept beyond the build is cloned (_kept), so
            # the mapping, with every page the prepacking read, goes once the build returns
            tensors: dict[str, Any] = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - not a dict
    except Exception as e:  # noqa: BLE001 - any unreadable file: the float weights make it again
        log.warning("could not read the stored %s weights %s (%s: %s); making them again", kind, path,
                    type(e).__name__, e)
        return None
    return tensors


def write_store(folder: str | Path, kind: str, kernel: str, key: dict[str, str], built: LeanWeights) -> bool:
    """Keep ``built``'s quantized matrices in the store (``_save``); False where the folder cannot be written (the
    next start quantizes again)."""
    tensors: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(built.layers):
        for name in ("norm_in", "norm_mlp", "b_qkv"):
            value = getattr(layer, name)
            if value is not None:
                tensors[f"{i}.{name}"] = value.detach().contiguous()
        for name in MATRICES:
            tensors.update({f"{i}.{name}.{k}": v for k, v in getattr(layer, name).state().items()})
    tensors["norm"] = built.norm.detach().contiguous()
    tensors.update({f"head.{k}": v for k, v in built.head.state().items()})
    head_q = getattr(built.head, "q", None)
    if isinstance(built.embed, Int8Rows) and (head_q is None or built.embed.q.data_ptr() != head_q.data_ptr()):
        tensors.update({f"embed.{k}": v for k, v in built.embed.state().items()})
    return _save(store_path(folder, kind, kernel), tensors, key, f"the {kind} weights")


def write_blocks(folder: str | Path, key: dict[str, str], made: dict[str, Any]) -> bool:
    """Keep the ``gguf`` kinds' repacked blocks (``blockq.BlockWeight``, by the file's matrix names), which the
    next start maps instead of repacking: the Qwen pair's 1.5 GB then costs neither a repacking pass nor fresh
    memory to fault in (file pages, shared with other processes of the same model)."""
    tensors = {name: torch.from_numpy(w._data) for name, w in made.items()}
    return _save(store_path(folder, "gguf", "blockq"), tensors, key, "the repacked gguf blocks")


def _save(path: Path, tensors: dict[str, torch.Tensor], key: dict[str, str], what: str) -> bool:
    """Written whole, then renamed into place, so a reader never sees half a file; False where the folder cannot
    be written (the next start makes them again)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=key)
        os.replace(tmp, path)
    except (OSError, SafetensorError) as e:  # (safetensors reports its I/O errors as SafetensorError)
        log.info("could not keep %s in %s (%s); the next start makes them again", what, path, e)
        tmp.unlink(missing_ok=True)
        return False
    return True


def _kept(t: torch.Tensor) -> torch.Tensor:
    """A stored tensor in memory of its own (not a view of the file's mapping, which would keep it all mapped:
    Qwen2.5-Coder's pair read 5.1 GB resident with the embeddings as views, against 3.5 GB quantized fresh)."""
    return t.clone()


def _unstate(stored: dict[str, torch.Tensor], name: str, kind: str, kernel: str) -> RowInt8Weight | Int8Weight:
    """The weight object of ``name`` in the store (``<name>.q``, ``<name>.scale``), as its kind makes it (the
    prepacked kernels copy the integers; ``int_mm`` keeps them, so they are cloned out of the mapping)."""
    state = {"q": stored[f"{name}.q"], "scale": stored[f"{name}.scale"]}
    if kind != "fbgemm" and kernel != "fbgemm":
        state = {k: _kept(v) for k, v in state.items()}
    if kind == "fbgemm":
        return Int8Weight.from_state(state)
    cols = state["q"].shape[1] - (PIN if kernel == "fbgemm" else 0)
    return RowInt8Weight.from_state(state, kernel, (state["q"].shape[0], cols))


def prepack_all(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run ``jobs`` (prepacking matrices: torch releases the GIL meanwhile) on torch's thread count."""
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        return list(pool.map(lambda job: job(), jobs))
