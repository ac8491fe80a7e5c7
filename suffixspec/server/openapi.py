"""``GET /openapi.json``: an OpenAPI 3.1 description of the routes, for clients and API fuzzers.

The request schemas say what ``validation.py`` accepts (types and ranges); the server stays the
authority (it ignores unknown fields, as OpenAI does, and answers every refusal with a 4xx
``{"error": {...}}``). The limits shown are the running server's (``ServerConfig``).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify

from ..draft import DRAFTERS

bp = Blueprint("openapi", __name__)

_JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(schema: str) -> dict[str, Any]:
    return {"required": True, "content": {_JSON: {"schema": _ref(schema)}}}


def _ok(desc: str, schema: dict[str, Any] | None = None, stream: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {_JSON: {"schema": schema or {"type": "object"}}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    return {"description": desc, "content": content}


def _errors(*codes: int) -> dict[str, Any]:
    words = {400: "invalid request (the message names the field)", 401: "missing or wrong API key",
             404: "not found", 413: "body too large", 501: "no document store", 503: "queue full or shutting down"}
    return {str(c): {"description": words[c], "content": {_JSON: {"schema": _ref("Error")}}} for c in codes}


def build_spec(cfg: Any, model_id: str, max_context: int) -> dict[str, Any]:
    """The OpenAPI document for a server with settings ``cfg``."""
    num = {"type": "number"}
    sampling = {
        "model": {"type": "string", "description": f"ignored; this server serves '{model_id}'"},
        "max_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": cfg.max_tokens_limit},
        "temperature": {**num, "minimum": 0, "maximum": 2},
        "top_p": {**num, "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": -1},
        "seed": {"type": ["integer", "null"], "minimum": 0, "description": (
            "fixes the sampled tokens. With the model-free drafters (prompt, history, documents, "
            "references, prediction), a text-mode bridged draft model or a same-vocabulary draft model that "
            "does not sample, the output equals speculation off (`speculation: false`) token for token, up to "
            "float rounding when the two best scores of the sampling race are within rounding (rare: see the README); with a draft model that samples "
            "(same vocabulary, or token-level intersection) the distribution is the same but the tokens are "
            "not those of speculation off, and may vary run to run (which drafts get verified follows measured "
            "timings). Greedy (temperature 0) output is always identical")},
        "presence_penalty": {**num, "minimum": -2, "maximum": 2},
        "frequency_penalty": {**num, "minimum": -2, "maximum": 2},
        "stop": {"oneOf": [{"type": "string", "minLength": 1},
                           {"type": "array", "maxItems": cfg.max_stop, "items": {"type": "string", "minLength": 1}}]},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "n": {"type": "integer", "enum": [1]},
        "logit_bias": {"type": "object", "additionalProperties": {**num, "minimum": -100, "maximum": 100}},
        "ignore_eos": {"type": "boolean"},
        "references": {"type": "array", "maxItems": cfg.max_references, "items": {"type": "string"},
                       "description": f"retrieved chunks the output may copy from (at most "
                                      f"{cfg.max_reference_chars} characters with the prediction)"},
        "prediction": {"type": "object", "required": ["content"],
                       "properties": {"type": {"type": "string", "enum": ["content"]},
                                      "content": {"type": "string"}}},
        "speculation": {"oneOf": [{"type": "boolean"}, _ref("Speculation")]},
    }
    text_part = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
    schemas = {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["message", "type"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                           "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}},
        "Speculation": {"type": "object", "properties": {
            "drafters": {"type": "array", "items": {"type": "string", "enum": list(DRAFTERS)}},
            "max_draft_tokens": {"type": "integer", "minimum": 0, "maximum": 256},
            "enabled": {"type": "boolean"}, "adaptive": {"type": "boolean"}}},
        "CompletionRequest": {"type": "object", "required": ["prompt"], "properties": {
            "prompt": {"oneOf": [{"type": "string", "minLength": 1},
                                 {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}],
                       "description": f"at most {min(max_context - 1, cfg.max_prompt_tokens or max_context)} tokens"},
            "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
            "echo": {"type": "boolean", "enum": [False]},
            **sampling}},
        "ChatRequest": {"type": "object", "required": ["messages"], "properties": {
            "messages": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["role", "content"],
                "properties": {"role": {"type": "string",
                                        "enum": ["system", "developer", "user", "assistant", "tool"]},
                               "content": {"oneOf": [{"type": "string"},
                                                     {"type": "array", "items": text_part}]}}}},
            "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": cfg.max_tokens_limit},
            "logprobs": {"type": "boolean"},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            **sampling}},
        "Document": {"oneOf": [{"type": "string", "minLength": 1}, {
            "type": "object", "required": ["text"],
            "properties": {"text": {"type": "string", "minLength": 1,
                                    "description": "the document's text itself (never read from a path)"},
                           "source": {"type": "string", "description": "a name for the document; not read"},
                           "metadata": {"type": "object"}}}]},
        "AddDocuments": {"type": "object", "required": ["documents"], "properties": {
            "documents": {"type": "array", "minItems": 1, "maxItems": cfg.max_documents_per_request,
                          "items": _ref("Document")}}},
        "DeleteDocuments": {"type": "object", "properties": {
            "ids": {"type": "array", "items": {"oneOf": [{"type": "integer"}, {"type": "string"}]}}}},
    }
    gen_errors = _errors(400, 401, 413, 503)
    paths = {
        "/v1/completions": {"post": {"operationId": "createCompletion", "summary": "Text completion",
                                     "requestBody": _body("CompletionRequest"),
                                     "responses": {"200": _ok("completion (SSE when stream is true)", stream=True),
                                                   **gen_errors}}},
        "/v1/chat/completions": {"post": {"operationId": "createChatCompletion", "summary": "Chat completion",
                                          "requestBody": _body("ChatRequest"),
                                          "responses": {"200": _ok("chat completion (SSE when stream is true)",
                                                                   stream=True), **gen_errors}}},
        "/v1/models": {"get": {"operationId": "listModels", "responses": {"200": _ok("the served model"),
                                                                          **_errors(401)}}},
        "/v1/models/{model}": {"get": {"operationId": "retrieveModel",
                                       "parameters": [{"name": "model", "in": "path", "required": True,
                                                       "schema": {"type": "string"}}],
                                       "responses": {"200": _ok("the model"), **_errors(401, 404)}}},
        "/v1/index/documents": {
            "get": {"operationId": "listDocuments", "parameters": [
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                {"name": "q", "in": "query", "schema": {"type": "string"}}],
                    "responses": {"200": _ok("a page of documents"), **_errors(400, 401, 501)}},
            "post": {"operationId": "addDocuments", "requestBody": _body("AddDocuments"),
                     "responses": {"200": _ok("one record per document"), **_errors(400, 401, 413, 501)}},
            "delete": {"operationId": "deleteDocuments",
                       "parameters": [{"name": "id", "in": "query", "schema": {"type": "string"}}],
                       "requestBody": {"required": False, "content": {_JSON: {"schema": _ref("DeleteDocuments")}}},
                       "responses": {"200": _ok("how many were removed"), **_errors(400, 401, 501)}}},
        "/v1/index/stats": {"get": {"operationId": "indexStats",
                                    "responses": {"200": _ok("corpus statistics"), **_errors(401, 501)}}},
        "/health": {"get": {"operationId": "health", "security": [],
                            "responses": {"200": _ok("serving"), "503": _ok("not serving")}}},
        "/metrics": {"get": {"operationId": "metrics", "security": [], "responses": {
            "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
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
    try:
        from importlib.metadata import version

        return version("suffixspec")
    except Exception:  # not installed (running from a checkout)
        return "0"


@bp.get("/openapi.json")
def openapi() -> Response:
    st = current_app.extensions["suffixspec"]
    return jsonify(build_spec(st.config, st.model_id, st.spec.max_context))
