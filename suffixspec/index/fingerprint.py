"""Tokenizers as the index sees them, by duck typing (no transformers import here): fingerprints,
batch encoding, and a tokenizer reduced to what the index needs.

One document corpus can serve several target tokenizers: token ids are stored per fingerprint, the
SHA-256 of the tokenizer's full serialized definition (vocabulary, merges, normalizer, added tokens).
Two tokenizers with the same fingerprint produce the same ids for the same text.

A fast tokenizer is, for the index, its Rust backend plus its fingerprint and name
(:class:`BackendTokenizer`): what a writer process receives, and what a store keeps of the tokenizers
it served, so that ``suffixspec index add`` indexes for them without importing ``transformers``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TOKENIZE_BATCH_CHARS = 2_000_000  # text per tokenizer batch: parallel enough, memory bounded
TOKENIZE_BATCH_DOCS = 512


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A 32-hex-digit hash of ``tokenizer``'s vocabulary and configuration.

    Accepts a `transformers` tokenizer (its ``backend_tokenizer``), a `tokenizers.Tokenizer`, any object
    with ``get_vocab()``, or any object with a ``fingerprint`` string attribute (tests, custom tokenizers).
    """
    explicit = getattr(tokenizer, "fingerprint", None)
    if isinstance(explicit, str) and explicit:
        return explicit
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        payload = backend.to_str()
    elif hasattr(tokenizer, "to_str"):
        payload = tokenizer.to_str()
    elif hasattr(tokenizer, "get_vocab"):
        payload = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    else:
        raise TypeError(
            f"cannot fingerprint a {type(tokenizer).__name__}: give it get_vocab(), a backend_tokenizer, "
            "or a `fingerprint` attribute"
        )
    extra = {k: getattr(tokenizer, k, None) for k in ("bos_token", "eos_token", "unk_token")}
    payload += json.dumps(extra, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


def tokenizer_name(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[np.ndarray]:
    """Token ids (uint32) of each text, without special tokens; batched in Rust when possible."""
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        encs = backend.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encs]
    out = []
    for text in texts:
        try:
            ids = tokenizer.encode(text, add_special_tokens=False)
        except TypeError:
            ids = tokenizer.encode(text)
        out.append(np.asarray(ids, dtype=np.uint32))
    return out


def encode_batched(tokenizer: Any, texts: Sequence[str], progress: Callable[[int], None] | None = None,
                   batch_chars: int = TOKENIZE_BATCH_CHARS) -> list[np.ndarray]:
    """Token ids (uint32, no special tokens) of each text, encoded in batches of about ``batch_chars``
    characters (at most ``TOKENIZE_BATCH_DOCS`` texts); ``progress(n)`` after each batch of ``n`` texts.

    A fast tokenizer encodes each batch in parallel in Rust (``encode_batch_fast``: the same ids as
    ``encode_batch`` without computing character offsets); others go through ``encode_texts``.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)
    out: list[np.ndarray] = []
    i = 0
    while i < len(texts):
        j, size = i, 0
        while j < len(texts) and (j == i or (size < batch_chars and j - i < TOKENIZE_BATCH_DOCS)):
            size += len(texts[j])
            j += 1
        chunk = list(texts[i:j])
        if fast is not None:
            out.extend(np.asarray(e.ids, dtype=np.uint32) for e in fast(chunk, add_special_tokens=False))
        else:
            out.extend(encode_texts(tokenizer, chunk))
        if progress:
            progress(j - i)
        i = j
    return out


class FingerprintCache:
    """``tokenizer_fingerprint`` remembered per tokenizer object: hashing a vocabulary takes ~20 ms, and
    every reload of the document index asks again; a tokenizer that grew (``add_tokens``) is hashed anew."""

    def __init__(self) -> None:
        self._seen: list[tuple[Any, int, str]] = []  # (tokenizer, its length, fingerprint), the last four

    def __call__(self, tokenizer: Any) -> str:
        size = len(tokenizer) if hasattr(tokenizer, "__len__") else -1
        for tok, n, fp in self._seen:
            if tok is tokenizer and n == size:
                return fp
        fp = tokenizer_fingerprint(tokenizer)
        self._seen = [*self._seen[-3:], (tokenizer, size, fp)]
        return fp


@dataclass
class BackendTokenizer:
    """What the index needs of a fast tokenizer: its Rust backend, fingerprint and name (same ids and
    fingerprint as the full tokenizer; pickled to a writer process, kept in a store, loaded without
    importing ``transformers``)."""

    backend_tokenizer: Any  # tokenizers.Tokenizer
    fingerprint: str  # tokenizer_fingerprint of the full tokenizer (its special tokens included)
    name_or_path: str

    @classmethod
    def from_json(cls, backend_json: str, fingerprint: str, name: str) -> BackendTokenizer:
        """Rebuild one from :meth:`to_json` (imports the ``tokenizers`` library, not ``transformers``)."""
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(backend_json), fingerprint, name)

    def to_json(self) -> str:
        return self.backend_tokenizer.to_str()


def backend_only(tokenizer: Any) -> BackendTokenizer | None:
    """``tokenizer`` as a :class:`BackendTokenizer` when it is a fast tokenizer (else None)."""
    if isinstance(tokenizer, BackendTokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_batch_fast") or not hasattr(backend, "to_str"):
        return None
    return BackendTokenizer(backend, tokenizer_fingerprint(tokenizer), tokenizer_name(tokenizer))
