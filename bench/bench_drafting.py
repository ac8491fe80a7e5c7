"""Drafting quality alone: our suffix proposer against ArcticInference's, replayed on fixed outputs.

Under greedy decoding the target's output does not depend on the drafts (lossless), so once the
output of every request is known, a drafter can be judged without running the model: replay the
engine's loop — ask for a draft under the engine's adaptive budget, accept the longest path of the
draft tree that the output continues with, append those tokens plus the target's own, repeat —
and count the verify steps. This is what the engine does, minus its timing-based gate (which
skips drafts that would not pay on this machine, so a replay verifies every draft): a
deterministic measure of the drafts, free of machine load.

Worked example: output ``[5, 6, 7, 8]``, first draft ``[5, 6, 9]`` -> accept ``5 6``, the target
gives ``7``: 3 tokens in step 1; second draft ``[8]`` -> accept ``8`` and the bonus token ends the
request (or the cap does): 2 steps, 2.0 tokens per step.

    python -m bench.bench_drafting [--requests 3] [--max-tokens 256] [--outputs written] [--max-draft-tokens 32]
                                   [--search] [--json out.json]

The outputs are generated once with the real target (greedy, speculation on: the same tokens) and
cached under ``--cache``; every system replays the same outputs, requests in the same order. With
``--outputs written`` the outputs are the answers a person would write instead (text that does not
loop, see :func:`written_traces`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suffixspec.draft import Draft
from suffixspec.proposers import Proposer, RequestContext

from .workloads import WORKLOADS, build


@dataclass
class Trace:
    """One request with the target's greedy output."""

    prompt_ids: list[int]
    output_ids: list[int]
    reference_ids: list[list[int]]
    prediction_ids: list[int] | None


@dataclass
class Replay:
    """Totals of one system over one workload's requests."""

    tokens: int = 0  # output tokens replayed
    steps: int = 0  # verify forward passes
    requests: int = 0  # prefill forward passes (one per request)
    drafted: int = 0  # draft nodes proposed
    propose_s: float = 0.0  # wall time in propose()
    propose_cpu_s: float = 0.0  # CPU time of this thread in propose() (insensitive to other jobs' load)

    @property
    def tokens_per_forward(self) -> float:
        """New tokens per target forward pass, prefill included (as ``suffixspec bench`` counts)."""
        return self.tokens / max(1, self.steps + self.requests)

    @property
    def mean_accepted_length(self) -> float:
        """New tokens per verify step."""
        return self.tokens / max(1, self.steps)

    def row(self) -> dict[str, Any]:
        return {"forward_passes": self.steps + self.requests, "tokens": self.tokens,
                "tokens_per_forward": round(self.tokens_per_forward, 3),
                "mean_accepted_length": round(self.mean_accepted_length, 3),
                "mean_draft": round(self.drafted / max(1, self.steps), 3),
                "propose_us_per_step": round(1e6 * self.propose_s / max(1, self.steps), 1),
                "propose_cpu_us_per_step": round(1e6 * self.propose_cpu_s / max(1, self.steps), 1)}


class OracleDrafter(Proposer):
    """Drafts the true continuation (the recorded output) up to the budget: the ceiling any drafter
    can reach under the engine's budget rule (32 nodes at most, grown as drafts are accepted)."""

    name = "oracle"

    def __init__(self, traces: list[Trace]) -> None:
        self.outputs = {tuple(t.prompt_ids): t.output_ids for t in traces}
        self._out: list[int] = []
        self._prompt_len = 0

    def begin(self, request: RequestContext) -> None:
        self._out = self.outputs.get(tuple(request.prompt_ids), [])
        self._prompt_len = len(request.prompt_ids)

    def propose(self, context, budget: int) -> Draft:
        done = len(context) - self._prompt_len
        want = self._out[done:done + budget]
        return Draft(list(want), list(range(-1, len(want) - 1)), ["prompt"] * len(want), score=float(len(want)))


def accepted_path(draft: Draft, output: list[int]) -> int:
    """Length of the longest draft path that ``output`` starts with (greedy verification)."""
    return draft.follow(output)[1]


def replay(proposer: Proposer, traces: list[Trace], drafters: tuple[str, ...] | None = None,
           max_draft_tokens: int = 32, max_context: int = 1 << 30) -> Replay:
    """Replay ``traces`` in order through ``proposer`` with the engine's budget rule."""
    from suffixspec.merge import merge_drafts

    out = Replay()
    for tr in traces:
        proposer.begin(RequestContext(list(tr.prompt_ids), tr.reference_ids, tr.prediction_ids, drafters=drafters))
        ema, copy_run = max_draft_tokens / 2, 0
        done: list[int] = []
        context = list(tr.prompt_ids)
        try:
            while len(done) < len(tr.output_ids):
                remaining = len(tr.output_ids) - len(done)
                budget = min(max_draft_tokens, remaining - 1, max_context - len(context))
                budget = min(budget, max(4, round(4 + 2 * ema), 2 * copy_run + 2))  # the engine's adaptive rule
                t, c = time.perf_counter(), time.thread_time()
                draft = merge_drafts([proposer.propose(context, budget)], budget) if budget > 0 else Draft()
                out.propose_s += time.perf_counter() - t
                out.propose_cpu_s += time.thread_time() - c
                rest = tr.output_ids[len(done):]
                acc = accepted_path(draft, rest)
                new = rest[:acc + 1]
                out.steps += 1
                out.drafted += len(draft)
                ema = 0.7 * ema + 0.3 * acc
                copy_run = acc if len(draft) and acc == max(draft.depths()) else 0
                done += new
                context += new
                proposer.update(new)
        finally:
            proposer.end(done)
        out.tokens += len(done)
        out.requests += 1
    return out


def record(model: str, workloads: tuple[str, ...], n: int, max_tokens: int, cache: Path, log=print
           ) -> dict[str, list[Trace]]:
    """Greedy outputs of every request (cached in ``cache`` as JSON)."""
    key = f"{model}|{n}|{max_tokens}"
    saved = json.loads(cache.read_text()) if cache.exists() else {}
    if all(f"{key}|{w}" in saved for w in workloads):
        return {w: [Trace(**t) for t in saved[f"{key}|{w}"]] for w in workloads}
    from suffixspec.config import SamplingParams
    from suffixspec.engine import Engine
    from suffixspec.loading import load_model
    from suffixspec.proposers.suffix import SuffixProposer

    target = load_model(model)
    engine = Engine(target)
    tok = target.tokenizer
    for w in workloads:
        if f"{key}|{w}" in saved:
            continue
        requests, _docs = build(w, tok, n, max_tokens)
        traces = []
        for req in requests:
            engine.proposers = [SuffixProposer(tokenizer=tok, history=False)]  # drafts only speed this up
            res = engine.generate(engine.encode(req.prompt), SamplingParams(max_tokens=req.max_tokens),
                                  references=req.references or None, prediction=req.prediction)
            traces.append(Trace(res.prompt_token_ids, res.token_ids,
                                [tok.encode(r, add_special_tokens=False) for r in req.references],
                                tok.encode(req.prediction, add_special_tokens=False) if req.prediction else None))
        saved[f"{key}|{w}"] = [t.__dict__ for t in traces]
        log(f"  recorded {w}: {sum(len(t.output_ids) for t in traces)} tokens")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(saved))
    return {w: [Trace(**t) for t in saved[f"{key}|{w}"]] for w in workloads}


def written_traces(model: str, workloads: tuple[str, ...], n: int, max_tokens: int) -> dict[str, list[Trace]]:
    """The same requests with the answer a person would write instead of the embedded target's output.

    The embedded target mostly loops (``\\n\\n\\n...``, ``,self,self,...``), so its recorded outputs
    test how drafters handle loops. These traces test text that does not loop: the edited window
    (code edit: the file with the rename applied, as the ``prediction`` variant sends it), the code
    under work written back (agentic: every step of the trace rewrites the same file), the retrieved
    chunk after the lines the prompt already started (RAG), the file's own continuation
    (open-ended). Drafts are judged on them exactly as on recorded outputs; nothing runs a model.
    """
    import random

    from suffixspec.loading import load_tokenizer

    from .workloads import heldout_texts

    tok = load_tokenizer(model)

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)[:max_tokens]

    out: dict[str, list[Trace]] = {}
    for w in workloads:
        requests, _docs = build(w, tok, n, max_tokens)
        if w in ("code_edit", "code_edit_prediction"):
            answers = [r.prediction for r in build("code_edit_prediction", tok, n, max_tokens)[0]]
        elif w == "agentic":
            answers = [r.prompt.split("\n", 3)[3].rsplit("\n# Step", 1)[0] for r in requests]
        elif w == "rag":
            answers = [r.references[0][len("".join(r.references[0].splitlines(keepends=True)[:3])):]
                       for r in requests]
        elif w == "open_ended":
            files = heldout_texts()
            random.Random(f"{w}-0").shuffle(files)  # as workloads.build shuffles them
            answers = [text[400:] for _, text in files[:n]]
        else:
            raise ValueError(f"no written answer for workload {w!r}")
        out[w] = [Trace(tok(r.prompt)["input_ids"], ids(a),
                        [tok.encode(x, add_special_tokens=False) for x in r.references],
                        tok.encode(r.prediction, add_special_tokens=False) if r.prediction else None)
                  for r, a in zip(requests, answers, strict=True)]
    return out


def documents_for(model: str, workload: str, n: int, max_tokens: int, tmp: Path) -> Any:
    """The document index the workload indexes first (RAG), or None."""
    from suffixspec.index.store import DocInput, IndexStore

    from suffixspec.loading import load_tokenizer

    tok = load_tokenizer(model)
    _reqs, docs = build(workload, tok, n, max_tokens)
    if not docs:
        return None
    store = IndexStore(tmp / f"{workload}.db")
    store.add_documents([DocInput(text, path=rel) for rel, text in docs], tok)
    return store.document_index(tok)


def systems(model: str, periodic: bool, arctic_params: dict[str, Any] | None = None
            ) -> dict[str, tuple[Callable[[Any], Proposer], tuple[str, ...] | None]]:
    """name -> (factory(documents) -> proposer, drafters)."""
    from suffixspec.loading import load_tokenizer
    from suffixspec.proposers.suffix import SuffixConfig, SuffixProposer

    from . import arctic

    tok = load_tokenizer(model)

    def ours(history: bool) -> Callable[[Any], Proposer]:
        return lambda docs: SuffixProposer(tokenizer=tok, documents=docs, history=history,
                                           config=SuffixConfig(periodic=periodic))

    out: dict[str, tuple[Callable[[Any], Proposer], tuple[str, ...] | None]] = {
        "ours_prompt": (ours(False), ("prompt",)),
        "ours_history": (ours(True), ("history",)),
        "ours_all": (ours(True), None),
    }
    if arctic.available():
        for name, params in (arctic_params or {"arctic_suffix": arctic.ARCTIC_DEFAULT,
                                               "arctic_suffix_best": arctic.ARCTIC_BEST}).items():
            out[name] = ((lambda docs, p=params: arctic.ArcticSuffixProposer(p)), None)
    return out


def search_arctic(traces: dict[str, list[Trace]], log=print) -> list[tuple[int, Any]]:
    """Verify steps summed over the workloads for a grid of Arctic settings, best first."""
    from . import arctic

    results = []
    for factor, offset, min_prob, tree in itertools.product((1.0, 2.0, 4.0, 8.0), (0.0, 4.0), (0.05, 0.1, 0.2),
                                                            (False, True)):
        p = arctic.ArcticParams(max_spec_factor=factor, max_spec_offset=offset, min_token_prob=min_prob,
                                use_tree_spec=tree)
        steps = sum(replay(arctic.ArcticSuffixProposer(p), trs).steps for trs in traces.values())
        results.append((steps, p))
        log(f"  {steps:6d} steps  {p.label()}")
    results.sort(key=lambda r: r[0])
    return results


def propose_cost(model: str, traces: dict[str, list[Trace]], rounds: int = 3) -> dict[str, dict[str, float]]:
    """Median propose CPU time per step (µs, this thread's CPU time: a loaded machine's waits left out)
    of the longest-match proposer (before the match-length rule:
    ``match_lengths=0``, factor 1, 128 candidates), today's default, and Arctic's best setting,
    interleaved round by round on the same replays (so machine load hits all alike)."""
    import statistics

    from suffixspec.loading import load_tokenizer
    from suffixspec.proposers.suffix import SuffixConfig, SuffixProposer

    from . import arctic

    tok = load_tokenizer(model)
    makers: dict[str, Callable[[], Proposer]] = {
        "ours, longest match only": lambda: SuffixProposer(tokenizer=tok, config=SuffixConfig(
            match_lengths=0, max_spec_factor=1.0, max_candidates=128)),
        "ours (default)": lambda: SuffixProposer(tokenizer=tok),
    }
    if arctic.available():
        makers["arctic_suffix_best"] = lambda: arctic.ArcticSuffixProposer(arctic.ARCTIC_BEST)
    times: dict[str, dict[str, list[float]]] = {name: {} for name in makers}
    for _ in range(rounds):
        for w, trs in traces.items():
            for name, make in makers.items():
                r = replay(make(), trs)
                times[name].setdefault(w, []).append(1e6 * r.propose_cpu_s / max(1, r.steps))
    return {name: {w: round(statistics.median(v), 1) for w, v in ws.items()} for name, ws in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="suffixspec/demo-target")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--cache", type=Path, default=Path("bench/results/drafting_outputs.json"),
                    help="greedy outputs, recorded once and reused")
    ap.add_argument("--outputs", choices=("recorded", "written"), default="recorded",
                    help="replay the embedded target's greedy outputs (recorded; they mostly loop) or the answers a "
                         "person would write (written: text that does not loop)")
    ap.add_argument("--max-draft-tokens", type=int, default=32,
                    help="the engine's node budget per draft (its default, 32; a request may ask for up to 256)")
    ap.add_argument("--search", action="store_true", help="grid-search Arctic's settings first")
    ap.add_argument("--cost", action="store_true", help="only time propose(): before / now / Arctic, interleaved")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import tempfile

    from . import arctic

    wl = tuple(args.workloads.split(","))
    if args.outputs == "written":
        traces = written_traces(args.model, wl, args.requests, args.max_tokens)
    else:
        traces = record(args.model, wl, args.requests, args.max_tokens, args.cache)
    if args.cost:
        cost = propose_cost(args.model, traces)
        print("| proposer | " + " | ".join(wl) + " |\n|---|" + "---:|" * len(wl))
        for name, row in cost.items():
            print(f"| {name} | " + " | ".join(f"{row[w]:.0f} µs CPU" for w in wl) + " |")
        if args.json:
            args.json.write_text(json.dumps({"propose_us_per_step": cost}, indent=2))
        return
    if args.search:
        if not arctic.available():
            raise SystemExit("--search needs arctic-inference (see PEERS.md)")
        best = search_arctic(traces)[0]
        print(f"best Arctic setting: {best[1].label()} ({best[0]} steps)")
    table: dict[str, Any] = {}
    print("| workload | periodic | system | forward passes | tokens/forward | mean accepted length | propose µs/step |")
    print("|---|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for w in wl:
            docs = documents_for(args.model, w, args.requests, args.max_tokens, Path(tmp))
            cap = args.max_draft_tokens
            oracle = replay(OracleDrafter(traces[w]), traces[w], max_draft_tokens=cap).row()
            table.setdefault(w, {})["oracle"] = oracle
            print(f"| {w} | – | oracle (ceiling) | {oracle['forward_passes']} | {oracle['tokens_per_forward']:.2f} | "
                  f"{oracle['mean_accepted_length']:.2f} | – |", flush=True)
            for periodic in (True, False):
                for name, (factory, drafters) in systems(args.model, periodic).items():
                    if name.startswith("arctic") and not periodic:
                        row = table[w]["on"][name]  # Arctic has no periodic rule: same replay
                    else:
                        row = replay(factory(docs), traces[w], drafters, max_draft_tokens=cap).row()
                    table.setdefault(w, {}).setdefault("on" if periodic else "off", {})[name] = row
                    print(f"| {w} | {'on' if periodic else 'off'} | {name} | {row['forward_passes']} | "
                          f"{row['tokens_per_forward']:.2f} | {row['mean_accepted_length']:.2f} | "
                          f"{row['propose_us_per_step']:.0f} |", flush=True)
    if not arctic.available():
        print("(arctic-inference is not installed: the arctic_suffix rows are skipped; see PEERS.md)")
    if args.json:
        args.json.write_text(json.dumps({"meta": vars(args) | {"cache": str(args.cache), "json": str(args.json)},
                                         "results": table}, indent=2))


if __name__ == "__main__":
    main()
