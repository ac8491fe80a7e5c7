"""Faults.

One request's failure stays its own (``scheduler.Scheduler``): a request whose join, prompt prefill, prefix
reuse or proposer (propose, update) fails, or whose row fails the target's pass, ends with a
``RequestFailed`` naming that step, while the requests running beside it finish with exactly the tokens
they get alone and no caller waits forever. Each failure is injected by wrapping one real method (the
runner's, the cache's, the suffix proposer's) to raise for one request, with several requests in the batch;
the step loop must end within a bounded number of steps with a final event on every handle, and the server
worker's callers read their events with a bounded wait.

The server process: kill -9 of `suffixspec serve` during a document add and during a generation, a
restart on the same store, the CLI adding documents while the server serves from the same database, and
corrupt or foreign database files (a clear error and exit 1, never a traceback or a crash loop)."""

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
from test_prefix import HEAD, TASKS

import suffixspec.core.kv as kv
from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.drafting.policy import Policy
from suffixspec.drafting.proposers import make_proposer
from suffixspec.drafting.proposers.suffix import SuffixProposer
from suffixspec.errors import RequestFailed
from suffixspec.loading import load_model
from suffixspec.runtimes.engine import Engine

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


@pytest.mark.slow  # subprocess servers, kill -9
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


@pytest.mark.slow  # a CLI process each
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


@pytest.mark.slow  # a server process
@pytest.mark.parametrize("name", ["foreign.db"])
def test_serve_on_a_bad_database_exits_with_a_clear_error(bad_dbs, tiny_model_dirs, name):
    res = subprocess.run([*CLI, "serve", "--model", str(tiny_model_dirs["llama"]), "--draft-model", "none",
                          "--db", str(bad_dbs / name), "--port", "0"], capture_output=True, text=True, env=ENV,
                         timeout=180)
    assert res.returncode == 1, res.stderr[-1500:]
    assert "Traceback" not in res.stderr and "Error:" in res.stderr and "not" in res.stderr, res.stderr[-1500:]


# ----- one request's failure stays its own ---------------------------------------------------------------
OTHER = "import os\nimport sys\n\ndef main(argv):\n    return len(argv)\n"  # shares no head with HEAD
FAULT_CASES = [dict(max_tokens=24, ignore_eos=True), dict(max_tokens=20, ignore_eos=True, temperature=1.0, seed=7),
               dict(max_tokens=22, ignore_eos=True, temperature=0.8, top_k=30, seed=3),
               dict(max_tokens=18, ignore_eos=True, presence_penalty=0.5)]
# A and B share a head (B waits a step to copy it: held), C (the victim, unless a test says otherwise) shares
# nothing and joins beside A, D shares the head too: the order in which _admit meets them
FAULT_REQS = [(HEAD + TASKS[0], FAULT_CASES[0]), (HEAD + TASKS[1], FAULT_CASES[1]), (OTHER + TASKS[2], FAULT_CASES[2]),
              (HEAD + TASKS[3], FAULT_CASES[3])]
STEP_LIMIT = 400  # far more steps than four requests of at most 24 tokens take: reaching it is a caller stuck
EVERY_DRAFT = SpeculationConfig(adaptive=False)  # every step asks the proposers (the gates would skip some calls)


class Injected(Exception):
    """The failure a test injects."""


@pytest.fixture(scope="module")
def fault_targets(tiny_model_dirs):
    return {arch: load_model(str(tiny_model_dirs[arch])) for arch in ("llama", "gpt2")}


@pytest.fixture(scope="module")
def alone(fault_targets):
    """Each request's tokens alone: plain decoding, its prompt prefilled in full."""
    out = {}
    for arch, target in fault_targets.items():
        plain = Engine(target, prefix_cache_mb=0)
        out[arch] = [plain.generate(p, SamplingParams(**c), speculation=False).token_ids for p, c in FAULT_REQS]
    return out


def _engine(target) -> Engine:
    """Four rows, the suffix proposer, joiners that share a 16-token head staggered (held a step)."""
    engine = Engine(target, [make_proposer("suffix", db=None, tokenizer=target.tokenizer)], max_num_seqs=4,
                    policy=Policy(shared_prefill_min=16))
    assert engine.batchable
    return engine


def _run_batch(engine: Engine, reqs=FAULT_REQS) -> list:
    """Submit every request at once, step until none runs or waits (at most STEP_LIMIT steps), and return each
    handle's final event: a StreamEvent with the result, or the exception it ended with. A handle with no
    final event is a caller that would wait forever."""
    sched = engine.scheduler
    handles = []
    for p, c in reqs:
        request, spec = engine.prepare(p, SamplingParams(**c), EVERY_DRAFT)
        handles.append(sched.submit(engine.state_maker(request, spec, None), None, request.prompt_ids))
    steps = 0
    while (sched.running or sched.waiting) and steps < STEP_LIMIT:
        sched.step()
        steps += 1
    assert steps < STEP_LIMIT, "the batch never drained"
    finals = []
    for i, h in enumerate(handles):
        events = []
        while not h.events.empty():
            events.append(h.events.get())
        assert events, f"request {i} is in no queue and has no event: its caller would wait forever"
        last = events[-1]
        assert isinstance(last, BaseException) or last.result is not None, (i, last)
        if not isinstance(last, BaseException):  # the stream carried every token once
            assert [t for ev in events for t in ev.token_ids] == last.result.token_ids
        finals.append(last)
    return finals


def _only_victim_failed(finals: list, want: list[list[int]], victim: int, stage: str) -> None:
    for i, (ev, tokens) in enumerate(zip(finals, want, strict=True)):
        if i == victim:
            assert isinstance(ev, RequestFailed), ev
            assert ev.stage == stage and isinstance(ev.__cause__, Injected), (ev, ev.__cause__)
            assert str(ev).startswith(f"the request failed while {stage} (Injected: ") and "other requests go on" in str(ev)
        else:
            assert not isinstance(ev, BaseException), (i, ev)
            assert ev.result.token_ids == tokens, (i, FAULT_REQS[i])


def _ids(engine: Engine, i: int) -> list[int]:
    return engine.encode(FAULT_REQS[i][0])


def test_a_failing_prefix_reuse_fails_its_request_alone_and_keeps_the_held_ones(fault_targets, alone, monkeypatch):
    """C's prefix copy raises in the same admission that holds B back to share A's prefill: C ends with its
    error, A, B and D finish as alone (before: B was in no queue, its caller waiting forever, and A failed)."""
    engine = _engine(fault_targets["llama"])
    sched, victim = engine.scheduler, _ids(engine, 2)
    reuse = sched.runner.reuse
    held: list = []  # handles held back a step to share a joiner's prefill
    shares = sched._shares_a_prefill

    def recording(handle) -> bool:
        out = shares(handle)
        if out:
            held.append(handle)
        return out

    monkeypatch.setattr(sched, "_shares_a_prefill", recording)

    def failing(row, prompt):
        if prompt == victim[:-1]:
            raise Injected("out of memory growing the cache")
        return reuse(row, prompt)

    monkeypatch.setattr(sched.runner, "reuse", failing)
    finals = _run_batch(engine)
    assert held, "no request was held back to share a prefill: the case this test is about did not happen"
    _only_victim_failed(finals, alone["llama"], 2, "copying its reused prompt prefix")


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_failing_prefill_fails_its_request_alone(fault_targets, alone, monkeypatch, arch):
    """C's prompt fails to compute. Lean (llama): it rides in A's pass, which fails; each row then runs alone
    and only C's fails. Padded (gpt2): C's prefill is a pass of its own."""
    engine = _engine(fault_targets[arch])
    sched, victim = engine.scheduler, _ids(engine, 2)[:-1]
    if sched.runner.packs_prompts:
        forward = sched.runner.forward

        def failing(rows):
            if any(r.logits == "none" and victim[r.past:] == list(r.ids) for r in rows):
                raise Injected("out of memory computing the prompt")
            return forward(rows)

        monkeypatch.setattr(sched.runner, "forward", failing)
    else:
        prefill = sched.runner.prefill

        def failing(row, ids, start=0):
            if victim[start:] == list(ids):
                raise Injected("out of memory computing the prompt")
            return prefill(row, ids, start)

        monkeypatch.setattr(sched.runner, "prefill", failing)
    assert sched.runner.packs_prompts == (arch == "llama")
    _only_victim_failed(_run_batch(engine), alone[arch], 2, "prefilling its prompt")


@pytest.mark.parametrize(("method", "stage"), [("propose", "drafting"), ("update", "committing its tokens")])
@pytest.mark.parametrize("victim", [0, 2])
def test_a_failing_proposer_fails_its_request_alone(fault_targets, alone, monkeypatch, method, stage, victim):
    """The victim's suffix proposer raises on its third propose (or update), mid-generation, with the other
    requests running: the victim ends with its error, the others finish as alone."""
    engine = _engine(fault_targets["llama"])
    ids = _ids(engine, victim)
    begin, original = SuffixProposer.begin, getattr(SuffixProposer, method)
    calls = []

    def tagging(self, request):
        self.victim = list(request.prompt_ids) == ids
        return begin(self, request)

    def failing(self, *args, **kwargs):
        if getattr(self, "victim", False):
            calls.append(method)
            if len(calls) == 3:
                raise Injected(f"a bug in {method}")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SuffixProposer, "begin", tagging)
    monkeypatch.setattr(SuffixProposer, method, failing)
    _only_victim_failed(_run_batch(engine), alone["llama"], victim, stage)
    assert len(calls) == 3  # the victim stopped at its failure


def test_a_row_that_fails_the_pass_fails_alone(fault_targets, alone, monkeypatch):
    """The victim's proposer drafts a token the model has no embedding for (mid-generation): the lean pass of
    every row fails; each row then runs alone, only the victim's fails, and the others commit the logits of
    their own passes (a row's logits are the same alone or in a batch): their tokens are the alone ones."""
    from suffixspec.drafting.draft import Draft

    engine = _engine(fault_targets["llama"])
    ids, vocab = _ids(engine, 0), engine.vocab_size
    propose = SuffixProposer.propose
    bad = []

    def out_of_vocabulary(self, context, budget):
        if list(context[:len(ids)]) == ids and len(context) == len(ids) + 5:
            bad.append(len(context))
            return Draft([vocab + 7], [-1], ["prompt"])
        return propose(self, context, budget)

    monkeypatch.setattr(SuffixProposer, "propose", out_of_vocabulary)
    finals = _run_batch(engine)
    assert bad and isinstance(finals[0], RequestFailed) and isinstance(finals[0].__cause__, IndexError)
    assert finals[0].stage == "the target's pass"
    for i in (1, 2, 3):
        assert finals[i].result.token_ids == alone["llama"][i], i


def test_a_cache_growth_that_runs_out_of_memory_fails_one_request_and_leaves_the_cache_usable(
        fault_targets, alone, monkeypatch):
    """C's prompt (over the cache's 256 positions) is stored by an earlier request; when C joins, copying it
    grows every row's buffers, and the growth runs out of memory after one layer. C ends with its error;
    A, B and D finish as alone; then C again (no failure now) gets its tokens alone: the half-grown cache
    was left as it was for its users."""
    long_other = OTHER * 11
    reqs = [*FAULT_REQS[:2], (long_other, FAULT_CASES[2]), FAULT_REQS[3]]
    target = fault_targets["llama"]
    want = Engine(target, prefix_cache_mb=0).generate(long_other, SamplingParams(**FAULT_CASES[2]), speculation=False)
    engine = _engine(target)
    assert len(engine.encode(long_other)) > 300
    warm = Engine(target, prefix_cache_mb=0)  # a cache of its own, filling the engine's store
    warm.prefix_store = engine.prefix_store
    assert warm.generate(long_other, SamplingParams(**FAULT_CASES[2]), speculation=False).token_ids == want.token_ids
    sched = engine.scheduler
    assert sched.runner.cache.capacity == 256 and engine.prefix_store.covered(engine.encode(long_other)) > 256
    grown = kv._grown
    growths = []

    def failing(buf, rows, positions):
        if positions > 256:
            growths.append(positions)
            if len(growths) == 3:  # keys and values of the first layer grew; the second layer's keys fail (once)
                raise Injected("out of memory growing the cache")
        return grown(buf, rows, positions)

    monkeypatch.setattr(kv, "_grown", failing)
    finals = _run_batch(engine, reqs)
    _only_victim_failed(finals, [*alone["llama"][:2], want.token_ids, alone["llama"][3]], 2,
                        "copying its reused prompt prefix")
    cache = sched.runner.cache
    assert cache.capacity == 256 and cache.keys[0].shape[2] == 512 and cache.keys[1].shape[2] == 256
    again = _run_batch(engine, [reqs[2], reqs[0]])
    assert [ev.result.token_ids for ev in again] == [want.token_ids, alone["llama"][0]]
    assert cache.capacity == 512 and {k.shape[2] for k in (*cache.keys, *cache.values)} == {512}


def test_the_server_worker_answers_the_failed_request_and_serves_the_others(fault_targets, alone, monkeypatch):
    """Through the HTTP server's worker (four runner threads sharing the batch): the request whose proposer
    fails gets a JobFailed naming the step, the others their alone tokens, every event read with a bounded
    wait (a stuck caller fails the test instead of hanging it)."""
    from suffixspec.server.worker import DONE, EngineWorker, Job, JobFailed

    engine = _engine(fault_targets["llama"])
    victim = _ids(engine, 1)
    propose = SuffixProposer.propose

    def failing(self, context, budget):
        if list(context[:len(victim)]) == victim and len(context) > len(victim) + 3:
            raise Injected("a bug in propose")
        return propose(self, context, budget)

    monkeypatch.setattr(SuffixProposer, "propose", failing)
    worker = EngineWorker(engine, max_queue=8)
    try:
        assert worker.concurrency == 4
        jobs = [worker.submit(Job(kwargs=dict(prompt=p, sampling=SamplingParams(**c), speculation=EVERY_DRAFT)))
                for p, c in FAULT_REQS]
        for i, job in enumerate(jobs):
            while True:
                ev = job.events.get(timeout=120)  # an upper bound for what takes a second: reaching it is a hang
                if ev is DONE or isinstance(ev, JobFailed):
                    break
            if i == 1:
                assert isinstance(ev, JobFailed) and isinstance(ev.exc, RequestFailed), ev
                assert ev.message == ("the engine failed on this request while drafting (the other requests go "
                                      "on); the server log has the details")
            else:
                assert ev is DONE and job.result.token_ids == alone["llama"][i], (i, ev)
    finally:
        worker.shutdown(timeout=60)
