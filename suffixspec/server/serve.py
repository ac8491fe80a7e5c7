"""Run the app under waitress, a production WSGI server (streaming works: it sends each chunk as written).

``channel_request_lookahead`` lets waitress notice a client that hangs up while its request is
still being generated (``environ["waitress.client_disconnected"]``), so the engine is freed at once.

Bodies over the limit are refused by waitress itself, before it buffers them, with the same JSON
413 the app gives (OpenAI's error shape, never waitress' text/plain page). The refused body is read
to its end and dropped (up to DRAIN_MAX bytes), so a client still sending it gets the 413 rather
than a reset connection.

Shutdown (SIGINT or SIGTERM): the engine stops taking requests (new ones get 503), the running
one finishes (or is cancelled after ``shutdown_timeout_s``) while waitress still sends its last
chunks, the store is flushed, and only then does the server loop stop. A second signal stops at once.
"""

from __future__ import annotations

import _thread
import logging
import signal
import threading
from typing import Any

from flask import Flask

log = logging.getLogger(__name__)

DRAIN_MAX = 1 << 30  # a refused body up to this size is read and dropped so its sender sees the 413


def _waitress_classes() -> tuple[type, type]:
    """An HTTP channel whose parser drains refused bodies and whose errors are OpenAI-shaped JSON."""
    import json

    from waitress.channel import HTTPChannel
    from waitress.parser import HTTPRequestParser
    from waitress.task import ErrorTask
    from waitress.utilities import RequestEntityTooLarge

    from suffixspec.server.errors import APIError

    class DrainingParser(HTTPRequestParser):
        """Reads a Content-Length body that is over the limit to its end without keeping it."""

        drain_left = 0

        def received(self, data: bytes) -> int:
            if self.drain_left:
                n = min(len(data), self.drain_left)
                self.drain_left -= n
                self.completed = not self.drain_left
                return n
            n = super().received(data)
            if (self.completed and isinstance(self.error, RequestEntityTooLarge) and not self.chunked
                    and 0 < self.content_length <= DRAIN_MAX and self.body_bytes_received == 0):
                self.drain_left = self.content_length
                self.completed = False
            return n

    class JSONErrorTask(ErrorTask):
        def execute(self) -> None:
            e = self.request.error
            if isinstance(e, RequestEntityTooLarge):
                limit = self.channel.adj.max_request_body_size - 1
                msg = f"the request body is larger than the limit of {limit} bytes"
            else:
                msg = f"{e.reason}: {e.body}"
            err = APIError(msg, e.code, code=e.reason.lower().replace(" ", "_"))
            body = json.dumps(err.body()).encode()
            self.status = f"{e.code} {e.reason}"
            self.response_headers.extend([("Content-Type", "application/json"),
                                          ("X-Content-Type-Options", "nosniff")])
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class Channel(HTTPChannel):
        parser_class = DrainingParser
        error_task_class = JSONErrorTask

    return Channel, JSONErrorTask


def _use_json_errors(server: Any) -> None:
    channel, _ = _waitress_classes()
    subs = [server] if hasattr(server, "channel_class") else [
        s for s in getattr(server, "map", {}).values() if hasattr(s, "channel_class")]
    for s in subs:
        s.channel_class = channel


def make_server(app: Flask, host: str = "127.0.0.1", port: int = 8000, threads: int = 16, **kw: Any) -> Any:
    """A waitress server for ``app`` (not started). ``port=0`` picks a free port (``server.effective_port``)."""
    from waitress.server import create_server

    st = app.extensions["suffixspec"]
    opts = dict(host=host, port=port, threads=threads, channel_request_lookahead=4,
                max_request_body_size=st.config.max_body_bytes + 1,  # waitress refuses > max_body_bytes
                ident="suffixspec",
                clear_untrusted_proxy_headers=True)
    opts.update(kw)
    server = create_server(app, **opts)
    _use_json_errors(server)
    return server


def serve(app: Flask, host: str = "127.0.0.1", port: int = 8000, threads: int = 16,
          on_ready: Any = None) -> None:
    """Serve until SIGINT/SIGTERM, then shut down cleanly. ``on_ready(server)`` is called once listening."""
    state = app.extensions["suffixspec"]
    server = make_server(app, host, port, threads)
    stopping = threading.Event()

    def drain_then_stop() -> None:
        try:
            state.shutdown()
        finally:
            _thread.interrupt_main()  # KeyboardInterrupt in the main thread ends server.run()

    def on_signal(signum: int, frame: Any) -> None:
        if stopping.is_set():
            raise KeyboardInterrupt
        stopping.set()
        log.info("shutting down: finishing in-flight requests and flushing the index")
        threading.Thread(target=drain_then_stop, name="suffixspec-shutdown", daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    log.info("suffixspec serving on http://%s:%s", host, server.effective_port)
    if on_ready is not None:
        on_ready(server)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        state.shutdown()  # no-op when the signal path already did it


class BackgroundServer:
    """A waitress server on a background thread (tests, notebooks, embedding in another program).

        with BackgroundServer(create_app(cfg)) as srv:
            OpenAI(base_url=srv.url + "/v1", api_key="-").completions.create(...)
    """

    def __init__(self, app: Flask, host: str = "127.0.0.1", port: int = 0, threads: int = 8) -> None:
        self.app = app
        self.server = make_server(app, host, port, threads)
        self.url = f"http://{host}:{self.server.effective_port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="suffixspec-waitress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # waitress' own run() only returns on KeyboardInterrupt; poll in steps so close() can end it,
        # then close every channel from this thread (keep-alive connections included).
        from waitress import wasyncore

        srv = self.server
        while not self._stop.is_set():
            srv.asyncore.loop(timeout=0.05, map=srv._map, use_poll=srv.adj.asyncore_use_poll, count=1)
        srv.task_dispatcher.shutdown(timeout=5)
        wasyncore.close_all(srv._map)

    def close(self) -> None:
        """Shut the engine down (finish or cancel, flush), then stop waitress."""
        try:
            self.app.extensions["suffixspec"].shutdown()
        finally:
            self._stop.set()
            self._thread.join(10)

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
