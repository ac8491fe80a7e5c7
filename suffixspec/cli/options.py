"""Options shared by the commands that load a model (``serve``, ``generate``)."""

from __future__ import annotations

import click

from ..models import DEFAULT_MODEL

_model_options = [
    click.option("--model", default=DEFAULT_MODEL, show_default=True,
                 help="Target model: a name from `suffixspec models` (smollm2-135m-instruct, gemma-3-270m), "
                      "a .gguf file, a local folder, a hub id, or the embedded test model suffixspec/demo-target."),
    click.option("--draft-model", default="auto", show_default=True,
                 help="Draft model (any tokenizer), named as --model. 'auto' = the draft model shipped for the "
                      "target, if any; 'none' = no draft model."),
    click.option("--db", type=click.Path(dir_okay=False), default=None,
                 help="SQLite document store (as for `suffixspec index add --db`); default: $SUFFIXSPEC_DB, "
                      "else ~/.local/share/suffixspec/index.db."),
    click.option("--device", default=None, help="torch device (default: cuda if present, else cpu)."),
    click.option("--dtype", default=None, help="Weights dtype: float32, bfloat16, float16 (default per device)."),
    click.option("--threads", type=click.IntRange(1, 1024), default=None,
                 help="torch threads for the model's passes. Default on a CPU: measured at start (one thread or "
                      "every core, whichever passes faster) and re-checked while decoding, as the machine's load "
                      "changes; OMP_NUM_THREADS fixes it too."),
]


def model_options(fn):
    for opt in reversed(_model_options):
        fn = opt(fn)
    return fn
