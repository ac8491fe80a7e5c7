"""What every model drafter shares: a draft model run with its own KV cache, an adaptive draft
length, and the per-request bookkeeping (:class:`ModelDrafter`).

Both model drafters build on it: :mod:`.draft_model` (same vocabulary) and :mod:`.bridged_draft`
(a different vocabulary through the token bridge); this module imports neither, so they depend on
it one way.

- :class:`DraftRunner` runs a small causal LM with its own KV cache. Given the ids the draft should
  have seen, it crops the cache to the longest common prefix with what it has already seen and
  feeds only the rest, so after the target rejects a draft suffix the cache is back in step with
  one short forward pass (the lean forward of :mod:`suffixspec.lean` is its fast path for the
  families it covers).
- :class:`AdaptiveLength` grows the draft length after a fully accepted draft and shrinks it
  after an early rejection.

Worked example (runner)::

    logits_after([5, 8, 13])       feeds 3 ids
    logits_after([5, 8, 13, 21])   feeds 21 alone (the cache holds 5 8 13)
    logits_after([5, 8, 13, 40])   crops the cache to [5, 8, 13], feeds 40
"""

from __future__ import annotations

import copy
import inspect
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..config import SamplingParams
from ..draft import SOURCE_DRAFT_MODEL
from ..kv import SlotCache, new_cache
from ..lean import PassRow, lean_forward
from ..loading import max_context
from ..prefix import common_prefix
from ..sampling import warp
from .base import Proposer, RequestContext

if TYPE_CHECKING:
    from ..loading import LoadedModel


class DraftRunner:
    """A draft model with its own KV cache, kept in step with a token sequence that may be rewritten.

    Models of a lean family (:mod:`suffixspec.lean`: Llama, Qwen2, Mistral, Gemma 3) run through the
    lean forward (``lean=True``, the default) over a one-row slot cache; others through their
    ``transformers`` forward with a ``DynamicCache``. A draft of a few million parameters spends most
    of a ``transformers`` call in Python (about 2 ms per call on the embedded 2 x 96 draft against
    ~0.3 ms lean), for a model called one to five times per step.
    """

    def __init__(self, loaded: LoadedModel, lean: bool = True) -> None:
        self.model = loaded.model
        self.device = torch.device(loaded.device)
        self.max_context = max_context(self.model.config)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_one = "logits_to_keep" in params
        self.lean = lean_forward(self.model) if lean else None
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
        if self.lean is not None:
            if self.cache is None:
                self.cache = SlotCache(1)
                self.cache.add_row()
            self._last = self.lean([PassRow(0, list(ids[n:]), None, n, "last")], self.cache)[0][0]
            self.cache.lengths[0] = len(ids)
            self.ids = list(ids)
            return self._last
        if self.cache is None or n == 0:
            self.cache = new_cache(self.model.config)  # every position kept, so crop works past a window
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
        return self.max_context - len(self.ids) - 1


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
        self.context_window = min(context_window or self.runner.max_context, self.runner.max_context)
        self.sampling = SamplingParams()
        self.enabled = True
        self._chain: list[int] = []  # tokens of the last proposed chain (for acceptance feedback)
        # the draft's sampling randomness, on the CPU whatever the draft's device: a seeded request draws
        # the same draft tokens on every device (see _sample)
        self._gen = torch.Generator()
        self._seed_offset = seed_offset
        self._prefilled = True  # the request's prompt is in the draft's cache (fed at the first propose)

    def begin(self, request: RequestContext) -> None:
        self.sampling = request.sampling
        self.enabled = request.drafters is None or SOURCE_DRAFT_MODEL in request.drafters
        self.length.reset()
        self._chain = []
        seed = request.sampling.seed if request.sampling.seed is not None else random.randrange(2**62)
        # the draft's own randomness: reproducible for seeded requests, independent of the target's
        self._gen.manual_seed((seed * 7919 + 12345 + self._seed_offset) % 2**63)

    def _prefill(self, ids: Sequence[int], keep: int = 0) -> None:
        """Feed the prompt to the draft model (all but its last token, which ``propose`` feeds) at
        the first ``propose`` of a request, timed as ``setup_s``: the engine's proposer gate then
        measures a drafter by its per-step cost, and a request whose other drafts fill the budget
        from its first step (copying, a text seam) never pays the draft model's prefill."""
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

    def fork(self) -> ModelDrafter:
        """A twin sharing the draft model's weights, with its own KV cache, length and RNG."""
        twin = copy.copy(self)
        twin.runner = copy.copy(self.runner)
        twin.runner.reset()
        twin.length = copy.copy(self.length)
        twin._gen = torch.Generator()
        return twin

    def _sample(self, probs: torch.Tensor) -> int:
        """A token drawn from ``probs`` [vocab] with the request's CPU generator. On a GPU the row comes to
        the CPU first (one transfer of the vocabulary's floats per drafted token, which reading the token
        back would wait for anyway): a GPU generator would draw other tokens for the same seed."""
        return int(torch.multinomial(probs.float().cpu(), 1, generator=self._gen))

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
        """The draft gave ``token`` less than ``min_confidence``: draft no further.

        Lossless for sampled chains too: the test decides whether node ``i + 1`` is drawn, from
        nodes ``1..i`` only (a stopping time). Node ``i``'s accept test uses ``q_i`` and nothing
        after it, and given the accepted path node ``i + 1`` is either absent (the target samples
        ``p``) or a fresh draw from ``q_{i+1}``. What would not be lossless is a cut that looks at
        a node itself or at later ones, such as keeping a chain only when it is short: that keeps
        node 1 only when it was unlikely (``q(x_1) < min_confidence``). Hence the planned size
        that :class:`~suffixspec.draft.Draft` carries for the engine's gate.

        Worked example: ``min_confidence = 0.3``, sampled ``x_1`` with ``q(x_1) = 0.2`` -> stop; the
        chain ``[x_1]`` still reaches verification (``planned = k``), whatever its length.
        """
        return float(probs[token]) < self.min_confidence
