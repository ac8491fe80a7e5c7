"""How much of an output is a loop: small models repeat themselves under greedy decoding, and a
loop is easy to draft, so every benchmark table says how much of each output loops and has a twin
restricted to the outputs that do not.

Two measures per output:

- ``distinct_4grams``: distinct 4-grams / 4-grams (1.0: no 4-gram repeats; a loop of period 3
  drives it towards 3 / n);
- ``loop_share``: the share of tokens inside a repeated period: token ``i`` is in a loop when it
  equals token ``i - p`` for a period ``p <= max_period`` along a run of at least
  ``max(min_run, p)`` tokens (the period's block written once more, in full, right after itself).

An output *loops* when its ``loop_share`` is at least :data:`LOOPING`.

Worked example: ``a b c d x y x y x y x y x y x y x y x y`` (4 + 16 tokens): from the second ``x y``
on each token equals the one 2 back, a run of 14 tokens at period 2; with ``min_run=8`` those 14 are
in a loop: ``loop_share = 14 / 20 = 0.7``; the 4-grams are ``a b c d``, ``b c d x``, ``c d x y``,
``d x y x`` and then only ``x y x y`` and ``y x y x``: 6 distinct of 17.
"""

from __future__ import annotations

from collections.abc import Sequence

LOOPING = 0.2  # an output with at least this share of its tokens inside a repeated period loops


def distinct_ngrams(tokens: Sequence[int], n: int = 4) -> float:
    """Distinct ``n``-grams / ``n``-grams (1.0 for an output shorter than ``n + 1`` tokens)."""
    total = len(tokens) - n + 1
    if total <= 1:
        return 1.0
    return len({tuple(tokens[i:i + n]) for i in range(total)}) / total


def loop_mask(tokens: Sequence[int], max_period: int = 64, min_run: int = 16) -> list[bool]:
    """Per token: inside a repeated period (see the module docstring)."""
    n = len(tokens)
    mask = [False] * n
    for p in range(1, min(max_period, n // 2) + 1):
        need = max(min_run, p)
        run = 0
        for i in range(p, n + 1):
            if i < n and tokens[i] == tokens[i - p]:
                run += 1
                continue
            if run >= need:
                for j in range(i - run, i):
                    mask[j] = True
            run = 0
    return mask


def loop_share(tokens: Sequence[int], max_period: int = 64, min_run: int = 16) -> float:
    """Share of ``tokens`` inside a repeated period (0.0 for an empty output)."""
    if not tokens:
        return 0.0
    return sum(loop_mask(tokens, max_period, min_run)) / len(tokens)


def loops(tokens: Sequence[int]) -> bool:
    """Does this output loop (``loop_share >= LOOPING``)?"""
    return loop_share(tokens) >= LOOPING
