"""Drafting alone, replayed on fixed outputs: our suffix proposer against ArcticInference's and the oracle.

Under greedy decoding the target's output does not depend on the drafts (lossless), so once the
output of every request is known, a drafter can be judged without running the model: replay the
engine's loop — ask for a draft under the engine's adaptive budget, accept the longest path of the
draft tree that the output continues with, append those tokens plus the target's own, repeat —
and count forward passes and drafted tokens. With the model's measured verify cost curve
(:mod:`suffixspec.bench.bench_limits`, ``--costs``) each step costs ``t(1 + drafted nodes)`` plus the propose
time (this thread's CPU time), and plain decoding ``t(1)`` per token: an estimated speedup free of
machine load. Where the file also has the model's prefill per prompt token, each request pays it
once in every system, plain decoding too, and a second estimate covers the whole request: the
prompt's prefill is what no drafter shortens, so this is the figure a real run's ratios compare with. The budget is the engine's (``budget.draft_budget``: momentum, and with ``--costs`` the
cost curve too). ``--gate`` (needs ``--costs``) puts the engine's own draft gate in the loop
(``gates.choose_drafts`` with the request's ``gates.DraftGate``, judging each draft's score against
that curve, exploration included), as the engine runs it on one request.

Worked example: output ``[5, 6, 7, 8]``, first draft ``[5, 6, 9]`` -> accept ``5 6``, the target
gives ``7``: 3 tokens in step 1; second draft ``[8]`` -> accept ``8`` and the bonus token ends the
request (or the cap does): 2 steps, 2.0 tokens per step; with t(1) = 70 ms, t(4) = 80 ms, t(2) = 72
ms: 152 ms against 4 x 70 = 280 ms plain, 1.84x.

    python -m suffixspec.bench.bench_drafting --model DIR [--outputs recorded|written] [--requests 8] [--max-tokens 128]
                                   [--costs suffixspec/bench/published/limits.json] [--gate] [--search] [--json out.json]

Outputs: ``recorded`` (default) are the target's greedy outputs, generated once and cached under
``--cache`` (they loop where the model loops: every table row says how much); ``written`` are the
answers written for the tasks (:attr:`bench.workloads.request.Request.answer`: the edited function, the
tool calls, the quoted documentation): text that does not loop, the same for every model.
History (earlier outputs) is off for every drafter unless ``--history``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suffixspec.bench.loops import loop_share
from suffixspec.bench.systems import NO_DOCUMENTS
from suffixspec.bench.workloads import WORKLOADS, build, index_documents
from suffixspec.drafting.budget import draft_budget
from suffixspec.drafting.costs import PassCost, StepCost
from suffixspec.drafting.draft import Draft
from suffixspec.drafting.gates import DraftGate, RowDraft, choose_drafts
from suffixspec.drafting.policy import DEFAULT, Policy
from suffixspec.drafting.proposers import Proposer, RequestContext


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
    drafted: int = 0  # draft nodes verified
    accepted: int = 0  # draft nodes accepted
    propose_s: float = 0.0  # wall time in propose()
    propose_cpu_s: float = 0.0  # CPU time of this thread in propose() (insensitive to other jobs' load)
    verify_s: float = 0.0  # verify passes' time by the cost curve (0 without one)
    plain_s: float = 0.0  # plain decoding's time by the cost curve: t(1) per token
    prefill_s: float = 0.0  # the prompts' prefill by the measured time per token (0 where not measured)

    @property
    def tokens_per_forward(self) -> float:
        """New tokens per target forward pass, prefill included (as ``suffixspec bench`` counts)."""
        return self.tokens / max(1, self.steps + self.requests)

    @property
    def mean_accepted_length(self) -> float:
        """New tokens per verify step."""
        return self.tokens / max(1, self.steps)

    def row(self) -> dict[str, Any]:
        out = {
            "forward_passes": self.steps + self.requests,
            "tokens": self.tokens,
            "tokens_per_forward": round(self.tokens_per_forward, 3),
            "mean_accepted_length": round(self.mean_accepted_length, 3),
            "mean_draft": round(self.drafted / max(1, self.steps), 3),
            "drafted_per_accepted": round(self.drafted / self.accepted, 2) if self.accepted else None,
            "propose_us_per_step": round(1e6 * self.propose_s / max(1, self.steps), 1),
            "propose_cpu_us_per_step": round(1e6 * self.propose_cpu_s / max(1, self.steps), 1),
        }
        if self.plain_s:
            out["estimated_speedup"] = round(self.plain_s / (self.verify_s + self.propose_cpu_s), 3)
        if self.plain_s and self.prefill_s:  # the whole request: the prompt's prefill paid by both
            out["estimated_speedup_request"] = round(
                (self.plain_s + self.prefill_s) / (self.verify_s + self.propose_cpu_s + self.prefill_s), 3
            )
        return out


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
        want = self._out[done : done + budget]
        return Draft(
            list(want), list(range(-1, len(want) - 1)), ["prompt"] * len(want), score=float(len(want))
        )


def accepted_path(draft: Draft, output: list[int]) -> int:
    """Length of the longest draft path that ``output`` starts with (greedy verification)."""
    return draft.follow(output)[1]


class CurveCost:
    """``costs.PassCost`` pinned to a measured curve (seconds by draft size k): the engine's budget and
    gate judge by it, deterministically. Made non-decreasing first, as ``PassCost`` makes its own (a
    larger pass never costs less: a noisy curve's dip would make a longer draft look free, or past the
    curve, its last slope negative); sizes past the curve extend its last slope."""

    def __init__(self, curve: dict[int, float]) -> None:
        self.curve: dict[int, float] = {}
        top = 0.0
        for k in sorted(curve):
            top = self.curve[k] = max(top, curve[k])
        self.top = max(curve)

    def estimate(self, inputs: int) -> float:
        k = inputs - 1
        if k <= self.top:
            return self.curve[max(0, k)]
        slope = self.curve[self.top] - self.curve[self.top - 1]
        return self.curve[self.top] + slope * (k - self.top)

    def observe(self, inputs: int, seconds: float) -> None:
        pass


def replay(
    proposer: Proposer,
    traces: list[Trace],
    drafters: tuple[str, ...] | None = None,
    max_draft_tokens: int = 32,
    max_context: int = 1 << 30,
    curve: dict[int, float] | None = None,
    gate: bool = False,
    policy: Policy = DEFAULT,
    prefill: float | None = None,
) -> Replay:
    """Replay ``traces`` in order through ``proposer`` as the engine steps one greedy request
    (``sequence.RequestState``): the budget of ``budget.draft_budget`` (its cost-curve bound with
    ``curve``), and with ``gate`` the draft gate (``gates.choose_drafts`` with the request's
    ``DraftGate``) judging each draft by ``curve``; a draft it skips costs a plain step. ``prefill``:
    seconds per prompt token of the prefill (``bench_limits.load_prefill``), added to each request."""
    if gate and not curve:
        raise ValueError("the draft gate judges drafts by a cost curve: pass curve (bench_drafting --costs)")
    from suffixspec.drafting.merge import merge_drafts

    cost = (
        CurveCost(curve) if curve else PassCost(policy)
    )  # an empty PassCost: momentum alone bounds the budget
    step = StepCost(cost, 1)
    rate = policy.accepted_rate
    out = Replay()
    for tr in traces:
        proposer.begin(
            RequestContext(list(tr.prompt_ids), tr.reference_ids, tr.prediction_ids, drafters=drafters)
        )
        judge = DraftGate(policy) if gate else None
        # the request's running means, as RequestState keeps them (see RequestState._learn)
        mean_accepted, copy_run = max_draft_tokens / 2, 0
        hits, tries = policy.acceptance_prior, 1.0
        acceptance = policy.acceptance_prior
        done: list[int] = []
        context = list(tr.prompt_ids)
        try:
            while len(done) < len(tr.output_ids):
                remaining = len(tr.output_ids) - len(done)
                budget = min(max_draft_tokens, remaining - 1, max_context - len(context))
                budget = draft_budget(budget, mean_accepted, copy_run, acceptance, step, policy)
                proposer.observe_costs(step)  # as the engine does
                t, c = time.perf_counter(), time.thread_time()
                draft = merge_drafts([proposer.propose(context, budget)], budget) if budget > 0 else Draft()
                out.propose_s += time.perf_counter() - t
                out.propose_cpu_s += time.thread_time() - c
                if judge is not None and len(draft):
                    row = RowDraft(draft.gate_size(), judge.expected(draft.score), gate=judge)
                    choose_drafts([row], cost)
                    if not row.verified:
                        draft = Draft()
                rest = tr.output_ids[len(done) :]
                acc = accepted_path(draft, rest)
                new = rest[: acc + 1]
                out.steps += 1
                out.drafted += len(draft)
                out.accepted += acc
                if curve:
                    out.verify_s += cost.estimate(1 + len(draft))
                mean_accepted = (1 - rate) * mean_accepted + rate * acc
                if len(draft):
                    missed = draft.follow(rest)[0] in draft.children()  # the walk stopped short of a leaf
                    hits = (1 - rate) * hits + rate * acc
                    tries = (1 - rate) * tries + rate * (acc + missed)
                    acceptance = hits / tries if tries > 0 else acceptance
                    if judge is not None:
                        judge.observe(draft.score, acc)
                copy_run = acc if len(draft) and acc == max(draft.depths()) else 0
                done += new
                context += new
                proposer.update(new)
        finally:
            proposer.end(done)
        out.tokens += len(done)
        out.requests += 1
        if curve:
            out.plain_s += len(done) * cost.estimate(1)
        if prefill:
            out.prefill_s += len(tr.prompt_ids) * prefill
    return out


def record(
    model: str, workloads: tuple[str, ...], n: int, max_tokens: int, cache: Path, log=print
) -> dict[str, list[Trace]]:
    """Greedy outputs of every request (cached in ``cache`` as JSON)."""
    key = f"{Path(model).name}|{n}|{max_tokens}"
    saved = json.loads(cache.read_text()) if cache.exists() else {}
    if all(f"{key}|{w}" in saved for w in workloads):
        return {w: [Trace(**t) for t in saved[f"{key}|{w}"]] for w in workloads}
    import torch

    from suffixspec.config import SamplingParams
    from suffixspec.drafting.proposers.suffix import SuffixProposer
    from suffixspec.loading import load_model
    from suffixspec.runtimes.engine import Engine

    torch.set_num_threads(1)
    target = load_model(model)
    engine = Engine(target, threads=1)
    tok = target.tokenizer
    for w in workloads:
        if f"{key}|{w}" in saved:
            continue
        requests, _docs = build(w, tok, n, max_tokens)
        traces = []
        for req in requests:
            engine.proposers = [SuffixProposer(tokenizer=tok, history=False)]  # drafts only speed this up
            res = engine.generate(
                engine.encode(req.prompt),
                SamplingParams(max_tokens=req.max_tokens),
                references=req.references or None,
                prediction=req.prediction,
            )
            traces.append(
                Trace(
                    res.prompt_token_ids,
                    res.token_ids,
                    [tok.encode(r, add_special_tokens=False) for r in req.references],
                    tok.encode(req.prediction, add_special_tokens=False) if req.prediction else None,
                )
            )
        saved[f"{key}|{w}"] = [t.__dict__ for t in traces]
        log(f"  recorded {w}: {sum(len(t.output_ids) for t in traces)} tokens")
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(saved))
    return {w: [Trace(**t) for t in saved[f"{key}|{w}"]] for w in workloads}


def written_traces(model: str, workloads: tuple[str, ...], n: int, max_tokens: int) -> dict[str, list[Trace]]:
    """The same requests with the answer written for each task (``Request.answer``) as the output:
    the edited function (code edit), the tool calls of the agent's turns, the quoted documentation
    (RAG), the package's own description (open-ended). Nothing runs a model."""
    from suffixspec.loading import load_tokenizer

    tok = load_tokenizer(model)

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)[:max_tokens]

    out: dict[str, list[Trace]] = {}
    for w in workloads:
        requests, _docs = build(w, tok, n, max_tokens)
        out[w] = [
            Trace(
                tok(r.prompt)["input_ids"],
                ids(r.answer),
                [tok.encode(x, add_special_tokens=False) for x in r.references],
                tok.encode(r.prediction, add_special_tokens=False) if r.prediction else None,
            )
            for r in requests
        ]
    return out


def documents_for(model: str, workload: str, n: int, max_tokens: int, tmp: Path) -> Any:
    """The document index the workload indexes first (RAG), or None."""
    from suffixspec.loading import load_tokenizer

    tok = load_tokenizer(model)
    _reqs, docs = build(workload, tok, n, max_tokens)
    return index_documents(tok, docs, tmp)


def systems(
    model: str, history: bool = False, arctic_params: dict[str, Any] | None = None
) -> dict[str, tuple[Callable[[Any], Proposer], tuple[str, ...] | None]]:
    """name -> (factory(documents) -> proposer, drafters)."""
    from dataclasses import replace

    from suffixspec.bench import arctic
    from suffixspec.drafting.proposers.suffix import SuffixProposer
    from suffixspec.loading import load_tokenizer

    tok = load_tokenizer(model)

    def ours(docs: Any) -> Proposer:
        return SuffixProposer(tokenizer=tok, documents=docs, history=history)

    out: dict[str, tuple[Callable[[Any], Proposer], tuple[str, ...] | None]] = {
        "ours_prompt": (ours, ("prompt",)),
        "ours_no_documents": (ours, NO_DOCUMENTS),
        "ours_all": (ours, None),
    }
    if history:
        out["ours_history"] = (ours, ("history",))
    if arctic.available():
        for name, params in (
            arctic_params
            or {"arctic_suffix": arctic.ARCTIC_DEFAULT, "arctic_suffix_best": arctic.ARCTIC_BEST}
        ).items():
            out[name] = (
                (lambda docs, p=replace(params, history=history): arctic.ArcticSuffixProposer(p)),
                None,
            )
    return out


def search_arctic(
    traces: dict[str, list[Trace]], curve: dict[int, float] | None = None, log=print
) -> list[tuple[float, Any]]:
    """Arctic settings of a grid, best first: by estimated time summed over the workloads with a cost
    curve (fewest verify steps without one). History off, as the benchmark runs it."""
    from suffixspec.bench import arctic

    results = []
    for factor, offset, min_prob, tree in itertools.product(
        (1.0, 2.0, 4.0, 8.0), (0.0, 4.0), (0.05, 0.1, 0.2, 0.3), (False, True)
    ):
        p = arctic.ArcticParams(
            max_spec_factor=factor,
            max_spec_offset=offset,
            min_token_prob=min_prob,
            use_tree_spec=tree,
            history=False,
        )
        reps = [replay(arctic.ArcticSuffixProposer(p), trs, curve=curve) for trs in traces.values()]
        cost = sum(r.verify_s for r in reps) if curve else sum(r.steps for r in reps)
        results.append((cost, p))
        log(f"  {cost:10.3f} {'s' if curve else 'steps'}  {p.label()}")
    results.sort(key=lambda r: r[0])
    return results


def propose_cost(model: str, traces: dict[str, list[Trace]], rounds: int = 3) -> dict[str, dict[str, float]]:
    """Median propose CPU time per step (µs, this thread's CPU time) of our proposer with each single
    drafter and all, and of Arctic's best setting, interleaved round by round on the same replays."""
    from suffixspec.bench import arctic
    from suffixspec.drafting.proposers.suffix import SuffixProposer
    from suffixspec.loading import load_tokenizer

    tok = load_tokenizer(model)
    makers: dict[str, tuple[Callable[[], Proposer], tuple[str, ...] | None]] = {
        "ours_prompt": (lambda: SuffixProposer(tokenizer=tok, history=False), ("prompt",)),
        "ours_all": (lambda: SuffixProposer(tokenizer=tok, history=False), None),
    }
    if arctic.available():
        makers["arctic_suffix_best"] = (lambda: arctic.ArcticSuffixProposer(arctic.ARCTIC_BEST), None)
    times: dict[str, dict[str, list[float]]] = {name: {} for name in makers}
    for _ in range(rounds):
        for w, trs in traces.items():
            for name, (make, drafters) in makers.items():
                r = replay(make(), trs, drafters)
                times[name].setdefault(w, []).append(1e6 * r.propose_cpu_s / max(1, r.steps))
    return {name: {w: round(statistics.median(v), 1) for w, v in ws.items()} for name, ws in times.items()}


def run(
    model: str,
    traces: dict[str, list[Trace]],
    n: int,
    max_tokens: int,
    curve: dict[int, float] | None,
    gate: bool,
    history: bool,
    max_draft_tokens: int = 32,
    log=print,
    prefill: float | None = None,
) -> dict[str, Any]:
    """Per workload: the oracle and every system, as table rows (``loop_share`` of the outputs too);
    ``prefill``: seconds per prompt token (the whole-request estimate)."""
    table: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w, trs in traces.items():
            docs = documents_for(model, w, n, max_tokens, Path(tmp))
            share = round(statistics.mean(loop_share(t.output_ids) for t in trs), 3)
            rows = {
                "oracle": replay(
                    OracleDrafter(trs), trs, max_draft_tokens=max_draft_tokens, curve=curve, prefill=prefill
                ).row()
            }
            for name, (factory, drafters) in systems(model, history).items():
                rows[name] = replay(
                    factory(docs), trs, drafters, max_draft_tokens, curve=curve, gate=gate, prefill=prefill
                ).row()
            for name, row in rows.items():
                log(
                    f"| {w} | {share:.2f} | {name} | {row['forward_passes']} | {row['tokens_per_forward']:.2f} | "
                    f"{row['mean_draft']:.1f} | {row['drafted_per_accepted'] or 0:.2f} | "
                    f"{row.get('estimated_speedup', 0):.2f}× | {row.get('estimated_speedup_request', 0):.2f}× | "
                    f"{row['propose_cpu_us_per_step']:.0f} |"
                )
            table[w] = {"loop_share": share, "systems": rows}
    return table


HEADER = (
    "| workload | loop share | system | forward passes | tokens/forward | mean draft | drafted/accepted "
    "| estimated speedup | with the prefill | propose µs CPU/step |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path("suffixspec/bench/results/drafting_outputs.json"),
        help="greedy outputs, recorded once and reused",
    )
    ap.add_argument(
        "--outputs",
        choices=("recorded", "written"),
        default="recorded",
        help="the target's greedy outputs (recorded) or the answers written for the tasks (written)",
    )
    ap.add_argument(
        "--max-draft-tokens",
        type=int,
        default=32,
        help="the engine's node budget per draft (its default, 32; a request may ask for up to 256)",
    )
    ap.add_argument(
        "--costs",
        type=Path,
        default=None,
        help="bench_limits --json output: turn steps into time with the model's verify cost curve",
    )
    ap.add_argument("--gate", action="store_true", help="the engine's draft gate in the loop (needs --costs)")
    ap.add_argument("--history", action="store_true", help="drafters keep earlier outputs (off by default)")
    ap.add_argument("--search", action="store_true", help="grid-search Arctic's settings first")
    ap.add_argument(
        "--cost", action="store_true", help="only time propose(): ours per drafter and Arctic, interleaved"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.gate and not args.costs:  # before recording outputs: a model run for nothing
        ap.error("--gate judges drafts by the model's verify cost curve: give --costs (bench_limits --json)")

    from suffixspec.bench import arctic
    from suffixspec.bench.bench_limits import load_curve, load_prefill

    wl = tuple(args.workloads.split(","))
    if args.outputs == "written":
        traces = written_traces(args.model, wl, args.requests, args.max_tokens)
    else:
        traces = record(args.model, wl, args.requests, args.max_tokens, args.cache)
    curve = load_curve(args.costs, args.model) if args.costs else None
    prefill = load_prefill(args.costs, args.model) if args.costs else None
    if args.cost:
        cost = propose_cost(args.model, traces)
        print("| proposer | " + " | ".join(wl) + " |\n|---|" + "---:|" * len(wl))
        for name, row in cost.items():
            print(f"| {name} | " + " | ".join(f"{row[w]:.0f} µs CPU" for w in wl) + " |")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"propose_us_per_step": cost}, indent=2))
        return
    if args.search:
        if not arctic.available():
            raise SystemExit("--search needs arctic-inference (docs/benchmarks.md says how to install it)")
        best = search_arctic(traces, curve)[0]
        print(f"best Arctic setting: {best[1].label()} ({best[0]:.3f})")
    print(HEADER)
    table = run(
        args.model,
        traces,
        args.requests,
        args.max_tokens,
        curve,
        args.gate,
        args.history,
        args.max_draft_tokens,
        log=lambda s: print(s, flush=True),
        prefill=prefill,
    )
    if not arctic.available():
        print(
            "(arctic-inference is not installed: the arctic_suffix rows are skipped; docs/benchmarks.md says how to install it)"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {k: str(v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"meta": meta, "results": table}, indent=2))


if __name__ == "__main__":
    main()
