"""One decision constant (a ``Policy`` field) at two or more values, side by side in one process.

A change to a rule of the policy module (how a draft model values its tokens, a gate's threshold) moves
figures by a few percent, less than two runs of ``suffixspec bench`` differ by on a shared machine. So
each request runs every system at every value of the field, one after the other in one process on one
engine (the same models, the same warm caches), the order turned round from one request to the next,
and the figure is this thread's CPU time. Every output must be the same at every value (the rules are
lossless); the table says so.

Worked example: ``--field model_value_shared --values true,false --systems ours_suffix,ours_all`` on four
code edits runs per request ``ours_suffix`` once (a system the field does not touch runs once, at the
first value, unless ``--every``), ``ours_all`` at true and at false; the totals read, say, 37.7 s, 38.5 s
and 43.2 s: the merged tree at 0.98x its suffix part with the rule, 0.87x without.

    python -m suffixspec.bench.bench_policy --model qwen2.5-coder-1.5b-instruct --draft-model auto \\
        --workloads code_edit --requests 4 --max-tokens 400 --field model_value_shared --values true,false \\
        --systems ours_suffix,ours_all [--json out.json]

Each value is a new ``Policy`` (``dataclasses.replace`` of the engine's, so it is validated) that the
engine takes with ``Engine.use_policy`` and lends its draft models; the engine's own policy is put back
at the end. Every run gets a fresh suffix proposer, and the engine keys the records it shares across
requests by the proposer objects, so no run inherits another's.
"""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any


def _parse(value: str) -> Any:
    """``true``/``false`` or a Python literal (``0.5``, ``(1, 2)``)."""
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    return ast.literal_eval(value.strip())


def run(
    model: str,
    drafts: list[str],
    workloads: list[str],
    n: int,
    max_tokens: int,
    field: str,
    values: list[Any],
    systems: list[str],
    every: bool = False,
    log=print,
) -> dict[str, Any]:
    from suffixspec.bench.run import workload_requests
    from suffixspec.bench.serving import run_ours_request, suffix_proposer_for
    from suffixspec.bench.systems import load_bench
    from suffixspec.drafting.policy import Policy

    if field not in {f.name for f in fields(Policy)}:
        raise SystemExit(f"Policy has no field {field!r}; see suffixspec/drafting/policy.py")
    bench = load_bench(model, drafts, False, 1, log)
    base = bench.engine.policy
    # one Policy per value (keyed by its repr: a literal may be a list), validated before any run
    policies = {repr(v): replace(base, **{field: v}) for v in values}
    touched = {s for s in systems if every or s.startswith("ours_")}
    results: dict[str, Any] = {}
    try:
        for w in workloads:
            reqs, _docs = workload_requests(w, bench, n, max_tokens, log)
            runs = [(s, v) for s in systems for v in (values if s in touched else values[:1])]
            totals = {f"{s}@{v}": 0.0 for s, v in runs}
            identical = True
            for k, req in enumerate(reqs):
                order = runs if k % 2 == 0 else runs[::-1]
                outs = {}
                for s, v in order:
                    bench.engine.use_policy(policies[repr(v)])
                    r = run_ours_request(bench, s, req, suffix_proposer_for(bench, None, s))
                    outs[f"{s}@{v}"] = r
                    totals[f"{s}@{v}"] += r.cpu_s
                same = len({tuple(r.tokens) for r in outs.values()}) == 1
                identical &= same
                log(
                    f"  {w} request {k + 1}/{len(reqs)}: {len(next(iter(outs.values())).tokens)} tokens, identical "
                    f"{same}; " + ", ".join(f"{name} {r.cpu_s:.2f} s" for name, r in outs.items())
                )
            results[w] = {
                "requests": len(reqs),
                "cpu_s": {k: round(v, 3) for k, v in totals.items()},
                "identical": identical,
            }
    finally:
        bench.engine.use_policy(base)
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = ["| workload | requests | system@value | CPU s | identical |", "|---|---:|---|---:|:---:|"]
    for w, r in results.items():
        for name, cpu in r["cpu_s"].items():
            lines.append(
                f"| {w} | {r['requests']} | {name} | {cpu:.2f} | {'yes' if r['identical'] else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--draft-model", default="none", help="comma-separated draft models, 'auto', or 'none'")
    ap.add_argument("--workloads", default="code_edit")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--field", required=True, help="a suffixspec.drafting.policy.Policy field")
    ap.add_argument("--values", default="true,false", help="comma-separated: true/false or Python literals")
    ap.add_argument("--systems", default="ours_all", help="comma-separated systems of suffixspec bench")
    ap.add_argument("--every", action="store_true", help="run every system at every value (not only ours_*)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from suffixspec.models import default_draft

    drafts = [
        default_draft(args.model) if d.strip() == "auto" else d.strip() for d in args.draft_model.split(",")
    ]
    drafts = [d for d in drafts if d not in (None, "", "none")]
    results = run(
        args.model,
        drafts,
        args.workloads.split(","),
        args.requests,
        args.max_tokens,
        args.field,
        [_parse(v) for v in args.values.split(",")],
        args.systems.split(","),
        args.every,
    )
    print(markdown(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"meta": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
