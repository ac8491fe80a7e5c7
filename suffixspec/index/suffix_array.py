"""A static suffix array over many token sequences: built once (libdivsufsort), memory-mapped, searched with bisect.

Layout: the sequences are concatenated, each followed by a separator; tokens are stored big-endian,
2 bytes each when every id is below ``SEP16 = 0xFFFF`` (the separator then), else 4 bytes with
``SEP = 2**32 - 1``. Comparing raw bytes compares token sequences (a match never crosses a separator
because no real token equals it). ``sa`` lists every suffix start in sorted order as int32: 6 bytes
per indexed token with 16-bit ids, 8 with 32-bit ones. It is built by libdivsufsort over the bytes
(:func:`sort_suffixes`), about 10 bytes of memory per token at the peak for 16-bit ids.

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
import os
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .speculate import LongestMatchLookups

SEP = 0xFFFFFFFF  # sequence separator of 32-bit arrays; never a real token id
SEP16 = 0xFFFF  # the separator of 16-bit arrays (vocabularies of fewer than 65535 ids)
_SEP_BYTES = b"\xff\xff\xff\xff"
DEFAULT_SORT_DEPTH = 256  # lookups compare at most this many tokens; match + draft depth stays below it
_BUCKET_CAP = 1 << 18  # first-token bucket table entries (2 MiB); an id of 4e9 must not allocate 32 GB
_EXTEND_MAX = 32  # a match with at most this many occurrences is extended backwards (see SuffixArray._extend)
# without a hint, the first length probed: a suffix this long occurs few times in most corpora, so its
# occurrences give the longest match by backward extension (one probe, whether or not the whole context
# occurs); probing the whole context first costs a binary search over lengths whenever it does not occur
_FIRST_GUESS = 16
_COMPACT_CHUNK = 1 << 22  # entries per step when the byte-level suffix array is cut down to token starts


def pack_be(tokens: Sequence[int], width: int = 4) -> bytes:
    """Token ids as big-endian bytes, ``width`` (2 or 4) per token (byte order = token order)."""
    return struct.pack(f">{len(tokens)}{'H' if width == 2 else 'I'}", *tokens)


def width_for(max_id: int) -> int:
    """Bytes per stored token: 2 when every id (and the separator 0xFFFF) fits, else 4."""
    return 2 if max_id < SEP16 else 4


def concat_with_separators(seqs: Sequence[Sequence[int] | np.ndarray],
                           width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate sequences, each followed by the separator. Returns (text as big-endian uint16 or
    uint32, start offset per sequence); ``width`` None picks 2 bytes when the ids allow it."""
    arrs = [np.asarray(s, dtype=np.int64) for s in seqs]
    for arr in arrs:
        if len(arr) and (arr.min() < 0 or arr.max() >= SEP):
            raise ValueError("token ids must be in [0, 2**32 - 1)")
    if width is None:
        width = width_for(max((int(a.max()) for a in arrs if len(a)), default=0))
    sep = SEP16 if width == 2 else SEP
    lengths = np.fromiter((len(a) for a in arrs), dtype=np.int64, count=len(arrs))
    starts = np.zeros(len(arrs), dtype=np.int64)
    if len(arrs):
        starts[1:] = np.cumsum(lengths + 1)[:-1]
    text = np.full(int(lengths.sum() + len(arrs)), sep, dtype=f">u{width}")
    for arr, st in zip(arrs, starts, strict=True):
        if len(arr):
            if arr.max() >= sep:
                raise ValueError(f"token id {int(arr.max())} does not fit a {8 * width}-bit array")
            text[st:st + len(arr)] = arr
    return text, starts


def sort_suffixes(raw: np.ndarray, width: int) -> np.ndarray:
    """Token start positions sorted by their suffixes: ``raw`` is the text as writable uint8 bytes
    (big-endian tokens of ``width`` bytes). Returns int32 positions in tokens.

    libdivsufsort (pydivsufsort) sorts every byte offset; byte order is token order for big-endian
    tokens, so the offsets that are multiples of ``width``, divided by it, are the token suffix array.
    They are packed in place into the front of libdivsufsort's output: 4 * width bytes per token at
    the peak, besides the text. Worked example (width 2): tokens ``[1, 0]`` are bytes ``00 01 00 00``;
    the byte suffixes sort as offsets ``2 3 0 1``; the even ones are ``2 0``: tokens ``[1, 0]``.
    """
    from pydivsufsort import divsufsort  # C (libdivsufsort): 9x faster than numpy prefix doubling here

    n = len(raw) // width
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    if len(raw) >= 2**31:
        raise ValueError("a suffix array segment holds at most 2**31 - 1 bytes of tokens")
    out = divsufsort(raw)
    shift = width.bit_length() - 1
    w = 0
    for a in range(0, len(out), _COMPACT_CHUNK):
        chunk = out[a:a + _COMPACT_CHUNK]
        keep = chunk[(chunk & (width - 1)) == 0] >> shift
        out[w:w + len(keep)] = keep
        w += len(keep)
    assert w == n
    return out[:n]


def build_suffix_array(text: np.ndarray, sort_depth: int = DEFAULT_SORT_DEPTH) -> np.ndarray:
    """Suffix start positions of ``text`` (big-endian uint16 / uint32 tokens) in sorted order (int32).

    Suffixes are fully sorted (``sort_depth`` is kept for callers; lookups compare at most that many
    tokens, so any order of suffixes equal that far would do).
    """
    text = np.asarray(text)
    if text.dtype.byteorder != ">" and text.dtype.itemsize > 1:
        text = text.astype(f">u{text.dtype.itemsize}")
    raw = np.frombuffer(bytearray(text.tobytes()), dtype=np.uint8)
    return np.array(sort_suffixes(raw, text.dtype.itemsize))


def first_token_buckets(counts: np.ndarray, width: int) -> np.ndarray:
    """The bucket table from the count of each (non-separator) token id: ``b[t]`` = suffixes whose first
    token is below ``t`` (real suffixes sort before separators, so they start the array)."""
    vocab = len(counts)
    if width == 4:
        vocab = min(vocab, _BUCKET_CAP)
    b = np.zeros(vocab + 1, dtype=np.int64)
    np.cumsum(counts[:vocab], out=b[1:])
    return b


def token_counts(text: np.ndarray, sep: int) -> np.ndarray:
    """Occurrences of each token id below the bucket cap (separators excluded)."""
    t = np.asarray(text)
    t = t[t != sep]
    if t.dtype.itemsize == 4:
        t = t[t < _BUCKET_CAP]
    return np.bincount(t.astype(np.int64), minlength=0) if len(t) else np.zeros(0, dtype=np.int64)


class SANode:
    """Implicit suffix-tree node: the ``sa[lo:hi]`` suffixes share their first ``depth`` tokens;
    ``count`` leaves out the suffixes of deleted documents (tombstones)."""

    __slots__ = ("owner", "lo", "hi", "depth", "count")

    def __init__(self, owner: SuffixArray, lo: int, hi: int, depth: int) -> None:
        self.owner, self.lo, self.hi, self.depth = owner, lo, hi, depth
        self.count = owner._live(lo, hi)

    def children(self, min_count: int) -> list[tuple[int, int, SANode]]:
        return self.owner._children(self, min_count)

    def chain(self, max_len: int) -> tuple[list[int], SANode]:
        return self.owner._chain(self, max_len)

    def child(self, tok: int) -> SANode | None:
        """The child for token ``tok`` (None when no live suffix continues with it)."""
        return self.owner._child(self, tok)

    def occurrences(self) -> list[tuple[SuffixArray, int]]:
        """``(array, start)`` of each live suffix in the node (read from ``sa``: for nodes of few)."""
        o = self.owner
        starts = o._sa[self.lo:self.hi]
        if o._dead is None:
            return [(o, p) for p in starts]
        d = o._dead
        dead = set(d[bisect_left(d, self.lo):bisect_left(d, self.hi)])
        return [(o, p) for r, p in enumerate(starts, self.lo) if r not in dead]


def common_prefix(runs: list[list[int]]) -> list[int]:
    """The longest run of tokens every list in ``runs`` starts with: ``[[1, 2, 3], [1, 2, 5], [1, 2]]`` -> ``[1, 2]``."""
    common = runs[0]
    for r in runs[1:]:
        k = 0
        for a, b in zip(common, r):  # noqa: B905 - lengths differ on purpose
            if a != b:
                break
            k += 1
        common = common[:k]
        if not common:
            break
    return common


class PosNode:
    """A match node given by its occurrences, when they are few: ``(array, start)`` of every live suffix
    that begins with the node's ``depth``-token path, in one array or in several (segments). Children
    and shared runs are read at those positions, with no search of ``sa``: a :class:`SANode` needs the
    ``sa`` range of its path first, one bisect per array, which for a match found by backward
    extension (:meth:`SuffixArray._extend`) is the most expensive part of a lookup. Counts, children
    (token order) and runs are those of the ``SANode`` of the same suffixes.

    Worked example: ``5 6`` (depth 2) occurs at 0 and 5 of ``5 6 7 1 SEP 5 6 7 2 SEP``: the shared run is
    ``[7]`` (node at depth 3, same occurrences), whose children are ``1`` and ``2``, count 1 each.
    """

    __slots__ = ("occ", "depth", "count", "limit")

    def __init__(self, occ: list[tuple[SuffixArray, int]], depth: int, limit: int) -> None:
        self.occ = occ  # (array, start of the suffix) per live occurrence
        self.depth = depth  # tokens of the path
        self.count = len(occ)
        self.limit = limit  # sort depth: tokens a lookup may compare (as SANode's owner.sort_depth)

    def children(self, min_count: int) -> list[tuple[int, int, PosNode]]:
        d = self.depth
        if d >= self.limit:
            return []
        groups: dict[int, list[tuple[SuffixArray, int]]] = {}
        for o, p in self.occ:  # every path ends before its separator, so p + d is inside the text
            s = o._base + o.width * (p + d)
            tok = int.from_bytes(o._buf[s:s + o.width], "big")
            if tok != o.sep:
                groups.setdefault(tok, []).append((o, p))
        return [(t, len(g), PosNode(g, d + 1, self.limit)) for t, g in sorted(groups.items()) if len(g) >= min_count]

    def chain(self, max_len: int) -> tuple[list[int], PosNode]:
        """The tokens every occurrence continues with (at most ``max_len``, cut at a separator)."""
        d = self.depth
        k = min(max_len, self.limit - d)
        if k <= 0 or not self.occ:
            return [], self
        o0 = self.occ[0][0]
        if any(o.width != o0.width for o, _ in self.occ):  # arrays of 16- and 32-bit ids: compare tokens
            run = common_prefix([_tokens(o, p + d, k) for o, p in self.occ])
        else:
            w = o0.width
            first = None
            for o, p in self.occ:
                s = o._base + w * (p + d)
                b = o._buf[s:s + w * k]
                if first is None:
                    first = b
                    continue
                if len(b) != len(first):  # one of them runs into the end of the text
                    m = min(len(b), len(first))
                    first, b = first[:m], b[:m]
                x = int.from_bytes(first, "big") ^ int.from_bytes(b, "big")
                if x:
                    first = first[:w * ((len(first) * 8 - x.bit_length()) // (8 * w))]
                    if not first:
                        return [], self
            run = list(struct.unpack(f">{len(first) // w}{o0._fmt[1]}", first))
            if o0.sep in run:
                run = run[:run.index(o0.sep)]
        if SEP in run:  # the mixed case marks separators of either width as SEP
            run = run[:run.index(SEP)]
        if not run:
            return [], self
        return run, PosNode(self.occ, d + len(run), self.limit)

    def occurrences(self) -> list[tuple[SuffixArray, int]]:
        return self.occ

    def range_node(self) -> SANode:
        """The same node as an ``sa`` range (its occurrences must all be in one array): one bisect."""
        o, p = self.occ[0]
        s = o._base + o.width * p
        pat = o._buf[s:s + o.width * self.depth]
        lo, hi, top = o._probe(pat)
        return SANode(o, lo, o._range_from(pat, lo, hi, top), self.depth)


def _tokens(o: SuffixArray, pos: int, k: int) -> list[int]:
    """Up to ``k`` token ids of ``o`` from ``pos``, its separator written as ``SEP`` whatever the width."""
    s = o._base + o.width * pos
    b = o._buf[s:s + o.width * k]
    run = list(struct.unpack(f">{len(b) // o.width}{o._fmt[1]}", b))
    return [SEP if t == o.sep else t for t in run]


class SuffixArray(LongestMatchLookups):
    """Static suffix index over a corpus of token sequences (documents, or one segment of them).

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

    def with_dead(self, dead: np.ndarray | None) -> SuffixArray:
        """The same arrays with another tombstone set (no copy of the mapped files)."""
        return SuffixArray(self.text, self.sa, self.starts, self.sort_depth, _buf=self._buf, _base=self._base,
                           _sa_view=self._sa, buckets=np.frombuffer(self._buckets, dtype=np.int64), dead=dead)

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

    # ----- construction and persistence -------------------------------------------------------
    @classmethod
    def build(cls, seqs: Sequence[Sequence[int] | np.ndarray], sort_depth: int = DEFAULT_SORT_DEPTH,
              width: int | None = None) -> SuffixArray:
        text, starts = concat_with_separators(seqs, width)
        return cls(text, build_suffix_array(text, sort_depth), starts, sort_depth)

    def save(self, prefix: str | Path) -> list[Path]:
        """Write ``prefix.tok`` (raw big-endian tokens), ``prefix.sa`` (raw int32), ``prefix.starts.npy``
        and ``prefix.buckets.npy``; :meth:`load` maps them."""
        prefix = str(prefix)
        paths = [Path(prefix + ".tok"), Path(prefix + ".sa"), Path(prefix + ".starts.npy"),
                 Path(prefix + ".buckets.npy")]
        with open(paths[0], "wb") as f:
            f.write(self._buf[self._base:self._base + self.width * self._n])
        with open(paths[1], "wb") as f:
            f.write(np.asarray(self.sa, dtype="<i4").tobytes())
        np.save(paths[2], np.asarray(self.starts, dtype=np.int64))
        np.save(paths[3], np.frombuffer(self._buckets, dtype=np.int64))
        return paths

    @classmethod
    def load(cls, prefix: str | Path, sort_depth: int = DEFAULT_SORT_DEPTH,
             dead: np.ndarray | None = None) -> SuffixArray:
        """Memory-map arrays written by :meth:`save` (no rebuild; pages load on demand)."""
        prefix = str(prefix)
        starts = np.load(prefix + ".starts.npy")
        buckets = np.load(prefix + ".buckets.npy")
        tok_bytes = os.path.getsize(prefix + ".tok")
        n = os.path.getsize(prefix + ".sa") // 4
        if n == 0:
            return cls(np.zeros(0, dtype=">u2"), np.zeros(0, dtype=np.int32), starts, sort_depth, buckets=buckets)
        width = tok_bytes // n
        buf = _mmap_file(prefix + ".tok")
        sa_buf = _mmap_file(prefix + ".sa")
        text = np.frombuffer(buf, dtype=f">u{width}")
        sa = np.frombuffer(sa_buf, dtype="<i4")
        return cls(text, sa, starts, sort_depth, _buf=buf, _base=0, _sa_view=memoryview(sa_buf).cast("i"),
                   buckets=buckets, dead=dead)

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
        found from few occurrences (:meth:`_extend`) costs one probe more for its range; :meth:`node`
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

    def node(self, context: Sequence[int], max_depth: int = 64, hint: int | None = None,
             at_least: int = 0, packed: tuple[int, bytes | None] | None = None
             ) -> tuple[int, SANode | PosNode | None]:
        """The match of :meth:`match` as a node: (match_len, node or None); a node of its occurrences
        (:class:`PosNode`) when they are few."""
        L, lo, hi, starts = self._find(context, max_depth, hint, at_least, packed)
        if not L:
            return 0, None
        if starts is not None:
            return L, PosNode([(self, p) for p in starts], L, self.sort_depth)
        return L, SANode(self, lo, hi, L)

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` (at most ``sort_depth`` tokens long)."""
        pat = self.pack(pattern)
        if pat is None or not pattern or self._n == 0:
            return 0
        lo, hi = self._range(pat)
        return self._live(lo, hi)

    def _token_at(self, pos: int) -> bytes:
        s = self._base + self.width * pos
        return self._buf[s:s + self.width]

    def _chain(self, node: SANode, max_len: int) -> tuple[list[int], SANode]:
        """The run shared by all live suffixes of ``node``: sorted order makes it the common prefix of the
        first and the last one (past the node's depth), cut at the first separator."""
        lo, hi, d, w = node.lo, node.hi, node.depth, self.width
        k = min(max_len, self.sort_depth - d)
        if k <= 0 or node.count <= 0:
            return [], node
        buf, base, sa = self._buf, self._base, self._sa
        a, z = self._first_live(lo, hi), self._last_live(lo, hi)
        lo, hi = a, z + 1  # tombstones at the edges may not share the run: the node keeps the live span
        s1 = base + w * (sa[a] + d)
        first = buf[s1:s1 + w * k]
        if z > a:
            s2 = base + w * (sa[z] + d)
            last = buf[s2:s2 + w * k]
            if len(last) != len(first):  # one of them runs into the end of the text
                m = min(len(first), len(last))
                first, last = first[:m], last[:m]
            x = int.from_bytes(first, "big") ^ int.from_bytes(last, "big")
            if x:
                common = (len(first) * 8 - x.bit_length()) >> self._shift
                first = first[:w * common]
        if not first:
            return [], node
        run = list(struct.unpack(f">{len(first) // w}{self._fmt[1]}", first))
        if self.sep in run:
            run = run[:run.index(self.sep)]
        return run, (SANode(self, lo, hi, d + len(run)) if run else node)

    def _child(self, node: SANode, tok: int) -> SANode | None:
        lo, hi, d, w = node.lo, node.hi, node.depth, self.width
        if hi <= lo or d >= self.sort_depth or not 0 <= tok < self.sep:
            return None
        buf, base, sa = self._buf, self._base, self._sa
        t = tok.to_bytes(w, "big")

        def key(i: int) -> bytes:
            s = base + w * (i + d)
            return buf[s:s + w]

        a = bisect_left(sa, t, lo, hi, key=key)
        b = gallop_right(sa, t, a + 1, hi, key) if a < hi and key(sa[a]) == t else a
        if self._live(a, b) <= 0:
            return None
        return SANode(self, a, b, d + 1)

    def _children(self, node: SANode, min_count: int) -> list[tuple[int, int, SANode]]:
        """Children of ``node`` with at least ``min_count`` occurrences (others may be omitted), in token order.

        The token after the node's prefix is sorted across ``sa[lo:hi]``. A child run of length
        ``>= stride`` must contain one of the sampled positions ``lo, lo + stride, ...``, so the
        sampled tokens are all the candidates; each run's bounds come from two bisects.
        """
        lo, hi, d, w = node.lo, node.hi, node.depth, self.width
        if node.count <= 0 or d >= self.sort_depth:
            return []
        sa, buf, base = self._sa, self._buf, self._base
        a, z = self._first_live(lo, hi), self._last_live(lo, hi)
        first = self._token_at(sa[a] + d)
        if z == a or first == self._token_at(sa[z] + d):  # one child (the common case deep down)
            if first == self._sep_bytes:
                return []  # tombstones at the edges may not share the token: the child keeps the live span
            return [(int.from_bytes(first, "big"), node.count, SANode(self, a, z + 1, d + 1))]

        def key(i: int) -> bytes:
            s = base + w * (i + d)
            return buf[s:s + w]

        out: list[tuple[int, int, SANode]] = []
        stride = max(1, min_count)
        pos = lo
        while pos < hi:
            tok = key(sa[pos])
            start = pos if stride == 1 or pos == lo else bisect_left(sa, tok, lo, pos + 1, key=key)
            end = gallop_right(sa, tok, pos + 1, hi, key)
            if tok != self._sep_bytes:
                child = SANode(self, start, end, d + 1)
                if child.count >= min_count and child.count > 0:
                    out.append((int.from_bytes(tok, "big"), child.count, child))
            # next sample point at or after the end of this run
            nxt = lo + ((end - lo + stride - 1) // stride) * stride
            pos = max(nxt, end) if stride > 1 else end
        return out


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


def _mmap_file(path: str) -> mmap.mmap:
    """A read-only mmap of a whole (non-empty) file."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
