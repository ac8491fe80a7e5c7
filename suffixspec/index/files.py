"""Walking paths for ``index add``: text files in; everything else skipped with a reason.

What is skipped, and why:

- symlinks whose target lies outside the given paths (``/etc/passwd`` linked into a docs folder
  must not be indexed under that name) unless ``follow_links=True``; dangling links and link loops;
- FIFOs, sockets and devices (opening a FIFO would block the walk forever);
- binary files, judged from their first bytes (a NUL byte or invalid UTF-8 in the first 8 KiB), so
  a 1 GB binary costs one 8 KiB read and a 3 MB ``.so`` is reported as binary, not as too large;
- text files larger than ``max_bytes``;
- empty files, and files of whitespace only (``py.typed``, ``REQUESTED``): nothing to draft from.

Example: with ``docs/`` holding ``a.md``, ``logo.png`` and ``secrets -> /etc/passwd``,
``[read_text(c) for c in walk(["docs"])]`` gives ``a.md`` with its text, ``logo.png`` skipped as
``binary`` and ``secrets`` skipped as ``symlink outside the given paths``.
"""

from __future__ import annotations

import codecs
import errno
import fnmatch
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BYTES = 2 * 1024 * 1024  # files larger than this are skipped (generated code, data dumps)
_SNIFF = 8192  # bytes read to detect binary content
_SKIP_DIRS = {"__pycache__", "node_modules"}

# Kinds of skip, as counted in the summary of ``index add``.
BINARY = "binary"
TOO_LARGE = "too large"
EMPTY = "empty"
UNREADABLE = "unreadable"
LINK_OUTSIDE = "symlink outside the given paths"
LINK_DANGLING = "dangling symlink"
LINK_LOOP = "symlink loop"
NOT_REGULAR = "not a regular file"


@dataclass
class FileCandidate:
    """One file found under the given paths (or an entry the walk already knows it must skip)."""

    path: Path  # absolute path of the file indexed (a followed link's target); the link itself when skipped
    size: int  # bytes on disk (0 when skipped)
    skip_kind: str | None = None  # one of the kinds above when the walk itself rejects the entry
    skip_detail: str = ""  # what the user needs to know about that skip (the link's target, the file type)


@dataclass
class FileText:
    """A readable text file, or why it was skipped."""

    path: Path
    text: str | None  # None when skipped
    skip_reason: str | None = None  # "binary", "too large (N bytes > M)", "symlink outside ...: -> /etc/passwd"
    skip_kind: str | None = None  # the kind alone (BINARY, TOO_LARGE, ...), for counting


def _skip(path: Path, kind: str, detail: str = "") -> FileCandidate:
    return FileCandidate(path, 0, kind, detail)


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "special file"


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def _real(p: Path) -> Path:
    """``p`` resolved as far as it resolves (a named path may itself be a broken link)."""
    try:
        return p.resolve()
    except (RuntimeError, OSError):
        return p.absolute()


def _resolve_link(p: Path) -> tuple[Path | None, str | None]:
    """(target, None) for a link that resolves, else (None, LINK_LOOP or LINK_DANGLING)."""
    try:
        return p.resolve(strict=True), None
    except RuntimeError:  # Python < 3.13 reports a loop this way
        return None, LINK_LOOP
    except OSError as e:
        return None, LINK_LOOP if e.errno == errno.ELOOP else LINK_DANGLING


def walk(paths: Sequence[str | os.PathLike], globs: Sequence[str] = (), *,
         follow_links: bool = False, exclude: Sequence[str] = ()) -> Iterator[FileCandidate]:
    """Files under ``paths`` (recursively, sorted), keeping names matching any of ``globs`` (all if none).

    Hidden directories (``.git``, ``.venv``), ``__pycache__`` and ``node_modules`` are not entered
    unless named directly, nor directories whose name matches one of ``exclude``; files whose name
    matches one of ``exclude`` are left out (``exclude=["test*", "tests"]`` leaves a package's tests
    out: ``tests/``, ``test/``, ``test_utils.py``). A path named directly is taken as given, even through a symlink; links
    found inside are followed only when their target is inside one of ``paths`` (directories inside
    are walked at their real place, once) or when ``follow_links`` is set. Every file is yielded
    once, by its resolved path. Entries that cannot be indexed (links out of the tree, dangling
    links, loops, FIFOs, sockets, devices) are yielded with ``skip_kind`` set so callers can say so.
    """
    named = [Path(p).expanduser() for p in paths]
    for root in named:
        if not os.path.lexists(root):
            raise FileNotFoundError(f"no such file or directory: {root}")
    roots = [_real(r) for r in named]  # where links may point without --follow-links
    seen: set[Path] = set()  # files yielded and directories walked, by real path

    def file_entry(p: Path, real: Path) -> Iterator[FileCandidate]:
        try:
            st = real.stat()
        except OSError as e:
            yield _skip(p, UNREADABLE, str(e))
            return
        if not stat.S_ISREG(st.st_mode):
            yield _skip(p, NOT_REGULAR, _file_type(st.st_mode))
        elif real not in seen:
            seen.add(real)
            yield FileCandidate(real, st.st_size)

    def matches(dirpath: str, name: str) -> bool:
        if excluded(name):
            return False
        return not globs or any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(os.path.join(dirpath, name), g)
                                for g in globs)

    def excluded(name: str) -> bool:
        return any(fnmatch.fnmatch(name, x) for x in exclude)

    def walk_dir(top: Path) -> Iterator[FileCandidate]:
        seen.add(top.resolve())
        for dirpath, dirnames, filenames in os.walk(top):  # never follows links itself: we decide below
            keep = []
            for d in sorted(dirnames):
                if d.startswith(".") or d in _SKIP_DIRS or excluded(d):
                    continue
                p = Path(dirpath, d)
                if not p.is_symlink():
                    keep.append(d)
                    continue
                real, broken = _resolve_link(p)
                here = Path(dirpath).resolve()
                if broken:
                    yield _skip(p, broken)
                elif here == real or here.is_relative_to(real):
                    yield _skip(p, LINK_LOOP, f"-> {real}")  # a link to an ancestor: walking it never ends
                elif _within(real, roots):
                    continue  # a directory inside the given paths: walked at its real place
                elif not follow_links:
                    yield _skip(p, LINK_OUTSIDE, f"-> {real}")
                elif real not in seen:
                    yield from walk_dir(p)
            dirnames[:] = keep
            for name in sorted(filenames):
                if not matches(dirpath, name):
                    continue
                p = Path(dirpath, name)
                if p.is_symlink():
                    real, broken = _resolve_link(p)
                    if broken:
                        yield _skip(p, broken)
                        continue
                    if not follow_links and not _within(real, roots):
                        yield _skip(p, LINK_OUTSIDE, f"-> {real}")
                        continue
                    yield from file_entry(p, real)
                else:
                    yield from file_entry(p, p.resolve())

    for root, real in zip(named, roots, strict=True):
        if root.is_symlink() and not root.exists():
            yield _skip(root, _resolve_link(root)[1] or LINK_DANGLING)
        elif real.is_dir():
            if real not in seen:
                yield from walk_dir(root)
        else:
            yield from file_entry(root, real)


def read_text(cand: FileCandidate, max_bytes: int = DEFAULT_MAX_BYTES) -> FileText:
    """The file's UTF-8 text, or a skip reason.

    Binary is judged first, from the first 8 KiB only (a NUL byte, or bytes that are not UTF-8),
    then the size: a large binary is "binary", a large text file "too large"; a file with no text but
    whitespace is "empty".
    """
    if cand.skip_kind is not None:
        reason = cand.skip_kind + (f" ({cand.skip_detail})" if cand.skip_detail else "")
        if cand.skip_kind == LINK_OUTSIDE:
            reason += "; pass --follow-links to index it"
        return FileText(cand.path, None, reason, cand.skip_kind)
    try:
        # O_NONBLOCK: a file swapped for a FIFO since the walk must not hang the add (no effect on files)
        fd = os.open(cand.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return FileText(cand.path, None, f"{NOT_REGULAR} ({_file_type(st.st_mode)})", NOT_REGULAR)
            head = f.read(_SNIFF)
            if b"\x00" in head:
                return FileText(cand.path, None, BINARY, BINARY)
            try:  # incremental: a character cut at the end of the sniff is not an error
                codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
            except UnicodeDecodeError:
                return FileText(cand.path, None, f"{BINARY} (not UTF-8)", BINARY)
            if st.st_size > max_bytes:
                return FileText(cand.path, None, f"{TOO_LARGE} ({st.st_size} bytes > {max_bytes})", TOO_LARGE)
            data = head + f.read()
    except OSError as e:
        return FileText(cand.path, None, f"{UNREADABLE}: {e}", UNREADABLE)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return FileText(cand.path, None, f"{BINARY} (not UTF-8)", BINARY)
    if not text.strip():
        return FileText(cand.path, None, EMPTY if not text else f"{EMPTY} (whitespace only)", EMPTY)
    return FileText(cand.path, text)
