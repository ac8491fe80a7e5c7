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


class RequestFailed(RuntimeError):
    """One request failed while the engine served it; the other requests in its batch go on, unaffected.

    ``stage`` names the step that failed (``joining the batch``, ``copying its reused prompt prefix``,
    ``prefilling its prompt``, ``drafting``, ``the target's pass``, ``committing its tokens``, ``ending``);
    the exception raised there is ``__cause__``. Example: a prefix copy that runs out of memory ->
    ``RequestFailed("the request failed while copying its reused prompt prefix (MemoryError: ...); the
    other requests go on")``; the HTTP server answers it with a 500 that names the stage only."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(f"the request failed while {stage} ({type(cause).__name__}: {cause}); the other "
                         "requests go on")
        self.stage = stage  # the step that failed, in words
        self.__cause__ = cause
