"""An incremental suffix index: O(1) appends, lookups by hash chains (as LZ77 compressors do).

For sources that grow one token at a time (a request's prompt + output) or that are rebuilt often
(the output history), a suffix array would have to be rebuilt on every append. Here each appended
token costs a few dictionary and array operations:

- ``buf``: the tokens, big-endian uint32 bytes;
- ``prev3[p]``: the previous position whose last three tokens hash to the same bucket as those ending
  at ``p``; ``head3[bucket]`` the most recent such position (a chain per bucket, newest first);
- ``prev1`` / ``head1``: the same per single token, for matches shorter than three tokens.

The bucket tables are plain int32 arrays with as many buckets as tokens (doubled, and the chains
relinked in one vectorised pass, when the index outgrows them); positions of other keys sharing a
bucket are rejected by the suffix comparison.

A lookup walks the chain of the context's last trigram (newest first, at most ``max_candidates``
positions), measures each candidate's common suffix with the context in one big-integer XOR, keeps
the longest, and the continuations of its occurrences form the children of the match node.
Counts are therefore those of the ``max_candidates`` most recent occurrences: a recency window.

Worked example: after ``extend([1, 2, 3, 9, 1, 2, 3, 7, 1, 2])`` the context ``[5, 1, 2]`` has
no trigram match; the unigram chain of ``2`` gives ends 2 and 6 (the live end 10 is skipped),
both with a common suffix ``1 2`` (``5 1 2`` does not occur): ``match_len = 2``, count 2, and one
child ``3`` (count 2) whose child is ``9`` or ``7`` (count 1 each).

Memory: 12 bytes per token (tokens, two link arrays) plus the two bucket tables, 8 to 16 bytes per
token: 20 to 28 bytes per token.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

import numpy as np

from .speculate import SpecParams, SpecResult, speculate_from, speculate_lengths
from .suffix_array_build import SEP, pack_be

_M = (1 << 21) - 1  # tokens are folded to 21 bits in the trigram key; collisions are verified away
_SEP_K2 = (_M << 21) | _M
_K2_MASK = (1 << 42) - 1
_M64 = (1 << 64) - 1
_GOLD = 0x9E3779B97F4A7C15  # Fibonacci hashing: bucket = (key * _GOLD mod 2**64) >> (64 - bits)
_MIN_BITS = 10
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
        self._set_table_bits(_MIN_BITS)
        self._k2 = _SEP_K2  # folded last two tokens
        self._n = 0
        self._num_seps = 0

    def _set_table_bits(self, bits: int) -> None:
        self._bits = bits
        self._shift = 64 - bits
        self._head1 = array("i", [-1]) * (1 << bits)
        self._head3 = array("i", [-1]) * (1 << bits)

    # ----- appends -------------------------------------------------------------------------------
    def append(self, tok: int) -> None:
        """Append one token (amortised O(1))."""
        p = self._n
        self._buf += tok.to_bytes(4, "big")
        shift = self._shift
        h = ((tok * _GOLD) & _M64) >> shift
        head = self._head1
        self._prev1.append(head[h])
        head[h] = p
        k3 = (self._k2 << 21) | (tok & _M)
        h = ((k3 * _GOLD) & _M64) >> shift
        head = self._head3
        self._prev3.append(head[h])
        head[h] = p
        self._k2 = k3 & _K2_MASK
        self._n = p + 1
        if p >= (1 << self._bits):  # load factor above 1: double the tables and relink
            self._rebuild(self._bits + 1)

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append a run of tokens (vectorised for long runs)."""
        if len(tokens) < 64:  # the per-step case (accepted draft + bonus token): append() inlined
            run = [int(t) for t in tokens]
            try:
                packed = pack_be(run)
            except struct.error:
                raise ValueError("token ids must be in [0, 2**32 - 1)") from None
            if SEP in run:  # packs fine but is the separator: a match would stop there, counts go wrong
                raise ValueError("token ids must be in [0, 2**32 - 1)")
            self._buf += packed
            prev1, prev3, head1, head3 = self._prev1, self._prev3, self._head1, self._head3
            shift, k2, p = self._shift, self._k2, self._n
            for tok in run:
                h = ((tok * _GOLD) & _M64) >> shift
                prev1.append(head1[h])
                head1[h] = p
                k3 = (k2 << 21) | (tok & _M)
                h = ((k3 * _GOLD) & _M64) >> shift
                prev3.append(head3[h])
                head3[h] = p
                k2 = k3 & _K2_MASK
                p += 1
            self._k2, self._n = k2, p
            if p > (1 << self._bits):
                bits = self._bits
                while (1 << bits) < p:
                    bits += 1
                self._rebuild(bits)
        else:
            toks = np.asarray(tokens, dtype=np.int64)
            if toks.min() < 0 or toks.max() >= SEP:
                raise ValueError("token ids must be in [0, 2**32 - 1)")
            self._buf += toks.astype(">u4").tobytes()
            self._n += len(toks)
            bits = self._bits
            while (1 << bits) < self._n:
                bits += 1
            self._rebuild(bits, start=self._n - len(toks) if bits == self._bits else 0)

    def end_sequence(self) -> None:
        """Close the current sequence: later matches do not run across this boundary."""
        self._buf += b"\xff\xff\xff\xff"
        self._prev1.append(-1)
        self._prev3.append(-1)
        self._k2 = ((self._k2 & _M) << 21) | _M  # the separator folds to _M, as in _rebuild()
        self._n += 1
        self._num_seps += 1
        if self._n > (1 << self._bits):
            self._rebuild(self._bits + 1)

    def add_sequence(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append a whole sequence followed by a separator."""
        self.extend(tokens)
        self.end_sequence()

    @classmethod
    def from_sequences(cls, seqs: Sequence[Sequence[int] | np.ndarray], max_candidates: int = 128) -> IncrementalIndex:
        """Build in one vectorised pass."""
        idx = cls(max_candidates)
        parts = []
        for s in seqs:
            arr = np.asarray(s, dtype=np.int64)
            if len(arr) and (arr.min() < 0 or arr.max() >= SEP):
                raise ValueError("token ids must be in [0, 2**32 - 1)")
            parts.append(arr)
            parts.append(np.array([SEP], dtype=np.int64))
        if not parts:
            return idx
        toks = np.concatenate(parts)
        idx._buf = bytearray(toks.astype(">u4").tobytes())
        idx._n = len(toks)
        idx._num_seps = len(seqs)
        bits = _MIN_BITS
        while (1 << bits) < idx._n:
            bits += 1
        idx._rebuild(bits)
        return idx

    def _rebuild(self, bits: int, start: int = 0) -> None:
        """(Re)link positions ``start..n-1`` into hash chains of a ``2**bits`` table, vectorised.

        ``start == 0`` rebuilds everything (new table size); otherwise the new positions are chained
        behind the current heads.
        """
        n = self._n
        toks = np.frombuffer(self._buf, dtype=">u4").astype(np.uint64)
        if start == 0:
            self._set_table_bits(bits)
            self._prev1 = array("i")
            self._prev3 = array("i")
        else:
            del self._prev1[start:]
            del self._prev3[start:]
        folded = toks & np.uint64(_M)  # SEP folds to _M, as in append()
        lo = max(0, start - 2)
        f = folded[lo:n]
        pad = np.full(2 - (start - lo), _M, dtype=np.uint64)
        f = np.concatenate([pad, f])
        k3 = (f[:-2] << np.uint64(42)) | (f[1:-1] << np.uint64(21)) | f[2:]
        keys1, keys3 = toks[start:n], k3
        is_sep = keys1 == np.uint64(SEP)
        pos = np.arange(start, n, dtype=np.int64)
        shift = np.uint64(self._shift)
        for keys, prev, head in ((keys1, self._prev1, self._head1), (keys3, self._prev3, self._head3)):
            h = ((keys * np.uint64(_GOLD)) >> shift).astype(np.int64)  # uint64 multiply wraps mod 2**64
            h[is_sep] = -1
            order = np.argsort(h, kind="stable")
            sh = h[order]
            same = np.zeros(len(h), dtype=bool)
            same[1:] = sh[1:] == sh[:-1]
            links = np.full(len(h), -1, dtype=np.int64)
            links[order[1:][same[1:]]] = pos[order[:-1][same[1:]]]
            first = ~same & (sh >= 0)
            heads = np.frombuffer(head, dtype=np.int32)
            links[order[first]] = heads[sh[first]]  # chain behind the existing head of the bucket
            links[is_sep] = -1
            is_last = np.ones(len(h), dtype=bool)
            is_last[:-1] = ~same[1:]
            is_last &= sh >= 0
            heads[sh[is_last]] = pos[order[is_last]].astype(np.int32)
            prev.frombytes(links.astype(np.int32).tobytes())
        tail = folded[max(0, n - 2):n].tolist()
        tail = [_M] * (2 - len(tail)) + tail
        self._k2 = (int(tail[0]) << 21) | int(tail[1])

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
        """Memory of the arrays: tokens, two link arrays, two bucket tables."""
        return len(self._buf) + 4 * (len(self._prev1) + len(self._prev3) + len(self._head1) + len(self._head3))

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
        shift = self._shift
        if m >= 3:
            t1, t2, t3 = tail[-3], tail[-2], tail[-1]
            k3 = ((t1 & _M) << 42) | ((t2 & _M) << 21) | (t3 & _M)
            best, ends = self._walk(self._head3[((k3 * _GOLD) & _M64) >> shift], self._prev3, a, m)
        if best < 3:
            best, ends = self._walk(self._head1[((tail[-1] * _GOLD) & _M64) >> shift], self._prev1, a, m)
        return best, ends

    def match_lengths(self, context: Sequence[int], max_depth: int = 64) -> list[tuple[int, int]]:
        """Every examined occurrence as ``(common suffix length with context, continuation position)``.

        The candidates of :meth:`match` (the chain of the context's last trigram, or of its last
        token when no trigram matches), not only the longest: an occurrence whose match is shorter
        may continue further (the longest often runs into the live end of a looping output).
        """
        m = min(max_depth, len(context))
        if m <= 0 or self._n == 0:
            return []
        tail = context[-m:]
        try:
            a = int.from_bytes(pack_be(tail), "big")
        except struct.error:
            return []
        found: list[tuple[int, int]] = []
        shift = self._shift
        if m >= 3:
            t1, t2, t3 = tail[-3], tail[-2], tail[-1]
            k3 = ((t1 & _M) << 42) | ((t2 & _M) << 21) | (t3 & _M)
            self._walk(self._head3[((k3 * _GOLD) & _M64) >> shift], self._prev3, a, m, found)
        if not any(ml >= 3 for ml, _ in found):
            found = []
            self._walk(self._head1[((tail[-1] * _GOLD) & _M64) >> shift], self._prev1, a, m, found)
        return found

    def _walk(self, q: int, prev: array, a: int, m: int, found: list[tuple[int, int]] | None = None
              ) -> tuple[int, list[int]]:
        """Longest match along one chain; with ``found``, also every candidate's ``(length, end)``."""
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
                if found is not None and ml > 0:
                    found.append((ml, end))
            q = prev[q]
        return best, ends

    def speculate_at(self, positions: Sequence[int], params: SpecParams, evidence: int) -> SpecResult:
        """Draft from the text that follows ``positions`` (their continuations counted as for a match),
        as if ``evidence`` context tokens had matched there (``params.limit(evidence)`` caps its size).

        Example: after ``add_sequence([4, 5, 6]); add_sequence([4, 5, 7])``, positions ``[0, 4]`` (the
        starts of both sequences) give the chain ``4 5`` (probability 1) and then ``6`` or ``7`` (1/2 each).
        """
        live = [p for p in positions if 0 <= p < self._n]
        if not live:
            return SpecResult()
        return speculate_from(_DynNode(self, live), evidence, params)

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

    def speculate(self, context: Sequence[int], params: SpecParams, max_depth: int = 64, lengths: int = 0
                  ) -> SpecResult:
        """Draft continuing ``context`` from its longest match (see :mod:`index.speculate`); with
        ``lengths > 0``, also from up to that many shorter match lengths, keeping the best-scoring draft
        (:func:`~index.speculate.speculate_lengths`)."""
        if lengths > 0:
            return speculate_lengths(self.match_lengths(context, max_depth), lambda ends: _DynNode(self, ends),
                                     params, self._n, tries=lengths)
        L, ends = self.match(context, max_depth)
        if L == 0:
            return SpecResult()
        return speculate_from(_DynNode(self, ends), L, params)
