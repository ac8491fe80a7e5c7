"""The results of ``suffixspec bench``: the rows (per workload and system, over all requests and over those
whose plain output does not loop; ours against the best baseline, llama.cpp against its own plain), the
Markdown tables, the speedup plot, and rows merged into a ``results.json`` that holds other models' rows."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from suffixspec.bench.loops import distinct_ngrams, loop_share, loops
from suffixspec.bench.systems import BASELINES, SESSION_SYSTEMS, Run, baseline


def summarize_sessions(
    runs: dict[str, list[Run]], restart: int, model: str, meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """Rows of ``agent_sessions`` (every request, the systems without a restart) and of
    ``agent_sessions_after_restart`` (the requests after it, every system); ours with its speed against
    ArcticInference in the same state (``best_baseline``: restarted or not), ``vs_best_baseline_median``:
    the median over requests of its time over ours."""
    plain = runs["hf_plain"]
    rows = []
    subsets = {
        "agent_sessions": (0, ("hf_plain", "ours_history", "arctic_suffix_best")),
        "agent_sessions_after_restart": (restart, SESSION_SYSTEMS),
    }
    for workload, (start, systems) in subsets.items():
        keep = [True] * (len(plain) - start)
        for system in (s for s in systems if s in runs):
            rs = runs[system][len(runs[system]) - len(keep) :]
            row = {
                "model": model,
                "workload": workload,
                "system": system,
                **summarize_system(plain[start:], rs, keep),
            }
            peer = system.replace("ours_history", "arctic_suffix_best")
            if (
                system.startswith("ours") and peer in runs
            ):  # the best-baseline column: Arctic in the same state
                theirs = runs[peer][len(runs[peer]) - len(keep) :]
                row["best_baseline"] = peer
                row["vs_best_baseline_median"] = _median(
                    [t.seconds / r.seconds for t, r in zip(theirs, rs, strict=True)]
                )
                row["vs_best_baseline_cpu_median"] = _median(
                    [t.cpu_s / r.cpu_s for t, r in zip(theirs, rs, strict=True)]
                )
            rows.append(row | {"no_loop": {"requests": 0}} | meta | {"history": True})
    return rows


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def summarize_system(plain: list[Run], rs: list[Run], keep: list[bool]) -> dict[str, Any]:
    """One row's figures over the requests with ``keep`` (all, or those whose plain output does not loop)."""
    pairs = [(p, r) for p, r, k in zip(plain, rs, keep, strict=True) if k]
    if not pairs:
        return {"requests": 0}
    tokens = sum(len(r.tokens) for _, r in pairs)
    speedups = [p.seconds / r.seconds for p, r in pairs]
    row: dict[str, Any] = {
        "requests": len(pairs),
        "tokens": tokens,
        "tokens_per_s": round(tokens / max(1e-9, sum(r.seconds for _, r in pairs)), 2),
        "speedup_median": _median(speedups),
        "speedup_min": round(min(speedups), 3),
        "speedup_max": round(max(speedups), 3),
        "cpu_speedup_median": _median([p.cpu_s / r.cpu_s for p, r in pairs if r.cpu_s > 0]),
        "identical": all(p.tokens == r.tokens for p, r in pairs),
        "loop_share": round(statistics.mean(loop_share(r.tokens) for _, r in pairs), 3),
        "distinct_4grams": round(statistics.mean(distinct_ngrams(r.tokens) for _, r in pairs), 3),
        "looping_outputs": sum(loops(r.tokens) for _, r in pairs),
        "forward_passes": sum(r.forwards for _, r in pairs),
    }
    row["tokens_per_forward"] = round(tokens / max(1, row["forward_passes"]), 3)
    if pairs[0][1].steps is not None:
        steps = sum(r.steps for _, r in pairs)
        drafted = sum(r.stats["drafted_tokens"] for _, r in pairs)
        accepted = sum(r.stats["accepted_tokens"] for _, r in pairs)
        per_source: dict[str, dict[str, int]] = {}
        for _, r in pairs:
            for src, c in r.stats["per_source"].items():
                acc = per_source.setdefault(src, {"drafted": 0, "accepted": 0})
                acc["drafted"] += c["drafted"]
                acc["accepted"] += c["accepted"]
        row.update(
            mean_accepted_length=round(tokens / max(1, steps), 3),
            drafted_tokens=drafted,
            acceptance_rate=round(accepted / drafted, 3) if drafted else 0.0,
            drafted_per_accepted=round(drafted / accepted, 2) if accepted else None,
            acceptance_per_source={
                s: round(c["accepted"] / c["drafted"], 3) if c["drafted"] else 0.0
                for s, c in per_source.items()
            },
            propose_ms_per_step=round(
                1e3 * sum(r.stats["time_propose_s"] for _, r in pairs) / max(1, steps), 3
            ),
        )
    return row


def vs_best_baseline(
    runs: dict[str, list[Run]], keep: list[bool], system: str = "ours_all"
) -> dict[str, Any]:
    """``system``'s speed over the faster of :data:`BASELINES` on this workload (the one with the higher
    median speedup over plain on the kept requests): median over requests of its time / ours, by wall
    time and by CPU time; and (``ours_all``) over the better of ``ours_suffix`` and ``ours_draft_model``,
    its parts (a merged tree must never be slower than its best part)."""
    if system not in runs or not any(keep):
        return {}
    plain = runs[baseline(tuple(runs))]
    out: dict[str, Any] = {}

    def med(s: str) -> float:
        return statistics.median(p.cpu_s / r.cpu_s for p, r, k in zip(plain, runs[s], keep, strict=True) if k)

    def ratios(other: str) -> tuple[float | None, float | None]:
        pairs = [(b, r) for b, r, k in zip(runs[other], runs[system], keep, strict=True) if k]
        return _median([b.seconds / r.seconds for b, r in pairs]), _median(
            [b.cpu_s / r.cpu_s for b, r in pairs]
        )

    base = [b for b in BASELINES if b in runs]
    if base:
        best = max(base, key=med)
        wall, cpu = ratios(best)
        out.update(best_baseline=best, vs_best_baseline_median=wall, vs_best_baseline_cpu_median=cpu)
    parts = [p for p in ("ours_suffix", "ours_draft_model") if p in runs]
    if system == "ours_all" and parts:
        best = max(parts, key=med)
        wall, cpu = ratios(best)
        out.update(best_part=best, vs_best_part_median=wall, vs_best_part_cpu_median=cpu)
    return out


def vs_llama(runs: dict[str, list[Run]], system: str, keep: list[bool]) -> dict[str, Any]:
    """A llama.cpp system against llama.cpp plain and its prompt lookup (medians over requests of their
    time / this system's), and the share of its outputs equal to llama.cpp plain's, token for token."""
    out: dict[str, Any] = {}
    rs = [r for r, k in zip(runs[system], keep, strict=True) if k]
    for base, key in (("llama_plain", "vs_llama_plain"), ("llama_prompt_lookup", "vs_llama_prompt_lookup")):
        if base in runs and base != system and rs:
            bs = [b for b, k in zip(runs[base], keep, strict=True) if k]
            out[key + "_median"] = _median([b.seconds / r.seconds for b, r in zip(bs, rs, strict=True)])
            out[key + "_cpu_median"] = _median(
                [b.cpu_s / r.cpu_s for b, r in zip(bs, rs, strict=True) if r.cpu_s > 0]
            )
    if "llama_plain" in runs and rs:
        ref = [b for b, k in zip(runs["llama_plain"], keep, strict=True) if k]
        out["identical_share"] = round(
            sum(b.tokens == r.tokens for b, r in zip(ref, rs, strict=True)) / len(rs), 3
        )
        out["identical"] = out["identical_share"] == 1.0
    return out


def vs_system(
    runs: dict[str, list[Run]], keep: list[bool], other: str, system: str = "ours_all"
) -> dict[str, Any]:
    """``system``'s speed over ``other`` on the kept requests: medians over requests of its wall and CPU time
    over ours (``ours_all`` over ``ours_no_documents``: what the documents add)."""
    if system not in runs or other not in runs or not any(keep):
        return {}
    pairs = [(o, r) for o, r, k in zip(runs[other], runs[system], keep, strict=True) if k]
    return {
        f"vs_{other.removeprefix('ours_')}_median": _median([o.seconds / r.seconds for o, r in pairs]),
        f"vs_{other.removeprefix('ours_')}_cpu_median": _median(
            [o.cpu_s / r.cpu_s for o, r in pairs if r.cpu_s > 0]
        ),
    }


def summarize(
    all_runs: dict[str, dict[str, list[Run]]], model: str, meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """The result rows: per workload and system, over all requests and (``no_loop``) over those whose
    plain output does not loop. A llama.cpp system's ``identical`` compares with llama.cpp plain (its
    quantized arithmetic differs from the dequantized ``transformers`` model's)."""
    rows = []
    for workload, runs in all_runs.items():
        base = baseline(tuple(runs))
        plain = runs[base]
        every = [True] * len(plain)
        no_loop = [not loops(p.tokens) for p in plain]
        for system, rs in runs.items():
            row = {
                "model": model,
                "workload": workload,
                "system": system,
                "baseline": base,
                **summarize_system(plain, rs, every),
            }
            if system.startswith("ours_") and "ours_off" in runs:  # at a quantized format, the reference
                row["identical_to_ours_off"] = all(
                    o.tokens == r.tokens for o, r in zip(runs["ours_off"], rs, strict=True)
                )
            nl = summarize_system(plain, rs, no_loop)
            if system == "ours_all":
                row.update(vs_best_baseline(runs, every))
                row.update(vs_system(runs, every, "ours_no_documents"))
                nl.update(vs_best_baseline(runs, no_loop))
                nl.update(vs_system(runs, no_loop, "ours_no_documents"))
            if system.startswith("llama_"):
                row.update(vs_llama(runs, system, every))
                if nl.get("requests"):
                    nl.update(vs_llama(runs, system, no_loop))
            row["no_loop"] = nl
            rows.append(row | meta)
    return rows


def _identical(row: dict[str, Any], r: dict[str, Any]) -> str:
    """The identical column: ``yes`` (equal to the baseline's outputs); at a quantized format, where ours
    equal our own plain outputs (the quantized model's) but not float32's, ``= ours_off``; else ``NO``."""
    if r["identical"]:
        return "yes"
    quantized = row.get("weights") not in (None, "float32", "bfloat16", "float16")
    return "= ours_off" if quantized and row.get("identical_to_ours_off") else "NO"


def _table_rows(rows: list[dict[str, Any]], no_loop: bool, times: str = "") -> Any:
    """(row, its figures: all outputs or those that do not loop, a cell formatter) for each row with
    requests; the formatter's default format is ``{:.2f}`` followed by ``times``."""
    for row in rows:
        r = row["no_loop"] if no_loop else row
        if not r.get("requests"):
            continue

        def f(key: str, fmt: str = "{:.2f}" + times, r=r) -> str:
            return fmt.format(r[key]) if r.get(key) is not None else "–"

        yield row, r, f


def markdown(rows: list[dict[str, Any]], no_loop: bool = False) -> str:
    """The full table (or its twin over the outputs that do not loop)."""
    lines = [
        "| model | workload | system | requests | tok/s | speedup (median, min–max) | CPU speedup | "
        "forward passes | tokens/forward | drafted/accepted | propose ms/step | loop share | vs best baseline "
        "(wall; CPU) | vs best part (CPU) | identical |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for row, r, f in _table_rows(rows, no_loop):
        lines.append(
            f"| {row['model']} | {row['workload']} | {row['system']} | {r['requests']} | {f('tokens_per_s', '{:.1f}')} "
            f"| {f('speedup_median', '{:.2f}×')} ({f('speedup_min')}–{f('speedup_max')}) "
            f"| {f('cpu_speedup_median', '{:.2f}×')} | {r['forward_passes']} | {f('tokens_per_forward')} "
            f"| {f('drafted_per_accepted')} | {f('propose_ms_per_step')} | {f('loop_share')} "
            f"| {f('vs_best_baseline_median', '{:.2f}×')}; {f('vs_best_baseline_cpu_median', '{:.2f}×')} "
            f"| {f('vs_best_part_cpu_median', '{:.2f}×')} | {_identical(row, r)} |"
        )
    return "\n".join(lines) + "\n"


def llama_markdown(rows: list[dict[str, Any]], no_loop: bool = False) -> str:
    """The llama.cpp table: each llama.cpp system against llama.cpp plain and its prompt lookup, and the
    runtimes side by side (speedup over ``transformers`` plain ``generate``); empty without llama rows."""
    mine = [r for r in rows if r["system"].startswith("llama_") or r["system"] in ("hf_plain", "ours_all")]
    if not any(r["system"].startswith("llama_") for r in mine):
        return ""
    lines = [
        "| model | workload | system | requests | tok/s | vs transformers plain (wall, CPU) "
        "| vs llama.cpp plain (wall, CPU) | vs its prompt lookup (wall, CPU) | tokens/forward | loop share "
        "| identical to llama.cpp plain |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, r, f in _table_rows(mine, no_loop, "×"):
        same = f("identical_share", "{:.0%}") if row["system"].startswith("llama_") else "–"
        hf = (
            f"{f('speedup_median')}, {f('cpu_speedup_median')}"
            if row.get("baseline", "hf_plain") == "hf_plain"
            else "–"
        )
        lines.append(
            f"| {row['model']} | {row['workload']} | {row['system']} | {r['requests']} "
            f"| {f('tokens_per_s', '{:.1f}')} | {hf} "
            f"| {f('vs_llama_plain_median')}, {f('vs_llama_plain_cpu_median')} "
            f"| {f('vs_llama_prompt_lookup_median')}, {f('vs_llama_prompt_lookup_cpu_median')} "
            f"| {f('tokens_per_forward', '{:.2f}')} | {f('loop_share', '{:.2f}')} | {same} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Median speedup over plain ``generate`` per workload and system, one panel per model (and per
    subset: all outputs, outputs that do not loop)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(len(models), 2, figsize=(15, 4.2 * len(models)), squeeze=False)
    for m, model in enumerate(models):
        mine = [r for r in rows if r["model"] == model and r["system"] not in ("hf_plain", "ours_off")]
        workloads = list(dict.fromkeys(r["workload"] for r in mine))
        systems = list(dict.fromkeys(r["system"] for r in mine))
        width = 0.8 / max(1, len(systems))
        for col, subset in enumerate(("all", "no_loop")):
            ax = axes[m][col]
            for k, system in enumerate(systems):
                ys = []
                for w in workloads:
                    row = next((r for r in mine if r["workload"] == w and r["system"] == system), {})
                    ys.append(
                        (row.get("no_loop", {}) if subset == "no_loop" else row).get("speedup_median") or 0.0
                    )
                ax.bar([i + k * width for i in range(len(workloads))], ys, width, label=system)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads, fontsize=8)
            ax.set_title(
                f"{model}: {'all outputs' if subset == 'all' else 'outputs that do not loop'}", fontsize=9
            )
            ax.set_ylabel("speedup over transformers generate (median)", fontsize=8)
            ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def merge_rows(path: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` replacing those of ``path`` (a results.json) with the same model, workload and system."""
    old = json.loads(path.read_text()) if path.exists() else []
    if not isinstance(old, list):  # a results.json of the old format (one run's summary): start afresh
        old = []
    new_keys = {(r["model"], r["workload"], r["system"]) for r in rows}
    return [r for r in old if (r.get("model"), r.get("workload"), r.get("system")) not in new_keys] + rows
