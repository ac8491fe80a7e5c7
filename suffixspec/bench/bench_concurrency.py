"""Concurrent clients against real ``suffixspec serve`` processes on loopback: batching on and off.

Two servers of the same model run side by side: ``--max-num-seqs N`` (batching) and
``--max-num-seqs 1`` (one request at a time); optionally a third, ``--max-num-seqs 1`` from another
checkout (``--before DIR``: the code before a change, for "one client alone is no slower"; with
``--before-max-num-seqs N`` it batches too, for a change to batching itself). For each
client count every server gets the same round, taking turns (the order rotates per round): every
client sends its requests one after the other (greedy, code-edit and agentic requests alternating,
from ``suffixspec.bench.workloads``), all clients start together. History is off (the requests' drafters
exclude it, so earlier answers do not turn later rounds into copies). Reported per round and
server: output tokens per second (wall), tokens per server CPU-second (steadier on a shared
machine), p50/p90 latency, mean rows per pass (``/metrics``); and whether every output equals the
same request served alone (the ``--max-num-seqs 1`` server runs each request alone).

    python -m suffixspec.bench.bench_concurrency --model smollm2-135m-instruct \\
        --clients 1,8 --max-num-seqs 8 --per-client 2 --max-tokens 96 --torch-threads 1

Each round uses fresh requests. Writes ``concurrency.json`` and ``concurrency.md`` (and a plot
unless ``--no-plot``) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from suffixspec.bench.checkout import command
from suffixspec.bench.processes import ServerProcess, free_port

DRAFTERS_NO_HISTORY = ["prompt", "documents", "references", "draft_model"]


class Server(ServerProcess):
    """A ``suffixspec serve`` subprocess on 127.0.0.1 with a private document store."""

    def __init__(
        self,
        name: str,
        model: str,
        draft_model: str,
        max_num_seqs: int,
        workdir: Path,
        torch_threads: int | None,
        code: str | None = None,
        threads: int = 40,
    ) -> None:
        self.name = name
        self.max_num_seqs = max_num_seqs
        port = free_port()
        # waitress' threads: --http-threads since torch's took the name --threads (older checkouts: --threads)
        serve = (
            command(code, "suffixspec", "serve")
            if code is not None
            else [sys.executable, "-m", "suffixspec", "serve"]
        )
        helptext = subprocess.run([*serve, "--help"], capture_output=True, text=True).stdout
        http = "--http-threads" if "--http-threads" in helptext else "--threads"
        args = [
            "--model",
            model,
            "--draft-model",
            draft_model,
            "--port",
            str(port),
            "--db",
            str(workdir / f"{name}.db"),
            "--max-num-seqs",
            str(max_num_seqs),
            http,
            str(threads),
            "--max-queue",
            "256",
        ]
        # another checkout's code, every part of it (checkout.py), or this one's
        cmd = [*serve, *args]
        env = dict(os.environ)
        if torch_threads:
            env["OMP_NUM_THREADS"] = str(torch_threads)
        super().__init__(cmd, port, workdir / f"serve-{name}.log", env, timeout_s=600)

    def complete(self, body: dict) -> dict:
        return self.post("/v1/completions", body)[0]

    def passes(self) -> tuple[float, float, float, float]:
        """(decode passes, requests summed over them, CPU seconds of passes that fed prompt tokens, CPU
        seconds of passes that only decoded) so far, from /metrics."""
        _, text = self.get("/metrics")
        got = dict.fromkeys(
            (
                "suffixspec_batch_size_count",
                "suffixspec_batch_size_sum",
                'suffixspec_pass_cpu_seconds_total{kind="prompt"}',
                'suffixspec_pass_cpu_seconds_total{kind="decode"}',
            ),
            0.0,
        )
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name in got:
                got[name] = float(value)
        return tuple(got.values())  # type: ignore[return-value]

    def cpu_seconds(self) -> float:
        """CPU time the server process has used (all its threads), from /proc: on a shared, loaded
        machine the CPU work per token is steadier than wall time."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def requests_pool(model: str, n: int, max_tokens: int) -> list[dict]:
    """``n`` completion bodies, code-edit and agentic requests alternating (greedy, history off)."""
    from suffixspec.bench.workloads import build
    from suffixspec.loading import load_tokenizer

    tok = load_tokenizer(model)
    if not getattr(tok, "chat_template", None):  # a base model (Gemma 3 270M): the requests as plain text
        tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    # one code edit per source file (build draws a different file for each: over a hundred files of
    # CODE_PACKAGES have a function to rename), four agentic turns per session
    edits, _ = build("code_edit", tok, (n + 1) // 2, max_tokens)
    agent, _ = build("agentic", tok, n // 2 + 1, max_tokens)
    if len(edits) < (n + 1) // 2 or len(agent) < n // 2:
        raise RuntimeError(
            f"the workloads make {len(edits)} code edits and {len(agent)} agentic turns; "
            f"{n} requests need {(n + 1) // 2} and {n // 2} (fewer --clients or --per-client)"
        )
    pool = []
    for i in range(n):
        r = edits[i // 2] if i % 2 == 0 else agent[i // 2]
        pool.append(
            {
                "prompt": r.prompt,
                "max_tokens": r.max_tokens,
                "temperature": 0,
                "speculation": {"drafters": DRAFTERS_NO_HISTORY},
            }
        )
    return pool


def run_round(server: Server, bodies: list[list[dict]]) -> dict:
    """Every client (one list of bodies each) sends its requests in turn; all start together."""
    start = threading.Barrier(len(bodies) + 1)
    results: list[list[tuple[float, dict]]] = [[] for _ in bodies]
    errors: list[BaseException] = []

    def client(i: int) -> None:
        start.wait()
        try:
            for body in bodies[i]:
                t = time.perf_counter()
                out = server.complete(body)
                results[i].append((time.perf_counter() - t, out))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    passes0 = server.passes()
    cpu0 = server.cpu_seconds()
    load0 = os.getloadavg()[0]
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    cpu = server.cpu_seconds() - cpu0
    passes1 = server.passes()
    lat = sorted(s for r in results for s, _ in r)
    outs = [out for r in results for _, out in r]
    tokens = sum(o["usage"]["completion_tokens"] for o in outs)
    n_pass = passes1[0] - passes0[0]
    prompt_cpu, decode_cpu = passes1[2] - passes0[2], passes1[3] - passes0[3]
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens": tokens,
        "tok_s": tokens / wall,
        # where the passes' CPU time went: passes that fed prompts (prefills; batched, a decode pass a
        # joining prompt rode in) against passes that only decoded
        "prompt_pass_cpu_s": prompt_cpu,
        "decode_pass_cpu_s": decode_cpu,
        "tok_per_cpu_s": tokens / cpu if cpu else 0.0,
        "p50_s": statistics.median(lat),
        "p90_s": lat[min(len(lat) - 1, int(0.9 * len(lat)))],
        "mean_batch": (passes1[1] - passes0[1]) / n_pass if n_pass else 0.0,
        "load_avg": round((load0 + os.getloadavg()[0]) / 2, 2),
        "texts": [o["choices"][0]["text"] for o in outs],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="suffixspec/demo-target", help="target model (a folder, a name)")
    ap.add_argument("--draft-model", default="none")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument(
        "--per-client", type=int, default=2, help="requests each client sends, one after the other"
    )
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS of the servers (0: none, suffixspec's own measured choice)",
    )
    ap.add_argument(
        "--before", default=None, help="a checkout whose code serves a third --max-num-seqs 1 server"
    )
    ap.add_argument(
        "--before-max-num-seqs",
        type=int,
        default=1,
        help="that server's --max-num-seqs (as --max-num-seqs: a change to batching itself, A/B per round)",
    )
    ap.add_argument("--out", default="suffixspec/bench/published")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument(
        "--replot", action="store_true", help="redraw the table and plot from --out's concurrency.json"
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.replot:
        meta = json.loads((out / "concurrency.json").read_text())
        plot(meta["rows"], meta["max_num_seqs"], out / "concurrency.png", meta.get("model", ""))
        (out / "concurrency.md").write_text(table(meta["rows"], meta["max_num_seqs"]))
        return
    counts = [int(c) for c in args.clients.split(",")]
    pool = requests_pool(args.model, sum(counts) * args.per_client + 1, args.max_tokens)
    workdir = Path(tempfile.mkdtemp(prefix="suffixspec-bench-concurrency-"))
    specs = [("batched", args.max_num_seqs, None), ("one_at_a_time", 1, None)]
    if args.before:
        specs.append(("before", args.before_max_num_seqs, args.before))
    servers: dict[str, Server] = {}
    rows = []
    try:
        for name, seqs, code in specs:
            servers[name] = Server(
                name, args.model, args.draft_model, seqs, workdir, args.torch_threads or None, code
            )
        for s in servers.values():  # warm-up: load, first pass, cost estimates
            s.complete(pool[-1])
        used = 0
        for k, clients in enumerate(counts):
            bodies = [
                pool[used + i * args.per_client : used + (i + 1) * args.per_client] for i in range(clients)
            ]
            used += clients * args.per_client
            names = list(servers)
            order = names[k % len(names) :] + names[: k % len(names)]
            res = {name: run_round(servers[name], bodies) for name in order}
            ref = res["one_at_a_time"]["texts"]
            row = {
                "clients": clients,
                "requests": clients * args.per_client,
                "identical": all(r["texts"] == ref for r in res.values()),
                "order": order,
                **{
                    f"{name}_{key}": round(v, 4)
                    for name, r in res.items()
                    for key, v in r.items()
                    if key != "texts"
                },
            }
            row["throughput_ratio"] = round(res["batched"]["tok_s"] / res["one_at_a_time"]["tok_s"], 3)
            row["p50_ratio"] = round(res["batched"]["p50_s"] / res["one_at_a_time"]["p50_s"], 3)
            row["cpu_ratio"] = round(
                res["batched"]["tok_per_cpu_s"] / res["one_at_a_time"]["tok_per_cpu_s"], 3
            )
            if res["batched"]["decode_pass_cpu_s"]:  # decoding alone: what batching can share
                row["decode_cpu_ratio"] = round(
                    res["one_at_a_time"]["decode_pass_cpu_s"] / res["batched"]["decode_pass_cpu_s"], 3
                )
            if "before" in res:  # this code's server of the same --max-num-seqs over the checkout's
                same = "batched" if args.before_max_num_seqs == args.max_num_seqs else "one_at_a_time"
                row["before_cpu_ratio"] = round(
                    res[same]["tok_per_cpu_s"] / res["before"]["tok_per_cpu_s"], 3
                )
                row["before_wall_ratio"] = round(res[same]["tok_s"] / res["before"]["tok_s"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        for s in servers.values():
            s.stop()
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "model": args.model,
        "draft_model": args.draft_model,
        "max_num_seqs": args.max_num_seqs,
        "per_client": args.per_client,
        "max_tokens": args.max_tokens,
        "torch_threads": args.torch_threads,
        "before": args.before,
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    (out / "concurrency.json").write_text(json.dumps(meta, indent=1))
    (out / "concurrency.md").write_text(table(rows, args.max_num_seqs))
    if not args.no_plot:
        plot(rows, args.max_num_seqs, out / "concurrency.png", args.model)
    print(table(rows, args.max_num_seqs))


def table(rows: list[dict], n: int) -> str:
    lines = [
        f"| clients | tok/s batched (N={n}) | tok/s one at a time | ratio | tokens per CPU-s ratio "
        "| decode passes' CPU ratio | prompt passes' CPU share (batched / one at a time) "
        "| p50 s batched | p50 s one at a time | mean batch | identical | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def share(r: dict, name: str) -> str:
        prompt, decode = r.get(f"{name}_prompt_pass_cpu_s"), r.get(f"{name}_decode_pass_cpu_s")
        return f"{prompt / (prompt + decode):.0%}" if prompt is not None and prompt + decode else "-"

    for r in rows:
        decode = f"{r['decode_cpu_ratio']:.2f}x" if "decode_cpu_ratio" in r else "-"
        lines.append(
            f"| {r['clients']} | {r['batched_tok_s']:.1f} | {r['one_at_a_time_tok_s']:.1f} | "
            f"{r['throughput_ratio']:.2f}x | {r['cpu_ratio']:.2f}x | {decode} | "
            f"{share(r, 'batched')} / {share(r, 'one_at_a_time')} | {r['batched_p50_s']:.1f} | "
            f"{r['one_at_a_time_p50_s']:.1f} | {r['batched_mean_batch']:.1f} | "
            f"{'yes' if r['identical'] else 'NO'} | {r['batched_load_avg']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], n: int, path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["clients"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    panels = (
        ("tok_s", "output tokens / s (all clients)"),
        ("tok_per_cpu_s", "output tokens per server CPU-second"),
        ("p50_s", "p50 request latency (s)"),
    )
    for ax, (key, label) in zip(axes, panels, strict=True):
        ax.plot(x, [r[f"batched_{key}"] for r in rows], "o-", label=f"--max-num-seqs {n}")
        ax.plot(x, [r[f"one_at_a_time_{key}"] for r in rows], "s--", label="--max-num-seqs 1")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(f"suffixspec serve, {Path(model).name}, greedy code-edit + agentic requests (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
