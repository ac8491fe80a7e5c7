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

    return AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))


def load_model(name_or_path: str = DEFAULT_TARGET, device: str | None = None, dtype: str | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer from a local directory, a hub id, or an embedded name."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .kv import attention_windows

    path = resolve_model_path(name_or_path)
    attention_windows(AutoConfig.from_pretrained(path))  # refuse, before loading weights, a cache we cannot rewind
    dev = pick_device(device)
    torch_dtype = pick_dtype(dev, dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    model.to(dev).eval()
    tokenizer = load_tokenizer(name_or_path)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name_or_path, device=dev, dtype=torch_dtype)
