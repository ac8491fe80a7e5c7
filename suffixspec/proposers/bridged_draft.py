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

from tokenizer_bridge import BoundaryLattice, DraftContext, TokenBridge

from ..draft import SOURCE_DRAFT_MODEL, Draft
from . import RequestContext
from .draft_model import AdaptiveLength, ModelDrafter, draft_probs

if TYPE_CHECKING:
    from ..loading import LoadedModel

MODES = ("text", "intersection")


class BridgedDraftProposer(ModelDrafter):
    """A draft model with its own tokenizer, bridged onto the target vocabulary.

    ``target_vocab_size``: width of the target's logits (``q`` rows). ``siblings``: how many
    boundary-lattice alternatives to add next to the last drafted token (text mode). ``heal``:
    text mode redraws the context's last draft token among the tokens that extend it (token
    healing), since the target's token boundaries are not the draft's.
    """

    def __init__(self, draft: LoadedModel, target_tokenizer: Any, target_vocab_size: int | None = None,
                 mode: str = "text", siblings: int = 2, length: AdaptiveLength | None = None,
                 min_confidence: float = 0.3, context_window: int | None = None, heal: bool = True) -> None:
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
        self.heal = heal
        self._heal_cache: dict[bytes, torch.Tensor] = {}  # last token bytes -> draft ids extending them
        self._draft_lattice: BoundaryLattice | None = None
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
        ids = self._window(self.ctx.ids, k, self._keep)
        healed = self._heal_candidates(ids)
        skip = b""
        if healed is not None:
            # token healing: the context's last draft token ("\n") may be the start of a longer
            # token ("\n\n") the draft would write; back it up and let the draft redo it,
            # restricted to tokens that begin with the same bytes
            skip = self.bridge.draft.token_bytes[ids[-1]]
            ids = ids[:-1]
        logits = self.runner.logits_after(ids)
        d_tokens: list[int] = []
        for i in range(k):
            probs = torch.softmax(logits.double(), dim=-1)
            if i == 0 and healed is not None:
                probs = torch.zeros_like(probs).index_copy_(0, healed, probs.index_select(0, healed))
                probs = probs / probs.sum()
            tok = int(torch.argmax(probs))
            d_tokens.append(tok)
            if tok in self.bridge.draft_eos or i + 1 == k or self._unsure(probs, tok):
                break
            logits = self.runner.extend(tok)
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
        return Draft(tokens, parents, [SOURCE_DRAFT_MODEL] * len(tokens), score=float(len(chain)) / 2)

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
