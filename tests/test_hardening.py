"""Issue 17's attacks and first-use snags, each on a real waitress server on 127.0.0.1 (or the real CLI):
huge prompts refused before tokenizing, a non-streaming client that hangs up, cross-site requests, NaN
and deep JSON, a database that refuses writes, oversized bodies, security headers, routes and model names."""

from __future__ import annotations

import html.parser
import http.client
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from suffixspec.server import create_app
from suffixspec.server.serve import BackgroundServer

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(tiny_model_dirs, tmp_path_factory):
    db = tmp_path_factory.mktemp("hardening-db") / "index.db"
    app = create_app({"model": str(tiny_model_dirs["llama"]), "draft_model": None, "db": str(db),
                      "max_tokens_limit": 1000, "max_body_bytes": 9 * MiB, "max_prompt_tokens": 600,
                      "served_model_name": ["tiny", "tiny-alias"],
                      "disconnect_poll_s": 30.0})  # so the disconnect test cannot pass by a timeout
    with BackgroundServer(app, threads=8) as srv:
        yield srv


def call(server, method: str, path: str, body=None, headers: dict | None = None, raw: bytes | None = None):
    """(status, lowercased headers, parsed JSON or text) of one request on a fresh connection."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)  # a busy shared CPU is slow
    h = dict(headers or {})
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    try:
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", "replace")
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    try:
        return resp.status, hdrs, json.loads(text)
    except ValueError:
        return resp.status, hdrs, text


def metric(server, name: str) -> float:
    text = call(server, "GET", "/metrics")[2]
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


class TokenizerSpy:
    """Records the length of every text the server's (real) tokenizer is asked to tokenize."""

    def __init__(self, tokenizer) -> None:
        self.tok, self.lengths = tokenizer, []
        cls, spy = type(tokenizer), self

        def __call__(this, text, *a, **kw):
            spy.lengths.append(len(text) if isinstance(text, str) else -1)
            return cls.__call__(this, text, *a, **kw)

        self.cls = cls
        tokenizer.__class__ = type(cls.__name__, (cls,), {"__call__": __call__})

    def __enter__(self) -> TokenizerSpy:
        return self

    def __exit__(self, *exc) -> None:
        self.tok.__class__ = self.cls


# -- 1. huge prompts are refused by cheap bounds before tokenizing ---------------------------------------

def test_a_huge_prompt_is_refused_without_tokenizing_it(server):
    tok = server.app.extensions["suffixspec"].spec.tokenizer
    big = "def f(x):\n    return x\n" * (7_900_000 // 24)
    for path, body in (("/v1/completions", {"prompt": big, "max_tokens": 4}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": big}], "max_tokens": 4})):
        with TokenizerSpy(tok) as spy:
            status, _, resp = call(server, "POST", path, body)
        assert status == 400 and resp["error"]["code"] == "context_length_exceeded", resp
        assert "shorten" in resp["error"]["message"]
        assert spy.lengths == [], spy.lengths  # refused from its length alone


def _code_text(chars: int) -> str:
    code = "".join(p.read_text() for p in sorted(Path(__file__).parent.glob("test_*.py")))
    return (code * (1 + chars // len(code)))[:chars]


def test_a_long_prompt_is_counted_in_pieces_and_refused_early():
    """Under the character bound, a long text is tokenized a piece at a time, stopping past the limit."""
    from suffixspec.loading import load_tokenizer
    from suffixspec.server import ServerConfig
    from suffixspec.server.errors import APIError
    from suffixspec.server.validation import PIECE_CHARS, check_bounds, max_chars_per_token

    tok = load_tokenizer("suffixspec/demo-target")  # its longest token has 66 characters
    cfg = ServerConfig(max_prompt_tokens=500)
    text = _code_text(30_000)
    assert len(text) < 501 * max_chars_per_token(tok)  # the character bound lets it through
    with TokenizerSpy(tok) as spy, pytest.raises(APIError) as err:
        check_bounds(text, tok, cfg, 2048, "prompt")
    assert err.value.code == "context_length_exceeded"
    assert len(spy.lengths) == 1 and spy.lengths[0] <= PIECE_CHARS  # one piece was enough to know


def test_the_bounds_never_refuse_a_prompt_that_fits():
    from suffixspec.loading import load_tokenizer
    from suffixspec.server import ServerConfig
    from suffixspec.server.validation import PIECE_CHARS, check_bounds, max_chars_per_token

    tok = load_tokenizer("suffixspec/demo-target")
    text = _code_text(PIECE_CHARS * 6 + 123)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    check_bounds(text, tok, ServerConfig(max_prompt_tokens=len(ids)), 10**9, "prompt")  # raises if it refuses
    longest = max(len(tok.decode([i])) for i in range(len(tok)))
    assert max_chars_per_token(tok) >= longest


def test_references_and_prediction_are_bounded_before_the_prompt_is_tokenized(server):
    tok = server.app.extensions["suffixspec"].spec.tokenizer
    huge = "x = 1\n" * 200_000
    with TokenizerSpy(tok) as spy:
        status, _, resp = call(server, "POST", "/v1/completions",
                               {"prompt": "x", "references": [huge], "prediction": {"content": huge}})
    assert status == 400 and resp["error"]["param"] == "references", resp
    assert spy.lengths == [], spy.lengths


# -- 2. a non-streaming client that hangs up stops its generation ------------------------------------------

def test_non_streaming_client_disconnect_cancels_the_generation(server):
    st = server.app.extensions["suffixspec"]
    cancelled_before = metric(server, 'suffixspec_generations_total{endpoint="completions",finish_reason="cancelled"}')
    tokens_before = metric(server, "suffixspec_completion_tokens_total")
    body = json.dumps({"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "temperature": 0,
                       "speculation": False}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    deadline = time.monotonic() + 60
    while not st.worker.busy() and time.monotonic() < deadline:
        time.sleep(0.005)
    sock.close()  # the client leaves while its request is being generated
    while st.worker.busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metric(server, 'suffixspec_generations_total{endpoint="completions",finish_reason="cancelled"}') \
        == cancelled_before + 1
    assert metric(server, "suffixspec_completion_tokens_total") - tokens_before < 1000



@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_is_logged_once_as_499_streaming_or_not(server, stream):
    """One event, one status: a client that hangs up mid-generation is ``499 client disconnected`` in the access
    log whether it streamed (its 200 went out with the first chunk) or not."""
    import logging
    import threading

    st = server.app.extensions["suffixspec"]
    logger = logging.getLogger("suffixspec.access")
    lines: list[str] = []
    logged = threading.Event()

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
            logged.set()

    handler, before = Catch(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    body = json.dumps({"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "temperature": 0,
                       "stream": stream, "speculation": False}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    try:
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        if stream:
            assert sock.recv(64).startswith(b"HTTP/1.1 200"), "the stream's status went out before the client left"
        deadline = time.monotonic() + 60
        while not st.worker.busy() and time.monotonic() < deadline:
            time.sleep(0.005)
        sock.close()  # the client leaves while its request is being generated
        while not any("/v1/completions" in line for line in lines) and time.monotonic() < deadline:
            logged.wait(0.05)
            logged.clear()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
    mine = [line for line in lines if "/v1/completions" in line]
    assert len(mine) == 1, lines
    assert mine[0].startswith("127.0.0.1 POST /v1/completions 499 client disconnected "), mine


# -- 3. cross-site requests ------------------------------------------------------------------------------

def test_a_cross_site_page_cannot_post(server):
    port = server.url.rsplit(":", 1)[1]
    good = {"prompt": "x", "max_tokens": 2}
    # the no-cors "simple" request a foreign page can send: text/plain body
    status, _, resp = call(server, "POST", "/v1/completions", raw=json.dumps(good).encode(),
                           headers={"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in resp["error"]["message"]
    status, _, resp = call(server, "POST", "/v1/index/documents", raw=b'{"documents": ["planted"]}',
                           headers={"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example"})
    assert status == 403 and resp["error"]["code"] == "origin_not_allowed"
    for origin in ("http://evil.example", "null", f"http://localhost.evil.example:{port}", "http://127.0.0.1:1"):
        status, _, resp = call(server, "POST", "/v1/completions", good, headers={"Origin": origin})
        assert status == 403, (origin, resp)
        status, _, resp = call(server, "DELETE", "/v1/index/documents?id=1", headers={"Origin": origin})
        assert status == 403, (origin, resp)
    # DNS rebinding: a foreign name resolved to 127.0.0.1 is same-origin with itself, but not our Host
    status, _, resp = call(server, "POST", "/v1/completions", good,
                           headers={"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"})
    assert status == 403 and resp["error"]["code"] == "host_not_allowed"
    assert call(server, "GET", "/", headers={"Host": f"evil.example:{port}"})[0] == 403
    # the page's own origin and clients without Origin (curl, openai) are served
    for headers in ({"Origin": f"http://127.0.0.1:{port}"}, {"Origin": f"http://localhost:{port}",
                                                                "Host": f"localhost:{port}"}, {}):
        assert call(server, "POST", "/v1/completions", good, headers=headers)[0] == 200, headers
    assert call(server, "DELETE", "/v1/index/documents?id=999999", headers={"Origin": f"http://127.0.0.1:{port}"}
                )[0] == 200


def test_allowed_hosts_and_origins_are_configurable(tiny_model_dirs):
    app = create_app({"model": str(tiny_model_dirs["llama"]), "draft_model": None, "db": False,
                      "allowed_hosts": "box.lan", "allowed_origins": ["https://app.example"]})
    try:
        c = app.test_client()
        body = {"prompt": "x", "max_tokens": 1}
        assert c.get("/health", headers={"Host": "box.lan:8000"}).status_code == 200
        assert c.get("/health", headers={"Host": "other.lan"}).status_code == 403
        assert c.post("/v1/completions", json=body, headers={"Origin": "https://app.example"}).status_code == 200
        assert c.post("/v1/completions", json=body, headers={"Origin": "https://evil.example"}).status_code == 403
    finally:
        app.extensions["suffixspec"].shutdown()


def test_serve_binds_a_lan_address_with_any_host_and_documents_the_options():
    from suffixspec.cli import main

    out = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--allowed-hosts" in out and "--allowed-origins" in out
    assert "SUFFIXSPEC_API_KEY" in out and "process list" in out


# -- 4. non-finite numbers, 6. deep nesting and long searches --------------------------------------------

def test_nan_and_infinity_are_refused_and_listings_stay_json(server):
    for raw in (b'{"documents": [{"text": "nan doc", "metadata": {"score": NaN}}]}',
                b'{"documents": [{"text": "inf doc", "metadata": {"score": -Infinity}}]}',
                b'{"documents": [{"text": "big doc", "metadata": {"score": 1e999}}]}'):
        status, _, resp = call(server, "POST", "/v1/index/documents", raw=raw,
                               headers={"Content-Type": "application/json"})
        assert status == 400 and "NaN" in resp["error"]["message"], resp
    status, _, resp = call(server, "POST", "/v1/completions", raw=b'{"prompt": "x", "temperature": NaN}',
                           headers={"Content-Type": "application/json"})
    assert status == 400
    status, _, listing = call(server, "GET", "/v1/index/documents?limit=1000")
    assert status == 200 and isinstance(listing, dict)  # strict JSON: parsed, so no bare NaN in it
    assert not any(d["preview"].endswith(" doc") and d["preview"] in ("nan doc", "inf doc", "big doc")
                   for d in listing["data"])


@pytest.mark.parametrize("depth", [100, 1000, 100_000])
def test_deeply_nested_json_is_a_400(server, depth):
    raw = b'{"prompt": "x", "metadata": ' + b"[" * depth + b"]" * depth + b"}"
    for path in ("/v1/completions", "/v1/index/documents"):
        status, _, resp = call(server, "POST", path, raw=raw, headers={"Content-Type": "application/json"})
        assert status == 400 and "nested too deeply" in resp["error"]["message"], (path, status, resp)


def test_a_very_long_search_is_a_400(server):
    status, _, resp = call(server, "GET", "/v1/index/documents?q=" + "a%25_" * 33_000)
    assert status == 400 and resp["error"]["param"] == "q"
    assert call(server, "GET", "/v1/index/documents?q=" + "a" * 1000)[0] == 200


# -- 5. a database that refuses writes -------------------------------------------------------------------

def test_generation_survives_a_database_that_refuses_writes(server):
    st = server.app.extensions["suffixspec"]
    store = st.spec.store
    assert call(server, "GET", "/health")[2]["status"] == "ok"
    failures = metric(server, "suffixspec_history_write_failures")

    def read_only() -> None:
        store.db.execute("PRAGMA query_only = 1")

    def writable() -> None:
        store.db.execute("PRAGMA query_only = 0")

    for refuse, undo, why in ((read_only, writable, "readonly"),):
        refuse()  # the engine's own connection now refuses writes
        try:
            for i in range(2):
                status, _, resp = call(server, "POST", "/v1/completions",
                                       {"prompt": f"def g{i}(y):", "max_tokens": 40, "temperature": 0,
                                        "ignore_eos": True})
                assert status == 200, resp
            health = call(server, "GET", "/health")[2]
            assert health["status"] == "degraded", (why, health, st.spec.history_status())
            assert health["degraded"][0]["component"] == "history" and why in health["degraded"][0]["message"]
            assert metric(server, "suffixspec_history_write_failures") >= failures + 2
            failures = metric(server, "suffixspec_history_write_failures")
        finally:
            undo()
        assert call(server, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200
        assert call(server, "GET", "/health")[2]["status"] == "ok"  # writable again: persisting again


def test_a_full_database_keeps_outputs_in_memory(tmp_path):
    """SQLITE_FULL (the file may not grow) while saving outputs: they stay drafted from, the error is kept."""
    from suffixspec.index.history import OutputHistory
    from suffixspec.index.store import IndexStore

    store = IndexStore(tmp_path / "full.db")
    store.db.execute(f"PRAGMA max_page_count = {store.db.execute('PRAGMA page_count').fetchone()[0]}")
    hist = OutputHistory(10**6, store, "fp")
    hist.add(list(range(5000)))
    hist.add(list(range(100, 5100)))
    assert "full" in hist.write_error and hist.write_failures == 2 and hist.num_outputs == 2
    assert store.db.execute("SELECT count(*) FROM history").fetchone()[0] == 0
    store.db.execute("PRAGMA max_page_count = 1073741823")
    hist.add([1, 2, 3])
    assert hist.write_error is None and store.db.execute("SELECT count(*) FROM history").fetchone()[0] == 1
    store.close()


def _make_read_only(path: Path) -> None:
    """A database file SQLite cannot write: chmod for a normal user, the immutable flag for root."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        path.parent.chmod(0o555)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root on a filesystem without chattr +i: cannot make a read-only file")


def _undo_read_only(path: Path) -> None:
    if os.geteuid() != 0:
        path.parent.chmod(0o755)
        path.chmod(0o644)
    else:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


@pytest.mark.slow  # three CLI processes, each loading a model
def test_cli_on_a_read_only_database(tiny_model_dirs, tmp_path):
    db = tmp_path / "ro" / "index.db"
    db.parent.mkdir()
    (tmp_path / "a.py").write_text("def a():\n    return 1\n")
    (tmp_path / "b.py").write_text("def b():\n    return 2\n")
    cli = [sys.executable, "-c", "from suffixspec.cli import main; main()"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    model = ["--model", str(tiny_model_dirs["llama"]), "--draft-model", "none"]
    res = subprocess.run([*cli, "index", "add", str(tmp_path / "a.py"), "--db", str(db), "--tokenizer", model[1]],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-1500:]
    before = sqlite3.connect(db).execute("SELECT count(*) FROM history").fetchone()[0]
    _make_read_only(db)
    try:
        res = subprocess.run([*cli, "index", "add", str(tmp_path / "b.py"), "--db", str(db), "--tokenizer", model[1]],
                             capture_output=True, text=True, env=env, timeout=300)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-1500:]
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "readonly" in errors[0] and "--db" in errors[0], res.stderr[-1500:]
        res = subprocess.run([*cli, "generate", "def f(x):", *model, "--db", str(db), "--max-tokens", "6"],
                             capture_output=True, text=True, env=env, timeout=300)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-1500:]
        assert "not being saved" in res.stderr and "mean accepted length" in res.stderr
    finally:
        _undo_read_only(db)
    assert sqlite3.connect(db).execute("SELECT count(*) FROM history").fetchone()[0] == before


# -- 9. oversized bodies: one JSON 413 -------------------------------------------------------------------

@pytest.mark.slow  # tens of MiB over loopback
@pytest.mark.parametrize(("path", "size_mib"), [("/v1/completions", 9.5), ("/v1/completions", 64),
                                               ("/v1/index/documents", 9.5)])
def test_any_oversized_body_gets_a_json_413(server, path, size_mib):
    """Refused by waitress before it buffers the body (the app's own 413 is the second line)."""
    field = b'"prompt": "' if path == "/v1/completions" else b'"documents": ["'
    raw = b"{" + field + b"a" * int(size_mib * MiB) + (b'"}' if path == "/v1/completions" else b'"]}')
    status, headers, resp = call(server, "POST", path, raw=raw, headers={"Content-Type": "application/json"})
    assert status == 413 and headers["content-type"] == "application/json", (status, headers, str(resp)[:300])
    assert resp["error"]["type"] == "invalid_request_error" and str(9 * MiB) in resp["error"]["message"]
    assert call(server, "GET", "/health")[0] == 200  # and the server goes on


# -- 10. security headers --------------------------------------------------------------------------------

class _InlineCode(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        names = {k for k, _ in attrs}
        if tag == "script" and "src" not in names:
            self.found.append("inline <script>")
        if tag == "style":
            self.found.append("inline <style>")
        self.found += [f"{tag} {k}=" for k in names if k.startswith("on") or k == "style"]


def test_web_page_security_headers(server):
    status, headers, page = call(server, "GET", "/")
    assert status == 200
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    parser = _InlineCode()
    parser.feed(page)
    assert parser.found == [], parser.found  # the CSP would block them
    for path in ("/app.js", "/v1/models", "/health"):
        assert call(server, "GET", path)[1]["x-content-type-options"] == "nosniff"


# -- 15. model names -------------------------------------------------------------------------------------

def test_unknown_model_is_404_and_aliases_work(server):
    for name in ("gpt-4o", "tiny-llama", "TINY"):
        status, _, resp = call(server, "POST", "/v1/chat/completions",
                               {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        assert status == 404 and resp["error"]["code"] == "model_not_found" and "tiny" in resp["error"]["message"]
        assert call(server, "GET", f"/v1/models/{name}")[0] == 404
    for name in ("tiny", "tiny-alias", "suffixspec", None):
        body = {"prompt": "x", "max_tokens": 1, **({"model": name} if name else {})}
        status, _, resp = call(server, "POST", "/v1/completions", body)
        assert status == 200 and resp["model"] == "tiny", resp
    assert [m["id"] for m in call(server, "GET", "/v1/models")[2]["data"]] == ["tiny"]


# -- 16. the "Token indices sequence length" warning, 12. progress bars -----------------------------------

def test_no_sequence_length_warning_or_progress_bars(tiny_model_dirs, capfd):
    from suffixspec.loading import load_model, load_tokenizer

    tok = load_tokenizer("suffixspec/demo-target")
    assert len(tok("word " * (tok.model_max_length + 10))["input_ids"]) > tok.model_max_length
    load_model(str(tiny_model_dirs["llama"]))
    err = capfd.readouterr().err
    assert "Token indices sequence length" not in err and "Loading weights" not in err, err[-800:]
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()  # the caller's setting is restored


# -- 11. the history switch, 17. prediction tokens in the CLI --------------------------------------------

def _history_rows(db: Path) -> int:
    return sqlite3.connect(db).execute("SELECT count(*) FROM history").fetchone()[0]


def test_generate_no_history_stores_and_drafts_nothing(tiny_model_dirs, tmp_path):
    from suffixspec.cli import main

    db = tmp_path / "i.db"
    args = ["generate", "def add(a, b):", "--model", str(tiny_model_dirs["llama"]), "--draft-model", "none",
            "--db", str(db), "--max-tokens", "24", "--json"]
    runs = [CliRunner().invoke(main, [*args, "--no-history"]) for _ in range(2)]
    assert all(r.exit_code == 0 for r in runs), runs[0].output
    outs = [json.loads(r.stdout) for r in runs]
    assert outs[0]["text"] == outs[1]["text"]
    # nothing is drafted from earlier outputs (the adaptive budget still follows measured step times,
    # so the step counts may differ between runs on a busy machine)
    assert all("history" not in o["speculative_decoding"]["per_source"] for o in outs)
    assert _history_rows(db) == 0
    assert CliRunner().invoke(main, args).exit_code == 0
    assert _history_rows(db) == 1  # without the switch the output is saved (and --help says so)
    helptext = CliRunner().invoke(main, ["generate", "--help"]).output
    assert "--no-history" in helptext and "history" in helptext.split("Options")[0]


def test_api_history_switch(tiny_model_dirs, tmp_path):
    from suffixspec import SuffixSpec

    db = tmp_path / "api.db"
    with SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=None, db=db, history=False) as spec:
        spec.generate("def f(x):", max_tokens=8)
        assert spec.history_status() == {"enabled": False, "persisted": False, "error": None, "write_failures": 0}
    assert _history_rows(db) == 0
    with SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=None, db=db) as spec:
        spec.generate("def f(x):", max_tokens=8)
        assert spec.history_status()["persisted"]
    assert _history_rows(db) == 1


def test_generate_shows_prediction_tokens(tiny_model_dirs, tmp_path):
    """The prediction's tokens as the server's usage counts them: the accepted ones are the prediction's
    drafted tokens the target kept (the prediction is the model's own output, so some are), the rejected
    ones the rest of the prediction."""
    from suffixspec.cli import main
    from suffixspec.loading import load_tokenizer

    common = ["generate", "def add(a, b):", "--model", str(tiny_model_dirs["llama"]), "--draft-model", "none",
              "--db", str(tmp_path / "i.db"), "--max-tokens", "12", "--no-history"]
    plain = json.loads(CliRunner().invoke(main, [*common, "--no-speculation", "--json"]).stdout)["text"]
    pred = tmp_path / "pred.py"
    pred.write_text(plain + "\n# and more the output never writes\n")
    args = [*common, "--prediction", str(pred)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stderr.splitlines() if "prediction:" in x)
    out = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    d = out["completion_tokens_details"]
    accepted, rejected = d["accepted_prediction_tokens"], d["rejected_prediction_tokens"]
    assert out["text"] == plain and accepted == out["speculative_decoding"]["per_source"]["prediction"]["accepted"]
    assert accepted >= 1  # the copy was drafted and kept
    n_pred = len(load_tokenizer(str(tiny_model_dirs["llama"])).encode(pred.read_text(), add_special_tokens=False))
    assert accepted + rejected == n_pred
    # the text output's own run (its gates, timed, may draft otherwise): counted the same way
    shown = re.search(r"prediction: (\d+) tokens? accepted, (\d+) rejected", line)
    assert shown and int(shown[1]) + int(shown[2]) == n_pred, line


# -- the document index's errors, by type ----------------------------------------------------------------

def test_index_errors_are_answered_by_type(server, tiny_model_dirs):
    """Raised for real: the database refusing a document write is a 503 that says why and what to do; a
    server without a store answers its index routes with a 501 (suffixspec.server.errors.INDEX_ERRORS)."""
    db = server.app.extensions["suffixspec"].spec.documents.store.db
    db.execute("PRAGMA query_only = 1")  # the index's write connection now refuses writes
    try:
        status, _, resp = call(server, "POST", "/v1/index/documents", {"documents": ["refused text"]})
    finally:
        db.execute("PRAGMA query_only = 0")
    assert status == 503 and resp["error"]["code"] == "index_read_only", resp
    assert "refused a write" in resp["error"]["message"] and "writable" in resp["error"]["message"]
    assert call(server, "POST", "/v1/index/documents", {"documents": ["accepted text"]})[0] == 200
    app = create_app({"model": str(tiny_model_dirs["llama"]), "draft_model": None, "db": False})
    try:
        resp = app.test_client().get("/v1/index/documents")
        assert resp.status_code == 501 and resp.get_json()["error"]["code"] == "index_unavailable"
        assert "without a document store" in resp.get_json()["error"]["message"]
    finally:
        app.extensions["suffixspec"].shutdown()
