"""The benchmark runner behind ``suffixspec bench``: workloads x systems, side by side in one run.

Systems (same target model, same draft model, same prompts, same process):

- ``hf_plain``: ``transformers`` greedy ``generate`` (the baseline every ratio is taken against);
- ``hf_prompt_lookup``: its prompt lookup decoding (``prompt_lookup_num_tokens=10``);
- ``hf_assisted``: its universal assisted generation with the different-tokenizer draft model;
- ``ours_<drafter>``: suffixspec with one drafter (prompt, history, documents, references,
  draft_model) and ``ours_all`` with every drafter;
- ``arctic_suffix`` / ``arctic_suffix_best``: ArcticInference's ``SuffixDecodingCache`` (vLLM's
  ``suffix`` method) as the only drafter in our engine, with its default settings and with the
  best of a grid (:mod:`bench.arctic`); skipped with a note when ``arctic-inference`` is missing.

For each workload and system: tokens/s, speedup over ``hf_plain`` per request (median, min, max),
target forward passes (counted with a hook on the target model for every system, prefill
included, so prompt lookup's count compares with ours), mean accepted length (new tokens per
target forward pass), acceptance rate per source, proposal overhead per step, and whether every
output is identical to ``hf_plain`` (greedy). Systems take turns on each request, so a ratio
compares runs made seconds apart.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .workloads import WORKLOADS, Request, build

HF_SYSTEMS = ("hf_plain", "hf_prompt_lookup", "hf_assisted")
OUR_DRAFTERS = ("prompt", "history", "documents", "references", "draft_model")
OUR_SYSTEMS = tuple(f"ours_{d}" for d in OUR_DRAFTERS) + ("ours_all",)
ARCTIC_SYSTEMS = ("arctic_suffix", "arctic_suffix_best")
SYSTEMS = HF_SYSTEMS + OUR_SYSTEMS + ARCTIC_SYSTEMS
QUICK_SYSTEMS = ("hf_plain", "hf_prompt_lookup", "hf_assisted", "ours_all")


@dataclass
class Run:
    """One request served by one system."""

    seconds: float  # wall time of the whole request (prefill included)
    tokens: list[int]  # generated ids
    forwards: int  # target forward passes, prefill included (every system)
    steps: int | None = None  # verify steps (ours only)
    stats: dict[str, Any] = field(default_factory=dict)  # RequestStats.to_dict() (ours only)


@dataclass
class Bench:
    """Models and drafters loaded once for the whole run."""

    target: Any  # LoadedModel
    draft: Any | None  # LoadedModel of the draft model (different tokenizer), or None
    draft_proposer: Any | None = None
    engine: Any = None
    forwards: Any = None  # ForwardCounter on the target model

    def __post_init__(self) -> None:
        from suffixspec.engine import Engine
        from suffixspec.proposers.draft_model import make_draft_proposer

        from .bench_bridge import ForwardCounter

        self.engine = Engine(self.target)
        self.forwards = ForwardCounter(self.target.model)
        if self.draft is not None:
            self.draft_proposer = make_draft_proposer(self.draft, self.target)


def _hf_generate(bench: Bench, system: str, req: Request) -> Run:
    import torch

    tok = bench.target.tokenizer
    ids = torch.tensor([tok(req.prompt)["input_ids"]], device=bench.target.device)
    kwargs: dict[str, Any] = dict(do_sample=False, max_new_tokens=req.max_tokens,
                                  attention_mask=torch.ones_like(ids), pad_token_id=tok.pad_token_id)
    if system == "hf_prompt_lookup":
        kwargs["prompt_lookup_num_tokens"] = 10
    elif system == "hf_assisted":
        kwargs.update(assistant_model=bench.draft.model, tokenizer=tok, assistant_tokenizer=bench.draft.tokenizer)
    calls = bench.forwards.calls
    t = time.perf_counter()
    with torch.inference_mode():
        out = bench.target.model.generate(ids, **kwargs)
    return Run(time.perf_counter() - t, out[0, ids.shape[1]:].tolist(), bench.forwards.calls - calls)


def _ours(bench: Bench, system: str, req: Request, suffix: Any) -> Run:
    """One request through our engine; ``suffix`` is the system's suffix proposer (ours or Arctic's)."""
    from suffixspec.config import SamplingParams, SpeculationConfig

    if system.startswith("arctic_"):
        bench.engine.proposers = [suffix]
        spec = SpeculationConfig()
    else:
        drafter = system.removeprefix("ours_")
        bench.engine.proposers = [suffix] + ([bench.draft_proposer] if bench.draft_proposer else [])
        spec = SpeculationConfig(drafters=None if drafter == "all" else (drafter,))
    calls = bench.forwards.calls
    t = time.perf_counter()
    res = bench.engine.generate(bench.engine.encode(req.prompt), SamplingParams(max_tokens=req.max_tokens),
                                spec, references=req.references or None, prediction=req.prediction)
    seconds = time.perf_counter() - t
    return Run(seconds, res.token_ids, bench.forwards.calls - calls, res.stats.steps, res.stats.to_dict())


def _suffix_proposer(bench: Bench, documents: Any, system: str = "ours_all", periodic: bool = True) -> Any:
    """A fresh drafter for ``system``: our suffix proposer, or Arctic's for the ``arctic_*`` systems."""
    if system in ARCTIC_SYSTEMS:
        from .arctic import ARCTIC_BEST, ARCTIC_DEFAULT, ArcticSuffixProposer

        return ArcticSuffixProposer(ARCTIC_BEST if system == "arctic_suffix_best" else ARCTIC_DEFAULT)
    from suffixspec.proposers.suffix import SuffixConfig, SuffixProposer

    return SuffixProposer(tokenizer=bench.target.tokenizer, documents=documents,
                          config=SuffixConfig(periodic=periodic))


def _document_index(bench: Bench, docs: list[tuple[str, str]], tmp: Path) -> Any:
    if not docs:
        return None
    from suffixspec.index.store import DocInput, IndexStore

    store = IndexStore(tmp / "bench.db")
    store.add_documents([DocInput(text, path=rel) for rel, text in docs], bench.target.tokenizer)
    return store.document_index(bench.target.tokenizer)


def run_workload(bench: Bench, name: str, systems: tuple[str, ...], n: int, max_tokens: int,
                 log=print, periodic: bool = True) -> dict[str, list[Run]]:
    """Every system serves each request in turn (request-major), so a system and its baseline run
    seconds apart rather than minutes: load changes on a shared machine hit both alike. Each of our
    systems keeps its own suffix proposer, so its output history sees the requests in order."""
    requests, docs = build(name, bench.target.tokenizer, n, max_tokens)
    _hf_generate(bench, "hf_plain", requests[0])  # untimed warm-up at this workload's prompt length
    active = [s for s in systems if not (s == "hf_assisted" and bench.draft is None)
              and not (s == "ours_draft_model" and bench.draft_proposer is None)]
    with tempfile.TemporaryDirectory() as tmp:
        documents = _document_index(bench, docs, Path(tmp))
        suffixes = {s: _suffix_proposer(bench, documents, s, periodic) for s in active if not s.startswith("hf_")}
        runs: dict[str, list[Run]] = {s: [] for s in active}
        for req in requests:
            for system in active:
                if system.startswith("hf_"):
                    runs[system].append(_hf_generate(bench, system, req))
                else:
                    runs[system].append(_ours(bench, system, req, suffixes[system]))
    for system in active:
        log(f"  {name:22s} {system:18s} {_tps(runs[system]):8.1f} tok/s")
    return runs


def _tps(runs: list[Run]) -> float:
    return sum(len(r.tokens) for r in runs) / max(1e-9, sum(r.seconds for r in runs))


def summarize(all_runs: dict[str, dict[str, list[Run]]]) -> dict[str, Any]:
    """Per workload and system: the figures of the table."""
    out: dict[str, Any] = {}
    for workload, runs in all_runs.items():
        plain = runs["hf_plain"]
        rows = {}
        for system, rs in runs.items():
            speedups = [p.seconds / r.seconds for p, r in zip(plain, rs, strict=True)]
            row: dict[str, Any] = {
                "tokens_per_s": round(_tps(rs), 2),
                "speedup_median": round(statistics.median(speedups), 3),
                "speedup_min": round(min(speedups), 3),
                "speedup_max": round(max(speedups), 3),
                "identical": all(p.tokens == r.tokens for p, r in zip(plain, rs, strict=True)),
                "tokens": sum(len(r.tokens) for r in rs),
                "forward_passes": sum(r.forwards for r in rs),
            }
            row["tokens_per_forward"] = round(row["tokens"] / max(1, row["forward_passes"]), 3)
            if rs and rs[0].steps is not None:
                steps = sum(r.steps for r in rs)
                drafted = sum(r.stats["drafted_tokens"] for r in rs)
                accepted = sum(r.stats["accepted_tokens"] for r in rs)
                per_source: dict[str, dict[str, int]] = {}
                for r in rs:
                    for src, c in r.stats["per_source"].items():
                        acc = per_source.setdefault(src, {"drafted": 0, "accepted": 0})
                        acc["drafted"] += c["drafted"]
                        acc["accepted"] += c["accepted"]
                row.update(
                    mean_accepted_length=round(row["tokens"] / max(1, steps), 3),
                    acceptance_rate=round(accepted / drafted, 3) if drafted else 0.0,
                    acceptance_per_source={s: round(c["accepted"] / c["drafted"], 3) if c["drafted"] else 0.0
                                           for s, c in per_source.items()},
                    propose_ms_per_step=round(1e3 * sum(r.stats["time_propose_s"] for r in rs) / max(1, steps), 3),
                )
            rows[system] = row
        out[workload] = rows
    return out


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| workload | system | tok/s | speedup (median, min–max) | forward passes | tokens/forward | "
             "mean accepted length | acceptance | propose ms/step | identical |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for workload, rows in summary.items():
        for system, r in rows.items():
            mal = f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else "–"
            acc = f"{r['acceptance_rate']:.2f}" if "acceptance_rate" in r else "–"
            prop = f"{r['propose_ms_per_step']:.2f}" if "propose_ms_per_step" in r else "–"
            lines.append(f"| {workload} | {system} | {r['tokens_per_s']:.1f} | {r['speedup_median']:.2f}× "
                         f"({r['speedup_min']:.2f}–{r['speedup_max']:.2f}) | {r['forward_passes']} | "
                         f"{r['tokens_per_forward']:.2f} | {mal} | {acc} | {prop} | "
                         f"{'yes' if r['identical'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(summary)
    systems = [s for s in SYSTEMS if any(s in summary[w] for w in workloads) and s != "hf_plain"]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(workloads)), 4.5))
    width = 0.8 / max(1, len(systems))
    for k, system in enumerate(systems):
        xs = [i + k * width for i in range(len(workloads))]
        ys = [summary[w].get(system, {}).get("speedup_median", 0.0) for w in workloads]
        ax.bar(xs, ys, width, label=system)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
    ax.set_ylabel("speedup over transformers greedy generate (median)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(model: str, draft_model: str | None, out_dir: Path, quick: bool = False,
        workloads: tuple[str, ...] = WORKLOADS, systems: tuple[str, ...] | None = None,
        requests: int | None = None, max_tokens: int | None = None, log=print,
        periodic: bool = True) -> dict[str, Any]:
    """Run the suite and write ``results.json``, ``results.md`` and ``speedup.png`` into ``out_dir``.

    ``periodic=False`` switches our proposer's periodic-continuation rule off (judges the drafts on
    output that is not a loop)."""
    from suffixspec.loading import load_model

    from .arctic import available

    systems = systems or (QUICK_SYSTEMS if quick else SYSTEMS)
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system(s) {unknown}; choose from {list(SYSTEMS)}")
    skipped = [s for s in systems if s in ARCTIC_SYSTEMS and not available()]
    if skipped:
        log(f"skipping {', '.join(skipped)}: arctic-inference is not installed (see PEERS.md / README)")
        systems = tuple(s for s in systems if s not in skipped)
    if "hf_plain" not in systems:
        systems = ("hf_plain", *systems)
    n = requests or (2 if quick else 5)
    max_tokens = max_tokens or (96 if quick else 256)
    target = load_model(model)
    draft = load_model(draft_model) if draft_model else None
    bench = Bench(target, draft)
    warm = Request(bench.engine.tokenizer.decode(bench.engine.encode("def main():\n    return 0\n")), 8)
    _hf_generate(bench, "hf_plain", warm)
    _ours(bench, "ours_all", warm, _suffix_proposer(bench, None))
    all_runs = {}
    started = time.perf_counter()
    for w in workloads:
        all_runs[w] = run_workload(bench, w, systems, n, max_tokens, log, periodic)
    summary = summarize(all_runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"model": model, "draft_model": draft_model, "requests_per_workload": n, "max_tokens": max_tokens,
            "quick": quick, "periodic": periodic, "skipped": skipped,
            "seconds": round(time.perf_counter() - started, 1)}
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "results": summary}, indent=2))
    table = markdown(summary)
    (out_dir / "results.md").write_text(table)
    plot(summary, out_dir / "speedup.png")
    return {"meta": meta, "results": summary, "markdown": table}
