"""Continuous batching: several requests' draft trees verified in ONE target forward pass.

A :class:`BatchScheduler` owns one thread that steps every running request together. Each step:

1. every row (request) proposes its own draft (its own proposers, budget and gates);
2. :func:`choose_drafts` decides which drafts the pass verifies, from the cost of a batched pass;
3. ONE forward over every row's last committed token and draft nodes, plus the prompts of the
   requests that joined since the last step. On Llama-style targets (:class:`LeanBatch`) the rows
   are packed: the matmuls run over the real tokens only and each row attends to its own cache
   with its own tree mask and positions. Other models run ``[B, W]`` inputs padded to the widest
   row with a 4D mask (joiners are then prefilled in a pass of their own);
4. every row walks its own tree (``verify_tree``) and commits its accepted path, then its cache row
   is compacted; finished and cancelled rows leave, waiting requests join before the next step.

The keys and values live in a :class:`SlotCache`: one preallocated buffer per layer, row ``r``
holding request ``r``'s tokens at positions ``0 .. length[r] - 1``. A step writes row ``r``'s new
block at ``length[r] ..``, so rows of different lengths need no copying, and compaction moves only
a row's accepted entries. Worked example of the padded pass (two rows, lengths 3 and 1, widths 2 and 1)::

    row 0: cache a b c | new x y     mask row "y": 1 1 1 1 1    (a b c, x its parent, itself)
    row 1: cache d . . | new z pad   mask row "z": 1 0 0 1 0    (d, itself; the gap is masked)
    position ids: row 0 [3, 4], row 1 [1, 1]

Masked entries add ``finfo.min`` before the softmax, so they weigh exactly zero: a row's logits are
those of the row run alone up to float rounding of the batched matmuls (the tests check greedy and
seeded outputs token for token).
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .budget import VerifyCost
from .draft import Draft
from .verify import verify_tree

if TYPE_CHECKING:
    from .engine import Engine, _Sequence

log = logging.getLogger(__name__)


class SlotCache:
    """Keys and values of up to ``rows`` requests, row ``r`` valid at positions ``< lengths[r]``.

    The model sees it through ``update`` (the ``transformers`` cache call of each attention layer):
    the new block of row ``r`` is written at ``lengths[r] + offsets``, and the layer attends to the
    buffer's first ``kv_len`` positions of the active rows (the mask hides what a row does not own).
    """

    def __init__(self, capacity: int = 256) -> None:
        self.keys: list[torch.Tensor] = []  # per layer [rows, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []  # valid positions per active row
        self.capacity = capacity  # positions allocated per row (grows by doubling)
        self._rows = 0  # rows allocated in the buffers
        self._first = 0  # first row of the current forward (prefill of a joining row)
        self._width = 0  # positions each row of the current forward writes
        self._kv_len = 0  # positions the current forward attends to

    @property
    def size(self) -> int:
        """Active rows."""
        return len(self.lengths)

    @torch.inference_mode()
    def reserve(self, rows: int, positions: int) -> None:
        """Make room for ``rows`` rows of ``positions`` each. Growing copies the buffers, so rows come
        in the scheduler's full count at once and positions double (zeroed: masked garbage must be finite)."""
        if rows <= self._rows and positions <= self.capacity:
            return
        self._rows = max(rows, self._rows)
        while self.capacity < positions:
            self.capacity *= 2
        for layer, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            self.keys[layer] = _grown(k, self._rows, self.capacity)
            self.values[layer] = _grown(v, self._rows, self.capacity)

    def begin(self, first: int, width: int) -> None:
        """The next forward writes ``width`` positions for each row from ``first`` to the last."""
        self._first, self._width = first, width
        self._kv_len = max(self.lengths[first:]) + width
        self.reserve(self.size, self._kv_len)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a layer's new keys/values [rows, heads, width, dim]; return what the layer attends to."""
        if layer_idx == len(self.keys):  # first forward: shapes and dtype come from the model
            shape = (self._rows, key.shape[1], self.capacity, key.shape[3])
            self.keys.append(torch.zeros(shape, dtype=key.dtype, device=key.device))
            self.values.append(torch.zeros(shape, dtype=value.dtype, device=value.device))
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        first, width = self._first, key.shape[2]
        for i in range(key.shape[0]):
            start = self.lengths[first + i]
            keys[first + i, :, start : start + width] = key[i]
            values[first + i, :, start : start + width] = value[i]
        last = first + key.shape[0]
        return keys[first:last, :, : self._kv_len], values[first:last, :, : self._kv_len]

    def allocate(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str
                 ) -> None:
        """Make the (empty) buffers for a model of this shape (the padded path makes them in ``update``)."""
        shape = (self._rows, kv_heads, self.capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths, default=0)

    def add_row(self) -> int:
        """A new empty row at the end; returns its index."""
        self.lengths.append(0)
        self.reserve(self.size, 0)
        return self.size - 1

    @torch.inference_mode()  # the buffers are inference tensors (made inside the forward)
    def keep(self, row: int, start: int, keep: list[int]) -> None:
        """After a pass that wrote row ``row`` at ``start``: keep the new-block offsets ``keep`` (in
        order) at ``start, start + 1, ...``; the row's length becomes ``start + len(keep)``."""
        if keep != list(range(len(keep))):
            idx = torch.tensor([start + k for k in keep], device=self.keys[0].device if self.keys else "cpu")
            for buf in (*self.keys, *self.values):
                buf[row, :, start : start + len(keep)] = buf[row].index_select(-2, idx)
        self.lengths[row] = start + len(keep)

    @torch.inference_mode()
    def remove_row(self, row: int) -> None:
        """Drop row ``row``: the last row moves into its place (rows stay ``0 .. size - 1``)."""
        last = self.size - 1
        if row != last:
            n = self.lengths[last]
            for buf in (*self.keys, *self.values):
                buf[row, :, :n] = buf[last, :, :n]
            self.lengths[row] = n
        self.lengths.pop()


def _grown(buf: torch.Tensor, rows: int, positions: int) -> torch.Tensor:
    if buf.shape[0] >= rows and buf.shape[2] >= positions:
        return buf
    out = torch.zeros((rows, buf.shape[1], positions, buf.shape[3]), dtype=buf.dtype, device=buf.device)
    out[: buf.shape[0], :, : buf.shape[2]] = buf
    return out


def batch_inputs(rows: list[tuple[list[int], list[int], int]], kv_len: int, dtype: torch.dtype,
                 device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids [B, W], 4D additive mask [B, 1, W, kv_len], position ids [B, W]) for one pass.

    ``rows[r] = (ids, parents, past)``: row ``r`` feeds ``ids`` (its root then its draft nodes, whose
    parents are ``parents``) after ``past`` cached positions; its block is written at ``past``.
    Padding (up to the widest row) repeats the root and attends to itself only.
    """
    width = max(len(ids) for ids, _, _ in rows)
    allowed = np.zeros((len(rows), width, kv_len), dtype=bool)
    positions = np.zeros((len(rows), width), dtype=np.int64)
    input_ids = np.zeros((len(rows), width), dtype=np.int64)
    for r, (ids, parents, past) in enumerate(rows):
        n = len(ids)
        input_ids[r, :n] = ids
        input_ids[r, n:] = ids[0]
        allowed[r, :n, :past] = True  # every real input sees the row's cache
        depth = [0] * n
        allowed[r, 0, past] = True
        for i, par in enumerate(parents):  # ancestors-or-self over the new block (parents come first)
            k, pk = i + 1, par + 1
            allowed[r, k, past : past + n] = allowed[r, pk, past : past + n]
            allowed[r, k, past + k] = True
            depth[k] = depth[pk] + 1
        positions[r, :n] = np.asarray(depth) + past
        positions[r, n:] = past
        for k in range(n, width):
            allowed[r, k, past + k] = True
    mask = torch.zeros((len(rows), 1, width, kv_len), dtype=dtype, device=device)
    mask.masked_fill_(torch.from_numpy(~allowed).to(device)[:, None], torch.finfo(dtype).min)
    return torch.from_numpy(input_ids).to(device), mask, torch.from_numpy(positions).to(device)


@torch.inference_mode()
def prefill_row(engine: Engine, cache: SlotCache, row: int, ids: list[int]) -> None:
    """Feed a joining request's prompt (all but its last token) into its empty row, alone."""
    if not ids:
        return
    cache.begin(row, len(ids))
    dtype = engine.model.dtype
    mask = torch.full((len(ids), len(ids)), torch.finfo(dtype).min, dtype=dtype, device=engine.device)
    kwargs: dict[str, Any] = {engine._cache_kw: cache, "attention_mask": mask.triu_(1)[None, None],  # causal
                              "position_ids": torch.arange(len(ids), device=engine.device)[None]}
    if engine._prefill_keeps_one:
        kwargs["logits_to_keep"] = 1
    engine.model(input_ids=torch.tensor([ids], device=engine.device), use_cache=True, **kwargs)
    cache.lengths[row] = len(ids)


@dataclass
class PassRow:
    """One row of a batched pass: what cache row ``row`` feeds after its ``past`` cached positions."""

    row: int  # cache row
    ids: list[int]  # the root (last committed token) then the draft nodes; or a prompt chunk
    parents: list[int] | None  # parents of ids[1:] as in Draft.parents (-1 = the root); None = a causal chain
    past: int  # cached positions before ids (where ids' keys/values are written)
    logits: bool = True  # False: only the keys/values are wanted (a joining request's prompt)

    @property
    def causal(self) -> bool:
        """A causal chain over an empty cache (a prompt with no reused prefix): attention runs with
        ``is_causal`` and no mask, as the batch-1 prefill does (same kernel, same logits)."""
        return self.parents is None and self.past == 0 and len(self.ids) > 1

    def tree(self, dtype: torch.dtype, device: torch.device | str) -> tuple[np.ndarray, torch.Tensor | None]:
        """(depth per id, additive mask [1, 1, n, past + n] or None when no mask is needed).

        Every id sees the whole cache; over the new block it sees its ancestors and itself (the
        whole prefix for a causal chain). None: a single id (it sees everything) or :attr:`causal`."""
        n = len(self.ids)
        if self.causal:
            return np.arange(n), None
        if self.parents is None:
            depth = np.arange(n)
            allowed = np.tril(np.ones((n, n), dtype=bool))
        else:
            allowed = np.zeros((n, n), dtype=bool)
            depth = np.zeros(n, dtype=np.int64)
            allowed[0, 0] = True
            for i, par in enumerate(self.parents):  # parents come before their children
                k, pk = i + 1, par + 1
                allowed[k] = allowed[pk]
                allowed[k, k] = True
                depth[k] = depth[pk] + 1
        if n == 1:
            return depth, None
        mask = torch.zeros((1, 1, n, self.past + n), dtype=dtype, device=device)
        mask[0, 0, :, self.past :].masked_fill_(torch.from_numpy(~allowed).to(device), torch.finfo(dtype).min)
        return depth, mask


def draft_row(row: int, last: int, draft: Draft, past: int) -> PassRow:
    """The pass row verifying ``draft`` after the committed token ``last``."""
    return PassRow(row, [last, *draft.tokens], list(draft.parents), past)


@torch.inference_mode()
def forward_rows(engine: Engine, cache: SlotCache, rows: list[PassRow], lean: Any = None
                 ) -> list[torch.Tensor | None]:
    """Per row: logits [len(ids), vocab] (float32), or None where ``logits`` is False; one pass.

    ``lean``: a :class:`LeanBatch` of the target (Llama-style models) runs the pass packed, without
    the ``transformers`` call machinery. Otherwise the model's own forward runs it over ``[B, W]``
    inputs padded to the widest row; that path takes every cache row in order (``rows[r].row == r``)
    and no prefill rows (joiners are prefilled by :func:`prefill_row` first)."""
    if lean is not None:
        return lean(rows, cache)
    if [r.row for r in rows] != list(range(cache.size)) or not all(r.logits for r in rows):
        raise ValueError("the padded pass takes every cache row in order, with logits")
    inputs = [(r.ids, r.parents or [], r.past) for r in rows]
    cache.begin(0, max(len(ids) for ids, _, _ in inputs))
    ids, mask, positions = batch_inputs(inputs, cache._kv_len, engine.model.dtype, engine.device)
    out = engine.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                       **{engine._cache_kw: cache}).logits.float()
    return [out[i, : len(r.ids)] for i, r in enumerate(rows)]


class LeanBatch:
    """The target's batched verify pass for Llama-style models, rows packed without padding.

    A ``transformers`` forward call spends ~7 ms of CPU time in Python per pass on the embedded
    5-layer target (hooks, output classes, per-layer bookkeeping), several times the compute of a
    pass over a few tokens; a batch pays it once, and this pays almost none of it. The numerics
    follow ``modeling_llama`` op for op (RMSNorm in float32, rotary embedding, SDPA with the
    row's mask, SiLU-gated MLP) on the weights of :class:`~suffixspec.proposers.draft_model.LeanLlama`;
    :func:`batch_problem`'s probe and the equality tests compare it with the batch-1 path.

    Rows are packed: the projections and the MLP run once over every row's real tokens
    (``sum(len(ids))`` of them, no padding to the widest row), and attention runs per row over
    that row's own cached length (no row reads the longest row's keys). On the embedded target a
    cached position costs 40 KB of keys and values per pass: a row of 264 cached tokens padded to
    a neighbour's 366 read 39% more than its own.

    Worked example (two rows: a tree of 3 nodes after 2 cached tokens, a lone root after 5)::

        packed tokens   r0: root a b   r1: root        (4 tokens through every matmul)
        attention       r0: 3 queries x 2 + 3 keys     r1: 1 query x 5 + 1 keys (no mask)
    """

    def __init__(self, model: Any) -> None:
        from .proposers.draft_model import LeanLlama

        cfg = model.config
        self.w = LeanLlama(model, int(getattr(cfg, "max_position_embeddings", 2048)))

    @staticmethod
    def supports(model: Any) -> bool:
        from .proposers.draft_model import LeanLlama

        return LeanLlama.supports(model)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.w.eps)
        return weight * h.to(x.dtype)

    @torch.inference_mode()
    def ready(self, cache: SlotCache, positions: int) -> None:
        """Room for ``positions`` positions in every row of ``cache`` (its buffers made on first use)."""
        cache.reserve(cache.size, positions)
        if not cache.keys:
            cache.allocate(len(self.w.layers), self.w.n_kv, self.w.head_dim, self.w.dtype, self.w.device)

    @torch.inference_mode()
    def __call__(self, rows: list[PassRow], cache: SlotCache) -> list[torch.Tensor | None]:
        """Per row: logits [len(ids), vocab] (float32), or None for a row that wants none (a prefill).

        Row ``rows[j]`` writes its keys/values into cache row ``rows[j].row`` at ``past ..``."""
        w, lin, sdpa = self.w, torch.nn.functional.linear, torch.nn.functional.scaled_dot_product_attention
        h_q, h_kv, d = w.n_heads, w.n_kv, w.head_dim
        half, rep = d // 2, h_q // h_kv
        device = w.device
        self.ready(cache, max(r.past + len(r.ids) for r in rows))
        offsets, masks, ids, positions, cache_rows = [], [], [], [], []
        total = 0
        for r in rows:
            offsets.append(total)
            total += len(r.ids)
            ids.extend(r.ids)
            depth, mask = r.tree(w.dtype, device)
            positions.append(depth + r.past)
            masks.append(mask)
            cache_rows.append(np.full(len(r.ids), r.row))
        ids_t = torch.tensor(ids, device=device)
        pos_t = torch.from_numpy(np.concatenate(positions)).to(device)
        # where each packed token's keys/values go: cache row, then position past + offset (its
        # slot in the block, not its tree depth); one indexed write per layer for every row
        row_t = torch.from_numpy(np.concatenate(cache_rows)).to(device)
        slot_t = torch.from_numpy(np.concatenate([np.arange(r.past, r.past + len(r.ids)) for r in rows])).to(device)
        x = w.embed[ids_t]  # [T, hidden]
        cos, sin = w.cos[pos_t][:, None], w.sin[pos_t][:, None]  # [T, 1, d]
        attn = torch.empty((total, h_q * d), dtype=w.dtype, device=device)
        for i, (w_in, w_qkv, b_qkv, wo, bo, w_post, w_gu, wd) in enumerate(w.layers):
            qkv = lin(self._rms(x, w_in), w_qkv, b_qkv).view(total, h_q + 2 * h_kv, d)
            qk, v = qkv[:, : h_q + h_kv], qkv[:, h_q + h_kv :]
            qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin  # rotary embedding
            kbuf, vbuf = cache.keys[i], cache.values[i]
            kbuf.transpose(1, 2)[row_t, slot_t] = qk[:, h_q:]  # [rows, positions, heads, d] view of the buffer
            vbuf.transpose(1, 2)[row_t, slot_t] = v
            q_all = qk[:, :h_q].transpose(0, 1)  # [heads, T, d]
            for r, start, mask in zip(rows, offsets, masks, strict=True):
                n, past = len(r.ids), r.past
                end = start + n
                keys, values = kbuf[r.row : r.row + 1, :, : past + n], vbuf[r.row : r.row + 1, :, : past + n]
                if rep > 1:
                    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
                a = sdpa(q_all[None, :, start:end], keys, values, attn_mask=mask, is_causal=r.causal,
                         scale=w.scale)  # [1, heads, n, d]
                attn[start:end] = a[0].transpose(0, 1).reshape(n, h_q * d)
            x = x + lin(attn, wo, bo)
            gate, up = lin(self._rms(x, w_post), w_gu).chunk(2, dim=-1)
            x = x + lin(torch.nn.functional.silu(gate) * up, wd)
        want = [j for j, r in enumerate(rows) if r.logits]
        out: list[torch.Tensor | None] = [None] * len(rows)
        if want:
            pick = torch.cat([torch.arange(offsets[j], offsets[j] + len(rows[j].ids)) for j in want]).to(device)
            logits = lin(self._rms(x.index_select(0, pick), w.norm), w.head).float()
            at = 0
            for j in want:
                out[j] = logits[at : at + len(rows[j].ids)]
                at += len(rows[j].ids)
        return out


def lean_forward(engine: Engine) -> LeanBatch | None:
    """A :class:`LeanBatch` of the target when it supports one and passes the batching probe."""
    if not LeanBatch.supports(engine.model):
        return None
    lean = LeanBatch(engine.model)
    problem = batch_problem(engine, lean)
    if problem is not None:
        log.warning("the lean batched forward is off for %s (%s)", engine.model_name, problem)
        return None
    return lean


def batch_problem(engine: Engine, lean: LeanBatch | None = None) -> str | None:
    """Why the target cannot run padded batches, or None when it can.

    Besides sliding-window attention, one probe compares a batched pass (two rows of different
    lengths, a tree draft in one) with the batch-1 path's logits: a model whose attention ignores
    the 4D mask or the per-row positions fails it."""
    if any(window is not None for window in engine._windows.values()):
        return "sliding-window attention"
    vocab = engine.vocab_size
    prompts = [[(7 * i + 3) % vocab for i in range(9)], [(5 * i + 1) % vocab for i in range(4)]]
    drafts = [Draft([11 % vocab, 12 % vocab, 13 % vocab], [-1, 0, 0], ["prompt"] * 3), Draft()]
    try:
        alone = []
        for ids, draft in zip(prompts, drafts, strict=True):
            dyn = engine._new_cache()
            engine._prefill(ids[:-1], dyn, reuse=False)
            alone.append(engine._forward([ids[-1], *draft.tokens], dyn, draft.parents, len(ids) - 1))
        cache = SlotCache(capacity=16)
        rows = [cache.add_row() for _ in prompts]
        if lean is not None:  # the joiners' prompts packed into one pass, as the scheduler does
            forward_rows(engine, cache, [PassRow(r, ids[:-1], None, 0, logits=False)
                                         for r, ids in zip(rows, prompts, strict=True)], lean)
            for r, ids in zip(rows, prompts, strict=True):
                cache.lengths[r] = len(ids) - 1
        else:
            for r, ids in zip(rows, prompts, strict=True):
                prefill_row(engine, cache, r, ids[:-1])
        batched = forward_rows(engine, cache, [draft_row(r, ids[-1], d, len(ids) - 1)
                                               for r, ids, d in zip(rows, prompts, drafts, strict=True)], lean)
    except Exception as e:  # noqa: BLE001 - any failure means "not batchable", said in the log
        return f"a batched pass failed: {type(e).__name__}: {e}"
    for r, ref in enumerate(alone):
        diff = float((batched[r] - ref).abs().max())
        if diff > 1e-3 * max(1.0, float(ref.abs().max())):
            return f"batched logits differ from batch-1 logits by {diff:.3g}"
    return None


class PassCost(VerifyCost):
    """Forward time by total inputs, for passes of any batch size (the smallest measured size,
    not necessarily 1, anchors the estimate: a batch of 8 never runs a 1-input pass)."""

    def estimate(self, inputs: int) -> float | None:
        if inputs in self.times or not self.times:
            return self.times.get(inputs)
        sizes = sorted(self.times)
        i = bisect.bisect_left(sizes, inputs)
        if 0 < i < len(sizes):  # interpolate between measured neighbours
            lo, hi = sizes[i - 1], sizes[i]
            w = (inputs - lo) / (hi - lo)
            return (1 - w) * self.times[lo] + w * self.times[hi]
        small, large = sizes[0], sizes[-1]
        if large > small:
            slope = max(0.0, (self.times[large] - self.times[small]) / (large - small))
        else:
            slope = self.times[small] * self.prior_slope
        anchor = large if i else small
        return max(0.0, self.times[anchor] + slope * (inputs - anchor))


class BatchCost:
    """The verify cost a row's gates see in a batch of ``rows``: ``estimate(k)`` is the measured
    time of a packed pass where this row feeds ``k`` inputs and every other row its root alone."""

    def __init__(self, cost: VerifyCost) -> None:
        self.cost = cost  # pass time by total inputs, shared by every batch size
        self.rows = 1  # rows of the current step

    def estimate(self, inputs: int) -> float | None:
        return self.cost.estimate(self.rows - 1 + inputs)

    def observe(self, inputs: int, seconds: float) -> None:
        self.cost.observe(self.rows - 1 + inputs, seconds)


@dataclass
class Plan:
    """One row's proposal for the next step."""

    draft: Draft  # the merged draft (emptied when the step does not verify it)
    calls: list  # proposer calls, as Engine._propose returns them
    exploring: bool  # a proposer was called only to re-measure it: verify its draft
    propose_s: float  # seconds the row spent proposing


def choose_drafts(plans: list[tuple[Any, Plan]], cost: VerifyCost, rows: int, explore_every: int = 8) -> None:
    """Empty the drafts a batched pass should not verify (in place).

    A packed pass costs ``t(inputs)``: every row feeds its root, a verified draft adds its nodes.
    A row's step costs its share of a plain pass, ``F = t(rows) / rows`` (its root through the
    matmuls, and its own attention over its cache, which no other row shares), and yields one
    token; its draft adds ``t(inputs + size) - t(inputs)`` and ``expected`` tokens (``score x
    calibration``, capped for a draft without ``q`` by what the target's sharpness lets it reach:
    ``DraftGate.expected``). Skipping a draft does not spare the row its tokens: it makes
    them later, about ``F`` per token. So a draft is verified when ``expected x F`` covers what it
    adds to the pass. Drafts are judged in order of expected tokens per node, each against the pass
    as the drafts taken before it left it; drafts that must be verified (non-adaptive requests,
    exploration) are always in. With one row this is exactly the batch-1 rule
    ``(1 + expected) * t(1) >= t(1 + nodes)``.

    Worked example: 4 rows, t(4) = 10 ms, t(8) = 12 ms, t(16) = 20 ms, so F = 2.5 ms; drafts of
    planned size 4 (expecting 3 tokens) and 8 (expecting 1): the first: 3 x 2.5 = 7.5 >= t(8) - t(4)
    = 2 -> verified; the second: 1 x 2.5 = 2.5 < t(16) - t(8) = 8 -> skipped. (Judging a draft by
    the whole step's tokens per second instead, as this did before, also skipped drafts worth
    their nodes whenever the other rows' drafts were good: in-process at 8 requests it ran 75-113
    row steps where the same requests alone ran 57-82; now 51-93 against 55-101.)

    A draft's size here is its planned size (``Draft.gate_size()``), never what a sampled draft
    happened to produce; nothing of another row's sampling reaches a row's tokens.
    """
    inputs = rows  # every row's root
    optional: list[tuple[int, float, Any, Plan]] = []  # (planned size, expected tokens, seq, plan)
    for seq, plan in plans:
        if not len(plan.draft):
            continue
        size = plan.draft.gate_size()
        if not seq.spec.adaptive or plan.exploring or seq.batch_skipped + 1 >= explore_every:
            inputs += size
            seq.batch_skipped = 0
            continue
        optional.append((size, seq.gate.expected(plan.draft.score, seq.gate.shape_of(plan.draft)), seq, plan))
    plain = cost.estimate(rows)  # None: the first pass; measure a plain step before judging drafts
    optional.sort(key=lambda o: -o[1] / max(1, o[0]))  # stable: equal rates keep the rows' order
    for size, expected, seq, plan in optional:
        if plain:
            now, more = cost.estimate(inputs), cost.estimate(inputs + size)
            if now is not None and more is not None and expected * plain / rows >= more - now:
                inputs += size
                seq.batch_skipped = 0
                continue
        seq.batch_skipped += 1
        plan.draft, plan.calls = Draft(), []  # not verified: says nothing about the proposers


@dataclass
class _Handle:
    """A request submitted to the scheduler, and the queue its caller reads."""

    make: Callable[[list], _Sequence]  # builds the request's state from the proposer set it is lent
    cancel: threading.Event  # set by the caller (client gone) or when the caller stops reading
    seq: _Sequence | None = None  # the request's decode state, once admitted
    events: queue.Queue = field(default_factory=queue.Queue)  # StreamEvent..., then the final one, or an exception
    proposers: list | None = None  # the proposer set lent to this request
    joining: bool = False  # admitted, its prompt not yet in the cache (it rides in the next pass)


class BatchScheduler:
    """Steps up to ``max_num_seqs`` requests together on one thread; others wait in line."""

    def __init__(self, engine: Engine, max_num_seqs: int, threaded: bool = True) -> None:
        self.engine = engine
        self.max_num_seqs = max_num_seqs
        self.threaded = threaded  # False: the caller drives ``step()`` (tests compose batches step by step)
        self.cost = PassCost()  # pass time by total inputs (rows x width), learned across requests
        self.cost_view = BatchCost(self.cost)  # what the rows' own gates see (rows set per step)
        self.cache = SlotCache()
        self.cache.reserve(max_num_seqs, 0)  # every row at once: adding a row then never copies
        self.lean = lean_forward(engine)  # the lean verify pass, or None: the model's own forward
        self._rows: list[_Handle] = []  # row i of the cache
        self._waiting: deque[_Handle] = deque()
        self._cond = threading.Condition()
        self._pool: list[list] = []  # proposer sets not in use (forks of engine.proposers)
        self._pool_of: tuple[int, ...] = ()  # ids of the engine proposers the pool was forked from
        self._forked = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- caller side -----------------------------------------------------------------------------
    def submit(self, make_seq: Callable[[list], _Sequence], cancel: threading.Event | None = None) -> _Handle:
        """Queue a request; ``make_seq(proposers)`` builds its state when it joins the batch."""
        handle = _Handle(make_seq, cancel or threading.Event())
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._waiting.append(handle)
            if self.threaded and self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="suffixspec-batch", daemon=True)
                self._thread.start()
            self._cond.notify()
        return handle

    def stream(self, make_seq: Callable[[list], _Sequence], cancel: threading.Event | None) -> Iterator[Any]:
        """Run a request in the batch; yields its StreamEvents (the last carries the result)."""
        handle = self.submit(make_seq, cancel)
        finished = False
        try:
            while True:
                ev = handle.events.get()
                if isinstance(ev, BaseException):
                    finished = True
                    raise ev
                yield ev
                if ev.result is not None:
                    finished = True
                    return
        finally:
            if not finished:  # the caller stopped reading: the row leaves at the next step
                handle.cancel.set()

    @property
    def running(self) -> int:
        """Requests in the batch now."""
        return len(self._rows)

    def close(self, timeout: float | None = 30.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- scheduler thread --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._rows and not self._closed:
                    self._cond.wait()
                if self._closed and not self._rows and not self._waiting:
                    self._thread = None
                    return
            self.step()

    def step(self) -> None:
        """Admit waiting requests, then run one decode step for the batch (the thread's loop body)."""
        try:
            self._admit()
            if self._rows:
                self._step()
        except Exception as e:  # a failed pass fails its rows, never the thread
            log.exception("batched decode step failed")
            for h in list(self._rows):
                self._fail(h, e)

    def _proposer_set(self) -> list:
        current = tuple(id(p) for p in self.engine.proposers)
        if current != self._pool_of:  # the engine's proposers were replaced: fork the new ones
            self._pool, self._pool_of, self._forked = [], current, 0
        if self._pool:
            return self._pool.pop()
        self._forked += 1
        if self._forked == 1:
            return list(self.engine.proposers)
        return [p.fork() for p in self.engine.proposers]

    def _admit(self) -> None:
        while len(self._rows) < self.max_num_seqs:
            with self._cond:
                if not self._waiting:
                    return
                handle = self._waiting.popleft()
            handle.proposers = self._proposer_set()
            try:
                handle.seq = handle.make(handle.proposers)
                handle.seq.begin()
            except Exception as e:
                self._release(handle)
                handle.events.put(e)
                continue
            row = self.cache.add_row()
            self._rows.append(handle)
            if handle.cancel.is_set():  # gone while waiting: it leaves at the next step, unprefilled
                continue
            if self.lean is not None:  # its prompt is packed into the next pass with the others' drafts
                handle.joining = len(handle.seq.request.prompt_ids) > 1
                continue
            try:
                self._prefill(row, handle)
            except Exception as e:
                log.exception("prefill failed")
                self._fail(handle, e)

    def _prefill(self, row: int, handle: _Handle) -> None:
        seq = handle.seq
        t = time.perf_counter()
        prefill_row(self.engine, self.cache, row, seq.request.prompt_ids[:-1])
        seq.stats.time_prefill_s = time.perf_counter() - t

    def _step(self) -> None:
        plans: dict[int, Plan] = {}
        for h in list(self._rows):
            if h.joining and not h.cancel.is_set():
                continue  # no cache yet: it proposes from the next step on
            t = time.perf_counter()
            try:
                planned = h.seq.plan()
            except Exception as e:
                self._fail(h, e)
                continue
            if planned is None:  # cancelled, or out of context
                self._finish(h)
                continue
            plans[id(h)] = Plan(planned[0], planned[1], planned[2], time.perf_counter() - t)
        if not self._rows:
            return
        decoding = [(i, h) for i, h in enumerate(self._rows) if not h.joining]
        pairs = [(h.seq, plans[id(h)]) for _, h in decoding]
        rows = len(pairs)
        for seq, _ in pairs:
            seq.cost_view.rows = rows
        choose_drafts(pairs, self.cost, rows)
        eng = self.engine
        pass_rows = [draft_row(i, seq.last, p.draft, self.cache.lengths[i]) for (i, _), (seq, p) in
                     zip(decoding, pairs, strict=True)]
        joining = [(i, h) for i, h in enumerate(self._rows) if h.joining]
        t_forward = time.perf_counter()
        for i, h in joining:
            prompt = h.seq.request.prompt_ids[:-1]
            reused = self._reuse(i, prompt)
            if reused < len(prompt):
                pass_rows.append(PassRow(i, prompt[reused:], None, reused, logits=False))
        logits = forward_rows(eng, self.cache, pass_rows, self.lean) if pass_rows else []
        elapsed = time.perf_counter() - t_forward
        inputs = sum(len(r.ids) for r in pass_rows[:rows])
        if not joining:  # a pass with a prompt in it says little about the cost of drafts
            self.cost.observe(inputs, elapsed)
        if rows and eng.step_observer is not None:
            eng.step_observer(rows, inputs)
        store = eng.prefix_store
        for i, h in joining:
            prompt = h.seq.request.prompt_ids[:-1]
            self.cache.lengths[i] = len(prompt)
            h.joining = False
            h.seq.stats.time_prefill_s = elapsed
            if store is not None:
                for end in store.wanted(prompt, 0):
                    store.put(prompt, end, [k[i, :, end - store.block : end] for k in self.cache.keys],
                              [v[i, :, end - store.block : end] for v in self.cache.values])
        done = []
        for (i, h), (seq, plan), row_logits in zip(decoding, pairs, logits, strict=False):
            try:
                t_row = time.perf_counter()
                outcome = verify_tree(plan.draft, row_logits, seq.processor, seq.rng, position=len(seq.output))
                t_verified = time.perf_counter()
                self.cache.keep(i, self.cache.lengths[i], [0] + [k + 1 for k in outcome.accepted])
                ev = seq.commit(plan.draft, plan.calls, outcome, plan.propose_s, elapsed + t_verified - t_row,
                                t_verified)
            except Exception as e:
                done.append((h, e))
                continue
            h.events.put(ev)
            if seq.finish is not None:
                done.append((h, None))
        for h, err in done:
            if err is None:
                self._finish(h)
            else:
                self._fail(h, err)

    @torch.inference_mode()
    def _reuse(self, row: int, prompt: list[int]) -> int:
        """Copy the longest stored prefix of a joiner's prompt into its row; returns its length."""
        store = self.engine.prefix_store
        if store is None:
            return 0
        n, blocks = store.lookup(prompt)
        if n:
            self.lean.ready(self.cache, n)
            at = 0
            for keys, values in blocks:
                for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
                    self.cache.keys[layer][row, :, at : at + store.block] = k
                    self.cache.values[layer][row, :, at : at + store.block] = v
                at += store.block
        return n

    def _remove(self, handle: _Handle) -> None:
        row = self._rows.index(handle)
        self.cache.remove_row(row)
        last = self._rows.pop()
        if last is not handle:
            self._rows[row] = last
        self._release(handle)

    def _release(self, handle: _Handle) -> None:
        if handle.proposers is not None and tuple(id(p) for p in self.engine.proposers) == self._pool_of:
            self._pool.append(handle.proposers)
        handle.proposers = None

    def _finish(self, handle: _Handle) -> None:
        try:
            ev = handle.seq.close()
        except Exception as e:
            self._remove(handle)
            handle.events.put(e)
            return
        self._remove(handle)
        handle.events.put(ev)

    def _fail(self, handle: _Handle, err: BaseException) -> None:
        try:
            handle.seq.end_proposers()
        except Exception:
            log.exception("ending the proposers of a failed request failed")
        if handle in self._rows:
            self._remove(handle)
        else:
            self._release(handle)
        handle.events.put(err)
