"""Model and tokenizer loading, exactly as `transformers` does, plus the embedded default models.

``load_target("suffixspec/demo-target")`` resolves the embedded model shipped in the package;
any other string is passed to ``AutoModelForCausalLM.from_pretrained`` (a local directory or a
hub id). The device is CUDA when present, else CPU; dtype is bf16 (or fp16) on GPU and float32
on CPU unless overridden.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TARGET = "suffixspec/demo-target"
DEFAULT_DRAFT = "suffixspec/demo-draft"
_EMBEDDED_DIR = Path(__file__).parent / "default_models"
_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16"}


def resolve_model_path(name_or_path: str) -> str:
    """Map an embedded model name (``suffixspec/demo-target``) to its directory; pass others through."""
    if name_or_path.startswith("suffixspec/"):
        local = _EMBEDDED_DIR / name_or_path.split("/", 1)[1]
        if not (local / "config.json").exists():
            raise FileNotFoundError(
                f"embedded model {name_or_path!r} is not in this installation ({local}); "
                "reinstall suffixspec or pass a hub id / local directory with --model"
            )
        return str(local)
    return name_or_path


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
    dtype: Any  # torch dtype of the weights


def load_tokenizer(name_or_path: str) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
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


def load_model(name_or_path: str = DEFAULT_TARGET, device: str | None = None, dtype: str | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer from a local directory, a hub id, or an embedded name."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .kv import attention_windows

    path = resolve_model_path(name_or_path)
    attention_windows(AutoConfig.from_pretrained(path))  # refuse, before loading weights, a cache we cannot rewind
    dev = pick_device(device)
    torch_dtype = pick_dtype(dev, dtype)
    with _quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    model.to(dev).eval()
    tokenizer = load_tokenizer(name_or_path)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name_or_path, device=dev, dtype=torch_dtype)
