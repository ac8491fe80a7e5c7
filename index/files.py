"""Walking paths for ``index add``: text files in, binary and oversized files skipped with a reason."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BYTES = 2 * 1024 * 1024  # files larger than this are skipped (generated code, data dumps)
_SNIFF = 8192  # bytes read to detect binary content
_SKIP_DIRS = {"__pycache__", "node_modules"}


@dataclass
class FileCandidate:
    """One file found under the given paths."""

    path: Path  # absolute path
    size: int  # bytes on disk


@dataclass
class FileText:
    """A readable text file, or why it was skipped."""

    path: Path
    text: str | None  # None when skipped
    skip_reason: str | None = None  # "binary", "too large (N bytes)", "unreadable: ..."


def walk(paths: Sequence[str | os.PathLike], globs: Sequence[str] = ()) -> Iterator[FileCandidate]:
    """Files under ``paths`` (recursively, sorted), keeping names matching any of ``globs`` (all if none).

    Hidden directories (``.git``, ``.venv``) and ``__pycache__`` are not entered unless named directly.
    """
    for root in paths:
        root = Path(root).expanduser()
        if root.is_file():
            yield FileCandidate(root.resolve(), root.stat().st_size)
            continue
        if not root.is_dir():
            raise FileNotFoundError(f"no such file or directory: {root}")
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS)
            for name in sorted(filenames):
                if globs and not any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(os.path.join(dirpath, name), g)
                                     for g in globs):
                    continue
                p = Path(dirpath, name)
                try:
                    if p.is_file():
                        yield FileCandidate(p.resolve(), p.stat().st_size)
                except OSError:
                    continue


def read_text(cand: FileCandidate, max_bytes: int = DEFAULT_MAX_BYTES) -> FileText:
    """The file's UTF-8 text, or a skip reason (binary: a NUL byte or invalid UTF-8; oversized)."""
    if cand.size > max_bytes:
        return FileText(cand.path, None, f"too large ({cand.size} bytes > {max_bytes})")
    try:
        data = cand.path.read_bytes()
    except OSError as e:
        return FileText(cand.path, None, f"unreadable: {e}")
    if b"\x00" in data[:_SNIFF]:
        return FileText(cand.path, None, "binary")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return FileText(cand.path, None, "binary (not UTF-8)")
    return FileText(cand.path, text)
