"""``suffixspec serve``: the REST API and the web page under waitress, a thin wrapper over ``create_app``.

torch and transformers are imported inside the command, so ``suffixspec --help`` stays fast.
"""

from __future__ import annotations

import click

from suffixspec.cli.options import model_options
from suffixspec.server.config import ServerConfig

DEFAULTS = ServerConfig  # the dataclass' class attributes are its defaults: the limits are defined there once


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
@click.option("--http-threads", default=16, show_default=True, type=click.IntRange(1, 256),
              help="waitress worker threads (connections served at once); torch's threads are --threads.")
@click.option("--max-queue", default=DEFAULTS.max_queue, show_default=True, type=click.IntRange(1, 10_000),
              help="Requests that may wait for the engine; more get 503 with Retry-After.")
@click.option("--max-num-seqs", default=DEFAULTS.max_num_seqs, show_default=True, type=click.IntRange(1, 256),
              help="Requests stepped together in one target forward pass (continuous batching); "
                   "1 serves one request at a time.")
@click.option("--prefix-cache-mb", default=float(DEFAULTS.prefix_cache_mb), show_default=True, type=click.FloatRange(0),
              help="Memory for the target's keys/values of earlier prompts: a prompt that starts with the "
                   "same tokens (a shared system prompt, a file sent again) skips that part of the prefill; "
                   "0 turns it off.")
@click.option("--max-tokens-limit", default=DEFAULTS.max_tokens_limit, show_default=True, type=click.IntRange(1),
              help="Largest max_tokens a request may ask for.")
@click.option("--max-body-mb", default=DEFAULTS.max_body_bytes / 2**20, show_default=True, type=click.FloatRange(0.01),
              help="Largest request body, in MiB.")
def serve_cmd(model, draft_model, db, device, weights, dtype, runtime, threads, host, port, api_key, served_model_name,
              allowed_hosts, allowed_origins, http_threads, max_queue, max_num_seqs, prefix_cache_mb, max_tokens_limit,
              max_body_mb):
    """Serve the OpenAI-compatible API (and the web page at /) under waitress.

    \b
    Examples:
      suffixspec serve                                  # SmolLM2-135M-Instruct on 127.0.0.1:8000
      suffixspec serve --model gemma-3-270m --db docs.db
      suffixspec serve --model ./model.gguf --draft-model none
      suffixspec serve --runtime llama-cpp              # the GGUF in llama.cpp, our drafter inside it
      SUFFIXSPEC_API_KEY=secret suffixspec serve --host 0.0.0.0 --port 8080
      suffixspec serve --served-model-name my-model --served-model-name gpt-4o-mini
    \b
    Then, with the official client:
      from openai import OpenAI
      client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="secret")
      client.chat.completions.create(model="suffixspec", messages=[{"role": "user", "content": "hi"}])
    """
    import logging

    from suffixspec.server import create_app
    from suffixspec.server.serve import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        click.echo(f"warning: serving on {host} without --api-key; anyone who can reach the port can use it",
                   err=True)
    from suffixspec.server.guards import is_loopback

    if allowed_hosts is None and not is_loopback(host.strip("[]")):
        allowed_hosts = "*" if host in ("0.0.0.0", "::", "") else host  # bound to a LAN address: clients use it
    cfg = ServerConfig(model=model, draft_model=draft_model, db=db, device=device, dtype=dtype, weights=weights,
                       runtime=runtime, threads=threads,
                       api_key=api_key,
                       served_model_name=list(served_model_name) or None, allowed_hosts=allowed_hosts,
                       allowed_origins=allowed_origins, max_queue=max_queue, max_num_seqs=max_num_seqs,
                       prefix_cache_mb=prefix_cache_mb,
                       max_tokens_limit=max_tokens_limit,
                       max_body_bytes=int(max_body_mb * 1024 * 1024))
    from suffixspec.index.store import StoreError

    click.echo(f"loading {model} ...", err=True)
    try:
        app = create_app(cfg)
    except StoreError as e:  # corrupt or foreign --db: a clear error and exit 1, not a traceback
        raise click.ClickException(str(e)) from None

    def ready(server) -> None:
        click.echo(f"suffixspec serving {app.extensions['suffixspec'].model_id} on "
                   f"http://{host}:{server.effective_port} (Ctrl-C to stop)", err=True)

    serve(app, host=host, port=port, threads=http_threads, on_ready=ready)
