"""LangChain: ``ChatSuffixSpec``, a chat model that drafts from references, and the LCEL step that feeds it.

Install with ``pip install 'suffixspec[langchain]'``. The three-line change from LangChain's usual chat
model, in the RAG chain of LangChain's own tutorials::

    from suffixspec import SuffixSpec
    from suffixspec.integrations.langchain import ChatSuffixSpec, prompt_with_references
    llm = ChatSuffixSpec(spec=SuffixSpec("smollm2-135m-instruct", history=False))   # was ChatOpenAI(...)
    # or ChatSuffixSpec(base_url="http://127.0.0.1:8000/v1") for a running `suffixspec serve`

    chain = ({"context": retriever, "question": RunnablePassthrough()}
             | prompt_with_references(prompt)     # was: prompt (with a format_docs step before it)
             | llm | StrOutputParser())
    chain.invoke("What does path.basename() return?")

**References.** Per call, ``llm.invoke(messages, references=[...], prediction="...")`` (also
``stream``, ``batch``, ``ainvoke``, ``astream``, ``abatch``, and ``llm.bind(references=[...])``).
In a chain the model sees only the prompt's messages, so :func:`prompt_with_references` formats the
prompt with the retrieved documents joined into ``{context}`` *and* attaches the documents' texts to
the last message (``additional_kwargs["references"]``), where ``ChatSuffixSpec`` reads them. Other
chat models ignore that key, so the same chain still runs on them.

**Statistics.** ``AIMessage.response_metadata`` (and ``ChatGeneration.generation_info``) hold the
server's ``speculative_decoding`` object (steps, drafted/accepted tokens per source),
``finish_reason``, ``usage`` and ``accepted_from_references``; ``usage_metadata`` the token counts.
Streamed, they come with the last chunk.

**Without this package.** ``ChatOpenAI(base_url="http://127.0.0.1:8000/v1", api_key=..., model="suffixspec")``
from ``langchain-openai`` works unchanged against ``suffixspec serve``; the extensions go in
``extra_body``: ``ChatOpenAI(..., extra_body={"references": [...]})`` or per call
``llm.invoke(messages, extra_body={"references": [...], "prediction": {"type": "content", "content": "..."}})``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.documents import Document
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.prompt_values import ChatPromptValue
from langchain_core.runnables import Runnable, RunnableLambda
from pydantic import ConfigDict, Field, PrivateAttr

from suffixspec.integrations.backend import SAMPLING_KEYS, Delta, Reply, Request, backend_for

__all__ = ["ChatSuffixSpec", "prompt_with_references"]

REFERENCES_KEY = "references"  # the message additional_kwargs key prompt_with_references fills

# LangChain message types -> chat-template roles
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "function"}


class ChatSuffixSpec(BaseChatModel):
    """A LangChain chat model on a :class:`suffixspec.SuffixSpec` (``spec=``) or a ``suffixspec serve`` (``base_url=``).

    Sampling fields apply to every call and may be overridden per call (``invoke(x, max_tokens=64)``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    spec: Any = Field(default=None, exclude=True, description="A SuffixSpec to run in this process.")
    base_url: str | None = Field(default=None, description="A suffixspec serve API root, http://HOST:PORT/v1.")
    api_key: str | None = Field(default=None, exclude=True, repr=False, description="The server's --api-key.")
    model_name: str = Field(default="suffixspec", alias="model", description="Model name sent to a server.")
    max_tokens: int = Field(default=256, gt=0)
    temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy: the same text with speculation on or off.")
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    speculation: Any = Field(default=None, description="None: defaults; False: plain decoding; or a dict such as "
                             "{'drafters': ['prompt', 'references'], 'max_draft_tokens': 32}.")
    references: list[str] | None = Field(default=None, description="References for every call (per-call ones add).")

    _backend: Any = PrivateAttr()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        remote = {"model": self.model_name} if self.base_url is not None else {}
        self._backend = backend_for(spec=self.spec, base_url=self.base_url, api_key=self.api_key, **remote)

    @property
    def _llm_type(self) -> str:
        return "suffixspec"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self._backend.model_name, "base_url": self.base_url,
                **{k: getattr(self, k) for k in SAMPLING_KEYS if getattr(self, k, None) is not None}}

    def _request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict) -> Request:
        sampling = {k: getattr(self, k, None) for k in SAMPLING_KEYS}
        sampling.update({k: kwargs[k] for k in SAMPLING_KEYS if k in kwargs})
        if stop is not None:
            sampling["stop"] = list(stop)
        refs = [*(self.references or ()), *(kwargs.get("references") or ())]
        for m in messages:  # what prompt_with_references attached
            refs += [r for r in m.additional_kwargs.get(REFERENCES_KEY) or () if r not in refs]
        msgs = [{"role": _ROLES.get(m.type, getattr(m, "role", m.type)), "content": m.text} for m in messages]
        return Request(messages=msgs, references=refs, prediction=kwargs.get("prediction"),
                       speculation=kwargs.get("speculation", self.speculation), sampling=sampling)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        return _result(self._backend.generate(self._request(messages, stop, kwargs)), self._backend.model_name)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        reply = await self._backend.agenerate(self._request(messages, stop, kwargs))
        return _result(reply, self._backend.model_name)

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        for delta in self._backend.stream(self._request(messages, stop, kwargs)):
            chunk = _chunk(delta, self._backend.model_name)
            if run_manager and delta.text:
                run_manager.on_llm_new_token(delta.text, chunk=chunk)
            yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        async for delta in self._backend.astream(self._request(messages, stop, kwargs)):
            chunk = _chunk(delta, self._backend.model_name)
            if run_manager and delta.text:
                await run_manager.on_llm_new_token(delta.text, chunk=chunk)
            yield chunk


def _usage(reply: Reply) -> dict:
    u = reply.usage
    return {"input_tokens": int(u.get("prompt_tokens", 0)), "output_tokens": int(u.get("completion_tokens", 0)),
            "total_tokens": int(u.get("total_tokens", 0))}


def _result(reply: Reply, model: str) -> ChatResult:
    meta = {"model_name": model, **reply.metadata()}
    message = AIMessage(content=reply.text, response_metadata=meta, usage_metadata=_usage(reply))
    return ChatResult(generations=[ChatGeneration(message=message, generation_info=meta)])


def _chunk(delta: Delta, model: str) -> ChatGenerationChunk:
    if delta.reply is None:
        return ChatGenerationChunk(message=AIMessageChunk(content=delta.text))
    meta = {"model_name": model, **delta.reply.metadata()}
    message = AIMessageChunk(content=delta.text, response_metadata=meta, usage_metadata=_usage(delta.reply),
                             chunk_position="last")
    return ChatGenerationChunk(message=message, generation_info=meta)


def format_documents(docs: Sequence[Document]) -> str:
    """The documents' texts, a blank line apart (what LangChain's RAG tutorials call ``format_docs``)."""
    return "\n\n".join(d.page_content for d in docs)


def prompt_with_references(prompt: Runnable, documents_key: str = "context",
                           format_docs: Callable[[Sequence[Document]], str] = format_documents) -> Runnable:
    """``prompt`` as an LCEL step that also hands the retrieved documents to ``ChatSuffixSpec`` as references.

    Input: the dict a RAG chain builds, e.g. ``{"context": [Document, ...], "question": "..."}``. The
    prompt is formatted with ``documents_key`` replaced by ``format_docs(documents)``; the documents'
    texts go to the last message's ``additional_kwargs["references"]``. A string in ``documents_key``
    (already formatted) is used as is and becomes one reference. Worked example::

        step = prompt_with_references(ChatPromptTemplate.from_template("{context}\\n\\nQ: {question}"))
        value = step.invoke({"context": [Document(page_content="a = 1")], "question": "a?"})
        value.to_messages()[-1].additional_kwargs["references"]   # ['a = 1']
    """

    def attach(inputs: dict) -> ChatPromptValue:
        docs = inputs[documents_key]
        texts = [docs] if isinstance(docs, str) else [d.page_content for d in docs]
        formatted = docs if isinstance(docs, str) else format_docs(docs)
        messages = list(prompt.invoke({**inputs, documents_key: formatted}).to_messages())
        last = messages[-1]
        extra = {**last.additional_kwargs, REFERENCES_KEY: [t for t in texts if t]}
        messages[-1] = last.model_copy(update={"additional_kwargs": extra})
        return ChatPromptValue(messages=messages)

    return RunnableLambda(attach, name="prompt_with_references")
