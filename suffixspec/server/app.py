"""The Flask application factory.

``create_app(config)`` builds the engine, index and tokenizers once (a ``SuffixSpec``), starts the
engine worker (``worker.py``: as many runner threads as the engine steps requests together), and keeps
both in ``app.extensions["suffixspec"]``. Every route is thin.
``app.extensions["suffixspec"].shutdown()`` finishes or cancels the work in flight and flushes
the output history and the store (``suffixspec serve`` calls it on exit).
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flask import Flask, Response, g, jsonify, request, send_from_directory
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule

from suffixspec.server import guards
from suffixspec.server.config import ServerConfig
from suffixspec.server.errors import EXCEPTIONS, APIError, to_api_error
from suffixspec.server.metrics import Metrics
from suffixspec.server.worker import EngineWorker, Job

log = logging.getLogger(__name__)
access_log = logging.getLogger("suffixspec.access")  # one line per request (``_install_access_log``)


@dataclass
class ServerState:
    """What the routes share; lives in ``app.extensions["suffixspec"]``."""

    config: ServerConfig
    spec: Any  # suffixspec.api.SuffixSpec: engine, tokenizer, document store
    worker: EngineWorker
    metrics: Metrics
    model_id: str  # the id /v1/models reports and responses carry
    model_names: frozenset[str] = frozenset()  # every name a request's `model` may give (model_id included)
    started: int = field(default_factory=lambda: int(time.time()))
    _closed: bool = False
    _close_lock: threading.Lock = field(default_factory=threading.Lock)

    def shutdown(self) -> None:
        """Stop taking requests, finish (or after the timeout cancel) the running one, flush the store."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self.worker.shutdown(self.config.shutdown_timeout_s)
        self.spec.close()

    @property
    def closed(self) -> bool:
        return self._closed


def _web_dir() -> Path | None:
    """The web page's folder, ``suffixspec/web`` (None where a partial install left it out)."""
    web = Path(__file__).resolve().parents[1] / "web"
    return web if (web / "index.html").is_file() else None


def create_app(config: ServerConfig | dict | None = None, *, spec: Any = None) -> Flask:
    """The suffixspec Flask app. ``spec`` (a built SuffixSpec) skips model loading (tests, embedding)."""
    cfg = ServerConfig.from_any(config)
    if spec is None:
        from suffixspec.api import SuffixSpec

        spec = SuffixSpec(model=cfg.model, draft_model=cfg.draft_model, db=cfg.db, device=cfg.device,
                          dtype=cfg.dtype, weights=cfg.weights, max_num_seqs=cfg.max_num_seqs,
                          prefix_cache_mb=cfg.prefix_cache_mb, threads=cfg.threads, runtime=cfg.runtime)
    holder: dict[str, EngineWorker] = {}
    metrics = Metrics(queue_length=lambda: holder["w"].queue_length() if "w" in holder else 0)

    def on_result(job: Job) -> None:
        wait = (job.started_at - job.submitted_at) if job.started_at else None
        metrics.record_generation(job.endpoint, job.result, wait)

    spec.engine.step_observer = metrics.record_pass  # batch size of every target forward pass
    worker = holder["w"] = EngineWorker(spec.engine, cfg.max_queue, on_result, metrics.record_step)
    history = getattr(spec, "history_status", None)
    if history is not None:
        from prometheus_client import Gauge

        Gauge("suffixspec_history_write_failures", "Output-history writes the database refused (read-only or "
              "full); those outputs are kept in memory only", registry=metrics.registry
              ).set_function(lambda: history()["write_failures"])
    app = Flask("suffixspec.server", static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes
    app.json.sort_keys = False  # keep OpenAI's field order
    names = cfg.served_names or [spec.model_name]
    # "suffixspec" is always accepted: the name the README and `serve --help` examples use
    aliases = frozenset([*names, spec.model_name, "suffixspec"])
    app.extensions["suffixspec"] = ServerState(cfg, spec, worker, metrics, names[0], aliases)

    from suffixspec.server.openapi import bp as openapi_bp
    from suffixspec.server.routes_index import bp as index_bp
    from suffixspec.server.routes_openai import bp as openai_bp

    app.register_blueprint(openai_bp)
    app.register_blueprint(index_bp)
    app.register_blueprint(openapi_bp)  # GET /openapi.json
    _install_access_log(app)  # first: its clock starts before the other checks run
    guards.install(app, cfg)  # Host and Origin checks run before the key check
    _install_auth(app, cfg)
    _install_errors(app)
    _install_misc(app)
    return app


def _install_access_log(app: Flask) -> None:
    """One line per request once its response is sent (a stream: when it ends): client, method, path,
    status (499 when the client left before the end, streaming or not), and for a generation its tokens,
    tokens per step and seconds. Example::

        127.0.0.1 POST /v1/chat/completions 200 64 tokens (40 prompt) 3.20 tokens/step 0.84 s

    ``/v1`` routes log at INFO; the web page's files, ``/health`` and ``/metrics`` (polled) at DEBUG."""

    @app.before_request
    def start_clock() -> None:
        g.access_started = time.perf_counter()

    @app.after_request
    def log_when_sent(resp: Response) -> Response:
        started = g.get("access_started") or time.perf_counter()
        job = g.get("job")  # a generation's worker job (routes_openai)
        path = f"{request.remote_addr or '-'} {request.method} {request.path}"
        level = logging.INFO if request.path.startswith("/v1") else logging.DEBUG

        def emit() -> None:  # after the body: by then a stream knows whether its client stayed to the end
            status = 499 if getattr(job, "client_left", False) else resp.status_code
            access_log.log(level, "%s %d%s %.2f s", path, status, _generation_words(job),
                           time.perf_counter() - started)

        resp.call_on_close(emit)
        return resp


def _generation_words(job: Any) -> str:
    """`` 64 tokens (40 prompt) 3.20 tokens/step`` for a finished generation; `` client disconnected`` for
    one whose client left (status 499, streaming or not); `` no result`` for one that failed; empty for any
    other request."""
    if job is None:
        return ""
    if getattr(job, "client_left", False):
        return " client disconnected"
    result = getattr(job, "result", None)
    if result is None:
        return " no result"
    return (f" {len(result.token_ids)} tokens ({len(result.prompt_token_ids)} prompt) "
            f"{result.stats.mean_accepted_length:.2f} tokens/step")


def _install_auth(app: Flask, cfg: ServerConfig) -> None:
    @app.before_request
    def check_key() -> Response | None:
        if not cfg.api_key or not request.path.startswith("/v1"):
            return None
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        given = token.strip().encode() if scheme.lower() == "bearer" else b""
        # compare_digest: the time taken does not reveal how much of the key matched
        if not hmac.compare_digest(given, cfg.api_key.encode()):
            msg = ("missing API key: send 'Authorization: Bearer <key>'" if not header
                   else "incorrect API key provided")
            return APIError(msg, 401, code="invalid_api_key",
                            headers={"WWW-Authenticate": 'Bearer realm="suffixspec"'}).response()
        return None

    @app.before_request
    def check_body_type() -> None:
        guards.require_json_body()


def _install_errors(app: Flask) -> None:
    retry_after = app.extensions["suffixspec"].config.retry_after_s

    @app.errorhandler(APIError)
    def api_error(e: APIError) -> Response:
        return e.response()

    def project_error(e: Exception) -> Response:
        err = to_api_error(e, retry_after)
        if err is None or err.status >= 500:
            log.warning("%s on %s %s: %s", type(e).__name__, request.method, request.path, e)
        return (err or _internal()).response()

    for exc_type in EXCEPTIONS:  # the project's exceptions, answered by type (errors.EXCEPTIONS)
        app.register_error_handler(exc_type, project_error)

    api_map: list[Map] = []  # built on first use, once every route is registered

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        status = e.code or 500
        if status in (404, 405):
            # The web page's GET catch-all matches every path: decide on the API routes alone, so an
            # unknown path is a 404 for any method and a known one with the wrong method a 405.
            try:
                if not api_map:
                    api_map.append(_api_routes(app))
                api_map[0].bind("").match(request.path, method=request.method)
            except MethodNotAllowed as m:
                status, e = 405, MethodNotAllowed(sorted(set(m.valid_methods or ()) | {"OPTIONS"}))
            except NotFound:
                status, e = 404, NotFound()
            except HTTPException:
                pass
        msg = {404: f"no route {request.method} {request.path}",
               405: f"method {request.method} is not allowed on {request.path}",
               413: f"the request body is larger than the limit of {app.config['MAX_CONTENT_LENGTH']} bytes"
               }.get(status, e.description or e.name)
        headers = None
        if status == 405:
            allow = e.valid_methods if isinstance(e, MethodNotAllowed) and e.valid_methods else None
            if allow is None and e.response is not None:
                allow = [e.response.headers["Allow"]]
            headers = {"Allow": ", ".join(allow)} if allow else None
        return APIError(msg, status, code=e.name.lower().replace(" ", "_"), headers=headers).response()

    @app.errorhandler(Exception)
    def unexpected(e: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)  # the trace stays in the log
        return _internal().response()

    @app.after_request
    def count(resp: Response) -> Response:
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        app.extensions["suffixspec"].metrics.http_requests.labels(rule, str(resp.status_code)).inc()
        return resp


def _internal() -> APIError:
    return APIError("internal server error; see the server log", 500, code="internal_error")


def _api_routes(app: Flask) -> Map:
    """The app's routes without the web page's catch-alls, to tell 404 from 405 (see http_error)."""
    return Map([Rule(r.rule, methods=r.methods, endpoint=r.endpoint) for r in app.url_map.iter_rules()
                if "<path:filename>" not in r.rule])


def _install_misc(app: Flask) -> None:
    st: ServerState = app.extensions["suffixspec"]
    web_dir = _web_dir()

    @app.get("/health")
    def health() -> Response:
        ok = st.worker.alive and not st.closed
        degraded = []
        history = getattr(st.spec, "history_status", None)
        hist = history() if history is not None else None
        if hist is not None and hist["error"]:
            degraded.append({"component": "history", "message": f"outputs are not persisted: {hist['error']}"})
        status = ("degraded" if degraded else "ok") if ok else "unavailable"
        resp = jsonify({"status": status, "model": st.model_id,
                        "queue_length": st.worker.queue_length(), "busy": st.worker.busy(),
                        "max_context": st.spec.max_context, "auth": bool(st.config.api_key),
                        "uptime_s": int(time.time()) - st.started, "degraded": degraded,
                        "threads": getattr(st.spec, "threads", None), "numerics": getattr(st.spec, "numerics", None)})
        resp.status_code = 200 if ok else 503
        return resp

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(st.metrics.render(), mimetype=None, content_type=st.metrics.content_type)

    def web_file(filename: str) -> Response:
        if web_dir is None or filename.endswith((".py", ".pyc")) or filename.startswith(("_", ".", "v1/")):
            raise NotFound()
        return send_from_directory(web_dir, filename)

    @app.get("/")
    def index() -> Response:
        return web_file("index.html")

    @app.get("/static/<path:filename>")
    def static_file(filename: str) -> Response:
        return web_file(filename)

    @app.get("/<path:filename>")
    def any_web_file(filename: str) -> Response:
        return web_file(filename)
