"""Compile-on-first-use for the project's small C kernels (exact attention, block-quantized products).

A C source beside this file is compiled once per machine with ``cc`` (or ``$CC``) and the given flags into
``$SUFFIXSPEC_CACHE/native/<stem>-<hash>.so``: the hash covers the source, the compiler, the flags, the machine
and its CPU's instruction set flags (``-march=native`` code for one CPU must not load on another). The file is
written to a temporary name and renamed into place, so concurrent starts never load half a file. A build also
removes the same kernel's libraries untouched for ``STALE_DAYS`` (older sources, flags or CPUs: an upgrade leaves
one behind). No build step at install and no torch headers: the libraries are loaded with ctypes.

Example: ``load(Path(__file__).with_name("blockq.c"), ("-O3", "-march=native", "-fPIC", "-shared"))`` -> a
``ctypes.CDLL``; RuntimeError (with the compiler's message) where it does not build."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path


def cpuinfo_line(field: str) -> str:
    """The first line of ``/proc/cpuinfo`` that starts with ``field`` (``"model name"``, ``"flags"``), whole;
    "" where there is none (another OS). Example: ``cpuinfo_line("flags")`` -> ``"flags\t\t: fpu vme ..."``."""
    try:
        return next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(field)), "")
    except OSError:
        return ""


STALE_DAYS = 30  # a kernel's other libraries not modified for this long are removed at its next build


def prune(target: Path, days: float = STALE_DAYS) -> list[Path]:
    """Remove the libraries of ``target``'s kernel (``<stem>-*.so`` beside it) other than ``target`` that were not
    modified for ``days``; returns them. A library in use stays usable (an unlinked file lives on while mapped);
    one still wanted is rebuilt at its next load. Errors (another process removing it first) are ignored."""
    import time

    stem = target.name.rsplit("-", 1)[0]
    cutoff = time.time() - days * 86400
    removed = []
    for old in target.parent.glob(f"{stem}-*.so"):
        try:
            if old != target and old.stat().st_mtime < cutoff:
                old.unlink()
                removed.append(old)
        except OSError:
            pass
    return removed


def library_path(source: Path, flags: Sequence[str], compiler: str) -> Path:
    """Where ``source`` compiled by ``compiler`` with ``flags`` is cached on this machine."""
    from suffixspec.gguf_cache import cache_dir

    key = hashlib.sha256(Path(source).read_bytes() + " ".join((compiler, *flags)).encode()
                         + platform.machine().encode() + cpuinfo_line("flags").encode()).hexdigest()[:16]
    return cache_dir() / "native" / f"{Path(source).stem}-{key}.so"


def build(source: Path, flags: Sequence[str], compiler: str | None = None) -> Path:
    """The compiled library's path, compiling it first where it is not cached. Raises RuntimeError with the
    compiler's message (or why it could not run)."""
    source = Path(source)
    compiler = compiler or os.environ.get("CC") or "cc"
    target = library_path(source, flags, compiler)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *flags, "-o", tmp, str(source), "-lm"], capture_output=True, text=True,
                              timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed on {source.name}: {done.stderr.strip()[-800:]}")
        os.replace(tmp, target)
        prune(target)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"could not compile {source.name} with {compiler!r}: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load(source: Path, flags: Sequence[str], compiler: str | None = None) -> ctypes.CDLL:
    """``build`` then load: the library as a ``ctypes.CDLL``. Raises RuntimeError or OSError."""
    return ctypes.CDLL(str(build(source, flags, compiler)))
