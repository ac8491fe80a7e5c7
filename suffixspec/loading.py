"""Model and tokenizer loading, exactly as `transformers` does, from a model name, a folder or a GGUF file.

``resolve_model_path`` maps what ``--model`` / ``model=`` accept to a folder ``from_pretrained``
reads: a known name (``smollm2-135m-instruct``, ``gemma-3-270m``: a GGUF from an installed package)
or any ``.gguf`` path becomes its converted folder in the cache (converted on first use, see
``suffixspec.gguf_cache``); an embedded name (``suffixspec/demo-target``) its folder in the package; any
other string (a local folder, a hub id) passes through. The device is CUDA when present, else CPU;
dtype is bf16 (or fp16) on GPU and float32 on CPU unless overridden.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suffixspec.models import DEFAULT_MODEL, embedded_path, gguf_source

_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16"}


def resolve_model_path(name_or_path: str, progress: bool = True) -> str:
    """The folder ``from_pretrained`` reads for a model name, an embedded name or a ``.gguf`` path;
    other strings (folders, hub ids) unchanged. A GGUF is converted once into the cache (with a
    progress bar unless ``progress=False``); a known name whose package is missing raises
    ``ModelNotInstalledError`` saying the pip command.

    >>> resolve_model_path("./my-model")
    './my-model'
    """
    return _resolve(name_or_path, progress)[0]


def _resolve(name_or_path: str, progress: bool = True) -> tuple[str, bool]:
    """(``resolve_model_path``'s folder, whether it is a folder of the conversion cache)."""
    local = embedded_path(name_or_path)
    if local is not None:
        return str(local), False
    src = gguf_source(name_or_path)
    if src is not None:
        from suffixspec.gguf_cache import cached_folder

        return str(cached_folder(src, progress=progress)), True
    return name_or_path, False


def pick_device(device: str | None = None) -> str:
    """``device`` if given, else ``cuda`` when available, else ``cpu``."""
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(device: str, dtype: str | None = None) -> Any:
    """float32 on CPU; bf16 on GPUs that support it, else fp16; or the name given."""
    import torch

    if dtype:
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
        return getattr(torch, _DTYPES[dtype])
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer, ready for inference."""

    model: Any  # transformers PreTrainedModel in eval mode
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    name: str  # the name or path it was loaded from
    device: str  # torch device string
    dtype: Any  # torch dtype of the weights as loaded (and of the activations: float32 for int8)
    # the conversion cache's folder the weights were read from (suffixspec's own, where the batching probe's
    # verdict is remembered: ``probe_cache``); None for any other source (a user's folder, a hub id, in memory)
    cache_folder: str | None = None
    # the weight format (suffixspec.core.formats.FORMATS, resolved: float32, bfloat16, float16 or int8); a quantized
    # one is built by the lean forward when the engine or draft runner first runs the model
    weights: str = "float32"
    # the folder the tokenizer was read from (a hub id where it was not a local folder)
    tokenizer_folder: str | None = None

    @functools.cached_property
    def tokenizer_files(self) -> str | None:
        """A digest of the tokenizer's files (:func:`tokenizer_files`), None where it did not come from a local
        folder: a draft whose files are the same bytes shares this tokenizer (load_model's share_tokenizer).
        Read when first asked, not at every load."""
        return None if self.tokenizer_folder is None else tokenizer_files(self.tokenizer_folder)

    @property
    def lean_kind(self) -> str:
        """The lean forward's weight kind for this format (``lean.KINDS``): ``int8``, ``gguf``, ``gguf16`` or ``float``."""
        from suffixspec.core.formats import QUANTIZED

        return self.weights if self.weights in QUANTIZED else "float"  # (the quantized formats name their kinds)


def max_context(config: Any) -> int:
    """The positions a model's config allows (its context length): ``max_position_embeddings`` as most
    families name it, ``n_positions`` as GPT-2 does, else 2048. Example: SmolLM2-135M -> 8192."""
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048)


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer of a model name, folder, hub id or ``.gguf`` file (see ``resolve_model_path``)."""
    return _tokenizer_from(resolve_model_path(name_or_path))


# what AutoTokenizer reads from a folder, but the chat template (a draft's prompts are token ids)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


def tokenizer_files(path: str) -> str | None:
    """A digest of the tokenizer files in folder ``path`` (``TOKENIZER_FILES``), None for a path that is not a local
    folder or holds none of them. Two models whose digests agree tokenize alike (Qwen2.5-Coder's 0.5B and 1.5B)."""
    import hashlib

    folder = Path(path)
    if not folder.is_dir():
        return None
    h = hashlib.sha256()
    found = False
    for name in TOKENIZER_FILES:
        f = folder / name
        if f.is_file():
            found = True
            h.update(name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest() if found else None


def _tokenizer_from(path: str) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    # transformers warns "Token indices sequence length is longer than the specified maximum" whenever a
    # text is tokenized past model_max_length: suffixspec checks the context itself (the server refuses
    # such prompts with a 400), so the warning only adds noise to the log. Mark it as already given.
    warned = getattr(tok, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tok


class _quiet_loading:
    """Hide transformers' "Loading weights" progress bars while a model loads (they mixed into the
    CLI's output on every call), then restore whatever the caller had set."""

    def __enter__(self) -> None:
        from transformers.utils import logging as hf_logging

        self._was_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()

    def __exit__(self, *exc: object) -> None:
        from transformers.utils import logging as hf_logging

        if self._was_on:
            hf_logging.enable_progress_bar()


# model types whose direct load (``_load_converted``) tests/test_models.py checks against from_pretrained
DIRECT_LOAD_TYPES = ("llama", "mistral", "qwen2", "gemma3_text")


def _load_converted(path: str, config: Any, torch_dtype: Any) -> Any | None:
    """The model of a folder ``gguf_cache.convert`` wrote, built directly: the architecture without weight
    initialization, then every weight from the folder's one safetensors file, as ``from_pretrained``
    fills it. None (the caller then uses ``from_pretrained``) when anything differs from what a
    conversion writes: another model type (``DIRECT_LOAD_TYPES``), dtype or file layout, a key the
    model lacks, or a parameter neither in the file nor tied to one that is.

    Why: ``from_pretrained`` of SmolLM2's converted folder took 0.4 s of CPU, 0.3 s of it before reading a
    weight (transformers builds its table of key renamings for every architecture it knows, 1,185 regular
    expressions), and a folder written by ``save_pretrained`` needs no renaming; this takes 0.1 s.
    Example: SmolLM2's file holds every key but ``lm_head.weight``, which ``tie_weights`` makes the
    embedding matrix, as from_pretrained does.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, GenerationConfig

    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        return None
    weights = Path(path) / "model.safetensors"
    if config.model_type not in DIRECT_LOAD_TYPES or torch_dtype != torch.float32 or not weights.is_file() \
            or any(Path(path).glob("*.safetensors.index.json")):
        return None
    state = load_file(weights)
    if any(t.dtype != torch_dtype for t in state.values()):
        return None
    with no_init_weights():  # every weight is replaced below: random initialization would be thrown away
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    from_file = {t.data_ptr() for t in state.values()}
    have = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    if unexpected or any(k not in have or have[k].data_ptr() not in from_file for k in missing):
        return None
    model.generation_config = GenerationConfig.from_pretrained(path)
    return model


def load_model(name_or_path: str = DEFAULT_MODEL, device: str | None = None, dtype: str | None = None,
               weights: str | None = None, draft: bool = False, share_tokenizer: LoadedModel | None = None
               ) -> LoadedModel:
    """Load a causal LM and its tokenizer from a model name, a ``.gguf`` file, a local folder, a hub
    id or an embedded name (``resolve_model_path``).

    ``weights``: the weight format (``suffixspec.core.formats.FORMATS``); ``"auto"`` = the fastest exact format
    measured on this machine (int8 on a CPU where ``torch._int_mm`` is exact and faster, see
    ``formats.resolve``); None (this function's default) = the floating format of ``dtype`` or the device,
    as before formats existed. An int8 model loads in float32 and is quantized by its lean forward when first
    run (``Runner``, ``DraftRunner``), which then releases the float weights. ``draft``: a draft model, whose
    tokens are only proposals: ``auto`` does not weigh how well its int8 agrees with its float32.
    ``share_tokenizer``: a loaded model (the target) whose tokenizer this one takes instead of loading its own
    where their tokenizer files are the same bytes (``tokenizer_files``): a Qwen tokenizer holds ~140 MB."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from suffixspec.core.formats import GGUF, LOAD_DTYPES, QUANTIZED, resolve
    from suffixspec.core.kv import attention_windows

    path, converted = _resolve(name_or_path)
    config = AutoConfig.from_pretrained(path)
    attention_windows(config)  # refuse, before loading weights, a cache we cannot rewind
    dev = pick_device(device)
    if weights is None:
        torch_dtype = pick_dtype(dev, dtype)
        fmt = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[torch_dtype]
    else:
        fmt = resolve(weights, dev, dtype, model=name_or_path, draft=draft)
        torch_dtype = LOAD_DTYPES[fmt]
    model = _load_converted(path, config, torch_dtype) if converted else None
    if model is None:
        with _quiet_loading():
            model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch_dtype)  # config read once
    model.to(dev).eval()
    if fmt in QUANTIZED:
        from suffixspec.core.lean_weights import unsupported

        problem = unsupported(model)
        if problem is not None:
            if weights != "auto":
                raise ValueError(f"{name_or_path} cannot run with {fmt} weights: they need suffixspec's lean forward "
                                 f"({problem}); use weights='float32'")
            fmt = "float32"  # auto: the fastest exact format this model can run
    if fmt in GGUF and not converted:
        raise ValueError(f"{name_or_path} cannot run with {fmt} weights: they are the blocks of the GGUF file a model "
                         f"is converted from; name the model by its GGUF (a known name or a .gguf path), or use "
                         f"weights='int8'")
    shared = share_tokenizer.tokenizer_files if share_tokenizer is not None else None
    if shared is not None and tokenizer_files(path) == shared:
        tokenizer = share_tokenizer.tokenizer
    else:
        tokenizer = _tokenizer_from(path)
    if fmt in QUANTIZED:  # the calibration text's ids, for the int8 build's smoothing (weights.smoothing)
        from suffixspec.core.weights import CALIBRATION_TEXT

        model._suffixspec_calibration = list(tokenizer(CALIBRATION_TEXT)["input_ids"])
        if converted:  # where the lean forward keeps the quantized matrices for the next start (lean_weights)
            model._suffixspec_folder = path
    return LoadedModel(model=model, tokenizer=tokenizer, name=name_or_path, device=dev, dtype=torch_dtype,
                       cache_folder=path if converted else None, weights=fmt, tokenizer_folder=path)
