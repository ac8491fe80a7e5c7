"""The ``weights`` option: the formats offered (:data:`FORMATS`), the one ``auto`` means on this machine
(:func:`resolve`), a draft's (:func:`draft_weights`), and the probe behind ``auto`` on a CPU: which exact int8
kernel works here and pays, measured once and remembered. How each format stores and multiplies its
matrices is ``weights``' job; the lean forward's int8 kernel is :func:`int8_kernel`, a draft model's kind
:func:`draft_int8_kind`. The probe checks each
kernel's exactness at several row counts, times 1 and 8 rows of two decode-sized matrices (:data:`PROBE_SHAPES`)
with each kernel and with float32, and keeps the verdict in ``~/.cache/suffixspec/formats.json`` under the torch
version and the CPU (its model name and a hash of its instruction-set flags).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from suffixspec.core.native import cpuinfo_line
from suffixspec.core.weights import KERNELS, Int8Weight, RowInt8Weight, int8_works, linear, packed

log = logging.getLogger(__name__)

FORMATS = ("auto", "float32", "bfloat16", "float16", "int8", "gguf", "gguf16")  # the ``weights`` option's values
EXACT = ("float32", "int8", "gguf", "gguf16")  # formats whose tokens do not depend on the pass's other rows (float32: up to rounding)
QUANTIZED = ("int8", "gguf", "gguf16")  # formats whose matrices are integers (the model's float weights are released)
# what each format loads the model's weights as (int8 quantizes from float32; gguf reads the file's blocks and
# keeps the model's float32 norms and biases)
LOAD_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.float32,
               "gguf": torch.float32, "gguf16": torch.float32}
GGUF = ("gguf", "gguf16")  # the formats that multiply a GGUF file's own blocks (8-bit, ~15-bit activations)
_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


# ``auto`` keeps a model in float32 whose int8 format is measured to agree with float32's greedy tokens
# less often than this (``models.KnownModel.int8_agreement``): SmolLM2-135M's int8 agrees on 94.6% of
# them (40 HumanEval answers, docs/benchmarks.md), and its answers change (the README's edit gains a
# trailing sentence that nothing drafts); the same bar for its gguf format (``KnownModel.gguf_agreement``):
# SmolLM2's gguf agrees on 98.4% and answers "What is the capital of France?" with a list that never says Paris
INT8_MIN_AGREEMENT = 0.99


def resolve(weights: str | None, device: str, dtype: str | None = None, model: str | None = None,
            draft: bool = False) -> str:
    """The concrete format (``float32``, ``bfloat16``, ``float16``, ``int8``, ``gguf`` or ``gguf16``) of ``weights``
    on ``device``; ``dtype`` (the older option) names a floating format and counts when ``weights`` is ``auto``.

    ``auto`` (or None): on a CPU, ``gguf`` for a model named by its GGUF file (a known name or a ``.gguf`` path)
    where the block kernel builds (:func:`gguf_works`) and the model's gguf is not measured to agree with float32
    below :data:`INT8_MIN_AGREEMENT`: the file's own blocks, the fewest bytes per step; where it is, ``gguf16`` (the
    same blocks, ~15-bit activations) if that is measured to agree at least that often; else the fastest exact
    int8 kernel measured here (:func:`int8_verdict`), unless ``model`` is a named model whose int8 is measured to
    agree with float32 below :data:`INT8_MIN_AGREEMENT` (neither is weighed for a ``draft``, whose tokens are only
    proposals); on a GPU bfloat16 where supported, else float16. Examples:
    ``resolve("auto", "cpu", model="qwen2.5-coder-1.5b-instruct")`` -> ``"gguf"`` (with a C compiler);
    ``resolve("auto", "cpu", model="smollm2-135m-instruct")`` -> ``"gguf16"`` (gguf 98.4%, gguf16 100%);
    ``resolve("auto", "cpu")`` -> ``"int8"`` where an exact int8 kernel is faster here;
    ``resolve(None, "cpu", dtype="bfloat16")`` -> ``"bfloat16"``."""
    name = _ALIASES.get(weights or "auto", weights or "auto")
    if name not in FORMATS:
        raise ValueError(f"unknown weights format {weights!r}; choose one of {', '.join(FORMATS)}")
    if dtype is not None:
        named = _ALIASES.get(dtype, dtype)
        if named not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"unknown dtype {dtype!r}; choose one of float32, bfloat16, float16 "
                             f"(or --weights {'|'.join(FORMATS)})")
        if name == "auto":
            return named
        if name != named:
            raise ValueError(f"dtype {dtype!r} and weights {weights!r} disagree; give only --weights")
    if name in QUANTIZED and not device.startswith("cpu"):
        raise ValueError(f"weights {name!r} is a CPU format (its integer kernels run on the CPU); on {device} use "
                         f"bfloat16, float16 or float32")
    if name != "auto":
        return name
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if device == "cpu":
        from suffixspec.models import KNOWN_MODELS

        known = None if draft else KNOWN_MODELS.get(model or "")
        low = known is not None and known.gguf_agreement is not None and known.gguf_agreement < INT8_MIN_AGREEMENT
        if gguf_named(model) and gguf_works():  # (gguf_works compiles the kernel: only when it counts)
            if not low:
                return "gguf"
            if known.gguf16_agreement is not None and known.gguf16_agreement >= INT8_MIN_AGREEMENT:
                log.info("weights auto -> gguf16 (%s's gguf agrees with float32 on %.1f%% of greedy tokens, its "
                         "gguf16 on %.2f%%)", known.name, 100 * known.gguf_agreement, 100 * known.gguf16_agreement)
                return "gguf16"
        if known is not None and known.int8_agreement is not None and known.int8_agreement < INT8_MIN_AGREEMENT:
            log.info("weights auto -> float32 (%s's int8 agrees with float32 on %.1f%% of greedy tokens; "
                     "--weights int8 to use it)", known.name, 100 * known.int8_agreement)
            return "float32"
        verdict = int8_verdict()
        if verdict["use"]:
            return "int8"
        log.info("weights auto -> float32 (%s)", verdict["why"])
    return "float32"


def gguf_named(model: str | None) -> bool:
    """Whether ``model`` names a GGUF file: a known model (``suffixspec.models``) or a ``.gguf`` path."""
    from suffixspec.models import KNOWN_MODELS

    return bool(model) and (model in KNOWN_MODELS or str(model).lower().endswith(".gguf"))


@functools.cache
def gguf_works() -> bool:
    """Whether the ``gguf`` format runs here: its block kernel (``blockq``) compiles and loads, or is cached."""
    from suffixspec.core import blockq

    return blockq.kernel() is not None


def draft_weights(target_format: str) -> str:
    """The ``weights`` a draft model loads with (``load_model(..., draft=True)``): the target's format, except
    that at ``int8`` or ``gguf`` it is ``auto``, so a draft of a family without a lean forward stays float32 where an
    explicit int8 would be refused. Example: ``draft_weights("int8") == "auto"``, ``draft_weights("bfloat16")
    == "bfloat16"``."""
    return "auto" if target_format in QUANTIZED else target_format


# -- the probe: does the exact int8 product work here, and does it pay ------------------------------------
PROBE_VERSION = 3  # bump when the probe's meaning changes
# decode-sized products (out, in), timed together: SmolLM2-135M's MLP matrix, which sits in cache, and
# Qwen2.5-Coder-1.5B's, which streams from memory as a large model's weights do (the small one alone can
# call a tie that the large one does not: docs/formats.md)
PROBE_SHAPES = ((1536, 576), (8960, 1536))
PROBE_ROWS = (1, 2, 8, 17)  # row counts checked for exactness (on the small matrix)


def _probe_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "suffixspec" / "formats.json"


def _machine_key() -> str:
    """What the verdict holds for: torch's version, the CPU model and a hash of its instruction set flags."""
    model, flags = cpuinfo_line("model name"), cpuinfo_line("flags")
    cpu = model.split(":", 1)[1].strip() if ":" in model else platform.machine()
    digest = hashlib.sha256(flags.encode()).hexdigest()[:16] if flags else ""
    return f"v{PROBE_VERSION} torch {torch.__version__} {cpu} {digest}"


@functools.cache
def int8_verdict() -> dict:
    """Whether ``auto`` on this CPU is int8: ``{"use": bool, "why": str, "int8_ms", "float32_ms"}``.

    The probe: a kernel must run and be exact (``torch._int_mm`` equal to the int64 product at several row
    counts, fbgemm's pinned product a row's alone); the faster of those over :data:`PROBE_SHAPES` is the
    kernel, and int8 is used where it is faster than the float32 product the lean forward would run (median
    of a few timed products, 1 and 8 rows). The
    verdict is remembered in ``~/.cache/suffixspec/formats.json`` under the torch version and CPU (a torch
    upgrade or another machine probes again); ``SUFFIXSPEC_INT8=0`` or ``=1`` decides without probing."""
    forced = os.environ.get("SUFFIXSPEC_INT8")
    if forced in ("0", "1"):
        return {"use": forced == "1", "why": f"SUFFIXSPEC_INT8={forced}"}
    key = _machine_key()
    path = _probe_file()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), dict) and "use" in known[key]:
        return known[key]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a decode pass's count on a busy CPU; two threads' timings swing with the load
    try:
        verdict = _probe()
    finally:
        torch.set_num_threads(threads)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({**(known if isinstance(known, dict) else {}), key: verdict}, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        log.debug("could not remember the int8 probe's verdict in %s: %s", path, e)
    return verdict


def int8_kernel() -> str:
    """The exact int8 kernel measured faster here (``int8_verdict()["kernel"]``), or the one
    ``SUFFIXSPEC_INT8_KERNEL`` names (``int_mm`` or ``fbgemm``: both exact, their outputs differ)."""
    forced = os.environ.get("SUFFIXSPEC_INT8_KERNEL")
    if forced:
        if forced not in KERNELS:
            raise ValueError(f"SUFFIXSPEC_INT8_KERNEL={forced!r} is not an int8 kernel: set it to one of "
                             f"{', '.join(KERNELS)}, or unset it to use the one the probe measured faster")
        return forced
    return int8_verdict().get("kernel") or "int_mm"


def _probe() -> dict:
    gen = torch.Generator().manual_seed(0)
    n, k = PROBE_SHAPES[0]
    works: dict[str, str] = {}  # kernel -> why it is not usable ("" where it is)
    try:
        wq = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        works["int_mm"] = ""
        for m in PROBE_ROWS:
            xq = torch.randint(-127, 128, (m, k), generator=gen, dtype=torch.int8)
            if not torch.equal(torch._int_mm(xq, wq.t()).long(), xq.long() @ wq.long().t()):
                works["int_mm"] = f"torch._int_mm is not the exact integer product at {m} rows"
                break
    except (RuntimeError, AttributeError, TypeError, NotImplementedError) as e:
        works["int_mm"] = f"torch._int_mm does not run here ({type(e).__name__}: {e})"
    works["fbgemm"] = "" if int8_works() else "fbgemm's int8 dynamic linear is not in this torch"
    times: dict[str, float] = {}  # kernel -> ms of 1 + 8 rows summed over the shapes; "<kernel>_1row" of 1 row
    usable = ["float32", *(name for name in KERNELS if not works[name])]
    for n, k in PROBE_SHAPES:
        w = torch.randn(n, k, generator=gen)
        x = torch.randn(max(PROBE_ROWS), k, generator=gen) * torch.rand(max(PROBE_ROWS), 1, generator=gen)
        weights: dict[str, Any] = {}
        for name in list(usable):
            try:
                weights[name] = packed(w) if name == "float32" else RowInt8Weight(w, name)
                if name == "fbgemm" and (n, k) == PROBE_SHAPES[0]:
                    whole = weights[name].mm(x)
                    if not all(torch.equal(weights[name].mm(x[i : i + 1])[0], whole[i]) for i in range(x.shape[0])):
                        works["fbgemm"] = "fbgemm's pinned product changes a row with the others"
            except (RuntimeError, AttributeError, TypeError) as e:
                works[name] = f"{name}'s product failed ({type(e).__name__}: {e})"
            if works.get(name):
                weights.pop(name, None)
                usable.remove(name)
        for rows in (1, 8):
            for name, weight in weights.items():
                ms = _median_ms(lambda weight=weight, xs=x[:rows]: linear(xs, weight))
                times[name] = times.get(name, 0.0) + ms
                if rows == 1:
                    times[f"{name}_1row"] = times.get(f"{name}_1row", 0.0) + ms
    exact = [name for name in KERNELS if name in usable]
    kernel = min(exact, key=lambda name: times[name]) if exact else None
    use = kernel is not None and times[kernel] < times["float32"]
    shapes = " and ".join(f"{n} x {k}" for n, k in PROBE_SHAPES)
    figures = ", ".join(f"{name} {times[name]:.3f} ms" for name in usable)
    why = (f"1 + 8 rows of {shapes}: {figures}"
           + "".join(f"; {name}: {reason}" for name, reason in works.items() if reason))
    return {"use": use, "kernel": kernel, "why": why,
            **{f"{name}_ms": round(t, 4) for name, t in times.items()}}


def _median_ms(product: Callable[[], Any], samples: int = 15, repeats: int = 4) -> float:
    """Median ms of one call of ``product`` (``samples`` timings of ``repeats`` calls each)."""
    taken = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(repeats):
            product()
        taken.append(time.perf_counter() - t0)
    return sorted(taken)[len(taken) // 2] / repeats * 1e3


def draft_int8_kind() -> str:
    """The lean weight kind an int8 draft model runs on here: ``"fbgemm"`` (fbgemm's dynamic int8 linear:
    per-tensor activation scale, so a row's result depends on the others', which a draft may: verification
    stays lossless whatever the draft computes) or ``"int8"`` (this module's exact rows), whichever multiplies
    one row faster on the probe's matrix (:func:`int8_verdict`; a draft steps one token at a time). fbgemm
    is CPU-only and absent from some builds: then ``"int8"``, or ``"float"`` where neither runs."""
    verdict = int8_verdict()
    kernel = verdict.get("kernel")
    if int8_works():
        plain = _fbgemm_1row_ms()
        exact = verdict.get(f"{kernel}_1row_ms") if kernel else None
        if exact is None or plain <= exact:
            return "fbgemm"
    return "int8" if kernel else "float"


@functools.cache
def _fbgemm_1row_ms() -> float:
    """fbgemm's plain dynamic int8 product (lean.Int8Weight) of one row on the probe's matrices, in ms
    (summed, as the verdict's ``<kernel>_1row_ms``)."""
    gen = torch.Generator().manual_seed(0)
    total = 0.0
    for shape in PROBE_SHAPES:
        w, x = torch.randn(*shape, generator=gen), torch.randn(1, shape[1], generator=gen)
        fb = Int8Weight(w)
        total += _median_ms(lambda fb=fb, x=x: linear(x, fb))
    return total
