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
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .budget import DraftGate, ProposerGate, VerifyCost
from .config import SamplingParams, SpeculationConfig
from .detok import TextTracker
from .draft import SOURCE_TARGET, Draft, drafter_allows
from .kv import attention_windows, keep_accepted, new_cache, tree_inputs
from .loading import LoadedModel
from .merge import merge_drafts
from .prefix import PrefixStore
from .proposers import Proposer, RequestContext
from .sampling import LogitsProcessor, PositionRNG
from .stats import RequestStats
from .verify import verify_tree

log = logging.getLogger(__name__)


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


class Engine:
    """Generates with a target model, speculating with the given proposers."""

    def __init__(self, target: LoadedModel, proposers: Sequence[Proposer] = (), max_draft_tokens: int = 32,
                 max_num_seqs: int = 1, prefix_cache_mb: float = 256) -> None:
        if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be a positive integer (1 = one request at a time), got {max_num_seqs!r}")
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 = no prompt-prefix reuse), got {prefix_cache_mb!r}")
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
        self._lock = threading.Lock()  # batch 1: concurrent callers queue here
        self.verify_cost = VerifyCost()  # forward time by input size, learned across requests (batch 1)
        self.max_num_seqs = max_num_seqs  # requests stepped together; 1 = one at a time, on the caller's thread
        self.step_observer: Callable[[int, int], None] | None = None  # called per pass with (rows, inputs)
        self._scheduler: Any = None  # batch.BatchScheduler, made on the first batched request
        self._batchable: bool | None = None  # can this model run padded batches? (probed once)
        # keys/values of earlier prompts' prefixes (both decode paths); None: every prompt prefilled in full
        self.prefix_store = PrefixStore(max_bytes=int(prefix_cache_mb * 2**20)) if prefix_cache_mb else None

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
        """Generate step by step, yielding new text and tokens; the last event carries the result.

        With ``max_num_seqs > 1`` concurrent callers share forward passes (the batch thread steps
        them together); each gets exactly the tokens it would get alone."""
        request, spec = self.prepare(prompt, sampling, speculation, references, prediction)
        if self.max_num_seqs > 1 and self.batchable:
            scheduler = self._batch()
            yield from scheduler.stream(self.sequence_maker(request, spec, cancel, scheduler.cost_view), cancel)
            return
        with self._lock:
            yield from self._run(request, spec, cancel)

    def prepare(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None,
                speculation: SpeculationConfig | bool | None = None, references: Sequence[str] | None = None,
                prediction: str | None = None) -> tuple[RequestContext, SpeculationConfig]:
        """Check and tokenize a request's arguments (``ValueError`` says what to change)."""
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
        return request, speculation

    def sequence_maker(self, request: RequestContext, spec: SpeculationConfig, cancel: threading.Event | None,
                       cost: Any) -> Callable[[list[Proposer]], _Sequence]:
        """What the batch scheduler calls when the request joins, with the proposer set it lends it."""
        return lambda proposers: _Sequence(self, request, spec, cancel, proposers, cost)

    def close(self) -> None:
        """End the batch thread once its requests are done and wait for it (at most 30 s; a later
        request starts a new one). Waiting matters at exit: a thread still winding down while the
        interpreter finalizes aborts the process ("terminate called without an active exception")."""
        scheduler, self._scheduler = self._scheduler, None  # no lock: a batch-1 generation may hold it
        if scheduler is not None:
            scheduler.close()

    def _batch(self) -> Any:
        with self._lock:
            if self._scheduler is None:
                from .batch import BatchScheduler

                self._scheduler = BatchScheduler(self, self.max_num_seqs)
            return self._scheduler

    @property
    def batchable(self) -> bool:
        """Whether the target can run padded batches (``batch.SlotCache``); probed on first use.

        Sliding-window attention (the mask would have to forget old positions) and models whose
        batched logits differ from their batch-1 logits run one request at a time, said in the log."""
        if self._batchable is None:
            from .batch import batch_problem

            problem = batch_problem(self)
            self._batchable = problem is None
            if problem is not None:
                log.warning("%s cannot be batched (%s); serving one request at a time", self.model_name, problem)
        return self._batchable

    # ----------------------------------------------------------------- decode loop
    def _run(self, request: RequestContext, spec: SpeculationConfig, cancel: threading.Event | None
             ) -> Iterator[StreamEvent]:
        """One request alone (batch 1): its own DynamicCache, today's loop."""
        seq = _Sequence(self, request, spec, cancel, self.proposers, self.verify_cost)
        seq.begin()
        try:
            cache = self._new_cache()
            t = time.perf_counter()
            self._prefill(request.prompt_ids[:-1], cache)
            seq.stats.time_prefill_s = time.perf_counter() - t
            while True:
                t = time.perf_counter()
                planned = seq.plan()
                if planned is None:
                    break
                draft, calls, exploring = planned
                gated = seq.spec.adaptive and len(draft) and not exploring
                # judged by gate_size(): a sampled draft's planned size, never what it sampled
                # a draft without q is also capped by the target's sharpness (sampled requests only)
                if gated and not seq.gate.worth(draft.gate_size(), draft.score, seq.gate.shape_of(draft)):
                    draft, calls = Draft(), []  # not verified: says nothing about the proposers
                t_proposed = time.perf_counter()
                past = seq.past
                logits = self._forward([seq.last, *draft.tokens], cache, draft.parents, past)
                self.verify_cost.observe(1 + len(draft), time.perf_counter() - t_proposed)
                if self.step_observer is not None:
                    self.step_observer(1, 1 + len(draft))
                outcome = verify_tree(draft, logits, seq.processor, seq.rng, position=len(seq.output))
                t_verified = time.perf_counter()
                keep_accepted(cache, past, [0] + [i + 1 for i in outcome.accepted])
                yield seq.commit(draft, calls, outcome, t_proposed - t, t_verified - t_proposed, t_verified)
                if seq.finish is not None:
                    break
        except BaseException:
            seq.end_proposers()
            raise
        yield seq.close()

    def _propose(self, proposers: list[Proposer], prompt: list[int], output: list[int], budget: int,
                 allowed: tuple[str, ...] | None, proposer_gate: ProposerGate | None, copying: set[str],
                 calibration: float = 1.0, hopeless: bool = False, unsure: bool = False
                 ) -> tuple[Draft, list[tuple[int, float, set[str]]]]:
        """The merged draft, and per proposer called: (index, seconds, sources it drafted).

        ``copying``: the sources of the last draft when it was accepted to its end (see ProposerGate).
        ``calibration``: the request's accepted-per-promised ratio (DraftGate): the drafts of the
        proposers called so far promise ``sum(score) * calibration`` tokens, which may make a costly
        proposer not worth calling (ProposerGate). A proposer's one-off setup (``setup_s``, a lazy
        prefill) is not charged to its per-step cost. ``hopeless`` (no deterministic draft can pay) and
        ``unsure`` (the target's sharpness not known yet: the first step) hold back proposers whose
        drafts carry no ``q``, the latter only those with a setup pending (see ProposerGate)."""
        if budget <= 0 or not proposers:
            return Draft(), []
        context = prompt + output
        drafts = []
        calls = []
        if proposer_gate is not None:
            proposer_gate.exploring = False
        for i, p in enumerate(proposers):
            promised = calibration * sum(d.score for d in drafts)
            held = (hopeless or (unsure and p.setup_pending())) and not p.drafts_with_q()
            if proposer_gate is not None and not proposer_gate.should_call(i, copying, promised, budget, held):
                continue
            t = time.perf_counter()
            d = p.propose(context, budget)
            calls.append((i, max(0.0, time.perf_counter() - t - getattr(p, "setup_s", 0.0)), set(d.sources)))
            if len(d) and (allowed is None or all(drafter_allows(allowed, s) for s in d.sources)):
                drafts.append(d)
        return merge_drafts(drafts, budget), calls

    # ----------------------------------------------------------------- model calls
    def _new_cache(self) -> Any:
        return new_cache(self.model.config)

    @torch.inference_mode()
    def _prefill(self, ids: list[int], cache: Any, reuse: bool = True) -> None:
        """Feed ``ids`` into an empty cache; the longest stored prefix is copied, not computed (``PrefixStore``)."""
        if not ids:
            return
        store = self.prefix_store if reuse else None
        start = 0
        if store is not None:
            start, blocks = store.lookup(ids)
            for layer in range(len(blocks[0][0]) if blocks else 0):
                keys = torch.cat([b[0][layer] for b in blocks], dim=-2)[None]  # [1, kv_heads, start, head_dim]
                cache.update(keys, torch.cat([b[1][layer] for b in blocks], dim=-2)[None], layer)
        if start < len(ids):
            kwargs = {"logits_to_keep": 1} if self._prefill_keeps_one else {}
            kwargs[self._cache_kw] = cache
            self.model(input_ids=torch.tensor([ids[start:]], device=self.device), use_cache=True, **kwargs)
        if store is not None:
            for end in store.wanted(ids, start):
                store.put(ids, end, [layer.keys[0, :, end - store.block : end] for layer in cache.layers],
                          [layer.values[0, :, end - store.block : end] for layer in cache.layers])

    @torch.inference_mode()
    def _forward(self, ids: list[int], cache: Any, parents: list[int], past: int) -> torch.Tensor:
        """Logits [len(ids), vocab] for ``last`` + draft nodes, one pass with a tree mask."""
        kwargs: dict[str, Any] = {self._cache_kw: cache}
        if parents:
            kwargs["attention_mask"], kwargs["position_ids"] = tree_inputs(parents, past, self.model.dtype, self.device,
                                                                             self._windows)
        out = self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=True, **kwargs)
        return out.logits[0].float()


class _Sequence:
    """One request's decode state: its drafters, sampler, RNG, stop rules, gates and output.

    Nothing here is shared with another request, so a request gives the same tokens alone
    (``Engine._run``) and in a batch (``batch.BatchScheduler``), which both drive it the same way:
    ``begin``, then per step ``plan`` -> one forward pass -> ``verify_tree`` -> ``commit``, then ``close``.
    """

    def __init__(self, engine: Engine, request: RequestContext, spec: SpeculationConfig,
                 cancel: threading.Event | None, proposers: Sequence[Proposer], cost: Any) -> None:
        sampling = request.sampling
        self.engine = engine
        self.request = request
        self.spec = spec
        self.sampling = sampling
        self.cancel = cancel  # set -> the request ends with finish "cancelled" at its next step
        self.stats = RequestStats()
        self.start = time.perf_counter()
        self.proposers = list(proposers) if spec.enabled and spec.max_draft_tokens > 0 else []
        self.processor = LogitsProcessor(sampling, engine.vocab_size, engine.device)
        self.rng = PositionRNG(sampling.seed)
        self.tracker = TextTracker(engine.tokenizer, sampling.stop)
        self.stop_ids = set() if sampling.ignore_eos else engine.eos_ids | set(sampling.stop_token_ids)
        self.output: list[int] = []
        self.sources: list[str] = []
        self.logprobs: list[dict] | None = [] if sampling.logprobs is not None else None
        self.finish: str | None = None
        self.ema_accepted = spec.max_draft_tokens / 2  # running mean of accepted tokens per step
        self.copy_run = 0  # accepted tokens of the last step when it accepted its whole draft path, else 0
        self.copy_sources: set[str] = set()  # the sources of that path
        self.cost_view = cost  # the verify cost the gates judge by (a BatchCost in a batch)
        self.gate = DraftGate(cost)
        self.proposer_gate = ProposerGate(cost) if spec.adaptive else None
        self.batch_skipped = 0  # steps in a row whose draft a batched pass did not verify
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

    def plan(self) -> tuple[Draft, list[tuple[int, float, set[str]]], bool] | None:
        """(draft, proposer calls, exploring) for the next step, or None when the request ends here."""
        spec = self.spec
        if self.cancel is not None and self.cancel.is_set():
            self.finish = "cancelled"
            return None
        room = self.engine.max_context - self.past - 1  # positions left after ``last``
        if room < 0:
            self.finish = "length"
            return None
        budget = min(spec.max_draft_tokens, self.sampling.max_tokens - len(self.output) - 1, room)
        if spec.adaptive:  # a fully accepted draft (copying) may double; a miss falls back to the mean
            budget = min(budget, max(4, round(4 + 2 * self.ema_accepted), 2 * self.copy_run + 2))
        # sampled requests: is the target too unsure for any deterministic draft to pay (DraftGate)?
        # Not known yet on the first step (``unsure``)
        sampled = spec.adaptive and not self.sampling.greedy and bool(self.proposers)
        unsure = sampled and self.gate.top_mass is None
        hopeless = sampled and not unsure and self.gate.hopeless(budget)
        draft, calls = self.engine._propose(self.proposers, self.request.prompt_ids, self.output, budget,
                                            self.request.drafters, self.proposer_gate, self.copy_sources,
                                            self.gate.calibration, hopeless, unsure)
        exploring = self.proposer_gate is not None and self.proposer_gate.exploring
        return draft, calls, exploring

    def commit(self, draft: Draft, calls: list[tuple[int, float, set[str]]], outcome: Any, propose_s: float,
               verify_s: float, t_verified: float) -> StreamEvent:
        """Append the accepted path and the target's token; feed stops, gates and proposers."""
        sampling = self.sampling
        new = [draft.tokens[i] for i in outcome.accepted] + [outcome.token]
        new_sources = [draft.sources[i] for i in outcome.accepted] + [SOURCE_TARGET]
        committed = 0
        for tok, src in zip(new, new_sources, strict=True):
            self.output.append(tok)
            self.sources.append(src)
            self.processor.observe(tok)
            committed += 1
            if tok in self.stop_ids:
                self.finish = "stop"
            elif self.tracker.push(tok, src):
                self.finish = "stop"
            elif len(self.output) >= sampling.max_tokens:
                self.finish = "length"
            if self.finish:
                break
        step_logprobs = None
        if self.logprobs is not None:
            step_logprobs = [_logprob_entry(outcome.processed[k], new[k], sampling.logprobs or 0)
                             for k in range(committed)]
            self.logprobs.extend(step_logprobs)
        kept_sources = [s for s in new_sources[:committed] if s != SOURCE_TARGET]
        depths = draft.depths()
        stats = self.stats
        stats.record_step(draft.sources, depths, kept_sources)
        stats.output_tokens = len(self.output)
        self.ema_accepted = 0.7 * self.ema_accepted + 0.3 * len(kept_sources)
        self.copy_run = len(kept_sources) if len(draft) and len(kept_sources) == max(depths) else 0
        self.copy_sources = set(kept_sources) if self.copy_run else set()
        if len(draft):
            self.gate.observe(draft.score, len(kept_sources))
        for mass in outcome.top_mass:
            self.gate.observe_target(mass)
        if self.proposer_gate is not None:
            for i, seconds, own in calls:
                self.proposer_gate.observe(i, seconds, sum(1 for src in kept_sources if src in own), own)
        for p in self.proposers:
            p.update(new[:committed])
        pieces = self.tracker.release(final=self.finish is not None)
        stats.time_propose_s += propose_s
        stats.time_verify_s += verify_s
        stats.time_update_s += time.perf_counter() - t_verified
        return StreamEvent("".join(s for s, _ in pieces), pieces, new[:committed], new_sources[:committed],
                           step_logprobs)

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


def _logprob_entry(processed: torch.Tensor, token: int, top_n: int) -> dict:
    logp = torch.log_softmax(processed.double(), dim=-1)  # [vocab]
    entry: dict = {"token": token, "logprob": float(logp[token]), "top": []}
    if top_n:
        values, ids = torch.topk(logp, top_n)
        entry["top"] = [(int(i), float(v)) for i, v in zip(ids, values, strict=True)]
    return entry
