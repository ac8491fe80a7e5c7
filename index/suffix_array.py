"""A static suffix array over many token sequences: built once with numpy, memory-mapped, searched with bisect.

Layout: the sequences are concatenated, each followed by the separator ``SEP = 2**32 - 1``; tokens are
stored as big-endian uint32, so comparing raw bytes compares token sequences (a match never crosses a
separator because no real token equals ``SEP``). ``sa`` lists the suffix start positions sorted by
their first ``sort_depth`` tokens (prefix doubling with ``np.argsort``). 8 bytes per indexed token.

Lookups run ``bisect`` over ``sa`` with a key that slices the token bytes, so every comparison is a
C-level ``memcmp``. The suffixes starting with a pattern form one contiguous range of ``sa``; inside
it, the suffixes are sorted by the token that follows the pattern, so each child of a suffix-tree
node is again a contiguous sub-range: the suffix tree is implicit, a node is ``(lo, hi, depth)``.

Worked example: sequences ``[5 6 7]`` and ``[5 6 8]`` give the text ``5 6 7 SEP 5 6 8 SEP``.
The context ``... 9 5 6`` matches ``5 6`` (``9 5 6`` does not occur): ``match_len = 2``, the
node covers the 2 suffixes starting with ``5 6``, and its children are ``7`` (count 1) and
``8`` (count 1).
"""

from __future__ import annotations

import mmap
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .speculate import SpecParams, SpecResult, speculate_from

SEP = 0xFFFFFFFF  # sequence separator; never a real token id
_SEP_BYTES = b"\xff\xff\xff\xff"
DEFAULT_SORT_DEPTH = 256  # suffixes are ordered by this many tokens; match + draft depth stays below it
_BUCKET_CAP = 1 << 18  # first-token bucket table entries (2 MiB); an id of 4e9 must not allocate 32 GB


def pack_be(tokens: Sequence[int]) -> bytes:
    """Token ids as big-endian uint32 bytes (byte order = token order)."""
    return struct.pack(f">{len(tokens)}I", *tokens)


def concat_with_separators(seqs: Sequence[Sequence[int] | np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate sequences, each followed by SEP. Returns (text uint32, start offset per sequence)."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    starts = np.zeros(len(seqs), dtype=np.int64)
    if len(seqs):
        starts[1:] = np.cumsum(lengths + 1)[:-1]
    text = np.full(int(lengths.sum() + len(seqs)), SEP, dtype=np.uint32)
    for s, st, ln in zip(seqs, starts, lengths, strict=True):
        if ln:
            arr = np.asarray(s, dtype=np.int64)
            if arr.min() < 0 or arr.max() >= SEP:
                raise ValueError("token ids must be in [0, 2**32 - 1)")
            text[st:st + ln] = arr
    return text, starts


def build_suffix_array(text: np.ndarray, sort_depth: int = DEFAULT_SORT_DEPTH) -> np.ndarray:
    """Suffix start positions sorted by their first ``sort_depth`` tokens (prefix doubling).

    Round ``h`` sorts by the pair (rank of the first ``h`` tokens, rank of the next ``h``), so after
    ``log2(sort_depth)`` rounds suffixes are ordered by ``sort_depth`` tokens; it stops early once all
    ranks are distinct. Suffixes equal in their first ``sort_depth`` tokens keep an arbitrary order.
    """
    n = len(text)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    if n >= 2**31:
        raise ValueError("the suffix array holds at most 2**31 - 1 tokens")
    _, rank = np.unique(text, return_inverse=True)
    rank = rank.astype(np.int64) + 1  # 0 is kept for "past the end"
    sa = np.argsort(rank, kind="stable")
    h = 1
    while h < sort_depth:
        second = np.zeros(n, dtype=np.int64)
        second[: n - h] = rank[h:]
        key = rank * (n + 2) + second
        sa = np.argsort(key, kind="stable")
        sk = key[sa]
        new_rank = np.empty(n, dtype=np.int64)
        bumps = np.empty(n, dtype=np.int64)
        bumps[0] = 1
        np.not_equal(sk[1:], sk[:-1], out=bumps[1:])
        np.cumsum(bumps, out=bumps)
        new_rank[sa] = bumps
        rank = new_rank
        h *= 2
        if bumps[-1] == n:  # all suffixes distinct: fully sorted
            break
    return sa.astype(np.int32)


class _SANode:
    """Implicit suffix-tree node: the ``sa[lo:hi]`` suffixes share their first ``depth`` tokens."""

    __slots__ = ("owner", "lo", "hi", "depth", "count")

    def __init__(self, owner: SuffixArray, lo: int, hi: int, depth: int) -> None:
        self.owner, self.lo, self.hi, self.depth = owner, lo, hi, depth
        self.count = hi - lo

    def children(self, min_count: int) -> list[tuple[int, int, _SANode]]:
        return self.owner._children(self, min_count)

    def chain(self, max_len: int) -> tuple[list[int], _SANode]:
        return self.owner._chain(self, max_len)


class SuffixArray:
    """Static suffix index over a corpus of token sequences (documents, or a history snapshot)."""

    def __init__(self, text: np.ndarray, sa: np.ndarray, starts: np.ndarray | None = None,
                 sort_depth: int = DEFAULT_SORT_DEPTH, *, _buf=None, _base: int = 0, _sa_view=None) -> None:
        self.text = text  # uint32 tokens with SEP after each sequence (big-endian on disk)
        self.sa = sa  # int32 suffix starts
        self.starts = starts if starts is not None else np.zeros(0, dtype=np.int64)  # start of each sequence
        self.sort_depth = sort_depth
        self._buf = _buf if _buf is not None else np.asarray(text, dtype=">u4").tobytes()
        self._base = _base  # byte offset of token 0 inside _buf
        self._sa = _sa_view if _sa_view is not None else memoryview(np.ascontiguousarray(sa, dtype=np.int32)).cast("B").cast("i")
        self._n = len(sa)
        self._buckets = self._first_token_buckets()

    def _first_token_buckets(self) -> memoryview:
        """``sa`` range of the suffixes starting with token ``t`` is ``[b[t], b[t + 1])``: bisects start narrow."""
        n = self._n
        real = np.asarray(self.text)[np.asarray(self.sa)[: n - len(self.starts)]] if n else np.zeros(0, np.uint32)
        vocab = int(real[-1]) + 1 if len(real) else 0  # sorted: the last real suffix has the largest first token
        self._n_real = len(real)
        self._bucketed = vocab <= _BUCKET_CAP  # else ids >= the cap are found by bisect (table stays small)
        vocab = min(vocab, _BUCKET_CAP)
        b = np.searchsorted(real, np.arange(vocab + 1, dtype=np.uint32)).astype(np.int64)
        return memoryview(b).cast("B").cast("q")

    def _bucket(self, tok: int) -> tuple[int, int]:
        b = self._buckets
        if tok + 1 < len(b):
            return b[tok], b[tok + 1]
        if self._bucketed:
            return 0, 0
        pat, buf, base = tok.to_bytes(4, "big"), self._buf, self._base

        def key(i: int) -> bytes:
            return buf[base + 4 * i:base + 4 * i + 4]

        lo = bisect_left(self._sa, pat, b[len(b) - 1], self._n_real, key=key)
        return lo, bisect_right(self._sa, pat, lo, self._n_real, key=key)

    # ----- construction and persistence -------------------------------------------------------
    @classmethod
    def build(cls, seqs: Sequence[Sequence[int] | np.ndarray], sort_depth: int = DEFAULT_SORT_DEPTH) -> SuffixArray:
        text, starts = concat_with_separators(seqs)
        return cls(text, build_suffix_array(text, sort_depth), starts, sort_depth)

    def save(self, prefix: str | Path) -> list[Path]:
        """Write ``prefix.tokens.npy`` (big-endian uint32), ``prefix.sa.npy``, ``prefix.starts.npy``."""
        prefix = str(prefix)
        paths = [Path(prefix + ".tokens.npy"), Path(prefix + ".sa.npy"), Path(prefix + ".starts.npy")]
        for path, arr in zip(paths, (np.asarray(self.text, dtype=">u4"), np.asarray(self.sa, dtype=np.int32),
                                     np.asarray(self.starts, dtype=np.int64)), strict=True):
            with open(path, "wb") as f:
                np.save(f, arr)
                f.flush()
        return paths

    @classmethod
    def load(cls, prefix: str | Path, sort_depth: int = DEFAULT_SORT_DEPTH) -> SuffixArray:
        """Memory-map arrays written by :meth:`save` (no rebuild; pages load on demand)."""
        prefix = str(prefix)
        text = np.load(prefix + ".tokens.npy", mmap_mode="r")
        sa = np.load(prefix + ".sa.npy", mmap_mode="r")
        starts = np.load(prefix + ".starts.npy")
        buf, base = _mmap_bytes(prefix + ".tokens.npy", text)
        sa_buf, sa_base = _mmap_bytes(prefix + ".sa.npy", sa)
        sa_view = memoryview(sa_buf)[sa_base:sa_base + 4 * len(sa)].cast("i") if len(sa) else memoryview(b"").cast("i")
        return cls(text, sa, starts, sort_depth, _buf=buf, _base=base, _sa_view=sa_view)

    # ----- facts ---------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        """Indexed tokens, separators excluded."""
        return self._n - len(self.starts)

    @property
    def num_sequences(self) -> int:
        return len(self.starts)

    def nbytes(self) -> int:
        return int(self.text.nbytes + self.sa.nbytes + self.starts.nbytes)

    # ----- lookup --------------------------------------------------------------------------------
    def _range(self, pattern: bytes, exists_only: bool = False) -> tuple[int, int]:
        """``sa[lo:hi]`` range of suffixes starting with ``pattern`` (big-endian bytes, >= 1 token).

        With ``exists_only`` the range is ``(lo, lo + 1)`` when the pattern occurs (one bisect, not two).
        """
        buf, base, m, sa = self._buf, self._base, len(pattern), self._sa
        lo, hi = self._bucket(int.from_bytes(pattern[:4], "big"))
        if m == 4 or hi <= lo:
            return lo, hi

        def key(i: int) -> bytes:
            s = base + 4 * i
            return buf[s:s + m]

        lo = bisect_left(sa, pattern, lo, hi, key=key)
        if lo >= hi or key(sa[lo]) != pattern:
            return lo, lo
        if exists_only:
            return lo, lo + 1
        return lo, bisect_right(sa, pattern, lo, hi, key=key)

    def match(self, context: Sequence[int], max_depth: int = 64, hint: int | None = None) -> tuple[int, int, int]:
        """Longest suffix of ``context`` (at most ``max_depth`` tokens) in the corpus: (match_len, lo, hi).

        ``hint``: a guess of the match length (for example the previous step's match plus the tokens
        appended since), tried first; a right guess costs two probes instead of a binary search.
        """
        kmax = min(max_depth, len(context), self.sort_depth)
        if kmax <= 0 or self._n == 0:
            return 0, 0, 0
        tail = context[-kmax:]
        try:
            pat = pack_be(tail)
        except struct.error:  # a negative or huge id: no match past it
            bad_at = max(i for i, t in enumerate(tail) if not 0 <= t < SEP)
            if bad_at == kmax - 1:
                return 0, 0, 0
            return self.match(context[len(context) - kmax + bad_at + 1:], max_depth, hint)
        good, bad = 0, kmax + 1
        guesses = [kmax] if hint is None else [min(max(hint, 1), kmax), kmax]
        for g in guesses:  # repetitive text usually matches the whole tail, or the hinted length
            if not good < g < bad:
                continue
            lo, hi = self._range(pat[4 * (kmax - g):], exists_only=True)
            if hi > lo:
                good = g
            else:
                bad = g
        while bad - good > 1:  # occurrence is monotone in the suffix length
            mid = (good + bad) // 2
            lo, hi = self._range(pat[4 * (kmax - mid):], exists_only=True)
            if hi > lo:
                good = mid
            else:
                bad = mid
        if good == 0:
            return 0, 0, 0
        lo, hi = self._range(pat[4 * (kmax - good):])
        return good, lo, hi

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` (at most ``sort_depth`` tokens long)."""
        lo, hi = self._range(pack_be(pattern))
        return hi - lo

    def continuations(self, context: Sequence[int], max_depth: int = 64) -> list[tuple[int, int]]:
        """Next tokens after the longest matched suffix, as ``(token, count)`` ranked by count."""
        L, lo, hi = self.match(context, max_depth)
        if L == 0:
            return []
        kids = _SANode(self, lo, hi, L).children(1)
        return sorted(((t, c) for t, c, _ in kids), key=lambda tc: (-tc[1], tc[0]))

    def speculate(self, context: Sequence[int], params: SpecParams, max_depth: int = 64,
                  hint: int | None = None) -> SpecResult:
        """Draft continuing ``context`` from its longest match (see :mod:`index.speculate`)."""
        L, lo, hi = self.match(context, max_depth, hint)
        if L == 0:
            return SpecResult()
        return speculate_from(_SANode(self, lo, hi, L), L, params)

    def _token_at(self, pos: int) -> bytes:
        s = self._base + 4 * pos
        return self._buf[s:s + 4]

    def _chain(self, node: _SANode, max_len: int) -> tuple[list[int], _SANode]:
        """The run shared by all suffixes of ``node``: sorted order makes it the common prefix of the first
        and the last suffix (past the node's depth), cut at the first separator."""
        lo, hi, d = node.lo, node.hi, node.depth
        k = min(max_len, self.sort_depth - d)
        if k <= 0 or hi <= lo:
            return [], node
        buf, base, sa = self._buf, self._base, self._sa
        s1 = base + 4 * (sa[lo] + d)
        first = buf[s1:s1 + 4 * k]
        if hi - lo > 1:
            s2 = base + 4 * (sa[hi - 1] + d)
            last = buf[s2:s2 + 4 * k]
            if len(last) != len(first):  # one of them runs into the end of the text
                m = min(len(first), len(last))
                first, last = first[:m], last[:m]
            x = int.from_bytes(first, "big") ^ int.from_bytes(last, "big")
            if x:
                common = (len(first) * 8 - x.bit_length()) >> 5
                first = first[:4 * common]
        if not first:
            return [], node
        run = list(struct.unpack(f">{len(first) >> 2}I", first))
        if SEP in run:
            run = run[:run.index(SEP)]
        return run, (_SANode(self, lo, hi, d + len(run)) if run else node)

    def _children(self, node: _SANode, min_count: int) -> list[tuple[int, int, _SANode]]:
        """Children of ``node`` with at least ``min_count`` occurrences (others may be omitted).

        The token after the node's prefix is sorted across ``sa[lo:hi]``. A child run of length
        ``>= stride`` must contain one of the sampled positions ``lo, lo + stride, ...``, so the
        sampled tokens are all the candidates; each run's bounds come from two bisects.
        """
        lo, hi, d = node.lo, node.hi, node.depth
        if hi <= lo or d >= self.sort_depth:
            return []
        sa, buf, base = self._sa, self._buf, self._base
        first = self._token_at(sa[lo] + d)
        if hi - lo == 1 or first == self._token_at(sa[hi - 1] + d):  # one child (the common case deep down)
            if first == _SEP_BYTES:
                return []
            return [(int.from_bytes(first, "big"), hi - lo, _SANode(self, lo, hi, d + 1))]

        def key(i: int) -> bytes:
            s = base + 4 * (i + d)
            return buf[s:s + 4]

        out: list[tuple[int, int, _SANode]] = []
        stride = max(1, min_count)
        pos = lo
        while pos < hi:
            tok = key(sa[pos])
            start = pos if stride == 1 or pos == lo else bisect_left(sa, tok, lo, pos + 1, key=key)
            end = bisect_right(sa, tok, pos, hi, key=key)
            if tok != _SEP_BYTES and end - start >= min_count:
                out.append((int.from_bytes(tok, "big"), end - start, _SANode(self, start, end, d + 1)))
            # next sample point at or after the end of this run
            nxt = lo + ((end - lo + stride - 1) // stride) * stride
            pos = max(nxt, end) if stride > 1 else end
        return out


def _mmap_bytes(path: str, arr: np.ndarray) -> tuple[object, int]:
    """A read-only mmap of ``path`` (slicing gives bytes) and the byte offset of ``arr``'s data in it."""
    if arr.nbytes == 0:
        return b"", 0
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return mm, int(arr.offset)
