"""The tables ``python -m suffixspec.bench.bench_index`` prints: one per section that ran."""

from __future__ import annotations

import statistics

# ArcticInference 0.3.0 on the micro section's corpus (depth 64), measured on a 2-core machine: printed
# for comparison when it is not installed here
PEERS = {
    "append_us_per_token": "1.1-1.5",
    "speculate_us_per_call": 92.0,
    "speculate_us_per_drafted_token": 5.8,
    "mean_draft_tokens": 15.9,
    "bytes_per_token": 360.0,
}


def fmt(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def report(results: dict) -> None:
    m = results.get("micro")
    if m:
        a = m.get("arctic")
        print(f"\n== micro: {m['tokens']:,} tokens of stdlib source, depth 64, contexts of 64 tokens ==")
        rows = [
            (
                "append, 1 token per call (us/token)",
                m["incremental_append_us_per_token"],
                "append_us_per_token",
            ),
            (
                "append, runs of 16 (us/token)",
                m["incremental_extend16_us_per_token"],
                "extend16_us_per_token",
            ),
            (
                "speculate path (us/call)",
                m["incremental_path_speculate_us_per_call"],
                "path_speculate_us_per_call",
            ),
            (
                "speculate path (us/drafted token)",
                m["incremental_path_us_per_drafted_token"],
                "path_us_per_drafted_token",
            ),
            (
                "speculate path (mean draft tokens)",
                m["incremental_path_mean_draft_tokens"],
                "path_mean_draft_tokens",
            ),
            (
                "speculate tree (us/call)",
                m["incremental_tree_speculate_us_per_call"],
                "tree_speculate_us_per_call",
            ),
            (
                "speculate tree (us/drafted token)",
                m["incremental_tree_us_per_drafted_token"],
                "tree_us_per_drafted_token",
            ),
            (
                "speculate tree (mean draft tokens)",
                m["incremental_tree_mean_draft_tokens"],
                "tree_mean_draft_tokens",
            ),
            ("bytes per indexed token", m["incremental_bytes_per_token"], "bytes_per_token"),
        ]
        sa_keys = {
            "speculate path (us/call)": "suffix_array_path_speculate_us_per_call",
            "speculate path (us/drafted token)": "suffix_array_path_us_per_drafted_token",
            "speculate path (mean draft tokens)": "suffix_array_path_mean_draft_tokens",
            "speculate tree (us/call)": "suffix_array_tree_speculate_us_per_call",
            "speculate tree (us/drafted token)": "suffix_array_tree_us_per_drafted_token",
            "speculate tree (mean draft tokens)": "suffix_array_tree_mean_draft_tokens",
            "bytes per indexed token": "suffix_array_bytes_per_token",
        }
        print(f"{'':40s} {'incremental':>12s} {'suffix array':>13s} {'arctic C++':>11s}")
        for label, mine, akey in rows:
            sa_v = m.get(sa_keys.get(label, ""), None)
            av = a.get(akey) if isinstance(a, dict) else None
            print(
                f"{label:40s} {fmt(mine):>12s} {fmt(sa_v) if sa_v is not None else '-':>13s} "
                f"{fmt(av) if av is not None else '-':>11s}"
            )
        if not isinstance(a, dict):
            print(f"ArcticInference: {a or 'not installed'}; its figures on a 2-core machine: {PEERS}")
    c = results.get("corpus")
    if c:
        print(f"\n== corpus: {c['tokens']:,} tokens in {c['documents']} files ==")
        for k in (
            "tokenize_s",
            "index_add_s",
            "other_writer_max_wait_s",
            "suffix_array_build_s",
            "load_s",
            "lookup_median_us",
            "lookup_p90_us",
            "lookup_mean_match_len",
            "speculate_tree_median_us",
            "memory_bytes_per_token",
            "arrays_bytes_per_token",
            "bytes_on_disk_per_token",
        ):
            print(f"{k:32s} {fmt(c[k])}")
    h = results.get("history")
    if h:
        print(
            f"\n== history: {h['requests']} templated requests, {h['output_tokens_per_request']:.0f} output tokens each =="
        )
        for k, v in h["mean_accepted_length_by_request"].items():
            print(f"mean accepted length, {k:18s} {v:.2f}")


def report_concurrent(c: dict) -> None:
    print(
        f"\n== concurrent: listing and a 16-token generation alone / while {c['add_chars'] / 1e6:.1f} MB are added "
        f"(medians; max = worst probe; load average at the end {c['load_average_end']:.1f}) =="
    )
    print(
        f"{'add runs':16s} {'add s':>7s} {'probes':>7s} {'list alone':>11s} {'during':>8s} {'max':>7s} "
        f"{'gen alone':>10s} {'max':>7s} {'during':>8s} {'max':>7s} {'gen CPU alone':>14s} {'during':>8s}"
    )
    for mode, m in c["modes"].items():
        print(
            f"{mode:16s} {statistics.median(m['add_s']):7.1f} {m['probes_during_add']:7d} "
            f"{m['list_alone_ms']:9.2f}ms {m['list_during_add_ms']:6.2f}ms {m['list_during_add_max_ms']:5.1f}ms "
            f"{m['generate_alone_ms']:8.1f}ms {m['generate_alone_max_ms']:5.0f}ms "
            f"{m['generate_during_add_ms']:6.1f}ms {m['generate_during_add_max_ms']:5.0f}ms "
            f"{m['generate_cpu_alone_ms']:12.1f}ms {m['generate_cpu_during_add_ms']:6.1f}ms"
        )


def report_add_cost(r: dict) -> None:
    print(
        f"\n== add: one small document added to a store of N documents ({r['adds']} adds each, interleaved; "
        f"medians; load average at the end {r['load_average_end']:.1f}) =="
    )
    print(
        f"{'documents':>10s} {'segments':>9s} {'CPU ms':>8s} {'wall ms':>8s} {'wall max':>9s} "
        f"{'reading every row (before) ms':>30s}"
    )
    for n, v in r["sizes"].items():
        print(
            f"{n:>10,d} {v['segments']:>9d} {v['cpu_ms_median']:>8.1f} {v['wall_ms_median']:>8.1f} "
            f"{v['wall_ms_max']:>9.1f} {v['read_every_row_ms']:>30.1f}"
        )
    print(f"CPU time per add, largest / smallest store: {r['cpu_ratio']:.2f}")


def report_busy_add(r: dict) -> None:
    print(
        f"\n== busy-add: `index add` of one small file vs `index stats`, {r['document_bytes'] / 1e6:.0f} MB indexed "
        f"({r['documents']:,} documents, {r['tokens']:,} tokens, {r['segments']} segments), a generation running in "
        f"another process; {r['rounds']} rounds; load average at the end {r['load_average_end']:.1f} =="
    )
    print(
        f"index stats {r['stats_median_s']:.2f} s ({r['stats_cpu_median_s']:.2f} s CPU), index add "
        f"{r['add_median_s']:.2f} s ({r['add_cpu_median_s']:.2f} s CPU), medians; the add's excess: median "
        f"{r['excess_median_s']:.2f} s ({r['excess_cpu_median_s']:.2f} s CPU), worst {r['excess_max_s']:.2f} s"
        + (
            f"; main's index add {r['main_add_median_s']:.2f} s ({r['main_add_cpu_median_s']:.2f} s CPU)"
            if "main_add_median_s" in r
            else ""
        )
    )
