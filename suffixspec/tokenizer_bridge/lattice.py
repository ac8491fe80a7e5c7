"""Boundary lattice: which target tokens can start, span or complete a piece of draft text.

The draft's text rarely ends on a boundary the target would choose: the draft stops after
``"ba"`` where the target writes ``"bar"``. An Aho-Corasick automaton (pyahocorasick) over the
target vocabulary's byte spellings answers three questions:

- :meth:`BoundaryLattice.starts` -- tokens whose bytes are a prefix of the text (the tokens the
  target could emit first), longest first;
- :meth:`BoundaryLattice.completions` -- tokens whose bytes *start with* the unfinished tail
  (``"ba"`` -> ``"bar"``, ``"base"``, ``"back"``), ranked; the draft tree offers them as siblings;
- :meth:`BoundaryLattice.spans` -- every vocabulary token occurring in the text, as
  ``(start, end, token)`` edges: the full segmentation lattice.

Bytes are mapped one-to-one onto the code points U+0100..U+01FF for the automaton's string keys,
so partial UTF-8 (half an emoji) is an ordinary key and no byte collides with a wildcard.

Worked example (vocabulary ``{"b", "ba", "bar", "base", "ar"}``)::

    starts(b"bar!")      -> ["bar", "ba", "b"]
    completions(b"ba")   -> ["bar", "base"]          # shortest extension first (or by scores)
    spans(b"bar")        -> [(0,1,"b"), (0,2,"ba"), (0,3,"bar"), (1,3,"ar")]
"""

from __future__ import annotations

from collections.abc import Sequence

import ahocorasick

from suffixspec.tokenizer_bridge.vocab import VocabTable

_OFFSET = 0x100


def _key(data: bytes) -> str:
    return "".join(chr(_OFFSET + b) for b in data)


class BoundaryLattice:
    """Aho-Corasick automaton over one vocabulary's token bytes (build once per vocabulary)."""

    def __init__(self, vocab: VocabTable, max_scan: int = 4096) -> None:
        self.vocab = vocab
        self.max_scan = max_scan  # completions() inspects at most this many candidates before ranking
        groups: dict[bytes, list[int]] = {}
        for tid, b in enumerate(vocab.token_bytes):
            if b:
                groups.setdefault(b, []).append(tid)
        self.automaton = ahocorasick.Automaton(ahocorasick.STORE_ANY, ahocorasick.KEY_STRING)
        for b, ids in groups.items():
            self.automaton.add_word(_key(b), (len(b), tuple(ids)))
        self.automaton.make_automaton()

    def starts(self, data: bytes) -> list[int]:
        """Tokens whose bytes are a prefix of ``data``, longest first (lowest id among equal spellings)."""
        out: list[int] = []
        key = _key(data[: self.vocab.max_token_bytes])
        for n in range(len(key), 0, -1):
            hit = self.automaton.get(key[:n], None)
            if hit is not None:
                out.append(hit[1][0])
        return out

    def completions(self, prefix: bytes, k: int = 8, scores: Sequence[float] | None = None,
                    exclude: Sequence[int] = ()) -> list[int]:
        """Up to ``k`` tokens whose bytes start with ``prefix`` (the prefix itself included), ranked.

        Ranking: by ``scores[token]`` descending when given (e.g. a draft distribution mapped onto
        this vocabulary), else shortest extension first, then lowest id (BPE merges frequent pairs
        first, so low ids are common tokens).
        """
        if not prefix or k <= 0:
            return []
        skip = set(exclude)
        cands: list[tuple[int, int]] = []  # (length, id)
        for n, (_, (length, ids)) in enumerate(self.automaton.items(_key(prefix))):
            if n >= self.max_scan:
                break
            tid = ids[0]
            if tid not in skip:
                cands.append((length, tid))
        if scores is not None:
            cands.sort(key=lambda c: (-float(scores[c[1]]) if c[1] < len(scores) else 0.0, c[0], c[1]))
        else:
            cands.sort()
        return [tid for _, tid in cands[:k]]

    def spans(self, data: bytes) -> list[tuple[int, int, int]]:
        """Every token occurring in ``data`` as ``(start, end, token)`` byte spans, sorted by start."""
        out: list[tuple[int, int, int]] = []
        for end, (length, ids) in self.automaton.iter(_key(data)):
            out.append((end + 1 - length, end + 1, ids[0]))
        out.sort()
        return out
