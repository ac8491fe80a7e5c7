"""Progress of long work on stderr: a live bar on a terminal, plain lines anywhere else.

A bar redraws its line with carriage returns, and nested bars (``transformers``' while it dequantizes
a GGUF file and loads the weights) move the cursor up with escape codes. On a terminal that is a bar;
in a log file, a CI log or a pipe it is a mess of ``\\r`` and ``\\x1b[A``. So where stderr is not a
terminal :func:`progress_bar` gives a :class:`LineProgress`, which writes one plain line when the status
changes (and every ``every_s`` seconds at most while only the count moves), and turns the bars of
``transformers`` off while it is open when the work runs it.

Example, off a terminal::

    bar = progress_bar(total=4, desc="converting x (once)")
    bar.set_postfix_str("reading the file")      # -> "converting x (once): 0/4 reading the file"
    bar.update()
    bar.set_postfix_str("building the tokenizer")  # -> "converting x (once): 1/4 building the tokenizer"
    bar.close()                                  # -> "converting x (once): 1/4 done"

On a terminal the same calls drive a ``tqdm`` bar (its keywords pass through).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (a closed or odd stream is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class LineProgress:
    """``tqdm``'s interface as our commands use it (``update``, ``set_postfix_str``, ``close``, ``with``),
    written as plain lines: no carriage return, no escape code."""

    def __init__(self, total: float | None = None, desc: str = "", stream: TextIO | None = None,
                 every_s: float = 10.0, unit: str = "", unit_scale: bool = False, libraries: bool = False,
                 disable: bool = False, **_ignored: Any) -> None:
        self.total = total  # the count at the end (bytes, tokens, steps), or None when not known
        self.desc = desc  # what is going on: the start of every line
        self.stream = stream or sys.stderr  # read at construction: a test's captured stderr is honoured
        self.every_s = every_s  # the longest silence while the count moves and the status does not
        self.unit = unit  # the count's unit ("B", "tok"; steps have none)
        self.unit_scale = unit_scale  # counts as 1.2M rather than 1234567
        self.disable = disable  # write nothing (tqdm's disable=True)
        self.n: float = 0  # the count so far
        self.status = ""  # the last status (set_postfix_str)
        self._last_line_at = time.monotonic()
        self._closed = False
        # libraries: the work runs transformers, whose own bars are turned off meanwhile (then restored)
        self._library_bars = _library_bars_off() if libraries and not disable else None

    def _count(self, n: float) -> str:
        if not self.unit_scale:
            return f"{n:g}"
        for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if n >= scale:
                return f"{n / scale:.1f}{suffix}"
        return f"{n:g}"

    def _line(self, status: str) -> None:
        if self.disable:
            return
        unit = self.unit if self.unit_scale else ""  # "3.1MB/8.2MB"; a count of steps: "2/4"
        count = self._count(self.n) + unit + (f"/{self._count(self.total)}{unit}" if self.total else "")
        self.stream.write(f"{self.desc}: {count} {status}".rstrip() + "\n")
        self.stream.flush()
        self._last_line_at = time.monotonic()

    def update(self, n: float = 1) -> None:
        self.n += n
        if time.monotonic() - self._last_line_at >= self.every_s:
            self._line(self.status)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        changed = s != self.status
        self.status = s
        if changed and refresh:
            self._line(s)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._line("done")
            _library_bars_restore(self._library_bars)

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def progress_bar(stream: TextIO | None = None, libraries: bool = False, **kw: Any) -> Any:
    """A ``tqdm`` bar on ``stream`` (stderr) when it is a terminal, else a :class:`LineProgress` with the
    same keywords (``total``, ``desc``, ``unit``, ``unit_scale``; the others are tqdm's looks).
    ``libraries``: the work runs ``transformers``, whose bars are then off while a LineProgress is open."""
    stream = stream or sys.stderr
    if is_terminal(stream):
        from tqdm import tqdm

        return tqdm(file=stream, **kw)
    return LineProgress(stream=stream, libraries=libraries, **kw)


# transformers' modules that draw bars with their own ``tqdm`` (not behind its progress-bar switch): the
# GGUF dequantizing loop. Their ``tqdm`` is swapped for a disabled one while a LineProgress is open.
_OWN_TQDM = ("transformers.modeling_gguf_pytorch_utils",)


def _library_bars_off() -> tuple[bool, dict]:
    """Turn ``transformers``' progress bars off (importing it: only work that runs it asks); what to restore:
    whether its switch was on, and the modules' own ``tqdm``."""
    import functools
    import importlib

    from transformers.utils import logging as tf_logging

    was_on = tf_logging.is_progress_bar_enabled()
    tf_logging.disable_progress_bar()
    swapped = {}
    for name in _OWN_TQDM:
        try:
            module = importlib.import_module(name)
        except ImportError:  # another transformers release: nothing of this name to quiet
            continue
        own = getattr(module, "tqdm", None)
        if callable(own) and not getattr(own, "suffixspec_quiet", False):  # a LineProgress inside another: as is
            swapped[name] = own
            module.tqdm = functools.partial(own, disable=True)
            module.tqdm.suffixspec_quiet = True
    return was_on, swapped


def _library_bars_restore(state: tuple[bool, dict] | None) -> None:
    if state is None:
        return
    was_on, swapped = state
    for name, original in swapped.items():
        sys.modules[name].tqdm = original
    if was_on:
        from transformers.utils import logging as tf_logging

        tf_logging.enable_progress_bar()
