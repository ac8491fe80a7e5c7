"""The engine's public face on llama.cpp: what ``SuffixSpec``, ``suffixspec generate`` and the server
call (``generate``, ``stream``, ``encode``, ``tokenizer``, ``max_context``, ``proposers``), with
llama-cpp-python's ``Llama.generate`` as the decode loop and :class:`SuffixDraftModel` as its drafter.

``SuffixSpec(runtime="llama-cpp")`` and ``suffixspec serve --runtime llama-cpp`` build one with
:func:`build_engine`. A request is checked and tokenized as the ``transformers`` engine does it
(``sequence.prepare``: the same prompt ids, references and prediction), its references and prediction
go to the drafter, and ``Llama.generate`` runs it: one sequence at a time (llama.cpp's own prefix
cache keeps the keys and values of the previous prompt), each token's source told by the draft it
was accepted from. Stop strings, EOS and ``max_tokens`` are the engine's rules (``sequence.StopRules``),
checked per token; the context's end and cancellation here.

What is and is not lossless here: llama.cpp's sampler draws every output token whether or not a draft
was there, and a draft token is kept only where it equals that draw (the one-hot rule of
docs/lossless.md), so the output equals llama.cpp's without speculation except where evaluating a
batch of tokens rounds the logits differently from evaluating one (a near tie then breaks the other
way); docs/llama_cpp.md gives the measured share of identical outputs. Sampling follows llama.cpp's
samplers (temperature, top-k, top-p; presence and frequency penalties over its last 64 tokens);
``logprobs`` and ``logit_bias`` are refused (the ``transformers`` runtime has them).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.core.stats import RequestStats
from suffixspec.drafting.draft import SOURCE_TARGET, Draft
from suffixspec.runtimes.llama_cpp.draft import RequestArgs, SuffixDraftModel

RUNTIME = "llama-cpp"  # the --runtime name


class LlamaCppEngine:
    """Generates with a ``llama_cpp.Llama`` whose draft model is ``drafter`` (or plain, without one).

    ``tokenizer``: the model's ``transformers`` tokenizer (prompts, chat template, detokenization);
    ``model_name``: what responses report. One request at a time (``max_num_seqs`` is 1)."""

    max_num_seqs = 1
    batchable = False

    def __init__(self, llm: Any, tokenizer: Any, model_name: str, drafter: SuffixDraftModel | None = None,
                 max_draft_tokens: int = 32, threads_given: bool = False) -> None:
        self.llm = llm
        self.threads = LlamaThreads(int(llm.context_params.n_threads), threads_given)  # what SuffixSpec.threads reads
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.drafter = drafter
        self.proposers = list(drafter.proposers) if drafter is not None else []  # SuffixSpec reads them (drafters)
        self.default_speculation = SpeculationConfig(max_draft_tokens=max_draft_tokens)
        self.max_context = int(llm.n_ctx())
        self.eos_ids = {int(llm.token_eos())}
        if isinstance(getattr(tokenizer, "eos_token_id", None), int):
            self.eos_ids.add(tokenizer.eos_token_id)
        self.step_observer: Any = None  # the server's metrics: a PassRecord per decode pass
        self._lock = threading.Lock()  # llama.cpp holds one sequence: requests run one after another
        if drafter is not None:
            drafter.on_pass = self._observe

    def _observe(self, inputs: int, seconds: float) -> None:
        if self.step_observer is not None:
            from suffixspec.core.scheduler import PassRecord

            self.step_observer(PassRecord(1, inputs, 0, seconds))

    def encode(self, text: str) -> list[int]:
        from suffixspec.core.sequence import encode

        return encode(self.tokenizer, text)

    def close(self) -> None:
        """Nothing runs in the background."""

    def generate(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None,
                 speculation: SpeculationConfig | bool | None = None, references: Sequence[str] | None = None,
                 prediction: str | None = None, cancel: threading.Event | None = None) -> Any:
        """Generate to completion and return the GenerationResult."""
        from suffixspec.core.sequence import result_of

        return result_of(self.stream(prompt, sampling, speculation, references, prediction, cancel))

    def stream(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None,
               speculation: SpeculationConfig | bool | None = None, references: Sequence[str] | None = None,
               prediction: str | None = None, cancel: threading.Event | None = None) -> Iterator[Any]:
        """StreamEvents, one per generated token; the last carries the GenerationResult."""
        from suffixspec.core.sequence import prepare

        request, spec = prepare(self.tokenizer, self.max_context, self.default_speculation, prompt, sampling,
                                speculation, references, prediction)
        if request.sampling.logprobs is not None:
            raise ValueError("logprobs are not available on the llama-cpp runtime; use --runtime transformers")
        if request.sampling.logit_bias:
            raise ValueError("logit_bias is not available on the llama-cpp runtime; use --runtime transformers")
        with self._lock:
            yield from self._run(request, spec, cancel)

    def _run(self, request: Any, spec: SpeculationConfig, cancel: threading.Event | None) -> Iterator[Any]:
        from suffixspec.core.sequence import GenerationResult, StopRules, StreamEvent

        sampling, drafter, prompt = request.sampling, self.drafter, request.prompt_ids
        if drafter is not None:
            drafter.expect(RequestArgs(request.reference_ids, request.prediction_ids, request.drafters,
                                       spec.enabled and spec.max_draft_tokens > 0, spec.adaptive,
                                       spec.max_draft_tokens))
        stops = StopRules(self.tokenizer, sampling, self.eos_ids)
        tracker = stops.tracker
        self.llm.set_seed(sampling.seed if sampling.seed is not None else secrets.randbits(31))
        started = time.perf_counter()
        output: list[int] = []
        sources: list[str] = []
        finish: str | None = None
        token_sources = TokenSources(drafter)
        gen = self.llm.generate(prompt, temp=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                min_p=0.0, typical_p=1.0, repeat_penalty=1.0,
                                presence_penalty=sampling.presence_penalty,
                                frequency_penalty=sampling.frequency_penalty)
        first_at = None
        try:
            for token in gen:
                if first_at is None:  # the prompt's evaluation and the first token's sampling
                    first_at = time.perf_counter()
                token = int(token)
                source = token_sources.source(token)
                output.append(token)
                sources.append(source)
                finish = stops.check(token, source, len(output))
                if finish is None and len(prompt) + len(output) >= self.max_context:
                    finish = "length"
                elif finish is None and cancel is not None and cancel.is_set():
                    finish = "cancelled"
                if finish is not None:  # its token goes with the final event
                    break
                pieces = tracker.release()
                yield StreamEvent("".join(s for s, _ in pieces), pieces, [token], [source], None)
        finally:
            gen.close()
        pieces = tracker.release(final=True)
        stats = drafter.finish(output) if drafter is not None else None
        if stats is None:  # no drafter: a plain run
            stats = RequestStats(output_tokens=len(output), time_total_s=time.perf_counter() - started)
        stats.time_total_s = time.perf_counter() - started
        stats.time_prefill_s = (first_at or started) - started
        result = GenerationResult(tracker.text, output, prompt, finish or "length", sources, None, stats)
        last = [output[-1]] if finish is not None and output else []
        yield StreamEvent("".join(s for s, _ in pieces), pieces, last, sources[-len(last):] if last else [],
                          None, result)


class LlamaThreads:
    """llama.cpp's thread count, in the form ``SuffixSpec.threads`` reports (``suffixspec.core.threads.describe``):
    given (``--threads N``) or llama-cpp-python's default; llama.cpp keeps it for the engine's life."""

    def __init__(self, threads: int, given: bool) -> None:
        self.current = threads
        self.how = "given" if given else "llama.cpp default"

    def to_dict(self) -> dict:
        from suffixspec.core.threads import wait_policy

        return {"threads": self.current, "how": self.how, "device": "cpu", "measured_ms": {},
                "wait_policy": wait_policy(), "rechecks": 0, "switches": 0}

    def describe(self) -> str:
        from suffixspec.core.threads import describe

        return describe(self.to_dict())


class TokenSources:
    """Which draft each generated token came from: tokens arrive one by one from ``Llama.generate``; a
    new draft call (the drafter's ``calls`` moved) starts a step, whose tokens match the draft up to
    the first that does not: that one, and every token of a step without a draft, is the target's."""

    def __init__(self, drafter: SuffixDraftModel | None) -> None:
        self.drafter = drafter
        self.calls = drafter.calls if drafter is not None else 0
        self.draft = Draft()
        self.pos = 0  # tokens of the step so far (-1 after the target's own token)

    def source(self, token: int) -> str:
        d = self.drafter
        if d is not None and d.calls != self.calls:
            self.calls, self.draft, self.pos = d.calls, d.current_draft, 0
        if 0 <= self.pos < len(self.draft) and self.draft.tokens[self.pos] == token:
            self.pos += 1
            return self.draft.sources[self.pos - 1]
        self.pos = -1
        return SOURCE_TARGET


def build_engine(model: str, store: Any = None, history: bool = True, max_draft_tokens: int = 32,
                 n_ctx: int = 4096, n_threads: int | None = None, speculation: bool = True) -> LlamaCppEngine:
    """The llama.cpp engine for ``model`` (a name or a ``.gguf`` path): its GGUF in llama.cpp, its
    ``transformers`` tokenizer, and (``speculation``) the suffix draft model over ``store``."""
    from suffixspec.runtimes.llama_cpp.model import gguf_tokenizer, load

    tokenizer = gguf_tokenizer(model)
    drafter = SuffixDraftModel(db=store, tokenizer=tokenizer, history=history,
                               max_draft_tokens=max_draft_tokens) if speculation else None
    llm = load(model, n_ctx=n_ctx, n_threads=n_threads, tokenizer=tokenizer, draft=drafter or False)
    return LlamaCppEngine(llm, tokenizer, model, drafter, max_draft_tokens, threads_given=n_threads is not None)
