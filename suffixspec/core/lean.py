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

import logging
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from suffixspec.core import blockq, exact_attention
from suffixspec.core.formats import QUANTIZED
from suffixspec.core.kv import SlotCache, key_span, layer_types, tree_block
from suffixspec.core.lean_weights import FAMILIES, Shape, build, rotary_table, unsupported
from suffixspec.core.weights import (
    Int8Rows,
    int8_works,
    linear,
    refuse_own_forward,
    release,
    released,
)

log = logging.getLogger(__name__)



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


# the lean forward's weight kinds: "float" (the model's own dtype; float32 packed for oneDNN), "int8" (exact:
# weights.RowInt8Weight, torch._int_mm, per-query attention), "fbgemm" (Int8Weight: fast for one row, a
# row's result depends on the others': draft models only), "gguf" (exact: the GGUF file's own blocks,
# blockq's kernel, per-query attention), "gguf16" (the same with ~15-bit activations: blockq's planes = 2)
KINDS = ("float", "int8", "fbgemm", "gguf", "gguf16")
_LEAN: dict[str, weakref.WeakKeyDictionary] = {k: weakref.WeakKeyDictionary() for k in KINDS}  # kind -> model -> forward
# kind -> model -> why its lean forward of that kind failed to build (a failing int8 build leaves float alone)
_BROKEN: dict[str, weakref.WeakKeyDictionary] = {k: weakref.WeakKeyDictionary() for k in KINDS}


def lean_forward(model: Any, weights: str = "float") -> LeanForward | None:
    """The lean forward of ``model`` with weights of kind ``weights`` (:data:`KINDS`; one per model and
    kind, so its fused weights exist once however many runners use it), or None when it runs through its
    own forward: its family has none (:func:`unsupported` says why), or building it failed (remembered per
    kind: a failing int8 build does not turn the float lean forward off). ``"fbgemm"``: None where
    :func:`int8_works` is false. A quantized kind releases the model's float weights once built
    (``weights.release``); its own forward then refuses to run (``weights.refuse_own_forward``).

    Building reads ``transformers`` internals (the rotary module's ``inv_freq``, config fields, the
    module layout), which a release may rename. Then the model's own forward serves it, the same
    tokens at its speed, and one warning per model says why::

        lean forward of LlamaForCausalLM unavailable (AttributeError: 'LlamaConfig' object has no
        attribute 'rms_norm_eps'); running the model's own forward
    """
    if weights not in KINDS:
        raise ValueError(f"unknown lean weight kind {weights!r}; one of {KINDS}")
    gone = released(model)
    if gone is not None and gone != weights:  # its float weights are gone: the quantized forward is the one left
        return _LEAN[gone].get(model)
    broken = _BROKEN[weights]
    if model in broken or (weights == "fbgemm" and not int8_works()):
        return None
    table = _LEAN[weights]
    lean = table.get(model)
    if lean is not None:
        return lean
    try:
        if unsupported(model) is not None:
            return None
        lean = table[model] = LeanForward(model, weights=weights)
    except Exception as e:  # noqa: BLE001 - any failure to read the model: its own forward still runs
        broken[model] = f"{type(e).__name__}: {e}"
        log.warning("lean forward of %s unavailable (%s); %s", type(model).__name__, broken[model],
                    "running the model's own forward" if weights == "float" else f"no {weights} weights for it")
        return None
    return lean


def _stacked(x: torch.Tensor, ws: tuple[torch.Tensor, ...], b: torch.Tensor | None) -> torch.Tensor:
    """``x @ cat(ws).T + b`` from the separate matrices (q, k, v) without a fused copy of them."""
    y = torch.cat([torch.mm(w, x.t()) for w in ws]).t()
    return y if b is None else y + b


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


# prompt positions per attention call of an exact format (LeanForward._exact_plan); divides the prefix
# store's block (16) so that a stored block is computed the same way in every prompt that holds it
EXACT_CHUNK = 16


@dataclass
class _ExactRow:
    """One row's attention plan at an exact format (:meth:`LeanForward._exact_plan`)."""

    row: int  # cache row
    past: int  # cached positions before the row's tokens
    nodes: list[tuple[int, int, list[tuple[int, int]], list[int]]]  # (packed query, key end, slot writes
    # (slot, packed src), the packed tokens at positions past .. end - 1: its path from the root)
    restores: list[tuple[int, int]]  # (slot, packed source) put back in node order after the row
    chunks: list[tuple[int, int, int, dict]]  # prompt: (packed first query, first, end position, window -> mask)


class LeanForward:
    """The lean forward of ``model`` (see the module docstring); ``__call__`` runs one packed pass."""

    def __init__(self, model: Any, weights: str = "float") -> None:
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
        self.embed: torch.Tensor | Int8Rows = inner.embed_tokens.weight
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
                inv, scaling = rotary_table(inner, kind if gemma else None)
                self.rope[key] = (inv.float().to(self.device), float(scaling))
        self.weights = weights  # the weight kind (KINDS)
        # matrices quantized (RowInt8Weight, blockq's blocks, or fbgemm's Int8Weight for a draft)
        self.int8 = weights != "float"
        # exact: a row's logits do not depend on the pass's other rows (integer products, per-query attention):
        # the kinds of the quantized formats (formats.QUANTIZED), not a draft's fbgemm
        self.exact = weights in QUANTIZED
        # the compiled kernel for an exact format's draft nodes (exact_attention), where it builds; float32 only
        self.native = (exact_attention.kernel() if self.exact and self.device.type == "cpu"
                       and self.dtype == torch.float32 else None)
        built = build(model, weights, Shape(self.n_heads, self.n_kv, self.head_dim, gemma, types))
        self.layers, self.norm, self.head, self.embed = built.layers, built.norm, built.head, built.embed
        # every product on blockq's kernel: a pass runs them on its own pool, torch's ops on one thread (__call__)
        self.blocks = all(isinstance(w, (blockq.BlockWeight, blockq.BlockConcat)) for w in
                          (self.head, *(w for L in self.layers for w in (L.w_qkv, L.wo, L.w_gu, L.wd))))
        self.smoothed = built.smoothed  # activation outliers moved into the weights (weights.smoothing)
        self.paged_out = built.paged_out  # bytes of the model's own matrices paged out once packed (see page_out)
        self.stored = built.stored  # the quantized matrices' store at this build: "read", "written" or ""
        int8 = self.int8
        self.onednn = self.head.is_mkldnn  # whether this forward's weights are packed (they all are, or none)
        self._positions = torch.arange(0, device=self.device)  # key positions for the masks (_arange)
        self.gemma = gemma
        # Gemma's MLP activation: "gelu_pytorch_tanh" is GELU's tanh approximation; None: SiLU (Llama)
        self.gelu = ("tanh" if cfg.hidden_activation == "gelu_pytorch_tanh" else "none") if gemma else None
        self.released = 0  # bytes of the model's float weights released (a quantized kind, built whole)
        # a Llama-family model on blockq's products with the compiled exact attention: its layers in one native call
        # a decode or verify pass (blockq.LayerStack, the same bits as the op-by-op pass); None: op by op
        self.stack = None
        # blockq's own glue for a gguf pass (None: torch's ops): the norm before a product, the rotary embedding
        # with the cache writes, silu(gate) * up, the same bits as the torch ops
        self.glue = glue = blockq.kernel() if self.blocks else None
        if (glue is not None and not gemma and self.native is not None and len(self.rope) == 1
                and all(L.q_norm is None and L.norm_post_attn is None and L.norm_post_mlp is None for L in self.layers)):
            self.stack = blockq.LayerStack(
                glue, [(L.norm_in, L.w_qkv, L.b_qkv, L.wo, L.bo, L.norm_mlp, L.w_gu, L.wd, L.window) for L in self.layers],
                (int(cfg.hidden_size), self.n_heads, self.n_kv, self.head_dim), self.eps, self.scale, self.native)
        if int8 and not any(model in _LEAN[k] for k in KINDS if k != weights):  # (no other forward reads them)
            own = [*(p for layer in inner.layers for p in (*layer.self_attn.parameters(), *layer.mlp.parameters())
                     if p.dim() == 2), inner.embed_tokens.weight, model.get_output_embeddings().weight]
            self.released = release(own, keep=model)
            refuse_own_forward(model, weights)

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
    def __call__(self, rows: list[PassRow], cache: SlotCache) -> list[torch.Tensor | None]:
        """Per row: logits [wanted, vocab] (float32), or None for a row that wants none.

        Row ``rows[j]`` writes its keys/values into cache row ``rows[j].row`` at ``past ..``; the
        caller sets the rows' lengths afterwards (``SlotCache.keep`` or ``lengths[row] = ...``).

        Where every product is blockq's and torch has several threads, the products run on that many of
        blockq's own threads (``blockq.pass_threads``) and torch's ops on one: they are small, and torch's
        idle OpenMP worker would spin on the core blockq's worker needs (Qwen2.5-1.5B Q4_K_M, plain decode at
        2 threads on the 2-core EPYC: 46 -> 40 ms a token). Same operations, so the same bits."""
        threads = torch.get_num_threads()
        if not self.blocks or threads == 1 or self.device.type != "cpu":
            return self._pass(rows, cache)
        torch.set_num_threads(1)
        try:
            with blockq.pass_threads(threads):
                return self._pass(rows, cache)
        finally:
            torch.set_num_threads(threads)

    @torch.inference_mode()
    def _pass(self, rows: list[PassRow], cache: SlotCache) -> list[torch.Tensor | None]:
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
        # an exact format attends query by query (_attend_exact); others in groups of rows
        plan = self._exact_plan(rows, offsets) if self.exact else None
        native = None
        if plan is not None and self.native is not None and any(e.nodes for e in plan):
            native = (self.native, *exact_attention.plan([(at, e.row, e.past, end, path) for e in plan
                                                           for at, end, _, path in e.nodes]))
        groups = [] if plan is not None else [self._group(rows, offsets, blocks, g)
                                              for g in self._grouping(rows, blocks)]
        pick = self._pick(rows, offsets)
        # [T, hidden]: a table's rows, or a quantized one's dequantized (Int8Rows, blockq's BlockWeight)
        x = self.embed[ids_t] if isinstance(self.embed, torch.Tensor) else self.embed.rows(ids_t)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        rotary = self._rotary(pos_t)
        if self.stack is not None and native is not None and not any(e.chunks for e in plan):
            # every row a tree or a lone token: all layers in one native call (the prompt chunks' SDPA is torch's)
            cos, sin = rotary["all"]
            x = self.stack(x.contiguous(), cos.reshape(total, -1).contiguous(), sin.reshape(total, -1).contiguous(),
                           row_t, slot_t, native[1], native[2], cache.keys, cache.values)
            return self._logits(rows, pick, x)
        glue = self.glue  # (Llama's norm formula in the kernel; Gemma's norm stays torch's)
        norm_in_kernel = glue is not None and not self.gemma
        attn = torch.empty((total, h_q * d), dtype=dtype, device=device)
        for i, L in enumerate(self.layers):
            plain = L.plain if total == 1 else None  # one token: the model's own matrices (see Layer.plain)
            if norm_in_kernel:  # blockq norms the rows itself
                qkv = L.w_qkv.mm(x, L.b_qkv, norm=(L.norm_in, self.eps))
            else:
                h = self._rms(x, L.norm_in)
                qkv = lin(h, L.w_qkv, L.b_qkv) if plain is None else _stacked(h, plain[0], L.b_qkv)
            qkv = qkv.reshape(total, h_q + 2 * h_kv, d)
            qk, v = qkv[:, : h_q + h_kv], qkv[:, h_q + h_kv:]
            if L.q_norm is not None:
                qk = torch.cat((self._rms(qk[:, :h_q], L.q_norm), self._rms(qk[:, h_q:], L.k_norm)), dim=1)
            cos, sin = rotary[L.rope]
            kbuf, vbuf = cache.keys[i], cache.values[i]
            if glue is not None:  # the same ops in one native call
                qk = blockq.rope_store(glue, qk, cos, sin, v, kbuf, vbuf, row_t, slot_t, h_q)
            else:
                qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin  # rotary embedding
                kbuf.transpose(1, 2)[row_t, slot_t] = qk[:, h_q:]  # [rows, positions, heads, d] view of the buffer
                vbuf.transpose(1, 2)[row_t, slot_t] = v
            q_all = qk[:, :h_q].transpose(0, 1)  # [heads, T, d]
            for g in groups:
                self.attend(g, L.window, q_all, kbuf, vbuf, attn)
            if plan is not None:
                self._attend_exact(plan, native, L.window, q_all, qk[:, h_q:], v, kbuf, vbuf, attn)
            o = lin(attn, L.wo if plain is None else plain[1], L.bo)
            x = x + (self._rms(o, L.norm_post_attn) if L.norm_post_attn is not None else o)
            if norm_in_kernel:  # (silu(gate) * up in the kernel too: LayerStack's bits on every machine)
                m = lin(blockq.silu_mul(glue, L.w_gu.mm(x, norm=(L.norm_mlp, self.eps))), L.wd)
            else:
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

    def attend(self, g: _Group, window: int | None, q_all: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor,
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

    # -- attention of an exact format: each query computed the same way whatever shares the pass -------------
    def _exact_plan(self, rows: list[PassRow], offsets: list[int]) -> list[_ExactRow]:
        """What :meth:`_attend_exact` does for each row at every layer (made once per pass).

        A row of draft nodes (or a lone root): each node attends alone, over exactly the keys plain decoding
        gives that token (the cached positions, then its ancestors in order, then itself), so its path's
        keys must sit at ``past, past + 1, ...``: nodes are visited depth first and a node off the first
        path writes its ancestors' keys/values into those slots (``writes``), the slots put back in node
        order after the row (``restores``). Example: parents [-1, 0, -1] (nodes a b c, past 5): a at slot 5
        sees 0..5, b (a's child) sees 0..6, c (a second child of the root) is written into slot 5 and sees
        0..5, then slot 5 gets a back.
        A prompt (a causal chain of several tokens): chunks of :data:`EXACT_CHUNK` queries at fixed
        positions (multiples of the chunk), each over every key up to its end with a causal mask, so a
        prompt prefix's keys/values do not depend on how long the prompt is (prefix reuse stays exact: the
        prefix store's blocks are whole chunks)."""
        plan = []
        for r, o in zip(rows, offsets, strict=True):
            n = len(r.ids)
            if r.parents is None and n > 1:
                chunks = []
                a = r.past
                while a < r.past + n:
                    b = min(r.past + n, (a // EXACT_CHUNK + 1) * EXACT_CHUNK)
                    chunks.append((o + a - r.past, a, b, {w: self._chunk_mask(a, b, w) for w in self.windows}))
                    a = b
                plan.append(_ExactRow(r.row, r.past, [], [], chunks))
                continue
            parents = r.parents or []
            children: list[list[int]] = [[] for _ in range(n)]
            for k, par in enumerate(parents):
                children[par + 1].append(k + 1)  # node k + 1 of ids (0 is the root)
            holds = list(range(n))  # which node's keys/values each slot past + s holds
            nodes, path, stack = [], [], [(0, 0)]
            while stack:  # depth first, children in order
                i, t = stack.pop()
                del path[t:]
                path.append(i)
                writes = []
                for depth, node in enumerate(path):
                    if holds[depth] != node:
                        holds[depth] = node
                        writes.append((r.past + depth, o + node))
                nodes.append((o + i, r.past + t + 1, writes, [o + k for k in path]))
                stack.extend((c, t + 1) for c in reversed(children[i]))
            restores = [(r.past + k, o + k) for k in range(n) if holds[k] != k]
            plan.append(_ExactRow(r.row, r.past, nodes, restores, []))
        return plan

    def _chunk_mask(self, a: int, b: int, window: int | None) -> tuple[int, torch.Tensor]:
        """(first key, additive mask [b - a, b - first]) of the prompt positions ``a .. b - 1`` attending
        causally (within ``window``) over every key before ``b``."""
        start = 0 if window is None else max(0, a - window + 1)
        pos = torch.arange(a, b, device=self.device)[:, None]
        keys = torch.arange(start, b, device=self.device)[None, :]
        ok = keys <= pos
        if window is not None:
            ok &= pos - keys < window
        return start, torch.zeros(ok.shape, dtype=self.dtype, device=self.device).masked_fill_(
            ~ok, torch.finfo(self.dtype).min)

    def _attend_exact(self, plan: list[_ExactRow], native: tuple | None, window: int | None, q_all: torch.Tensor,
                      k_new: torch.Tensor, v_new: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor,
                      attn: torch.Tensor) -> None:
        """Attention of an exact format (:meth:`_exact_plan`): each draft node (or lone root) alone over its own
        keys, each prompt chunk in one SDPA call on one thread. ``native`` (the compiled kernel and the pass's
        :func:`~suffixspec.core.exact_attention.plan`): every node in one call, each computed the same way
        whatever shares it; else one SDPA call per node, a plain step's call exactly. Not one SDPA call for all:
        SDPA's CPU kernel rounds a query differently when other queries share the call (measured: none of 16
        tree queries equal to its lone call) and at another thread count (one query, 1 vs 2 threads)."""
        h_q, h_kv, d = self.n_heads, self.n_kv, self.head_dim
        if native is not None:
            fn, meta, path = native
            exact_attention.attend(fn, meta, path, q_all.transpose(0, 1), kbuf, vbuf, k_new, v_new, attn,
                                   self.scale, window, blockq.pool())
            if not any(e.chunks for e in plan):
                return
        sdpa = torch.nn.functional.scaled_dot_product_attention
        gqa = h_q != h_kv
        threads = torch.get_num_threads()
        if threads != 1:
            torch.set_num_threads(1)
        try:
            for e in plan:
                keys, values = kbuf[e.row], vbuf[e.row]  # [h_kv, positions, d]
                for at, end, writes, _ in e.nodes if native is None else ():
                    for slot, src in writes:
                        keys[:, slot] = k_new[src]
                        values[:, slot] = v_new[src]
                    start = 0 if window is None else max(0, end - window)
                    a = sdpa(q_all[None, :, at : at + 1], keys[None, :, start:end], values[None, :, start:end],
                             scale=self.scale, enable_gqa=gqa)  # [1, h_q, 1, d]
                    attn[at] = a.reshape(h_q * d)
                for slot, src in e.restores if native is None else ():
                    keys[:, slot] = k_new[src]
                    values[:, slot] = v_new[src]
                for at, a0, b0, masks in e.chunks:
                    start, mask = masks[window]
                    m = b0 - a0
                    a = sdpa(q_all[None, :, at : at + m], keys[None, :, start:b0], values[None, :, start:b0],
                             attn_mask=mask[None, None], scale=self.scale, enable_gqa=gqa)  # [1, h_q, m, d]
                    attn[at : at + m] = a[0].transpose(0, 1).reshape(m, h_q * d)
        finally:
            if threads != 1:
                torch.set_num_threads(threads)

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

