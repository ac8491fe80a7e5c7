"""Different-vocabulary draft model through the token bridge (universal assisted generation).

Two modes:

- ``"text"``: the draft writes text in its own tokens; the bridge re-encodes the new tail with the
  target tokenizer (look-behind window) and, with ``siblings > 0`` (off by default), the boundary
  lattice adds the other target tokens that could spell the draft's last, possibly unfinished,
  word as siblings. No ``q``: the one-hot
  rule verifies it, lossless at any temperature. Draft tokens are the draft's argmax (the choice
  that maximizes the chance ``y ~ p`` lands on the node); the draft's runner-up first tokens
  (``alternatives``, when their probability reaches ``alt_confidence``) are translated too and
  offered as further first-position branches.
- ``"intersection"``: at every step the draft distribution is restricted to the tokens both
  vocabularies spell the same way and renormalized; the drafted token is a target token sampled
  from that distribution, which is reported as ``q`` (the ``min(1, p/q)`` rule). Greedy requests
  take the argmax of the restricted distribution (computed over the draft ids that have a twin,
  never spread onto the target vocabulary), omit ``q``, and get text mode's token healing,
  boundary siblings and runner-up branch.

Token healing (text mode and greedy intersection mode): the target's context often ends on a token the
draft would have merged with what follows (the target wrote ``"\\n"``, the draft would write
``"\\n\\n"``); the draft backs up its context's last token and redraws it among the tokens that
extend it, and the drafted text starts after the bytes the context already holds. Without it a
weak draft loses most first tokens at such boundaries (measured on the embedded pair: tokens per
step 1.09 -> 1.31 in intersection mode).

The draft's context is kept in draft tokens by :class:`tokenizer_bridge.DraftContext`: each step
the target's new tokens are appended as bytes and only a look-behind window is re-encoded; the
draft's KV cache is cropped to the common prefix of what it saw and the new ids.

Worked example (text mode, ``siblings=2``; target byte-level BPE, draft SentencePiece)::

    target context  "...def add(a, b):\\n"      draft context  [..."▁def", "▁add", "(", "a", ",", "▁b", "):\\n"]
    draft argmax    ["▁", "▁", "▁", "▁return", "▁a"]  -> bytes b"    return a"
    bridge          ["ĠĠĠ", "Ġreturn", "Ġa"]       + siblings of "Ġa": ["Ġadd", "Ġand"]
    Draft tokens    [ĠĠĠ, Ġreturn, Ġa, Ġadd, Ġand], parents [-1, 0, 1, 1, 1]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from suffixspec.drafting.draft import SOURCE_DRAFT_MODEL, Draft
from suffixspec.drafting.proposers.base import RequestContext
from suffixspec.drafting.proposers.model_drafter import AdaptiveLength, ModelDrafter, draft_probs
from suffixspec.tokenizer_bridge import BoundaryLattice, DraftContext, TokenBridge

if TYPE_CHECKING:
    from suffixspec.loading import LoadedModel

MODES = ("text", "intersection")


class BridgedDraftProposer(ModelDrafter):
    """A draft model with its own tokenizer, bridged onto the target vocabulary.

    ``target_vocab_size``: width of the target's logits (``q`` rows). ``siblings``: how many
    boundary-lattice alternatives to add next to the last drafted token (text mode, greedy
    intersection). ``heal``: redraw the context's last draft token among the tokens that extend
    it (token healing), since the target's token boundaries are not the draft's.
    ``alternatives``: how many of the draft's runner-up first tokens (each with probability at
    least ``alt_confidence``) to add as further first-position branches (text mode, greedy
    intersection); a weak draft's first token is its most often accepted one.
    ``first_confidence``: propose nothing when the draft gives its first token less than this
    (text mode, greedy intersection): on a CPU, verifying any draft costs the target more than a
    plain step, which an unsure first token rarely pays back.

    Defaults measured on the embedded pair (8 held-out prompts x 48 tokens, greedy, drafting every
    step): boundary siblings left tokens per target pass unchanged (text 1.123 with two, 1.120
    without; intersection 1.200 both) while each verified node costs the target ~0.7 ms, so
    ``siblings=0``; a second runner-up first token raised intersection mode to 1.211 for 0.3 nodes.
    ``first_confidence`` 0 -> 0.2: text 1.126 -> 1.110 tokens per pass, 62.0 -> 72.2 tokens/s;
    intersection 1.211 -> 1.150, 62.8 -> 69.1 tokens/s (one thread).
    """

    def __init__(self, draft: LoadedModel, target_tokenizer: Any, target_vocab_size: int | None = None,
                 mode: str = "text", siblings: int = 0, length: AdaptiveLength | None = None,
                 min_confidence: float = 0.3, context_window: int | None = None, heal: bool = True,
                 alternatives: int = 2, alt_confidence: float = 0.05, first_confidence: float = 0.2,
                 int8: bool | None = None, max_length: int = 24) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown bridge mode {mode!r}; choose one of {MODES}")
        super().__init__(draft, length, seed_offset=1, min_confidence=min_confidence, context_window=context_window,
                         int8=int8, max_length=max_length)
        self.mode = mode
        self.siblings = siblings
        if alternatives < 0 or not 0.0 <= alt_confidence <= 1.0:
            raise ValueError(f"need alternatives >= 0 and 0 <= alt_confidence <= 1, got {alternatives}, {alt_confidence}")
        self.alternatives = alternatives
        self.alt_confidence = alt_confidence
        if not 0.0 <= first_confidence < 1.0:
            raise ValueError(f"first_confidence must be in [0, 1), got {first_confidence}")
        self.first_confidence = first_confidence
        self.bridge = TokenBridge.cached(target_tokenizer, draft.tokenizer, target_size=target_vocab_size,
                                         draft_size=self.runner.vocab_size)
        self.target_vocab_size = self.bridge.target_size
        if mode == "intersection":
            inter = self.bridge.intersection  # built once per tokenizer pair
            self._to_draft = torch.as_tensor(inter.to_draft, device=self.runner.device)
            self._mapped_draft = torch.as_tensor(inter.draft_ids, device=self.runner.device)
            self._mapped_target = inter.target_ids.tolist()  # parallel to _mapped_draft
        self.ctx: DraftContext | None = None
        self._keep = len(self.bridge.draft_prefix_ids())  # the draft's BOS stays when its context is cut
        self.heal = heal
        self._heal_cache: dict[bytes, torch.Tensor] = {}  # last token bytes -> draft ids extending them
        self._twin_cache: dict[bytes, tuple[torch.Tensor, list[int]] | None] = {}
        self._draft_lattice: BoundaryLattice | None = None
        self._pushed = 0  # target tokens the draft context has seen (pushed or waiting in _unpushed)
        # tokens not yet re-encoded into the draft context: pushed when the next draft needs them, so a
        # step that does not call this proposer (the engine's ProposerGate skips it) costs nothing
        # here, and a push of n tokens costs about one push of one (0.06 ms per call on this CPU)
        self._unpushed: list[int] = []

    def begin(self, request: RequestContext) -> None:
        super().begin(request)
        # the prompt is encoded into draft tokens and fed to the draft at the first propose, timed as
        # setup_s (see ModelDrafter._prefill): a request other drafters serve alone never pays for it
        self.ctx = None
        self._pushed = len(request.prompt_ids)
        self._unpushed = []

    def update(self, new_tokens: Sequence[int]) -> None:
        super().update(new_tokens)
        if self.ctx is not None:
            self._unpushed.extend(new_tokens)
            self._pushed += len(new_tokens)

    def end(self, output_ids: Sequence[int]) -> None:
        super().end(output_ids)
        self.ctx = None

    def drafts_with_q(self) -> bool:
        return self.mode == "intersection" and not self.sampling.greedy

    def setup_pending(self) -> bool:
        return self.enabled and self.ctx is None

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        self.setup_s = 0.0
        if not self.enabled or budget <= 0 or not context or not self.worth_drafting():
            return Draft()
        try:
            return self._propose(context, budget)
        finally:
            self.learn_cost()

    def _propose(self, context: Sequence[int], budget: int) -> Draft:
        if self.ctx is None or self._pushed != len(context):  # the request's first call (or out of step)
            t = time.perf_counter()
            self.ctx = self.bridge.draft_context(context)
            self._pushed, self._unpushed = len(context), []
            self._prefill(self.ctx.ids, self._keep)
            self.setup_s = time.perf_counter() - t
        elif self._unpushed:
            self.ctx.push_target(self._unpushed)
            self._unpushed = []
        if not self.ctx.ids:
            return Draft()
        k = min(budget, self.max_length if self.costed() else self.length.value, self.context_window // 2)
        self._reach, self._reaches = 1.0, []  # chance that every draft token so far comes true (its own probabilities)
        if self.mode == "text":
            return self._propose_text(context, k, budget)
        return self._propose_intersection(k, budget)

    # -- text level ---------------------------------------------------------------------------------
    def _propose_text(self, context: Sequence[int], k: int, budget: int) -> Draft:
        ids = self._window(self.ctx.ids, k, self._keep)
        healed = self._heal_candidates(ids)
        skip = b""
        if healed is not None:
            # token healing: the context's last draft token ("\n") may be the start of a longer
            # token ("\n\n") the draft would write; back it up and let the draft redo it,
            # restricted to tokens that begin with the same bytes
            skip = self.bridge.draft.token_bytes[ids[-1]]
            ids = ids[:-1]
        logits = self.logits(ids)
        d_tokens: list[int] = []
        runner_up: list[int] = []
        for i in range(k):
            probs = torch.softmax(logits.double(), dim=-1)
            if i == 0 and healed is not None:
                probs = torch.zeros_like(probs).index_copy_(0, healed, probs.index_select(0, healed))
                probs = probs / probs.sum()
            confidence = None  # the draft's probability of tok, when read already
            if i == 0 and self.alternatives:
                values, indices = (t.tolist() for t in torch.topk(probs, 1 + self.alternatives))  # one read each
                tok, confidence = indices[0], values[0]
                runner_up = [t for v, t in zip(values[1:], indices[1:], strict=True) if v >= self.alt_confidence]
            else:
                tok = int(torch.argmax(probs))
            if i == 0 and (float(probs[tok]) if confidence is None else confidence) < self.first_confidence:
                return Draft()  # a draft this unsure costs the target more than it is likely to save
            d_tokens.append(tok)
            if tok in self.bridge.draft_eos or i + 1 == k or self._stop_after(probs, tok, i + 1):
                break
            logits = self.extend(tok)
        tr = self.bridge.translate(context, d_tokens, skip=skip + self.ctx.pending)
        chain = tr.target_ids[: min(k, budget)]
        if not chain:
            return Draft()
        self._chain = chain
        tokens, parents = list(chain), list(range(-1, len(chain) - 1))
        room = budget - len(tokens)
        if self.siblings and room > 0 and not tr.eos and len(chain) == len(tr.target_ids):
            # the draft stopped mid-text: its last target token may be a fragment of a longer token
            for s in self.bridge.siblings(chain[-1], tr.rest, k=min(self.siblings, room)):
                tokens.append(s)
                parents.append(parents[len(chain) - 1])
        for alt in runner_up:
            # the draft's runner-up first token, translated: a second branch at the root
            first = self.bridge.translate(context, [alt], skip=skip + self.ctx.pending).target_ids[:1]
            if first:
                self._add_root(tokens, parents, first[0], budget)
        return Draft(tokens, parents, [SOURCE_DRAFT_MODEL] * len(tokens), score=float(len(chain)) / 2)

    @staticmethod
    def _add_root(tokens: list[int], parents: list[int], token: int | None, budget: int) -> None:
        """Add ``token`` as a first-position branch unless it is there or the budget is spent."""
        if token is None or len(tokens) >= budget:
            return
        if not any(p == -1 and t == token for t, p in zip(tokens, parents, strict=True)):
            tokens.append(token)
            parents.append(-1)

    def _heal_candidates(self, ids: Sequence[int]) -> torch.Tensor | None:
        """Draft ids whose bytes start with the last context token's bytes (None: nothing to heal)."""
        if not self.heal or len(ids) <= self._keep + 1:
            return None
        last = self.bridge.draft.token_bytes[ids[-1]] if 0 <= ids[-1] < self.bridge.draft.size else None
        if not last:
            return None
        hit = self._heal_cache.get(last)
        if hit is None:
            if self._draft_lattice is None:
                self._draft_lattice = BoundaryLattice(self.bridge.draft)
            cands = self._draft_lattice.completions(last, k=self._draft_lattice.max_scan)
            hit = torch.as_tensor(cands, device=self.runner.device) if len(cands) > 1 else torch.empty(0)
            self._heal_cache[last] = hit
        return hit if hit.numel() > 1 else None

    # -- token-level intersection --------------------------------------------------------------------
    def _propose_intersection(self, k: int, budget: int) -> Draft:
        ids = self._window(self.ctx.ids, k, self._keep)
        if self.sampling.greedy:
            return self._intersection_greedy(ids, k, budget)
        logits = self.logits(ids)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            q = self.bridge.map_q(draft_probs(logits, self.sampling))  # [target_vocab]
            if float(q.sum()) <= 0.0:  # no mass on the intersection
                break
            tok = self._sample(q)
            tokens.append(tok)
            rows.append(q)
            if tok in self.bridge.target_eos or i + 1 == k or self._stop_after(q, tok, i + 1):
                break
            logits = self.extend(int(self._to_draft[tok]))
        if not tokens:
            return Draft()
        self._chain = tokens
        # score and size as planned before sampling (k), never the sampled length: the gate judges them
        return Draft.chain(tokens, SOURCE_DRAFT_MODEL, q=torch.stack(rows), score=float(k) / 2, planned=k)

    def _intersection_greedy(self, ids: list[int], k: int, budget: int) -> Draft:
        """Greedy: the argmax over the draft tokens that have a target twin (no ``q`` is needed, so
        the distribution is never spread onto the target vocabulary), plus the same boundary
        siblings as text mode (one-hot rule).

        Token healing as in text mode: when the context's last draft token ``B`` ("\\n") begins
        longer draft tokens, the draft redraws it among them; a redrawn ``B + R`` ("\\n\\n")
        drafts the target twin of the remainder ``R`` ("\\n").
        """
        tokens: list[int] = []
        runner_up: list[int] = []
        heal = self._heal_twins(ids)
        logits = None
        if heal is not None:
            cands, twins = heal
            probs = torch.softmax(self.logits(ids[:-1]).index_select(0, cands).double(), dim=-1)
            values, indices = (t.tolist() for t in torch.topk(probs, min(1 + self.alternatives, probs.numel())))
            best = indices[0]
            runner_up = [twins[t] for v, t in zip(values[1:], indices[1:], strict=True)
                         if twins[t] >= 0 and v >= self.alt_confidence]
            if twins[best] >= 0:  # the draft writes B + R: R's twin is the first draft token
                if values[0] < self.first_confidence:
                    return Draft()
                tokens.append(twins[best])
                if twins[best] in self.bridge.target_eos or k == 1 or self._stop_after(probs, best, 1):
                    k = 0
                else:
                    logits = self.extend(int(cands[best]))
            # else the draft keeps B as it is: draft on after it, as without healing
        if logits is None and k:
            logits = self.logits(ids)
        for i in range(len(tokens), k):
            probs = torch.softmax(logits.index_select(0, self._mapped_draft).double(), dim=-1)
            first = i == 0 and heal is None
            values, indices = (t.tolist() for t in torch.topk(probs, min(1 + (self.alternatives if first else 0),
                                                                         probs.numel())))  # one read each
            tok = int(self._mapped_target[indices[0]])
            if not tokens and values[0] < self.first_confidence:
                return Draft()
            if first:
                runner_up = [int(self._mapped_target[t]) for v, t in zip(values[1:], indices[1:], strict=True)
                             if v >= self.alt_confidence]
            tokens.append(tok)
            if tok in self.bridge.target_eos or i + 1 == k or self._stop_after(probs, indices[0], i + 1):
                break
            logits = self.extend(int(self._mapped_draft[indices[0]]))
        chain = tokens[:budget]
        self._chain = chain
        parents = list(range(-1, len(chain) - 1))
        if self.siblings and chain and chain[-1] not in self.bridge.target_eos:
            for s in self.bridge.siblings(chain[-1], k=min(self.siblings, budget - len(tokens))):
                tokens.append(s)
                parents.append(parents[len(chain) - 1])
        for alt in runner_up:
            self._add_root(tokens, parents, alt, budget)
        return Draft(tokens, parents, [SOURCE_DRAFT_MODEL] * len(tokens), score=float(len(chain)) / 2)

    def _heal_twins(self, ids: Sequence[int]) -> tuple[torch.Tensor, list[int]] | None:
        """Healing candidates for the intersection: draft ids extending the last context token
        ``B`` and, per candidate, the target twin of its remainder (-1 for ``B`` itself)."""
        cands = self._heal_candidates(ids)
        if cands is None:
            return None
        last = self.bridge.draft.token_bytes[ids[-1]]
        hit = self._twin_cache.get(last)
        if hit is None:
            keep, twins = [], []
            for d in cands.tolist():
                rest = self.bridge.draft.token_bytes[d][len(last):]
                t = self.bridge.target.by_bytes.get(rest, -1) if rest else -1
                if t < self.target_vocab_size and (t >= 0 or d == ids[-1]):
                    keep.append(d)
                    twins.append(t)
            hit = (torch.as_tensor(keep, device=self.runner.device), twins) if len(keep) > 1 else None
            self._twin_cache[last] = hit
        return hit
