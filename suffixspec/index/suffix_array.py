"""A static suffix array over many token sequences: built once (libdivsufsort), memory-mapped, searched with bisect.

Its token layout and construction are in :mod:`.suffix_array_build`, its sorted suffixes and the
longest-match search over them in :mod:`.suffix_array_search`; here, :class:`SuffixArray` puts them
together with the implicit suffix tree, construction and persistence (``save``, ``load``: memory-mapped).

The suffixes starting with a pattern form one contiguous range of ``sa``; inside it, the suffixes are
sorted by the token that follows the pattern, so each child of a suffix-tree node is again a contiguous
sub-range: the suffix tree is implicit, a node is ``(lo, hi, depth)`` (:class:`SANode`), or, for a match
of few occurrences, the list of them (:class:`PosNode`).

Worked example: sequences ``[5 6 7]`` and ``[5 6 8]`` give the text ``5 6 7 SEP 5 6 8 SEP``.
The context ``... 9 5 6`` matches ``5 6`` (``9 5 6`` does not occur): ``match_len = 2``, the
node covers the 2 suffixes starting with ``5 6``, and its children are ``7`` (count 1) and
``8`` (count 1).
"""

from __future__ import annotations

import mmap
import os
import struct
from bisect import bisect_left
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .speculate import LongestMatchLookups
from .suffix_array_build import DEFAULT_SORT_DEPTH, SEP, build_suffix_array, concat_with_separators
from .suffix_array_search import SortedSuffixes, gallop_right


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
    extension (:meth:`~.suffix_array_search.SortedSuffixes._extend`) is the most expensive part of a lookup. Counts, children
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


class SuffixArray(SortedSuffixes, LongestMatchLookups):
    """Static suffix index over a corpus of token sequences (documents, or one segment of them): the
    search of :class:`~.suffix_array_search.SortedSuffixes` (``dead``: its tombstones), and nodes of its
    matches.
    """

    def with_dead(self, dead: np.ndarray | None) -> SuffixArray:
        """The same arrays with another tombstone set (no copy of the mapped files)."""
        return SuffixArray(self.text, self.sa, self.starts, self.sort_depth, _buf=self._buf, _base=self._base,
                           _sa_view=self._sa, buckets=np.frombuffer(self._buckets, dtype=np.int64), dead=dead)

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


def _mmap_file(path: str) -> mmap.mmap:
    """A read-only mmap of a whole (non-empty) file."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
