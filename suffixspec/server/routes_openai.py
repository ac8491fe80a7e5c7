"""``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``: thin routes over the worker."""

from __future__ import annotations

import json
import queue
import re
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from .errors import APIError
from .responses import SSE_DONE, ResponseBuilder, sse
from .validation import GenRequest, check_reference_size, parse_chat, parse_completion
from .worker import DONE, Job, JobFailed, QueueFull, ShuttingDown

bp = Blueprint("openai", __name__)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a \uD800-\uDFFF escape somewhere in the body


def state() -> Any:
    return current_app.extensions["suffixspec"]


def read_json() -> dict:
    """The request body as a JSON object, or a 400 that says why not (413 when too large)."""
    raw = request.get_data(cache=True)  # Flask raises 413 past MAX_CONTENT_LENGTH
    if not raw:
        raise APIError("the request body is empty; send a JSON object", 400, code="invalid_json")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(f"could not parse the JSON body: {e}", 400, code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(f"the JSON body must be an object, got {type(body).__name__}", 400, code="invalid_json")
    if _SURROGATE_ESCAPE.search(raw):  # "\ud800" alone decodes to a str no tokenizer or database can take
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise APIError("the JSON body holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its "
                           "pair); send valid Unicode text", 400, code="invalid_json") from None
    return body


@bp.get("/v1/models")
def models() -> Response:
    st = state()
    return jsonify({"object": "list", "data": [{"id": st.model_id, "object": "model", "created": st.started,
                                                "owned_by": "suffixspec", "max_model_len": st.spec.max_context}]})


@bp.get("/v1/models/<path:model>")
def model(model: str) -> Response:
    st = state()
    if model != st.model_id:
        raise APIError(f"the model '{model}' does not exist; this server serves '{st.model_id}'", 404,
                       "model", "model_not_found")
    return jsonify({"id": st.model_id, "object": "model", "created": st.started, "owned_by": "suffixspec",
                    "max_model_len": st.spec.max_context})


@bp.post("/v1/completions")
def completions() -> Response:
    return _generate(parse_completion, "completions")


@bp.post("/v1/chat/completions")
def chat_completions() -> Response:
    return _generate(parse_chat, "chat")


def _generate(parser: Callable[..., GenRequest], endpoint: str) -> Response:
    st = state()
    req = parser(read_json(), st.spec, st.config)
    check_reference_size(req, st.config)
    tok = st.spec.tokenizer
    prediction_len = len(tok.encode(req.prediction, add_special_tokens=False)) if req.prediction else (
        0 if req.prediction == "" else None)
    job = Job(kwargs=dict(prompt=req.prompt_ids, sampling=req.sampling, speculation=req.speculation,
                          references=req.references, prediction=req.prediction), endpoint=endpoint)
    try:
        st.worker.submit(job)
    except QueueFull as e:
        st.metrics.rejected.labels("queue_full").inc()
        raise APIError(f"the server is busy ({e}); retry after a moment", 503, code="queue_full",
                       headers={"Retry-After": str(st.config.retry_after_s)}) from None
    except ShuttingDown:
        raise APIError("the server is shutting down", 503, code="shutting_down") from None
    builder = ResponseBuilder(req.kind, st.model_id, tok, prediction_len, req.logprobs)
    disconnected = request.environ.get("waitress.client_disconnected")
    poll = st.config.disconnect_poll_s
    if req.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return Response(_stream(job, builder, req.include_usage, disconnected, poll),
                        mimetype="text/event-stream", headers=headers)
    return jsonify(builder.full(_wait(job, disconnected, poll)))


def _next_event(job: Job, disconnected: Callable[[], bool] | None, poll: float) -> Any:
    """The job's next event; cancels the job and returns None if the client has gone."""
    while True:
        try:
            return job.events.get(timeout=poll)
        except queue.Empty:
            if disconnected is not None and disconnected():
                job.cancel.set()
                return None


def _failure(ev: JobFailed) -> APIError:
    if ev.shutdown:
        return APIError("the server is shutting down; retry on another instance or later", 503, code="shutting_down")
    if ev.bad_request:
        return APIError(ev.message, 400, code="invalid_value")
    return APIError(ev.message, 500, code="engine_error")


def _wait(job: Job, disconnected: Callable[[], bool] | None, poll: float) -> Any:
    """Block until the job finishes; its GenerationResult."""
    try:
        while True:
            ev = _next_event(job, disconnected, poll)
            if ev is None:  # the client left; nobody will read an answer
                raise APIError("client disconnected", 499, code="client_disconnected")
            if ev is DONE:
                return job.result
            if isinstance(ev, JobFailed):
                raise _failure(ev)
    finally:
        job.cancel.set()  # no-op when finished; stops the engine if we leave early


def _stream(job: Job, builder: ResponseBuilder, include_usage: bool,
            disconnected: Callable[[], bool] | None, poll: float) -> Iterator[bytes]:
    """SSE body. Leaving early (the WSGI server closes us when the client goes) cancels the job."""
    try:
        first = builder.first_chunk()
        if first is not None:
            yield sse(first)
        while True:
            ev = _next_event(job, disconnected, poll)
            if ev is None:
                return
            if ev is DONE:
                break
            if isinstance(ev, JobFailed):
                yield sse(_failure(ev).body())
                break
            result = getattr(ev, "result", None)
            lp = ev.logprobs
            if result is not None:
                if builder.logprobs is not None and result.logprobs:
                    lp = result.logprobs[builder.lp_sent:]
                yield sse(builder.chunk(ev.text, ev.pieces, lp, result))
                if include_usage:
                    yield sse(builder.usage_chunk(result))
            elif ev.text or lp:
                yield sse(builder.chunk(ev.text, ev.pieces, lp if builder.logprobs is not None else None))
        yield SSE_DONE
    finally:
        job.cancel.set()
