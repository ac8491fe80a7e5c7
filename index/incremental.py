"""An incremental suffix index: O(1) appends, lookups by hash chains (as LZ77 compressors do).

For sources that grow one token at a time (a request's prompt + output) or that are rebuilt often
(the output history), a suffix array would have to be rebuilt on every append. Here each appended
token costs a few dictionary and array operations:

- ``buf``: the tokens, big-endian uint32 bytes;
- ``prev3[p]``: the previous position whose last three tokens hash like those ending at ``p``;
  ``last3[key]`` the most recent such position (a chain per trigram, newest first);
- ``prev1`` / ``last1``: the same per single token, for matches shorter than three tokens.

A lookup walks the chain of the context's last trigram (newest first, at most ``max_candidates``
positions), measures each candidate's common suffix with the context in one big-integer XOR, keeps
the longest, and the continuations of its occurrences form the children of the match node.
Counts are therefore those of the ``max_candidates`` most recent occurrences: a recency window.

Worked example: after ``extend([1, 2, 3, 9, 1, 2, 3, 7, 1, 2])`` the context ``[5, 1, 2]`` has
no trigram match; the unigram chain of ``2`` gives ends 2 and 6 (the live end 10 is skipped),
both with a common suffix ``1 2`` (``5 1 2`` does not occur): ``match_len = 2``, count 2, and one
child ``3`` (count 2) whose child is ``9`` or ``7`` (count 1 each).

Memory: 12 bytes per token plus one dict entry per distinct token and trigram.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

import numpy as np

from .speculate import SpecParams, SpecResult, speculate_from
from .suffix_array import SEP, pack_be

_M = (1 << 21) - 1  # tokens are folded to 21 bits in the trigram key; collisions are verified away
_SEP_K2 = (_M << 21) | _M
_unpack_tok = struct.Struct(">I").unpack_from


class _DynNode:
    """A node below the match: the positions where each occurrence continues."""

    __slots__ = ("owner", "positions", "count")

    def __init__(self, owner: IncrementalIndex, positions: list[int]) -> None:
        self.owner = owner
        self.positions = positions
        self.count = len(positions)

    def children(self, min_count: int) -> list[tuple[int, int, _DynNode]]:
        owner = self.owner
        n, buf = owner._n, owner._buf
        if self.count == 1:  # single occurrence: one child or none
            p = self.positions[0]
            if p >= n:
                return []
            tok = _unpack_tok(buf, 4 * p)[0]
            return [] if tok == SEP else [(tok, 1, _DynNode(owner, [p + 1]))]
        groups: dict[int, list[int]] = {}
        for p in self.positions:
            if p < n:
                tok = _unpack_tok(buf, 4 * p)[0]
                if tok != SEP:
                    g = groups.get(tok)
                    if g is None:
                        groups[tok] = [p + 1]
                    else:
                        g.append(p + 1)
        return [(t, len(g), _DynNode(owner, g)) for t, g in groups.items() if len(g) >= min_count]

    def chain(self, max_len: int) -> tuple[list[int], _DynNode]:
        """The run every occurrence continues with: common prefix of the continuation windows."""
        owner = self.owner
        n, buf = owner._n, owner._buf
        p0 = self.positions[0]
        k = min(max_len, n - p0)
        if k <= 0:
            return [], self
        first = buf[4 * p0:4 * (p0 + k)]
        for p in self.positions[1:]:
            k = min(k, n - p)
            if k <= 0:
                return [], self
            other = buf[4 * p:4 * (p + k)]
            first = first[:4 * k]
            x = int.from_bytes(first, "big") ^ int.from_bytes(other, "big")
            if x:
                k = (4 * k * 8 - x.bit_length()) >> 5
                if k == 0:
                    return [], self
        run = list(struct.unpack(f">{k}I", first[:4 * k]))
        if SEP in run:
            run = run[:run.index(SEP)]
        if not run:
            return [], self
        step = len(run)
        return run, _DynNode(owner, [p + step for p in self.positions])


class IncrementalIndex:
    """Append-only suffix index over one or more token sequences (see the module docstring)."""

    def __init__(self, max_candidates: int = 128) -> None:
        self.max_candidates = max_candidates  # occurrences examined per lookup (newest first)
        self.clear()

    def clear(self) -> None:
        self._buf = bytearray()
        self._prev1 = array("i")
        self._prev3 = array("i")
        self._last1: dict[int, int] = {}
        self._last3: dict[int, int] = {}
        self._k2 = _SEP_K2  # folded last two tokens
        self._n = 0
        self._num_seps = 0

    # ----- appends -------------------------------------------------------------------------------
    def append(self, tok: int) -> None:
        """Append one token (amortised O(1))."""
        p = self._n
        self._buf += tok.to_bytes(4, "big")
        last1 = self._last1
        self._prev1.append(last1.get(tok, -1))
        last1[tok] = p
        k3 = (self._k2 << 21) | (tok & _M)
        last3 = self._last3
        self._prev3.append(last3.get(k3, -1))
        last3[k3] = p
        self._k2 = ((self._k2 & _M) << 21) | (tok & _M)
        self._n = p + 1

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append a run of tokens (vectorised for long runs)."""
        if len(tokens) < 64:
            for t in tokens:
                self.append(int(t))
        else:
            self._extend_np(np.asarray(tokens, dtype=np.int64))

    def end_sequence(self) -> None:
        """Close the current sequence: later matches do not run across this boundary."""
        self._buf += b"\xff\xff\xff\xff"
        self._prev1.append(-1)
        self._prev3.append(-1)
        self._k2 = _SEP_K2
        self._n += 1
        self._num_seps += 1

    def add_sequence(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append a whole sequence followed by a separator."""
        self.extend(tokens)
        self.end_sequence()

    @classmethod
    def from_sequences(cls, seqs: Sequence[Sequence[int] | np.ndarray], max_candidates: int = 128) -> IncrementalIndex:
        idx = cls(max_candidates)
        for s in seqs:
            idx.add_sequence(s)
        return idx

    def _extend_np(self, toks: np.ndarray) -> None:
        if len(toks) == 0:
            return
        if toks.min() < 0 or toks.max() >= SEP:
            raise ValueError("token ids must be in [0, 2**32 - 1)")
        n0, m = self._n, len(toks)
        pos = np.arange(n0, n0 + m, dtype=np.int64)
        folded = toks & _M
        prev_two = np.empty(m + 2, dtype=np.int64)
        prev_two[0], prev_two[1] = (self._k2 >> 21) & _M, self._k2 & _M
        prev_two[2:] = folded
        k3 = (prev_two[:-2] << 42) | (prev_two[1:-1] << 21) | prev_two[2:]
        for keys, prev, last in ((toks, self._prev1, self._last1), (k3, self._prev3, self._last3)):
            order = np.argsort(keys, kind="stable")
            sk = keys[order]
            same = np.zeros(m, dtype=bool)
            same[1:] = sk[1:] == sk[:-1]
            links = np.full(m, -1, dtype=np.int64)
            links[order[1:][same[1:]]] = pos[order[:-1][same[1:]]]
            first = ~same
            is_last = np.ones(m, dtype=bool)
            is_last[:-1] = ~same[1:]
            for k, o in zip(sk[first].tolist(), order[first].tolist(), strict=True):  # chain to earlier runs
                links[o] = last.get(k, -1)
            last.update(zip(sk[is_last].tolist(), pos[order[is_last]].tolist(), strict=True))
            prev.frombytes(links.astype(np.int32).tobytes())
        self._buf += toks.astype(">u4").tobytes()
        self._k2 = (int(folded[-2]) << 21 | int(folded[-1])) if m >= 2 else ((self._k2 & _M) << 21) | int(folded[-1])
        self._n += m

    # ----- facts ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def num_tokens(self) -> int:
        """Tokens held, separators excluded."""
        return self._n - self._num_seps

    def tokens(self, start: int = 0, stop: int | None = None) -> list[int]:
        """Tokens (separators included as SEP) in ``[start, stop)``."""
        stop = self._n if stop is None else stop
        return list(struct.unpack(f">{stop - start}I", self._buf[4 * start:4 * stop]))

    def nbytes(self) -> int:
        """Approximate memory: arrays plus dict entries (about 100 bytes each)."""
        arrays = len(self._buf) + 4 * (len(self._prev1) + len(self._prev3))
        return arrays + 100 * (len(self._last1) + len(self._last3))

    # ----- lookup --------------------------------------------------------------------------------
    def match(self, context: Sequence[int], max_depth: int = 64) -> tuple[int, list[int]]:
        """Longest suffix of ``context`` found here: (match_len, continuation positions, newest first)."""
        m = min(max_depth, len(context))
        if m <= 0 or self._n == 0:
            return 0, []
        tail = context[-m:]
        try:
            a = int.from_bytes(pack_be(tail), "big")
        except struct.error:
            return 0, []
        best, ends = 0, []
        if m >= 3:
            t1, t2, t3 = tail[-3], tail[-2], tail[-1]
            k3 = ((t1 & _M) << 42) | ((t2 & _M) << 21) | (t3 & _M)
            best, ends = self._walk(self._last3.get(k3, -1), self._prev3, a, m)
        if best < 3:
            best, ends = self._walk(self._last1.get(tail[-1], -1), self._prev1, a, m)
        return best, ends

    def _walk(self, q: int, prev: array, a: int, m: int) -> tuple[int, list[int]]:
        buf, n = self._buf, self._n
        best, ends = 0, []
        seen = 0
        while q >= 0 and seen < self.max_candidates:
            end = q + 1
            if end < n:  # the live end of the buffer has no continuation: skip it
                seen += 1
                start = end - m if end >= m else 0
                mb = end - start
                x = int.from_bytes(buf[4 * start:4 * end], "big") ^ (a if mb == m else a & ((1 << (32 * mb)) - 1))
                if x == 0:
                    ml = mb
                else:
                    ml = ((x & -x).bit_length() - 1) >> 5
                if ml > best:
                    best, ends = ml, [end]
                elif ml == best and ml > 0:
                    ends.append(end)
            q = prev[q]
        return best, ends

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` among the examined (newest) candidates."""
        L, ends = self.match(pattern, max_depth=len(pattern))
        return len(ends) if L == len(pattern) else 0

    def continuations(self, context: Sequence[int], max_depth: int = 64) -> list[tuple[int, int]]:
        """Next tokens after the longest matched suffix, as ``(token, count)`` ranked by count."""
        L, ends = self.match(context, max_depth)
        if L == 0:
            return []
        kids = _DynNode(self, ends).children(1)
        return sorted(((t, c) for t, c, _ in kids), key=lambda tc: (-tc[1], tc[0]))

    def speculate(self, context: Sequence[int], params: SpecParams, max_depth: int = 64) -> SpecResult:
        """Draft continuing ``context`` from its longest match (see :mod:`index.speculate`)."""
        L, ends = self.match(context, max_depth)
        if L == 0:
            return SpecResult()
        return speculate_from(_DynNode(self, ends), L, params)
