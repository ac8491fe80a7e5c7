"""The engine worker behind the HTTP service: bounded queue (503), client disconnects, shutdown.

A gate proposer blocks the engine inside a decode step until the test opens it, so every state
(running, queued, full) is reached deterministically, without sleeping.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Sequence

import pytest

from suffixspec.api import SuffixSpec
from suffixspec.drafting.draft import Draft
from suffixspec.drafting.proposers import Proposer
from suffixspec.loading import load_model
from suffixspec.runtimes.engine import Engine
from suffixspec.server import create_app
from suffixspec.server.serve import BackgroundServer

WAIT = 60  # seconds: an upper bound for events that take milliseconds; never reached when things work


class GateProposer(Proposer):
    """Proposes nothing, but each propose waits for a permit (or for ``open``)."""

    name = "gate"

    def __init__(self) -> None:
        self.entered = threading.Event()  # a step has started
        self.permits = threading.Semaphore(0)
        self.opened = threading.Event()
        self.outputs: list[int] = []  # length of each finished request's output

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        self.entered.set()
        if not self.opened.is_set():
            self.permits.acquire(timeout=WAIT)
        return Draft()

    def end(self, output_ids: Sequence[int]) -> None:
        self.outputs.append(len(output_ids))

    def open(self) -> None:
        self.opened.set()
        for _ in range(100):
            self.permits.release()


@pytest.fixture(scope="module")
def target(tiny_model_dirs):
    return load_model(str(tiny_model_dirs["llama"]))


@pytest.fixture
def gated(target):
    """(server, gate): a server whose engine waits at the gate; max_queue=1."""
    gate = GateProposer()
    spec = SuffixSpec(engine=Engine(target, [gate]), db=False)
    app = create_app({"max_queue": 1, "disconnect_poll_s": 0.05, "shutdown_timeout_s": WAIT}, spec=spec)
    srv = BackgroundServer(app, threads=8)
    yield srv, gate
    gate.open()
    srv.close()


def post(srv, path: str, body: dict) -> tuple[int, dict, str]:
    host, port = srv.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read().decode()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def open_long_stream(srv) -> socket.socket:
    """A raw socket that has sent a streaming request for 400 tokens (the test hangs up on it later)."""
    host, port = srv.url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "import os", "max_tokens": 400, "ignore_eos": True, "temperature": 0,
                       "stream": True}).encode()
    sock = socket.create_connection((host, int(port)), timeout=WAIT)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    return t, out


def submitted_signal(srv) -> threading.Event:
    """An event set each time a job enters the worker queue."""
    worker = srv.app.extensions["suffixspec"].worker
    event = threading.Event()
    original = worker.submit

    def submit(job):
        res = original(job)
        event.set()
        return res

    worker.submit = submit
    return event


def metric(srv, name: str, **labels: str) -> float:
    text = srv.app.extensions["suffixspec"].metrics.render().decode()
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def test_full_queue_answers_503_with_retry_after(gated):
    srv, gate = gated
    queued = submitted_signal(srv)
    body = {"prompt": "def add(a, b):", "max_tokens": 5, "temperature": 0}
    ta, a = in_thread(post, srv, "/v1/completions", body)  # runs (held at the gate)
    assert gate.entered.wait(WAIT)
    queued.clear()
    tb, b = in_thread(post, srv, "/v1/completions", body)  # waits in the queue (size 1)
    assert queued.wait(WAIT)
    status, headers, data = post(srv, "/v1/completions", body)
    assert status == 503 and headers["retry-after"].isdigit()
    assert json.loads(data)["error"]["code"] == "queue_full"
    gate.open()
    ta.join(WAIT)
    tb.join(WAIT)
    assert a[0][0] == 200 and b[0][0] == 200
    assert json.loads(a[0][2])["choices"][0]["text"] == json.loads(b[0][2])["choices"][0]["text"]
    assert metric(srv, "suffixspec_rejected_requests_total", reason="queue_full") == 1


def test_disconnect_mid_stream_frees_the_engine(gated):
    srv, gate = gated
    sock = open_long_stream(srv)
    assert gate.entered.wait(WAIT)
    sock.settimeout(0.5)
    received = b""
    for _ in range(100):  # one decode step at a time until a chunk with text came through
        gate.permits.release()
        try:
            received += sock.recv(65536)
        except TimeoutError:
            continue
        if b"data: " in received:
            break
    assert b"200 OK" in received and b"text/event-stream" in received
    sock.close()  # the client goes away mid-stream
    gate.open()  # the engine would now run all 400 tokens unless the request is cancelled
    status, _, data = post(srv, "/v1/completions", {"prompt": "import os", "max_tokens": 4, "temperature": 0})
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 4
    assert gate.outputs[0] < 400  # the streamed request stopped early
    assert metric(srv, "suffixspec_generations_total", endpoint="completions", finish_reason="cancelled") == 1


def test_shutdown_finishes_running_refuses_queued_and_new(gated):
    srv, gate = gated
    st = srv.app.extensions["suffixspec"]
    queued = submitted_signal(srv)
    ta, a = in_thread(post, srv, "/v1/completions", {"prompt": "for i in", "max_tokens": 6, "stream": True,
                                                     "temperature": 0})
    assert gate.entered.wait(WAIT)
    queued.clear()
    tb, b = in_thread(post, srv, "/v1/completions", {"prompt": "x", "max_tokens": 3})
    assert queued.wait(WAIT)
    tshut, _ = in_thread(st.shutdown)
    tb.join(WAIT)  # the queued request is refused at once, while the running one still runs
    assert b[0][0] == 503 and json.loads(b[0][2])["error"]["code"] == "shutting_down"
    status, _, data = post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 3})
    assert status == 503
    health = http.client.HTTPConnection(*srv.url.removeprefix("http://").split(":"), timeout=WAIT)
    health.request("GET", "/health")
    assert health.getresponse().status == 503
    gate.open()
    ta.join(WAIT)
    tshut.join(WAIT)
    status, _, text = a[0]
    assert status == 200 and text.rstrip().endswith("data: [DONE]")  # the running stream was completed
    assert '"finish_reason":"length"' in text
    assert not st.worker.alive and st.spec._closed


def test_completion_tokens_are_counted_as_they_are_generated(gated):
    """The metrics page's tokens/s follows a running generation: each step's tokens count when committed.

    While the engine waits at the gate inside a step, every earlier step's event is out: the counter
    must equal the tokens those events carried, before the request ends."""
    import queue

    from suffixspec.config import SamplingParams, SpeculationConfig
    from suffixspec.server.worker import DONE, Job

    srv, gate = gated
    st = srv.app.extensions["suffixspec"]
    # adaptive=False: no proposer gate, so the gate proposer is asked (and waits) at every step; with the
    # adaptive one it would skip a proposer that took long, and the request could end between two waits
    job = st.worker.submit(Job(kwargs=dict(prompt=st.spec.encode("import os"),
                                           sampling=SamplingParams(max_tokens=40, ignore_eos=True),
                                           speculation=SpeculationConfig(adaptive=False))))
    assert gate.entered.wait(WAIT)
    seen = 0
    for step in range(1, 4):
        gate.entered.clear()
        gate.permits.release()
        assert gate.entered.wait(WAIT)  # held inside a later step: the steps before it are delivered
        while True:
            try:
                ev = job.events.get_nowait()
            except queue.Empty:
                break
            assert ev is not DONE
            seen += len(ev.token_ids)
        assert seen == step and metric(srv, "suffixspec_completion_tokens_total") == seen  # one token a step
    gate.open()
    while job.events.get(timeout=WAIT) is not DONE:
        pass
    assert metric(srv, "suffixspec_completion_tokens_total") == 40  # counted once, not again at the end


# -- errors by kind: a bad request is a 400 that says what to change; a bug a 500 that says nothing of it --

class BrokenProposer(Proposer):
    """A proposer with a bug while ``broken``: its draft has two tokens and one parent, which ``Draft``
    refuses with a ValueError in the engine's first step, before any event reached the client."""

    name = "broken"

    def __init__(self) -> None:
        self.broken = True

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        if self.broken:
            return Draft([context[-1], context[-1]], [-1], ["prompt", "prompt"])
        return Draft()


# A real template that refuses a conversation opening with the assistant (as many models' templates do)
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] == 'assistant' %}"
    "{{ raise_exception('a conversation starts with a system or user message') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
INTERNALS = ("Traceback", 'File "', ".py", "ValueError", "Draft", "parent", "propose", "broken")


@pytest.fixture
def broken(target):
    """(server, proposer): a server whose one proposer is broken, on a tokenizer with a strict template."""
    import copy
    import dataclasses

    tokenizer = copy.deepcopy(target.tokenizer)
    tokenizer.chat_template = STRICT_TEMPLATE
    proposer = BrokenProposer()
    spec = SuffixSpec(engine=Engine(dataclasses.replace(target, tokenizer=tokenizer), [proposer]), db=False)
    srv = BackgroundServer(create_app({}, spec=spec), threads=4)
    yield srv, proposer
    srv.close()


def test_a_proposer_bug_is_a_500_that_names_nothing_and_logs_the_traceback(broken, caplog):
    srv, proposer = broken
    body = {"prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}
    with caplog.at_level("ERROR", logger="suffixspec.server.worker"):
        status, _, data = post(srv, "/v1/completions", body)
        stream_status, _, stream = post(srv, "/v1/completions", {**body, "stream": True})
    err = json.loads(data)["error"]
    assert status == 500 and err["type"] == "server_error" and err["code"] == "engine_error", data
    assert "server log" in err["message"] and "while drafting" in err["message"]  # the stage, nothing more
    for leak in INTERNALS:
        assert leak not in data and leak not in stream, (leak, data, stream)
    # streaming: the headers were sent before the failure, so the error is an event, then [DONE]
    assert stream_status == 200 and '"engine_error"' in stream and stream.rstrip().endswith("[DONE]")
    logged = [r for r in caplog.records if r.name == "suffixspec.server.worker" and r.exc_info
              and "Draft needs one parent" in str(r.exc_info[1])]
    assert len(logged) == 2 and isinstance(logged[0].exc_info[1].__cause__, ValueError)  # the log has the traceback
    proposer.broken = False  # the worker survived the bug
    status, _, data = post(srv, "/v1/completions", body)
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 4


def test_a_bad_request_is_still_a_400_that_says_what_to_change(broken):
    srv, _ = broken
    status, _, data = post(srv, "/v1/chat/completions",
                           {"messages": [{"role": "assistant", "content": "hello"}], "max_tokens": 2})
    err = json.loads(data)["error"]
    assert status == 400 and err["type"] == "invalid_request_error" and err["param"] == "messages", data
    assert err["message"] == ("the model's chat template rejected these messages: a conversation starts "
                              "with a system or user message")
    status, _, data = post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 2, "top_p": 0})
    assert status == 400 and json.loads(data)["error"]["param"] == "top_p", data


def test_the_engines_request_checks_are_a_400_any_other_error_a_500(target, caplog):
    """The worker answers a RequestError raised before the first event (the engine's own request checks,
    here the prompt length) as a bad request, and any other exception as the engine's failure."""
    from suffixspec.config import SamplingParams
    from suffixspec.server.worker import EngineWorker, Job, JobFailed

    proposer = BrokenProposer()
    worker = EngineWorker(Engine(target, [proposer]), max_queue=4)
    try:
        too_long = worker.submit(Job(kwargs=dict(prompt=[5] * 2000, sampling=SamplingParams(max_tokens=2))))
        failed = too_long.events.get(timeout=WAIT)
        assert isinstance(failed, JobFailed) and failed.bad_request and failed.param == "prompt"
        assert failed.message == "the prompt has 2000 tokens but the model's context is 1024; shorten the prompt"
        with caplog.at_level("ERROR", logger="suffixspec.server.worker"):
            bug = worker.submit(Job(kwargs=dict(prompt=[5, 6, 7], sampling=SamplingParams(max_tokens=2))))
            failed = bug.events.get(timeout=WAIT)
        assert isinstance(failed, JobFailed) and not failed.bad_request
        assert failed.message == ("the engine failed on this request while drafting (the other requests go on); "
                                  "the server log has the details")
        assert any(r.exc_info and "Draft needs one parent" in str(r.exc_info[1]) for r in caplog.records)
    finally:
        worker.shutdown(timeout=WAIT)
