"""The batching probe's passing verdicts, remembered in the folder of a converted model.

:meth:`~suffixspec.core.runner.Runner.batch_problem` checks with a few passes (two rows, a tree, three of the
model's own ``transformers`` forwards) that the lean or padded forward gives every row the model's own
logits. Its verdict depends on the model (weights and config), the device and dtype, the versions of
torch and transformers and suffixspec's forward code, and on nothing a request brings; yet every start
proved it again: 1.4 CPU seconds of a start of ``suffixspec generate --model smollm2-135m-instruct``.

So a *passing* verdict on a model of the conversion cache (``suffixspec.gguf_cache``: a folder suffixspec
made and owns, replaced whole when its source changes) is written into that folder, ``probe.json``,
under a key of everything above (:func:`probe_key`); a later start whose key is equal skips the probe.
Anything else probes as before: another key (torch or transformers upgraded, the forward code edited,
another device, dtype or attention implementation), a missing, unreadable or malformed file, a model
from any other folder (not ours to write into; the embedded test pair is small), and a failing
verdict, which is never remembered (it is checked again at every start, so its warning is said each
time and a transient failure, such as running out of memory, does not stick).

Worked example (``probe.json`` holds one entry per device, dtype and forward)::

    1st start   no probe.json          -> probe passes -> {"cpu torch.float32 lean": {"torch": "2.13.0", ...}}
    2nd start   the entry equals the key -> no probe
    torch 2.14  entry["torch"] differs -> probe -> passes -> the entry is replaced
    --dtype bfloat16                   -> another entry: probed once, then remembered beside the first
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from suffixspec.core.runner import Runner

log = logging.getLogger(__name__)

FILE = "probe.json"  # in a converted model's folder
VERSION = 1  # of the probe and of this file's layout: bump when either changes meaning
# the modules whose code decides the verdict: the probe itself, the lean forwards, the masks and the cache
_CODE = ("runner.py", "lean.py", "kv.py", "weights.py")


def batch_problem(runner: Runner, cache_folder: str | Path | None) -> str | None:
    """``runner.batch_problem()``, unless ``cache_folder`` (a converted model's folder, or None) remembers
    that it passed under the same key; a new pass is remembered there (see the module docstring)."""
    if cache_folder is None:
        return runner.batch_problem()
    path = Path(cache_folder) / FILE
    slot, key = probe_key(runner)
    if key["code"] is None:  # the forward code cannot be read (a frozen install): nothing to key a verdict by
        return runner.batch_problem()
    entries = _read(path)
    if entries.get(slot) == key:
        return None
    problem = runner.batch_problem()
    if problem is None:
        _write(path, {**entries, slot: key})
    return problem


def probe_key(runner: Runner) -> tuple[str, dict]:
    """(the entry's name: device, dtype and forward; what must be equal for the verdict to hold)."""
    import transformers

    model = runner.model
    forward = f"lean {runner.lean.family}" if runner.lean is not None else "padded"
    if runner.lean is not None and runner.lean.onednn:
        forward += " onednn"  # packed weights round differently (SUFFIXSPEC_ONEDNN=0 keeps them plain)
    kind = getattr(runner.lean, "weights", "float")
    if runner.lean is not None and kind != "float":
        forward += f" {kind}"  # another weight format: another verdict (and another probe)
    device = str(runner.device)
    if runner.device.type == "cuda":  # another GPU model runs other kernels
        device += f" {torch.cuda.get_device_name(runner.device)}"
    slot = f"{device} {runner.dtype} {forward}"
    config = model.config.to_json_string(use_diff=False)
    key = {"version": VERSION, "torch": torch.__version__, "transformers": transformers.__version__,
           "code": _code_hash(), "config": hashlib.sha256(config.encode()).hexdigest(),
           "attention": str(getattr(model.config, "_attn_implementation", None))}
    return slot, key


def _code_hash() -> str | None:
    """sha256 of the forward code's source (``_CODE``): an edit, or another suffixspec release, re-probes.
    None when a source file cannot be read."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    try:
        for name in _CODE:
            h.update(name.encode())
            h.update((here / name).read_bytes())
    except OSError:
        return None
    return h.hexdigest()


def _read(path: Path) -> dict:
    """The file's entries; {} when it is missing, unreadable or not what this module writes."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(v, dict)}


def _write(path: Path, entries: dict) -> None:
    """Replace the file whole (a reader sees the old one or the new one); a folder that refuses writes
    (a read-only cache) only means the next start probes again."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        log.debug("could not remember the batching probe's verdict in %s: %s", path, e)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
