"""Exact attention in one native call per layer: every query of a pass alone, in a fixed order.

An exact weight format (``int8``) promises that a token's logits do not depend on what else its pass holds.
SDPA's CPU kernel rounds a query's result differently when other queries share the call, so through SDPA the
lean forward calls it once per query (``LeanForward._attend_exact``): a verify pass of 17 tree nodes on a
30-layer model is 510 calls, each paying SDPA's and Python's overhead (most of a small model's verify pass).
``exact_attention.c`` computes each (query, key head) in a fixed order over that query's own keys: the cached
positions, then its path's new keys read where the pass packed them (no slot rewrites), so one call per layer
serves the whole pass and each query's result is the same as in a plain step of that token.

The C file is compiled once per machine (``cc -O3 -march=native``, its sources' and flags' hash in the name)
into ``$SUFFIXSPEC_CACHE/native/``, and loaded with ctypes: no build step at install, no torch headers. Where
there is no compiler (or ``SUFFIXSPEC_EXACT_ATTENTION=sdpa``) the lean forward keeps the per-query SDPA calls:
exact too, slower; the choice is made once per process, so both modes of a run use the same one.

Example: ``kernel()`` -> the loaded function, or None (logged once, with the compiler's message)."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import numpy as np
import torch

from suffixspec.core import native

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("exact_attention.c")
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared")
MODES = ("native", "sdpa")


def mode() -> str:
    """``$SUFFIXSPEC_EXACT_ATTENTION``: ``native`` (the default: the compiled kernel where it builds) or ``sdpa``."""
    value = os.environ.get("SUFFIXSPEC_EXACT_ATTENTION", "native").strip().lower() or "native"
    if value not in MODES:
        raise ValueError(f"SUFFIXSPEC_EXACT_ATTENTION={value!r}: use one of {', '.join(MODES)}")
    return value


def build(compiler: str | None = None) -> Path:
    """The compiled library's path, compiling it first where it is not cached (``native.build``: atomically, a
    temporary file renamed into place, so concurrent starts never load half a file). Raises RuntimeError with
    the compiler's message."""
    return native.build(SOURCE, FLAGS, compiler)


@functools.cache
def kernel() -> ctypes._CFuncPtr | None:
    """The native function, or None where this process uses per-query SDPA calls (see the module docstring)."""
    if mode() == "sdpa":
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (RuntimeError, OSError) as e:
        log.warning("exact attention runs per query through SDPA (slower, as exact): %s", e)
        return None
    fn = lib.exact_attention
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [i64, ptr, ptr, ptr, i64, i64, ptr, ptr, i64, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i64,
                   i64, i64, i64, ctypes.c_float, i64, ptr, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def plan(queries: list[tuple[int, int, int, int, list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's arrays for queries ``(packed token, cache row, past, end, path)``: ``path`` is the packed
    tokens at positions ``past .. end - 1`` (the query's ancestors from the root, then itself)."""
    meta = np.empty((len(queries), 5), dtype=np.int64)
    paths: list[int] = []
    for i, (tok, row, past, end, path) in enumerate(queries):
        if len(path) != end - past:
            raise ValueError(f"query {i}: {end - past} new positions but a path of {len(path)}")
        meta[i] = (tok, row, past, end, len(paths))
        paths.extend(path)
    return meta, np.asarray(paths or [0], dtype=np.int64)


def attend(fn: ctypes._CFuncPtr, meta: np.ndarray, path: np.ndarray, q: torch.Tensor, kbuf: torch.Tensor,
           vbuf: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, out: torch.Tensor, scale: float,
           window: int | None, pool: tuple[int, int] | None = None) -> None:
    """Every query of ``meta`` into ``out`` [T, h_q * d]: ``q`` [T, h_q, d], ``k_new``/``v_new`` [T, h_kv, d]
    (the pass's packed keys/values), ``kbuf``/``vbuf`` [rows, h_kv, capacity, d] (the cache), float32 on the
    CPU, each with its last dimension contiguous. ``pool``: (address of blockq's ``bq_parallel``, threads), the
    (query, key head) pairs shared among that many of its threads (``blockq.pool``); None: this thread alone.
    The same bits either way: each pair is computed by one thread, by the same instructions."""
    for name, t in (("q", q), ("kbuf", kbuf), ("vbuf", vbuf), ("k_new", k_new), ("v_new", v_new), ("out", out)):
        if t.dtype != torch.float32 or t.device.type != "cpu" or t.stride(-1) != 1:
            raise ValueError(f"exact attention: {name} must be float32 on the CPU with a contiguous last dim")
    if kbuf.stride() != vbuf.stride() or out.stride(1) != 1:
        raise ValueError("exact attention: keys and values of the cache must share a layout; out must be [T, h_q * d]")
    h_q, d = q.shape[1], q.shape[2]
    h_kv = k_new.shape[1]
    rc = fn(len(meta), meta.ctypes.data, path.ctypes.data, q.data_ptr(), q.stride(0), q.stride(1),
            kbuf.data_ptr(), vbuf.data_ptr(), kbuf.stride(0), kbuf.stride(1), kbuf.stride(2),
            k_new.data_ptr(), k_new.stride(0), k_new.stride(1), v_new.data_ptr(), v_new.stride(0), v_new.stride(1),
            out.data_ptr(), out.stride(0), h_q, h_kv, d, scale, window or 0, *(pool or (None, 1)))
    if rc != 0:
        raise MemoryError("exact attention: out of memory for its score buffer")
