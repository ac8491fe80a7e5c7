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
"""

from __future__ import annotations

import numpy as np
import torch


def tree_inputs(parents: list[int], past: int, dtype: torch.dtype, device: torch.device | str
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(4D additive attention mask [1, 1, n, past + n], position ids [1, n]) for root + draft nodes."""
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
    mask = torch.zeros((1, 1, n, past + n), dtype=dtype, device=device)
    mask.masked_fill_(torch.from_numpy(~full).to(device)[None, None], torch.finfo(dtype).min)
    positions = torch.from_numpy(depth + past).to(device)[None]
    return mask, positions


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
