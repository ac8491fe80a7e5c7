"""``suffixspec generate``: one generation, a thin wrapper over ``SuffixSpec.stream``.

torch and transformers are imported inside the command, so ``suffixspec --help`` stays fast.

What it reports apart (``Timing``): start-up, the prefill, the first decode step and the decode speed
after it. Start-up pays the process's one-time set-up (loading; ``SuffixSpec`` warms the engine up:
packed weights, the batching probe unless a start before remembered its verdict (``probe_cache``),
the thread count's timed passes), and the decode tokens/s is measured over the steps after the first
(whose draft may still build what a drafter makes on first use). The draft model is loaded only
when the request can draft from it (not with ``--no-speculation``, ``--max-tokens 1`` or
``--drafters`` without ``draft_model``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from suffixspec.cli.options import DrafterList, model_options
from suffixspec.cli.process import allow_fast_exit


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


@dataclass
class Timing:
    """Where one ``generate`` run's seconds went. Example: 40 prompt tokens, 7 completion tokens in 5
    steps -> prefill 0.40 s, first step 1.30 s (2 tokens), then 5 tokens in 0.50 s: 10 tokens/s decode."""

    load_s: float  # building SuffixSpec: imports, tokenizer, model(s), store, the engine's warm-up
    prefill_s: float  # the engine's prefill of the prompt
    first_step_s: float  # the first decode step (with the prompt's tokenizing)
    first_step_tokens: int  # tokens the first step produced
    decode_s: float  # the steps after the first
    decode_tokens: int  # tokens those steps produced

    def __post_init__(self) -> None:
        if min(self.load_s, self.prefill_s, self.first_step_s, self.decode_s) < 0:
            raise ValueError(f"a Timing holds a negative duration: {self}")

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens per second after the first step; None when there was no later step."""
        return self.decode_tokens / self.decode_s if self.decode_tokens and self.decode_s > 0 else None

    def to_dict(self) -> dict:
        # the rate from the rounded seconds, so the figures printed agree with each other
        rounded = Timing(**{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()})
        rate = rounded.decode_tokens_per_s
        return {**asdict(rounded), "decode_tokens_per_s": None if rate is None else round(rate, 2)}


def _draft_model_needed(speculation, max_tokens: int) -> bool:
    """Whether the request can draft from a draft model: it speculates, does not leave the draft model out,
    and has room for a draft (the first token of an output is the target's own: --max-tokens 1 never drafts)."""
    if max_tokens <= 1:
        return False
    if speculation is None:
        return True
    return speculation.enabled and (speculation.drafters is None or "draft_model" in speculation.drafters)


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
@click.option("--drafters", default=None, type=DrafterList(),
              help="Comma-separated drafters to use "
                   "(a --prediction drafts whenever it is given, listed or not).")
@click.option("--max-draft-tokens", default=None, type=click.IntRange(0, 256))
@click.option("--no-speculation", is_flag=True, help="Plain decoding (one target token per step), for comparison.")
@click.option("--compare", is_flag=True,
              help="Run the request twice in this process, with speculation and then without, and print both "
                   "decode speeds, tokens per step and whether the outputs are identical.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print text as it is generated.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, finish reason, statistics).")
@click.option("--no-history", is_flag=True,
              help="Neither draft from nor save to the output history: nothing generated is stored, and "
                   "earlier runs do not change this one.")
def generate_cmd(prompt, model, draft_model, db, device, weights, dtype, runtime, threads, prompt_file, chat, max_tokens,
                 temperature, top_p, top_k, seed, stop, references, prediction, drafters, max_draft_tokens, no_speculation,
                 compare, stream, as_json, no_history):
    """Generate one completion and print the text, then the speculative-decoding statistics.

    The statistics give the decode speed apart from start-up (loading and the one-time warm-up), the
    prefill and the first step, then the thread count and how it was chosen (measured at start unless
    --threads or OMP_NUM_THREADS fixes it).

    Every output is saved in the output history of the --db store (default
    ~/.local/share/suffixspec/index.db), and later runs draft from it: that is why a second
    identical run is faster and prints other statistics. --no-history turns that off.

    \b
    Examples:
      suffixspec generate "def fibonacci(n):" --max-tokens 64
      suffixspec generate --prompt-file edit.txt --prediction old_file.py --json
      suffixspec generate "Summarize:" --reference chunk1.txt --reference chunk2.txt
      suffixspec generate "def f(x):" --no-speculation      # the same text, slower
      suffixspec generate --prompt-file examples/edit.txt --chat --compare   # both, side by side
    """
    from suffixspec.api import SuffixSpec

    if prompt_file:
        prompt = _read(prompt_file)
    if not prompt:
        raise click.UsageError("give a PROMPT argument or --prompt-file")
    if compare and no_speculation:
        raise click.UsageError("--compare runs the request with and without speculation; drop --no-speculation")
    if no_speculation:
        speculation = False
    elif drafters or max_draft_tokens is not None:
        speculation = {}
        if drafters:
            speculation["drafters"] = drafters
        if max_draft_tokens is not None:
            speculation["max_draft_tokens"] = max_draft_tokens
    else:
        speculation = None
    try:
        speculation = SuffixSpec.speculation_config(speculation)  # bad drafter names fail before loading
        if not _draft_model_needed(speculation, max_tokens):
            draft_model = None  # loading it would only delay the first token
        t = time.perf_counter()
        spec = SuffixSpec(model=model, draft_model=draft_model, db=db, device=device, dtype=dtype, weights=weights,
                          history=not no_history, threads=threads, runtime=runtime)
        load_s = time.perf_counter() - t
        kw = dict(speculation=speculation, references=[_read(p) for p in references] or None,
                  prediction=_read(prediction) if prediction else None, max_tokens=max_tokens,
                  temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=list(stop))
        source = dict(messages=[{"role": "user", "content": prompt}]) if chat else dict(prompt=prompt)
        result, timing = _run(spec, source, kw, load_s, echo=stream and not as_json)
        # --compare: the plain run second, so it cannot draft from (and the first run's drafts never came
        # from) an output this command wrote to the history
        plain = _run(spec, source, {**kw, "speculation": SuffixSpec.speculation_config(False)}, 0.0,
                     echo=False) if compare else None
        threads_used = spec.threads
        weights_used = spec.weights
        spec.close()
    except (ValueError, OSError) as e:  # OSError: a model or file that cannot be read (transformers says which)
        raise click.ClickException(str(e)) from None
    stats = result.stats.to_dict()
    pred = _prediction_tokens(spec, result, stats, kw["prediction"])
    comparison = _comparison(result, timing, *plain) if plain is not None else None
    if as_json:
        out = {"text": result.text, "finish_reason": result.finish_reason,
               "prompt_tokens": len(result.prompt_token_ids), "completion_tokens": len(result.token_ids),
               "timing": timing.to_dict(), "speculative_decoding": stats, "threads": threads_used,
               "weights": weights_used}
        if pred is not None:
            out["completion_tokens_details"] = pred
        if comparison is not None:
            out["compare"] = comparison
        click.echo(json.dumps(out, ensure_ascii=False))
        allow_fast_exit()
        return
    if not stream:
        click.echo(result.text)
    _print_stats(result, stats, timing, pred, threads_used, comparison, sampled=temperature > 0 and seed is None,
                 weights=weights_used)
    allow_fast_exit()  # the store is closed and the output printed: nothing is left to finalize


def _run(spec, source: dict, kw: dict, load_s: float, echo: bool):
    """Stream the generation (printing its text when ``echo``) and time its steps: (result, Timing).

    The engine sends one event per decode step, then a last one with the result; the first step's event
    comes after the prefill, so first step = time to it - prefill."""
    result = None
    t0 = time.perf_counter()
    first_at = last_at = None
    first_tokens = tokens = 0
    for ev in spec.stream(**source, **kw):
        now = time.perf_counter()
        if ev.token_ids:
            tokens += len(ev.token_ids)
            if first_at is None:
                first_at, first_tokens = now, len(ev.token_ids)
            last_at = now
        if echo:
            click.echo(ev.text, nl=False)
        result = ev.result or result
    if echo:
        click.echo()
    prefill = float(result.stats.time_prefill_s)
    first_at = first_at or time.perf_counter()
    timing = Timing(load_s, prefill, max(0.0, first_at - t0 - prefill), first_tokens,
                    (last_at or first_at) - first_at, tokens - first_tokens)
    return result, timing


def _prediction_tokens(spec, result, stats: dict, prediction: str | None) -> dict | None:
    """Accepted/rejected prediction tokens, counted as the server's ``usage`` counts them."""
    if prediction is None:
        return None
    from suffixspec.server.responses import usage

    n = len(spec.tokenizer.encode(prediction, add_special_tokens=False))
    details = usage(result, n)["completion_tokens_details"]
    return {k: details[k] for k in ("accepted_prediction_tokens", "rejected_prediction_tokens")}


def _comparison(result, timing: Timing, plain_result, plain_timing: Timing) -> dict:
    """What ``--compare`` reports: both runs' decode speeds and tokens per step, the speedup (decode
    tokens/s, after each run's first step: the second run's prefill reuses the first's prompt prefix), and
    whether the outputs are the same tokens. Example: 45.0 against 15.0 tokens/s -> speedup 3.0."""
    def one(res, t: Timing) -> dict:
        st = res.stats.to_dict()
        return {"decode_tokens_per_s": t.to_dict()["decode_tokens_per_s"], "steps": st["steps"],
                "tokens_per_step": round(st["mean_accepted_length"], 2), "completion_tokens": len(res.token_ids)}
    spec, plain = one(result, timing), one(plain_result, plain_timing)
    a, b = spec["decode_tokens_per_s"], plain["decode_tokens_per_s"]
    return {"speculative": spec, "plain": plain, "speedup": round(a / b, 2) if a and b else None,
            "identical": list(result.token_ids) == list(plain_result.token_ids)}


def _compare_line(c: dict, sampled: bool) -> str:
    spec, plain = c["speculative"], c["plain"]

    def rate(r: dict) -> str:
        v = r["decode_tokens_per_s"]
        return f"{v:.1f} tokens/s" if v is not None else "n/a tokens/s"
    speedup = f"{c['speedup']:.2f}x" if c["speedup"] is not None else "speedup n/a (an output ended in its first step)"
    same = ("outputs identical" if c["identical"] else
            "outputs differ (sampling without --seed draws anew each run)" if sampled else "outputs differ")
    return (f"compare: speculative {rate(spec)} ({spec['tokens_per_step']:.2f} tokens/step, {spec['steps']} steps), "
            f"plain {rate(plain)} ({plain['tokens_per_step']:.2f} tokens/step, {plain['steps']} steps): {speedup}, "
            f"{same}")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _print_stats(result, stats: dict, timing: Timing, pred: dict | None = None, threads: dict | None = None,
                 comparison: dict | None = None, sampled: bool = False, weights: str | None = None) -> None:
    per_source = ", ".join(f"{src} {d['accepted']}/{d['drafted']}" for src, d in stats["per_source"].items())
    rate = timing.decode_tokens_per_s
    decode = (f"decode: {rate:.1f} tokens/s ({timing.decode_tokens} tokens in {timing.decode_s:.2f}s, after "
              "the first step)" if rate is not None else
              "decode: the output ended in its first step; ask for more tokens to measure the decode speed")
    lines = [
        f"finish: {result.finish_reason}; {len(result.prompt_token_ids)} prompt + {len(result.token_ids)} "
        "completion tokens",
        decode,
        f"prefill {timing.prefill_s:.2f}s ({_n(len(result.prompt_token_ids), 'token')}), first step "
        f"{timing.first_step_s:.2f}s ({_n(timing.first_step_tokens, 'token')}); start-up {timing.load_s:.2f}s "
        "(imports, tokenizer, model, store, warm-up)",
        f"steps: {stats['steps']}; mean accepted length {stats['mean_accepted_length']:.2f} tokens/step; "
        f"acceptance {stats['acceptance_rate']:.1%} ({stats['accepted_tokens']}/{stats['drafted_tokens']} drafted)",
    ]
    if per_source:
        lines.append(f"accepted/drafted by source: {per_source}")
    if pred is not None:
        lines.append(f"prediction: {pred['accepted_prediction_tokens']} tokens accepted, "
                     f"{pred['rejected_prediction_tokens']} rejected")
    if threads:
        from suffixspec.core.threads import describe

        lines.append(f"threads: {describe(threads)}")
    if weights:
        lines.append(f"weights: {weights} (--weights; docs/formats.md)")
    if comparison is not None:
        lines.append(_compare_line(comparison, sampled))
    click.echo("\n".join("-- " + line for line in lines), err=True)

