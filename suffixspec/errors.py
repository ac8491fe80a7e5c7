"""The request error: a request's arguments cannot be served as given; the message says what to change.

Errors are told apart by kind, not by Python's exception type alone. :class:`RequestError` is raised
only by the checks of a request's arguments: ``SamplingParams`` and ``SpeculationConfig``,
``sequence.prepare`` (prompt length, an empty prompt), the Python API's own argument checks
(``SuffixSpec.generate``), and a chat template that refuses the conversation. The HTTP server answers it
with a 400 that shows the message; anything else raised while serving a request (a bug in a proposer,
the runner, a full disk) is a 500 whose body says only to see the server log, which holds the traceback.

It is a ``ValueError``, so code that caught ``ValueError`` from the API still catches it; code that
must tell a bad request from a bug catches ``RequestError``. Example::

    SamplingParams(top_p=0)
    -> RequestError("top_p must be in (0, 1], got 0"), .param == "top_p"
    -> HTTP 400 {"error": {"message": "top_p must be in (0, 1], got 0", "param": "top_p", ...}}
"""

from __future__ import annotations


class RequestError(ValueError):
    """A request's argument that cannot be served as given; the message says what to change."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param  # the argument (request field) to change, when one is to blame
