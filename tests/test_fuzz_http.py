"""Fuzz the HTTP API with hypothesis-built requests: every answer is a 2xx or a clear 4xx, never a 500.

Bodies mix plausible values of every known field (from the OpenAPI description the app serves) with
arbitrary JSON, NaN/Infinity, huge integers, lone UTF-16 surrogates, wrong content types and raw
bytes. Runs in-process on the Flask test client with a tiny model and tight limits (max_tokens <= 4),
derandomized with bounded examples, so CI is deterministic and fast.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixspec.server import create_app

pytestmark = pytest.mark.slow

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SETTINGS = settings(max_examples=60, derandomize=True, deadline=None, database=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))
SEEN: dict[str, int] = {}  # route -> requests tried (reported by the summary test)
STATUS: dict[int, int] = {}  # HTTP status -> count


@pytest.fixture(scope="module")
def app(tiny_model_dirs, tmp_path_factory):
    db = tmp_path_factory.mktemp("fuzz-db") / "index.db"
    app = create_app({"model": str(tiny_model_dirs["llama"]), "draft_model": None, "api_key": KEY, "db": str(db),
                      "max_tokens_limit": 4, "default_max_tokens": 4, "default_completion_max_tokens": 4,
                      "max_prompt_tokens": 48, "max_body_bytes": 16 * 1024, "max_references": 4,
                      "max_reference_chars": 2000, "max_documents_per_request": 5})
    yield app
    app.extensions["suffixspec"].shutdown()


@pytest.fixture(scope="module")
def client(app):
    return app.test_client()


# -- strategies -------------------------------------------------------------------------------------

texts = st.one_of(st.text(max_size=40), st.sampled_from(["", "def f(x):", "\ud800", "a\udfffb", "\x00", "🙂" * 5,
                                                          "<|endoftext|>", "<|im_start|>user", "/etc/passwd"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-3, 600),
                    st.floats(allow_nan=True, allow_infinity=True), texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)


def field(plausible: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(plausible, plausible, json_values)


def sampling_fields(f) -> dict:
    """Optional sampling fields; ``f`` wraps each plausible strategy (identity: mostly valid requests)."""
    return {
        "model": f(texts),
        "max_tokens": f(st.integers(-1, 5)),
        "temperature": f(st.one_of(st.just(0), st.floats(-0.5, 2.5))),
        "top_p": f(st.floats(-0.1, 1.1)),
        "top_k": f(st.integers(-2, 500)),
        "seed": f(st.one_of(st.integers(0, 2**64), st.integers(-2**66, 2**66))),
        "presence_penalty": f(st.floats(-2.5, 2.5)),
        "frequency_penalty": f(st.floats(-2.5, 2.5)),
        "stop": f(st.one_of(texts, st.lists(texts, max_size=20))),
        "stream": f(st.booleans()),
        "stream_options": f(st.fixed_dictionaries({"include_usage": f(st.booleans())})),
        "n": f(st.integers(0, 2)),
        "logit_bias": f(st.dictionaries(st.one_of(st.integers(-5, 1000).map(str), texts),
                                        st.one_of(st.floats(-120, 120), json_values), max_size=3)),
        "ignore_eos": f(st.booleans()),
        "references": f(st.lists(texts, max_size=6)),
        "prediction": f(st.fixed_dictionaries({"type": st.sampled_from(["content", "other"]), "content": f(texts)})),
        "speculation": f(st.one_of(st.booleans(), st.fixed_dictionaries({}, optional={
            "drafters": f(st.lists(st.sampled_from(["prompt", "history", "documents", "references", "draft_model",
                                                    "nope"]), max_size=3)),
            "max_draft_tokens": f(st.integers(-1, 300)), "enabled": f(st.booleans())}))),
    }


def bodies(f) -> tuple[st.SearchStrategy, st.SearchStrategy]:
    """(completion bodies, chat bodies) with every field wrapped by ``f``."""
    message = st.fixed_dictionaries({
        "role": f(st.sampled_from(["system", "developer", "user", "assistant", "tool", "bot"])),
        "content": f(st.one_of(texts, st.lists(st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "text", "image_url"]), "text": texts}), max_size=3)))})
    completion = st.fixed_dictionaries(
        {"prompt": f(st.one_of(texts, st.lists(st.integers(-2, 500), max_size=6)))},
        optional={**sampling_fields(f), "logprobs": f(st.integers(-1, 25)), "echo": f(st.booleans()),
                  "best_of": f(st.integers(0, 2)), "suffix": f(texts)})
    chat = st.fixed_dictionaries(
        {"messages": f(st.lists(message, max_size=3))},
        optional={**sampling_fields(f), "max_completion_tokens": f(st.integers(-1, 5)),
                  "logprobs": f(st.booleans()), "top_logprobs": f(st.integers(-1, 25)),
                  "tools": f(st.lists(json_values, max_size=1)),
                  "response_format": f(st.fixed_dictionaries({"type": st.sampled_from(["text", "json"])}))})
    return completion, chat


completion_bodies, chat_bodies = bodies(field)  # one field in three is arbitrary JSON: the 400 paths
plausible_completions, plausible_chats = bodies(lambda s: s)  # typed values: mostly served to the end
doc_item = st.one_of(texts, st.fixed_dictionaries({"text": field(texts)},
                                                  optional={"source": field(texts), "metadata": json_values}))
doc_bodies = st.one_of(st.fixed_dictionaries({"documents": field(st.lists(doc_item, max_size=7))}),
                       st.fixed_dictionaries({"text": field(texts)}), json_values)


def encode(body, how: str) -> tuple[bytes, dict]:
    """A body as the client sends it: JSON (NaN allowed, as Python writes it), or broken on purpose."""
    raw = json.dumps(body, ensure_ascii=how != "utf8").encode("utf-8", "surrogatepass")
    if how == "truncated":
        raw = raw[: len(raw) // 2]
    elif how == "latin1":
        raw = raw + b"\xff\xfe"
    return raw, {"Content-Type": "text/plain" if how == "text_plain" else "application/json"}


hows = st.sampled_from(["ascii", "ascii", "ascii", "utf8", "truncated", "latin1", "text_plain"])


def b(text: str) -> bytes:
    """UTF-8 bytes of any Python string, lone surrogates included (as a broken client sends them)."""
    return text.encode("utf-8", "surrogatepass")


def check(resp, route: str) -> None:
    """A 2xx, or a 4xx whose JSON error says what is wrong; no 5xx, no trace, no internals."""
    SEEN[route] = SEEN.get(route, 0) + 1
    STATUS[resp.status_code] = STATUS.get(resp.status_code, 0) + 1
    data = resp.get_data()
    text = data.decode("utf-8", "replace")
    assert resp.status_code < 500, (route, resp.status_code, text[:500])
    assert "Traceback" not in text and 'File "' not in text, text[:500]
    if resp.status_code >= 400:
        err = json.loads(text)["error"]
        assert err["message"] and err["type"] and err["type"] != "server_error", err
    elif resp.mimetype == "text/event-stream":
        events = [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: {")]
        assert events and text.rstrip().endswith("data: [DONE]"), text[-300:]
        for ev in events:  # an error inside the stream is a client error too, never an internal one
            assert ev.get("error", {}).get("type") != "server_error", ev
    else:
        json.loads(text)


# -- the fuzzers ------------------------------------------------------------------------------------

@SETTINGS
@given(body=completion_bodies, how=hows)
def test_fuzz_completions(client, body, how):
    raw, headers = encode(body, how)
    check(client.post("/v1/completions", data=raw, headers={**AUTH, **headers}), "/v1/completions")


@SETTINGS
@given(body=st.one_of(plausible_completions, plausible_chats))
def test_fuzz_typed_requests_are_served_or_refused_clearly(client, body):
    route = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    check(client.post(route, json=json.loads(json.dumps(body)), headers=AUTH), route)


@SETTINGS
@given(body=chat_bodies, how=hows)
def test_fuzz_chat(client, body, how):
    raw, headers = encode(body, how)
    check(client.post("/v1/chat/completions", data=raw, headers={**AUTH, **headers}), "/v1/chat/completions")


@settings(SETTINGS, max_examples=40)
@given(body=doc_bodies, how=hows)
def test_fuzz_add_documents(client, body, how):
    raw, headers = encode(body, how)
    check(client.post("/v1/index/documents", data=raw, headers={**AUTH, **headers}), "POST /v1/index/documents")


@settings(SETTINGS, max_examples=40)
@given(ids=st.lists(st.one_of(st.integers(-5, 2**70), texts), max_size=4), body=json_values,
       limit=st.one_of(st.integers(-3, 2000).map(str), texts), offset=st.one_of(st.integers(-3, 10**12).map(str), texts),
       q=texts)
def test_fuzz_list_and_delete_documents(client, ids, body, limit, offset, q):
    qs = urlencode({"limit": b(limit), "offset": b(offset), "q": b(q)})
    check(client.get("/v1/index/documents?" + qs, headers=AUTH), "GET /v1/index/documents")
    raw = json.dumps({"ids": ids} if ids else body).encode("utf-8", "surrogatepass")
    check(client.delete("/v1/index/documents", data=raw, headers={**AUTH, "Content-Type": "application/json"}),
          "DELETE /v1/index/documents")
    check(client.delete("/v1/index/documents?" + urlencode([("id", b(str(i))) for i in ids]), headers=AUTH),
          "DELETE /v1/index/documents")


@settings(SETTINGS, max_examples=40)
@given(path=st.text(alphabet=st.characters(codec="utf-8"), max_size=30),
       method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
       raw=st.binary(max_size=64))
def test_fuzz_any_route_and_method(client, path, method, raw):
    for p in ("/v1/" + path, "/" + path, "/v1/index/" + path):
        resp = client.open(p, method=method, data=raw, headers=AUTH)
        SEEN["any"] = SEEN.get("any", 0) + 1
        assert resp.status_code < 500, (method, p, resp.status_code, resp.get_data()[:300])
        assert b"Traceback" not in resp.get_data()


def test_openapi_describes_every_route(client, app):
    resp = client.get("/openapi.json")
    assert resp.status_code == 200
    spec = resp.get_json()
    assert spec["openapi"].startswith("3.") and spec["security"] == [{"bearer": []}]
    rules = {(r.rule.replace("<path:model>", "{model}"), m.lower()) for r in app.url_map.iter_rules()
             for m in r.methods - {"HEAD", "OPTIONS"} if r.rule.startswith("/v1")}
    described = {(p, m) for p, ops in spec["paths"].items() for m in ops}
    assert rules <= described, rules - described
    limits = spec["components"]["schemas"]["CompletionRequest"]["properties"]
    refs = next(s for s in limits["references"]["anyOf"] if s.get("type") == "array")
    assert limits["max_tokens"]["maximum"] == 4 and refs["maxItems"] == 4
    assert json.dumps(spec)  # plain JSON, no Python objects


# -- requests drawn from the served OpenAPI description (the schema and the validation must agree) ----------

def from_schema(schema: dict, root: dict, depth: int = 0) -> st.SearchStrategy:
    """Values valid under ``schema`` (the subset of JSON Schema /openapi.json uses), refs into ``root``."""
    if "$ref" in schema:
        return from_schema(root["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]], root, depth)
    if "anyOf" in schema:
        return st.one_of([from_schema(_merge(schema, sub), root, depth) for sub in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(int(schema.get("minimum", -10)), int(min(schema.get("maximum", 600), 10**6)))
    if kind == "number":
        lo, hi = schema.get("minimum", schema.get("exclusiveMinimum", -10.0)), schema.get("maximum", 10.0)
        return st.floats(lo, hi, exclude_min="exclusiveMinimum" in schema, allow_nan=False)
    if kind == "string":
        return st.text(st.characters(codec="utf-8"), min_size=schema.get("minLength", 0), max_size=12)
    if kind == "array":
        item = from_schema(schema.get("items", {"type": "string"}), root, depth + 1)
        return st.lists(item, min_size=schema.get("minItems", 0), max_size=min(schema.get("maxItems", 3), 3))
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        if not props:  # a map: logit_bias, metadata
            values = schema.get("additionalProperties")
            value = from_schema(values, root, depth + 1) if isinstance(values, dict) else st.integers()
            keys = st.integers(0, 500).map(str) if "propertyNames" in schema else st.text(max_size=6)
            return st.dictionaries(keys, value, max_size=2)
        return st.fixed_dictionaries({k: from_schema(v, root, depth + 1) for k, v in props.items() if k in required},
                                     optional={k: from_schema(v, root, depth + 1) for k, v in props.items()
                                               if k not in required})
    return st.none()


def _merge(parent: dict, sub: dict) -> dict:
    """A member of an ``anyOf`` with the constraints written beside it (maxItems on tool_calls)."""
    out = {k: v for k, v in parent.items() if k not in ("anyOf", "default", "description", "title")}
    return {**out, **sub}


# refusals that need the model or several fields together, which a schema cannot say
CONTEXT_REFUSALS = ("context_length_exceeded", "outside the vocabulary", "chat template rejected",
                    "'top_logprobs' needs", "'stream_options' is only allowed", "references and prediction hold")


@pytest.fixture(scope="module")
def served_schema(client):
    return client.get("/openapi.json").get_json()


@pytest.mark.parametrize(("route", "schema"), [("/v1/completions", "CompletionRequest"),
                                               ("/v1/chat/completions", "ChatRequest"),
                                               ("/v1/index/documents", "AddDocuments")])
def test_requests_the_schema_allows_are_served(client, served_schema, route, schema):
    """Every body valid under /openapi.json is served (2xx), or refused only for what needs the model."""
    bodies = from_schema({"$ref": f"#/components/schemas/{schema}"}, served_schema)

    @settings(SETTINGS, max_examples=30)
    @given(body=bodies)
    def run(body):
        resp = client.post(route, json=body, headers=AUTH)
        check(resp, "schema " + route)
        if resp.status_code >= 400:
            err = resp.get_json()["error"]
            assert resp.status_code == 400 and any(r in err["message"] or r == err["code"]
                                                   for r in CONTEXT_REFUSALS), (body, err)

    run()


def test_fuzz_summary(client):
    """Runs last in this file: every fuzzed route was exercised (the counts go to the report)."""
    print("requests tried per route:", json.dumps(SEEN), "statuses:", json.dumps(STATUS))
    assert STATUS.get(200, 0) >= 40, STATUS  # the fuzzer reaches generation, not only the validators
    for route in ("/v1/completions", "/v1/chat/completions", "POST /v1/index/documents",
                  "GET /v1/index/documents", "DELETE /v1/index/documents", "any"):
        assert SEEN.get(route, 0) >= 30, (route, SEEN)
