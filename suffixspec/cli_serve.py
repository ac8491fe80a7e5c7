"""``suffixspec serve`` and ``suffixspec generate``: thin wrappers over ``SuffixSpec`` and ``create_app``.

torch and transformers are imported inside the commands, so ``suffixspec --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from .loading import DEFAULT_TARGET

_model_options = [
    click.option("--model", default=DEFAULT_TARGET, show_default=True,
                 help="Target model: a local directory, a hub id, or the embedded suffixspec/demo-target."),
    click.option("--draft-model", default="auto", show_default=True,
                 help="Draft model (any tokenizer). 'auto' = the embedded draft with the embedded target; "
                      "'none' = no draft model."),
    click.option("--db", type=click.Path(dir_okay=False), default=None,
                 help="SQLite document store (as for `suffixspec index add --db`); default: $SUFFIXSPEC_DB, "
                      "else ~/.local/share/suffixspec/index.db."),
    click.option("--device", default=None, help="torch device (default: cuda if present, else cpu)."),
    click.option("--dtype", default=None, help="Weights dtype: float32, bfloat16, float16 (default per device)."),
]


def model_options(fn):
    for opt in reversed(_model_options):
        fn = opt(fn)
    return fn


@click.command("serve")
@model_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind. Keep 127.0.0.1 unless the port is protected; use --api-key otherwise.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--api-key", envvar="SUFFIXSPEC_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on every /v1 route. Prefer the environment variable "
                   "SUFFIXSPEC_API_KEY: a key given on the command line is visible to every user of the machine "
                   "in the process list (ps).")
@click.option("--served-model-name", multiple=True,
              help="Model name clients give in `model` (repeatable: aliases); the first is the id /v1/models "
                   "reports. Default: --model. Other names get 404 model_not_found ('suffixspec' always works).")
@click.option("--allowed-hosts", default=None,
              help="Comma-separated Host names this server answers to besides localhost/127.0.0.1/[::1] "
                   "(a LAN name, a reverse proxy's domain); '*' = any. Default: loopback names only when bound "
                   "to a loopback address, else any.")
@click.option("--allowed-origins", default=None,
              help="Comma-separated web origins (https://app.example) whose pages may POST/DELETE here; "
                   "'*' = any. Default: only this server's own web page (cross-site requests get 403).")
@click.option("--threads", default=16, show_default=True, type=click.IntRange(1, 256),
              help="waitress worker threads (connections served at once).")
@click.option("--max-queue", default=32, show_default=True, type=click.IntRange(1, 10_000),
              help="Requests that may wait for the engine; more get 503 with Retry-After.")
@click.option("--max-num-seqs", default=4, show_default=True, type=click.IntRange(1, 256),
              help="Requests stepped together in one target forward pass (continuous batching); "
                   "1 serves one request at a time.")
@click.option("--prefix-cache-mb", default=256.0, show_default=True, type=click.FloatRange(0),
              help="Memory for the target's keys/values of earlier prompts: a prompt that starts with the "
                   "same tokens (a shared system prompt, a file sent again) skips that part of the prefill; "
                   "0 turns it off.")
@click.option("--max-tokens-limit", default=8192, show_default=True, type=click.IntRange(1),
              help="Largest max_tokens a request may ask for.")
@click.option("--max-body-mb", default=8.0, show_default=True, type=click.FloatRange(0.01),
              help="Largest request body, in MiB.")
def serve_cmd(model, draft_model, db, device, dtype, host, port, api_key, served_model_name, allowed_hosts,
              allowed_origins, threads, max_queue, max_num_seqs, prefix_cache_mb, max_tokens_limit, max_body_mb):
    """Serve the OpenAI-compatible API (and the web page at /) under waitress.

    \b
    Examples:
      suffixspec serve                                  # embedded demo models on 127.0.0.1:8000
      suffixspec serve --model Qwen/Qwen2.5-0.5B --draft-model none --db docs.db
      SUFFIXSPEC_API_KEY=secret suffixspec serve --host 0.0.0.0 --port 8080
      suffixspec serve --served-model-name my-model --served-model-name gpt-4o-mini
    \b
    Then, with the official client:
      from openai import OpenAI
      client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="secret")
      client.chat.completions.create(model="suffixspec", messages=[{"role": "user", "content": "hi"}])
    """
    import logging

    from .server import ServerConfig, create_app
    from .server.serve import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        click.echo(f"warning: serving on {host} without --api-key; anyone who can reach the port can use it",
                   err=True)
    from .server.guards import is_loopback

    if allowed_hosts is None and not is_loopback(host.strip("[]")):
        allowed_hosts = "*" if host in ("0.0.0.0", "::", "") else host  # bound to a LAN address: clients use it
    cfg = ServerConfig(model=model, draft_model=draft_model, db=db, device=device, dtype=dtype, api_key=api_key,
                       served_model_name=list(served_model_name) or None, allowed_hosts=allowed_hosts,
                       allowed_origins=allowed_origins, max_queue=max_queue, max_num_seqs=max_num_seqs,
                       prefix_cache_mb=prefix_cache_mb,
                       max_tokens_limit=max_tokens_limit,
                       max_body_bytes=int(max_body_mb * 1024 * 1024))
    from index.store import StoreError

    click.echo(f"loading {model} ...", err=True)
    try:
        app = create_app(cfg)
    except StoreError as e:  # corrupt or foreign --db: a clear error and exit 1, not a traceback
        raise click.ClickException(str(e)) from None

    def ready(server) -> None:
        click.echo(f"suffixspec serving {app.extensions['suffixspec'].model_id} on "
                   f"http://{host}:{server.effective_port} (Ctrl-C to stop)", err=True)

    serve(app, host=host, port=port, threads=threads, on_ready=ready)


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
    from .api import SuffixSpec

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
        from .cli import allow_fast_exit

        allow_fast_exit()
        return
    if not stream:
        click.echo(result.text)
    _print_stats(result, stats, pred)
    from .cli import allow_fast_exit

    allow_fast_exit()  # the store is closed and the output printed: nothing is left to finalize


def _prediction_tokens(spec, result, stats: dict, prediction: str | None) -> dict | None:
    """Accepted/rejected prediction tokens, counted as the server's ``usage`` counts them."""
    if prediction is None:
        return None
    from .server.responses import usage

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
