"""Requests served by the systems of ``suffixspec bench``: one request through ``transformers``, our engine
(with our suffix proposer or ArcticInference's) or llama.cpp, timed and counted (:class:`~suffixspec.bench.systems.Run`);
a workload's requests through every system in turn, the order rotating (:func:`run_workload`); and the agent
sessions with a restart half-way (:func:`run_sessions`)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from suffixspec.bench.loops import loop_share
from suffixspec.bench.systems import ARCTIC_SYSTEMS, SESSION_SYSTEMS, Bench, Run, baseline, no_documents
from suffixspec.bench.workloads import index_documents
from suffixspec.bench.workloads.request import Request


def hf_generate(bench: Bench, system: str, req: Request) -> Run:
    import torch

    target = bench.hf_target or bench.target
    tok = target.tokenizer
    ids = torch.tensor([tok(req.prompt)["input_ids"]], device=target.device)
    kwargs: dict[str, Any] = dict(
        do_sample=False,
        max_new_tokens=req.max_tokens,
        attention_mask=torch.ones_like(ids),
        pad_token_id=tok.pad_token_id,
    )
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
    return Run(
        time.perf_counter() - t,
        time.thread_time() - c,
        out[0, ids.shape[1] :].tolist(),
        bench.hf_forwards.calls - calls,
    )


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
            drafters = no_documents()
        else:
            drafters = (drafter,)
        spec = SpeculationConfig(drafters=drafters)
    calls = bench.forwards.calls
    t, c = time.perf_counter(), time.thread_time()
    res = bench.engine.generate(
        bench.engine.encode(req.prompt),
        SamplingParams(max_tokens=req.max_tokens),
        spec,
        references=req.references or None,
        prediction=req.prediction,
    )
    seconds, cpu = time.perf_counter() - t, time.thread_time() - c
    return Run(
        seconds, cpu, res.token_ids, bench.forwards.calls - calls, res.stats.steps, res.stats.to_dict()
    )


def llama_generate(bench: Bench, system: str, req: Request) -> Run:
    """One request through llama.cpp (:mod:`suffixspec.bench.llama`): the same prompt ids as ``hf_generate``'s."""
    ids = bench.target.tokenizer(req.prompt)["input_ids"]
    tokens, seconds, cpu, forwards, stats = bench.llama.generate(
        system, ids, req.max_tokens, req.references, req.prediction
    )
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


def run_workload(
    bench: Bench,
    requests: list[Request],
    docs: list[tuple[str, str]],
    systems: tuple[str, ...],
    log=print,
    name: str = "",
    tmp: Path | None = None,
) -> dict[str, list[Run]]:
    """Every system serves each request in turn (request-major, the order rotating by one per
    request), so a system and its baseline run seconds apart rather than minutes: load changes on a
    shared machine hit both alike. Each of our systems keeps its own suffix proposer for the workload.
    ``tmp``: where the documents are indexed (a run's folder, kept across its workloads; default: a
    folder of this workload's own)."""
    base = baseline(systems)
    if any(s.startswith("hf_") for s in systems):  # untimed warm-up at this workload's prompt length
        hf_generate(bench, "hf_plain", requests[0])
    elif base == "llama_plain":
        llama_generate(bench, base, requests[0])
    else:  # a phase of our systems alone (a separate process)
        run_ours_request(bench, "ours_off", Request(requests[0].prompt, 4), None)
    with tempfile.TemporaryDirectory() as own:
        documents = index_documents(bench.target.tokenizer, docs, tmp or Path(own))
        suffixes = {
            s: suffix_proposer_for(bench, documents, s)
            for s in systems
            if not s.startswith(("hf_", "llama_"))
        }
        if bench.llama is not None:  # like ours: what the drafter learned starts afresh with each workload
            bench.llama.new_workload()
        runs: dict[str, list[Run]] = {s: [] for s in systems}
        for k, req in enumerate(requests):
            for system in systems[k % len(systems) :] + systems[: k % len(systems)]:
                if system.startswith("hf_"):
                    runs[system].append(hf_generate(bench, system, req))
                elif system.startswith("llama_"):
                    runs[system].append(llama_generate(bench, system, req))
                else:
                    runs[system].append(run_ours_request(bench, system, req, suffixes[system]))
            plain = runs[base][-1]
            log(
                f"  {name} request {k + 1}/{len(requests)}: {len(plain.tokens)} tokens, loop share "
                f"{loop_share(plain.tokens):.2f}; over {base} (wall, CPU): "
                + ", ".join(
                    f"{s} {plain.seconds / runs[s][-1].seconds:.2f}x, "
                    f"{plain.cpu_s / max(runs[s][-1].cpu_s, 1e-9):.2f}x"
                    for s in systems
                    if s != base
                )
            )
    return runs


def run_sessions(
    bench: Bench, requests: list[Request], log=print, tmp: Path | None = None, arctic: bool = True
) -> tuple[dict[str, list[Run]], int]:
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
    hf_generate(bench, "hf_plain", requests[0])
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
            for system in live[k % len(live) :] + live[: k % len(live)]:
                if system == "hf_plain":
                    runs[system].append(hf_generate(bench, system, req))
                else:
                    kind = "ours_all" if system.startswith("ours") else "arctic_suffix_best"
                    runs[system].append(run_ours_request(bench, kind, req, suffixes[system]))
            plain = runs["hf_plain"][-1]
            log(
                f"  agent_sessions request {k + 1}/{len(requests)}{' (restarted)' if k >= restart else ''}: "
                f"{len(plain.tokens)} tokens; "
                + ", ".join(
                    f"{s} {plain.seconds / runs[s][-1].seconds:.2f}x" for s in live if s != "hf_plain"
                )
            )
    return runs, restart
