"""Incremental, UTF-8-safe detokenization with stop strings and per-character provenance.

Byte-level BPE can split one character over several tokens ("🙂" = 4 byte tokens); decoding such
a partial sequence yields U+FFFD. Text is released only once it decodes cleanly, and text that
could still become a stop string is held back until it cannot.

Worked example: stop = ["\\n\\n"], tokens decode to "a", "\\n", "\\n" -> after "a\\n" only "a" is
released ("\\n" may start the stop string); after the next "\\n" the stop is found, the output is
"a" and the request finishes with reason "stop".
"""

from __future__ import annotations

from typing import Any


class TextTracker:
    """Builds the output text token by token; finds stop strings; releases safe text with sources."""

    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.max_stop = max((len(s) for s in stop), default=0)
        self.tokens: list[int] = []
        self.text = ""  # decoded text so far (truncated at a stop string once found)
        self.segments: list[tuple[int, str]] = []  # (end offset in text, source) runs
        self.released = 0  # characters of ``text`` already handed out
        self._seg = 0  # first segment not yet fully released
        self._prefix = 0  # token offset where the decode window starts
        self._read = 0  # token offset up to which text has been produced
        self.stopped = False

    def _decode(self, toks: list[int]) -> str:
        return self.tokenizer.decode(toks, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token: int, source: str) -> bool:
        """Append one token; returns True when a stop string has just been completed."""
        self.tokens.append(token)
        prefix_text = self._decode(self.tokens[self._prefix : self._read])
        new_text = self._decode(self.tokens[self._prefix :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return False  # incomplete character (or a token with no text): wait for more
        delta = new_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self.tokens)
        start = len(self.text)
        self.text += delta
        self.segments.append((len(self.text), source))
        if self.stop:
            window_start = max(0, start - self.max_stop + 1)
            hits = [i for s in self.stop if (i := self.text.find(s, window_start)) >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                return True
        return False

    def releasable(self, final: bool) -> int:
        """End offset of the text that can be handed out now."""
        if final or not self.stop:
            return len(self.text)
        # hold back a tail that is a proper prefix of some stop string
        for k in range(min(self.max_stop - 1, len(self.text) - self.released), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stop):
                return len(self.text) - k
        return len(self.text)

    def release(self, final: bool = False) -> list[tuple[str, str]]:
        """New (text piece, source) pairs since the last release."""
        end = self.releasable(final)
        pieces: list[tuple[str, str]] = []
        while self._seg < len(self.segments) and self.released < end:
            seg_end, source = self.segments[self._seg]
            hi = min(seg_end, end)
            if self.released < hi:
                piece = self.text[self.released : hi]
                if pieces and pieces[-1][1] == source:
                    pieces[-1] = (pieces[-1][0] + piece, source)
                else:
                    pieces.append((piece, source))
                self.released = hi
            if seg_end <= end:
                self._seg += 1
            else:
                break
        return pieces
