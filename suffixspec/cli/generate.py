"""``suffixspec generate``: one generation, a thin wrapper over ``SuffixSpec.generate`` / ``stream``.

torch and transformers are imported inside the command, so ``suffixspec --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from .options import model_options
from .process import allow_fast_exit


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


@click.command("generate")
@click.argument("prompt", required=False)
@model_options
@click.option("--prompt-file", type=click.Path(exists=True, dir_okay=False), help="Read the prompt from a file.")
@click.option("--chat", is_flag=True, help="Treat PROMPT as a user message and apply the chat template.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0, 2),
              help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0))
@click.option("--seed", default=None, type=int)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--reference", "references", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="A file whose text the output may copy from (repeatable; RAG chunks).")
@click.option("--prediction", type=click.Path(exists=True, dir_okay=False),
              help="A file holding the expected output (code edits).")
@click.option("--drafters", default=None,
              help="Comma-separated drafters to use: prompt,history,documents,references,draft_model.")
@click.option("--max-draft-tokens", default=None, type=click.IntRange(0, 256))
@click.option("--no-speculation", is_flag=True, help="Plain decoding (one target token per step), for comparison.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print text as it is generated.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, finish reason, statistics).")
@click.option("--no-history", is_flag=True,
              help="Neither draft from nor save to the output history: nothing generated is stored, and "
                   "earlier runs do not change this one.")
def generate_cmd(prompt, model, draft_model, db, device, dtype, prompt_file, chat, max_tokens, temperature, top_p,
                 top_k, seed, stop, references, prediction, drafters, max_draft_tokens, no_speculation, stream,
                 as_json, no_history):
    """Generate one completion and print the text, then the speculative-decoding statistics.

    Every output is saved in the output history of the --db store (default
    ~/.local/share/suffixspec/index.db), and later runs draft from it: that is why a second
    identical run is faster and prints other statistics. --no-history turns that off.

    \b
    Examples:
      suffixspec generate "def fibonacci(n):" --max-tokens 64
      suffixspec generate --prompt-file edit.txt --prediction old_file.py --json
      suffixspec generate "Summarize:" --reference chunk1.txt --reference chunk2.txt
      suffixspec generate "def f(x):" --no-speculation      # the same text, slower
    """
    from ..api import SuffixSpec

    if prompt_file:
        prompt = _read(prompt_file)
    if not prompt:
        raise click.UsageError("give a PROMPT argument or --prompt-file")
    if no_speculation:
        speculation = False
    elif drafters or max_draft_tokens is not None:
        speculation = {}
        if drafters:
            speculation["drafters"] = tuple(d.strip() for d in drafters.split(",") if d.strip())
        if max_draft_tokens is not None:
            speculation["max_draft_tokens"] = max_draft_tokens
    else:
        speculation = None
    try:
        speculation = SuffixSpec.speculation_config(speculation)  # bad drafter names fail before loading
        spec = SuffixSpec(model=model, draft_model=draft_model, db=db, device=device, dtype=dtype,
                          history=not no_history)
        kw = dict(speculation=speculation, references=[_read(p) for p in references] or None,
                  prediction=_read(prediction) if prediction else None, max_tokens=max_tokens,
                  temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=list(stop))
        source = dict(messages=[{"role": "user", "content": prompt}]) if chat else dict(prompt=prompt)
        if stream and not as_json:
            result = None
            for ev in spec.stream(**source, **kw):
                click.echo(ev.text, nl=False)
                result = ev.result or result
            click.echo()
        else:
            result = spec.generate(**source, **kw)
        spec.close()
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    stats = result.stats.to_dict()
    pred = _prediction_tokens(spec, result, stats, kw["prediction"])
    if as_json:
        out = {"text": result.text, "finish_reason": result.finish_reason,
               "prompt_tokens": len(result.prompt_token_ids), "completion_tokens": len(result.token_ids),
               "speculative_decoding": stats}
        if pred is not None:
            out["completion_tokens_details"] = pred
        click.echo(json.dumps(out, ensure_ascii=False))
        allow_fast_exit()
        return
    if not stream:
        click.echo(result.text)
    _print_stats(result, stats, pred)
    allow_fast_exit()  # the store is closed and the output printed: nothing is left to finalize


def _prediction_tokens(spec, result, stats: dict, prediction: str | None) -> dict | None:
    """Accepted/rejected prediction tokens, counted as the server's ``usage`` counts them."""
    if prediction is None:
        return None
    from ..server.responses import usage

    n = len(spec.tokenizer.encode(prediction, add_special_tokens=False))
    details = usage(result, n)["completion_tokens_details"]
    return {k: details[k] for k in ("accepted_prediction_tokens", "rejected_prediction_tokens")}


def _print_stats(result, stats: dict, pred: dict | None = None) -> None:
    per_source = ", ".join(f"{src} {d['accepted']}/{d['drafted']}" for src, d in stats["per_source"].items())
    secs = stats["time_total_s"] or 1e-9
    lines = [
        f"finish: {result.finish_reason}; {len(result.prompt_token_ids)} prompt + {len(result.token_ids)} "
        f"completion tokens in {secs:.2f}s ({len(result.token_ids) / secs:.1f} tokens/s)",
        f"steps: {stats['steps']}; mean accepted length {stats['mean_accepted_length']:.2f} tokens/step; "
        f"acceptance {stats['acceptance_rate']:.1%} ({stats['accepted_tokens']}/{stats['drafted_tokens']} drafted)",
    ]
    if per_source:
        lines.append(f"accepted/drafted by source: {per_source}")
    if pred is not None:
        lines.append(f"prediction: {pred['accepted_prediction_tokens']} tokens accepted, "
                     f"{pred['rejected_prediction_tokens']} rejected")
    click.echo("\n".join("-- " + line for line in lines), err=True)
