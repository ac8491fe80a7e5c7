"""OpenAI-format errors: ``{"error": {"message", "type", "param", "code"}}`` with the right HTTP status."""

from __future__ import annotations

from typing import Any

from flask import Response, jsonify

from ..index.errors import InvalidDocument, NoDocumentStore, ReadOnlyStore, StoreError, WriterDied

# HTTP status -> OpenAI error type.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class APIError(Exception):
    """An error the client should see. ``message`` says what is wrong and, where it helps, what to do."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, type_: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.type = type_ or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        resp = jsonify(self.body())
        resp.status_code = self.status
        for k, v in self.headers.items():
            resp.headers[k] = v
        return resp


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    """A 400 about one request field."""
    return APIError(message, 400, param=param, code=code)


# The document index's exceptions (suffixspec.index.errors) -> (HTTP status, code); a subclass is answered
# as its nearest listed base. Their messages are written to be shown (what happened, what to do).
INDEX_ERRORS: dict[type[Exception], tuple[int, str]] = {
    InvalidDocument: (400, "invalid_value"),
    NoDocumentStore: (501, "index_unavailable"),
    ReadOnlyStore: (503, "index_read_only"),
    WriterDied: (503, "index_writer_died"),
    StoreError: (503, "index_unavailable"),
}


def index_error(exc: Exception) -> APIError | None:
    """The answer to one of the document index's exceptions (None: not one of them)."""
    for cls in type(exc).__mro__:
        if cls in INDEX_ERRORS:
            status, code = INDEX_ERRORS[cls]
            return APIError(str(exc), status, code=code)
    return None
