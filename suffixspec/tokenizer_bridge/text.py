"""Text-level translation between tokenizers with a look-behind window (universal assisted generation).

Only the new tail is re-encoded: the last few tokens of the context (the *window*) are turned back
into bytes, the new bytes are appended, and the result is encoded again. Where the new encoding
starts with the window's own tokens, the rest is the translation of the tail.

Worked example (target = byte-level BPE, window of 2)::

    context ids  [..., "Ġreturn", "Ġa"]     window bytes b" return a"
    new bytes    b" + b\\n"                  (decoded from the draft model's tokens)
    encode(b" return a + b\\n") -> ["Ġreturn", "Ġa", "Ġ+", "Ġb", "Ċ"]
    window tokens match -> new target ids ["Ġ+", "Ġb", "Ċ"]

When the encoding would re-split the window (``"ba"`` + ``"r"`` -> ``"bar"``), a context we may
rewrite (the draft model's own context) keeps the common prefix and replaces the rest; a fixed
context (tokens the target already emitted) keeps its tokens and the tail is encoded on its own.
Bytes that end inside a UTF-8 character are held back (``rest``) until the character completes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from suffixspec.tokenizer_bridge.vocab import VocabTable, utf8_complete_prefix

DEFAULT_WINDOW = 6  # look-behind tokens
MIN_WINDOW_BYTES = 12  # ...and at least this many bytes, so the pre-tokenizer sees the word it splits
MAX_WINDOW = 64  # never look further back than this many tokens


def window_start(vocab: VocabTable, ids: Sequence[int], window: int = DEFAULT_WINDOW) -> int:
    """Index where the look-behind window over ``ids`` starts.

    The window holds at least ``window`` tokens and ``MIN_WINDOW_BYTES`` bytes when the context
    allows, starts on a UTF-8 character boundary, never includes a special token, and for
    tokenizers that prepend a space prefers a token that begins with a space (so that encoding the
    window's text adds no extra space).
    """
    n = len(ids)
    start = n
    nbytes = 0
    while start > 0 and n - start < MAX_WINDOW:
        tb = vocab.token_bytes[ids[start - 1]] if 0 <= ids[start - 1] < vocab.size else None
        if tb is None:  # special token: the window stops after it
            break
        start -= 1
        nbytes += len(tb)
        if n - start >= window and nbytes >= MIN_WINDOW_BYTES and _good_start(vocab, tb, True):
            return start
    # ran into the context start, a special token or MAX_WINDOW: move forward to a good start
    first = start
    while start < n and not _good_start(vocab, vocab.token_bytes[ids[start]] or b"", False):
        start += 1
    if vocab.prepends_space:
        spaced = start
        while spaced < n and not _good_start(vocab, vocab.token_bytes[ids[spaced]] or b"", True):
            spaced += 1
        # a window at the very start of the text needs no leading space (encode_exact drops a lone one)
        if spaced < n or start != first:
            start = spaced if spaced < n else start
    return start


def _good_start(vocab: VocabTable, tb: bytes, want_space: bool) -> bool:
    if not tb or (tb[0] & 0xC0) == 0x80:  # empty, or starts inside a UTF-8 character
        return False
    return not (want_space and vocab.prepends_space) or tb[:1] == b" "


@dataclass
class Retokenized:
    """Result of appending bytes to a context: ``ids[:keep] + new_ids`` spells context + new bytes."""

    keep: int  # how many context tokens stay as they are
    new_ids: list[int]  # tokens that follow ids[:keep]
    rest: bytes  # new bytes not yet encoded (an unfinished UTF-8 character at the end)
    exact: bool  # the tokenizer itself produced new_ids (False: greedy fallback split)


def retokenize(vocab: VocabTable, ids: Sequence[int], data: bytes, window: int = DEFAULT_WINDOW,
               approximate: bool = False) -> Retokenized:
    """Encode ``data`` appended to ``ids``, re-encoding only the look-behind window.

    ``approximate``: where no exact spelling exists (a normalizer rewrites the text, a character
    no token spells), fall back to the tokenizer's plain encoding (may contain ``<unk>``).
    """
    start = window_start(vocab, ids, window)
    left = vocab.bytes_of(list(ids[start:]))
    combined = left + data
    cut = utf8_complete_prefix(combined)
    if cut <= len(left):  # nothing complete to add yet
        return Retokenized(len(ids), [], data, True)
    enc = vocab.encode_exact(combined[:cut])
    rest = combined[cut:]
    if enc is None:  # normalization changed the text: encode the new part alone
        return _alone(vocab, ids, combined[len(left) : cut], rest, approximate)
    lcp = 0
    win = ids[start:]
    while lcp < len(win) and lcp < len(enc) and enc[lcp] == win[lcp]:
        lcp += 1
    return Retokenized(start + lcp, list(enc[lcp:]), rest, True)


def translate_tail(vocab: VocabTable, ids: Sequence[int], data: bytes, window: int = DEFAULT_WINDOW) -> Retokenized:
    """Tokens for ``data`` continuing a *fixed* context ``ids`` (tokens already emitted stay).

    ``keep`` is always ``len(ids)``. If re-encoding would re-split the context's last tokens, the
    new bytes are encoded on their own (what the model must emit after the tokens it already has).
    """
    r = retokenize(vocab, ids, data, window)
    if r.keep == len(ids):
        return r
    resplit = len(vocab.bytes_of(list(ids[r.keep :])))  # bytes of the tokens the encoding wanted to re-split
    new = vocab.bytes_of(r.new_ids)[resplit:]  # the re-encoding spells those bytes, then the new ones
    return _alone(vocab, ids, new, r.rest)


def _alone(vocab: VocabTable, ids: Sequence[int], new: bytes, rest: bytes, approximate: bool = False) -> Retokenized:
    enc = vocab.encode_exact(new) if new and (new[0] & 0xC0) != 0x80 else None
    if enc is not None:
        return Retokenized(len(ids), enc, rest, True)
    if approximate and new:
        # exact bytes in a non-canonical split beat canonical tokens that spell something else
        split = vocab.split_longest(new)
        if vocab.bytes_of(split) == new:
            return Retokenized(len(ids), split, rest, False)
        enc = vocab.encode_text(new.decode("utf-8", errors="ignore"))
        if vocab.prepends_space and new[:1] != b" " and enc and vocab.token_bytes[enc[0]] == b" ":
            enc = enc[1:]
        return Retokenized(len(ids), enc, rest, False)
    split = vocab.split_longest(new)
    done = len(vocab.bytes_of(split))
    return Retokenized(len(ids), split, new[done:] + rest, False)


class IncrementalEncoder:
    """A token sequence of one tokenizer kept equal to a growing byte string, re-encoding only the tail.

    Used for the draft model's context: the target appends tokens, their bytes are appended here,
    and the draft's ids are rewritten from the first token that changes (so its KV cache can be
    cropped to the common prefix).

    >>> enc = IncrementalEncoder(vocab, prefix_ids=[bos])   # doctest: +SKIP
    >>> enc.append_bytes(b"def f")    # ids -> [bos, "▁def", "▁f"]
    """

    def __init__(self, vocab: VocabTable, prefix_ids: Sequence[int] = (), window: int = DEFAULT_WINDOW) -> None:
        self.vocab = vocab
        self.window = window
        self.ids: list[int] = list(prefix_ids)  # current token ids
        self.pending = b""  # bytes of an unfinished UTF-8 character, not yet in ids

    def append_bytes(self, data: bytes) -> int:
        """Append text bytes; returns how many old ids were kept (the rest were rewritten)."""
        if not data:
            return len(self.ids)
        r = retokenize(self.vocab, self.ids, self.pending + data, self.window, approximate=True)
        del self.ids[r.keep :]
        self.ids.extend(r.new_ids)
        self.pending = r.rest
        return r.keep

    def append_special(self, token: int) -> None:
        """Append a special token (it ends the window; pending bytes are dropped)."""
        self.pending = b""
        self.ids.append(token)
