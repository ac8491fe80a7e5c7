"""LlamaIndex: ``SuffixSpecLLM``, an LLM whose query engines hand their retrieved nodes over as ``references``.

Install with ``pip install 'suffixspec[llama-index]'``. The three-line change from LlamaIndex's usual LLM::

    from suffixspec import SuffixSpec
    from suffixspec.integrations.llama_index import SuffixSpecLLM
    Settings.llm = SuffixSpecLLM(spec=SuffixSpec("smollm2-135m-instruct", history=False))
    # or SuffixSpecLLM(base_url="http://127.0.0.1:8000/v1") for a running `suffixspec serve`

    answer = index.as_query_engine().query("What does path.basename() return?")

**How the retrieved nodes reach the generation.** LlamaIndex's query engines never give the LLM the
nodes themselves: the response synthesizer (compact, refine, simple_summarize, tree_summarize,
generation) formats them into its prompt template and calls ``llm.predict`` / ``llm.stream`` /
``llm.apredict`` / ``llm.astream`` with the template variables: ``context_str`` holds the chunks of
that very call (``context_msg`` the next chunk and ``existing_answer`` the answer so far, when
refining). ``SuffixSpecLLM`` overrides those four methods: it sets the values named in
``reference_args`` as the references of the generations that happen inside the call (a context
variable, so concurrent threads and asyncio tasks each see their own), then runs LlamaIndex's own
method unchanged (its events, its prompt formatting, its output parser). We chose this hook over
the alternatives because it needs no configuration and is exact:

- a *node postprocessor* sees the nodes, but runs before the synthesizer packs or truncates them and
  would have to hand them to the LLM through shared state, and the user would have to add it to
  every query engine;
- a *custom response synthesizer* or *query-engine helper* works only where the user builds it, and
  would re-implement LlamaIndex's five synthesizers;
- an *instrumentation handler* on ``RetrievalEndEvent`` gets the nodes of a retriever, not of the
  LLM call that uses them (refine calls the LLM once per chunk), and handlers are global.

The template variables are what the model actually reads, per call, so with refine each call drafts
from its own chunk and from the answer it is refining. Direct calls take references explicitly:
``llm.complete(prompt, references=[...])``, ``llm.chat(messages, references=[...], prediction=...)``.
Chat engines (``as_chat_engine``) call ``llm.chat`` with the context already in the messages, so
they need the explicit form.

**Statistics.** Every response carries the server's ``speculative_decoding`` object (steps, drafted
and accepted tokens per source), ``finish_reason``, ``usage`` and ``accepted_from_references`` in
``CompletionResponse.additional_kwargs`` / ``ChatResponse.additional_kwargs`` (streams: on the last
chunk), and ``raw`` holds the server's JSON when the LLM talks to a server. A query engine returns
only text, so :class:`SpeculationStats`, an instrumentation event handler (LlamaIndex's way of
observing the LLM calls inside a pipeline), collects them::

    with SpeculationStats() as stats:
        response = query_engine.query("What does path.basename() return?")
    stats.accepted("references")   # tokens of the answer drafted from the retrieved chunks and kept
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMCompletionEndEvent
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.prompts import BasePromptTemplate

from suffixspec.integrations.backend import SAMPLING_KEYS, Delta, Reply, Request, accepted_tokens, backend_for

__all__ = ["SpeculationStats", "SuffixSpecLLM"]

# The references of the generations inside one predict/stream call (see the module docstring).
_PROMPT_REFERENCES: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "suffixspec_prompt_references", default=())


class SuffixSpecLLM(CustomLLM):
    """A LlamaIndex LLM on a :class:`suffixspec.SuffixSpec` (``spec=``) or a ``suffixspec serve`` (``base_url=``).

    Sampling fields apply to every call; ``complete``/``chat`` (and the streaming and async variants)
    also take them per call, with ``references=[...]``, ``prediction="..."`` and ``speculation=``.
    """

    max_tokens: int = Field(default=256, gt=0, description="Most tokens to generate per call.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy (the same text with speculation on or off).")
    top_p: float | None = Field(default=None, description="Nucleus sampling mass; None = 1.")
    top_k: int | None = Field(default=None, description="Keep the k most likely tokens; None = all.")
    seed: int | None = Field(default=None, description="Seed of the sampled positions (same text on or off).")
    stop: list[str] | None = Field(default=None, description="Stop strings.")
    speculation: Any = Field(default=None, description="None: defaults; False: plain decoding; a dict such as "
                             "{'drafters': ['prompt', 'references'], 'max_draft_tokens': 32}.")
    reference_args: list[str] = Field(
        default_factory=lambda: ["context_str", "context_msg", "existing_answer"],
        description="Prompt-template variables whose values become references in predict/stream calls.")
    model: str = Field(default="suffixspec", description="Model name sent to a server (base_url).")
    base_url: str | None = Field(default=None, description="A suffixspec serve API root, http://HOST:PORT/v1.")
    context_window: int | None = Field(default=None, description="Tokens of context; None = the model's.")

    _backend: Any = PrivateAttr()

    def __init__(self, spec: Any = None, base_url: str | None = None, api_key: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(base_url=base_url, **kwargs)
        remote = {"model": self.model} if base_url is not None else {}
        self._backend = backend_for(spec=spec, base_url=base_url, api_key=api_key, **remote)

    @classmethod
    def class_name(cls) -> str:
        return "SuffixSpecLLM"

    @property
    def metadata(self) -> LLMMetadata:
        window = self.context_window or self._backend.context_window  # a server is asked on first use
        return LLMMetadata(context_window=window, num_output=self.max_tokens,
                           is_chat_model=self._backend.is_chat_model, model_name=self._backend.model_name)

    # -- the hook: template variables -> references ------------------------------------------

    @contextmanager
    def _template_references(self, prompt_args: dict) -> Iterator[None]:
        refs = tuple(str(prompt_args[k]) for k in self.reference_args if prompt_args.get(k))
        token = _PROMPT_REFERENCES.set(refs)
        try:
            yield
        finally:
            _PROMPT_REFERENCES.reset(token)

    def predict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        with self._template_references(prompt_args):
            return super().predict(prompt, **prompt_args)

    def stream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> Any:
        # stream_chat/stream_complete read the references when called, before the tokens are read
        with self._template_references(prompt_args):
            return super().stream(prompt, **prompt_args)

    async def apredict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        with self._template_references(prompt_args):
            return await super().apredict(prompt, **prompt_args)

    async def astream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> Any:
        with self._template_references(prompt_args):
            return await super().astream(prompt, **prompt_args)

    # -- requests -----------------------------------------------------------------------------

    def _request(self, prompt: str | None, messages: Sequence[ChatMessage] | None, kwargs: dict) -> Request:
        sampling = {k: getattr(self, k, None) for k in SAMPLING_KEYS}
        sampling.update({k: kwargs[k] for k in SAMPLING_KEYS if k in kwargs})
        refs = [*_PROMPT_REFERENCES.get(), *(kwargs.get("references") or ())]
        msgs = None
        if messages is not None:
            msgs = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        elif self._backend.is_chat_model:  # complete() on a chat model: the prompt is the user's turn
            msgs, prompt = [{"role": "user", "content": prompt}], None
        return Request(prompt=prompt, messages=msgs, references=refs, prediction=kwargs.get("prediction"),
                       speculation=kwargs.get("speculation", self.speculation), sampling=sampling)

    def _prompt(self, prompt: str, formatted: bool) -> str:
        return prompt if formatted or self._backend.is_chat_model else self.completion_to_prompt(prompt)

    # -- completion ---------------------------------------------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        reply = self._backend.generate(self._request(self._prompt(prompt, formatted), None, kwargs))
        return CompletionResponse(text=reply.text, additional_kwargs=reply.metadata(), raw=_raw(reply))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        req = self._request(self._prompt(prompt, formatted), None, kwargs)  # now, not when first read
        return _completions(self._backend.stream(req))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        reply = await self._backend.agenerate(self._request(self._prompt(prompt, formatted), None, kwargs))
        return CompletionResponse(text=reply.text, additional_kwargs=reply.metadata(), raw=_raw(reply))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        req = self._request(self._prompt(prompt, formatted), None, kwargs)
        return _acompletions(self._backend.astream(req))

    # -- chat ---------------------------------------------------------------------------------

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        reply = self._backend.generate(self._request(None, messages, kwargs))
        return _chat_response(reply.text, reply.text, reply)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return _chats(self._backend.stream(self._request(None, messages, kwargs)))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        reply = await self._backend.agenerate(self._request(None, messages, kwargs))
        return _chat_response(reply.text, reply.text, reply)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return _achats(self._backend.astream(self._request(None, messages, kwargs)))


def _raw(reply: Reply) -> dict:
    """The server's JSON, or in process the same fields a server would send."""
    return reply.raw if reply.raw is not None else {"speculative_decoding": reply.stats, "usage": reply.usage,
                                                   "finish_reason": reply.finish_reason}


def _completion(text: str, delta: Delta) -> CompletionResponse:
    meta = delta.reply.metadata() if delta.reply is not None else {"provenance": delta.provenance}
    return CompletionResponse(text=text, delta=delta.text, additional_kwargs=meta,
                              raw=_raw(delta.reply) if delta.reply is not None else None)


def _chat_response(text: str, new: str, reply: Reply | None, provenance: list | None = None) -> ChatResponse:
    meta = reply.metadata() if reply is not None else {"provenance": provenance or []}
    return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=new,
                        additional_kwargs=meta, raw=_raw(reply) if reply is not None else None)


def _completions(deltas: Iterator[Delta]) -> CompletionResponseGen:
    text = ""
    for d in deltas:
        text += d.text
        yield _completion(text, d)


async def _acompletions(deltas: AsyncIterator[Delta]) -> CompletionResponseAsyncGen:
    text = ""
    async for d in deltas:
        text += d.text
        yield _completion(text, d)


def _chats(deltas: Iterator[Delta]) -> ChatResponseGen:
    text = ""
    for d in deltas:
        text += d.text
        yield _chat_response(text, d.text, d.reply, d.provenance)


async def _achats(deltas: AsyncIterator[Delta]) -> ChatResponseAsyncGen:
    text = ""
    async for d in deltas:
        text += d.text
        yield _chat_response(text, d.text, d.reply, d.provenance)


class SpeculationStats(BaseEventHandler):
    """Collects the statistics of every suffixspec generation of a pipeline (instrumentation handler).

    ``with SpeculationStats() as stats:`` listens on LlamaIndex's root dispatcher for the block's
    duration (or call ``attach()`` / ``detach()``); ``stats.calls`` holds one ``additional_kwargs``
    dict per LLM call (``speculative_decoding``, ``usage``, ``finish_reason``, ...).
    """

    calls: list[dict] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "SuffixSpecSpeculationStats"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, (LLMChatEndEvent, LLMCompletionEndEvent)) and event.response is not None:
            meta = event.response.additional_kwargs or {}
            if "speculative_decoding" in meta:
                self.calls.append(dict(meta))

    def accepted(self, source: str = "references") -> int:
        """Tokens drafted by ``source`` and kept, over all calls collected."""
        return sum(accepted_tokens(c["speculative_decoding"], source) for c in self.calls)

    @property
    def output_tokens(self) -> int:
        return sum(int(c["usage"].get("completion_tokens", 0)) for c in self.calls)

    def attach(self) -> SpeculationStats:
        get_dispatcher().add_event_handler(self)
        return self

    def detach(self) -> None:
        dispatcher = get_dispatcher()  # by identity: pydantic models with equal fields compare equal
        dispatcher.event_handlers = [h for h in dispatcher.event_handlers if h is not self]

    def __enter__(self) -> SpeculationStats:
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        self.detach()
