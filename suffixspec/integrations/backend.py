"""Where an integration's generations run: a ``SuffixSpec`` in this process, or a ``suffixspec serve`` URL.

Both framework adapters (``llama_index.py``, ``langchain.py``) turn their framework's calls into a
:class:`Request` and read back :class:`Reply` / :class:`Delta` objects, so the two modes, streaming
and async are written once, here, without importing either framework. Worked example::

    from suffixspec import SuffixSpec
    from suffixspec.integrations.backend import Request, backend_for

    backend = backend_for(spec=SuffixSpec())                 # or backend_for(base_url="http://127.0.0.1:8000/v1")
    chunk = "def area(r):\\n    return 3.14159 * r * r\\n"     # what the retriever returned
    reply = backend.generate(Request(prompt="def area(r):", references=[chunk], sampling={"max_tokens": 16}))
    reply.text                     # the completion, the same with or without the chunk (greedy)
    reply.accepted("references")   # how many of its tokens were drafted from the chunk and kept

In process, async calls run the blocking generation on a worker thread (the engine steps concurrent
callers together with ``max_num_seqs > 1``, else one at a time); a stream that the caller stops reading
is cancelled.
Against a server, requests go through ``httpx`` (a dependency of both frameworks' core packages) with
the server's extensions in the body: ``references``, ``prediction``, ``speculation``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from suffixspec.drafting.draft import SOURCE_REFERENCES

# Sampling keywords the integrations pass through (SamplingParams' names, the server's JSON names).
SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "presence_penalty",
                 "frequency_penalty", "logit_bias")


@dataclass
class Request:
    """One generation, framework-neutral. Give exactly one of ``prompt`` and ``messages``."""

    prompt: str | None = None  # a completion prompt, used as is
    messages: list[dict] | None = None  # chat messages ``{"role", "content"}``; the chat template applies
    references: list[str] | None = None  # retrieved chunks the answer may copy (drafted, never shown to the model)
    prediction: str | None = None  # the expected output of an edit (OpenAI's predicted outputs)
    speculation: Any = None  # None: defaults; False: plain decoding; a dict or SpeculationConfig
    sampling: dict[str, Any] = field(default_factory=dict)  # SAMPLING_KEYS -> value; None values are dropped

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt= or messages=")
        unknown = sorted(set(self.sampling) - set(SAMPLING_KEYS))
        if unknown:
            raise ValueError(f"unknown sampling option(s) {unknown}; choose from {list(SAMPLING_KEYS)}")
        self.sampling = {k: v for k, v in self.sampling.items() if v is not None}
        self.references = [r for r in self.references or () if r] or None
        self.prediction = self.prediction or None


@dataclass
class Reply:
    """A finished generation, in the server's vocabulary (what ``/v1/chat/completions`` returns)."""

    text: str  # the generated text (stop string and end token excluded)
    finish_reason: str | None  # "stop" or "length"
    stats: dict  # the server's ``speculative_decoding`` object: steps, per_source {drafted, accepted}, ...
    usage: dict  # OpenAI's usage: prompt_tokens, completion_tokens, total_tokens (+ prediction details)
    raw: dict | None = None  # the server's JSON response (its last chunk when streamed); None in process

    def accepted(self, source: str = SOURCE_REFERENCES) -> int:
        """Output tokens drafted by ``source`` (``references``, ``prompt``, ...) that the target kept."""
        return accepted_tokens(self.stats, source)

    def metadata(self) -> dict:
        """What the adapters put in their framework's response metadata."""
        return {"finish_reason": self.finish_reason, "usage": dict(self.usage),
                "speculative_decoding": self.stats, "accepted_from_references": self.accepted()}


def accepted_tokens(stats: dict, source: str = SOURCE_REFERENCES) -> int:
    """Tokens drafted by ``source`` and kept, from a ``speculative_decoding`` object."""
    return int(((stats.get("per_source") or {}).get(source) or {}).get("accepted", 0))


@dataclass
class Delta:
    """New output of a stream; the last delta of a stream carries the reply (and may hold no text)."""

    text: str  # new text since the previous delta
    provenance: list[dict] = field(default_factory=list)  # [{"text", "source"}] concatenating to ``text``
    reply: Reply | None = None  # set on the last delta only


class LocalBackend:
    """Generations on a :class:`~suffixspec.SuffixSpec` in this process."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.model_name = str(getattr(spec, "model_name", "suffixspec"))
        self.context_window = int(spec.max_context)
        # a model without a chat template gets a plain transcript from render_chat: no chat model
        self.is_chat_model = bool(getattr(spec.tokenizer, "chat_template", None))

    def _kwargs(self, req: Request) -> dict:
        kw = dict(req.sampling, references=req.references, prediction=req.prediction, speculation=req.speculation)
        if req.messages is not None:
            kw["messages"] = req.messages
        else:
            kw["prompt"] = req.prompt
        return kw

    def _reply(self, result: Any, req: Request) -> Reply:
        from suffixspec.server.responses import finish_reason, stats_dict, usage

        pred_len = len(self.spec.tokenizer.encode(req.prediction, add_special_tokens=False)) if req.prediction else None
        return Reply(result.text, finish_reason(result.finish_reason), stats_dict(result), usage(result, pred_len))

    def generate(self, req: Request) -> Reply:
        return self._reply(self.spec.generate(**self._kwargs(req)), req)

    def stream(self, req: Request, cancel: threading.Event | None = None) -> Iterator[Delta]:
        from suffixspec.server.responses import merge_pieces

        for ev in self.spec.stream(cancel=cancel, **self._kwargs(req)):
            reply = self._reply(ev.result, req) if ev.result is not None else None
            if ev.text or reply is not None:
                yield Delta(ev.text, merge_pieces(ev.pieces), reply)

    async def agenerate(self, req: Request) -> Reply:
        return await asyncio.to_thread(self.generate, req)

    async def astream(self, req: Request) -> AsyncIterator[Delta]:
        """The stream on a worker thread, handed over through a queue; leaving early cancels it."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        end = object()

        def put(item: Any) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                for delta in self.stream(req, cancel):
                    put(delta)
            except BaseException as e:  # handed to the reader, raised there
                put(e)
            finally:
                put(end)

        worker = loop.run_in_executor(None, work)
        try:
            while (item := await queue.get()) is not end:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()
            await worker


class RemoteBackend:
    """Generations on a ``suffixspec serve`` (or any server that reads the same extensions).

    ``base_url`` is the API root clients use (``http://127.0.0.1:8000/v1``); ``api_key`` the server's
    ``--api-key`` (or ``$SUFFIXSPEC_API_KEY``), if it has one.
    """

    def __init__(self, base_url: str, api_key: str | None = None, model: str = "suffixspec",
                 timeout: float = 600.0, is_chat_model: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model_name = model
        self.timeout = timeout
        self.is_chat_model = is_chat_model  # the server applies its model's chat template
        self._context_window: int | None = None

    @property
    def context_window(self) -> int:
        """The served model's context (``max_model_len`` of ``GET /v1/models``), asked once."""
        if self._context_window is None:
            import httpx

            r = httpx.get(self.base_url + "/models", headers=self.headers, timeout=self.timeout)
            self._check(r.status_code, r.text)
            self._context_window = int(r.json()["data"][0].get("max_model_len") or 2048)
        return self._context_window

    def _call(self, req: Request, stream: bool) -> tuple[str, dict]:
        body: dict[str, Any] = {"model": self.model_name, **req.sampling}
        if "logit_bias" in body:  # JSON object keys are strings
            body["logit_bias"] = {str(k): v for k, v in body["logit_bias"].items()}
        if req.messages is not None:
            url, body["messages"] = "/chat/completions", req.messages
        else:
            url, body["prompt"] = "/completions", req.prompt
        if req.references:
            body["references"] = req.references
        if req.prediction:
            body["prediction"] = {"type": "content", "content": req.prediction}
        if req.speculation is not None:
            spec = req.speculation
            body["speculation"] = spec if isinstance(spec, (bool, dict)) else {
                k: list(v) if isinstance(v, tuple) else v for k, v in asdict(spec).items() if v is not None}
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        return self.base_url + url, body

    @staticmethod
    def _check(status: int, text: str) -> None:
        if status >= 400:
            try:
                message = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = text[:500]
            raise RuntimeError(f"suffixspec server answered {status}: {message}")

    @staticmethod
    def _reply(obj: dict) -> Reply:
        choice = obj["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        return Reply(text or "", choice.get("finish_reason"), obj.get("speculative_decoding") or {},
                     obj.get("usage") or {}, raw=obj)

    def generate(self, req: Request) -> Reply:
        import httpx

        url, body = self._call(req, stream=False)
        r = httpx.post(url, json=body, headers=self.headers, timeout=self.timeout)
        self._check(r.status_code, r.text)
        return self._reply(r.json())

    async def agenerate(self, req: Request) -> Reply:
        import httpx

        url, body = self._call(req, stream=False)
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            r = await client.post(url, json=body, headers=self.headers)
        self._check(r.status_code, r.text)
        return self._reply(r.json())

    def stream(self, req: Request) -> Iterator[Delta]:
        import httpx

        url, body = self._call(req, stream=True)
        events = _SSE()
        with httpx.stream("POST", url, json=body, headers=self.headers, timeout=self.timeout) as r:
            if r.status_code >= 400:
                self._check(r.status_code, r.read().decode("utf-8", "replace"))
            for line in r.iter_lines():
                yield from events.feed(line)
        yield events.last()

    async def astream(self, req: Request) -> AsyncIterator[Delta]:
        import httpx

        url, body = self._call(req, stream=True)
        events = _SSE()
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            async with client.stream("POST", url, json=body, headers=self.headers) as r:
                if r.status_code >= 400:
                    self._check(r.status_code, (await r.aread()).decode("utf-8", "replace"))
                async for line in r.aiter_lines():
                    for delta in events.feed(line):
                        yield delta
        yield events.last()


class _SSE:
    """Reads a streamed OpenAI response (``data: {json}`` lines, then ``data: [DONE]``) into deltas."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.stats: dict = {}
        self.usage: dict = {}
        self.raw: dict | None = None
        self.done = False

    def feed(self, line: str) -> Iterator[Delta]:
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        obj = json.loads(data)
        if "error" in obj:
            raise RuntimeError(f"suffixspec server: {obj['error'].get('message')}")
        self.raw = obj
        self.stats = obj.get("speculative_decoding") or self.stats
        self.usage = obj.get("usage") or self.usage
        for choice in obj.get("choices") or ():
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            text = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
            if text:
                self.text.append(text)
                yield Delta(text, list(obj.get("provenance") or []))

    def last(self) -> Delta:
        if not self.done:
            raise RuntimeError("the suffixspec server's stream ended before [DONE]")
        return Delta("", [], Reply("".join(self.text), self.finish_reason, self.stats, self.usage, self.raw))


def backend_for(spec: Any = None, base_url: str | None = None, api_key: str | None = None,
                **remote: Any) -> LocalBackend | RemoteBackend:
    """A backend on ``spec`` (a SuffixSpec) or on ``base_url``; exactly one of the two."""
    if (spec is None) == (base_url is None):
        raise ValueError("give either spec=SuffixSpec(...) (in process) or base_url='http://HOST:PORT/v1' "
                         "(a suffixspec serve)")
    return LocalBackend(spec) if spec is not None else RemoteBackend(base_url, api_key, **remote)  # type: ignore[arg-type]
