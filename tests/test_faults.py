"""Faults: kill -9 of `suffixspec serve` during a document add and during a generation, a restart on the
same store, the CLI adding documents while the server serves from the same database, and corrupt or
foreign database files (a clear error and exit 1, never a traceback or a crash loop)."""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow  # subprocess servers, kill -9

CLI = [sys.executable, "-c", "from suffixspec.cli import main; main()"]
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
ENV.pop("SUFFIXSPEC_API_KEY", None)


class Server:
    """`suffixspec serve` in a subprocess on a free port of 127.0.0.1."""

    def __init__(self, model, db) -> None:
        cmd = [*CLI, "serve", "--model", str(model), "--draft-model", "none", "--db", str(db), "--port", "0"]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=ENV)
        self.log: list[str] = []
        lines: queue.Queue = queue.Queue()

        def pump() -> None:
            for line in self.proc.stderr:
                self.log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self.url = None
        deadline = time.monotonic() + 180
        while self.url is None and time.monotonic() < deadline:
            line = lines.get(timeout=180)
            assert line is not None, "".join(self.log)[-2000:]
            m = re.search(r"on http://(127\.0\.0\.1):(\d+)", line)
            if m:
                self.url = (m.group(1), int(m.group(2)))
        assert self.url, "".join(self.log)[-2000:]

    def call(self, method: str, path: str, body=None, timeout: float = 120) -> tuple[int, object]:
        conn = http.client.HTTPConnection(*self.url, timeout=timeout)
        try:
            conn.request(method, path, json.dumps(body) if body is not None else None,
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read().decode()
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw
        finally:
            conn.close()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def db_state(db) -> tuple[str, dict[str, str], int]:
    """(integrity_check, {path: text}, history rows) read with a plain sqlite3 connection."""
    conn = sqlite3.connect(str(db))
    try:
        ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
        docs = dict(conn.execute("SELECT path, text FROM documents"))
        hist = conn.execute("SELECT count(*) FROM history").fetchone()[0]
        return ok, docs, hist
    finally:
        conn.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="finds the writer process in /proc")
def test_kill9_during_add_and_generation_then_restart(tiny_model_dirs, tmp_path):
    model, db = tiny_model_dirs["llama"], tmp_path / "index.db"
    first = [{"text": f"def helper_{i}(x):\n    return x * {i} + {i}\n", "source": f"lib/h{i}.py"} for i in range(5)]
    srv = Server(model, db)
    try:
        assert srv.call("POST", "/v1/index/documents", {"documents": first})[0] == 200
        for p in ("def helper_1(x):", "import os"):
            assert srv.call("POST", "/v1/completions", {"prompt": p, "max_tokens": 8, "temperature": 0})[0] == 200
        _, docs_before, hist_before = db_state(db)
        assert set(docs_before) == {d["source"] for d in first} and hist_before >= 2
        # in flight at the kill: a long streaming generation and a large document add (over 1 MiB of text: it
        # runs in the server's writer process), each waited for until it is seen running
        big = {"documents": [{"text": "x = [" + ", ".join(str(i) for i in range(200_000)) + "]\n",
                              "source": "big.py"}]}
        streaming = threading.Event()
        gen = threading.Thread(target=_stream, args=(srv, {"prompt": "class Point:", "max_tokens": 1000, "stream": True,
                                                           "ignore_eos": True}, streaming), daemon=True)
        add = threading.Thread(target=lambda: _swallow(srv.call, "POST", "/v1/index/documents", big), daemon=True)
        gen.start()
        assert streaming.wait(120), "no token was streamed"  # the generation is in flight
        add.start()
        writer_pid = _child_of(srv.proc.pid, timeout_s=120)  # the add is in flight: its writer process runs
        assert gen.is_alive()  # and the generation still streams
        srv.kill9()
        gen.join(10)
        add.join(10)
        deadline = time.monotonic() + 120
        while _alive(writer_pid):  # the orphaned writer reads the end of its pipe and aborts
            assert time.monotonic() < deadline, "the writer process outlived its server"
            time.sleep(0.05)
    finally:
        srv.stop()
    ok, docs, hist = db_state(db)
    assert ok == "ok"
    assert {k: docs[k] for k in docs_before} == docs_before  # every document added before is there, unchanged
    assert set(docs) == set(docs_before)  # the add killed in flight left nothing behind
    assert hist >= hist_before  # the output history up to the last flush
    srv = Server(model, db)  # a restart serves from the same store
    try:
        status, listing = srv.call("GET", "/v1/index/documents?limit=100")
        assert status == 200 and {d["source"] for d in listing["data"]} >= set(docs_before)
        status, stats = srv.call("GET", "/v1/index/stats")
        assert status == 200 and stats["documents"] == len(docs)
        status, out = srv.call("POST", "/v1/completions", {"prompt": "def helper_3(x):", "max_tokens": 8,
                                                           "temperature": 0, "speculation": {"drafters": ["documents"]}})
        assert status == 200 and out["choices"][0]["finish_reason"] in ("stop", "length")
        assert srv.call("GET", "/health")[0] == 200

        # the writer process of a large add is killed: a 503 that says what to do, and nothing half-added
        answer = {}
        adder = threading.Thread(target=lambda: answer.update(r=srv.call("POST", "/v1/index/documents", big)))
        adder.start()
        os.kill(_child_of(srv.proc.pid, timeout_s=120), signal.SIGKILL)
        adder.join(120)
        status, body = answer["r"]
        assert status == 503 and body["error"]["code"] == "index_writer_died", body
        assert "killed by SIGKILL" in body["error"]["message"] and "retry" in body["error"]["message"]
        assert srv.call("GET", "/v1/index/stats")[1]["documents"] == len(docs)

        # the CLI adds documents to the same database while the server serves from it
        tree = tmp_path / "tree"
        tree.mkdir()
        for i in range(20):
            (tree / f"m{i}.py").write_text(f"def cli_fn_{i}(a):\n    return a - {i}\n" * 20)
        cli = subprocess.Popen([*CLI, "index", "add", str(tree), "--db", str(db), "--tokenizer", str(model), "-q"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        statuses = []
        with ThreadPoolExecutor(2) as pool:
            while cli.poll() is None:
                futs = [pool.submit(srv.call, "POST", "/v1/completions", {"prompt": "import os", "max_tokens": 4}),
                        pool.submit(srv.call, "GET", "/v1/index/documents?limit=5")]
                statuses += [f.result()[0] for f in futs]
        out, err = cli.communicate()
        assert cli.returncode == 0, err[-2000:]
        assert "added 20" in out and statuses and set(statuses) == {200}
        status, listing = srv.call("GET", "/v1/index/documents?limit=1000")
        assert sum(1 for d in listing["data"] if (d["source"] or "").startswith(str(tree))) == 20
        assert srv.call("POST", "/v1/completions", {"prompt": "def cli_fn_3(a):", "max_tokens": 6,
                                                    "speculation": {"drafters": ["documents"]}})[0] == 200
    finally:
        srv.stop()
    assert srv.proc.returncode == 0, "".join(srv.log)[-2000:]
    assert db_state(db)[0] == "ok"


def _stream(srv: Server, body: dict, first: threading.Event) -> None:
    """POST a streaming completion and read it; ``first`` is set at its first event (tokens are coming)."""
    conn = http.client.HTTPConnection(*srv.url, timeout=120)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        for line in conn.getresponse():
            if line.startswith(b"data:"):
                first.set()
    except (OSError, http.client.HTTPException):  # the server was killed under the request
        pass
    finally:
        conn.close()


def _child_of(pid: int, timeout_s: float) -> int:
    """The first child process ``pid`` starts (any of its threads), waited for."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                kids = open(f"/proc/{pid}/task/{task}/children").read().split()
            except OSError:  # the thread ended meanwhile
                continue
            if kids:
                return int(kids[0])
        time.sleep(0.01)
    raise AssertionError(f"process {pid} started no child in {timeout_s} s")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def _swallow(fn, *a):
    try:
        fn(*a)
    except (OSError, http.client.HTTPException):  # the server was killed under the request
        pass


@pytest.fixture(scope="module")
def bad_dbs(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad-dbs")
    (d / "random.db").write_bytes(os.urandom(4096))
    (d / "text.db").write_text("this is not a database\n")
    conn = sqlite3.connect(str(d / "foreign.db"))
    conn.execute("CREATE TABLE users (name TEXT, email TEXT)")
    conn.execute("INSERT INTO users VALUES ('a', 'b')")
    conn.commit()
    conn.close()
    conn = sqlite3.connect(str(d / "clash.db"))
    conn.execute("CREATE TABLE documents (title TEXT, body TEXT)")
    conn.commit()
    conn.close()
    header = bytearray((d / "foreign.db").read_bytes())
    header[100:] = os.urandom(len(header) - 100)  # a valid header, garbage pages
    (d / "corrupt.db").write_bytes(bytes(header))
    return d


@pytest.mark.parametrize(("name", "cmd"), [("random.db", "list"), ("text.db", "stats"), ("foreign.db", "list"),
                                           ("clash.db", "stats"), ("corrupt.db", "list")])
def test_bad_database_is_a_clear_error(bad_dbs, name, cmd):
    before = (bad_dbs / name).read_bytes()
    res = subprocess.run([*CLI, "index", cmd, "--db", str(bad_dbs / name)], capture_output=True, text=True, env=ENV,
                         timeout=120)
    assert res.returncode == 1, (res.stdout, res.stderr[-1500:])
    assert "Traceback" not in res.stderr and res.stderr.startswith("Error:"), res.stderr[-1500:]
    assert name in res.stderr
    assert (bad_dbs / name).read_bytes() == before  # another program's file is left untouched


@pytest.mark.parametrize("name", ["foreign.db"])
def test_serve_on_a_bad_database_exits_with_a_clear_error(bad_dbs, tiny_model_dirs, name):
    res = subprocess.run([*CLI, "serve", "--model", str(tiny_model_dirs["llama"]), "--draft-model", "none",
                          "--db", str(bad_dbs / name), "--port", "0"], capture_output=True, text=True, env=ENV,
                         timeout=180)
    assert res.returncode == 1, res.stderr[-1500:]
    assert "Traceback" not in res.stderr and "Error:" in res.stderr and "not" in res.stderr, res.stderr[-1500:]
