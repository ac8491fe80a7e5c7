"""How a suffix array's tokens are laid out, and how the array is built: packing, sorting, the bucket table.

Layout: the sequences are concatenated, each followed by a separator; tokens are stored big-endian,
2 bytes each when every id is below ``SEP16 = 0xFFFF`` (the separator then), else 4 bytes with
``SEP = 2**32 - 1``. Comparing raw bytes compares token sequences (a match never crosses a separator
because no real token equals it). ``sa`` lists every suffix start in sorted order as int32: 6 bytes
per indexed token with 16-bit ids, 8 with 32-bit ones. It is built by libdivsufsort over the bytes
(:func:`sort_suffixes`), about 10 bytes of memory per token at the peak for 16-bit ids. The
first-token bucket table (:func:`first_token_buckets`) gives where each first token's suffixes start
in ``sa``, so a lookup bisects inside one bucket.

Worked example: sequences ``[5 6 7]`` and ``[5 6 8]`` give the text ``5 6 7 SEP 5 6 8 SEP``
(:func:`concat_with_separators`: 2 bytes a token, the sequences start at 0 and 4).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

SEP = 0xFFFFFFFF  # sequence separator of 32-bit arrays; never a real token id
SEP16 = 0xFFFF  # the separator of 16-bit arrays (vocabularies of fewer than 65535 ids)
DEFAULT_SORT_DEPTH = 256  # lookups compare at most this many tokens; match + draft depth stays below it
_BUCKET_CAP = 1 << 18  # first-token bucket table entries (2 MiB); an id of 4e9 must not allocate 32 GB
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
