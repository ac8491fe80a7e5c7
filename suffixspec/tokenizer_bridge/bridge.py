"""`TokenBridge`: everything a different-vocabulary draft model needs from the two tokenizers.

API (all ids are plain ints; nothing here knows about models)::

    bridge = TokenBridge.cached(target_tok, draft_tok)    # tables built once per tokenizer pair
    ctx = bridge.draft_context(prompt_target_ids)          # draft ids kept in step with the target
    ctx.push_target(new_target_ids)                        # target appended tokens -> draft ids
    tr = bridge.translate(target_context, draft_new_ids)   # draft tokens -> target ids for the new tail
    tr.target_ids, tr.rest, tr.eos
    bridge.siblings(tr.target_ids[-1], tr.rest, k=3)       # boundary lattice: alternatives for the last token
    bridge.map_q(q_draft)                                  # [..., draft_vocab] -> [..., target_vocab]
    bridge.coverage().to_dict()

Worked example (target byte-level BPE, draft Metaspace)::

    target context   ["def", "Ġf", "(", "x", "):", "Ċ"]         text "def f(x):\\n"
    draft proposes   ["\\t", "r", "et", "ur", "n", "▁x"]         bytes b"\\treturn x"
    translate        ["ĉ", "ret", "urn", "Ġx"]                  (only the window "):\\n" is re-encoded)
    siblings("Ġx")   ["Ġx", ...tokens starting with " x"]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from suffixspec.tokenizer_bridge.intersection import Coverage, VocabIntersection
from suffixspec.tokenizer_bridge.lattice import BoundaryLattice
from suffixspec.tokenizer_bridge.text import DEFAULT_WINDOW, IncrementalEncoder, translate_tail
from suffixspec.tokenizer_bridge.vocab import VocabTable

_TABLES: dict[int, tuple[Any, VocabTable]] = {}  # id(tokenizer) -> (tokenizer kept alive, table)
_BRIDGES: dict[tuple[int, int, int, int], TokenBridge] = {}


def vocab_table(tokenizer: Any) -> VocabTable:
    """The cached :class:`VocabTable` of a tokenizer object."""
    hit = _TABLES.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer:
        hit = (tokenizer, VocabTable(tokenizer))
        _TABLES[id(tokenizer)] = hit
    return hit[1]


@dataclass
class Translation:
    """Draft tokens translated into target tokens for the new tail."""

    target_ids: list[int]  # target ids spelling the draft's text (after the target context)
    rest: bytes  # draft bytes not translated (an unfinished UTF-8 character, or unspellable)
    eos: bool  # the draft ended with its end-of-sequence token (target EOS appended to target_ids)
    draft_used: int  # how many draft tokens were read (up to and including EOS / the first special)


class DraftContext:
    """Draft-vocabulary ids for the target's context, updated incrementally as the target appends.

    Target text tokens are turned into bytes and re-encoded with the draft tokenizer over a
    look-behind window; target special tokens map to the draft's special with the same role or
    text (or are dropped). ``ids`` may be rewritten from some position on; callers keep a KV cache
    in step by cropping it to the common prefix.
    """

    def __init__(self, bridge: TokenBridge, prompt_ids: Sequence[int]) -> None:
        self.bridge = bridge
        self.encoder = IncrementalEncoder(bridge.draft, bridge.draft_prefix_ids(), bridge.window)
        bos = getattr(bridge.target_tokenizer, "bos_token_id", None)
        start = 1 if prompt_ids and bos is not None and prompt_ids[0] == bos else 0  # the draft has its own BOS
        self.push_target(list(prompt_ids[start:]))

    @property
    def ids(self) -> list[int]:
        return self.encoder.ids

    @property
    def pending(self) -> bytes:
        """Target bytes not yet in ``ids`` (the target's text ends inside a UTF-8 character)."""
        return self.encoder.pending

    def push_target(self, target_ids: Sequence[int]) -> None:
        """The target context grew by ``target_ids``."""
        tv = self.bridge.target
        run: list[bytes] = []
        for t in target_ids:
            b = tv.token_bytes[t] if 0 <= t < tv.size else None
            if b is not None:
                run.append(b)
                continue
            self.encoder.append_bytes(b"".join(run))
            run = []
            d = self.bridge.special_to_draft.get(int(t))
            if d is not None:
                self.encoder.append_special(d)
        self.encoder.append_bytes(b"".join(run))


class TokenBridge:
    """Translation tables between a target tokenizer and a draft tokenizer (build with ``cached``)."""

    def __init__(self, target_tokenizer: Any, draft_tokenizer: Any, window: int = DEFAULT_WINDOW,
                 target_size: int | None = None, draft_size: int | None = None) -> None:
        """``target_size``/``draft_size``: the models' logits widths when they exceed ``len(tokenizer)``."""
        self.target_tokenizer = target_tokenizer
        self.draft_tokenizer = draft_tokenizer
        self.target = vocab_table(target_tokenizer)
        self.draft = self.target if draft_tokenizer is target_tokenizer else vocab_table(draft_tokenizer)
        self.window = window
        self.target_size = max(target_size or 0, self.target.size)
        self.draft_size = max(draft_size or 0, self.draft.size)
        self._lattice: BoundaryLattice | None = None
        self._intersection: VocabIntersection | None = None
        self.target_eos = _eos_ids(target_tokenizer)
        self.draft_eos = _eos_ids(draft_tokenizer)
        self.special_to_draft = self._special_map()

    @classmethod
    def cached(cls, target_tokenizer: Any, draft_tokenizer: Any, target_size: int | None = None,
               draft_size: int | None = None) -> TokenBridge:
        """One bridge per (target, draft) tokenizer pair and sizes, built on first use."""
        key = (id(target_tokenizer), id(draft_tokenizer), target_size or 0, draft_size or 0)
        hit = _BRIDGES.get(key)
        if hit is None or hit.target_tokenizer is not target_tokenizer or hit.draft_tokenizer is not draft_tokenizer:
            hit = cls(target_tokenizer, draft_tokenizer, target_size=target_size, draft_size=draft_size)
            _BRIDGES[key] = hit
        return hit

    @classmethod
    def from_pretrained(cls, target: str, draft: str) -> TokenBridge:
        """Load both tokenizers exactly as ``transformers`` does (local path or hub id)."""
        from transformers import AutoTokenizer

        return cls.cached(AutoTokenizer.from_pretrained(target), AutoTokenizer.from_pretrained(draft))

    # -- tables built on first use ---------------------------------------------------------------
    @property
    def lattice(self) -> BoundaryLattice:
        if self._lattice is None:
            self._lattice = BoundaryLattice(self.target)
        return self._lattice

    @property
    def intersection(self) -> VocabIntersection:
        if self._intersection is None:
            self._intersection = VocabIntersection(self.target, self.draft, self.target_size, self.draft_size)
        return self._intersection

    @property
    def same_vocabulary(self) -> bool:
        """Both tokenizers spell every id identically (a same-vocabulary draft needs no bridge)."""
        return self.target.token_bytes == self.draft.token_bytes and self.target.special_ids == self.draft.special_ids

    def coverage(self) -> Coverage:
        return self.intersection.coverage()

    def map_q(self, q_draft: Any) -> Any:
        """Draft distribution(s) restricted and renormalized onto the target vocabulary."""
        return self.intersection.map_q(q_draft)

    # -- text level --------------------------------------------------------------------------------
    def draft_prefix_ids(self) -> list[int]:
        """Special ids the draft tokenizer puts before any text (its BOS), as the draft model expects."""
        tok = self.draft_tokenizer
        with_special = tok.encode("a", add_special_tokens=True)
        plain = tok.encode("a", add_special_tokens=False)
        n = len(with_special) - len(plain)
        return list(with_special[:n]) if n > 0 and with_special[n:] == plain else []

    def draft_context(self, prompt_target_ids: Sequence[int]) -> DraftContext:
        return DraftContext(self, prompt_target_ids)

    def translate(self, target_context: Sequence[int], draft_ids: Sequence[int], skip: bytes = b"") -> Translation:
        """Target ids for the text of ``draft_ids`` continuing ``target_context`` (which stays fixed).

        Reading stops at the first draft special token; the draft's EOS becomes the target's EOS.
        ``skip``: bytes the draft text must start with that the target context already holds (the
        target ended inside a UTF-8 character, see ``DraftContext.pending``); if the draft text
        does not start with them, nothing is translated.
        """
        dv = self.draft
        data: list[bytes] = []
        used, eos = 0, False
        for d in draft_ids:
            used += 1
            b = dv.token_bytes[d] if 0 <= d < dv.size else None
            if b is None:
                eos = d in self.draft_eos
                break
            data.append(b)
        text = b"".join(data)
        if skip:
            if not text.startswith(skip):
                return Translation([], text, False, used)
            text = text[len(skip) :]
        r = translate_tail(self.target, target_context, text, self.window)
        ids = list(r.new_ids)
        if eos and not r.rest and self.target_eos:
            ids.append(min(self.target_eos))
        return Translation(ids, r.rest, eos, used)

    def siblings(self, last_token: int, rest: bytes = b"", k: int = 3, scores: Sequence[float] | None = None) -> list[int]:
        """Up to ``k`` target tokens other than ``last_token`` that begin the same text and go on.

        The draft text ends somewhere inside a word; ``last_token`` spells its final piece. Tokens
        whose spelling starts with that piece (plus any untranslated ``rest``) are the likely ways
        the target writes the word, so they are offered as siblings of ``last_token``.
        """
        b = self.target.token_bytes[last_token] if 0 <= last_token < self.target.size else None
        if not b:
            return []
        return self.lattice.completions(b + rest, k=k, scores=scores, exclude=(last_token,))

    def _special_map(self) -> dict[int, int]:
        """Target special id -> draft special id (same role or same text)."""
        out: dict[int, int] = {}
        d_by_text = {str(v.content): int(k) for k, v in (getattr(self.draft_tokenizer, "added_tokens_decoder", {}) or {}).items()}
        for k, v in (getattr(self.target_tokenizer, "added_tokens_decoder", {}) or {}).items():
            if str(v.content) in d_by_text:
                out[int(k)] = d_by_text[str(v.content)]
        for t in self.target_eos:
            if self.draft_eos and t not in out:
                out[t] = min(self.draft_eos)
        return out


def _eos_ids(tokenizer: Any) -> set[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list) else {int(eos)}
