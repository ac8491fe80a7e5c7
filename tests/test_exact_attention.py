"""The compiled attention of exact formats (suffixspec.core.exact_attention): each query's result is SDPA's
(within float32 rounding), over the keys a plain step would hold, whatever else shares the call; it is built
once per machine and its absence falls back to per-query SDPA calls. The lean forward's bitwise row
independence with it is tests/test_weights.py::test_int8_logits_of_a_row_do_not_depend_on_the_pass."""

from __future__ import annotations

import logging

import pytest
import torch

from suffixspec.core import exact_attention as E

# (query heads, key heads, head size, window): grouped queries, a head size off the 8-lane vectors, one past
# the 64-column register block, a sliding window shorter than the path
SHAPES = [(9, 3, 64, None), (12, 2, 128, None), (4, 4, 20, 5), (8, 2, 72, 3), (2, 1, 256, None)]


def _reference(q, kbuf, vbuf, k_new, v_new, tok, row, past, path, d, window):
    keys = torch.cat([kbuf[row, :, :past], k_new[path].transpose(0, 1)], 1)
    values = torch.cat([vbuf[row, :, :past], v_new[path].transpose(0, 1)], 1)
    if window:
        keys, values = keys[:, -window:], values[:, -window:]
    return torch.nn.functional.scaled_dot_product_attention(
        q[tok][None, :, None].double(), keys[None].double(), values[None].double(), scale=d ** -0.5,
        enable_gqa=True).reshape(-1).float()


@pytest.mark.parametrize("shape", SHAPES)
def test_each_query_gets_its_own_keys_attention(shape):
    """Two cache rows; row 1 holds a tree (a chain of three and a second child of the root), row 0 a chain of
    two: every query equals SDPA over the cached keys then its own path, in float64, within 2e-5."""
    h_q, h_kv, d, window = shape
    fn = E.kernel()
    assert fn is not None, "cc should build the kernel on this machine"
    g = torch.Generator().manual_seed(sum(shape[:3]))
    kbuf, vbuf = torch.randn(2, h_kv, 64, d, generator=g), torch.randn(2, h_kv, 64, d, generator=g)
    q = torch.randn(6, h_q, d, generator=g) * 2
    k_new, v_new = torch.randn(6, h_kv, d, generator=g), torch.randn(6, h_kv, d, generator=g)
    queries = [(0, 1, 30, 31, [0]), (1, 1, 30, 32, [0, 1]), (2, 1, 30, 33, [0, 1, 2]), (3, 1, 30, 32, [0, 3]),
               (4, 0, 10, 11, [4]), (5, 0, 10, 12, [4, 5])]
    meta, path = E.plan(queries)
    out = torch.zeros(6, h_q * d)
    E.attend(fn, meta, path, q, kbuf, vbuf, k_new, v_new, out, d ** -0.5, window)
    for tok, row, past, _, p in queries:
        ref = _reference(q, kbuf, vbuf, k_new, v_new, tok, row, past, p, d, window)
        assert float((ref - out[tok]).abs().max()) < 2e-5, (shape, tok)


def test_a_query_alone_and_among_others_is_the_same_bit_for_bit():
    """The last node of a 17-node chain, computed alone (its keys cached, as a plain step has them) and as one
    of the chain's 17 queries (its ancestors' keys read where the pass packed them): equal."""
    fn = E.kernel()
    g = torch.Generator().manual_seed(3)
    h_q, h_kv, d, past = 12, 2, 128, 40
    q = torch.randn(17, h_q, d, generator=g)
    k_new, v_new = torch.randn(17, h_kv, d, generator=g), torch.randn(17, h_kv, d, generator=g)
    kbuf, vbuf = torch.randn(1, h_kv, 80, d, generator=g), torch.randn(1, h_kv, 80, d, generator=g)
    together = torch.zeros(17, h_q * d)
    meta, path = E.plan([(i, 0, past, past + i + 1, list(range(i + 1))) for i in range(17)])
    E.attend(fn, meta, path, q, kbuf, vbuf, k_new, v_new, together, d ** -0.5, None)
    cached_k, cached_v = kbuf.clone(), vbuf.clone()
    cached_k[0, :, past : past + 16], cached_v[0, :, past : past + 16] = k_new[:16].transpose(0, 1), v_new[:16].transpose(0, 1)
    alone = torch.zeros(17, h_q * d)
    meta, path = E.plan([(16, 0, past + 16, past + 17, [16])])
    E.attend(fn, meta, path, q, cached_k, cached_v, k_new, v_new, alone, d ** -0.5, None)
    assert torch.equal(alone[16], together[16])


@pytest.mark.parametrize("threads", [2, 3])
def test_queries_shared_among_blockqs_threads_are_the_same_bits(threads):
    """Through blockq's pool (``blockq.pool`` inside ``pass_threads``): the (query, key head) pairs spread over
    2 or 3 threads give the bits of one thread, for 17 tree queries over two cache rows, with and without a
    window."""
    from suffixspec.core import blockq

    fn = E.kernel()
    if blockq.kernel() is None:
        pytest.skip("no block kernel (no C compiler)")
    assert blockq.pool() is None  # outside a pass: no pool
    g = torch.Generator().manual_seed(threads)
    h_q, h_kv, d = 12, 2, 128
    q = torch.randn(17, h_q, d, generator=g)
    k_new, v_new = torch.randn(17, h_kv, d, generator=g), torch.randn(17, h_kv, d, generator=g)
    kbuf, vbuf = torch.randn(2, h_kv, 300, d, generator=g), torch.randn(2, h_kv, 300, d, generator=g)
    queries = [(i, i % 2, 200 + i, 200 + 2 * i + 1, list(range(i + 1))) for i in range(17)]
    meta, path = E.plan(queries)
    for window in (None, 7):
        alone, shared = torch.zeros(17, h_q * d), torch.full((17, h_q * d), float("nan"))
        E.attend(fn, meta, path, q, kbuf, vbuf, k_new, v_new, alone, d ** -0.5, window)
        with blockq.pass_threads(threads):
            pool = blockq.pool()
            assert pool is not None and pool[1] == threads
            E.attend(fn, meta, path, q, kbuf, vbuf, k_new, v_new, shared, d ** -0.5, window, pool)
        assert torch.equal(alone, shared), window


def test_bad_inputs_say_what_to_give(monkeypatch):
    with pytest.raises(ValueError, match="2 new positions but a path of 1"):
        E.plan([(0, 0, 5, 7, [0])])
    fn = E.kernel()
    meta, path = E.plan([(0, 0, 0, 1, [0])])
    x = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match="float32 on the CPU"):
        E.attend(fn, meta, path, x.double(), torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8), x, x,
                 torch.zeros(1, 16), 1.0, None)
    monkeypatch.setenv("SUFFIXSPEC_EXACT_ATTENTION", "fast")
    with pytest.raises(ValueError, match="native, sdpa"):
        E.mode()


def test_a_build_removes_the_kernels_stale_libraries(tmp_path, monkeypatch):
    """A build removes the same kernel's other libraries untouched for native.STALE_DAYS (an upgrade's leftovers),
    and keeps recent ones and other kernels' files."""
    import os
    import time

    from suffixspec.core import native

    monkeypatch.setenv("SUFFIXSPEC_CACHE", str(tmp_path))
    folder = tmp_path / "native"
    folder.mkdir()
    stem = E.SOURCE.stem
    old, recent, other = folder / f"{stem}-0000000000000000.so", folder / f"{stem}-1111111111111111.so", folder / "x-2.so"
    for f in (old, recent, other):
        f.write_bytes(b"not a library")
    month = time.time() - (native.STALE_DAYS + 1) * 86400
    os.utime(old, (month, month))
    os.utime(other, (month, month))
    built = E.build()
    assert built.exists() and not old.exists() and recent.exists() and other.exists()


def test_it_is_built_once_and_without_a_compiler_the_forward_falls_back(tmp_path, monkeypatch, caplog):
    """The library is cached under $SUFFIXSPEC_CACHE/native (a second build compiles nothing); with no compiler,
    kernel() is None and says why, and LeanForward keeps per-query SDPA (exact too: test_weights)."""
    monkeypatch.setenv("SUFFIXSPEC_CACHE", str(tmp_path))
    built = E.build()
    assert built.parent == tmp_path / "native" and built.exists()
    stamp = built.stat().st_mtime_ns
    assert E.build() == built and built.stat().st_mtime_ns == stamp
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    E.kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="suffixspec.core.exact_attention"):
            assert E.kernel() is None
        assert "per query through SDPA" in caplog.text and "no-such-cc" in caplog.text
    finally:
        E.kernel.cache_clear()
