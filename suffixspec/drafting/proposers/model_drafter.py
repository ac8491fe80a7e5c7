"""What every model drafter shares: a draft model run with its own KV cache, an adaptive draft
length, and the per-request bookkeeping (:class:`ModelDrafter`).

Both model drafters build on it: :mod:`.draft_model` (same vocabulary) and :mod:`.bridged_draft`
(a different vocabulary through the token bridge); this module imports neither, so they depend on
it one way.

- :class:`DraftRunner` runs a small causal LM with its own KV cache. Given the ids the draft should
  have seen, it crops the cache to the longest common prefix with what it has already seen and
  feeds only the rest, so after the target rejects a draft suffix the cache is back in step with
  one short forward pass (the lean forward of :mod:`suffixspec.core.lean` is its fast path for the
  families it covers).
- :class:`ModelDrafter` keeps what a drafter learns across requests (the CPU seconds of one draft
  forward, the acceptance of its first and later tokens) and, inside the engine, judges each draft
  from those costs (:class:`~suffixspec.drafting.judge.ModelDraftJudge`: whether to draft, how far, which
  runner-ups to branch on). Outside the engine (no costs told) :class:`AdaptiveLength` grows the draft
  length after a fully accepted draft and shrinks it after an early rejection.
- A draft model on a CPU runs on int8 matrices when it was loaded with ``weights="int8"`` (or ``auto``
  resolved to it), or has :data:`INT8_MIN_PARAMS` or more parameters; the int8 kernel is the one measured
  faster for one row here (``formats.draft_int8_kind``: fbgemm's, else the exact rows).

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

from suffixspec.config import SamplingParams
from suffixspec.core.formats import GGUF, draft_int8_kind
from suffixspec.core.kv import SlotCache, new_cache
from suffixspec.core.lean import PassRow, lean_forward
from suffixspec.core.prefix import common_prefix
from suffixspec.core.sampling import warp
from suffixspec.drafting.costs import StepCost, cpu_clock
from suffixspec.drafting.draft import SOURCE_DRAFT_MODEL
from suffixspec.drafting.judge import ModelDraftJudge
from suffixspec.drafting.policy import DEFAULT, Policy
from suffixspec.drafting.proposers.base import Proposer, RequestContext
from suffixspec.loading import max_context

if TYPE_CHECKING:
    from suffixspec.loading import LoadedModel


# Draft models of at least this many parameters run on int8 matrices by default (``ModelDrafter(int8=None)``):
# measured with Qwen2.5-Coder-1.5B-Instruct drafting for itself's 0.5B sibling on HumanEval chat prompts
# (greedy, 256 new tokens, one thread, load 9-12), the int8 draft accepted as many tokens as the float32
# one (80/89, 134/145, 144/158 against 79/91, 133/148, 146/158) for a third of its CPU time, and the
# requests took 9.1 / 12.2 / 13.0 CPU s against 14.3 / 21.2 / 19.6 (speculation off: 22.7 / 37.2 / 35.1).
# Smaller drafts (the embedded 9M-parameter pair, test models) stay in float32: their step is cheap anyway.
INT8_MIN_PARAMS = 100_000_000


class DraftRunner:
    """A draft model with its own KV cache, kept in step with a token sequence that may be rewritten.

    Models of a lean family (:mod:`suffixspec.core.lean`: Llama, Qwen2, Mistral, Gemma 3) run through the
    lean forward (``lean=True``, the default) over a one-row slot cache; others through their
    ``transformers`` forward with a ``DynamicCache``. A draft of a few million parameters spends most
    of a ``transformers`` call in Python, several times a lean call (docs/benchmarks.md, "Figures behind
    the policy's defaults"), for a model called one to five times per step.
    """

    def __init__(self, loaded: LoadedModel, lean: bool = True, int8: bool = False) -> None:
        """``int8``: run on int8 matrices (the kind ``formats.draft_int8_kind`` measures faster), falling back
        to the float lean forward where that cannot be built (a failure isolated to the int8 kind)."""
        self.model = loaded.model
        self.device = torch.device(loaded.device)
        self.max_context = max_context(self.model.config)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_one = "logits_to_keep" in params
        # a draft loaded at gguf runs its file's blocks; int8: the lean forward on int8 matrices, where this torch
        # has them; else float
        kind = (loaded.weights if loaded.weights in GGUF and lean else
                draft_int8_kind() if int8 and lean and self.device.type == "cpu" else "float")
        self.lean = (lean_forward(self.model, kind) if kind != "float" else None) or (
            lean_forward(self.model) if lean else None)
        self.int8 = self.lean is not None and self.lean.int8
        self.reset()

    def reset(self) -> None:
        self.cache: Any = None
        self.ids: list[int] = []  # what the cache (plus ``_last``) holds
        self._last: torch.Tensor | None = None  # [vocab] logits after ``ids``
        self.fed = 0  # tokens the last call fed through the model (0: its logits were kept)

    @torch.inference_mode()
    def logits_after(self, ids: Sequence[int]) -> torch.Tensor:
        """Next-token logits [vocab] (float32) after ``ids``, feeding only what the cache lacks."""
        if not ids:
            raise ValueError("the draft model needs at least one context token")
        n = common_prefix(self.ids, ids)
        if n == len(ids) == len(self.ids) and self._last is not None:
            self.fed = 0
            return self._last
        self._feed(ids, min(n, len(ids) - 1), every=False)  # at least one token fed, to get logits
        return self._last

    def extend(self, token: int) -> torch.Tensor:
        """Logits after appending ``token`` to the current ids."""
        return self.logits_after([*self.ids, token])

    @torch.inference_mode()
    def logits_along(self, ids: Sequence[int], start: int) -> torch.Tensor:
        """Next-token logits [len(ids) - start, vocab] after each of ``ids[:start + 1]``, ..., ``ids``, in one
        forward (feeding what the cache lacks from ``ids[start]`` on at the latest): what the draft model
        says at every position of a chain another drafter proposed. Example: ids = context + [a, b],
        start = len(context) - 1 -> three rows: after the context, after a, after a b."""
        if not 0 <= start < len(ids):
            raise ValueError(f"start must index ids (0 <= start < {len(ids)}), got {start}")
        rows, n = self._feed(ids, min(common_prefix(self.ids, ids), start), every=True)
        return rows[start - n:]

    def _feed(self, ids: Sequence[int], n: int, every: bool) -> tuple[torch.Tensor, int]:
        """Feed ``ids[n:]`` after the cache's first ``n`` positions (a cache without them starts over) and
        make the cache hold ``ids``: the logits rows [fed, vocab] of every fed position (``every``) or
        [1, vocab] of the last, and where the feed started."""
        if self.lean is not None:
            if self.cache is None:
                self.cache = SlotCache(1)
                self.cache.add_row()
            rows = self.lean([PassRow(0, list(ids[n:]), None, n, "all" if every else "last")], self.cache)[0]
            self.cache.lengths[0] = len(ids)
        else:
            if self.cache is None or n == 0:
                self.cache = new_cache(self.model.config)  # every position kept, so crop works past a window
                n = 0
            elif self.cache.get_seq_length() > n:
                self.cache.crop(n - self.cache.get_seq_length())  # negative: drop that many (any transformers)
            kwargs: dict[str, Any] = {self._cache_kw: self.cache, "use_cache": True}
            if self._keep_one and not every:
                kwargs["logits_to_keep"] = 1
            out = self.model(input_ids=torch.tensor([list(ids[n:])], device=self.device), **kwargs)
            rows = out.logits[0].float() if every else out.logits[0, -1:].float()
        self.ids = list(ids)
        self._last = rows[-1]
        self.fed = len(ids) - n
        return rows, n

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
    """Shared bookkeeping of model drafters: request state, allowed sources, the draft's costs and yield.

    Inside the engine (``observe_costs`` tells it the pass cost each step) a model drafter judges its own
    drafts from measured costs (:class:`~suffixspec.drafting.judge.ModelDraftJudge`): whether to draft this step,
    how far (while the draft's own probability of its tokens so far pays for another forward), which
    runner-ups to add as branches. Called alone (no costs told: a test, a script), it drafts
    :class:`AdaptiveLength` tokens and stops after one it gives less than ``min_confidence``.

    ``int8``: run the draft on int8 matrices (:class:`suffixspec.core.lean.Int8Weight`; float32 where this
    torch lacks them). ``max_length``: the most tokens a draft may have when the costs decide."""

    name = "draft_model"
    judges_own_cost = True

    def __init__(self, draft: LoadedModel, length: AdaptiveLength | None = None, seed_offset: int = 0,
                 min_confidence: float = 0.3, context_window: int | None = None, int8: bool | None = None,
                 max_length: int = 24, policy: Policy | None = None) -> None:
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"min_confidence must be in [0, 1), got {min_confidence}")
        if context_window is not None and context_window < 16:
            raise ValueError(f"context_window must be at least 16 tokens, got {context_window}")
        self.draft = draft
        if int8 is None:  # by the format it was loaded with, else by size (int8 runs on a CPU only: DraftRunner)
            int8 = draft.weights == "int8" or (draft.weights == "float32" and sum(
                p.numel() for p in draft.model.parameters()) >= INT8_MIN_PARAMS)
        self.runner = DraftRunner(draft, int8=int8)
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
        if max_length < 1:
            raise ValueError(f"max_length must be at least 1, got {max_length}")
        self.max_length = max_length
        self.policy = policy or DEFAULT
        # what this drafter learned over the engine's life: CPU seconds of one draft forward (None: not
        # measured yet), and the first token's and a drafted token's acceptance, each request's starting point
        self.step_s: float | None = None
        self.first_prior = self.policy.acceptance_prior
        self.token_prior = self.policy.acceptance_prior
        self.step_ratio: float | None = None  # a draft forward over the target's plain step, by bytes (estimate_cost)
        self.judge = ModelDraftJudge(self.policy, self.first_prior)
        self._hits, self._tries = self.token_prior, 1.0  # this request's per-token acceptance (moving)
        self._step: StepCost | None = None  # the pass cost told this step (None: judge nothing)
        self._fwd_cpu, self._fwd_n = 0.0, 0  # CPU seconds and count of this call's draft forwards
        self._reach = 1.0  # the chance that the draft's tokens so far all come true (_stop_after)
        self._reaches: list[float] = []  # per token of the last chain: its reach (the judge's calibration)

    def begin(self, request: RequestContext) -> None:
        self.sampling = request.sampling
        self.enabled = request.drafters is None or SOURCE_DRAFT_MODEL in request.drafters
        self.length.reset()
        self._chain = []
        seed = request.sampling.seed if request.sampling.seed is not None else random.randrange(2**62)
        # the draft's own randomness: reproducible for seeded requests, independent of the target's
        self._gen.manual_seed((seed * 7919 + 12345 + self._seed_offset) % 2**63)
        self.judge = ModelDraftJudge(self.policy, self.first_prior, self.step_ratio)
        self.judge.step_s = self.step_s
        self._hits, self._tries = self.token_prior, 1.0
        self._step = None

    def active(self) -> bool:
        return self.enabled

    def estimate_cost(self, target: LoadedModel) -> None:
        """Until a draft forward is measured, judge the draft as costing its share of the target's plain step by
        the weight bytes each reads a step (``weights.weight_bytes``; a CPU decode step is bound by reading them):
        without it the first request ran the draft (its prompt's prefill, 0.65 s for 156 tokens on
        Qwen2.5-Coder-0.5B at gguf) before anything said it paid. Example: the 0.5B at gguf reads 0.39 of what
        its 1.5B target reads (measured steps: 16-20 and 32-35 ms)."""
        from suffixspec.core.lean import lean_forward
        from suffixspec.core.weights import weight_bytes

        ours = weight_bytes(self.draft.model, self.runner.lean)
        theirs = weight_bytes(target.model, lean_forward(target.model, target.lean_kind))
        self.step_ratio = ours / theirs if theirs > 0 else None
        self.judge.step_ratio = self.step_ratio

    def observe_costs(self, step: StepCost | None) -> None:
        # with its own judgement off (judges_own_cost False: the engine's gates judge its drafts) it plans
        # nothing from costs: its drafts keep the lengths its confidence gives
        self._step = step if self.judges_own_cost else None

    @property
    def acceptance(self) -> float:
        """This request's per-token acceptance of drafted tokens (moving average, from the drafter's prior)."""
        return self._hits / self._tries if self._tries > 0 else self.token_prior

    def observe_promise(self, tokens: float) -> None:
        self.judge.promised_before = tokens  # an accepted token of ours is worth a plain step over (1 + these)

    def costed(self) -> bool:
        """Whether this step's draft is judged from measured costs (inside the engine, once measured)."""
        return self._step is not None and self.step_s is not None and self._step.plain() is not None

    def worth_drafting(self, context: Sequence[int] | None = None) -> bool:
        """False when the draft does not pay this step (``ModelDraftJudge.worth``; always True outside
        the engine). ``context``: the ids the draft would continue; the tokens of it the draft's cache lacks
        (the prompt before the first draft, the tokens accepted while the draft sat out) are fed in its first
        forward, which then costs :meth:`forwards` of them, not one."""
        if self._step is None:
            return True
        lag = 1
        if context is not None:
            window = self._window(context, self.length.value)
            lag = max(1, len(window) - common_prefix(self.runner.ids, window))
        return self.judge.worth(self._step, self.forwards(lag))

    def forwards(self, tokens: int) -> float:
        """A draft forward over ``tokens`` new inputs in one-token forwards: ``t(tokens) / t(1)`` on the
        target's pass curve (the same kinds of matrices, read once for all the inputs), 1.0 for one token or
        while no pass was measured. Example: t(1) = 46 ms, t(2) = 56 ms -> forwards(2) = 1.22."""
        if tokens <= 1 or self._step is None:
            return 1.0
        one, many = self._step.cost.estimate(1), self._step.cost.estimate(tokens)
        return 1.0 if not one or many is None else max(1.0, many / one)

    def draft_further(self, reach: float, nodes: int, probs: torch.Tensor, token: int) -> bool:
        """Whether to draft another token after one whose chain so far comes true with chance ``reach``:
        by the costs inside the engine, else unless the draft was unsure of ``token`` (``_unsure``)."""
        if self.costed():
            return self.judge.further(reach, nodes, self._step)
        return not self._unsure(probs, token)

    def _stop_after(self, probs: torch.Tensor, token: int, drafted: int) -> bool:
        """Whether drafting stops after ``token`` (the ``drafted``-th draft token, drawn from ``probs``),
        keeping the chain's reach in ``_reach`` (reset by the caller at each draft)."""
        self._reach *= float(probs[token])
        self._reaches.append(self._reach)
        return not self.draft_further(self._reach, drafted, probs, token)

    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        """``runner.logits_after(ids)``, its CPU time counted toward ``step_s`` as :meth:`forwards` of the
        tokens it fed: a forward that first catches up on the tokens accepted while the draft sat out (30 of
        them cost 65-100 ms against 22 for one, Qwen2.5-Coder-0.5B at gguf) read as one forward made the
        draft look three times as slow, and the judge then kept it off where it paid."""
        t = cpu_clock()
        out = self.runner.logits_after(ids)
        if self.runner.fed:  # (0: its logits were kept, no forward)
            self._fwd_cpu += (cpu_clock() - t) / self.forwards(self.runner.fed)
            self._fwd_n += 1
        return out

    def extend(self, token: int) -> torch.Tensor:
        """``runner.extend(token)``, timed as :meth:`logits`."""
        return self.logits([*self.runner.ids, token])

    def vet(self, ids: Sequence[int], chain: Sequence[int]) -> torch.Tensor:
        """The draft's logits after ``ids`` and after each token of ``chain`` (another drafter's proposal) in
        one forward (``runner.logits_along``): ``len(chain) + 1`` rows. Not folded into ``step_s``, the cost of
        one more token drafted one at a time, which the judge weighs."""
        return self.runner.logits_along([*ids, *chain], len(ids) - 1)

    def learn_cost(self) -> None:
        """Fold this call's draft forwards into ``step_s`` (a moving average over the engine's life)."""
        if self._fwd_n:
            per = self._fwd_cpu / self._fwd_n
            rate = self.policy.proposer_rate
            self.step_s = per if self.step_s is None else (1 - rate) * self.step_s + rate * per
            self.judge.step_s = self.step_s
        self._fwd_cpu, self._fwd_n = 0.0, 0

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
            new = list(new_tokens)
            self.length.observe(len(self._chain), common_prefix(self._chain, new[:-1]))
            # what the target said of the chain: verified, its accepted run and (but for a full run) the miss
            # after it; not verified, only whether the target's own token is the first (as the one-hot rule
            # would have judged it). Lossless as a record of the past: it only shapes later drafts.
            known = min(len(self._chain), len(new))
            hits = common_prefix(self._chain[:known], new)
            rate = self.policy.accepted_rate
            self._hits = (1 - rate) * self._hits + rate * hits
            self._tries = (1 - rate) * self._tries + rate * (hits + (hits < known))
            self.judge.observe(new[0] == self._chain[0], sum(self._reaches[:known]), hits)
        self._chain = []
        self._reaches = []

    def end(self, output_ids: Sequence[int]) -> None:
        self._chain = []
        # the next request starts from what this one learned (half way: requests differ)
        self.first_prior = 0.5 * self.first_prior + 0.5 * self.judge.first
        self.token_prior = 0.5 * self.token_prior + 0.5 * self.acceptance

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
        that :class:`~suffixspec.drafting.draft.Draft` carries for the engine's gate.

        Worked example: ``min_confidence = 0.3``, sampled ``x_1`` with ``q(x_1) = 0.2`` -> stop; the
        chain ``[x_1]`` still reaches verification (``planned = k``), whatever its length.
        """
        return float(probs[token]) < self.min_confidence
