"""Same-vocabulary draft model (classic speculative decoding), plus the pieces every model drafter shares.

- :class:`DraftRunner` runs a small causal LM with its own KV cache. Given the ids the draft should
  have seen, it crops the cache to the longest common prefix with what it has already seen and
  feeds only the rest, so after the target rejects a draft suffix the cache is back in step with
  one short forward pass.
- :class:`AdaptiveLength` grows the draft length after a fully accepted draft and shrinks it
  after an early rejection.
- :class:`DraftModelProposer` drafts a chain with a model that shares the target's vocabulary.
  Greedy requests: argmax tokens, no ``q``. Sampling requests: tokens are sampled from the draft's
  processed distribution (temperature, top-k, top-p) and that distribution is reported as
  ``Draft.q`` (one row per node, over the target vocabulary), so verification applies
  ``min(1, p/q)``.

Worked example (draft length 3, greedy)::

    context [5, 8, 13]        runner feeds the 3 ids (or only the new ones), argmax -> 21
    then 21 -> 34, 34 -> 55    Draft.chain([21, 34, 55])
    target accepts [21] + 40   update([21, 40]); next propose crops the cache to [5, 8, 13, 21]
                               and feeds 40 alone; length shrinks 3 -> 2 (early rejection)
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..config import SamplingParams
from ..draft import SOURCE_DRAFT_MODEL, Draft
from ..sampling import warp
from . import Proposer, RequestContext

if TYPE_CHECKING:
    from ..loading import LoadedModel


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftRunner:
    """A draft model with its own KV cache, kept in step with a token sequence that may be rewritten."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.model = loaded.model
        self.device = torch.device(loaded.device)
        cfg = self.model.config
        self.max_positions = int(getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 2048))
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_one = "logits_to_keep" in params
        self.reset()

    def reset(self) -> None:
        self.cache: Any = None
        self.ids: list[int] = []  # what the cache (plus ``_last``) holds
        self._last: torch.Tensor | None = None  # [vocab] logits after ``ids``

    @torch.inference_mode()
    def logits_after(self, ids: Sequence[int]) -> torch.Tensor:
        """Next-token logits [vocab] (float32) after ``ids``, feeding only what the cache lacks."""
        if not ids:
            raise ValueError("the draft model needs at least one context token")
        n = common_prefix(self.ids, ids)
        if n == len(ids) == len(self.ids) and self._last is not None:
            return self._last
        n = min(n, len(ids) - 1)  # feed at least one token to get logits
        if self.cache is None or n == 0:
            from transformers import DynamicCache

            self.cache = DynamicCache(config=self.model.config)
            n = 0
        elif self.cache.get_seq_length() > n:
            self.cache.crop(n - self.cache.get_seq_length())  # negative: drop that many (any transformers)
        kwargs: dict[str, Any] = {self._cache_kw: self.cache, "use_cache": True}
        if self._keep_one:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=torch.tensor([list(ids[n:])], device=self.device), **kwargs)
        self.ids = list(ids)
        self._last = out.logits[0, -1].float()
        return self._last

    def extend(self, token: int) -> torch.Tensor:
        """Logits after appending ``token`` to the current ids."""
        return self.logits_after([*self.ids, token])

    def room(self) -> int:
        return self.max_positions - len(self.ids) - 1


def draft_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The draft's sampling distribution [vocab] (float64), processed like the target's (``sampling.warp``).

    Any distribution would keep verification lossless as long as it is the one the token was
    drawn from; processing it like the target's makes it closer to ``p`` (higher acceptance).
    """
    return warp(logits.double(), sampling)


def fit_width(row: torch.Tensor, width: int) -> torch.Tensor:
    """Pad with zeros or cut a distribution row to ``width`` entries, renormalized."""
    if row.shape[-1] > width:
        row = row[..., :width]
    elif row.shape[-1] < width:
        row = torch.nn.functional.pad(row, (0, width - row.shape[-1]))
    return row / row.sum(-1, keepdim=True).clamp_min(1e-300)


class AdaptiveLength:
    """Draft length that grows by one after full acceptance and shrinks after early rejection.

    ``4`` drafted, ``4`` accepted -> 5; ``4`` drafted, ``1`` accepted (less than half) -> 3.
    """

    def __init__(self, start: int = 4, low: int = 1, high: int = 16) -> None:
        if not 1 <= low <= start <= high:
            raise ValueError(f"need 1 <= low <= start <= high, got low={low} start={start} high={high}")
        self.start, self.low, self.high = start, low, high
        self.value = start

    def reset(self) -> None:
        self.value = self.start

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        if accepted >= drafted:
            self.value = min(self.high, self.value + 1)
        elif accepted * 2 < drafted:
            self.value = max(self.low, self.value - 1)


class ModelDrafter(Proposer):
    """Shared bookkeeping of model drafters: request state, allowed sources, adaptive length."""

    name = "draft_model"

    def __init__(self, draft: LoadedModel, length: AdaptiveLength | None = None, seed_offset: int = 0,
                 min_confidence: float = 0.3, context_window: int | None = None) -> None:
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"min_confidence must be in [0, 1), got {min_confidence}")
        if context_window is not None and context_window < 16:
            raise ValueError(f"context_window must be at least 16 tokens, got {context_window}")
        self.draft = draft
        self.runner = DraftRunner(draft)
        self.length = length or AdaptiveLength()
        # stop drafting after a token the draft itself gives less than this probability (each
        # further token would cost a draft forward pass for a likely rejection)
        self.min_confidence = min_confidence
        # the draft sees at most this many tokens (a small draft trained on short contexts drafts
        # better from a recent window); default: the model's position limit
        self.context_window = min(context_window or self.runner.max_positions, self.runner.max_positions)
        self.sampling = SamplingParams()
        self.enabled = True
        self._chain: list[int] = []  # tokens of the last proposed chain (for acceptance feedback)
        self._gen = torch.Generator(device=self.runner.device)
        self._seed_offset = seed_offset

    def begin(self, request: RequestContext) -> None:
        self.sampling = request.sampling
        self.enabled = request.drafters is None or SOURCE_DRAFT_MODEL in request.drafters
        self.length.reset()
        self._chain = []
        seed = request.sampling.seed if request.sampling.seed is not None else random.randrange(2**62)
        # the draft's own randomness: reproducible for seeded requests, independent of the target's
        self._gen.manual_seed((seed * 7919 + 12345 + self._seed_offset) % 2**63)

    def _prefill(self, ids: Sequence[int], keep: int = 0) -> None:
        """Feed the prompt to the draft model now (all but its last token, which the first
        ``propose`` feeds), so a request's first draft costs one short forward pass like every
        other, and the engine's proposer gate measures a drafter by its per-step cost."""
        ids = self._window(ids, self.length.value, keep)
        if self.enabled and len(ids) > max(1, keep + 1):
            self.runner.logits_after(ids[:-1])

    def update(self, new_tokens: Sequence[int]) -> None:
        if self._chain and new_tokens:
            accepted = common_prefix(self._chain, list(new_tokens)[:-1])
            self.length.observe(len(self._chain), accepted)
        self._chain = []

    def end(self, output_ids: Sequence[int]) -> None:
        self._chain = []

    def _sample(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs.float(), 1, generator=self._gen))

    def _window(self, ids: Sequence[int], k: int, keep: int = 0) -> list[int]:
        """The draft's input: ``ids`` cut so ``k`` more tokens fit in ``context_window``.

        The cut moves in steps of a quarter window, so the KV cache is rebuilt only when it moves;
        the first ``keep`` ids (a BOS) stay.
        """
        limit = self.context_window - max(k, self.length.high) - 1  # fixed, so the cut does not jitter with k
        if len(ids) <= limit:
            return list(ids)
        step = max(1, self.context_window // 4)
        start = keep + ((len(ids) - limit) // step + 1) * step
        return list(ids[:keep]) + list(ids[start:])

    def _unsure(self, probs: torch.Tensor, token: int) -> bool:
        """The draft gave ``token`` less than ``min_confidence``: draft no further."""
        return float(probs[token]) < self.min_confidence


class DraftModelProposer(ModelDrafter):
    """Classic speculative decoding with a draft model sharing the target's vocabulary.

    ``target_vocab_size``: width of the target's logits (q rows are padded/cut to it).
    ``sample``: under sampling, draw draft tokens from the draft distribution and report ``q``
    (higher acceptance); ``False`` drafts argmax tokens without ``q`` (one-hot rule, so a seeded
    request gives the same tokens with speculation on and off).
    """

    def __init__(self, draft: LoadedModel, target_vocab_size: int | None = None, sample: bool = True,
                 length: AdaptiveLength | None = None, min_confidence: float = 0.3,
                 context_window: int | None = None) -> None:
        super().__init__(draft, length, min_confidence=min_confidence, context_window=context_window)
        self.target_vocab_size = target_vocab_size or self.runner.vocab_size
        self.sample = sample

    def begin(self, request: RequestContext) -> None:
        super().begin(request)
        self._prefill(request.prompt_ids)

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        k = min(budget, self.length.value, self.context_window // 2)
        if not self.enabled or k <= 0 or not context:
            return Draft()
        logits = self.runner.logits_after(self._window(context, k))
        use_q = self.sample and not self.sampling.greedy
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            if use_q:
                probs = fit_width(draft_probs(logits, self.sampling), self.target_vocab_size)
                tok = self._sample(probs)
                rows.append(probs)
            else:
                probs = torch.softmax(logits[: self.target_vocab_size].double(), dim=-1)
                tok = int(torch.argmax(probs))
            tokens.append(tok)
            if i + 1 == k or self._unsure(probs, tok):
                break
            logits = self.runner.extend(tok)
        self._chain = tokens
        q = torch.stack(rows) if use_q else None
        return Draft.chain(tokens, SOURCE_DRAFT_MODEL, q=q, score=float(self.length.value) / 2)


def make_draft_proposer(draft: LoadedModel, target: LoadedModel, mode: str = "auto", **kwargs: Any) -> Proposer:
    """A draft-model proposer for ``target``: same vocabulary -> :class:`DraftModelProposer`,
    otherwise :class:`~suffixspec.proposers.bridged_draft.BridgedDraftProposer`.

    ``mode``: ``"auto"``; ``"same"``; ``"text"`` (bridged, text level, one-hot rule) or
    ``"intersection"`` (bridged, token-level intersection with a known ``q``).
    """
    from tokenizer_bridge import TokenBridge

    from .bridged_draft import BridgedDraftProposer

    width = int(target.model.get_output_embeddings().weight.shape[0])
    if mode not in ("auto", "same", "text", "intersection"):
        raise ValueError(f"unknown draft mode {mode!r}; choose auto, same, text or intersection")
    if mode == "auto":
        same = TokenBridge.cached(target.tokenizer, draft.tokenizer).same_vocabulary
        mode = "same" if same else "text"
    if mode == "same":
        return DraftModelProposer(draft, target_vocab_size=width, **kwargs)
    return BridgedDraftProposer(draft, target.tokenizer, target_vocab_size=width, mode=mode, **kwargs)
