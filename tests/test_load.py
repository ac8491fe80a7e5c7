"""A bounded load test against a real waitress server on 127.0.0.1.

16 clients (half streaming) send 96 greedy requests over 6 distinct prompts as fast as they can; every
answer must equal the same request served alone (nothing lost, nothing mixed up between clients),
the server's memory must stay bounded across rounds, and a full queue must answer 503 with
Retry-After (then serve again).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import pytest

from suffixspec.server import create_app
from suffixspec.server.serve import BackgroundServer

pytestmark = pytest.mark.slow

CLIENTS = 16
PER_CLIENT = 6
PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "import os", "The quick brown", "if x is None:"]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def server(tiny_model_dirs, tmp_path_factory):
    db = tmp_path_factory.mktemp("load-db") / "index.db"
    app = create_app({"model": str(tiny_model_dirs["llama"]), "draft_model": None, "db": str(db),
                      "max_queue": 64, "disconnect_poll_s": 0.05})
    with BackgroundServer(app, threads=CLIENTS + 4) as srv:
        yield srv


def _wait_until(cond, held: list, st, timeout: float = 120) -> None:
    """Wait for ``cond()`` (worker state); fail with what the worker, the clients and every thread saw."""
    deadline = time.monotonic() + timeout  # a bound for a loaded CPU; the loop ends as soon as it holds
    while not cond() and time.monotonic() < deadline and not any(f.done() for f in held):
        time.sleep(0.01)
    assert cond(), ("the queue did not fill as expected", st.worker.queue_length(), st.worker.busy(),
                    st.worker.concurrency, [f.result()[:1] if f.done() and not f.exception() else
                                            repr(f.exception()) if f.done() else "pending" for f in held],
                    _thread_stacks())


def _thread_stacks() -> str:
    """Where every thread of this process is now (for a failure message)."""
    import sys
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(f"--- {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame)[-6:])
                     for ident, frame in sys._current_frames().items())


def _rss() -> int:
    """Resident memory of this process (the server runs in it), bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def post(url: str, path: str, body: dict, timeout: float = 120) -> tuple[int, dict, str]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def text_of(status: int, raw: str, stream: bool, chat: bool) -> str:
    assert status == 200, raw[:300]
    if not stream:
        choice = json.loads(raw)["choices"][0]
        return choice["message"]["content"] if chat else choice["text"]
    events = [b[6:] for b in raw.split("\n\n") if b.startswith("data: ")]
    assert events[-1] == "[DONE]", raw[-200:]
    out = []
    for e in events[:-1]:
        ev = json.loads(e)
        assert "error" not in ev, ev
        for c in ev.get("choices", []):
            out.append((c.get("delta") or {}).get("content") or "" if chat else c.get("text", ""))
    return "".join(out)


def request(url: str, prompt: str, chat: bool, stream: bool) -> tuple[tuple, str]:
    body = {"max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    status, _, raw = post(url, "/v1/chat/completions" if chat else "/v1/completions", body)
    return (prompt, chat), text_of(status, raw, stream, chat)


def test_concurrent_clients_get_exactly_their_own_answers(server):
    spec = server.app.extensions["suffixspec"].spec
    alone = dict(request(server.url, p, chat, False) for p in PROMPTS for chat in (False, True))  # one at a time
    assert alone[(PROMPTS[1], False)] == spec.generate(PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0.0).text

    tracemalloc.start()
    peaks, rss = [], [_rss()]
    results: list[tuple[tuple, str]] = []
    t0 = time.monotonic()
    for rnd in range(2):  # two rounds: memory after the second must not have grown with the load
        with ThreadPoolExecutor(CLIENTS) as pool:
            futs = [pool.submit(request, server.url, PROMPTS[(c + k + rnd) % len(PROMPTS)], (c + 2 * k) % 3 == 0,
                                (c + k) % 2 == 0) for c in range(CLIENTS) for k in range(PER_CLIENT // 2)]
            results += [f.result() for f in futs]
        peaks.append(tracemalloc.get_traced_memory()[0])
        rss.append(_rss())
    elapsed = time.monotonic() - t0
    tracemalloc.stop()
    assert len(results) == CLIENTS * PER_CLIENT
    wrong = [(key, text) for key, text in results if text != alone[key]]
    assert not wrong, wrong[:3]
    # live Python memory after round 2 is not above round 1 by more than a few MB (no per-request leak)
    assert peaks[1] - peaks[0] < 8 * 2**20, peaks
    assert rss[2] - rss[1] < 64 * 2**20, rss  # the process (server threads + torch) does not grow per round
    st = server.app.extensions["suffixspec"]
    assert st.worker.queue_length() == 0 and not st.worker.busy()
    print(f"load: {CLIENTS} clients, {len(results)} requests (half streaming, 1/3 chat) in {elapsed:.1f}s, "
          f"all equal to the request served alone; traced memory {peaks[0] / 2**20:.1f} -> {peaks[1] / 2**20:.1f} MiB, "
          f"RSS {rss[0] / 2**20:.0f} -> {rss[1] / 2**20:.0f} -> {rss[2] / 2**20:.0f} MiB")


def test_full_queue_answers_503_with_retry_after_then_recovers(tiny_model_dirs, tmp_path):
    app = create_app({"model": str(tiny_model_dirs["llama"]), "draft_model": None, "db": False, "max_queue": 2,
                      "retry_after_s": 3, "max_num_seqs": 1})  # one running + 2 queued (test_server_batch: N running)
    st = app.extensions["suffixspec"]
    gate = threading.Event()
    real_stream = st.worker.engine.stream

    def slow_stream(*a, **kw):  # hold the engine until the test has filled the queue
        gate.wait(600)  # released by the test's finally, whatever happens
        yield from real_stream(*a, **kw)

    st.worker.engine.stream = slow_stream
    with BackgroundServer(app, threads=12) as srv:
        body = {"prompt": "import os", "max_tokens": 3, "temperature": 0}
        with ThreadPoolExecutor(3) as pool:
            try:
                # One at a time: the first must be running before the others arrive. Sent together, the three
                # could all reach the queue before the worker thread woke (a loaded machine): two waited, the
                # third got a 503 and the queue never held 2 behind a running one (failed 3 full-suite runs).
                held = []
                for want_queued in (0, 1, 2):
                    held.append(pool.submit(post, srv.url, "/v1/completions", body))
                    _wait_until(lambda n=want_queued: st.worker.busy() and st.worker.queue_length() == n, held, st)
                statuses = [post(srv.url, "/v1/completions", body, timeout=30) for _ in range(4)]
                for status, headers, raw in statuses:
                    assert status == 503 and headers["retry-after"] == "3"
                    assert json.loads(raw)["error"]["code"] == "queue_full"
            finally:
                gate.set()  # never leave the engine held (and its thread alive) for the next tests
            assert [f.result()[0] for f in held] == [200, 200, 200]
        st.worker.engine.stream = real_stream
        assert post(srv.url, "/v1/completions", body)[0] == 200
        metrics = http.client.HTTPConnection(*srv.url.removeprefix("http://").split(":"))
        metrics.request("GET", "/metrics")
        text = metrics.getresponse().read().decode()
        assert 'suffixspec_rejected_requests_total{reason="queue_full"} 4.0' in text or "queue_full" in text
