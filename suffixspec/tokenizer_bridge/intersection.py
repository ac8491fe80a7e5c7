"""Token-level intersection of two vocabularies and the mapping of a draft distribution onto it.

Two tokens correspond when they spell the same bytes (so ``Ġfoo``, ``▁foo`` and `` foo`` agree,
and the byte-fallback token ``<0xE4>`` equals the byte-level token ``ä``). Special tokens
correspond by role (EOS to EOS) or by identical text (``<|im_end|>`` in both).

Worked example::

    draft vocab   0:"<s>" 1:"</s>" 2:"▁de" 3:"f" 4:"<0x61>" 5:"a" 6:"▁zz"
    target vocab  0:"<|endoftext|>"(eos) 1:"Ġde" 2:"f" 3:"a"
    pairs (draft -> target): 1->0 (eos), 2->1, 3->2, 4->3, 5->3       6 has no counterpart
    q_draft = [0, .1, .3, .2, .1, .2, .1]
    restricted to the intersection: mass .9, q_target = [.1, .3, .2, .3] / .9

Sampling a target token from ``q_target`` gives a draft with a *known* q over the target
vocabulary, so verification can use ``min(1, p/q)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from suffixspec.tokenizer_bridge.vocab import VocabTable

_ROLES = ("eos_token_id",)  # BOS/PAD/UNK are never drafted, and a BOS may share its id with EOS


@dataclass
class Coverage:
    """How much of each vocabulary the intersection covers."""

    draft_mapped: int  # draft tokens with a target counterpart
    draft_size: int
    target_covered: int  # distinct target tokens reached
    target_size: int

    @property
    def draft_fraction(self) -> float:
        return self.draft_mapped / max(1, self.draft_size)

    @property
    def target_fraction(self) -> float:
        return self.target_covered / max(1, self.target_size)

    def to_dict(self) -> dict[str, float | int]:
        return {"draft_mapped": self.draft_mapped, "draft_size": self.draft_size,
                "target_covered": self.target_covered, "target_size": self.target_size,
                "draft_fraction": round(self.draft_fraction, 4), "target_fraction": round(self.target_fraction, 4)}


class VocabIntersection:
    """Draft id <-> target id correspondence by normalized spelling.

    ``draft_ids[j]`` and ``target_ids[j]`` are one pair; several draft ids may map to one target
    id (``"a"`` and ``<0x61>``). ``to_draft[t]`` is a draft id spelling target token ``t`` (or -1).
    """

    def __init__(self, target: VocabTable, draft: VocabTable, target_size: int | None = None,
                 draft_size: int | None = None) -> None:
        self.target_size = target_size or target.size
        self.draft_size = draft_size or draft.size
        pairs: dict[int, int] = {}
        for d, b in enumerate(draft.token_bytes[: self.draft_size]):
            if b:
                t = target.by_bytes.get(b)
                if t is not None and t < self.target_size:
                    pairs[d] = t
        for d, t in _special_pairs(target.tokenizer, draft.tokenizer):
            if d < self.draft_size and t < self.target_size:
                pairs[d] = t
        self.draft_ids = np.fromiter(pairs.keys(), dtype=np.int64, count=len(pairs))
        self.target_ids = np.fromiter(pairs.values(), dtype=np.int64, count=len(pairs))
        self.to_target = np.full(self.draft_size, -1, dtype=np.int64)
        self.to_target[self.draft_ids] = self.target_ids
        self.to_draft = np.full(self.target_size, -1, dtype=np.int64)
        # reversed so that the lowest draft id wins for a target id spelled by several draft ids
        self.to_draft[self.target_ids[::-1]] = self.draft_ids[::-1]
        self._torch_cache: dict[Any, tuple] = {}

    def coverage(self) -> Coverage:
        return Coverage(len(self.draft_ids), self.draft_size, int(np.unique(self.target_ids).size), self.target_size)

    def map_q(self, q_draft: Any) -> Any:
        """Draft distribution(s) ``[..., draft_vocab]`` -> ``[..., target_vocab]`` on the intersection.

        Mass of draft tokens without a counterpart is dropped and the rest renormalized. Rows with
        no mass on the intersection come back all zero (the caller must not draft from them).
        Accepts numpy arrays or torch tensors (torch is imported only for tensors).
        """
        if isinstance(q_draft, np.ndarray):
            q = q_draft[..., : self.draft_size]
            out = np.zeros(q.shape[:-1] + (self.target_size,), dtype=np.float64)
            np.add.at(out, (..., self.target_ids), q[..., self.draft_ids])
            mass = out.sum(-1, keepdims=True)
            return np.divide(out, mass, out=np.zeros_like(out), where=mass > 0)
        import torch

        key = (q_draft.device,)
        if key not in self._torch_cache:
            self._torch_cache[key] = (torch.as_tensor(self.draft_ids, device=q_draft.device),
                                      torch.as_tensor(self.target_ids, device=q_draft.device))
        d_idx, t_idx = self._torch_cache[key]
        q = q_draft[..., : self.draft_size]
        out = torch.zeros(q.shape[:-1] + (self.target_size,), dtype=q.dtype, device=q.device)
        out.index_add_(out.dim() - 1, t_idx, q.index_select(q.dim() - 1, d_idx))
        mass = out.sum(-1, keepdim=True)
        return torch.where(mass > 0, out / mass.clamp_min(torch.finfo(out.dtype).tiny), torch.zeros_like(out))


def _special_pairs(target_tok: Any, draft_tok: Any) -> list[tuple[int, int]]:
    """(draft id, target id) for special tokens that share a role or their text."""
    out: list[tuple[int, int]] = []
    for role in _ROLES:
        t, d = getattr(target_tok, role, None), getattr(draft_tok, role, None)
        if t is not None and d is not None:
            out.append((int(d), int(t)))
    t_special = {str(v.content): int(k) for k, v in (getattr(target_tok, "added_tokens_decoder", {}) or {}).items()}
    for k, v in (getattr(draft_tok, "added_tokens_decoder", {}) or {}).items():
        if str(v.content) in t_special:
            out.append((int(k), t_special[str(v.content)]))
    return out
