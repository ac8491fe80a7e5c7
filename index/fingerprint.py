"""Tokenizer fingerprints and batch encoding, by duck typing (no transformers import here).

One document corpus can serve several target tokenizers: token ids are stored per fingerprint, the
SHA-256 of the tokenizer's full serialized definition (vocabulary, merges, normalizer, added tokens).
Two tokenizers with the same fingerprint produce the same ids for the same text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np


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
