"""OpenAI-format errors: ``{"error": {"message", "type", "param", "code"}}`` with the right HTTP status.

Two ways an error reaches a client:
- a route raises ``APIError`` (a refusal it words itself: a bad field, an unknown model);
- the project's own exceptions are answered by type, from ``EXCEPTIONS`` below. A subclass is
  answered as its nearest listed base (``UnusableDatabase`` is a ``StoreError``); an exception not listed
  (``KeyError``, a plain ``ValueError``, a bug) is a 500 whose message says only "see the server log",
  and the log gets the traceback. A bad request is a ``RequestError`` (``suffixspec.errors``, raised by
  the request checks alone): a 400 with its message and the field it names.

Example: the index writer child is killed while adding documents -> ``WriterDied("the index writer
process exited (killed by SIGKILL) before finishing: ...")`` -> 503, code ``index_writer_died``,
that message, ``Retry-After: 2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import Response, jsonify

from suffixspec.errors import RequestError
from suffixspec.index.errors import InvalidDocument, NoDocumentStore, ReadOnlyStore, StoreError, WriterDied
from suffixspec.server.worker import QueueFull, ShuttingDown

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


@dataclass(frozen=True)
class Answer:
    """How the server answers one of the project's exception types."""

    status: int  # HTTP status
    code: str  # the error's "code"
    message: str = "{exc}"  # shown to the client; {exc} = the exception's own message (written to be shown)
    retry: bool = False  # send Retry-After (the condition passes: a full queue, a writer to restart)


# The project's exceptions -> their answer. Adding a type is one line; order does not matter (the
# nearest base in the exception's MRO wins).
EXCEPTIONS: dict[type[BaseException], Answer] = {
    QueueFull: Answer(503, "queue_full", "the server is busy ({exc}); retry after a moment", retry=True),
    ShuttingDown: Answer(503, "shutting_down", "the server is shutting down; retry on another instance or later"),
    RequestError: Answer(400, "invalid_value"),  # the request checks (a chat template that refuses the messages)
    # the document index's (suffixspec.index.errors): messages written to be shown (what happened, what to do)
    InvalidDocument: Answer(400, "invalid_value"),
    NoDocumentStore: Answer(501, "index_unavailable"),
    ReadOnlyStore: Answer(503, "index_read_only"),
    WriterDied: Answer(503, "index_writer_died", retry=True),
    StoreError: Answer(503, "index_unavailable"),
}


def answer_for(exc: BaseException) -> Answer | None:
    """The answer for ``exc``'s type or its nearest listed base; None for an exception not listed."""
    for cls in type(exc).__mro__:
        if cls in EXCEPTIONS:
            return EXCEPTIONS[cls]
    return None


def to_api_error(exc: BaseException, retry_after_s: int) -> APIError | None:
    """``exc`` as the APIError its type maps to (None: not one of the project's, a 500)."""
    ans = answer_for(exc)
    if ans is None:
        return None
    headers = {"Retry-After": str(retry_after_s)} if ans.retry else None
    return APIError(ans.message.format(exc=str(exc).strip("'\"")), ans.status, param=getattr(exc, "param", None),
                    code=ans.code, headers=headers)
