"""A shallow draft model that borrows its target's embedding and head (same vocabulary, real ``q``).

A draft for SmolLM2-135M-Instruct with its own 49,152 x 576 embedding would weigh 56 MB in float16,
over the 30 MB the package allows for drafts. This draft ships only a few decoder layers and a final
norm (trained by :mod:`suffixspec.training.distill`); at load time it takes the target's embedding
table (shared, not copied) and the rows of the target's head for the ``head_tokens`` it was trained to
propose (the target's most frequent answer tokens). Its head then costs one read of those rows per
draft token instead of the target's whole head (49,152 rows: ~14 ms per token at one thread here),
and it can never propose a token outside them (their ``q`` is 0, which verification allows).

Files of a shallow draft folder: ``config.json`` (a ``LlamaConfig`` of the layers, plus a
``suffixspec_shallow`` entry: the target it was trained for and a checksum of that target's embedding),
``model.safetensors`` (``model.layers.*``, ``model.norm.weight``, ``head_tokens``), ``README.md``.

Worked example (head of 4 tokens ``[2, 7, 9, 30]``, target vocabulary 32)::

    draft hidden state h     -> logits over the 4 rows: [0.1, 2.0, -1.0, 0.5]
    full-width logits        -> 32 entries, -inf except [2]=0.1, [7]=2.0, [9]=-1.0, [30]=0.5
    argmax                   -> token 7 (a target id; fed back through the target's own embedding)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .draft_model import DraftModelProposer

if TYPE_CHECKING:
    from ..loading import LoadedModel

SHALLOW_KEY = "suffixspec_shallow"  # config.json entry that marks a shallow draft
def is_shallow_draft(folder: str | Path) -> bool:
    cfg = Path(folder) / "config.json"
    return cfg.exists() and SHALLOW_KEY in json.loads(cfg.read_text(encoding="utf-8"))


def embedding_checksum(embed: torch.Tensor) -> float:
    """A cheap fingerprint of a target's embedding table (sum of its first 256 rows, float64)."""
    return float(embed.detach()[:256].double().sum())


def build_draft_model(config: Any, target_model: Any, head_tokens: torch.Tensor) -> Any:
    """A ``LlamaForCausalLM`` of ``config``'s layers whose embedding is ``target_model``'s (the same
    tensor) and whose head holds the target head's rows for ``head_tokens`` (frozen; a copy of those
    rows). The layers and norm are left as initialized: load or train them."""
    from transformers import LlamaForCausalLM

    cfg = config.__class__.from_dict(config.to_dict())
    cfg.tie_word_embeddings = False
    target_embed = target_model.get_input_embeddings().weight
    if tuple(target_embed.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"this draft needs a target embedding of {cfg.vocab_size} x {cfg.hidden_size}, the target "
                         f"has {tuple(target_embed.shape)}: it was trained for another model")
    # built with a one-row table (not 49k rows made only to be replaced), then given the real sizes back
    special = {k: None for k in ("pad_token_id", "bos_token_id", "eos_token_id")}
    small = cfg.__class__.from_dict({**cfg.to_dict(), "vocab_size": 1, **special})
    model = LlamaForCausalLM(small).to(target_embed.dtype)
    for key in ("vocab_size", *special):
        setattr(model.config, key, getattr(cfg, key))
    model.model.embed_tokens = target_model.get_input_embeddings()  # shared with the target, never trained here
    head = target_model.get_output_embeddings().weight
    model.lm_head = torch.nn.Linear(cfg.hidden_size, len(head_tokens), bias=False, dtype=head.dtype)
    model.lm_head.weight = torch.nn.Parameter(head[head_tokens.long()].detach().clone(), requires_grad=False)
    model.to(target_embed.device)
    model.register_buffer("head_tokens", head_tokens.long().to(target_embed.device), persistent=False)
    return model


def load_shallow_draft(folder: str | Path, target: LoadedModel) -> LoadedModel:
    """Load a shallow draft folder onto ``target`` (its embedding and head rows are borrowed)."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    from ..loading import LoadedModel

    folder = Path(folder)
    raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    meta = raw.get(SHALLOW_KEY)
    if meta is None:
        raise ValueError(f"{folder} is not a shallow draft (no {SHALLOW_KEY!r} in its config.json)")
    state = load_file(str(folder / "model.safetensors"))
    head_tokens = state.pop("head_tokens")
    model = build_draft_model(LlamaConfig.from_dict(raw), target.model, head_tokens)
    embed = target.model.get_input_embeddings().weight
    if abs(embedding_checksum(embed) - meta["embed_checksum"]) > 1e-3 * max(1.0, abs(meta["embed_checksum"])):
        raise ValueError(f"{folder} was trained for {meta.get('target')!r}; this target's embedding differs")
    missing, unexpected = model.load_state_dict({k: v.to(embed.dtype) for k, v in state.items()}, strict=False)
    left = [k for k in missing if k not in ("model.embed_tokens.weight", "lm_head.weight")]
    if left or unexpected:
        raise ValueError(f"{folder}: weights missing {left} or unexpected {unexpected}")
    model.to(embed.dtype).eval()
    return LoadedModel(model=model, tokenizer=target.tokenizer, name=str(folder), device=target.device,
                       dtype=target.dtype)


def save_shallow_draft(model: Any, folder: str | Path, target_name: str, info: dict | None = None) -> Path:
    """Write the trained part of a shallow draft (layers, final norm: float16; ``head_tokens``) and its
    config with the ``suffixspec_shallow`` entry; the borrowed embedding and head rows are not written."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()
             if k.startswith(("model.layers.", "model.norm."))}
    state["head_tokens"] = model.head_tokens.to(torch.int32).cpu().contiguous()
    save_file(state, str(folder / "model.safetensors"))
    cfg = model.config.to_dict()
    cfg["dtype"] = "float32"  # stored in float16; computed in the target's dtype
    cfg[SHALLOW_KEY] = {"target": target_name, "head_tokens": int(len(model.head_tokens)),
                        "embed_checksum": embedding_checksum(model.get_input_embeddings().weight), **(info or {})}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return folder


class _FullWidth:
    """Wraps the draft runner's lean forward: logits over the head's rows -> logits over the target
    vocabulary (-inf elsewhere), so token ids stay the target's everywhere else."""

    def __init__(self, lean: Any, head_tokens: torch.Tensor, width: int) -> None:
        self.lean = lean
        self.head_tokens = head_tokens
        self.width = width

    def __call__(self, rows: list[Any], cache: Any) -> list[torch.Tensor | None]:
        """The lean forward's per-row logits [wanted, len(head_tokens)], each widened to [wanted, width]."""
        out: list[torch.Tensor | None] = []
        for sub in self.lean(rows, cache):
            if sub is None:
                out.append(None)
                continue
            full = torch.full((*sub.shape[:-1], self.width), float("-inf"), dtype=sub.dtype, device=sub.device)
            out.append(full.index_copy_(sub.dim() - 1, self.head_tokens, sub))
        return out


class ShallowDraftProposer(DraftModelProposer):
    """:class:`DraftModelProposer` over a shallow draft (:func:`load_shallow_draft`): the same chain
    drafting, ``q`` and adaptive length; logits come back over the whole target vocabulary."""

    def __init__(self, draft: LoadedModel, target_vocab_size: int | None = None, **kwargs: Any) -> None:
        head_tokens = getattr(draft.model, "head_tokens", None)
        if head_tokens is None:
            raise ValueError("ShallowDraftProposer needs a draft from load_shallow_draft (it has no head_tokens)")
        super().__init__(draft, target_vocab_size=target_vocab_size, **kwargs)
        width = int(draft.model.get_input_embeddings().weight.shape[0])
        if self.runner.lean is None:
            raise ValueError("a shallow draft runs on the lean Llama forward; this draft's config is not supported")
        self.runner.lean = _FullWidth(self.runner.lean, head_tokens, width)
        self.runner.vocab_size = width
        self.target_vocab_size = target_vocab_size or width
