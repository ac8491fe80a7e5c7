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

from flask import Blueprint, Response, jsonify, request

from suffixspec.server.errors import invalid
from suffixspec.server.routes_openai import read_json, state
from suffixspec.server.schema import parse, request_models

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


@bp.get("/v1/index/documents")
def list_documents() -> Response:
    spec = state().spec
    limit = _int_arg("limit", 20, 1, 1000)
    offset = _int_arg("offset", 0, 0, 10**9)
    q = request.args.get("q") or None
    limit_q = state().config.max_query_chars
    if q is not None and len(q) > limit_q:  # SQLite refuses long LIKE patterns ("pattern too complex")
        raise invalid(f"query parameter 'q' is {len(q)} characters long; search with at most {limit_q}", "q")
    page = spec.list_documents(limit=limit, offset=offset, query=q)
    return jsonify({"object": "list", "data": page["data"], "total": page["total"],
                    "limit": limit, "offset": offset})


@bp.post("/v1/index/documents")
def add_documents() -> Response:
    st = state()
    req = parse(request_models(st.config).add_documents, read_json())
    clean = [{"text": d.text, "source": d.source, "metadata": d.metadata} for d in req.documents]
    added = st.spec.add_documents(clean)
    return jsonify({"object": "list", "data": added})


@bp.delete("/v1/index/documents")
def delete_documents() -> Response:
    st = state()
    ids: list = request.args.getlist("id")
    if request.get_data(cache=True):
        ids += parse(request_models(st.config).delete_documents, read_json()).ids
    if not ids:
        raise invalid("give the documents to remove as ?id=... or {\"ids\": [...]}", "ids", "missing_required")
    norm = [int(v) if isinstance(v, str) and v.isascii() and v.isdigit() else v for v in ids]  # not int("²")
    removed = st.spec.remove_documents(norm)
    return jsonify({"object": "list", "deleted": removed, "ids": norm})


@bp.get("/v1/index/stats")
def index_stats() -> Response:
    return jsonify(state().spec.index_stats())
