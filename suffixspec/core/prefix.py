"""Prompt-prefix reuse: the target's keys and values of earlier prompts, kept by blocks of tokens.

Agentic requests repeat a long head (system prompt, tool list, the file under work) and change only
the last lines; a code-edit tool resends the same file. A :class:`PrefixStore` keeps the keys and
values of prompt prefixes in blocks of ``block`` tokens. A prefill looks up the longest stored run of
whole blocks, copies it into the request's cache and feeds only the rest; then it stores the blocks it
computed.

Every request's prefill uses it (``runner.Runner.reuse`` / ``remember``), alone or in a batch, so a
server with ``--max-num-seqs 1`` gains as much from it as a batched one; requests that join a batch
together and share a head are staggered so that the head is computed once
(``scheduler.Scheduler._admit``).

**Keys: chained block hashes** (as vLLM keys its KV blocks). A block's keys depend on every token before
it, so its key must name the whole prefix, in constant size: ``key = block_key(parent's key, the block's
own tokens)``. A lookup hashes each block once (an 8k-token prompt: 512 hashes of 16 tokens, never the
2.1M token references that whole-prefix tuples hold). A block also keeps its own tokens and its parent's
key, compared on every lookup: a hash collision is a miss, never another prompt's keys. A block is
stored only under a stored parent and leaves only without children (below), so a parent key always
names the block its children were computed after.

**Memory**: ``max_bytes`` counts each block's tensors and its key (the tokens, the node, the hash).

**Eviction from a chain's tail.** Only a block without stored children (a leaf) is evicted, the least
recently used first; a lookup or a store marks every block of its chain used at once, so a chain's head
is never older than its tail and a chain shrinks from its end. One block over budget costs a chain its
last block, never its head (which would leave the rest stored but unreachable).

Worked example (``block = 4``): a prompt ``a b c d e f g h i j`` stores blocks ``abcd`` (key
``K1 = block_key(None, abcd)``) and ``efgh`` (``K2 = block_key(K1, efgh)``); a later prompt ``a b c d e f
g h x y`` copies 8 positions and feeds ``x y``; a prompt ``a b c d e f z`` copies 4 and feeds ``e f z``.
With room for two blocks, storing ``p q r s`` evicts ``efgh`` (the leaf), not ``abcd``.

A reused position's keys are the ones the earlier prefill computed for the same tokens at the same
positions; the prefill of the rest attends to them exactly as to keys it computed itself, so the
logits are the prompt's own up to float rounding (the tests check outputs token for token).

Cost of the keys, an 8192-token prompt (512 blocks of 16), tiny tensors so only the keys count, the store
before and after in one process (load average 10 on 2 cores): on an empty store, ``covered`` + ``lookup``
0.45 ms (the whole-prefix-tuple store: ``covered`` + ``wanted`` + ``lookup`` 57 ms; 142 ms at a lower load
in the review); with all 512 blocks stored, ``lookup`` 0.59 ms (194 ms), ``covered`` 0.54 ms (104 ms).
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

# a block's per-layer keys and values: one [layers, kv_heads, block, head_dim] tensor each when every layer
# has the same shape (iterating it gives the layers), else a list of per-layer [kv_heads, block, head_dim]
Tensors = torch.Tensor | list[torch.Tensor]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share: ``common_prefix([1, 2, 3], [1, 2, 5]) == 2``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def block_key(parent: int | None, tokens: bytes) -> int:
    """A block's key: its parent's key (None for a prompt's first block) chained with its own tokens."""
    return hash((parent, tokens))


@dataclass(slots=True, eq=False)
class _Block:
    """One stored block."""

    key: int  # its key: block_key(parent, tokens)
    parent: int | None  # the key of the block before it (None: a prompt's first block)
    tokens: bytes  # its own tokens (int64), compared on lookup so a hash collision is a miss
    keys: Tensors  # per-layer keys of its positions
    values: Tensors  # per-layer values
    size: int  # bytes counted against max_bytes: its tensors and its key
    used: int  # tick of its last lookup or store (a block's is never older than its children's)
    children: int = 0  # stored blocks whose parent it is: evicted only at 0 (a chain's tail first)


_KEY_BYTES = (sys.getsizeof(_Block(0, None, b"", [], [], 0, 0)) + sys.getsizeof(2**62)  # the node, its hash
              + 3 * 8 * 2)  # its dict slot (hash, key, value; a dict keeps a third of its slots free)


class PrefixStore:
    """Keys/values of prompt prefixes by blocks of ``block`` tokens (thread-safe; module docstring)."""

    def __init__(self, block: int = 16, max_bytes: int = 256 << 20) -> None:
        if block < 1 or max_bytes < 0:
            raise ValueError(f"need block >= 1 and max_bytes >= 0, got {block}, {max_bytes}")
        self.block = block  # tokens per block
        self.max_bytes = max_bytes  # the store's budget, keys included; least recently used tails go first
        self.bytes = 0  # bytes held now
        self.hits = 0  # positions copied instead of computed, since start
        self._blocks: dict[int, _Block] = {}
        self._leaves: list[tuple[int, int, int]] = []  # heap of (used, order, key) of leaves; stale ones skipped
        self._ticks = itertools.count(1)  # the clock of ``used``
        self._order = itertools.count()  # ties in the heap: the leaf pushed first leaves first
        self._lock = threading.Lock()

    # -- reading -----------------------------------------------------------------------------------------
    def lookup(self, ids: Sequence[int]) -> tuple[int, list[tuple[Tensors, Tensors]]]:
        """(positions found, their blocks' (keys, values) in order) for the longest stored run of whole
        blocks of ``ids``; the run counts as used."""
        with self._lock:
            found = self._run(ids)
            self._touch(found)
            self.hits += len(found) * self.block
        return len(found) * self.block, [(b.keys, b.values) for b in found]

    def covered(self, ids: Sequence[int]) -> int:
        """Positions of ``ids`` a :meth:`lookup` would find now (no use recorded, nothing counted)."""
        with self._lock:
            return len(self._run(ids)) * self.block

    def _run(self, ids: Sequence[int]) -> list[_Block]:
        """The stored blocks of ``ids``'s longest stored run of whole blocks, head first."""
        out = []
        for key, parent, tokens in self._chain(ids):
            b = self._blocks.get(key)
            if b is None or b.parent != parent or b.tokens != tokens:
                break
            out.append(b)
        return out

    def _chain(self, ids: Sequence[int]) -> Iterator[tuple[int, int | None, bytes]]:
        """(key, parent key, tokens) of each whole block of ``ids``, head first, each hashed when reached."""
        step = 8 * self.block
        raw = array("q", ids[: len(ids) - len(ids) % self.block]).tobytes()
        parent = None
        for at in range(0, len(raw), step):
            tokens = raw[at : at + step]
            key = block_key(parent, tokens)
            yield key, parent, tokens
            parent = key

    # -- storing -----------------------------------------------------------------------------------------
    def fill(self, ids: Sequence[int], block_of: Callable[[int, int], tuple[Tensors, Tensors]]) -> int:
        """Store the whole blocks of ``ids`` the store lacks, head first; ``block_of(start, end)`` gives the
        per-layer keys and values of positions ``start .. end - 1`` (copied here). Stops at a block that does
        not fit (the head that fits stays). Returns the blocks stored."""
        if self.max_bytes == 0:
            return 0
        stored = 0
        with self._lock:
            tick = next(self._ticks)
            chain: list[_Block] = []
            for i, (key, parent, tokens) in enumerate(self._chain(ids)):
                b = self._blocks.get(key)
                if b is None:
                    b = self._add(key, parent, tokens, *block_of(i * self.block, (i + 1) * self.block), tick)
                    self._evict()  # older tails first; the chain's own blocks are parents now, but its new tail
                    if key not in self._blocks:  # it did not fit, even with every older tail gone
                        break
                    stored += 1
                elif b.parent != parent or b.tokens != tokens:  # another chain's block under a colliding key
                    break
                b.used = tick
                chain.append(b)
            self._touch(chain, tick)
        return stored

    def _add(self, key: int, parent: int | None, tokens: bytes, keys: Tensors, values: Tensors, tick: int) -> _Block:
        keys, values = _copied(keys), _copied(values)
        size = _nbytes(keys) + _nbytes(values) + sys.getsizeof(tokens) + _KEY_BYTES
        b = _Block(key, parent, tokens, keys, values, size, tick)
        self._blocks[key] = b
        self.bytes += size
        if parent is not None:
            self._blocks[parent].children += 1
        heapq.heappush(self._leaves, (tick, next(self._order), key))
        return b

    def _touch(self, chain: list[_Block], tick: int | None = None) -> None:
        """Mark a chain's blocks used now (all at once: its head never older than its tail)."""
        if not chain:
            return
        tick = tick or next(self._ticks)
        for b in chain:
            b.used = tick
        tail = chain[-1]
        if tail.children == 0:
            heapq.heappush(self._leaves, (tick, next(self._order), tail.key))

    def _evict(self) -> None:
        """Drop least recently used leaves until the store fits its budget."""
        while self.bytes > self.max_bytes and self._leaves:
            used, _, key = heapq.heappop(self._leaves)
            b = self._blocks.get(key)
            if b is None or b.children or b.used != used:  # a stale entry: gone, a parent now, or used since
                continue
            del self._blocks[key]
            self.bytes -= b.size
            if b.parent is not None:
                parent = self._blocks[b.parent]
                parent.children -= 1
                if parent.children == 0:  # the chain's new tail
                    heapq.heappush(self._leaves, (parent.used, next(self._order), b.parent))
        if len(self._leaves) > 2 * len(self._blocks) + 64:  # stale entries pile up under lookups: rebuild
            self._leaves = [(b.used, next(self._order), k) for k, b in self._blocks.items() if not b.children]
            heapq.heapify(self._leaves)

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._leaves.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._blocks)


def _copied(tensors: Tensors) -> Tensors:
    """A block's per-layer views as one stacked copy when the layers' shapes agree, else per-layer copies."""
    if isinstance(tensors, torch.Tensor):
        return tensors.clone()
    if len({tuple(t.shape) for t in tensors}) == 1:
        return torch.stack(tensors)
    return [t.clone() for t in tensors]


def _nbytes(tensors: Tensors) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(t.numel() * t.element_size() for t in tensors)
