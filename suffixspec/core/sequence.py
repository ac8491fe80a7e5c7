"""One request's decode state: its drafters, sampler, randomness, stop rules, gates and output.

Nothing here is shared with another request (except what ``gates.ProposerGate`` shares for
proposers whose drafts carry no ``q``), and every sampled position draws from the request's own seed
and position. What holds alone and in a batch, exactly: a greedy request, and a seeded one whose drafts
carry no ``q``, gives the same tokens (up to float rounding of ``p``); a request whose drafts carry ``q``
(a sampling draft model) gives the target's law, but not always the same tokens: which of its drafts
a pass verifies, and how long a draft model drafts, follow measured pass costs, which the other rows of
a batch change (and which differ from one run to the next even alone), and a sampled draft's tokens and
accept tests change the tokens that come out, never their distribution.
The scheduler drives it: ``begin``, then per step :meth:`RequestState.plan` (propose) -> the
policy's ``choose_drafts`` -> one pass -> ``verify_tree`` -> :meth:`RequestState.commit`, then
:meth:`RequestState.close`, whose event carries the :class:`GenerationResult`.

Worked example (greedy, chain draft): committed "... a", draft [b, c, d]; the target's argmax after
a, b, c is b, c, x -> accept b c, emit x: three tokens for one pass; the cache keeps a b c, and x
becomes ``last`` for the next step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.core.detok import TextTracker
from suffixspec.core.sampling import LogitsProcessor, PositionRNG
from suffixspec.core.stats import RequestStats
from suffixspec.core.verify import VerifyOutcome
from suffixspec.drafting.budget import draft_budget
from suffixspec.drafting.costs import StepCost, cpu_clock
from suffixspec.drafting.draft import SOURCE_TARGET, Draft, drafter_allows, surest_path
from suffixspec.drafting.gates import ProposerGate, ProposerRecord, RowDraft
from suffixspec.drafting.merge import merge_drafts
from suffixspec.drafting.policy import Policy
from suffixspec.drafting.proposers import Proposer, RequestContext
from suffixspec.drafting.tracked import DraftRecord
from suffixspec.errors import RequestError


@dataclass
class GenerationResult:
    """The outcome of one request."""

    text: str  # generated text, stop string and EOS excluded
    token_ids: list[int]  # generated token ids (a final EOS included)
    prompt_token_ids: list[int]  # the prompt as the target tokenizer encoded it
    finish_reason: str  # "stop" (EOS or stop string), "length" (max_tokens or context) or "cancelled"
    token_sources: list[str]  # per generated token: a draft source, or "target" for the target's own token
    logprobs: list[dict] | None  # per token {"token", "logprob", "top": [(id, logprob), ...]} if asked
    stats: RequestStats  # speculative-decoding statistics


@dataclass
class StreamEvent:
    """New output after one decode step. The last event of a stream carries the result."""

    text: str = ""  # UTF-8-safe new text (held back while it could still start a stop string)
    pieces: list[tuple[str, str]] = field(default_factory=list)  # (text piece, source), concatenating to text
    token_ids: list[int] = field(default_factory=list)  # tokens committed this step
    sources: list[str] = field(default_factory=list)  # source per committed token
    logprobs: list[dict] | None = None  # entries (as in GenerationResult.logprobs) for token_ids, if asked
    result: GenerationResult | None = None  # set on the final event only


@dataclass
class Call:
    """One proposer call of a step."""

    index: int  # the proposer's index in the request's proposer list
    name: str  # the proposer's name (statistics)
    cpu_s: float  # CPU seconds of the call, its one-off setup excluded (ProposerGate)
    wall_s: float  # wall seconds of the call, setup included (statistics)
    setup_s: float  # CPU seconds of its one-off setup in this call (a draft model's prompt prefill)
    sources: set[str]  # node sources of its draft


@dataclass
class Plan:
    """One row's proposal for the next step."""

    draft: Draft  # the merged draft (emptied when the pass does not verify it)
    calls: list[Call]  # proposer calls
    row_draft: RowDraft  # the draft as choose_drafts judges it (it fills verified / explored)
    propose_s: float  # wall seconds the row spent proposing


@dataclass
class Target:
    """What a request needs to know of the target and the engine."""

    tokenizer: Any  # the target tokenizer (detokenization, stop strings)
    eos_ids: set[int]  # end-of-sequence token ids
    vocab_size: int  # width of the target's logits
    device: torch.device  # where the logits live
    max_context: int  # the model's position limit
    policy: Policy  # the engine's decision constants


class RequestState:
    """One request's decode state (see the module docstring)."""

    def __init__(self, target: Target, request: RequestContext, spec: SpeculationConfig,
                 cancel: threading.Event | None, proposers: Sequence[Proposer],
                 shared: dict[int, ProposerRecord] | None = None) -> None:
        sampling = request.sampling
        self.target = target
        self.policy = target.policy
        self.request = request
        self.spec = spec
        self.sampling = sampling
        self.cancel = cancel  # set -> the request ends with finish "cancelled" at its next step
        # what its drafts taught (statistics, the budget's momentum, the draft gate): kept as the llama.cpp
        # drafter keeps it
        self.record = DraftRecord(self.policy, spec.max_draft_tokens / 2)
        self.stats, self.gate = self.record.stats, self.record.gate
        self.start = time.perf_counter()
        self.proposers = list(proposers) if spec.enabled and spec.max_draft_tokens > 0 else []
        self.processor = LogitsProcessor(sampling, target.vocab_size, target.device)
        self.rng = PositionRNG(sampling.seed)
        self.stops = StopRules(target.tokenizer, sampling, target.eos_ids)
        self.tracker = self.stops.tracker
        self.output: list[int] = []
        self.sources: list[str] = []
        self.logprobs: list[dict] | None = [] if sampling.logprobs is not None else None
        self.finish: str | None = None
        # per-token acceptance along verified drafts (budget): moving averages of accepted nodes and of
        # tries (accepted nodes plus one for a rejection) per step, from the policy's prior
        self._hits, self._tries = self.policy.acceptance_prior, 1.0
        self.acceptance = self.policy.acceptance_prior
        # per proposer index: accepted tokens per token its drafts' node probabilities promised, over its
        # verified drafts (the weight merge_drafts ranks its nodes with against the other proposers')
        self.trust: dict[int, float] = {}
        self.proposer_gate: ProposerGate | None = None  # made in begin (it asks the proposers about q)
        # proposer records shared with the engine's other requests of this proposer set (deterministic drafts)
        self.shared = {} if shared is None else shared
        self._ended = False

    @property
    def past(self) -> int:
        """Tokens in the KV cache: every committed token but the last."""
        return len(self.request.prompt_ids) - 1 + len(self.output)

    @property
    def last(self) -> int:
        """The last committed token (the root of the next draft)."""
        return self.output[-1] if self.output else self.request.prompt_ids[-1]

    def begin(self) -> None:
        for p in self.proposers:
            p.begin(self.request)
        if self.spec.adaptive:
            self.proposer_gate = ProposerGate(self.policy, self.shared,
                                              [not p.drafts_with_q() for p in self.proposers])

    # -- propose ---------------------------------------------------------------------------------------
    def plan(self, step: StepCost) -> Plan | None:
        """The draft for the next step (judged later by ``choose_drafts``), or None when the request ends
        here (cancelled, or out of context). ``step``: the pass cost as a row of this step sees it."""
        spec = self.spec
        if self.cancel is not None and self.cancel.is_set():
            self.finish = "cancelled"
            return None
        room = self.target.max_context - self.past - 1  # positions left after ``last``
        if room < 0:
            self.finish = "length"
            return None
        t = time.perf_counter()
        budget = min(spec.max_draft_tokens, self.sampling.max_tokens - len(self.output) - 1, room)
        if spec.adaptive:
            budget = draft_budget(budget, self.record.mean_accepted, self.record.copy_run, self.acceptance, step,
                                  self.policy)
        # sampled requests: is the target too unsure for any deterministic draft to pay (DraftGate)?
        # Not known yet on the first step (``unsure``)
        sampled = spec.adaptive and not self.sampling.greedy and bool(self.proposers)
        unsure = sampled and self.gate.top_mass is None
        hopeless = sampled and not unsure and self.gate.hopeless(budget, step)
        draft, calls = self._propose(budget, step, hopeless, unsure)
        draft = draft.ending_at(self.stops.stop_ids)
        exploring = self.proposer_gate is not None and self.proposer_gate.exploring
        shape = self.gate.shape_of(draft) if len(draft) else None
        size = draft.gate_size() if len(draft) else 0
        always_verify = not spec.adaptive or exploring  # a re-measured proposer's draft is verified (its yield counts)
        row_draft = RowDraft(size, self.gate.expected(draft.score, shape) if size else 0.0, always_verify,
                             None if always_verify else self.gate, shape)
        return Plan(draft, calls, row_draft, time.perf_counter() - t)

    def _propose(self, budget: int, step: StepCost, hopeless: bool, unsure: bool) -> tuple[Draft, list[Call]]:
        """The merged draft of the proposers the gate calls, and the calls.

        ``hopeless`` (no deterministic draft can pay) and ``unsure`` (the target's sharpness not known
        yet: the first step) hold back proposers whose drafts carry no ``q``, the latter only those with
        a setup pending (see ProposerGate)."""
        if budget <= 0 or not self.proposers:
            return Draft(), []
        context = self.request.prompt_ids + self.output
        allowed = self.request.drafters
        gate = self.proposer_gate
        plain = step.plain()
        drafts: list[Draft] = []
        weights: list[float] = []
        promised = 0.0  # accepted tokens the drafts so far promise: their scores, each times its proposer's trust
        calls: list[Call] = []
        if gate is not None:
            gate.begin_step()
        for i, p in enumerate(self.proposers):
            if not p.active():  # left out by the request's drafters: no call, nothing recorded
                continue
            held_back = (hopeless or (unsure and p.setup_pending())) and not p.drafts_with_q()
            judges_itself = p.judges_own_cost and self.spec.adaptive
            if gate is not None and not gate.should_call(i, plain, self.record.copy_sources, promised, budget, held_back,
                                                         judges_itself):
                continue
            # every proposer is told the pass cost (the suffix proposer weighs its documents with it); one that
            # judges its own cost plans from it only when speculation adapts
            p.observe_costs(None if p.judges_own_cost and not judges_itself else step)
            p.observe_lead(self._lead(drafts, weights))
            p.observe_promise(promised)
            wall, cpu = time.perf_counter(), cpu_clock()
            d = p.propose(context, budget)
            cpu = cpu_clock() - cpu
            setup = getattr(p, "setup_s", 0.0)
            calls.append(Call(i, p.name, max(0.0, cpu - setup), time.perf_counter() - wall, setup, set(d.sources)))
            if len(d) and (allowed is None or all(drafter_allows(allowed, s) for s in d.sources)):
                drafts.append(d)
                weights.append(self.trust.get(i, 1.0))
                promised += self.trust.get(i, self.gate.calibration) * d.score
        # a merged node is worth its place when its chance of acceptance times a plain step (what an accepted
        # token saves) covers what one more node adds to the pass
        node = step.per_node(budget) if len(drafts) > 1 else None
        floor = node / plain if node is not None and plain else 0.0
        return merge_drafts(drafts, budget, weights, floor), calls

    def _lead(self, drafts: list[Draft], weights: list[float]) -> list[int]:
        """The chain the drafts so far are sure of: the surest path of the one promising the most, up to its
        first node below even odds once weighted by its proposer's trust (none where no draft carries
        node probabilities). Example: a suffix copy at 0.98, 0.97, 0.6, 0.4 with trust 1 -> its first 3."""
        best = max(((d, w) for d, w in zip(drafts, weights, strict=True) if d.probs is not None),
                   key=lambda dw: dw[0].score * dw[1], default=None)
        if best is None:
            return []
        d, w = best
        out = []
        for node in surest_path(d):
            if d.probs[node] * w < 0.5:  # type: ignore[index]
                break
            out.append(d.tokens[node])
        return out

    # -- commit ----------------------------------------------------------------------------------------
    def commit(self, plan: Plan, outcome: VerifyOutcome, verify_s: float, t_verified: float) -> StreamEvent:
        """Append the accepted path and the target's token; feed stops, gates and proposers."""
        draft, sampling = plan.draft, self.sampling
        new = [draft.tokens[i] for i in outcome.accepted] + [outcome.token]
        new_sources = [draft.sources[i] for i in outcome.accepted] + [SOURCE_TARGET]
        committed = 0
        for tok, src in zip(new, new_sources, strict=True):
            self.output.append(tok)
            self.sources.append(src)
            self.processor.observe(tok)
            committed += 1
            self.finish = self.stops.check(tok, src, len(self.output))
            if self.finish:
                break
        step_logprobs = None
        if self.logprobs is not None:
            step_logprobs = [_logprob_entry(outcome.processed[k], new[k], sampling.logprobs or 0)
                             for k in range(committed)]
            self.logprobs.extend(step_logprobs)
        accepted_sources = [s for s in new_sources[:committed] if s != SOURCE_TARGET]
        self._learn(plan, outcome, accepted_sources)
        for p in self.proposers:
            p.update(new[:committed])
        stats = self.stats
        stats.output_tokens = len(self.output)
        stats.time_propose_s += plan.propose_s
        stats.time_verify_s += verify_s
        pieces = self.tracker.release(final=self.finish is not None)
        stats.time_update_s += time.perf_counter() - t_verified
        return StreamEvent("".join(s for s, _ in pieces), pieces, new[:committed], new_sources[:committed],
                           step_logprobs)

    def _learn(self, plan: Plan, outcome: VerifyOutcome, accepted_sources: list[str]) -> None:
        """Statistics, the budget's running means, the gates (a skipped draft's calls yielded nothing)."""
        draft, rate = plan.draft, self.policy.accepted_rate
        self.record.observe(draft, draft.depths(), accepted_sources)  # statistics, momentum, the draft gate
        for call in plan.calls:
            self.stats.record_call(call.name, call.wall_s)
        if len(draft):  # per-token acceptance: the accepted nodes, and a miss unless the walk reached a leaf
            hits = len(outcome.accepted)
            missed = (outcome.accepted[-1] if outcome.accepted else -1) in draft.children()
            self._hits = (1 - rate) * self._hits + rate * hits
            self._tries = (1 - rate) * self._tries + rate * (hits + missed)
            self.acceptance = self._hits / self._tries if self._tries > 0 else self.acceptance
        for mass in outcome.top_mass:
            self.gate.observe_target(mass)
        for call in plan.calls:
            accepted_of_call = sum(1 for src in accepted_sources if src in call.sources)
            if self.proposer_gate is not None:
                self.proposer_gate.observe(call.index, call.cpu_s, accepted_of_call, call.sources, call.setup_s)
            if draft.probs is not None and len(self.proposers) > 1:  # what its nodes promised in the merged draft
                promised = sum(p for p, src in zip(draft.probs, draft.sources, strict=True) if src in call.sources)
                if promised > 0:
                    trust = self.trust.get(call.index, 1.0)
                    self.trust[call.index] = (1 - self.policy.calibration_rate) * trust + \
                        self.policy.calibration_rate * min(self.policy.calibration_cap, accepted_of_call / promised)

    # -- end -------------------------------------------------------------------------------------------
    def end_proposers(self) -> None:
        """Tell the proposers the request ended (once)."""
        if not self._ended:
            self._ended = True
            for p in self.proposers:
                p.end(self.output)

    def close(self) -> StreamEvent:
        """End the request: the final event, carrying the result."""
        self.end_proposers()
        self.stats.time_total_s = time.perf_counter() - self.start
        pieces = self.tracker.release(final=True)
        result = GenerationResult(self.tracker.text, self.output, self.request.prompt_ids, self.finish,
                                  self.sources, self.logprobs, self.stats)
        return StreamEvent("".join(s for s, _ in pieces), pieces, [], [], None, result)


def prepare(tokenizer: Any, max_context: int, default: SpeculationConfig, prompt: str | Sequence[int],
            sampling: SamplingParams | None = None, speculation: SpeculationConfig | bool | None = None,
            references: Sequence[str] | None = None, prediction: str | None = None
            ) -> tuple[RequestContext, SpeculationConfig]:
    """Check and tokenize a request's arguments (a :class:`RequestError` says what to change)."""
    sampling = sampling or SamplingParams()
    if speculation is None or speculation is True:
        speculation = default
    elif speculation is False:
        speculation = SpeculationConfig(enabled=False)
    prompt_ids = encode(tokenizer, prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not prompt_ids:
        bos = tokenizer.bos_token_id
        if bos is None:
            raise RequestError("the prompt is empty and the tokenizer has no BOS token; give a non-empty prompt",
                               "prompt")
        prompt_ids = [bos]
    if len(prompt_ids) >= max_context:
        raise RequestError(f"the prompt has {len(prompt_ids)} tokens but the model's context is "
                           f"{max_context}; shorten the prompt", "prompt")
    request = RequestContext(
        prompt_ids=prompt_ids,
        reference_ids=[tokenizer.encode(r, add_special_tokens=False) for r in references or ()],
        prediction_ids=tokenizer.encode(prediction, add_special_tokens=False) if prediction else None,
        sampling=sampling,
        drafters=speculation.drafters,
    )
    return request, speculation


class StopRules:
    """When an output stops, the same on every runtime (the engine's ``RequestState.commit``, the llama.cpp
    engine's loop): an end-of-sequence or stop token, a stop string (whose text ``tracker`` holds back while
    it could still start one), ``max_tokens``. Example: ``max_tokens=3``, tokens a b c -> None, None,
    "length"; an EOS token -> "stop" (the stop strings never see it)."""

    def __init__(self, tokenizer: Any, sampling: SamplingParams, eos_ids: set[int]) -> None:
        self.tracker = TextTracker(tokenizer, sampling.stop)
        # ignore_eos passes the end-of-text tokens only: stop_token_ids still stop (as vLLM's do)
        self.stop_ids = (set() if sampling.ignore_eos else set(eos_ids)) | set(sampling.stop_token_ids)
        self.max_tokens = sampling.max_tokens

    def check(self, token: int, source: str, produced: int) -> str | None:
        """``token`` (drafted by ``source``) is the ``produced``-th output token: "stop", "length" or None."""
        if token in self.stop_ids or self.tracker.push(token, source):
            return "stop"
        return "length" if produced >= self.max_tokens else None


def result_of(events: Iterable[StreamEvent]) -> GenerationResult:
    """The result a stream's last event carries (``generate`` of every engine: the stream, run to its end)."""
    for event in events:
        if event.result is not None:
            return event.result
    raise RuntimeError("the request's stream ended without its result")  # the last event always carries it


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def _logprob_entry(processed: torch.Tensor, token: int, top_n: int) -> dict:
    """The token's logprob and the ``top_n`` likeliest (id, logprob), read back from the logits' device
    in one transfer each (not one per number)."""
    logp = torch.log_softmax(processed.double(), dim=-1)  # [vocab]
    if not top_n:
        return {"token": token, "logprob": float(logp[token]), "top": []}
    values, ids = torch.topk(logp, top_n)
    chosen, *top = torch.cat((logp[token : token + 1], values)).tolist()
    return {"token": token, "logprob": chosen, "top": list(zip(ids.tolist(), top, strict=True))}
