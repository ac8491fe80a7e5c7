"""A document index in segments (LSM-style): immutable suffix arrays, tombstones, merges, one combined lookup.

An add writes its documents into a *fresh segment* (a :class:`~index.suffix_array.SuffixArray` over
just those documents, cheap to build); a delete or an update leaves the old tokens where they are and
records *tombstones*: the ``sa`` ranks of the dead document's suffixes in that segment, which lookups
subtract. Segments of similar size are merged in the background into larger ones (dropping the
tombstoned documents), so a corpus is a handful of segments whatever the history of its edits.

A lookup asks every segment and combines them so that every answer is the one a single suffix array
over the live documents would give (:class:`SegmentSet`):

- the match length is the longest of the segments' (a suffix occurs in the union iff it occurs in
  one of them); the match node is the list of the segments' nodes of that length;
- a node's count is the sum of its parts' counts; its children are the union of the parts'
  children by token, each count summed exactly (a child with ``min_count`` occurrences in total has
  ``ceil(min_count / k)`` of them in one of the ``k`` parts, so asking each part for those finds it,
  and the others are asked for that token's exact range);
- a node's shared run (compressed edge) is the common prefix of the parts' runs;
- when the match occurs at most ``_POS_UNION`` times in all segments together (the usual case for a
  long match), the node is instead one list of those occurrences (``PosNode``): children and runs are
  read at each occurrence, whatever segment holds it, with no search.

Worked example: segment A holds ``[1 2 3]``, segment B holds ``[1 2 4]`` and ``[1 2 3]``; context
``... 1 2`` matches 2 tokens in both; the node's count is 1 + 2 = 3 and its children are ``3``
(1 + 1 = 2) and ``4`` (0 + 1 = 1), exactly those of one array over all three documents.

Building a segment streams its sequences to a token file on disk (:class:`SegmentWriter`), then sorts
the suffixes with libdivsufsort: memory stays bounded by the segment's size, never the corpus'.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .speculate import LongestMatchLookups
from .suffix_array import PosNode, SANode, SuffixArray, common_prefix
from .suffix_array_build import DEFAULT_SORT_DEPTH, SEP, SEP16, first_token_buckets, sort_suffixes

_SCAN_CHUNK = 1 << 23  # suffix-array entries per step when tombstones are located
_POS_UNION = 64  # a match with at most this many occurrences in all segments is one node of them (_union)
_SMALL_PART = 32  # a node part this small lists all its children (cheaper than searching for missing ones)


class SegmentWriter:
    """Streams token sequences into ``<prefix>.tok`` and sorts them into a segment on :meth:`finish`.

    Ids are stored in 2 bytes while they all fit (``width`` 2) and the file is widened to 4 bytes
    the first time one does not. ``files`` lists every path written (for clean-up by the caller).
    """

    def __init__(self, prefix: str | os.PathLike, width: int = 2) -> None:
        self.prefix = str(prefix)
        self.width = width  # bytes per token in the file
        self.files: list[Path] = [Path(self.prefix + ext) for ext in (".tok", ".sa", ".starts.npy", ".buckets.npy")]
        self._f = open(self.files[0], "wb")  # noqa: SIM115 - closed in finish()/abort()
        self.starts: list[int] = []
        self.n = 0  # entries written, separators included
        self.counts = np.zeros(0, dtype=np.int64)  # occurrences per token id (bucket table)
        self.sorted = False  # finish() done: the segment's files are complete

    @property
    def num_tokens(self) -> int:
        return self.n - len(self.starts)

    def add(self, ids: np.ndarray | Sequence[int]) -> None:
        """Append one sequence (and its separator)."""
        arr = np.asarray(ids)
        if len(arr):
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= SEP:
                raise ValueError("token ids must be in [0, 2**32 - 1)")
            if self.width == 2 and hi >= SEP16:
                self._widen()
            cap = hi + 1 if self.width == 2 else min(hi + 1, 1 << 18)
            small = arr if self.width == 2 else arr[arr < cap]
            c = np.bincount(small.astype(np.int64), minlength=cap)
            if len(c) > len(self.counts):
                c[:len(self.counts)] += self.counts
                self.counts = c
            else:
                self.counts[:len(c)] += c
        sep = SEP16 if self.width == 2 else SEP
        out = np.empty(len(arr) + 1, dtype=f">u{self.width}")
        out[:-1] = arr
        out[-1] = sep
        self._f.write(out.tobytes())
        self.starts.append(self.n)
        self.n += len(out)

    def _widen(self) -> None:
        """Rewrite the 16-bit file as 32-bit ids (the first id that does not fit 16 bits arrived)."""
        self._f.close()
        old = np.fromfile(self.files[0], dtype=">u2").astype(">u4")
        old[old == SEP16] = SEP
        old.tofile(self.files[0])
        self._f = open(self.files[0], "ab")  # noqa: SIM115
        self.width = 4

    def finish(self) -> SuffixArray:
        """Sort the suffixes, write ``.sa``, ``.starts.npy`` and ``.buckets.npy`` (fsync'ed) and return
        the memory-mapped segment. Peak memory: the text plus 4 bytes per byte of it."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        raw = np.fromfile(self.files[0], dtype=np.uint8)  # writable: libdivsufsort's binding wants that
        sa = sort_suffixes(raw, self.width)
        del raw
        with open(self.files[1], "wb") as f:
            sa.tofile(f)  # little-endian int32 on every platform numpy builds for
            f.flush()
            os.fsync(f.fileno())
        del sa
        np.save(self.files[2], np.asarray(self.starts, dtype=np.int64))
        np.save(self.files[3], first_token_buckets(self.counts, self.width))
        for p in self.files[2:]:
            with open(p, "rb+") as f:
                os.fsync(f.fileno())
        self.sorted = True
        return SuffixArray.load(self.prefix)

    def abort(self) -> None:
        """Close and delete what was written."""
        if not self._f.closed:
            self._f.close()
        for p in self.files:
            p.unlink(missing_ok=True)


def sequence_bounds(starts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each sequence, its separator included."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.empty_like(starts)
    if len(starts):
        ends[:-1] = starts[1:]
        ends[-1] = n
    return starts, ends


def tombstone_ranks(sa: SuffixArray, dead_seqs: np.ndarray, sa_file: str | os.PathLike | None = None) -> np.ndarray:
    """Sorted ``sa`` ranks of every suffix that starts inside one of the sequences ``dead_seqs``.

    One pass over ``sa`` in chunks: a position is dead when it falls in one of the sorted, disjoint
    intervals, which ``searchsorted`` tells by the parity of the bound it lands after. With ``sa_file``
    (the segment's ``.sa``) the chunks are read from it rather than from the mapping, whose pages would
    stay resident in the process (4 bytes per token of the segment counted in its RSS after a delete).
    """
    if len(dead_seqs) == 0 or sa.num_suffixes == 0:
        return np.zeros(0, dtype=np.int32)
    starts, ends = sequence_bounds(sa.starts, sa.num_suffixes)
    dead_seqs = np.unique(np.asarray(dead_seqs, dtype=np.int64))
    s, e = starts[dead_seqs], ends[dead_seqs]
    bounds = np.empty(2 * len(s), dtype=np.int64)
    bounds[0::2], bounds[1::2] = s, e
    out = []
    for a, chunk in _sa_chunks(sa, sa_file):
        if len(s) <= 4:  # few documents: plain comparisons beat a search
            hit = np.zeros(len(chunk), dtype=bool)
            for lo, hi in zip(s, e, strict=True):
                hit |= (chunk >= lo) & (chunk < hi)
        else:
            hit = np.searchsorted(bounds, chunk, side="right") & 1
        out.append((np.flatnonzero(hit) + a).astype(np.int32))  # 4 bytes per dead suffix, not 8 (a large delete)
    return np.concatenate(out)


def _sa_chunks(sa: SuffixArray, sa_file: str | os.PathLike | None) -> Iterable[tuple[int, np.ndarray]]:
    """``(offset, entries)`` of ``sa`` in steps of ``_SCAN_CHUNK``, read from ``sa_file`` when given."""
    if sa_file is None:
        arr = np.asarray(sa.sa)
        for a in range(0, sa.num_suffixes, _SCAN_CHUNK):
            yield a, arr[a:a + _SCAN_CHUNK]
        return
    with open(sa_file, "rb") as f:
        for a in range(0, sa.num_suffixes, _SCAN_CHUNK):
            yield a, np.fromfile(f, dtype="<i4", count=min(_SCAN_CHUNK, sa.num_suffixes - a))


class _MultiNode:
    """A node of the union of several segments: one ``SANode`` per segment holding the path."""

    __slots__ = ("parts", "count")

    def __init__(self, parts: list[SANode]) -> None:
        self.parts = parts
        self.count = sum(p.count for p in parts)

    def children(self, min_count: int) -> list[tuple[int, int, _MultiNode | SANode]]:
        parts = self.parts
        per = max(1, -(-min_count // len(parts)))  # pigeonhole: see the module docstring
        found: dict[int, list[SANode | None]] = {}
        complete = []  # parts whose every child is listed (a missing token is absent, no search needed)
        for i, p in enumerate(parts):
            full = per == 1 or p.hi - p.lo <= _SMALL_PART
            complete.append(full)
            for tok, _, node in p.children(1 if full else per):
                found.setdefault(tok, [None] * len(parts))[i] = node
        out = []
        for tok in sorted(found):
            nodes = found[tok]
            kids = []
            for i, node in enumerate(nodes):
                if node is None and not complete[i]:
                    node = parts[i].child(tok)
                if node is not None and node.count > 0:
                    kids.append(node)
            child = kids[0] if len(kids) == 1 else _MultiNode(kids)
            out.append((tok, child.count, child))
        return out

    def chain(self, max_len: int) -> tuple[list[int], _MultiNode]:
        chained = [p.chain(max_len) for p in self.parts]
        common = common_prefix([r for r, _ in chained])
        if not common:
            return [], self
        step = len(common)
        # each part's own node after its run spans only its live suffixes (tombstones at the edges may not
        # share the run); the combined node goes ``step`` tokens down in it
        return common, _MultiNode([SANode(q.owner, q.lo, q.hi, p.depth + step)
                                   for p, (_, q) in zip(self.parts, chained, strict=True)])


def _union(parts: list[SANode | PosNode]) -> _MultiNode | PosNode:
    """One node of the same path in several segments: a node of all their occurrences when they are at most
    ``_POS_UNION`` (children and runs read at each, no search), else a :class:`_MultiNode` of ranges."""
    if sum(p.count for p in parts) <= _POS_UNION:
        return PosNode([oc for p in parts for oc in p.occurrences()], parts[0].depth,
                        min(p.limit if isinstance(p, PosNode) else p.owner.sort_depth for p in parts))
    return _MultiNode([p.range_node() if isinstance(p, PosNode) else p for p in parts])


class SegmentSet(LongestMatchLookups):
    """The document index of one tokenizer: several segments looked up as one (see the module docstring).

    Same lookup interface as :class:`~index.suffix_array.SuffixArray` (``match``-free: ``speculate``,
    ``continuations``, ``count``, ``num_tokens``), so the suffix proposer reads either.
    """

    def __init__(self, segments: Sequence[SuffixArray], live_tokens: int | None = None,
                 live_sequences: int | None = None) -> None:
        # largest first: the longest match is most often found there, the others need ~2 probes each
        self.segments = sorted(segments, key=lambda s: -s.num_tokens)
        self.sort_depth = min((s.sort_depth for s in self.segments), default=DEFAULT_SORT_DEPTH)
        self._live_tokens = live_tokens
        self._live_sequences = live_sequences

    @property
    def num_tokens(self) -> int:
        """Tokens of live documents (separators excluded)."""
        if self._live_tokens is not None:
            return self._live_tokens
        return sum(s.num_tokens for s in self.segments)

    @property
    def num_sequences(self) -> int:
        if self._live_sequences is not None:
            return self._live_sequences
        return sum(s.num_sequences for s in self.segments)

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.segments)

    def node(self, context: Sequence[int], max_depth: int = 64,
             hint: int | None = None) -> tuple[int, SANode | _MultiNode | None]:
        """Longest suffix of ``context`` in any segment and the combined node of its occurrences."""
        best, parts = 0, []
        packs: dict[tuple[int, int], tuple[int, bytes | None]] = {}  # the context packed once per layout
        for seg in self.segments:
            layout = (seg.width, seg.sort_depth)
            packed = packs.get(layout)
            if packed is None:
                packed = packs[layout] = seg.packed_tail(context, max_depth)
            L, node = seg.node(context, max_depth, hint if best == 0 else None, at_least=best, packed=packed)
            if node is None or node.count == 0:
                continue
            if L > best:
                best, parts = L, [node]
            elif L == best:
                parts.append(node)
        if not parts:
            return 0, None
        return best, (parts[0] if len(parts) == 1 else _union(parts))

    def count(self, pattern: Sequence[int]) -> int:
        return sum(s.count(pattern) for s in self.segments)

    def sequences(self) -> list[list[int]]:
        """Every live sequence (tests, small corpora): per segment in file order, tombstones left out."""
        out = []
        for seg in self.segments:
            dead = set(np.asarray(seg.sa)[np.asarray(seg.dead)].tolist()) if len(seg.dead) else set()
            starts, ends = sequence_bounds(seg.starts, seg.num_suffixes)
            text = np.asarray(seg.text)
            for s, e in zip(starts, ends, strict=True):
                if int(s) not in dead:
                    out.append(text[s:e - 1].astype(np.int64).tolist())
        return out


# ----- merge policy ------------------------------------------------------------------------------------
@dataclass
class MergePolicy:
    """When segments are merged (tiered, as LSM stores do).

    Segments are grouped in tiers by live size (``fanout`` times larger per tier; everything under
    ``floor_tokens`` is tier 0). A tier holding ``fanout`` segments is merged into one of the next tier,
    as long as the result stays under ``max_tokens``; a segment with more than ``max_dead`` of its
    tokens tombstoned is rewritten (its dead documents dropped).
    """

    fanout: int = 4  # segments of one tier merged at once
    floor_tokens: int = 1 << 20  # segments smaller than this are all tier 0
    max_tokens: int = 128 << 20  # no merge produces a segment larger than this (memory: ~10 bytes/token)
    max_dead: float = 0.3  # rewrite a segment once this fraction of its tokens is tombstoned
    max_segments: int = 3  # above this many segments, the smallest are merged too (every lookup asks each)
    max_skew: float = 4.0  # ... if the largest of them is at most this many times the rest together
    full: float = 0.75  # a compaction leaves segments of at least this fraction of max_tokens alone
    idle_compact_s: float | None = 60.0  # compact this long after the last write (background merges); None: never

    def tier(self, tokens: int) -> int:
        return 0 if tokens < self.floor_tokens else 1 + int(math.log(tokens / self.floor_tokens, self.fanout))

    def plan(self, segments: Iterable[SegmentInfo]) -> list[list[int]]:
        """Groups of segment ids to merge (disjoint), smallest first."""
        segments = list(segments)
        by_tier: dict[int, list[SegmentInfo]] = {}
        out: list[list[int]] = []
        for s in sorted(segments, key=lambda s: (s.live_tokens, s.id)):
            if s.tokens and s.dead_tokens > self.max_dead * s.tokens and s.live_tokens >= self.max_tokens // 2:
                out.append([s.id])  # large and mostly dead: rewrite alone
                continue
            by_tier.setdefault(self.tier(s.live_tokens), []).append(s)
        for _, group in sorted(by_tier.items()):
            while len(group) >= self.fanout:
                take, total = [], 0
                for s in group:
                    if total + s.live_tokens > self.max_tokens and take:
                        break
                    take.append(s)
                    total += s.live_tokens
                    if len(take) == self.fanout:
                        break
                if len(take) < 2:
                    break
                out.append([s.id for s in take])
                group = [s for s in group if s not in take]
            for s in group:  # mostly-dead small segments go with the next merge of their tier anyway
                if s.tokens and s.dead_tokens > self.max_dead * s.tokens and not any(s.id in g for g in out):
                    out.append([s.id])
        return out + self._fewer(segments, out)

    def compaction(self, segments: Iterable[SegmentInfo]) -> list[int]:
        """Segment ids to rewrite as the fewest segments of at most ``max_tokens`` (filled in turn), or []
        when that would not lower their number. Segments already at least ``full`` of ``max_tokens`` (and
        not mostly tombstones) stay as they are, so a compaction after a small add rewrites the part that
        is not full, not the whole corpus.

        Worked example (``max_tokens`` 128M, ``full`` 0.75): segments of 69M, 68M and 63M: none is full,
        their 200M fit in 2 segments: all three are rewritten as 128M + 72M. Later, a 1M segment beside
        those: the 128M one is full; 72M + 1M fit in one: those two are rewritten.
        """
        rest = [s for s in segments
                if s.live_tokens < self.full * self.max_tokens or s.dead_tokens > self.max_dead * s.tokens]
        need = max(1, math.ceil(sum(s.live_tokens for s in rest) / self.max_tokens))
        if len(rest) <= need:
            return []
        return [s.id for s in sorted(rest, key=lambda s: s.id)]

    def _fewer(self, segments: Iterable[SegmentInfo], planned: list[list[int]]) -> list[list[int]]:
        """Merges of the smallest segments while there are more than ``max_segments`` (balanced ones only:
        a small segment is not merged into a much larger one, which would rewrite it for every add)."""
        busy = {i for g in planned for i in g}
        count = len(list(segments)) - sum(len(g) - 1 for g in planned)
        free = sorted((s for s in segments if s.id not in busy), key=lambda s: (s.live_tokens, s.id))
        out = []
        while count > self.max_segments and len(free) >= 2:
            take, total = [free[0]], free[0].live_tokens
            for s in free[1:]:
                if total + s.live_tokens > self.max_tokens or s.live_tokens > self.max_skew * total:
                    break
                take.append(s)
                total += s.live_tokens
                if count - (len(take) - 1) <= self.max_segments:
                    break
            if len(take) < 2:
                break
            out.append([s.id for s in take])
            count -= len(take) - 1
            free = free[len(take):]
        return out


@dataclass
class SegmentInfo:
    """A segment as the store lists it."""

    id: int  # row id in the ``segments`` table
    name: str  # file prefix inside the arrays directory
    tokens: int  # tokens in the files (tombstoned ones included, separators not)
    dead_tokens: int = 0  # tokens of tombstoned documents
    sequences: int = 0  # documents in the files
    dead_sequences: int = 0  # of which tombstoned
    width: int = 2  # bytes per stored token
    dead_file: str | None = None  # file name of the tombstones (None: none)
    extra: dict = field(default_factory=dict)

    @property
    def live_tokens(self) -> int:
        return self.tokens - self.dead_tokens
