"""Different-vocabulary draft model through the token bridge (universal assisted generation).

Two modes:

- ``"text"``: the draft writes text in its own tokens; the bridge re-encodes the new tail with the
  target tokenizer (look-behind window) and the boundary lattice adds the other target tokens
  that could spell the draft's last, possibly unfinished, word as siblings. No ``q``: the one-hot
  rule verifies it, lossless at any temperature. Draft tokens are the draft's argmax (the choice
  that maximizes the chance ``y ~ p`` lands on the node).
- ``"intersection"``: at every step the draft distribution is restricted to the tokens both
  vocabularies spell the same way and renormalized; the drafted token is a target token sampled
  from that distribution, which is reported as ``q`` (the ``min(1, p/q)`` rule). Greedy requests
  take the argmax of the restricted distribution and omit ``q``.

The draft's context is kept in draft tokens by :class:`tokenizer_bridge.DraftContext`: each step
the target's new tokens are appended as bytes and only a look-behind window is re-encoded; the
draft's KV cache is cropped to the common prefix of what it saw and the new ids.

Worked example (text mode; target byte-level BPE, draft SentencePiece)::

    target context  "...def add(a, b):\\n"      draft context  [..."▁def", "▁add", "(", "a", ",", "▁b", "):\\n"]
    draft argmax    ["▁", "▁", "▁", "▁return", "▁a"]  -> bytes b"    return a"
    bridge          ["ĠĠĠ", "Ġreturn", "Ġa"]       + siblings of "Ġa": ["Ġadd", "Ġand"]
    Draft tokens    [ĠĠĠ, Ġreturn, Ġa, Ġadd, Ġand], parents [-1, 0, 1, 1, 1]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from tokenizer_bridge import DraftContext, TokenBridge

from ..draft import SOURCE_DRAFT_MODEL, Draft
from . import RequestContext
from .draft_model import AdaptiveLength, ModelDrafter, draft_probs

if TYPE_CHECKING:
    from ..loading import LoadedModel

MODES = ("text", "intersection")


class BridgedDraftProposer(ModelDrafter):
    """A draft model with its own tokenizer, bridged onto the target vocabulary.

    ``target_vocab_size``: width of the target's logits (``q`` rows). ``siblings``: how many
    boundary-lattice alternatives to add next to the last drafted token (text mode).
    """

    def __init__(self, draft: LoadedModel, target_tokenizer: Any, target_vocab_size: int | None = None,
                 mode: str = "text", siblings: int = 2, length: AdaptiveLength | None = None,
                 min_confidence: float = 0.3, context_window: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown bridge mode {mode!r}; choose one of {MODES}")
        super().__init__(draft, length, seed_offset=1, min_confidence=min_confidence, context_window=context_window)
        self.mode = mode
        self.siblings = siblings
        self.bridge = TokenBridge.cached(target_tokenizer, draft.tokenizer, target_size=target_vocab_size,
                                         draft_size=self.runner.vocab_size)
        self.target_vocab_size = self.bridge.target_size
        if mode == "intersection":
            inter = self.bridge.intersection  # built once per tokenizer pair
            self._to_draft = torch.as_tensor(inter.to_draft, device=self.runner.device)
        self.ctx: DraftContext | None = None
        self._keep = len(self.bridge.draft_prefix_ids())  # the draft's BOS stays when its context is cut
        self._pushed = 0  # target tokens the draft context has seen

    def begin(self, request: RequestContext) -> None:
        super().begin(request)
        self.ctx = self.bridge.draft_context(request.prompt_ids) if self.enabled else None
        self._pushed = len(request.prompt_ids)

    def update(self, new_tokens: Sequence[int]) -> None:
        super().update(new_tokens)
        if self.ctx is not None:
            self.ctx.push_target(new_tokens)
            self._pushed += len(new_tokens)

    def end(self, output_ids: Sequence[int]) -> None:
        super().end(output_ids)
        self.ctx = None

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        if not self.enabled or budget <= 0 or not context:
            return Draft()
        if self.ctx is None or self._pushed != len(context):  # called without begin/update: resync
            self.ctx = self.bridge.draft_context(context)
            self._pushed = len(context)
        if not self.ctx.ids:
            return Draft()
        k = min(budget, self.length.value, self.context_window // 2)
        if self.mode == "text":
            return self._propose_text(context, k, budget)
        return self._propose_intersection(k)

    # -- text level ---------------------------------------------------------------------------------
    def _propose_text(self, context: Sequence[int], k: int, budget: int) -> Draft:
        logits = self.runner.logits_after(self._window(self.ctx.ids, k, self._keep))
        d_tokens: list[int] = []
        # draft tokens are shorter or longer than target tokens; draft a few more than k target tokens
        for i in range(k):
            probs = torch.softmax(logits.double(), dim=-1)
            tok = int(torch.argmax(probs))
            d_tokens.append(tok)
            if tok in self.bridge.draft_eos or i + 1 == k or self._unsure(probs, tok):
                break
            logits = self.runner.extend(tok)
        tr = self.bridge.translate(context, d_tokens, skip=self.ctx.pending)
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
        return Draft(tokens, parents, [SOURCE_DRAFT_MODEL] * len(tokens), score=float(len(chain)) / 2)

    # -- token-level intersection --------------------------------------------------------------------
    def _propose_intersection(self, k: int) -> Draft:
        logits = self.runner.logits_after(self._window(self.ctx.ids, k, self._keep))
        greedy = self.sampling.greedy
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            if greedy:
                q = self.bridge.map_q(torch.softmax(logits.double(), dim=-1))  # [target_vocab]
            else:
                q = self.bridge.map_q(draft_probs(logits, self.sampling))  # [target_vocab]
            if float(q.sum()) <= 0.0:  # no mass on the intersection
                break
            tok = int(torch.argmax(q)) if greedy else self._sample(q)
            tokens.append(tok)
            rows.append(q)
            if tok in self.bridge.target_eos or i + 1 == k or self._unsure(q, tok):
                break
            logits = self.runner.extend(int(self._to_draft[tok]))
        if not tokens:
            return Draft()
        self._chain = tokens
        q_rows = None if greedy else torch.stack(rows)  # [nodes, target_vocab]
        return Draft.chain(tokens, SOURCE_DRAFT_MODEL, q=q_rows, score=float(len(tokens)) / 2)
