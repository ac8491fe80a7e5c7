"""Prompt-prefix reuse: the target's keys and values of earlier prompts, kept by blocks of tokens.

Agentic requests repeat a long head (system prompt, tool list, the file under work) and change only
the last lines; a code-edit tool resends the same file. A :class:`PrefixStore` keeps the keys and
values of prompt prefixes in blocks of ``block`` tokens, keyed by the whole token prefix up to the
block's end (a block's keys depend on every token before it), least recently used dropped first
once ``max_bytes`` is reached. A prefill looks up the longest stored run of whole blocks, copies it
into the request's cache and feeds only the rest; then it stores the blocks it computed.

Every request's prefill uses it (``runner.Runner.reuse`` / ``remember``), alone or in a batch, so a
server with ``--max-num-seqs 1`` gains as much from it as a batched one; requests that join a batch
together and share a head are staggered so that the head is computed once
(``scheduler.Scheduler._admit``).

Worked example (``block = 4``): a prompt ``a b c d e f g h i j`` stores blocks ``abcd`` and
``abcdefgh``; a later prompt ``a b c d e f g h x y`` copies 8 positions and feeds ``x y``; a prompt
``a b c d e f z`` copies 4 and feeds ``e f z``.

A reused position's keys are the ones the earlier prefill computed for the same tokens at the same
positions; the prefill of the rest attends to them exactly as to keys it computed itself, so the
logits are the prompt's own up to float rounding (the tests check outputs token for token).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share: ``common_prefix([1, 2, 3], [1, 2, 5]) == 2``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixStore:
    """Keys/values of prompt prefixes by blocks of ``block`` tokens (thread-safe).

    A stored block is a pair of per-layer tensors ``[kv_heads, block, head_dim]``."""

    def __init__(self, block: int = 16, max_bytes: int = 256 << 20) -> None:
        if block < 1 or max_bytes < 0:
            raise ValueError(f"need block >= 1 and max_bytes >= 0, got {block}, {max_bytes}")
        self.block = block  # tokens per block
        self.max_bytes = max_bytes  # the store's budget; least recently used blocks go first
        self.bytes = 0  # bytes held now
        self.hits = 0  # positions copied instead of computed, since start
        self._blocks: OrderedDict[tuple[int, ...], tuple[list[torch.Tensor], list[torch.Tensor]]] = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, ids: Sequence[int]) -> tuple[int, list[tuple[list[torch.Tensor], list[torch.Tensor]]]]:
        """(positions found, their blocks in order) for the longest stored run of whole blocks of ``ids``."""
        found = []
        with self._lock:
            for end in range(self.block, len(ids) + 1, self.block):
                entry = self._blocks.get(tuple(ids[:end]))
                if entry is None:
                    break
                self._blocks.move_to_end(tuple(ids[:end]))
                found.append(entry)
            self.hits += len(found) * self.block
        return len(found) * self.block, found

    def covered(self, ids: Sequence[int]) -> int:
        """Positions of ``ids`` a :meth:`lookup` would find now (no use recorded, nothing counted)."""
        with self._lock:
            n = 0
            for end in range(self.block, len(ids) + 1, self.block):
                if tuple(ids[:end]) not in self._blocks:
                    break
                n = end
            return n

    def wanted(self, ids: Sequence[int], start: int) -> list[int]:
        """Ends of the whole blocks of ``ids`` at or after position ``start`` that the store lacks."""
        with self._lock:
            return [end for end in range(self.block, len(ids) + 1, self.block)
                    if end - self.block >= start and tuple(ids[:end]) not in self._blocks]

    def put(self, ids: Sequence[int], end: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Store the block of ``ids`` ending at ``end``: per-layer ``[kv_heads, block, head_dim]`` (copied)."""
        if self.max_bytes == 0:
            return
        keys = [k.clone() for k in keys]
        values = [v.clone() for v in values]
        size = sum(t.numel() * t.element_size() for t in (*keys, *values))
        key = tuple(ids[:end])
        with self._lock:
            if key in self._blocks:
                return
            self._blocks[key] = (keys, values)
            self.bytes += size
            while self.bytes > self.max_bytes and self._blocks:
                _, (k_old, v_old) = self._blocks.popitem(last=False)
                self.bytes -= sum(t.numel() * t.element_size() for t in (*k_old, *v_old))

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._blocks)
