"""The target model as the scheduler drives it: rows of keys and values, and one pass over them.

A :class:`Runner` owns the target's :class:`~suffixspec.core.kv.SlotCache` (one row per running request)
and runs a pass: a list of :class:`~suffixspec.core.lean.PassRow` (a row's root and draft nodes, or a
joining request's prompt) -> logits per row. Two ways to run it:

- **lean** (Llama, Qwen2, Mistral, Gemma 3: :mod:`suffixspec.core.lean`): every row packed into one
  forward, prompts included, rows in any order;
- **padded** (any other model): the model's own ``transformers`` forward over ``[B, W]`` inputs padded
  to the widest row with a 4D mask per layer type (built by ``kv.tree_mask``); it takes every cache
  row in order, so a joining request's prompt is fed in a pass of its own when it joins
  (:meth:`prefill`), as :attr:`packs_prompts` says. Worked example (two rows, lengths 3 and 1, widths
  2 and 1)::

    row 0: cache a b c | new x y     mask row "y": 1 1 1 1 1    (a b c, x its parent, itself)
    row 1: cache d . . | new z pad   mask row "z": 1 0 0 1 0    (d, itself; the gap is masked)
    position ids: row 0 [3, 4], row 1 [1, 1]

Masked entries add ``finfo.min`` before the softmax, so they weigh exactly zero: a row's logits are
those of the row run alone up to float rounding of the batched matmuls. :meth:`batch_problem` probes
that once (two rows of different lengths, a tree in one) against the model's own forward, row by
row; a model that fails it runs one request at a time (``rows = 1``), said in the log.

Prompt-prefix reuse (:class:`~suffixspec.core.prefix.PrefixStore`): :meth:`reuse` copies the longest
stored run of a joining prompt's blocks into its row, so only the rest is fed; :meth:`remember`
stores the blocks a prefill computed. Every path uses it.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from suffixspec.core.kv import SlotCache, additive, layer_types, tree_mask
from suffixspec.core.lean import PassRow, lean_forward
from suffixspec.core.lean_weights import paging_own_forward, unsupported
from suffixspec.core.prefix import PrefixStore
from suffixspec.core.weights import released
from suffixspec.drafting.draft import root_path

log = logging.getLogger(__name__)


class Runner:
    """The target's cache rows and passes (see the module docstring)."""

    def __init__(self, model: Any, rows: int = 1, prefix_store: PrefixStore | None = None, lean: bool = True,
                 weights: str = "float") -> None:
        self.model = model
        cfg = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        types = layer_types(cfg)  # refuses layers whose cache cannot drop rejected tokens
        self.windows: dict[str, int | None] = dict(types)  # layer type -> window (None: full)
        params = inspect.signature(model.forward).parameters
        # transformers 5.x renames ``past_key_values`` to ``cache``; accept both generations
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keeps_one = "logits_to_keep" in params
        # weights: the lean forward's weight kind (lean.KINDS); a quantized one has no other way to run
        self.lean = lean_forward(model, weights) if lean else None
        if self.lean is None and (weights != "float" or released(model)):
            raise ValueError(f"{type(model).__name__} cannot run with {weights} weights: that needs suffixspec's lean "
                             f"forward (Llama, Qwen2, Mistral, Gemma 3 families; {unsupported(model) or 'its build failed'}"
                             f"); load it with weights='float32'")
        self.prefix_store = prefix_store
        self.rows = rows  # the most rows a pass may hold
        self.cache = SlotCache(rows)
        self._probing = False  # the batching probe's passes are not shown to the model's observers

    @property
    def packs_prompts(self) -> bool:
        """Whether a joining request's prompt rides in the next pass with the others' drafts (lean), or is
        fed when it joins, in a pass of its own (:meth:`prefill`, the padded forward)."""
        return self.lean is not None

    # -- rows ------------------------------------------------------------------------------------------
    def add_row(self) -> int:
        return self.cache.add_row()

    def remove_row(self, row: int) -> None:
        self.cache.remove_row(row)

    def length(self, row: int) -> int:
        return self.cache.lengths[row]

    def keep(self, row: int, start: int, keep: list[int]) -> None:
        """After a pass that wrote row ``row`` at ``start``: keep the new-block offsets ``keep`` in order."""
        self.cache.keep(row, start, keep)

    def set_length(self, row: int, length: int) -> None:
        self.cache.lengths[row] = length

    # -- passes ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, rows: list[PassRow]) -> list[torch.Tensor | None]:
        """Per row: logits [wanted, vocab] (float32) or None; one pass. The padded forward takes every
        cache row, in order, with logits (prompts go through :meth:`prefill`)."""
        if self.lean is not None:
            self._observe_call()
            return self.lean(rows, self.cache)
        if [r.row for r in rows] != list(range(self.cache.size)) or any(r.logits != "all" for r in rows):
            raise ValueError("the padded pass takes every cache row in order, with logits")
        width = max(len(r.ids) for r in rows)
        self.cache.begin(0, width)
        ids, mask, positions = self._padded_inputs(rows, width, self.cache.kv_len)
        out = self._call(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         **{self._cache_kw: self.cache}).logits.float()
        return [out[i, : len(r.ids)] for i, r in enumerate(rows)]

    @torch.inference_mode()
    def prefill(self, row: int, ids: list[int], start: int = 0) -> None:
        """Feed ``ids`` (a prompt, all but its last token) into row ``row`` after its first ``start``
        positions (a reused prefix), alone; the row's length becomes ``start + len(ids)``."""
        if ids:
            if self.lean is not None:
                self._observe_call()
                self.lean([PassRow(row, ids, None, start, "none")], self.cache)
            else:
                self._padded_prefill(row, ids, start)
        self.cache.lengths[row] = start + len(ids)

    def _padded_prefill(self, row: int, ids: list[int], start: int) -> None:
        cache = self.cache
        cache.lengths[row] = start
        cache.begin(row, len(ids))  # the pass holds this row alone (a joiner is the last row)
        _, mask, positions = self._padded_inputs([PassRow(row, ids, None, start, "none")], len(ids), cache.kv_len)
        kwargs: dict[str, Any] = {self._cache_kw: cache, "attention_mask": mask, "position_ids": positions}
        if self._keeps_one:
            kwargs["logits_to_keep"] = 1
        self._call(input_ids=torch.tensor([ids], device=self.device), use_cache=True, **kwargs)

    def _padded_inputs(self, rows: list[PassRow], width: int, kv_len: int
                       ) -> tuple[torch.Tensor, torch.Tensor | dict[str, torch.Tensor], torch.Tensor]:
        """(input ids [B, W], 4D additive mask [B, 1, W, kv_len] or one per layer type, position ids [B, W]).

        Padding (up to the widest row) repeats the root and attends to itself only."""
        windows = list(dict.fromkeys(self.windows.values()))
        allowed = {w: np.zeros((len(rows), width, kv_len), dtype=bool) for w in windows}
        positions = np.zeros((len(rows), width), dtype=np.int64)
        input_ids = np.zeros((len(rows), width), dtype=np.int64)
        for b, r in enumerate(rows):
            n = len(r.ids)
            input_ids[b, :n] = r.ids
            input_ids[b, n:] = r.ids[0]
            depth, masks = tree_mask(r.parents, r.past, windows, n)
            positions[b, :n] = depth + r.past
            positions[b, n:] = r.past
            for w, m in masks.items():
                if m.allowed is not None:
                    allowed[w][b, :n, m.first : r.past + n] = m.allowed
                elif m.causal:
                    allowed[w][b, :n, m.first : r.past + n] = np.tril(np.ones((n, n), dtype=bool))
                else:
                    allowed[w][b, :n, m.first : r.past + n] = True
                for k in range(n, width):
                    allowed[w][b, k, r.past + k] = True
        masks = {w: additive(a, self.dtype, self.device)[:, None] for w, a in allowed.items()}
        by_type = {kind: masks[w] for kind, w in self.windows.items()}
        mask: Any = next(iter(by_type.values())) if len(by_type) == 1 else by_type
        return (torch.from_numpy(input_ids).to(self.device), mask, torch.from_numpy(positions).to(self.device))

    def _call(self, **kwargs: Any) -> Any:
        """The model's own forward (its hooks run, except for the probe's passes)."""
        return self.model.forward(**kwargs) if self._probing else self.model(**kwargs)

    def _observe_call(self) -> None:
        """Run the target module's forward pre-hooks: observers of the model (a pass counter, a profiler)
        see every pass, the lean ones too, which do not go through ``model.forward``."""
        if self._probing:
            return
        for hook in list(self.model._forward_pre_hooks.values()):
            hook(self.model, ())

    # -- prompt prefixes -------------------------------------------------------------------------------
    @torch.inference_mode()
    def reuse(self, row: int, prompt: list[int]) -> int:
        """Copy the longest stored prefix of ``prompt`` into the (empty) row; returns its length."""
        store = self.prefix_store
        if store is None:
            return 0
        n, blocks = store.lookup(prompt)
        if n:
            if self.lean is not None:
                self.lean.allocate(self.cache, n)
            elif not self.cache.keys:
                return 0  # the padded forward makes its buffers on its first pass
            at = 0
            for keys, values in blocks:
                self.cache.copy_in(row, at, keys, values)
                at += store.block
        self.cache.lengths[row] = n
        return n

    def remember(self, row: int, prompt: list[int]) -> None:
        """Store the whole blocks of ``prompt`` (now in row ``row``) that the store lacks."""
        store = self.prefix_store
        if store is None:
            return
        store.fill(prompt, lambda start, end: self.cache.block(row, start, end))

    # -- probes on a scratch cache ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _scratch(self, rows: int, capacity: int) -> Iterator[None]:
        """Run probe passes on a cache of their own (the real rows untouched); the model's observers see none."""
        saved = self.cache
        self._probing = True
        try:
            self.cache = SlotCache(rows, capacity=capacity)
            yield
        finally:
            self.cache = saved
            self._probing = False

    @contextlib.contextmanager
    def sample_pass(self, inputs: int, context: int) -> Iterator[Callable[[], None]]:
        """A callable that runs one pass of ``inputs`` tokens (a root and a chain) after ``context`` cached
        ones, on a scratch cache (the thread count's probe: ``threads.ThreadTuner.calibrate``)."""
        ids = [(7 * i + 3) % self.vocab_size for i in range(context + inputs)]
        with self._scratch(1, context + inputs), torch.inference_mode():
            row = self.cache.add_row()
            self.prefill(row, ids[:context])

            def run() -> None:
                self.forward([PassRow(row, ids[context:], None, context)])
                self.cache.lengths[row] = context

            yield run

    # -- the batching probe ----------------------------------------------------------------------------
    def batch_problem(self) -> str | None:
        """Why passes over several rows would not give each row its own logits, or None when they do.

        Two rows of different lengths, a tree draft in one, against the model's own forward over each
        row's tokens alone: a model whose attention ignores the 4D mask or the per-row positions, or a
        lean forward that does not match its model, fails it. Run on a scratch cache."""
        vocab = self.vocab_size
        if getattr(self.lean, "exact", False):
            return self.invariance_problem()
        # how far a row's logits may be from the model's own, relative to their largest: 1e-3 in float32;
        # four rounding steps of a reduced precision (bf16 3.1e-2, fp16 3.9e-3), where any two kernels
        # differ by more than 1e-3 (measured on the tiny test models, lean against transformers' forward,
        # largest logit difference over the largest logit: bf16 0.7-0.8%, fp16 0.09-0.12%); a wrong mask or
        # position moves logits by their own size
        tol = max(1e-3, 4 * torch.finfo(self.dtype).eps)
        prompts = [[(7 * i + 3) % vocab for i in range(9)], [(5 * i + 1) % vocab for i in range(4)]]
        drafts = [([11 % vocab, 12 % vocab, 13 % vocab], [-1, 0, 0]), ([], [])]
        try:
            with self._scratch(2, 16):
                return self._batch_problem(prompts, drafts, vocab, tol)
        except Exception as e:  # noqa: BLE001 - any failure means "not batchable", said in the log
            return f"a batched pass failed: {type(e).__name__}: {e}"

    def invariance_problem(self) -> str | None:
        """For an exact format (``lean.exact``): why a row's logits would depend on the pass's other rows, or
        None when they do not. Each probe row's logits in one packed pass (prompts of different lengths, a
        tree draft, a chain, a lone root) must equal, bit for bit, its logits from passes of its own in which
        every token is fed one at a time, as plain decoding feeds them (the model's own forward cannot serve
        as the reference: its float weights are released)."""
        vocab = self.vocab_size
        prompts = [[(7 * i + 3) % vocab for i in range(9)], [(5 * i + 1) % vocab for i in range(4)],
                   [(3 * i + 2) % vocab for i in range(6)]]
        drafts = [([11 % vocab, 12 % vocab, 13 % vocab, 14 % vocab], [-1, 0, 0, 1]), ([], []),
                  ([21 % vocab, 22 % vocab], [-1, 0])]
        try:
            with self._scratch(len(prompts), 16):
                rows = [self.cache.add_row() for _ in prompts]
                for r, ids in zip(rows, prompts, strict=True):
                    self.prefill(r, ids[:-1])
                batched = self.forward([PassRow(r, [ids[-1], *tokens], parents, len(ids) - 1)
                                        for r, ids, (tokens, parents) in zip(rows, prompts, drafts, strict=True)])
            for b, (ids, (tokens, parents)) in enumerate(zip(prompts, drafts, strict=True)):
                for k in range(-1, len(tokens)):  # each node's path fed token by token on a cache of its own
                    path = [tokens[n] for n in root_path(parents, k)] if k >= 0 else []
                    with self._scratch(1, 16):
                        row = self.cache.add_row()
                        self.prefill(row, ids[:-1])
                        for j, t in enumerate([ids[-1], *path]):
                            alone = self.forward([PassRow(row, [t], None, len(ids) - 1 + j)])[0][0]
                            self.cache.lengths[row] = len(ids) + j
                    if not torch.equal(alone, batched[b][k + 1]):
                        diff = float((alone - batched[b][k + 1]).abs().max())
                        return f"a row's logits change with the pass's other rows (by {diff:.3g})"
        except Exception as e:  # noqa: BLE001 - any failure means "not batchable", said in the log
            return f"a batched pass failed: {type(e).__name__}: {e}"
        return None

    def _batch_problem(self, prompts: list[list[int]], drafts: list[tuple[list[int], list[int]]], vocab: int,
                       tol: float) -> str | None:
        rows = [self.cache.add_row() for _ in prompts]
        for r, ids in zip(rows, prompts, strict=True):
            self.prefill(r, ids[:-1])
        batched = self.forward([PassRow(r, [ids[-1], *tokens], parents, len(ids) - 1)
                                for r, ids, (tokens, parents) in zip(rows, prompts, drafts, strict=True)])
        for ids, (tokens, parents), got in zip(prompts, drafts, batched, strict=True):
            # one plain forward per leaf of the tree covers the root and every node on its path
            # (the probe runs at start-up: HF forwards cost 0.1-0.3 s each on a CPU)
            leaves = [k for k in range(len(tokens)) if k not in parents] or [-1]
            for leaf in leaves:
                path = root_path(parents, leaf)
                with torch.inference_mode(), paging_own_forward(self.model):  # forward(): no model hooks
                    ref = self.model.forward(input_ids=torch.tensor([ids + [tokens[n] for n in path]],
                                                                    device=self.device)).logits[0].float()
                for j, k in enumerate([-1, *path]):  # -1: the root (logits after the prompt)
                    want = ref[len(ids) - 1 + j]
                    diff = float((got[k + 1] - want).abs().max())
                    if diff > tol * max(1.0, float(want.abs().max())):
                        return f"batched logits differ from the model's own by {diff:.3g}"
        return None
