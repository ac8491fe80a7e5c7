"""The sorted suffixes of a suffix array, and the search for the longest suffix of a context among them.

:class:`SortedSuffixes` holds a suffix array's token bytes, its ``sa`` (the suffix starts, sorted), the
first-token bucket table and the tombstones; :class:`~.suffix_array.SuffixArray` builds on it with the
implicit suffix tree's nodes, construction and persistence.

Lookups run ``bisect`` over ``sa`` with a key that slices the token bytes, so every comparison is a
C-level ``memcmp``. The suffixes starting with a pattern form one contiguous range of ``sa``
(:meth:`SortedSuffixes._probe`; its end found by :func:`gallop_right`). The longest suffix of a context
that occurs (:meth:`SortedSuffixes.match`) is found by probing lengths, or, from the few occurrences of
a shorter one, by comparing the text before them with the context (:meth:`SortedSuffixes._extend`).

Worked example: sequences ``[5 6 7]`` and ``[5 6 8]`` give the text ``5 6 7 SEP 5 6 8 SEP``. The
context ``... 9 5 6`` matches ``5 6`` (``9 5 6`` does not occur): ``match_len = 2``, and the range
covers the 2 suffixes starting with ``5 6``.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np

from .suffix_array_build import DEFAULT_SORT_DEPTH, SEP, SEP16, first_token_buckets, pack_be, token_counts

_SEP_BYTES = b"\xff\xff\xff\xff"  # the 32-bit separator as bytes (a 16-bit array's: its first two)
_EXTEND_MAX = 32  # a match with at most this many occurrences is extended backwards (see SortedSuffixes._extend)
# without a hint, the first length probed: a suffix this long occurs few times in most corpora, so its
# occurrences give the longest match by backward extension (one probe, whether or not the whole context
# occurs); probing the whole context first costs a binary search over lengths whenever it does not occur
_FIRST_GUESS = 16


class SortedSuffixes:
    """A suffix array's arrays and the longest-match search over them (see the module docstring).

    ``dead``: sorted ``sa`` ranks of suffixes that belong to deleted documents (tombstones); lookups
    count and draft as if those documents were not there.
    """

    def __init__(self, text: np.ndarray, sa: np.ndarray, starts: np.ndarray | None = None,
                 sort_depth: int = DEFAULT_SORT_DEPTH, *, _buf=None, _base: int = 0, _sa_view=None,
                 buckets: np.ndarray | None = None, dead: np.ndarray | None = None) -> None:
        self.text = text  # big-endian uint16 / uint32 tokens with a separator after each sequence
        self.sa = sa  # int32 suffix starts, sorted
        self.starts = starts if starts is not None else np.zeros(0, dtype=np.int64)  # start of each sequence
        self.sort_depth = sort_depth
        self.width = np.asarray(text).dtype.itemsize if len(text) else 4  # bytes per token: 2 or 4
        if self.width not in (2, 4):
            raise ValueError("token arrays are big-endian uint16 or uint32")
        self.sep = SEP16 if self.width == 2 else SEP
        self._sep_bytes = _SEP_BYTES[:self.width]
        self._fmt = ">H" if self.width == 2 else ">I"
        self._shift = 4 if self.width == 2 else 5  # bits per token, log2
        self._buf = _buf if _buf is not None else np.asarray(text, dtype=f">u{self.width}").tobytes()
        self._base = _base  # byte offset of token 0 inside _buf
        self._sa = _sa_view if _sa_view is not None else memoryview(np.ascontiguousarray(sa, dtype=np.int32)).cast("B").cast("i")
        self._n = len(sa)
        self._n_real = self._n - len(self.starts)
        self.dead = np.zeros(0, dtype=np.int32) if dead is None else np.asarray(dead, dtype=np.int32)
        self._dead = memoryview(np.ascontiguousarray(self.dead)).cast("B").cast("i") if len(self.dead) else None
        if buckets is None:
            buckets = first_token_buckets(token_counts(text, self.sep), self.width)
        # every first token inside the table? else ids >= the cap are found by bisect
        self._bucketed = int(buckets[-1]) == self._n_real
        self._buckets = memoryview(np.ascontiguousarray(buckets, dtype=np.int64)).cast("B").cast("q")

    def _live(self, lo: int, hi: int) -> int:
        d = self._dead
        if d is None or hi <= lo:
            return max(0, hi - lo)
        return hi - lo - (bisect_left(d, hi) - bisect_left(d, lo))

    def _first_live(self, lo: int, hi: int) -> int:
        """The first rank in ``[lo, hi)`` that is not a tombstone (``hi`` if none)."""
        d = self._dead
        if d is None:
            return lo
        i = bisect_left(d, lo)
        while i < len(d) and d[i] == lo and lo < hi:
            lo += 1
            i += 1
        return lo

    def _last_live(self, lo: int, hi: int) -> int:
        """The last rank in ``[lo, hi)`` that is not a tombstone (``lo - 1`` if none)."""
        d = self._dead
        p = hi - 1
        if d is None:
            return p
        i = bisect_left(d, hi) - 1
        while i >= 0 and d[i] == p and p >= lo:
            p -= 1
            i -= 1
        return p

    def _bucket(self, tok: int) -> tuple[int, int]:
        b = self._buckets
        if tok + 1 < len(b):
            return b[tok], b[tok + 1]
        if self._bucketed:
            return 0, 0
        pat, buf, base, w = tok.to_bytes(4, "big"), self._buf, self._base, self.width

        def key(i: int) -> bytes:
            return buf[base + w * i:base + w * i + w]

        lo = bisect_left(self._sa, pat, b[len(b) - 1], self._n_real, key=key)
        return lo, bisect_right(self._sa, pat, lo, self._n_real, key=key)

    # ----- facts ---------------------------------------------------------------------------------
    @property
    def num_suffixes(self) -> int:
        """Entries of ``sa``: one per indexed token and one per sequence's separator."""
        return self._n

    @property
    def num_tokens(self) -> int:
        """Indexed tokens, separators excluded (tombstoned ones included)."""
        return self._n - len(self.starts)

    @property
    def num_sequences(self) -> int:
        return len(self.starts)

    def nbytes(self) -> int:
        return int(self.text.nbytes + self.sa.nbytes + self.starts.nbytes + self.dead.nbytes)

    def pack(self, tokens: Sequence[int]) -> bytes | None:
        """``tokens`` as this array's bytes; None if one of them cannot occur here."""
        try:
            pat = pack_be(tokens, self.width)
        except struct.error:
            return None
        if self.width == 2 and SEP16 in tokens:
            return None
        return pat

    # ----- lookup --------------------------------------------------------------------------------
    def _key(self, m: int):
        """Sort key of ``sa`` entries for a pattern of ``m`` bytes: the first ``m`` bytes of the suffix."""
        buf, base, w = self._buf, self._base, self.width

        def key(i: int) -> bytes:
            s = base + w * i
            return buf[s:s + m]

        return key

    def _probe(self, pattern: bytes) -> tuple[int, int, int]:
        """Where the suffixes starting with ``pattern`` (>= 1 token) begin: ``(lo, hi, top)`` with ``lo`` -1
        when no live suffix does. ``hi`` (end of the range) is -1 when it was not needed to know that
        (no tombstones): :meth:`_range_from` finds it from ``lo`` when the caller wants it; ``top`` bounds
        it (the end of the first token's bucket). One bisect, not the two of a full range."""
        w = self.width
        lo, top = self._bucket(int.from_bytes(pattern[:w], "big"))
        if top <= lo:
            return -1, -1, -1
        hi = -1
        if len(pattern) == w:
            hi = top
        else:
            key = self._key(len(pattern))
            lo = bisect_left(self._sa, pattern, lo, top, key=key)
            if lo >= top or key(self._sa[lo]) != pattern:
                return -1, -1, -1
        if self._dead is not None:
            hi = self._range_from(pattern, lo, hi, top)
            if self._live(lo, hi) == 0:
                return -1, -1, -1
        return lo, hi, top

    def _range_from(self, pattern: bytes, lo: int, hi: int, top: int) -> int:
        """End of the range of suffixes starting with ``pattern`` that begins at ``lo`` (``hi`` if known)."""
        if hi >= 0:
            return hi
        return gallop_right(self._sa, pattern, lo + 1, top, self._key(len(pattern)))

    def _range(self, pattern: bytes) -> tuple[int, int]:
        """``sa[lo:hi]`` range of suffixes starting with ``pattern`` (big-endian bytes, >= 1 token); empty
        when every occurrence is a tombstone."""
        lo, hi, top = self._probe(pattern)
        if lo < 0:
            return 0, 0
        return lo, self._range_from(pattern, lo, hi, top)

    def packed_tail(self, context: Sequence[int], max_depth: int = 64) -> tuple[int, bytes | None]:
        """``(k, bytes)``: the last ``k`` tokens of ``context`` that a lookup compares, packed for this
        array (None when one of them cannot occur here); computed once per context by a set of segments."""
        kmax = min(max_depth, len(context), self.sort_depth)
        return kmax, (self.pack(context[-kmax:]) if kmax > 0 else b"")

    def match(self, context: Sequence[int], max_depth: int = 64, hint: int | None = None,
              at_least: int = 0, packed: tuple[int, bytes | None] | None = None) -> tuple[int, int, int]:
        """Longest suffix of ``context`` (at most ``max_depth`` tokens) in the corpus: (match_len, lo, hi).

        ``hint``: a guess of the match length (for example the previous step's match plus the tokens
        appended since), tried first; a right guess costs two probes instead of a binary search. Without
        one, ``_FIRST_GUESS`` tokens are tried first (their few occurrences usually settle it), then all.
        ``at_least``: lengths below it are of no interest (another segment already matched that far):
        ``(0, 0, 0)`` unless a match of at least that length exists here. ``packed``: the result of
        :meth:`packed_tail` for this context and ``max_depth`` (saves packing it again).

        Each probe is one bisect (:meth:`_probe`); the longest probe that hit gives the range's start,
        and its end is found by galloping from there (a match has few occurrences, often one). A match
        found from few occurrences (:meth:`_extend`) costs one probe more for its range; :meth:`~.suffix_array.SuffixArray.node`
        skips it (the node is made of the occurrences).
        """
        L, lo, hi, _ = self._find(context, max_depth, hint, at_least, packed)
        if L and lo < 0:
            pl = self.pack(context[len(context) - L:])
            lo, hi, top = self._probe(pl)
            hi = self._range_from(pl, lo, hi, top)
        return L, lo, hi

    def _find(self, context: Sequence[int], max_depth: int, hint: int | None, at_least: int,
              packed: tuple[int, bytes | None] | None) -> tuple[int, int, int, list[int] | None]:
        """:meth:`match`'s search: ``(L, lo, hi, starts)``; ``starts`` lists the live occurrences (text
        positions) when they are few (then ``lo``/``hi`` may be -1: not searched), else None."""
        kmax, pat = packed if packed is not None else self.packed_tail(context, max_depth)
        if kmax <= 0 or self._n == 0 or at_least > kmax:
            return 0, 0, 0, None
        if pat is None:  # a negative or huge id: no match past it
            tail = context[-kmax:]
            bad_at = max(i for i, t in enumerate(tail) if not 0 <= t < self.sep)
            if bad_at == kmax - 1:
                return 0, 0, 0, None
            return self._find(context[len(context) - kmax + bad_at + 1:], max_depth, hint, at_least, None)
        w = self.width
        good, bad = 0, kmax + 1
        hit = (-1, -1, -1)  # _probe of the longest length found so far
        done: tuple[int, int, int, list[int]] | None = None  # the answer, once a backward extension settled it

        def probe(g: int) -> None:
            nonlocal good, bad, hit, done
            r = self._probe(pat[w * (kmax - g):])
            if r[0] < 0:
                bad = g
                return
            good, hit = g, r
            done = self._extend(pat, kmax, g, r)

        guesses = [min(_FIRST_GUESS, kmax), kmax] if hint is None else [min(max(hint, 1), kmax), kmax]
        if at_least > 0:
            probe(at_least)
            if good == 0:
                return 0, 0, 0, None
            # another segment matched exactly ``at_least``: this one most often does too (one probe more)
            guesses = [at_least + 1, kmax]
        for g in guesses:  # repetitive text usually matches the whole tail, or the hinted length
            if done is None and good < g < bad:
                probe(g)
        while done is None and bad - good > 1:  # occurrence is monotone in the suffix length
            probe((good + bad) // 2)
        if done is not None:
            return done
        if good == 0:
            return 0, 0, 0, None
        lo, hi, top = hit
        return good, lo, self._range_from(pat[w * (kmax - good):], lo, hi, top), None

    def _extend(self, pat: bytes, kmax: int, g: int, hit: tuple[int, int, int]
                ) -> tuple[int, int, int, list[int]] | None:
        """The longest match from the occurrences of a shorter one, when they are few: ``(L, lo, hi,
        starts)`` (``starts``: where its live occurrences begin; ``lo``, ``hi`` its ``sa`` range, -1 when
        not searched), or None when the last ``g`` tokens of ``pat`` (``kmax`` tokens, found at ``hit``
        by :meth:`_probe`) occur more than ``_EXTEND_MAX`` times.

        Every occurrence of a longer suffix of the context contains one of the ``g``-token suffix, so
        comparing the text before each of those (live) occurrences with the context, backwards, gives the
        longest match and all its occurrences: one slice and one XOR per occurrence (the equal trailing
        bytes of two byte strings are the high zero bits of their XOR read little-endian) instead of a
        bisect per probed length. (An occurrence of the longer match is live as the shorter one inside
        it is: both lie in one document.)

        Worked example (width 2): context ``7 8 9``, ``g = 1`` (``9``) occurs once, at text position 5,
        with text ``... 3 8 9``: the two tokens before it are ``3 8`` vs the context's ``7 8``; XOR of
        ``00 03 00 08`` and ``00 07 00 08`` (little-endian) has its highest set bit in the second byte, so
        the last 2 bytes (one token) agree: the longest match is ``8 9``, ``L = 2``, starting at 4.
        """
        lo, hi, top = hit
        w, sa = self.width, self._sa
        pg = pat[w * (kmax - g):]
        if hi < 0:
            key = self._key(len(pg))
            n = min(top, lo + _EXTEND_MAX + 1)
            if n - lo > _EXTEND_MAX and key(sa[lo + _EXTEND_MAX]) == pg:
                return None
            hi = bisect_right(sa, pg, lo + 1, min(n, lo + _EXTEND_MAX), key=key)
        elif hi - lo > _EXTEND_MAX:
            return None
        d = self._dead
        if d is None:
            starts = list(sa[lo:hi])
        else:
            dead = set(d[bisect_left(d, lo):bisect_left(d, hi)])
            starts = [sa[r] for r in range(lo, hi) if r not in dead]
        e = kmax - g  # tokens the context has before the g matched ones
        if e == 0 or not starts:
            return g, lo, hi, starts
        buf, base = self._buf, self._base
        exts = []
        for p in starts:
            start = p - e if p >= e else 0
            t = buf[base + w * start:base + w * p]
            x = pat[w * (e - (p - start)):w * e]
            if t == x:
                exts.append(p - start)
            else:
                v = int.from_bytes(t, "little") ^ int.from_bytes(x, "little")
                exts.append((len(t) * 8 - v.bit_length()) // (8 * w))
        best = max(exts)
        if best == 0:
            return g, lo, hi, starts
        return g + best, -1, -1, [p - best for p, x in zip(starts, exts, strict=True) if x == best]

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` (at most ``sort_depth`` tokens long)."""
        pat = self.pack(pattern)
        if pat is None or not pattern or self._n == 0:
            return 0
        lo, hi = self._range(pat)
        return self._live(lo, hi)


def gallop_right(sa, pattern: bytes, lo: int, hi: int, key) -> int:
    """``bisect_right(sa, pattern, lo, hi, key=key)`` when the entries before ``lo`` are known to equal
    ``pattern``: the range is widened 8, 64, 512... entries at a time and bisected inside the last step,
    so a run of ``c`` equal entries costs about ``2 log8 c + 3`` keys instead of ``log2 (hi - lo)``.

    Worked example: ``sa`` keys ``a a a b b ...`` (1000 entries), ``lo = 1``: the entry at 8 is not
    ``a``, so bisect inside ``[1, 8)``: 3 is returned after 1 + 3 key calls (a plain bisect: 10).
    """
    step = 8
    while lo < hi:
        end = min(hi, lo + step)
        if key(sa[end - 1]) != pattern:
            return bisect_right(sa, pattern, lo, end - 1, key=key)
        lo = end
        step *= 8
    return hi
