"""The speculative decode engine: prefill, then propose -> merge -> verify -> accept -> update.

Batch 1, one request at a time (the server's worker owns the engine). The KV cache holds every
committed token except the last one; each step feeds ``[last] + draft nodes`` in ONE forward pass
with a tree attention mask, walks the tree with the lossless rules of ``verify.py``, moves the
accepted nodes' KV entries into place and crops the rest.

Worked example (greedy, chain draft): committed "... a", draft [b, c, d]; the target's argmax after
a, b, c is b, c, x -> accept b c, emit x: three tokens for one forward pass; the cache keeps
a b c, and x becomes ``last`` for the next step.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .budget import DraftGate, ProposerGate, VerifyCost
from .config import SamplingParams, SpeculationConfig
from .detok import TextTracker
from .draft import SOURCE_PREDICTION, SOURCE_REFERENCES, SOURCE_TARGET, Draft
from .kv import attention_windows, keep_accepted, new_cache, tree_inputs
from .loading import LoadedModel
from .merge import merge_drafts
from .proposers import Proposer, RequestContext
from .sampling import LogitsProcessor, PositionRNG
from .stats import RequestStats
from .verify import verify_tree


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


def _drafter_of(source: str) -> str:
    return SOURCE_REFERENCES if source == SOURCE_PREDICTION else source


class Engine:
    """Generates with a target model, speculating with the given proposers."""

    def __init__(self, target: LoadedModel, proposers: Sequence[Proposer] = (), max_draft_tokens: int = 32) -> None:
        self.target = target
        self.model = target.model
        self.tokenizer = target.tokenizer
        self.model_name = target.name
        self.device = torch.device(target.device)
        self.proposers = list(proposers)
        self.default_speculation = SpeculationConfig(max_draft_tokens=max_draft_tokens)
        cfg = self.model.config
        self.max_context = int(getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 2048))
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.eos_ids = self._eos_ids()
        params = inspect.signature(self.model.forward).parameters
        self._prefill_keeps_one = "logits_to_keep" in params
        # transformers 5.x renames ``past_key_values`` to ``cache``; accept both generations
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._windows = attention_windows(cfg)  # layer type -> sliding window (None: full); refuses others
        self._lock = threading.Lock()  # the engine is batch 1; concurrent callers queue here
        self.verify_cost = VerifyCost()  # forward time by input size, learned across requests

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for value in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    # ----------------------------------------------------------------- public API
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def generate(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None,
                 speculation: SpeculationConfig | bool | None = None, references: Sequence[str] | None = None,
                 prediction: str | None = None, cancel: threading.Event | None = None) -> GenerationResult:
        """Generate to completion and return the result."""
        result = None
        for event in self.stream(prompt, sampling, speculation, references, prediction, cancel):
            result = event.result or result
        assert result is not None
        return result

    def stream(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None,
               speculation: SpeculationConfig | bool | None = None, references: Sequence[str] | None = None,
               prediction: str | None = None, cancel: threading.Event | None = None) -> Iterator[StreamEvent]:
        """Generate step by step, yielding new text and tokens; the last event carries the result."""
        sampling = sampling or SamplingParams()
        if speculation is None or speculation is True:
            speculation = self.default_speculation
        elif speculation is False:
            speculation = SpeculationConfig(enabled=False)
        prompt_ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not prompt_ids:
            bos = self.tokenizer.bos_token_id
            if bos is None:
                raise ValueError("the prompt is empty and the tokenizer has no BOS token; give a non-empty prompt")
            prompt_ids = [bos]
        if len(prompt_ids) >= self.max_context:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens but the model's context is "
                             f"{self.max_context}; shorten the prompt")
        request = RequestContext(
            prompt_ids=prompt_ids,
            reference_ids=[self.tokenizer.encode(r, add_special_tokens=False) for r in references or ()],
            prediction_ids=self.tokenizer.encode(prediction, add_special_tokens=False) if prediction else None,
            sampling=sampling,
            drafters=speculation.drafters,
        )
        with self._lock:
            yield from self._run(request, speculation, cancel)

    # ----------------------------------------------------------------- decode loop
    def _run(self, request: RequestContext, spec: SpeculationConfig, cancel: threading.Event | None
             ) -> Iterator[StreamEvent]:
        sampling = request.sampling
        stats = RequestStats()
        start = time.perf_counter()
        proposers = self.proposers if spec.enabled and spec.max_draft_tokens > 0 else []
        for p in proposers:
            p.begin(request)
        processor = LogitsProcessor(sampling, self.vocab_size, self.device)
        rng = PositionRNG(sampling.seed)
        tracker = TextTracker(self.tokenizer, sampling.stop)
        stop_ids = set() if sampling.ignore_eos else self.eos_ids | set(sampling.stop_token_ids)
        output: list[int] = []
        sources: list[str] = []
        logprobs: list[dict] | None = [] if sampling.logprobs is not None else None
        finish = None
        ema_accepted = spec.max_draft_tokens / 2  # running mean of accepted tokens per step
        copy_run = 0  # accepted tokens of the last step when it accepted its whole draft path, else 0
        copy_sources: set[str] = set()  # the sources of that path
        gate = DraftGate(self.verify_cost)
        proposer_gate = ProposerGate(self.verify_cost) if spec.adaptive else None
        try:
            cache = self._new_cache()
            t = time.perf_counter()
            self._prefill(request.prompt_ids[:-1], cache)
            stats.time_prefill_s = time.perf_counter() - t
            last = request.prompt_ids[-1]
            past = len(request.prompt_ids) - 1
            while finish is None:
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    break
                room = self.max_context - past - 1  # positions left after ``last``
                remaining = sampling.max_tokens - len(output)
                if room < 0:
                    finish = "length"
                    break
                budget = min(spec.max_draft_tokens, remaining - 1, room)
                if spec.adaptive:  # a fully accepted draft (copying) may double; a miss falls back to the mean
                    budget = min(budget, max(4, round(4 + 2 * ema_accepted), 2 * copy_run + 2))
                t = time.perf_counter()
                draft, calls = self._propose(proposers, request.prompt_ids, output, budget, request.drafters,
                                             proposer_gate, copy_sources)
                exploring = proposer_gate is not None and proposer_gate.exploring
                if spec.adaptive and len(draft) and not exploring and not gate.worth(draft.gate_size(), draft.score):
                    # judged by gate_size(): a sampled draft's planned size, never what it sampled
                    draft, calls = Draft(), []  # not verified: says nothing about the proposers
                t_proposed = time.perf_counter()
                logits = self._forward([last, *draft.tokens], cache, draft.parents, past)
                self.verify_cost.observe(1 + len(draft), time.perf_counter() - t_proposed)
                outcome = verify_tree(draft, logits, processor, rng, position=len(output))
                t_verified = time.perf_counter()
                keep_accepted(cache, past, [0] + [i + 1 for i in outcome.accepted])
                past += 1 + len(outcome.accepted)
                last = outcome.token
                new = [draft.tokens[i] for i in outcome.accepted] + [outcome.token]
                new_sources = [draft.sources[i] for i in outcome.accepted] + [SOURCE_TARGET]
                committed = 0
                for tok, src in zip(new, new_sources, strict=True):
                    output.append(tok)
                    sources.append(src)
                    processor.observe(tok)
                    committed += 1
                    if tok in stop_ids:
                        finish = "stop"
                    elif tracker.push(tok, src):
                        finish = "stop"
                    elif len(output) >= sampling.max_tokens:
                        finish = "length"
                    if finish:
                        break
                step_logprobs = None
                if logprobs is not None:
                    step_logprobs = [_logprob_entry(outcome.processed[k], new[k], sampling.logprobs or 0)
                                     for k in range(committed)]
                    logprobs.extend(step_logprobs)
                kept_sources = [s for s in new_sources[:committed] if s != SOURCE_TARGET]
                depths = draft.depths()
                stats.record_step(draft.sources, depths, kept_sources)
                stats.output_tokens = len(output)
                ema_accepted = 0.7 * ema_accepted + 0.3 * len(kept_sources)
                copy_run = len(kept_sources) if len(draft) and len(kept_sources) == max(depths) else 0
                copy_sources = set(kept_sources) if copy_run else set()
                if len(draft):
                    gate.observe(draft.score, len(kept_sources))
                if proposer_gate is not None:
                    for i, seconds, own in calls:
                        proposer_gate.observe(i, seconds, sum(1 for src in kept_sources if src in own), own)
                for p in proposers:
                    p.update(new[:committed])
                pieces = tracker.release(final=finish is not None)
                stats.time_propose_s += t_proposed - t
                stats.time_verify_s += t_verified - t_proposed
                stats.time_update_s += time.perf_counter() - t_verified
                yield StreamEvent("".join(s for s, _ in pieces), pieces, new[:committed], new_sources[:committed],
                                  step_logprobs)
        finally:
            for p in proposers:
                p.end(output)
        stats.time_total_s = time.perf_counter() - start
        pieces = tracker.release(final=True)
        result = GenerationResult(tracker.text, output, request.prompt_ids, finish, sources, logprobs, stats)
        yield StreamEvent("".join(s for s, _ in pieces), pieces, [], [], None, result)

    def _propose(self, proposers: list[Proposer], prompt: list[int], output: list[int], budget: int,
                 allowed: tuple[str, ...] | None, proposer_gate: ProposerGate | None, copying: set[str]
                 ) -> tuple[Draft, list[tuple[int, float, set[str]]]]:
        """The merged draft, and per proposer called: (index, seconds, sources it drafted).

        ``copying``: the sources of the last draft when it was accepted to its end (see ProposerGate)."""
        if budget <= 0 or not proposers:
            return Draft(), []
        context = prompt + output
        drafts = []
        calls = []
        if proposer_gate is not None:
            proposer_gate.exploring = False
        for i, p in enumerate(proposers):
            if proposer_gate is not None and not proposer_gate.should_call(i, copying):
                continue
            t = time.perf_counter()
            d = p.propose(context, budget)
            calls.append((i, time.perf_counter() - t, set(d.sources)))
            if len(d) and (allowed is None or all(_drafter_of(s) in allowed for s in d.sources)):
                drafts.append(d)
        return merge_drafts(drafts, budget), calls

    # ----------------------------------------------------------------- model calls
    def _new_cache(self) -> Any:
        return new_cache(self.model.config)

    @torch.inference_mode()
    def _prefill(self, ids: list[int], cache: Any) -> None:
        if not ids:
            return
        kwargs = {"logits_to_keep": 1} if self._prefill_keeps_one else {}
        kwargs[self._cache_kw] = cache
        self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=True, **kwargs)

    @torch.inference_mode()
    def _forward(self, ids: list[int], cache: Any, parents: list[int], past: int) -> torch.Tensor:
        """Logits [len(ids), vocab] for ``last`` + draft nodes, one pass with a tree mask."""
        kwargs: dict[str, Any] = {self._cache_kw: cache}
        if parents:
            kwargs["attention_mask"], kwargs["position_ids"] = tree_inputs(parents, past, self.model.dtype, self.device,
                                                                             self._windows)
        out = self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=True, **kwargs)
        return out.logits[0].float()


def _logprob_entry(processed: torch.Tensor, token: int, top_n: int) -> dict:
    logp = torch.log_softmax(processed.double(), dim=-1)  # [vocab]
    entry: dict = {"token": token, "logprob": float(logp[token]), "top": []}
    if top_n:
        values, ids = torch.topk(logp, top_n)
        entry["top"] = [(int(i), float(v)) for i, v in zip(ids, values, strict=True)]
    return entry
