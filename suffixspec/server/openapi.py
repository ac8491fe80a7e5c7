"""``GET /openapi.json``: an OpenAPI 3.1 description of the routes, for clients and API fuzzers.

The request bodies' schemas are generated from the models that validate them (``schema.py``), with
the running server's limits, so the description and the validation cannot disagree. The server
accepts a little more than the schemas say: it ignores unknown fields (as OpenAI does) and takes
``null`` for "not sent"; every refusal is a 4xx ``{"error": {...}}``.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify
from pydantic.json_schema import models_json_schema

from suffixspec.server.schema import Error, request_models

bp = Blueprint("openapi", __name__)

_JSON = "application/json"
_ERRORS = {400: "invalid request (param names the field)", 401: "missing or wrong API key", 404: "not found",
           413: "body too large", 501: "no document store", 503: "busy, shutting down, or the index unavailable"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _ok(desc: str, stream: bool = False, content_type: str = _JSON) -> dict[str, Any]:
    content: dict[str, Any] = {content_type: {"schema": {"type": "object" if content_type == _JSON else "string"}}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    return {"description": desc, "content": content}


def _op(op_id: str, summary: str, ok: dict[str, Any], errors: tuple[int, ...] = (), body: str | None = None,
        params: list[dict[str, Any]] | None = None, body_required: bool = True, public: bool = False) -> dict:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "responses": {"200": ok, **{
        str(c): {"description": _ERRORS[c], "content": {_JSON: {"schema": _ref("Error")}}} for c in errors}}}
    if body:
        op["requestBody"] = {"required": body_required, "content": {_JSON: {"schema": _ref(body)}}}
    if params:
        op["parameters"] = params
    if public:
        op["security"] = []
    return op


def _query(name: str, schema: dict[str, Any], where: str = "query") -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "schema": schema}


def build_spec(cfg: Any, max_context: int, model_names: list[str] | None = None) -> dict[str, Any]:
    """The OpenAPI document for a server with settings ``cfg``, a model of ``max_context`` tokens
    served under ``model_names``."""
    models = request_models(cfg)
    _, defs = models_json_schema(
        [(m, "validation") for m in (models.completion, models.chat, models.add_documents, models.delete_documents,
                                     Error)], ref_template="#/components/schemas/{model}")
    schemas = defs["$defs"]
    limit = min(max_context - 1, cfg.max_prompt_tokens or max_context)
    for name, field in (("CompletionRequest", "prompt"), ("ChatRequest", "messages")):
        schemas[name]["properties"][field]["description"] = f"at most {limit} tokens (the server's prompt limit)"
        if model_names:
            schemas[name]["properties"]["model"]["enum"] = ["", *sorted(model_names)]
    gen = (400, 401, 404, 413, 503)
    store = (400, 401, 501, 503)
    paths = {
        "/v1/completions": {"post": _op("createCompletion", "Text completion", _ok(
            "completion (server-sent events when stream is true)", stream=True), gen, "CompletionRequest")},
        "/v1/chat/completions": {"post": _op("createChatCompletion", "Chat completion", _ok(
            "chat completion (server-sent events when stream is true)", stream=True), gen, "ChatRequest")},
        "/v1/models": {"get": _op("listModels", "The served model", _ok("a list of one model"), (401,))},
        "/v1/models/{model}": {"get": _op("retrieveModel", "One model", _ok("the model"), (401, 404),
                                          params=[_query("model", {"type": "string"}, "path")])},
        "/v1/index/documents": {
            "get": _op("listDocuments", "A page of indexed documents", _ok("a page of documents"), store, params=[
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                _query("offset", {"type": "integer", "minimum": 0}),
                _query("q", {"type": "string", "maxLength": cfg.max_query_chars})]),
            "post": _op("addDocuments", "Index documents (idempotent by content)", _ok("one record per document"),
                        store + (413,), "AddDocuments"),
            "delete": _op("deleteDocuments", "Remove documents", _ok("how many were removed"), store,
                          "DeleteDocuments", [_query("id", {"type": "string"})], body_required=False)},
        "/v1/index/stats": {"get": _op("indexStats", "Corpus statistics", _ok("corpus statistics"), (401, 501, 503))},
        "/health": {"get": _op("health", "Liveness", _ok("serving"), public=True)},
        "/metrics": {"get": _op("metrics", "Prometheus metrics", _ok("Prometheus text format",
                                                                     content_type="text/plain"), public=True)},
        "/openapi.json": {"get": _op("openapi", "This description", _ok("OpenAPI 3.1"), public=True)},
    }
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "suffixspec", "version": _version(),
                 "description": "OpenAI-compatible completions with lossless speculative decoding, "
                                "plus the document index the suffix drafter reads."},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if cfg.api_key:
        spec["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        spec["security"] = [{"bearer": []}]
    return spec


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("suffixspec")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "0"


@bp.get("/openapi.json")
def openapi() -> Response:
    st = current_app.extensions["suffixspec"]
    return jsonify(build_spec(st.config, st.spec.max_context, sorted(st.model_names)))
