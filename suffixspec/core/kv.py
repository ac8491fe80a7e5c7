"""The target's keys and values, and which of them each input of a pass attends to.

:class:`SlotCache` holds the keys and values of up to ``rows`` requests in one preallocated buffer
per layer, row ``r`` holding request ``r``'s tokens at positions ``0 .. lengths[r] - 1``. A pass
writes row ``r``'s new block at ``lengths[r] ..`` (rows of different lengths need no copying);
after verification :meth:`SlotCache.keep` moves the accepted nodes' entries into place and the
row's length drops the rest. Every position of every layer is kept, sliding-window layers too: a
cache that forgets old positions as it goes cannot take back the rejected nodes of a verify pass.

:func:`tree_mask` says what each input of a row sees. The pass feeds ``[root] + draft nodes``
after ``past`` cached tokens; input ``k`` (``k = 0`` is the root, the last committed token) sees
every cached token, itself and its ancestors::

    parents (draft) = [-1, 0, 0]      input = [root, n0, n1, n2]
    allowed over the new block (1 = attend):
        root: 1 0 0 0
        n0:   1 1 0 0
        n1:   1 1 1 0
        n2:   1 1 0 1
    position ids = past + [0, 1, 2, 2]  (depth)

Sliding-window layers (Mistral, Gemma 2/3, Qwen2 with ``use_sliding_window``) see only the last
``W`` positions: an input at position ``P = past + depth`` sees a cached token at ``j`` iff
``P - j < W`` and an ancestor at depth ``d'`` iff ``depth - d' < W`` (``transformers``'
``sliding_window_overlay`` on positions, so a tree node sees what it would see in a chain). Worked
example (``W = 2``, ``past = 3``, chain of 2): the root at position 3 sees cached 2 and itself;
node 1 (position 4) sees the root and itself; node 2 sees node 1 and itself. Models whose layers
are neither full nor sliding attention (linear attention, recurrent or chunked layers, shared KV)
are refused at load by :func:`attention_windows`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

SUPPORTED_LAYERS = ("full_attention", "sliding_attention")


def attention_windows(config: Any) -> dict[str, int | None]:
    """Attention layer types of a model and their windows (``None``: full), e.g. Gemma 2:
    ``{"full_attention": None, "sliding_attention": 4096}``.

    Raises ValueError, naming the layer types, for a model whose cache tree verification cannot
    rewind (anything but full and sliding-window attention).
    """
    types = layer_types(config)
    kinds: dict[str, int | None] = {}
    for kind, window in types:
        kinds[kind] = window
    return kinds


def layer_types(config: Any) -> list[tuple[str, int | None]]:
    """(layer type, sliding window or None) per decoder layer, in order; refuses what cannot be rewound.

    Read with ``transformers``' own helper where it has one (``cache_utils.get_layer_types_and_kwargs``,
    which knows the newest layouts), else from the config's documented fields (:func:`_config_layer_types`:
    ``layer_types``, ``sliding_window``, ``attention_chunk_size``): the helper is not public API, so a
    ``transformers`` release without it (5.6, the lowest release suffixspec supports, has none; a later one may rename it) must not
    stop a start.
    """

    def refuse(types: list[str]) -> None:
        bad = sorted({t for t in types if t not in SUPPORTED_LAYERS})
        if bad:
            raise ValueError(
                f"{getattr(config, 'model_type', 'this model')} has {', '.join(bad)} layers; suffixspec verifies "
                f"draft trees only on models with full or sliding-window attention layers "
                f"({', '.join(SUPPORTED_LAYERS)}), whose KV cache can drop rejected draft tokens. Use such a model "
                "(e.g. Llama, Qwen2, Mistral, Gemma 2)")

    decoder = config.get_text_config(decoder=True)
    refuse(list(getattr(decoder, "layer_types", None) or []))  # before the kwargs of a type we do not know
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        types, kwargs = get_layer_types_and_kwargs(decoder)
        windows = [kw.get("sliding_window") for kw in kwargs]
    except (ImportError, AttributeError, TypeError):  # no such helper, or one that reads other fields
        types, windows = _config_layer_types(decoder)
    refuse(types)  # inferred types, and layers that reuse another layer's KV ("dummy")
    return list(zip(types, windows, strict=True))


def _config_layer_types(decoder: Any) -> tuple[list[str], list[int | None]]:
    """(layer types, sliding windows) from a decoder config's documented fields, as ``transformers``' caches
    read them: ``layer_types`` when the config has it, else every layer sliding when ``sliding_window`` is
    set (Mistral), chunked when ``attention_chunk_size`` is, full otherwise. Layers that reuse another
    layer's keys and values (``num_kv_shared_layers``, ``kv_sharing_modes``) come out as ``"dummy"``.

    Example: Gemma 3 (``layer_types`` = 5 sliding then 1 full, ``sliding_window`` 512) ->
    ``(["sliding_attention"] * 5 + ["full_attention"], [512] * 5 + [None])``.
    """
    n = int(decoder.num_hidden_layers)
    window = getattr(decoder, "sliding_window", None)
    chunk = getattr(decoder, "attention_chunk_size", None)
    types = list(getattr(decoder, "layer_types", None) or [])
    if not types:
        kind = "sliding_attention" if window is not None else "chunked_attention" if chunk is not None \
            else "full_attention"
        types = [kind] * n
    shared = int(getattr(decoder, "num_kv_shared_layers", 0) or 0)
    if shared:
        types = types[: n - shared] + ["dummy"] * shared
    modes = getattr(decoder, "kv_sharing_modes", None)
    if modes:
        types = ["dummy" if mode == "reuse" else t for t, mode in zip(types, modes, strict=False)]
    types = ["dummy" if t in ("moe", "mlp") else t for t in types]
    return types, [window if t == "sliding_attention" else chunk if t == "chunked_attention" else None for t in types]


def new_cache(config: Any) -> Any:
    """A ``DynamicCache`` that keeps every position of every layer (see the module docstring);
    for draft models that run through their own ``transformers`` forward."""
    from transformers import DynamicCache

    windows = attention_windows(config)
    return DynamicCache() if any(w is not None for w in windows.values()) else DynamicCache(config=config)


@dataclass
class RowMask:
    """What the inputs of one row see under one attention window (see :func:`tree_mask`)."""

    first: int  # the first key position any input of the row sees (0 for full attention)
    allowed: np.ndarray | None  # [n, past + n - first] bool; None: every key from ``first`` on (no mask needed)
    causal: bool = False  # a causal chain over keys [first, past + n) with past == first: ``is_causal`` applies


def tree_mask(parents: list[int] | None, past: int, windows: Iterable[int | None] = (None,),
              n: int | None = None) -> tuple[np.ndarray, dict[int | None, RowMask]]:
    """(depth of each input [n], {window: RowMask}) for a row feeding ``[root] + nodes`` after ``past``
    cached positions. ``parents`` as ``Draft.parents`` (of the nodes; -1 = the root), or None for a
    causal chain of ``n`` inputs (a prompt). The padded pass's mask builder; the lean pass builds the same
    masks on the device from :func:`tree_block` and :func:`key_span`.

    Example: ``tree_mask([-1, 0, 0], 2)`` -> depth ``[0, 1, 2, 2]`` and, for full attention,
    ``first = 0`` and rows ``[1 1 1 0 0 0], [1 1 1 1 0 0], [1 1 1 1 1 0], [1 1 1 1 0 1]``.
    """
    depth, block = tree_block(parents, n)
    n = len(depth)
    out: dict[int | None, RowMask] = {}
    for window in windows:
        if window in out:
            continue
        first, free, causal = key_span(depth, past, window, parents is None)
        if free:
            out[window] = RowMask(first, None, causal)
            continue
        allowed = np.ones((n, past + n - first), dtype=bool)
        allowed[:, past - first:] = np.tril(np.ones((n, n), dtype=bool)) if block is None else block
        if window is not None:
            positions = depth + past  # [n]
            keys = np.concatenate([np.arange(first, past), positions])  # [past + n - first]
            allowed &= positions[:, None] - keys[None, :] < window
        out[window] = RowMask(first, allowed)
    return depth, out


def tree_block(parents: list[int] | None, n: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(depth of each input [n], ancestor-or-self matrix of the new block [n, n] bool) of a row feeding
    ``[root] + nodes``; for a causal chain of ``n`` inputs (``parents`` None) the matrix is None (it is
    lower-triangular). Example: ``tree_block([-1, 0, 0])`` -> depth ``[0, 1, 2, 2]``, rows ``[1 0 0 0],
    [1 1 0 0], [1 1 1 0], [1 1 0 1]``."""
    if parents is None:
        if n is None:
            raise ValueError("a causal chain needs its length n")
        return np.arange(n), None
    n = len(parents) + 1
    block = np.zeros((n, n), dtype=bool)
    depth = np.zeros(n, dtype=np.int64)
    block[0, 0] = True
    for i, par in enumerate(parents):  # parents come before their children
        k, pk = i + 1, par + 1
        block[k] = block[pk]
        block[k, k] = True
        depth[k] = depth[pk] + 1
    return depth, block


def key_span(depth: np.ndarray, past: int, window: int | None, chain: bool) -> tuple[int, bool, bool]:
    """(the first key position any input of the row sees, whether the inputs need no mask over keys
    ``[first, past + n)``, whether ``is_causal`` gives their mask) under ``window`` (None: full attention).

    No mask: the root alone (it sees every key from ``first`` on), or a prompt over an empty cache (causal),
    as long as no input has a key beyond its window in that range: the deepest input (position
    ``past + deepest``) must not see keys at or before ``past + deepest - window``. Example: a lone root
    after 7 cached tokens under a window of 4 -> ``(4, True, False)``."""
    first = 0 if window is None else max(0, past - window + 1)
    if window is None or past + int(depth.max()) - window < first:
        if len(depth) == 1:
            return first, True, False
        if chain and past == first:
            return first, True, True
    return first, False, False


def additive(allowed: np.ndarray, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An additive attention mask (0 where allowed, the dtype's minimum elsewhere) of ``allowed``'s shape."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(torch.from_numpy(~allowed).to(device), torch.finfo(dtype).min)


class SlotCache:
    """Keys and values of up to ``rows`` requests, row ``r`` valid at positions ``< lengths[r]``.

    Buffers are ``[rows, kv_heads, capacity, head_dim]`` per layer, allocated for the scheduler's
    full row count at once and doubled in positions when a row outgrows them (zeroed: masked
    garbage must be finite). The lean forward writes into them directly; a model's own
    ``transformers`` forward sees the cache through :meth:`update` (its per-layer cache call),
    which writes the new block of each row at ``lengths[r]`` and returns the first ``kv_len``
    positions of the rows in the pass (the mask hides what a row does not own).
    """

    def __init__(self, rows: int = 1, capacity: int = 256) -> None:
        self.keys: list[torch.Tensor] = []  # per layer [rows, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []  # valid positions per active row
        self.capacity = capacity  # positions allocated per row (grows by doubling)
        self._rows = rows  # rows allocated in the buffers
        self._first = 0  # first row of the current padded forward
        self._kv_len = 0  # positions the current padded forward attends to

    @property
    def size(self) -> int:
        """Active rows."""
        return len(self.lengths)

    def allocate(self, layers: int, kv_heads: list[int] | int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        """Make the (empty) buffers for a model of this shape (a padded forward makes them in ``update``)."""
        heads = [kv_heads] * layers if isinstance(kv_heads, int) else list(kv_heads)
        self.keys = [torch.zeros((self._rows, h, self.capacity, head_dim), dtype=dtype, device=device) for h in heads]
        self.values = [torch.zeros_like(k) for k in self.keys]

    @torch.inference_mode()
    def reserve(self, rows: int, positions: int) -> None:
        """Room for ``rows`` rows of ``positions`` each (growing copies the buffers)."""
        if rows <= self._rows and positions <= self.capacity:
            return
        rows = max(rows, self._rows)
        capacity = self.capacity
        while capacity < positions:
            capacity *= 2
        # layer by layer (one layer's copy at a time in memory); the sizes are recorded once every layer has
        # grown, so a growth that fails part way (out of memory) leaves the cache as it was for its users:
        # the layers already grown hold the same entries, and the next growth skips them
        for layer, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            self.keys[layer] = _grown(k, rows, capacity)
            self.values[layer] = _grown(v, rows, capacity)
        self._rows, self.capacity = rows, capacity

    def add_row(self) -> int:
        """A new empty row at the end; returns its index (room made first: a failure adds no row)."""
        self.reserve(self.size + 1, 0)
        self.lengths.append(0)
        return self.size - 1

    @torch.inference_mode()  # the buffers are inference tensors
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

    @torch.inference_mode()
    def copy_in(self, row: int, at: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Write per-layer ``[kv_heads, n, head_dim]`` blocks into row ``row`` at ``at ..`` (a reused prefix)."""
        n = keys[0].shape[-2]
        self.reserve(self._rows, at + n)
        for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
            self.keys[layer][row, :, at : at + n] = k
            self.values[layer][row, :, at : at + n] = v

    def block(self, row: int, start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Row ``row``'s per-layer keys and values at positions ``start .. end - 1`` (views)."""
        return ([k[row, :, start:end] for k in self.keys], [v[row, :, start:end] for v in self.values])

    # -- a model's own forward (the padded pass) ------------------------------------------------
    def begin(self, first: int, width: int) -> None:
        """The next padded forward writes ``width`` positions for each row from ``first`` to the last."""
        self._first = first
        self._kv_len = max(self.lengths[first:]) + width
        self.reserve(self.size, self._kv_len)

    @property
    def kv_len(self) -> int:
        """Positions the current padded forward attends to."""
        return self._kv_len

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

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths, default=0)


def _grown(buf: torch.Tensor, rows: int, positions: int) -> torch.Tensor:
    if buf.shape[0] >= rows and buf.shape[2] >= positions:
        return buf
    rows, positions = max(rows, buf.shape[0]), max(positions, buf.shape[2])  # (a layer grown by a failed growth)
    out = torch.zeros((rows, buf.shape[1], positions, buf.shape[3]), dtype=buf.dtype, device=buf.device)
    out[: buf.shape[0], :, : buf.shape[2]] = buf
    return out
