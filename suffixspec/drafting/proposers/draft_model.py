"""Same-vocabulary draft model (classic speculative decoding), and the factory of model drafters.

- :class:`DraftModelProposer` drafts a chain with a model that shares the target's vocabulary
  (the runner, the costs and the request bookkeeping come from :mod:`.model_drafter`).
  Greedy requests: argmax tokens, no ``q``, and (inside the engine) the draft's runner-up as a sibling
  where it pays for its node. Sampling requests: tokens are sampled from the draft's processed
  distribution (temperature, top-k, top-p) and that distribution is reported as ``Draft.q`` (one row
  per node, over the target vocabulary), so verification applies ``min(1, p/q)``.
- :func:`make_draft_proposer` picks it or :class:`~.bridged_draft.BridgedDraftProposer`.

Worked example (greedy, inside the engine: F = 230 ms, a draft forward 30 ms)::

    context [5, 8, 13]        runner feeds the 3 ids (or only the new ones): 21 (p 0.9), runner-up 22 (0.08)
                              reach 0.9: 0.9 x 230 >= 30 + ~3 ms, draft on; 22 at 0.08 x 230 >= ~3 ms: a sibling
    then 21 -> 34 (0.6)       reach 0.54: draft on;   34 -> 55 (0.2): reach 0.11, 25 ms < 33 ms: stop
    Draft                     tokens [21, 22, 34, 55], parents [-1, -1, 0, 2]
    target accepts [21] + 40   update([21, 40]); next propose crops the cache to [5, 8, 13, 21] and
                              feeds 40 alone; the chain promised 0.9 + 0.54 + 0.11 and 1 came true
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from suffixspec.drafting.draft import SOURCE_DRAFT_MODEL, Draft
from suffixspec.drafting.judge import model_draft_length
from suffixspec.drafting.proposers.base import Proposer, RequestContext
from suffixspec.drafting.proposers.bridged_draft import BridgedDraftProposer
from suffixspec.drafting.proposers.model_drafter import AdaptiveLength, ModelDrafter, draft_probs, fit_width
from suffixspec.drafting.registry import Drafter

if TYPE_CHECKING:
    from suffixspec.loading import LoadedModel


class DraftModelProposer(ModelDrafter):
    """Classic speculative decoding with a draft model sharing the target's vocabulary.

    ``target_vocab_size``: width of the target's logits (q rows are padded/cut to it).
    ``sample``: under sampling, draw draft tokens from the draft distribution and report ``q``
    (higher acceptance); ``False`` drafts argmax tokens without ``q`` (one-hot rule, so a seeded
    request gives the same tokens with speculation on and off).
    """

    def __init__(self, draft: LoadedModel, target_vocab_size: int | None = None, sample: bool = True,
                 length: AdaptiveLength | None = None, min_confidence: float = 0.3,
                 context_window: int | None = None, int8: bool | None = None, max_length: int = 24) -> None:
        super().__init__(draft, length, min_confidence=min_confidence, context_window=context_window, int8=int8,
                         max_length=max_length)
        self.target_vocab_size = target_vocab_size or self.runner.vocab_size
        self.sample = sample

    def begin(self, request: RequestContext) -> None:
        super().begin(request)
        self._prefilled = False  # the prompt is fed at the first propose (see ModelDrafter._prefill)
        self._lead: list[int] = []

    def observe_lead(self, tokens: Sequence[int]) -> None:
        self._lead = list(tokens)  # vetted in one forward at the next propose (greedy drafts only)

    def drafts_with_q(self) -> bool:
        return self.sample and not self.sampling.greedy

    def setup_pending(self) -> bool:
        return self.enabled and not self._prefilled

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        self.setup_s = 0.0
        cap = min(budget, self.context_window // 2)
        if not self.enabled or cap <= 0 or not context or not self.worth_drafting(context):
            return Draft()
        if not self._prefilled:
            t = time.perf_counter()
            self._prefill(context)
            self._prefilled, self.setup_s = True, time.perf_counter() - t
        use_q = self.drafts_with_q()
        costed = self.costed()
        if not costed:
            k = min(cap, self.length.value)
        elif use_q:  # its size is judged before sampling: planned from the measured costs and acceptance
            k = model_draft_length(self.acceptance, self.step_s, self._step, min(cap, self.max_length))
        else:
            k = min(cap, self.max_length)
        ids = self._window(context, k)
        lead = [] if use_q else self._lead[:k]  # a greedy draft vets another drafter's chain in one forward
        self._lead = []
        vetted = self.vet(ids, lead) if lead else None  # its logits after ids and after each lead token
        logits = vetted[0] if vetted is not None else self.logits(ids)
        self._reaches = []
        tokens: list[int] = []
        parents: list[int] = []
        rows: list[torch.Tensor] = []
        chain: list[int] = []
        node_probs: list[float] = []  # each node's reach (a runner-up's: its parent's reach times its probability)
        reach, score, last = 1.0, 0.0, -1
        while True:
            if use_q:
                probs = fit_width(draft_probs(logits, self.sampling), self.target_vocab_size)
                tok = self._sample(probs)
                rows.append(probs)
            else:
                probs = torch.softmax(logits[: self.target_vocab_size].double(), dim=-1)
                top = torch.topk(probs, 2)
                tok = int(top.indices[0])
            tokens.append(tok)
            parents.append(last)
            last = len(tokens) - 1
            chain.append(tok)
            alt_reach = reach * float(top.values[1]) if not use_q else 0.0
            reach *= float(probs[tok])
            self._reaches.append(reach)
            node_probs.append(reach)
            score += reach
            if costed and not use_q and len(tokens) < cap and self.judge.branch(alt_reach, len(tokens), self._step):
                # a small tree where the draft's top two are close: its runner-up as a sibling, not drafted on
                tokens.append(int(top.indices[1]))
                parents.append(parents[last])
                node_probs.append(alt_reach)
                score += alt_reach
            if len(chain) >= k or len(tokens) >= cap or not self.draft_further(reach, len(tokens), probs, tok):
                break
            ids.append(tok)
            if vetted is not None and len(chain) < len(vetted) and tok == lead[len(chain) - 1]:
                logits = vetted[len(chain)]  # still on the vetted chain: its next row is already computed
            else:
                vetted = None
                logits = self.logits(ids)  # the runner drops what it fed past the agreement
        self.learn_cost()
        self._chain = chain
        q = torch.stack(rows) if use_q else None
        if use_q:  # score fixed before sampling (the gates judge it; see ModelDrafter._unsure)
            a, term, score = self.acceptance, 1.0, 0.0
            for _ in range(k):
                term *= a
                score += term
            score = score if costed else float(self.length.value) / 2
        elif not costed:
            score = float(self.length.value) / 2
        return Draft(tokens, parents, [SOURCE_DRAFT_MODEL] * len(tokens), q, None, score=score,
                     planned=k if use_q else None, probs=None if use_q else node_probs)


def make_draft_proposer(draft: LoadedModel, target: LoadedModel, mode: str = "auto", **kwargs: Any) -> Proposer:
    """A draft-model proposer for ``target``: same vocabulary -> :class:`DraftModelProposer`,
    otherwise :class:`~suffixspec.drafting.proposers.bridged_draft.BridgedDraftProposer`.

    ``mode``: ``"auto"``; ``"same"``; ``"text"`` (bridged, text level, one-hot rule) or
    ``"intersection"`` (bridged, token-level intersection with a known ``q``).
    """
    from suffixspec.tokenizer_bridge import TokenBridge

    width = int(target.model.get_output_embeddings().weight.shape[0])
    if mode not in ("auto", "same", "text", "intersection"):
        raise ValueError(f"unknown draft mode {mode!r}; choose auto, same, text or intersection")
    if mode == "auto":
        same = TokenBridge.cached(target.tokenizer, draft.tokenizer).same_vocabulary
        mode = "same" if same else "text"
    if mode == "same":
        proposer = DraftModelProposer(draft, target_vocab_size=width, **kwargs)
    else:
        proposer = BridgedDraftProposer(draft, target.tokenizer, target_vocab_size=width, mode=mode, **kwargs)
    proposer.estimate_cost(target)
    return proposer


# This drafter (suffixspec.drafting.registry): built where a draft model is named
DRAFTER = Drafter(
    name="draft_model",
    sources=("draft_model",),
    needs=("draft", "target"),
    order=10,
    build=make_draft_proposer,
)
