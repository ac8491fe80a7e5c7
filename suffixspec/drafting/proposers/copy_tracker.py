"""Following where a suffix draft's output copies the request's own text, and resuming the copy after an edit.

:class:`CopyTracker` (one per request of :class:`~suffixspec.drafting.proposers.suffix.SuffixProposer`) notes
where the output copies the request's text, drafts where a copy interrupted by an edit picks up again, and
re-applies the edits it learned to later drafts (a rename applied all over a file costs one miss). Also here:
the continuation-rate kind of its drafts (:data:`RESUME`, with its match length and prior) and the helpers
that read tokens as text (:func:`token_text`) and identifiers in it (:func:`ends_with_word`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from suffixspec.index.incremental import IncrementalIndex
from suffixspec.index.speculate import SpecResult
from suffixspec.index.suffix_array_build import SEP

# The kind of a resumed copy's drafts (SpecResult.kind): it learns continuation rates of its own.
RESUME = "resume"
# The match length a resumed copy's tokens count as (CopyTracker.drafts: the copy ran before the edit),
# and the prior of its rates: its first token (the guess where the copy picks up) is right about one
# time in ten on SmolLM2's own code edits (16 of 100 replayed; the model rewrites more than it
# renames), and past it the copy goes on less surely than a long match. Replayed with the verify cost
# curve, a prior of 0.3 for the first token lost 4% on SmolLM2's code edits against no resume at
# all; 0.1 loses nothing there and gains 28% on the edits written as asked (the rename applied).
RESUME_MATCH = 8
RESUME_PRIOR = (0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.75, 0.8, 0.85, 0.9, 0.92, 0.94)


class CopyTracker:
    """Follows where the output copies the request's own text, and drafts where a copy interrupted
    by an edit picks up again.

    While every new token equals the text at the tracked position ``at``, the copy goes on. When one
    differs, the copy was interrupted at ``resume`` (an inserted or replaced word). From then on, for
    up to ``window`` new tokens, :meth:`drafts` proposes chains that resume the copy: from the next
    position after an occurrence of the last written token within ``window`` tokens of ``resume``
    (the edit is over and the copy went on with that token) and from ``resume`` itself (the edit ends
    now). A copy is picked up after a step that added 4 or more tokens (a draft was accepted), at the
    newest occurrence of the longest match of at least 4 tokens.

    Worked example: the prompt holds ``def f(local): return local + 1`` and the output has copied
    ``def f(local`` (``at`` points at ``)``); the target writes ``_v2`` instead: ``resume`` = the
    position of ``)``. After the output ``... local_v2``, a draft ``) : return local + 1`` starting
    at ``resume`` is proposed; it is accepted to the next rename.

    When the copy picks up again, the edit is learned (the text it skipped and what was written
    instead, after the token that preceded it: here "after ``local``, insert ``_v2``") and applied
    to later drafts copied from the request (:meth:`apply`): the next ``local`` of the copy is
    drafted as ``local_v2``, so a rename applied all over a file costs one miss, not one per place.
    With the tokens' texts (``token_bytes``), an insertion at the end of an identifier is learned as
    that word's: the tokenizer splits ``frame`` as `` frame`` after a space and ``frame`` after ``(``,
    so "after the token `` frame``, insert ``_value``" would miss ``derive_context(frame)``; "after the
    word ``frame`` (a whole identifier: no letter, digit or ``_`` before or after it), insert
    ``_value``" drafts it.
    """

    def __init__(self, window: int = 16, token_bytes: Sequence[bytes | None] | None = None) -> None:
        self.window = window
        self.token_bytes = token_bytes  # each token's text (VocabTable.token_bytes): edits learned as words
        self.at: int | None = None  # position in the request index the next output token should copy
        self.resume: int | None = None  # where an interrupted copy stood
        self.starts: list[int] = []  # the resume positions drafted at the last step
        self.written: list[int] = []  # the tokens written since the interruption
        self.edits: list[tuple[int, list[int], list[int]]] = []  # learned (after token, removed, inserted)
        self.applied: list[tuple[list[int], int, tuple[int, list[int], list[int]]]] = []  # (draft, at, edit)
        # an insertion at the end of an identifier, by the identifier's text: "frame" -> "frame_value" is drafted
        # wherever the copy holds the word "frame", whichever token ends it (" frame", "(frame", "frame")
        # (an attribute, ".frame", only where the renamed one was one: a local's rename leaves obj.frame alone)
        self.words: dict[tuple[int, tuple[int, ...], tuple[int, ...]], bytes] = {}

    @staticmethod
    def _follow(index: IncrementalIndex, pos: int, new: list[int], end: int) -> int:
        """How many of ``new`` equal the text from ``pos`` on (before ``end``)."""
        text = index.tokens(pos, min(end, pos + len(new)))
        k = 0
        while k < len(text) and text[k] == new[k]:
            k += 1
        return k

    def update(self, index: IncrementalIndex, n: int, new: list[int], depth: int) -> None:
        """``new`` tokens are about to be appended to ``index``, which holds ``n`` tokens."""
        if not new:
            return
        starts = [self.at] if self.at is not None else (self.starts if self.resume is not None else [])
        k, j = max(((self._follow(index, s, new, n), s) for s in starts), default=(0, None))
        if j is not None and k and self.at is None:
            self._learn(index, j)  # an interrupted copy picked up again at j
        for toks, at, edit in self.applied:  # an edit the output did not repeat is forgotten (newest evidence)
            hit = 0
            while hit < min(len(toks), len(new)) and toks[hit] == new[hit]:
                hit += 1
            if at <= hit < min(len(new), at + len(edit[2]) + 1) and edit in self.edits:
                self.edits.remove(edit)
                self.words.pop(_edit_key(edit), None)
        self.applied = []
        if j is not None and k == len(new):
            self.at, self.resume = j + k, None  # the copy goes on (or picked up again)
        elif j is not None and (k or self.at is not None):
            self.at, self.resume, self.written = None, j + k, new[k:]  # interrupted after k tokens
        elif self.resume is not None:
            self.written += new
            if len(self.written) > self.window:
                self.resume = None
        self.starts = []
        if self.at is None and self.resume is None and len(new) >= 4:
            context = index.tokens(max(0, n - depth), n) + new
            length, ends = index.match(context, depth)
            if length >= 4 and ends and ends[0] < n:
                self.at = ends[0]

    def drafts(self, index: IncrementalIndex, context: Sequence[int], budget: int) -> list[SpecResult]:
        """Chains resuming an interrupted copy (see the class docstring); none while copying."""
        if self.resume is None or budget <= 0:
            self.starts = []
            return []
        r, n = self.resume, len(index)
        end = max(r, n - len(self.written))  # the interruption's own tokens are no source
        after = [j + 1 for j, tok in enumerate(index.tokens(r, min(end, r + self.window)), r)
                 if tok == context[-1]][:2]
        self.starts = [j for j in after if j < end] + [r]
        out = []
        for start, prob in zip(self.starts, (0.3, 0.2, 0.1), strict=False):
            run = index.tokens(start, min(end, start + budget))
            if SEP in run:
                run = run[:run.index(SEP)]
            if run:
                out.append(SpecResult(run, list(range(-1, len(run) - 1)), [prob] * len(run), prob * len(run),
                                      RESUME_MATCH, RESUME))
        return out

    def _learn(self, index: IncrementalIndex, start: int) -> None:
        """The copy interrupted at ``resume`` went on at ``start``: remember the edit (what of the text
        between them was replaced by what was written), keyed by the token before the interruption."""
        if self.resume is None or self.resume == 0:
            return
        src, out = index.tokens(self.resume, start), list(self.written)
        while src and out and src[-1] == out[-1]:  # the resumed copy's first tokens are no part of the edit
            src.pop()
            out.pop()
        edit = (index.tokens(self.resume - 1, self.resume)[0], src, out)
        if (src or out) and len(src) + len(out) <= self.window and edit not in self.edits:
            self.edits = [*self.edits[-3:], edit]
            word = self._word_before(index, self.resume) if not src and out else None
            if word and is_word_byte(self._text(out)[:1]):
                self.words[_edit_key(edit)] = word

    def _text(self, tokens: Sequence[int]) -> bytes:
        return token_text(self.token_bytes or (), tokens)

    def _word_before(self, index: IncrementalIndex, pos: int) -> bytes | None:
        """The identifier the request's text ends with before ``pos``, if one ends there (None without the
        tokens' texts, or where the text at ``pos`` goes on with the same identifier)."""
        if not self.token_bytes:
            return None
        before = self._text(index.tokens(max(0, pos - 8), pos))
        after = self._text(index.tokens(pos, pos + 1))
        m = _WORD_END.search(before)
        if m is None or is_word_byte(after[:1]) or m.start() == 0 and pos > 8:
            return None  # no identifier ends here, or it may begin before the 8 tokens read
        dotted = m.start() > 0 and before[m.start() - 1:m.start()] == b"."
        return b"." + m.group() if dotted else m.group()

    def apply(self, res: SpecResult, context: Sequence[int]) -> None:
        """Apply the learned edits to a chain draft copied from the request (in place, same length)."""
        if not self.edits or any(par != i - 1 for i, par in enumerate(res.parents)):
            return
        src, probs = res.token_ids, res.probs
        toks: list[int] = []
        new_probs: list[float] = []
        words = self.words if self.token_bytes else {}
        text = self._text(context[-8:]) if words else b""  # what the draft continues, as text (word edits)
        i = -1  # -1: the context's last token, after which the draft starts
        while i < len(src) and len(toks) < len(src):
            if i >= 0:
                toks.append(src[i])
                new_probs.append(probs[i])
                if words:
                    text += self._text(src[i:i + 1])
            key = src[i] if i >= 0 else context[-1]
            prob = probs[max(0, i)]
            rest = src[i + 1:]
            for after, removed, inserted in self.edits:
                if rest[len(removed):len(removed) + len(inserted)] == inserted or rest[:len(removed)] != removed:
                    continue
                word = words.get(_edit_key((after, removed, inserted)))
                if (key == after if word is None else  # a word's edit: wherever the identifier ends, only there
                        rest and ends_with_word(text, word) and not is_word_byte(self._text(rest[:1])[:1])):
                    self.applied.append((toks, len(toks), (after, removed, inserted)))
                    toks.extend(inserted)
                    new_probs.extend([prob] * len(inserted))
                    if words:
                        text += self._text(inserted)
                    i += len(removed)
                    break
            i += 1
        n = len(src)
        res.token_ids, res.probs = toks[:n], new_probs[:n]
        res.parents = list(range(-1, len(res.token_ids) - 1))
        res.score = sum(res.probs)


def token_text(token_bytes: Sequence[bytes | None], ids: Sequence[int]) -> bytes:
    """The tokens' texts joined (``VocabTable.token_bytes``); a special or unknown token is ``\\xff``, a byte
    no UTF-8 text holds."""
    return b"".join((token_bytes[t] if 0 <= t < len(token_bytes) else None) or b"\xff" for t in ids)


_WORD_END = re.compile(rb"[A-Za-z0-9_]+\Z")  # the identifier a text ends with (ASCII: code's names)


def is_word_byte(b: bytes) -> bool:
    """Whether ``b`` (one byte, or empty) is a letter, digit or underscore."""
    return len(b) == 1 and (b.isalnum() or b == b"_")


def ends_with_word(text: bytes, word: bytes) -> bool:
    """Whether ``text`` ends with the identifier ``word`` as a whole (no letter, digit or ``_`` before it);
    a ``word`` that starts with ``.`` is an attribute, and one that does not is never an attribute."""
    if word[:1] == b".":
        return text.endswith(word)
    before = text[-len(word) - 1:-len(word)]
    return text.endswith(word) and not is_word_byte(before) and before != b"."


def _edit_key(edit: tuple[int, list[int], list[int]]) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    return edit[0], tuple(edit[1]), tuple(edit[2])
