"""Benchmark of the suffix index (suffixspec/index/): append, speculate, memory, corpora up to 200M tokens, history growth.

The command line of ``python -m suffixspec.bench.bench_index``: which sections run (the package docstring
says what each measures), in this process, then their tables and, with ``--json``, their results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from suffixspec.bench.bench_index.corpus import get_tokenizer, load_texts, tokenize
from suffixspec.bench.bench_index.lookups import (
    bench_corpus,
    bench_history,
    bench_lookup_vs_main,
    bench_micro,
    bench_retrieval,
)
from suffixspec.bench.bench_index.report import report, report_add_cost, report_busy_add, report_concurrent
from suffixspec.bench.bench_index.scale import bench_reopen, bench_scale
from suffixspec.bench.bench_index.writes import (
    CONCURRENT_MODES,
    bench_add_cost,
    bench_busy_add,
    bench_concurrent,
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m suffixspec.bench.bench_index", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--tokens", type=int, default=5_000_000, help="corpus size for the corpus section")
    ap.add_argument("--micro-tokens", type=int, default=311_000, help="tokens for the micro section")
    ap.add_argument("--contexts", type=int, default=2000, help="speculate / lookup calls measured")
    ap.add_argument("--requests", type=int, default=100, help="requests in the history section")
    ap.add_argument(
        "--tokenizer", default=None, help="tokenizer name or path (default: demo-target or a trained BPE)"
    )
    ap.add_argument(
        "--arctic-python",
        default=None,
        help="python of an environment with arctic-inference installed (micro: compare with it)",
    )
    ap.add_argument(
        "--sections",
        default="micro,corpus,history",
        help="comma-separated: micro, corpus, history, lookup (segments vs main's array at --tokens), "
        "concurrent (listing and generation during an add of ~--tokens tokens), "
        "reopen (merges, lookups, add/delete one on the database of a scale run in --workdir), "
        "retrieval (the documents' draft lookup per decoding step on --db or --workdir's database: "
        "median and p99, along held-out and copied text), "
        "add (one small document added beside --add-sizes documents), "
        "busy-add (index add of one file vs index stats on a --busy-bytes index while another "
        "process generates; --workdir keeps the index), "
        "scale (streamed add up to --scale-tokens; run alone, niced, in the background)",
    )
    ap.add_argument(
        "--scale-tokens",
        default="25000000,50000000,100000000,200000000",
        help="cumulative stages of the scale section",
    )
    ap.add_argument(
        "--main-root",
        default=None,
        help="checkout of the code to compare with (lookup: its single suffix array; reopen: its segments)",
    )
    ap.add_argument(
        "--compact", action="store_true", help="reopen: also compact (in a child process) and time both"
    )
    ap.add_argument(
        "--workdir", default=None, help="where the scale section keeps its database (default: a temp dir)"
    )
    ap.add_argument(
        "--db", default=None, help="retrieval: the store to look up (default: --workdir's scale.db)"
    )
    ap.add_argument("--rounds", type=int, default=1, help="concurrent: adds per mode (interleaved)")
    ap.add_argument(
        "--modes",
        default=",".join(CONCURRENT_MODES),
        help="concurrent: where the add runs: thread (in this process, as before), process-nice0 "
        "(a writer process at this priority), process-nice19, process (SuffixSpec.add_documents: "
        "SCHED_IDLE, nice 19)",
    )
    ap.add_argument("--add-sizes", default="100,20000", help="add: documents already stored, per store")
    ap.add_argument(
        "--adds", type=int, default=15, help="add: small documents added to each store (interleaved)"
    )
    ap.add_argument(
        "--busy-model",
        default="smollm2-135m-instruct",
        help="busy-add: the model the index is for and the other process generates with",
    )
    ap.add_argument("--busy-bytes", type=int, default=100_000_000, help="busy-add: text indexed first")
    ap.add_argument("--compare-main", action="store_true", help="busy-add: also time --main-root's index add")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    t = time.perf_counter()
    texts = load_texts()
    tokenizer, tok_name = get_tokenizer(args.tokenizer, texts)
    print(
        f"tokenizer: {tok_name}; {len(texts)} stdlib files; cores: {os.cpu_count()}; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results: dict = {"tokenizer": tok_name, "load_average": os.getloadavg()[0]}
    if "micro" in sections:
        seqs = tokenize(tokenizer, texts, args.micro_tokens)
        results["micro"] = bench_micro(seqs, args.contexts, args.arctic_python)
    if "corpus" in sections:
        results["corpus"] = bench_corpus(tokenizer, texts, args.tokens, args.contexts)
    if "history" in sections:
        results["history"] = bench_history(tokenizer, args.requests)
    if "lookup" in sections:
        results["lookup"] = bench_lookup_vs_main(tokenizer, texts, args.tokens, args.contexts, args.main_root)
        print(json.dumps(results["lookup"]), flush=True)
    if "retrieval" in sections:
        db = Path(args.db) if args.db else Path(args.workdir) / "scale.db"
        results["retrieval"] = bench_retrieval(
            tokenizer, db, args.contexts, log=lambda s: print(s, flush=True)
        )
    if "reopen" in sections:
        results["reopen"] = bench_reopen(
            tokenizer, Path(args.workdir), args.contexts, main_root=args.main_root, compact=args.compact
        )
        print(json.dumps(results["reopen"]), flush=True)
    if "concurrent" in sections:
        modes = tuple(args.modes.split(","))
        results["concurrent"] = bench_concurrent(
            texts, args.tokens * 3, rounds=args.rounds, modes=modes, log=lambda s: print(s, flush=True)
        )
        report_concurrent(results["concurrent"])
    if "add" in sections:
        results["add"] = bench_add_cost(
            tokenizer,
            texts,
            [int(x) for x in args.add_sizes.split(",")],
            args.adds,
            log=lambda s: print(s, flush=True),
        )
        report_add_cost(results["add"])
    if "busy-add" in sections:
        workdir = Path(args.workdir or tempfile.mkdtemp(prefix="busy-add-"))
        workdir.mkdir(parents=True, exist_ok=True)
        results["busy_add"] = bench_busy_add(
            args.busy_model,
            workdir,
            args.busy_bytes,
            max(args.rounds, 5),
            main_root=args.main_root if args.compare_main else None,
            log=lambda s: print(s, flush=True),
        )
        report_busy_add(results["busy_add"])
    if "scale" in sections:
        stages = [int(x) for x in args.scale_tokens.split(",")]
        if args.workdir:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
            results["scale"] = bench_scale(
                tokenizer, stages, args.contexts, Path(args.workdir), log=lambda s: print(s, flush=True)
            )
        else:
            with tempfile.TemporaryDirectory() as d:
                results["scale"] = bench_scale(
                    tokenizer, stages, args.contexts, Path(d), log=lambda s: print(s, flush=True)
                )
    results["wall_s"] = time.perf_counter() - t
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
