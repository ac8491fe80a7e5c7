"""``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``: thin routes over the worker."""

from __future__ import annotations

import json
import math
import queue
import re
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, request

from suffixspec.server.errors import APIError
from suffixspec.server.responses import SSE_DONE, ResponseBuilder, sse
from suffixspec.server.validation import GenRequest, parse_chat, parse_completion
from suffixspec.server.worker import DONE, Job, JobFailed, QueueFull

bp = Blueprint("openai", __name__)
# a \uD800-\uDFFF escape, or such a code point's own 3 bytes (json.loads decodes bytes with surrogatepass)
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def state() -> Any:
    return current_app.extensions["suffixspec"]


def _non_finite(token: str) -> Any:
    raise APIError(f"the JSON body holds {token}, which is not a JSON number (the JSON standard has no "
                   "NaN or Infinity); send a finite number or null", 400, code="invalid_json")


def _finite_float(token: str) -> float:
    v = float(token)
    if not math.isfinite(v):  # 1e999 parses to inf
        _non_finite(token if len(token) <= 40 else token[:40] + "...")
    return v


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of arrays/objects (a scalar is 0), counted without recursion; stops past ``limit``."""
    depth, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            depth = max(depth, d)
            if depth > limit:
                return depth
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return depth


def read_json() -> dict:
    """The request body as a JSON object, or a 400 that says why not (413 when too large)."""
    raw = request.get_data(cache=True)  # Flask raises 413 past MAX_CONTENT_LENGTH
    if not raw:
        raise APIError("the request body is empty; send a JSON object", 400, code="invalid_json")
    limit = state().config.max_json_depth
    try:
        body = json.loads(raw, parse_constant=_non_finite, parse_float=_finite_float)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(f"could not parse the JSON body: {e}", 400, code="invalid_json") from None
    except RecursionError:
        raise APIError(f"the JSON body is nested too deeply; at most {limit} levels of arrays and objects "
                       "are accepted", 400, code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(f"the JSON body must be an object, got {type(body).__name__}", 400, code="invalid_json")
    if json_depth(body, limit) > limit:
        raise APIError(f"the JSON body is nested too deeply; at most {limit} levels of arrays and objects "
                       "are accepted", 400, code="invalid_json")
    if _SURROGATE.search(raw):  # "\ud800" alone decodes to a str no tokenizer or database can take
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise APIError("the JSON body holds a lone UTF-16 surrogate (\\ud800-\\udfff without its "
                           "pair); send valid Unicode text", 400, code="invalid_json") from None
    return body


def model_card() -> dict:
    """The served model as ``/v1/models`` lists it. Besides OpenAI's fields: ``max_model_len`` (as vLLM),
    ``chat_template`` (whether chat requests get the model's template; the web page opens in Chat mode
    then) and ``drafters`` (the names ``speculation.drafters`` may give on this server)."""
    st = state()
    return {"id": st.model_id, "object": "model", "created": st.started, "owned_by": "suffixspec",
            "max_model_len": st.spec.max_context, "chat_template": st.spec.has_chat_template,
            "drafters": st.spec.drafters}


@bp.get("/v1/models")
def models() -> Response:
    return jsonify({"object": "list", "data": [model_card()]})


def check_model(name: str) -> None:
    """A 404 ``model_not_found`` for a model this server does not serve (as OpenAI and vLLM answer)."""
    st = state()
    if name and name not in st.model_names:
        others = sorted(st.model_names - {st.model_id})
        alias = f" (aliases: {', '.join(others)})" if others else ""
        raise APIError(f"the model '{name}' does not exist; this server serves '{st.model_id}'{alias}; "
                       "more names can be served with --served-model-name", 404, "model", "model_not_found")


@bp.get("/v1/models/<path:model>")
def model(model: str) -> Response:
    check_model(model)
    return jsonify(model_card())


@bp.post("/v1/completions")
def completions() -> Response:
    return _generate(parse_completion, "completions")


@bp.post("/v1/chat/completions")
def chat_completions() -> Response:
    return _generate(parse_chat, "chat")


def _generate(parser: Callable[..., GenRequest], endpoint: str) -> Response:
    st = state()
    body = read_json()
    if isinstance(body.get("model"), str):
        check_model(body["model"])
    req = parser(body, st.spec, st.config)
    tok = st.spec.tokenizer
    prediction_len = len(tok.encode(req.prediction, add_special_tokens=False)) if req.prediction else (
        0 if req.prediction == "" else None)
    job = Job(kwargs=dict(prompt=req.prompt_ids, sampling=req.sampling, speculation=req.speculation,
                          references=req.references, prediction=req.prediction), endpoint=endpoint)
    g.job = job  # the access log's line names its tokens
    try:
        st.worker.submit(job)  # QueueFull and ShuttingDown are answered by type (errors.EXCEPTIONS)
    except QueueFull:
        st.metrics.rejected.labels("queue_full").inc()
        raise
    builder = ResponseBuilder(req.kind, st.model_id, tok, prediction_len, req.logprobs)
    disconnected = request.environ.get("waitress.client_disconnected")
    poll = st.config.disconnect_poll_s
    if req.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return Response(_stream(job, builder, req.include_usage, disconnected, poll),
                        mimetype="text/event-stream", headers=headers)
    return jsonify(builder.full(_wait(job, disconnected, poll)))


def _next_event(job: Job, disconnected: Callable[[], bool] | None, poll: float) -> Any:
    """The job's next event; cancels the job and returns None if the client has gone.

    The socket is checked before every event, not only when none came for ``poll`` seconds: the
    engine sends one event per step, and steps faster than ``poll`` used to hide a client that left
    (a non-streaming request then ran to max_tokens). ``disconnected`` is waitress' flag, set by its
    event loop when the socket reads EOF, so checking it costs an attribute read."""
    while True:
        if disconnected is not None and disconnected():
            job.cancel.set()
            return None
        try:
            return job.events.get(timeout=poll)
        except queue.Empty:
            continue


def _failure(ev: JobFailed) -> APIError:
    if ev.shutdown:
        return APIError("the server is shutting down; retry on another instance or later", 503, code="shutting_down")
    if ev.bad_request:
        return APIError(ev.message, 400, param=ev.param, code="invalid_value")
    return APIError(ev.message, 500, code="engine_error")


def _wait(job: Job, disconnected: Callable[[], bool] | None, poll: float) -> Any:
    """Block until the job finishes; its GenerationResult."""
    try:
        while True:
            ev = _next_event(job, disconnected, poll)
            if ev is None:  # the client left; nobody will read an answer
                job.client_left = True
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
            if ev is None:  # the client left (seen on its socket)
                job.client_left = True
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
    except GeneratorExit:  # the WSGI server closed the body before its end: the client went away
        job.client_left = True
        raise
    finally:
        job.cancel.set()
