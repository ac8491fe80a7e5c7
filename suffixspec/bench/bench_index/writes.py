"""Adding documents while the index serves: the concurrent section (listing and generating during an add, the
add in a thread or a writer process), the add section (one small document beside 100 or 20,000) and the
busy-add section (``suffixspec index add`` against ``index stats`` while another process generates)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suffixspec.bench.bench_index.children import CHECKOUT, GENERATOR
from suffixspec.bench.bench_index.corpus import small_documents, source_files, stream_docs
from suffixspec.bench.checkout import command
from suffixspec.bench.processes import children_cpu
from suffixspec.index.store import DocInput

CONCURRENT_MODES = ("thread", "process-nice0", "process-nice19", "process")


def bench_concurrent(
    texts: list[tuple[str, str]],
    n_chars: int,
    rounds: int = 1,
    probes_alone: int = 3,
    modes: tuple[str, ...] = CONCURRENT_MODES,
    log=print,
) -> dict:
    """``GET /v1/index/documents`` (``list_documents``) and a 16-token greedy generation with the
    embedded models, timed alone and while another thread of this process adds ``n_chars`` of new
    documents (what a server's POST does), alternating, in one process. Each round runs one add per
    mode, interleaved, each after ``probes_alone`` probes with nothing else running:

    - ``thread``: ``IndexStore.add_documents`` in the adding thread (the server's POST before);
    - ``process-nice0``: the same add in a writer process at the server's priority (no interpreter
      shared: what is left of the slowdown is the cores);
    - ``process-nice19``: the writer process at nice 19 only (no ``SCHED_IDLE``);
    - ``process``: ``SuffixSpec.add_documents`` as it is (a writer process, ``SCHED_IDLE``, nice 19).

    Probes record wall time and the generating thread's CPU time (``time.thread_time``). After each
    probe the prober pauses as long as the probe took (the server busy half of the time: a writer at
    the lowest priority gets the other half; back-to-back generations would starve it), and the
    ``probes_alone`` probes alone are taken before and after each add, so that a change of the
    machine's load during a run weighs on both sides alike.
    """
    import threading

    from suffixspec.api import SuffixSpec
    from suffixspec.index import writer

    def probe(spec) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        spec.list_documents(limit=20)
        t1 = time.perf_counter()
        c1 = time.thread_time()
        spec.generate("def area(r):", max_tokens=16, temperature=0)
        t2 = time.perf_counter()
        time.sleep(t2 - t0)
        return t1 - t0, t2 - t1, time.thread_time() - c1

    def batch(tag: str) -> list[dict]:
        out, total = [], 0
        for p, t in texts:
            out.append({"text": t, "source": f"{p}#{tag}"})
            total += len(t)
            if total >= n_chars:
                break
        return out

    res: dict = {"modes": {m: {"alone": [], "during": [], "add_s": []} for m in modes}}
    with (
        tempfile.TemporaryDirectory() as d,
        SuffixSpec(model="suffixspec/demo-target", db=Path(d) / "i.db") as spec,
    ):
        spec.add_documents([{"text": t, "source": p} for p, t in texts[:20]])
        index = spec.documents  # the DocumentIndex behind spec.add_documents
        store, doc_tokenizer = index.store, index.tokenizer().tokenizer
        for _ in range(2):
            probe(spec)  # warm-up

        def add(mode: str, docs: list[dict]) -> None:
            ins = [DocInput(x["text"], x["source"]) for x in docs]
            if mode == "thread":
                with index.write_lock:
                    store.add_documents(ins, doc_tokenizer)
            elif mode.startswith("process-nice"):
                with index.write_lock:
                    writer.add_documents(spec.db_path, ins, doc_tokenizer, nice=int(mode[12:]), idle=False)
            else:
                spec.add_documents(docs)

        for r in range(rounds):
            for mode in modes:
                m = res["modes"][mode]
                m["alone"] += [probe(spec) for _ in range(probes_alone)]
                docs = batch(f"{mode}-{r}")
                res["add_chars"] = sum(len(x["text"]) for x in docs)
                adder = threading.Thread(target=add, args=(mode, docs))
                t = time.perf_counter()
                adder.start()
                while adder.is_alive():
                    m["during"].append(probe(spec))
                adder.join()
                m["add_s"].append(time.perf_counter() - t)
                m["alone"] += [probe(spec) for _ in range(probes_alone)]
                log(
                    f"  {mode}: add {m['add_s'][-1]:.1f} s, {len(m['during'])} probes during adds so far; "
                    f"load {os.getloadavg()[0]:.1f}"
                )
    med = statistics.median
    for m in res["modes"].values():
        al, du = m.pop("alone"), m.pop("during")
        m.update(
            {
                "probes_alone": len(al),
                "probes_during_add": len(du),
                "list_alone_ms": med(a for a, _, _ in al) * 1e3,
                "list_during_add_ms": med(a for a, _, _ in du) * 1e3,
                "list_during_add_max_ms": max(a for a, _, _ in du) * 1e3,
                "generate_alone_ms": med(g for _, g, _ in al) * 1e3,
                "generate_alone_max_ms": max(g for _, g, _ in al) * 1e3,
                "generate_during_add_ms": med(g for _, g, _ in du) * 1e3,
                "generate_during_add_max_ms": max(g for _, g, _ in du) * 1e3,
                "generate_cpu_alone_ms": med(c for _, _, c in al) * 1e3,
                "generate_cpu_during_add_ms": med(c for _, _, c in du) * 1e3,
            }
        )
    res["load_average_end"] = os.getloadavg()[0]
    return res


def bench_add_cost(tokenizer, texts: list[tuple[str, str]], sizes: list[int], adds: int, log=print) -> dict:
    """``DocumentIndex.add_documents`` of one new small document (what ``SuffixSpec.add_documents``, ``POST
    /v1/index/documents`` and ``index add`` of one file run) into stores already holding ``sizes`` documents
    (compacted, as a corpus is after its first add), the stores interleaved add by add; CPU time
    (``time.process_time``) and wall time per add, medians. Beside them: reading every document's (path,
    hash), which SuffixSpec.add_documents did on every add before (what it would cost now)."""
    from suffixspec.index import DocumentIndex

    pool = small_documents(texts, max(sizes))
    res: dict = {"sizes": {}, "adds": adds}
    with tempfile.TemporaryDirectory() as d:
        indexes = {}
        for n in sizes:
            t = time.perf_counter()
            index = indexes[n] = DocumentIndex(Path(d) / f"{n}.db", tokenizer=tokenizer, nice=0)
            index.add_documents(pool[:n])
            index.merge(compact=True)
            log(
                f"  add: {n} documents stored in {time.perf_counter() - t:.1f} s; load {os.getloadavg()[0]:.1f}"
            )
            res["sizes"][n] = {
                "cpu_ms": [],
                "wall_ms": [],
                "segments": len(index.store.segment_infos(index.store.fingerprint(tokenizer))),
            }
        for k in range(adds + 1):  # the first round warms caches up: not counted
            for n, index in indexes.items():
                doc = {"text": f"def added_{k}(x):\n    return x * {k} + {n}\n", "source": f"added/{k}.py"}
                c, t = time.process_time(), time.perf_counter()
                (rec,) = index.add_documents([doc])
                wall, cpu = time.perf_counter() - t, time.process_time() - c
                assert rec["status"] == "added"
                if k:
                    res["sizes"][n]["cpu_ms"].append(cpu * 1e3)
                    res["sizes"][n]["wall_ms"].append(wall * 1e3)
        for n, index in indexes.items():
            db = index.store.db
            t = time.perf_counter()
            for _ in range(3):
                db.execute("SELECT path, content_hash FROM documents").fetchall()
            res["sizes"][n]["read_every_row_ms"] = (time.perf_counter() - t) / 3 * 1e3
            index.close()
    for v in res["sizes"].values():
        cpu, wall = v.pop("cpu_ms"), v.pop("wall_ms")
        v.update(
            {
                "cpu_ms_median": statistics.median(cpu),
                "wall_ms_median": statistics.median(wall),
                "wall_ms_max": max(wall),
            }
        )
    lo, hi = min(sizes), max(sizes)
    res["cpu_ratio"] = res["sizes"][hi]["cpu_ms_median"] / res["sizes"][lo]["cpu_ms_median"]
    res["load_average_end"] = os.getloadavg()[0]
    return res


def build_busy_index(model: str, workdir: Path, corpus_bytes: int, log=print) -> Path:
    """``workdir/busy.db``: about ``corpus_bytes`` of source text indexed for ``model``'s tokenizer and
    compacted, the model recorded as served (built once; run it niced on a shared machine)."""
    from suffixspec.index import DocumentIndex
    from suffixspec.loading import load_tokenizer

    db = workdir / "busy.db"
    if not db.exists():
        t = time.perf_counter()
        tokenizer = load_tokenizer(model)
        with DocumentIndex(db, tokenizer=tokenizer, model=model, nice=0) as index:
            index.serve(tokenizer, model)  # as a server of the model does: `index add` then defaults to it
            index.store.add_documents(
                stream_docs(source_files(), int(corpus_bytes / 3.6)), tokenizer
            )  # streamed
            index.merge(compact=True)
        log(f"  busy-add: {corpus_bytes / 1e6:.0f} MB indexed in {time.perf_counter() - t:.0f} s")
    return db


def bench_busy_add(
    model: str, workdir: Path, corpus_bytes: int, rounds: int, main_root: str | None = None, log=print
) -> dict:
    """``suffixspec index add`` of one small new file and ``suffixspec index stats`` on a store of about
    ``corpus_bytes`` of text (indexed for ``model``'s tokenizer first, kept in ``workdir``), each run as a
    fresh process, alternating, while another process generates with ``model`` (one torch thread, greedy,
    back to back, in a session of its own as a server in another terminal). Wall time of each command; the add's excess over stats is what a user waits for the
    add itself. With ``main_root``: the same add by that checkout's code, interleaved."""

    from suffixspec.index import DocumentIndex

    db = build_busy_index(model, workdir, corpus_bytes, log)
    with DocumentIndex(db) as index:
        st = index.stats()
    res: dict = {
        "documents": st["documents"],
        "document_bytes": st["document_bytes"],
        "tokens": st["tokens"],
        "segments": st["segments"],
        "rounds": rounds,
        "stats_s": [],
        "add_s": [],
        "main_add_s": [],
    }
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT), "TOKENIZERS_PARALLELISM": "true"}
    # in a session of its own, as a server started from another terminal: its own scheduler autogroup
    gen = subprocess.Popen(
        [sys.executable, "-c", GENERATOR, model],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert gen.stdout.readline().strip() == "generating"
        time.sleep(5)  # the first generation is under way (past its prefill)

        def timed_cli(args: list[str], root: str | None = None) -> tuple[float, float]:
            """(wall, CPU) seconds of ``suffixspec index ARGS`` run from ``root``'s code (default: this one),
            started in ``workdir`` so that no checkout is on its path but the one named."""
            argv = ["index", *args, "--db", str(db)]
            cmd = command(root, "suffixspec", *argv) if root else [sys.executable, "-m", "suffixspec", *argv]
            cpu = children_cpu()
            t = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)
            wall = time.perf_counter() - t
            assert out.returncode == 0, out.stderr[-2000:]
            return wall, children_cpu() - cpu

        for k in range(rounds):
            res["stats_s"].append(timed_cli(["stats"]))
            note = workdir / f"note-{time.time_ns()}.md"
            note.write_text(f"# note {k}\n\nA small file added while a generation runs.\n")
            res["add_s"].append(timed_cli(["add", str(note), "-q"]))
            if main_root:
                note = workdir / f"note-{time.time_ns()}.md"
                note.write_text(f"# note {k}, main\n\nA small file added while a generation runs.\n")
                res["main_add_s"].append(timed_cli(["add", str(note), "-q", "--tokenizer", model], main_root))
            log(
                f"  busy-add round {k}: stats {res['stats_s'][-1][0]:.2f} s ({res['stats_s'][-1][1]:.2f} CPU), "
                f"add {res['add_s'][-1][0]:.2f} s ({res['add_s'][-1][1]:.2f} CPU)"
                + (
                    f", main's add {res['main_add_s'][-1][0]:.2f} s ({res['main_add_s'][-1][1]:.2f} CPU)"
                    if main_root
                    else ""
                )
                + f"; load {os.getloadavg()[0]:.1f}"
            )
        assert gen.poll() is None, "the generation stopped"
    finally:
        gen.kill()
        gen.wait()
    med = statistics.median
    res["excess_s"] = [a[0] - s[0] for a, s in zip(res["add_s"], res["stats_s"], strict=True)]
    res["excess_cpu_s"] = [a[1] - s[1] for a, s in zip(res["add_s"], res["stats_s"], strict=True)]
    res.update(
        {
            "stats_median_s": med(w for w, _ in res["stats_s"]),
            "add_median_s": med(w for w, _ in res["add_s"]),
            "stats_cpu_median_s": med(c for _, c in res["stats_s"]),
            "add_cpu_median_s": med(c for _, c in res["add_s"]),
            "excess_median_s": med(res["excess_s"]),
            "excess_max_s": max(res["excess_s"]),
            "excess_cpu_median_s": med(res["excess_cpu_s"]),
            "load_average_end": os.getloadavg()[0],
        }
    )
    if res["main_add_s"]:
        res["main_add_median_s"] = med(w for w, _ in res["main_add_s"])
        res["main_add_cpu_median_s"] = med(c for _, c in res["main_add_s"])
    return res
