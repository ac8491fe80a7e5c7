"""Options shared by the commands that load a model (``serve``, ``generate``)."""

from __future__ import annotations

from typing import Any

import click

from suffixspec.drafting.registry import source_names
from suffixspec.models import DEFAULT_MODEL, KNOWN_MODELS

# the names `--model` accepts besides paths and hub ids, from the registry (suffixspec/models.py), so a model
# registered there is named in every command's help
MODEL_NAMES = ", ".join(KNOWN_MODELS)


class DrafterList(click.ParamType):
    """Comma-separated drafter names (``--drafters prompt,references``), the registry's
    (``drafting.registry.source_names``): checked when parsed, listed in ``--help`` as it is shown."""

    name = "drafters"

    def choices(self) -> tuple[str, ...]:
        return source_names()

    def get_metavar(self, param: Any, ctx: Any = None) -> str:
        return "[" + ",".join(self.choices()) + "]"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        names = tuple(d.strip() for d in str(value).split(",") if d.strip())
        unknown = [d for d in names if d not in self.choices()]
        if unknown:
            self.fail(f"unknown drafter(s) {', '.join(unknown)}; choose from {','.join(self.choices())}", param, ctx)
        return names

_model_options = [
    click.option("--model", default=DEFAULT_MODEL, show_default=True,
                 help=f"Target model: a name from `suffixspec models` ({MODEL_NAMES}), "
                      "a .gguf file, a local folder, a hub id, or the embedded test model suffixspec/demo-target."),
    click.option("--draft-model", default="auto", show_default=True,
                 help="Draft model (any tokenizer), named as --model. 'auto' = the draft model shipped for the "
                      "target, if any; 'none' = no draft model."),
    click.option("--db", type=click.Path(dir_okay=False), default=None,
                 help="SQLite document store (as for `suffixspec index add --db`); default: $SUFFIXSPEC_DB, "
                      "else ~/.local/share/suffixspec/index.db."),
    click.option("--device", default=None, help="torch device (default: cuda if present, else cpu)."),
    click.option("--weights", type=click.Choice(["auto", "float32", "bfloat16", "float16", "int8", "gguf", "gguf16"]), default="auto",
                 show_default=True,
                 help="Weight format of the target and draft model. auto: on a CPU gguf for a model named by its GGUF "
                      "file (unless measured to lose quality: SmolLM2 runs gguf16), else the fastest exact int8 "
                      "kernel measured there; on a GPU bfloat16/float16. gguf: the "
                      "GGUF file's own blocks (Q4_K, Q6_K, ...) and 8-bit activations, gguf16: the same blocks and "
                      "~15-bit activations (float32's tokens more often, twice the arithmetic), int8: int8 rows; each gives "
                      "its own output, identical with speculation on and off; float32: exactly transformers' "
                      "output; bfloat16/float16: not exact (docs/formats.md)."),
    click.option("--dtype", default=None, help="Older name for a floating --weights: float32, bfloat16, float16."),
    click.option("--runtime", type=click.Choice(["transformers", "llama-cpp"]), default="transformers",
                 show_default=True,
                 help="What runs the model: our engine over transformers, or llama-cpp: the GGUF in llama.cpp "
                      "with the suffix drafter inside it (pip install 'suffixspec[llama-cpp]'; no draft model; "
                      "docs/llama_cpp.md)."),
    click.option("--threads", type=click.IntRange(1, 1024), default=None,
                 help="torch threads for the model's passes. Default on a CPU: measured at start (one thread or "
                      "every core, whichever passes faster) and re-checked while decoding, as the machine's load "
                      "changes; OMP_NUM_THREADS fixes it too. --runtime llama-cpp: llama.cpp's threads (default: "
                      "the physical cores)."),
]


def model_options(fn):
    for opt in reversed(_model_options):
        fn = opt(fn)
    return fn
