"""The HTTP service on a real waitress server on 127.0.0.1, driven by the official `openai` client and raw HTTP."""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from tiny import copyable

from suffixspec.server import create_app
from suffixspec.server.serve import BackgroundServer

KEY = "test-key-123"
PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "import os", "The quick brown", "if x is None:"]


@pytest.fixture(scope="module")
def server(tiny_model_dirs, tmp_path_factory):
    db = tmp_path_factory.mktemp("server-db") / "index.db"
    app = create_app({"model": str(tiny_model_dirs["llama"]), "draft_model": None, "api_key": KEY, "db": str(db),
                      "max_tokens_limit": 512, "max_references": 3, "max_body_bytes": 64 * 1024,
                      "max_prompt_tokens": 600, "served_model_name": ["tiny-llama", "m"]})
    with BackgroundServer(app, threads=12) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def raw(server, method: str, path: str, body=None, headers: dict | None = None, key: str | None = KEY):
    """(status, headers, parsed JSON or text) for one raw HTTP request."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    h = dict(headers or {})
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
        h.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=body, headers=h)
    resp = conn.getresponse()
    data = resp.read().decode()
    conn.close()
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = data
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, parsed


def sse_events(text: str) -> list:
    events = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def greedy(server, prompt: str, max_tokens: int = 16) -> str:
    spec = server.app.extensions["suffixspec"].spec
    return spec.generate(prompt, max_tokens=max_tokens, temperature=0.0).text




# -- the openai client, unchanged --------------------------------------------------------------------

def test_models_lists_the_served_model(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [server.app.extensions["suffixspec"].model_id] == ["tiny-llama"]
    # extensions the web page reads: the tiny tokenizer has a chat template; no draft model is loaded
    card = models.data[0].model_dump()
    assert card["chat_template"] is True
    assert card["drafters"] == ["prompt", "history", "documents", "references", "prediction"]
    assert client.models.retrieve("m").model_dump() == card


def test_completion_matches_the_engine(client, server):
    r = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=16, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].text == greedy(server, PROMPTS[0])
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extra = r.model_extra
    assert extra["speculative_decoding"]["steps"] >= 1
    assert "".join(p["text"] for p in r.choices[0].model_extra["provenance"]) == r.choices[0].text


def test_completion_stream_equals_non_stream(client):
    full = client.completions.create(model="m", prompt=PROMPTS[1], max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model="m", prompt=PROMPTS[1], max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == full.choices[0].finish_reason
    assert "speculative_decoding" in finals[0].model_extra
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    for c in chunks:
        if c.choices:  # provenance texts concatenate to the chunk's text
            assert "".join(p["text"] for p in c.model_extra["provenance"]) == c.choices[0].text


def test_chat_non_stream_and_stream(client, server):
    msgs = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    spec = server.app.extensions["suffixspec"].spec
    assert r.usage.prompt_tokens == len(spec.encode_chat(msgs))  # the tokenizer's chat template was applied
    assert r.choices[0].message.content == spec.generate(messages=msgs, max_tokens=12, temperature=0).text
    chunks = list(client.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    assert all(c.usage is None for c in chunks)  # no include_usage -> no usage chunk


def test_logprobs(client):
    r = client.completions.create(model="m", prompt=PROMPTS[2], max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == r.usage.completion_tokens == len(lp.token_logprobs) == len(lp.top_logprobs)
    for lp_tok, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) <= 3 and lp_tok <= 0 and max(top.values()) == pytest.approx(lp_tok)  # greedy = top-1
    c = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)
    chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=5, temperature=0, logprobs=True, stream=True))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]


def test_stop_string_and_seeded_sampling(client, server):
    base = client.completions.create(model="m", prompt=PROMPTS[3], max_tokens=24, temperature=0).choices[0].text
    if len(base) > 4:
        stop = base[2:4]
        r = client.completions.create(model="m", prompt=PROMPTS[3], max_tokens=24, temperature=0, stop=[stop])
        assert r.choices[0].text == base[: base.index(stop)] and r.choices[0].finish_reason == "stop"
    kw = dict(model="m", prompt=PROMPTS[3], max_tokens=12, temperature=0.9, top_p=0.9, seed=7)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text


def test_openai_client_errors(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="x", n=2)
    assert "n=1" in e.value.body["message"] and e.value.body["param"] == "n"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], temperature=3)
    assert e.value.body["param"] == "temperature"


def test_several_clients_at_once_get_their_own_greedy_answers(client, server):
    alone = {p: greedy(server, p, 10) for p in PROMPTS}

    def ask(p: str) -> tuple[str, str]:
        if PROMPTS.index(p) % 2:  # half of them stream
            s = client.completions.create(model="m", prompt=p, max_tokens=10, temperature=0, stream=True)
            return p, "".join(c.choices[0].text for c in s if c.choices)
        return p, client.completions.create(model="m", prompt=p, max_tokens=10, temperature=0).choices[0].text

    with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        answers = list(pool.map(ask, PROMPTS * 2))
    assert len(answers) == 2 * len(PROMPTS)
    for p, text in answers:
        assert text == alone[p], p


# -- extensions (raw HTTP) ---------------------------------------------------------------------------

def test_speculation_field_and_references(server):
    body = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0}
    st, _, plain = raw(server, "POST", "/v1/completions", {**body, "speculation": False})
    assert st == 200 and plain["speculative_decoding"]["drafted_tokens"] == 0
    st, _, spec = raw(server, "POST", "/v1/completions",
                      {**body, "speculation": {"drafters": ["references"], "max_draft_tokens": 8},
                       "references": [plain["choices"][0]["text"]]})
    assert st == 200 and spec["choices"][0]["text"] == plain["choices"][0]["text"]  # lossless
    assert set(spec["speculative_decoding"]["per_source"]) <= {"references"}
    st, _, pred = raw(server, "POST", "/v1/completions",
                      {**body, "prediction": {"type": "content", "content": plain["choices"][0]["text"]}})
    details = pred["usage"]["completion_tokens_details"]
    assert set(details) >= {"accepted_prediction_tokens", "rejected_prediction_tokens"}


def test_stream_is_sse_with_done(server):
    st, headers, text = raw(server, "POST", "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
                             "stream_options": {"include_usage": True}, "temperature": 0})
    assert st == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse_events(text)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] >= 1
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])


# -- validation: every wrong field is a 400 that names it ---------------------------------------------

BAD = [
    ("/v1/completions", {"prompt": "x", "max_tokens": "10"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"prompt": "x", "temperature": True}, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_k": 1.5}, "top_k"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 5}, "presence_penalty"),
    ("/v1/completions", {"prompt": "x", "seed": "s"}, "seed"),
    ("/v1/completions", {"prompt": "x", "seed": -1, "temperature": 0.5}, "seed"),
    ("/v1/completions", {"prompt": "x", "stop": 3}, "stop"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/completions", {"prompt": "x", "logprobs": 50}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 500}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"999999": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "n": 3}, "n"),
    ("/v1/completions", {"prompt": "x", "echo": True}, "echo"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 10**9]}, "prompt"),
    ("/v1/completions", {}, "prompt"),
    ("/v1/completions", {"prompt": "x", "references": "abc"}, "references"),
    ("/v1/completions", {"prompt": "x", "references": ["a", "b", "c", "d"]}, "references"),
    ("/v1/completions", {"prompt": "x", "prediction": "abc"}, "prediction"),
    ("/v1/completions", {"prompt": "x", "speculation": "fast"}, "speculation"),
    ("/v1/completions", {"prompt": "x", "speculation": {"drafters": ["magic"]}}, "speculation.drafters"),
    ("/v1/completions", {"prompt": "x", "speculation": {"max_draft_tokens": 1000}}, "speculation.max_draft_tokens"),
    ("/v1/completions", {"prompt": "x " * 700}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 5, "max_completion_tokens": "a"}, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "tools": [{"type": "function"}]}, "tools"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD, ids=[f"{p.split('/')[-1]}-{m}" for p, _, m in BAD])
def test_bad_fields_are_clear_400s(server, path, body, param):
    status, _, resp = raw(server, "POST", path, body)
    assert status == 400, resp
    err = resp["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert "Traceback" not in err["message"]


def test_openai_fields_without_effect_are_ignored(server):
    status, _, resp = raw(server, "POST", "/v1/completions",
                          {"prompt": "x", "max_tokens": 2, "user": "u1", "metadata": {}, "store": False})
    assert status == 200 and resp["choices"][0]["finish_reason"] in ("stop", "length")
    status, _, resp = raw(server, "POST", "/v1/chat/completions",  # unknown keys of a message pass too
                          {"messages": [{"role": "user", "content": "x", "name": "u", "refusal": None}],
                           "max_tokens": 2, "tool_choice": "none", "parallel_tool_calls": False})
    assert status == 200, resp


@pytest.mark.parametrize(("path", "body", "param", "words"), [
    ("/v1/chat/completions", {"max_token": 8, "temprature": 0}, "max_token",
     ["'max_token' (did you mean 'max_tokens'?)", "'temprature' (did you mean 'temperature'?)"]),
    ("/v1/completions", {"prompt": "x", "frobnicate": {"a": 1}}, "frobnicate",
     ["'frobnicate'", "the known fields are", "max_tokens"]),
    ("/v1/chat/completions", {"speculation": {"drafter": ["prompt"]}}, "speculation.drafter",
     ["did you mean 'speculation.drafters'?"]),
    ("/v1/chat/completions", {"prediction": {"type": "content", "content": "x", "contents": "y"}},
     "prediction.contents", ["'prediction.contents' (did you mean 'prediction.content'?)"]),
])
def test_unknown_fields_are_400s_naming_the_nearest(server, path, body, param, words):
    """OpenAI refuses an unrecognized argument; a typo here used to run with the default (temperature 1)."""
    if path.endswith("chat/completions"):
        body = {"messages": [{"role": "user", "content": "x"}], **body}
    status, _, resp = raw(server, "POST", path, body)
    assert status == 400, resp
    err = resp["error"]
    assert err["code"] == "unknown_parameter" and err["param"] == param
    assert all(w in err["message"] for w in words), err["message"]


def test_context_overflow_names_the_numbers(server):
    status, _, resp = raw(server, "POST", "/v1/completions", {"prompt": [17] * 590, "max_tokens": 512})
    assert status == 400 and resp["error"]["code"] == "context_length_exceeded"
    assert "1024" in resp["error"]["message"] and "1102" in resp["error"]["message"]


@pytest.mark.parametrize(("body", "headers", "status", "code"), [
    (b"{not json", {"Content-Type": "application/json"}, 400, "invalid_json"),
    (b"[1, 2]", {"Content-Type": "application/json"}, 400, "invalid_json"),
    (b"", {}, 400, "invalid_json"),
    (b"\xff\xfe", {"Content-Type": "application/json"}, 400, "invalid_json"),
    # a lone surrogate, escaped or as its own 3 bytes (json.loads decodes bytes with surrogatepass)
    (b'{"prompt": "a\\ud800"}', {"Content-Type": "application/json"}, 400, "invalid_json"),
    (b'{"prompt": "a\xed\xa0\x80"}', {"Content-Type": "application/json"}, 400, "invalid_json"),
    (b'{"prompt": "x"}', {}, 415, "unsupported_media_type"),
    (b'{"prompt": "x"}', {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
    (b'{"prompt": "x"}', {"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
    (b'{"prompt": "' + b"a" * 70000 + b'"}', {}, 413, None),
])
def test_malformed_bodies(server, body, headers, status, code):
    st, _, resp = raw(server, "POST", "/v1/completions", body, headers)
    assert st == status and "error" in resp
    if code:
        assert resp["error"]["code"] == code


# -- auth: tests/test_security.py checks every route in-process; here the real server's answer ------------

def test_a_missing_key_is_a_401_with_the_scheme(server):
    status, headers, resp = raw(server, "POST", "/v1/completions", {"prompt": "x"}, key=None)
    assert status == 401 and resp["error"]["code"] == "invalid_api_key"
    assert resp["error"]["type"] == "authentication_error" and "Bearer" in headers["www-authenticate"]


def test_open_routes_and_web_page(server):
    assert raw(server, "GET", "/health", key=None)[0] == 200
    status, headers, text = raw(server, "GET", "/", key=None)
    assert status == 200 and "<html" in text.lower()
    assert raw(server, "GET", "/app.js", key=None)[0] == 200
    assert raw(server, "GET", "/static/style.css", key=None)[0] == 200
    for path in ("/__init__.py", "/../pyproject.toml", "/static/../../pyproject.toml", "/nothing.js"):
        assert raw(server, "GET", path, key=None)[0] == 404, path


def test_wrong_method_and_unknown_route_are_json_errors(server):
    for path in ("/v1/completions", "/v1/chat/completions"):
        status, headers, resp = raw(server, "GET", path)
        assert status == 405 and resp["error"]["code"] == "method_not_allowed", (path, status, resp)
        assert "POST" in headers["allow"]
    status, headers, resp = raw(server, "PUT", "/v1/completions", {"prompt": "x"})
    assert status == 405 and resp["error"]["message"] and "POST" in headers["allow"]
    status, _, resp = raw(server, "POST", "/health", {"x": 1})
    assert status == 405, (status, resp)
    for method in ("POST", "PUT", "DELETE", "GET"):  # an unknown route is a 404 whatever the method
        for path in ("/v1/nothing", "/v1/index/nothing", "/nothing"):
            status, _, resp = raw(server, method, path, {"x": 1} if method != "GET" else None)
            assert status == 404 and resp["error"]["code"] == "not_found", (method, path, status, resp)


def test_metrics_count_requests_tokens_and_queue(server, client):
    client.completions.create(model="m", prompt=PROMPTS[4], max_tokens=3, temperature=0)
    status, headers, text = raw(server, "GET", "/metrics", key=None)
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("suffixspec_http_requests_total", "suffixspec_prompt_tokens_total",
                 "suffixspec_completion_tokens_total", "suffixspec_steps_total", "suffixspec_step_seconds_total",
                 "suffixspec_queue_length", "suffixspec_mean_accepted_length", "suffixspec_generations_total"):
        assert name in text, name
    client.completions.create(model="m", prompt=PROMPTS[4], max_tokens=8, temperature=0,
                              extra_body={"references": [PROMPTS[4] * 3], "speculation": {"drafters": ["references"]}})
    text = raw(server, "GET", "/metrics", key=None)[2]
    assert 'suffixspec_accepted_tokens_by_position_total{position="1"}' in text or \
        'suffixspec_drafted_tokens_total{source="references"}' in text
    assert 'suffixspec_draft_depth_steps_by_position_total{position="1"}' in text
    done = [line for line in text.splitlines() if line.startswith("suffixspec_completion_tokens_total")]
    assert float(done[0].split()[-1]) >= 3


def test_health_reports_the_engine(server):
    status, _, body = raw(server, "GET", "/health", key=None)
    assert status == 200 and body["status"] == "ok" and body["auth"] is True and body["max_context"] == 1024
    # what the target computes with: at auto the tiny model is int8 on a CPU whose probe says so (the compiled
    # exact attention), else float32 on the lean forward's grouped attention
    from suffixspec.core.formats import int8_kernel

    num = body["numerics"]
    assert num == ({"weights": "int8", "kernel": int8_kernel(), "attention": "native"} if num["weights"] == "int8"
                   else {"weights": "float32", "kernel": None, "attention": "sdpa"}), num


def test_one_worker_owns_the_engine(server):
    """One engine worker per app: as many runner threads as the engine batches requests, no more."""
    worker = server.app.extensions["suffixspec"].worker
    assert worker.concurrency == (worker.engine.max_num_seqs if worker.engine.batchable else 1)
    assert [t.name for t in worker._threads] == [f"suffixspec-engine-{i}" for i in range(worker.concurrency)]
    assert all(t.is_alive() for t in worker._threads)
    alive = {t.name for t in threading.enumerate()}
    assert {t.name for t in worker._threads} <= alive


# -- index routes --------------------------------------------------------------------------------------

def test_documents_added_through_the_api_draft_the_next_request(server):
    prompt, text, bias = copyable(server.app.extensions["suffixspec"].spec, 24)
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "speculation": {"drafters": ["documents"]},
            "logit_bias": {str(k): v for k, v in bias.items()}}
    _, _, before = raw(server, "POST", "/v1/completions", body)
    assert before["speculative_decoding"]["per_source"].get("documents", {}).get("drafted", 0) == 0
    assert before["choices"][0]["text"] == text
    st, _, added = raw(server, "POST", "/v1/index/documents",
                       {"documents": [{"text": prompt + text, "source": "notes/point.py"}]})
    assert st == 200 and added["data"][0]["status"] in ("added", "updated") and added["data"][0]["num_tokens"] > 0
    _, _, after = raw(server, "POST", "/v1/completions", body)
    assert after["choices"][0]["text"] == text  # lossless
    docs = after["speculative_decoding"]["per_source"]["documents"]
    assert docs["accepted"] > 0
    assert after["speculative_decoding"]["mean_accepted_length"] > before["speculative_decoding"][
        "mean_accepted_length"]


def test_document_crud_and_stats(server):
    st, _, added = raw(server, "POST", "/v1/index/documents",
                       {"documents": ["alpha beta gamma", {"text": "delta epsilon", "metadata": {"name": "d.txt"}}]})
    assert st == 200 and [d["status"] for d in added["data"]] == ["added", "added"]
    ids = [d["id"] for d in added["data"]]
    st, _, again = raw(server, "POST", "/v1/index/documents", {"documents": ["alpha beta gamma"]})
    assert again["data"][0]["status"] == "unchanged" and again["data"][0]["id"] == ids[0]  # idempotent
    st, _, page = raw(server, "GET", "/v1/index/documents?limit=1&offset=0")
    assert st == 200 and len(page["data"]) == 1 and page["total"] >= 2
    st, _, found = raw(server, "GET", "/v1/index/documents?q=epsilon")
    assert [d["id"] for d in found["data"]] == [ids[1]] and found["data"][0]["name"] == "d.txt"
    st, _, stats = raw(server, "GET", "/v1/index/stats")
    assert st == 200 and stats["documents"] >= 2 and "served" in stats
    st, _, gone = raw(server, "DELETE", f"/v1/index/documents?id={ids[0]}")
    assert st == 200 and gone["deleted"] == 1
    st, _, gone = raw(server, "DELETE", "/v1/index/documents", {"ids": [ids[1], 999999]})
    assert gone["deleted"] == 1
    _, _, found = raw(server, "GET", "/v1/index/documents?q=epsilon")
    assert found["total"] == 0


@pytest.mark.parametrize(("method", "path", "body", "param"), [
    ("POST", "/v1/index/documents", {"documents": "text"}, "documents"),
    ("POST", "/v1/index/documents", {"documents": []}, "documents"),
    ("POST", "/v1/index/documents", {"documents": [""]}, "documents[0].text"),
    ("POST", "/v1/index/documents", {"documents": [{"text": "a", "metadata": 3}]}, "documents[0].metadata"),
    ("POST", "/v1/index/documents", {"documents": [{"txt": "a"}]}, "documents[0]"),
    ("GET", "/v1/index/documents?limit=abc", None, "limit"),
    ("GET", "/v1/index/documents?limit=0", None, "limit"),
    ("DELETE", "/v1/index/documents", None, "ids"),
    ("DELETE", "/v1/index/documents", {"ids": "3"}, "ids"),
])
def test_index_validation(server, method, path, body, param):
    st, _, resp = raw(server, method, path, body)
    assert st == 400 and resp["error"]["param"] == param, resp


@pytest.mark.parametrize("drafters", [["prompt", "references"], ["prompt"], ["prompt", "prediction"], ["documents"]])
def test_prediction_raises_mean_accepted_length_and_reports_usage(server, drafters):
    """A code edit whose output is known in advance: the prediction drafts it, the output is unchanged.
    It drafts whenever it is given, whichever drafters the request lists ("prediction" among them or not)."""
    prompt, _, bias = copyable(server.app.extensions["suffixspec"].spec, 40)
    body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "speculation": {"drafters": drafters},
            "logit_bias": {str(k): v for k, v in bias.items()}}
    _, _, without = raw(server, "POST", "/v1/completions", body)
    expected = without["choices"][0]["text"]
    prediction = expected + "\n# trailing lines the edit dropped\n"
    _, _, with_pred = raw(server, "POST", "/v1/completions",
                          {**body, "prediction": {"type": "content", "content": prediction}})
    assert with_pred["choices"][0]["text"] == expected
    sd_without, sd_with = without["speculative_decoding"], with_pred["speculative_decoding"]
    assert sd_with["mean_accepted_length"] > sd_without["mean_accepted_length"]
    details = with_pred["usage"]["completion_tokens_details"]
    accepted = sd_with["per_source"]["prediction"]["accepted"]
    spec = server.app.extensions["suffixspec"].spec
    n_pred = len(spec.tokenizer.encode(prediction, add_special_tokens=False))
    assert details["accepted_prediction_tokens"] == accepted > 0
    assert details["rejected_prediction_tokens"] == n_pred - accepted
    assert "completion_tokens_details" not in without["usage"]  # only reported when a prediction is given


def test_token_id_prompts_and_content_parts(server, client):
    spec = server.app.extensions["suffixspec"].spec
    ids = spec.encode(PROMPTS[0])
    by_ids = client.completions.create(model="m", prompt=ids, max_tokens=6, temperature=0)
    by_text = client.completions.create(model="m", prompt=[PROMPTS[0]], max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text and by_ids.usage.prompt_tokens == len(ids)
    parts = client.chat.completions.create(
        model="m", max_tokens=4, temperature=0,
        messages=[{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
                  {"role": "user", "content": "hi"}])
    plain = client.chat.completions.create(model="m", max_tokens=4, temperature=0,
                                           messages=[{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": "hi"}])
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens


class _Lines(__import__("logging").Handler):
    """Collects the access log's lines; ``wait(n)`` returns once n arrived (a line is written after its
    response is sent: a stream's when it ends)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.cond = threading.Condition()

    def emit(self, record) -> None:
        with self.cond:
            self.lines.append(record.getMessage())
            self.cond.notify_all()

    def wait(self, parts: tuple[str, ...]) -> list[str]:
        """The lines so far once each of ``parts`` is in one of them (then a moment more for any second
        line of the same request)."""
        def seen() -> bool:
            return all(any(p in line for line in self.lines) for p in parts)

        with self.cond:
            assert self.cond.wait_for(seen, timeout=60), self.lines
        time.sleep(0.3)
        with self.cond:
            return list(self.lines)


def test_one_access_log_line_per_request(server):
    import logging

    logger = logging.getLogger("suffixspec.access")
    lines, before = _Lines(), logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    # token counts no other test of this server asks for, so a line that an earlier test's request (a stream
    # the client left) writes late cannot pass for one of these
    parts = ("/v1/completions 200 7 tokens", "/v1/completions 400", "/v1/chat/completions 200 5 tokens")
    try:
        raw(server, "POST", "/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 7, "temperature": 0})
        raw(server, "POST", "/v1/completions", {"prompt": "x", "max_token": 7})
        raw(server, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 5, "stream": True})
        got = lines.wait(parts)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(before)
    done, refused, streamed = ([s for s in got if part in s] for part in parts)
    assert len(done) == 1 and len(streamed) == 1, got  # one line per request
    done, streamed = done[0], streamed[0]
    assert refused, got
    assert all(r.startswith("127.0.0.1 POST /v1/completions 400") and "tokens" not in r for r in refused)
    assert done.startswith("127.0.0.1 POST /v1/completions 200 7 tokens (") and " tokens/step " in done
    assert done.endswith(" s") and "prompt)" in done
    assert streamed.startswith("127.0.0.1 POST /v1/chat/completions 200 5 tokens (")
