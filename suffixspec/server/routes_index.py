"""``GET/POST/DELETE /v1/index/documents`` and ``GET /v1/index/stats`` over the document store.

Documents added here are drafted from by the very next request (the suffix proposer reads the
live corpus); adding is idempotent by content hash.

- ``GET  /v1/index/documents?limit=20&offset=0&q=text`` -> ``{"object": "list", "data": [...], "total": N}``
- ``POST /v1/index/documents`` with ``{"documents": ["text" | {"text", "source", "metadata"}]}``
  -> ``{"object": "list", "data": [{"id", "created", ...}]}``
- ``DELETE /v1/index/documents?id=3`` or with ``{"ids": [3, 4]}`` -> ``{"deleted": n, "ids": [...]}``
- ``GET  /v1/index/stats`` -> corpus and history statistics
"""

from __future__ import annotations

import json

from flask import Blueprint, Response, jsonify, request

from .errors import INDEX_ERRORS, index_error, invalid
from .routes_openai import read_json, state

bp = Blueprint("index", __name__)


def _int_arg(name: str, default: int, lo: int, hi: int) -> int:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise invalid(f"query parameter '{name}' must be an integer, got {raw!r}", name, "invalid_type") from None
    if not lo <= v <= hi:
        raise invalid(f"query parameter '{name}' must be between {lo} and {hi}, got {v}", name)
    return v


def _store_call(fn, *args, **kw):
    """``fn(...)``, the document index's exceptions answered by type (errors.INDEX_ERRORS); others are a 500."""
    try:
        return fn(*args, **kw)
    except tuple(INDEX_ERRORS) as e:
        raise index_error(e) from None


@bp.get("/v1/index/documents")
def list_documents() -> Response:
    spec = state().spec
    limit = _int_arg("limit", 20, 1, 1000)
    offset = _int_arg("offset", 0, 0, 10**9)
    q = request.args.get("q") or None
    limit_q = state().config.max_query_chars
    if q is not None and len(q) > limit_q:  # SQLite refuses long LIKE patterns ("pattern too complex")
        raise invalid(f"query parameter 'q' is {len(q)} characters long; search with at most {limit_q}", "q")
    page = _store_call(spec.list_documents, limit=limit, offset=offset, query=q)
    return jsonify({"object": "list", "data": page["data"], "total": page["total"],
                    "limit": limit, "offset": offset})


@bp.post("/v1/index/documents")
def add_documents() -> Response:
    st = state()
    body = read_json()
    docs = body.get("documents")
    if docs is None and isinstance(body.get("text"), str):  # a single document
        docs = [body]
    if not isinstance(docs, list) or not docs:
        raise invalid('\'documents\' must be a non-empty list of strings or {"text", "source", "metadata"} '
                      "objects", "documents", "invalid_type")
    if len(docs) > st.config.max_documents_per_request:
        raise invalid(f"at most {st.config.max_documents_per_request} documents per request, got {len(docs)}",
                      "documents")
    clean = []
    for i, d in enumerate(docs):
        p = f"documents[{i}]"
        if isinstance(d, str):
            d = {"text": d}
        if not isinstance(d, dict) or not isinstance(d.get("text"), str):
            raise invalid(f"'{p}' must be a string or an object with a 'text' string", p, "invalid_type")
        if not d["text"]:
            raise invalid(f"'{p}.text' is empty", f"{p}.text")
        if d.get("source") is not None and not isinstance(d["source"], str):
            raise invalid(f"'{p}.source' must be a string", f"{p}.source", "invalid_type")
        meta = d.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise invalid(f"'{p}.metadata' must be an object", f"{p}.metadata", "invalid_type")
        clean.append({"text": d["text"], "source": d.get("source"), "metadata": meta or {}})
    added = _store_call(st.spec.add_documents, clean)
    return jsonify({"object": "list", "data": added})


@bp.delete("/v1/index/documents")
def delete_documents() -> Response:
    spec = state().spec
    ids: list = request.args.getlist("id")
    if request.get_data(cache=True):
        body = read_json()
        more = body.get("ids", [])
        if not isinstance(more, list):
            raise invalid("'ids' must be a list of document ids", "ids", "invalid_type")
        ids += more
    if not ids:
        raise invalid("give the documents to remove as ?id=... or {\"ids\": [...]}", "ids", "missing_required")
    norm = []
    for v in ids:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise invalid(f"document ids must be integers or strings, got {json.dumps(v)}", "ids", "invalid_type")
        norm.append(int(v) if isinstance(v, str) and v.isascii() and v.isdigit() else v)  # not int("²")
    removed = _store_call(spec.remove_documents, norm)
    return jsonify({"object": "list", "deleted": removed, "ids": norm})


@bp.get("/v1/index/stats")
def index_stats() -> Response:
    return jsonify(_store_call(state().spec.index_stats))
