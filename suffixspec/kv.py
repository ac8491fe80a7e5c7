"""Tree attention inputs and KV-cache compaction for one verification pass.

The verify pass feeds ``[root] + draft nodes`` after ``past`` cached tokens. Node ``k`` of the input
(``k = 0`` is the root, the last committed token) sees every cached token, itself and its ancestors:

    parents (draft) = [-1, 0, 0]      input = [root, n0, n1, n2]
    mask over the new block (1 = attend):
        root: 1 0 0 0
        n0:   1 1 0 0
        n1:   1 1 1 0
        n2:   1 1 0 1
    position ids = past + [0, 1, 2, 2]  (depth)

Sliding-window layers (Mistral, Gemma 2/3, Qwen2 with ``use_sliding_window``) see only the last
``W`` positions: a node at position ``P = past + depth`` attends to a cached token at ``j`` iff
``P - j < W`` and to an ancestor at depth ``d'`` iff ``depth - d' < W`` (``transformers``'
``sliding_window_overlay`` on positions, so a tree node sees what it would see in a chain). The
cache keeps every position in every layer (plain ``DynamicLayer`` objects): a sliding layer of
``transformers`` drops old positions as it goes, and then cannot take back the rejected nodes of a
verify pass. Models whose layers are neither full nor sliding attention (linear attention,
recurrent or chunked layers, shared KV) are refused at load by :func:`attention_windows`.

Worked example (``W = 2``, ``past = 3``, chain of 2): the root at position 3 sees cached 2 and
itself; node 1 (position 4) sees the root and itself; node 2 sees node 1 and itself.
"""

from __future__ import annotations

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
    from transformers.cache_utils import get_layer_types_and_kwargs

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
    types, kwargs = get_layer_types_and_kwargs(decoder)
    refuse(types)  # inferred types, and layers that reuse another layer's KV ("dummy")
    return {t: kw.get("sliding_window") for t, kw in zip(types, kwargs, strict=True)}


def new_cache(config: Any) -> Any:
    """A ``DynamicCache`` that keeps every position of every layer (see the module docstring)."""
    from transformers import DynamicCache

    windows = attention_windows(config)
    return DynamicCache() if any(w is not None for w in windows.values()) else DynamicCache(config=config)


def tree_inputs(parents: list[int], past: int, dtype: torch.dtype, device: torch.device | str,
                windows: dict[str, int | None] | None = None) -> tuple[torch.Tensor | dict[str, torch.Tensor],
                                                                        torch.Tensor]:
    """(4D additive attention mask [1, 1, n, past + n], position ids [1, n]) for root + draft nodes.

    ``windows`` (from :func:`attention_windows`): with a sliding-window layer type the mask is cut
    to each window; with several layer types it is a dict of masks by layer type, the form
    ``transformers``' hybrid models (Gemma 2/3, Qwen2) take as ``attention_mask``.
    """
    n = len(parents) + 1
    allowed = np.zeros((n, n), dtype=bool)  # [n, n] ancestor-or-self over the new block
    depth = np.zeros(n, dtype=np.int64)
    allowed[0, 0] = True
    for i, par in enumerate(parents):
        k, pk = i + 1, par + 1
        allowed[k] = allowed[pk]
        allowed[k, k] = True
        depth[k] = depth[pk] + 1
    full = np.ones((n, past + n), dtype=bool)
    full[:, past:] = allowed
    positions = depth + past  # [n]
    key_positions = np.concatenate([np.arange(past), positions])  # [past + n]

    def additive(visible: np.ndarray) -> torch.Tensor:
        mask = torch.zeros((1, 1, n, past + n), dtype=dtype, device=device)
        return mask.masked_fill_(torch.from_numpy(~visible).to(device)[None, None], torch.finfo(dtype).min)

    masks = {}
    for kind, window in (windows or {"full_attention": None}).items():
        visible = full if window is None else full & (positions[:, None] - key_positions[None, :] < window)
        masks[kind] = additive(visible)
    mask = next(iter(masks.values())) if len(masks) == 1 else masks
    return mask, torch.from_numpy(positions).to(device)[None]


@torch.inference_mode()
def keep_accepted(cache, past: int, keep: list[int]) -> None:
    """Compact the cache after a verify pass over ``n`` new tokens starting at ``past``.

    ``keep`` lists the new-block offsets to keep, in order (root first, then accepted nodes); they
    are moved to ``past, past + 1, ...`` and everything after is cropped. For a chain whose accepted
    nodes are a prefix, only the crop happens.
    """
    total = cache.get_seq_length()
    contiguous = keep == list(range(len(keep)))
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        if not contiguous:
            idx = torch.tensor([past + k for k in keep], device=layer.keys.device)
            layer.keys[..., past : past + len(keep), :] = layer.keys.index_select(-2, idx)
            layer.values[..., past : past + len(keep), :] = layer.values.index_select(-2, idx)
    drop = total - (past + len(keep))
    if drop > 0:
        cache.crop(-drop)
