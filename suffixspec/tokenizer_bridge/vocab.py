"""Byte view of a tokenizer's vocabulary: what bytes each token stands for, and exact encoding.

Every tokenizer family spells the same text differently: byte-level BPE writes a space as ``Ġ``
and a newline as ``Ċ`` (GPT-2's byte-to-unicode table), SentencePiece/Metaspace writes a space as
``▁`` and unknown characters as byte-fallback tokens ``<0xE4>``. Comparing tokenizers is only
possible on the *bytes* a token contributes to the decoded text, so :class:`VocabTable` computes
them once per tokenizer.

Worked example (byte-level BPE vs Metaspace)::

    byte-level  "Ġd" -> b" d"    "ä½ł" -> b"\\xe4\\xbd\\xa0" (你)    "ðŁ" -> b"\\xf0\\x9f" (half an emoji)
    Metaspace   "▁de" -> b" de"  "<0xE4>" -> b"\\xe4"

Special tokens (``<s>``, ``<|endoftext|>``) have no bytes (``None``): they are control symbols,
never text.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

SPACE_MARKER = "▁"  # SentencePiece / Metaspace space
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-unicode character -> byte table (inverse of ``bytes_to_unicode``)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


@lru_cache(maxsize=1)
def _byte_level_translation() -> dict[int, str]:
    """``str.translate`` table: byte-level character -> its byte as a latin-1 character; every other
    character below 256 -> U+FFFF (not latin-1: encoding fails, as a lookup in the table would)."""
    table = {ord(c): chr(b) for c, b in byte_level_decoder().items()}
    return {**{o: "\uffff" for o in range(256)}, **table}


def utf8_complete_prefix(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that ends on a UTF-8 character boundary.

    ``b"a\\xe4\\xbd"`` (``a`` + two of the three bytes of 你) -> 1.
    """
    n = len(data)
    i = n - 1
    # walk back over at most 3 continuation bytes to the lead byte of the last character
    while i >= 0 and n - i <= 4 and (data[i] & 0xC0) == 0x80:
        i -= 1
    if i < 0:  # no lead byte at all: invalid UTF-8, nothing to wait for
        return n
    lead = data[i]
    need = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
    return n if n - i >= need else i


def _tokenizer_json(tokenizer: Any) -> dict:
    """The ``decoder`` and ``pre_tokenizer`` specs of a fast tokenizer: only these two, since
    serializing the whole tokenizer (``to_str``) and parsing it took 1.8 s of CPU for Gemma 3's
    262k-token vocabulary, on the first request's first step."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return {}
    try:
        return {key: json.loads(part.__getstate__()) for key in ("decoder", "pre_tokenizer")
                if (part := getattr(backend, key, None)) is not None}
    except Exception:  # pragma: no cover - exotic backends
        return {}


def _component_types(node: Any) -> set[str]:
    """All ``type`` names in a (possibly nested Sequence) normalizer/pre-tokenizer/decoder spec."""
    out: set[str] = set()
    if isinstance(node, dict):
        if "type" in node:
            out.add(node["type"])
        for v in node.values():
            out |= _component_types(v)
    elif isinstance(node, list):
        for v in node:
            out |= _component_types(v)
    return out


class VocabTable:
    """Per-token bytes, special ids and an exact encoder for one tokenizer (build once, reuse).

    Attributes:
        token_bytes: ``token_bytes[i]`` = bytes that token ``i`` adds to decoded text, ``None`` for
            special tokens and ids the tokenizer does not know.
        kind: ``"byte_level"``, ``"metaspace"`` or ``"text"`` (spelling recovered by decoding).
        prepends_space: the tokenizer adds a space before text that does not start with one
            (SentencePiece ``add_dummy_prefix``, Metaspace ``prepend_scheme``).
        prepends_always: ...and even before text that does (Llama's legacy normalizer).
        special_ids: ids of special tokens (no bytes).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        spec = _tokenizer_json(tokenizer)
        decoder_types = _component_types(spec.get("decoder"))
        pre_types = _component_types(spec.get("pre_tokenizer"))
        if "ByteLevel" in decoder_types or "ByteLevel" in pre_types:
            self.kind = "byte_level"
        elif "Metaspace" in decoder_types or "Replace" in decoder_types or "ByteFallback" in decoder_types:
            self.kind = "metaspace"
        else:
            self.kind = "text"
        self.size = max(len(tokenizer), getattr(tokenizer, "vocab_size", 0) or 0)
        self.special_ids: set[int] = set(getattr(tokenizer, "all_special_ids", []) or [])
        for tid, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
            if getattr(added, "special", False):
                self.special_ids.add(int(tid))
        self.token_bytes: list[bytes | None] = self._all_token_bytes()
        self.prepends_space = self._detect_prepend()
        # bytes -> the lowest id spelling them (several ids may spell the same bytes: "a" and <0x61>)
        self.by_bytes: dict[bytes, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b and b not in self.by_bytes:
                self.by_bytes[b] = i
        self.max_token_bytes = max(map(len, self.by_bytes), default=1)

    # -- per-token bytes ---------------------------------------------------------------------
    def _all_token_bytes(self) -> list[bytes | None]:
        tok = self.tokenizer
        out: list[bytes | None] = [None] * self.size
        pieces = self._pieces()
        added = {int(k): v for k, v in (getattr(tok, "added_tokens_decoder", {}) or {}).items()}
        # byte-level spelling -> bytes through str.translate (one C call per token, not one per
        # character): a table character becomes its byte as a latin-1 character; any other becomes
        # U+FFFF, so latin-1 encoding fails exactly where the table has no entry
        table = _byte_level_translation() if self.kind == "byte_level" else None
        for i, piece in enumerate(pieces):
            if piece is None or i in self.special_ids:
                continue
            if i in added:  # non-special added tokens are stored as plain text
                out[i] = str(added[i].content).encode("utf-8")
            elif table is not None:
                try:
                    out[i] = piece.translate(table).encode("latin-1")
                except UnicodeEncodeError:  # not a byte-level spelling (should not happen); keep its text
                    out[i] = piece.encode("utf-8")
            elif self.kind == "metaspace":
                m = _BYTE_FALLBACK.match(piece) if piece.startswith("<0x") else None
                out[i] = bytes([int(m.group(1), 16)]) if m else piece.replace(SPACE_MARKER, " ").encode("utf-8")
            else:
                out[i] = tok.convert_tokens_to_string([piece]).encode("utf-8")
        return out

    def _pieces(self) -> list[str | None]:
        """Each id's token string (None where the tokenizer has none), from one vocabulary dict rather
        than one ``convert_ids_to_tokens`` call per id (1.4 s of CPU for 262k tokens)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return self.tokenizer.convert_ids_to_tokens(list(range(self.size)))
        pieces: list[str | None] = [None] * self.size
        for piece, i in backend.get_vocab(with_added_tokens=True).items():
            if 0 <= i < self.size:
                pieces[i] = piece
        return pieces

    def _detect_prepend(self) -> bool:
        ids = self.tokenizer.encode("a", add_special_tokens=False)
        self.prepends_always = self.bytes_of(self.tokenizer.encode(" a", add_special_tokens=False)) == b"  a"
        return self.bytes_of(ids) == b" a"

    def bytes_of(self, ids: list[int]) -> bytes:
        """Concatenated bytes of ``ids`` (special tokens contribute nothing)."""
        tb = self.token_bytes
        return b"".join(tb[i] or b"" for i in ids if 0 <= i < len(tb))

    # -- exact encoding ----------------------------------------------------------------------
    def encode_exact(self, data: bytes) -> list[int] | None:
        """Token ids whose bytes are exactly ``data`` as this tokenizer would split them, else None.

        Handles tokenizers that prepend a space (``"a"`` -> ``["▁", "a"]``: the lone ``▁`` is
        dropped) and returns None when normalization changes the text or the prepended space is
        fused into the first token (``"def"`` -> ``["▁de", "f"]``).
        """
        if not data:
            return []
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        got = self.bytes_of(ids)
        if got == data and not any(i in self.special_ids for i in ids):
            return ids
        if self.prepends_space and got == b" " + data and ids and self.token_bytes[ids[0]] == b" ":
            return ids[1:]
        if self.prepends_space and data[:1] == b" " and len(data) > 1:
            # tokenizers that prepend even before a space (Llama's legacy SentencePiece): let the
            # tokenizer add the leading space itself
            ids = self.tokenizer.encode(text[1:], add_special_tokens=False)
            if self.bytes_of(ids) == data and not any(i in self.special_ids for i in ids):
                return ids
        return None

    def split_longest(self, data: bytes) -> list[int]:
        """Greedy longest-match split of ``data`` into vocabulary tokens (works on partial UTF-8).

        Not the tokenizer's own split; used where the tokenizer cannot be run (a continuation that
        starts inside a character). Stops early at a byte no token spells.
        """
        out: list[int] = []
        i = 0
        while i < len(data):
            for n in range(min(self.max_token_bytes, len(data) - i), 0, -1):
                tid = self.by_bytes.get(data[i : i + n])
                if tid is not None:
                    out.append(tid)
                    i += n
                    break
            else:
                break
        return out

    def encode_text(self, text: str) -> list[int]:
        """Plain encoding without special tokens (approximate when ``encode_exact`` fails)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def fingerprint(self) -> str:
        """Identifies the vocabulary (name + size + a hash of the token spellings)."""
        import hashlib

        h = hashlib.sha1()
        for b in self.token_bytes:
            h.update(b"\x00" if b is None else b + b"\x01")
        return f"{getattr(self.tokenizer, 'name_or_path', '')}:{self.size}:{h.hexdigest()[:16]}"
