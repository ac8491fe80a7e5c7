"""Security properties of the service: auth on every /v1 route with a constant-time compare, localhost by
default, documents are text (never server-side paths), request limits, and no stack trace to a client."""

from __future__ import annotations

import hmac
import inspect
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from suffixspec.server import app as app_module
from suffixspec.server import create_app

KEY = "sec-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def app(tiny_model_dirs, tmp_path_factory):
    db = tmp_path_factory.mktemp("sec-db") / "index.db"
    app = create_app({"model": str(tiny_model_dirs["llama"]), "draft_model": None, "api_key": KEY, "db": str(db),
                      "max_tokens_limit": 8, "max_prompt_tokens": 32, "max_body_bytes": 8 * 1024,
                      "max_references": 2, "max_reference_chars": 100, "max_stop": 2, "max_documents_per_request": 3})
    yield app
    app.extensions["suffixspec"].shutdown()


@pytest.fixture(scope="module")
def client(app):
    return app.test_client()


# -- authentication ----------------------------------------------------------------------------------

def _routes(app):
    """(method, concrete path) for every rule in the url map."""
    out = []
    for rule in app.url_map.iter_rules():
        path = rule.rule.replace("<path:model>", "x").replace("<path:filename>", "app.js")
        out += [(m, path) for m in sorted(rule.methods - {"HEAD", "OPTIONS"})]
    return out


def test_every_v1_and_index_route_needs_the_key(app, client):
    routes = [(m, p) for m, p in _routes(app) if p.startswith("/v1")]
    assert {p for _, p in routes} >= {"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/x",
                                      "/v1/index/documents", "/v1/index/stats"}
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                        {"Authorization": f"Basic {KEY}"}, {"Authorization": f"Bearer {KEY[:-1]}"},
                        {"Authorization": f"Bearer {KEY}x"}, {"Authorization": "Bearer "},
                        {"Authorization": f"Bearer {KEY}".encode().decode("latin-1") + "\u00e9"}):
            resp = client.open(path, method=method, headers=headers, json={"prompt": "x"} if method != "GET" else None)
            assert resp.status_code == 401, (method, path, headers)
            assert resp.get_json()["error"]["code"] == "invalid_api_key"
    # every route outside /v1 is public on purpose: health, metrics, the OpenAPI description, the web page
    public = {p for _, p in _routes(app) if not p.startswith("/v1")}
    assert public <= {"/health", "/metrics", "/openapi.json", "/", "/static/app.js", "/app.js"}, public
    # unknown /v1 paths and path tricks are refused before routing, not served
    for path in ("/v1/nope", "/v1//completions", "/v1/index/../completions", "/v1/%2e%2e/health"):
        assert client.get(path).status_code == 401, path


def test_the_right_key_is_accepted_case_insensitive_scheme(client):
    assert client.get("/v1/models", headers=AUTH).status_code == 200
    assert client.get("/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200


def test_every_key_check_is_one_constant_time_compare_of_the_whole_key(client, monkeypatch):
    """Right, wrong, short, long, prefix and non-ASCII keys each cost exactly one hmac.compare_digest of
    the whole given token against the whole key (bytes): no length check or prefix test decides first,
    so the time taken does not tell how much of a guess was right."""
    seen = []
    real = hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(app_module.hmac, "compare_digest", spy)
    for given in ("", "s", KEY[:5], KEY[:-1], KEY + "x", "é" + KEY[1:], KEY):
        seen.clear()
        status = client.get("/v1/models", headers={"Authorization": f"Bearer {given}"}).status_code
        assert status == (200 if given == KEY else 401), given
        assert len(seen) == 1 and seen[0][1] == KEY.encode() and isinstance(seen[0][0], bytes), (given, seen)
        assert seen[0][0] == given.encode() or not given.isascii(), (given, seen)  # the whole token, as given


# -- binding -----------------------------------------------------------------------------------------

def test_server_binds_localhost_by_default():
    from suffixspec.cli import main
    from suffixspec.server import serve as serve_module

    assert inspect.signature(serve_module.make_server).parameters["host"].default == "127.0.0.1"
    assert inspect.signature(serve_module.serve).parameters["host"].default == "127.0.0.1"
    assert inspect.signature(serve_module.BackgroundServer).parameters["host"].default == "127.0.0.1"
    serve_cmd = main.commands["serve"]
    host = next(p for p in serve_cmd.params if p.name == "host")
    assert host.default == "127.0.0.1"
    assert "127.0.0.1" in CliRunner().invoke(main, ["serve", "--help"]).output


def test_background_server_listens_on_loopback_only(app):
    from suffixspec.server.serve import make_server

    srv = make_server(app, port=0)
    try:
        assert srv.socket.getsockname()[0] == "127.0.0.1"
    finally:
        srv.close()


# -- documents are text, not paths -------------------------------------------------------------------

def test_documents_are_stored_as_text_never_read_from_the_server(client, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT")
    paths = ["/etc/passwd", str(secret), "file://" + str(secret), "../../../../etc/hostname", "~/.bashrc"]
    resp = client.post("/v1/index/documents", headers=AUTH,
                       json={"documents": [paths[0], {"text": paths[1], "source": paths[1]}, paths[2]]})
    assert resp.status_code == 200, resp.get_json()
    recs = resp.get_json()["data"]
    assert [r["num_chars"] for r in recs] == [len(paths[0]), len(paths[1]), len(paths[2])]
    listing = client.get("/v1/index/documents", headers=AUTH, query_string={"limit": 1000}).get_json()["data"]
    previews = json.dumps(listing)
    assert "TOP-SECRET-CONTENT" not in previews and "root:" not in previews
    # a document named by a path (source) with other text: the text is what is stored
    resp = client.post("/v1/index/documents", headers=AUTH, json={"documents": [{"text": "hello", "source": paths[1]}]})
    assert resp.get_json()["data"][0]["num_chars"] == 5
    # a body without text, only a path-like field, is refused
    for body in ({"documents": [{"source": "/etc/passwd"}]}, {"documents": [{"path": "/etc/passwd"}]},
                 {"path": "/etc/passwd"}, {"documents": [{"text": ["/etc/passwd"]}]}):
        resp = client.post("/v1/index/documents", headers=AUTH, json=body)
        assert resp.status_code == 400, body
    assert Path(secret).read_text() == "TOP-SECRET-CONTENT"


def test_no_path_reading_api_is_reachable_from_routes():
    """The routes call add_documents (text), never add_paths / read_text / open."""
    from suffixspec.server import routes_index, routes_openai

    for mod in (routes_index, routes_openai):
        src = inspect.getsource(mod)
        for bad in ("add_paths", "read_text", "open(", "Path("):
            assert bad not in src, (mod.__name__, bad)


# -- limits ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "x", "max_tokens": 9}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 10**6},
     "max_completion_tokens"),
    ("/v1/completions", {"prompt": "def f(x): return x + 1\n" * 20}, "prompt"),
    ("/v1/completions", {"prompt": list(range(33))}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 200}]}, "messages"),
    ("/v1/completions", {"prompt": "x", "references": ["a", "b", "c"]}, "references"),
    ("/v1/completions", {"prompt": "x", "references": ["a" * 60, "b" * 60]}, "references"),
    ("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c"]}, "stop"),
    ("/v1/index/documents", {"documents": ["a", "b", "c", "d"]}, "documents"),
])
def test_request_limits_are_clear_400s(client, path, body, param):
    resp = client.post(path, headers=AUTH, json=body)
    assert resp.status_code == 400, resp.get_json()
    assert resp.get_json()["error"]["param"] == param


# -- no stack trace reaches a client -----------------------------------------------------------------

def _no_trace(text: str) -> None:
    for leak in ("Traceback", 'File "', "RuntimeError", "secret-internal", ".py", "line "):
        assert leak not in text, (leak, text[:300])


def test_internal_errors_never_show_a_trace(app, client, monkeypatch):
    st = app.extensions["suffixspec"]

    def boom(*a, **kw):
        raise RuntimeError("secret-internal /srv/app/module.py line 42")

    # in a route (before the engine), in the store, in the engine (non-streaming and streaming)
    monkeypatch.setattr(st.spec, "encode", boom)
    resp = client.post("/v1/completions", headers=AUTH, json={"prompt": "x", "max_tokens": 2})
    assert resp.status_code == 500
    _no_trace(resp.get_data(as_text=True))
    monkeypatch.undo()
    # an exception that is not one of the document index's own (suffixspec.index.errors) is a bug: a 500
    # that shows nothing of it, never a 400 carrying its raw message
    monkeypatch.setattr(st.spec, "index_stats", lambda: (_ for _ in ()).throw(KeyError("secret-internal")))
    resp = client.get("/v1/index/stats", headers=AUTH)
    assert resp.status_code == 500 and "secret-internal" not in resp.get_data(as_text=True)
    _no_trace(resp.get_data(as_text=True))
    monkeypatch.setattr(st.spec, "list_documents", lambda **kw: 1 / 0)
    resp = client.get("/v1/index/documents", headers=AUTH)
    assert resp.status_code == 500 and "ZeroDivision" not in resp.get_data(as_text=True)
    _no_trace(resp.get_data(as_text=True))
    monkeypatch.undo()
    monkeypatch.setattr(st.worker.engine, "stream", boom)
    resp = client.post("/v1/completions", headers=AUTH, json={"prompt": "x", "max_tokens": 2})
    assert resp.status_code == 500 and resp.get_json()["error"]["type"] == "server_error"
    _no_trace(resp.get_data(as_text=True))
    resp = client.post("/v1/chat/completions", headers=AUTH,
                       json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True})
    assert resp.status_code == 200  # headers were sent: the error is an event in the stream
    body = resp.get_data(as_text=True)
    _no_trace(body)
    assert '"error"' in body and body.rstrip().endswith("[DONE]")
    # a ValueError is no refusal of the request: only the request checks' RequestError is a 400 with its
    # message (tests/test_server_worker.py: a real proposer's bug, and real refusals, on a real server)
    monkeypatch.setattr(st.worker.engine, "stream", lambda *a, **kw: (_ for _ in ()).throw(
        ValueError("secret-internal: node 3 has parent 7")))
    resp = client.post("/v1/completions", headers=AUTH, json={"prompt": "x", "max_tokens": 2})
    assert resp.status_code == 500 and "secret-internal" not in resp.get_data(as_text=True)
    _no_trace(resp.get_data(as_text=True))
    from suffixspec.errors import RequestError

    monkeypatch.setattr(st.worker.engine, "stream", lambda *a, **kw: (_ for _ in ()).throw(
        RequestError("the prompt is too long for this engine; shorten it", "prompt")))
    resp = client.post("/v1/completions", headers=AUTH, json={"prompt": "x", "max_tokens": 2})
    assert resp.status_code == 400 and resp.get_json()["error"]["param"] == "prompt"
    assert resp.get_json()["error"]["message"] == "the prompt is too long for this engine; shorten it"
    monkeypatch.undo()
    assert client.post("/v1/completions", headers=AUTH, json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_debug_mode_is_off(app):
    assert not app.debug and not app.config.get("PROPAGATE_EXCEPTIONS")


# -- the project's exceptions are answered by type -----------------------------------------------------

def test_project_exceptions_are_answered_by_type_with_their_message(app, client, monkeypatch):
    """errors.EXCEPTIONS: a dead index writer is a 503 that says so (never a 400/501 by RuntimeError)."""
    from suffixspec.index.errors import StoreError, WriterDied
    from suffixspec.server.worker import QueueFull

    st = app.extensions["suffixspec"]
    died = WriterDied("the index writer process exited (killed by SIGKILL) before finishing: nothing was added")
    monkeypatch.setattr(st.spec, "add_documents", lambda docs: (_ for _ in ()).throw(died))
    resp = client.post("/v1/index/documents", headers=AUTH, json={"documents": ["a"]})
    err = resp.get_json()["error"]
    assert resp.status_code == 503 and err["code"] == "index_writer_died" and err["type"] == "server_error"
    assert err["message"] == str(died) and resp.headers["Retry-After"] == str(st.config.retry_after_s)
    monkeypatch.setattr(st.spec, "index_stats", lambda: (_ for _ in ()).throw(StoreError("index.db is locked")))
    resp = client.get("/v1/index/stats", headers=AUTH)
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "index_unavailable"
    assert "Retry-After" not in resp.headers
    monkeypatch.setattr(st.worker, "submit", lambda job: (_ for _ in ()).throw(QueueFull("32 requests are waiting")))
    resp = client.post("/v1/completions", headers=AUTH, json={"prompt": "x", "max_tokens": 1})
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "queue_full"
    assert "32 requests are waiting" in resp.get_json()["error"]["message"] and resp.headers["Retry-After"]


def test_the_nearest_listed_base_answers_an_unlisted_subclass():
    from suffixspec.index.errors import StoreError
    from suffixspec.server.errors import EXCEPTIONS, answer_for

    class Corrupt(StoreError):
        pass

    assert answer_for(Corrupt("x")) is EXCEPTIONS[StoreError]
    assert answer_for(KeyError("x")) is None and answer_for(RuntimeError("x")) is None  # a 500, not a guess
