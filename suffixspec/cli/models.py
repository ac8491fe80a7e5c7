"""``suffixspec models``: the model names ``--model`` knows, installed or not, converted or not.

Reads package folders and the cache with ``stat`` only (no torch, no hashing), so it answers at once.
"""

from __future__ import annotations

import json

import click


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n else "-"


def _prepare_weights(name: str) -> str | None:
    """Build the model at its default weight format once, so that what its first start would write beside the
    converted model (the repacked GGUF blocks, or the int8 matrices: core/lean_weights.py) is there already;
    what was kept, or None where the format keeps nothing (float32)."""
    from suffixspec.core.lean import lean_forward
    from suffixspec.loading import load_model

    loaded = load_model(name, weights="auto")
    if loaded.lean_kind == "float":
        return None
    lean = lean_forward(loaded.model, loaded.lean_kind)
    if lean is None or not lean.stored:
        return None
    return f"{loaded.weights} weights {'kept' if lean.stored == 'written' else 'already kept'} for its starts"


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per model (one per line).")
@click.option("--convert", multiple=True, metavar="NAME",
              help="Convert NAME (a name below or a .gguf file) into the cache now rather than on first use, "
                   "with its default weight format's quantized matrices, e.g. while building an image "
                   "(repeatable).")
def models_cmd(as_json: bool, convert: tuple[str, ...]) -> None:
    """List the model names --model accepts: installed or not, converted into the cache or not,
    size on disk (the package's GGUF, the converted folder), memory when served (resident memory of
    `suffixspec serve` with the model alone, as measured; docs/models.md), licence, and the command that
    installs it.

    The first use of a name converts its GGUF once into the cache ($SUFFIXSPEC_CACHE, default
    ~/.cache/suffixspec); later loads read the cache. Any .gguf file, local folder or hub id works
    with --model too.

    \b
    Examples:
      suffixspec models
      suffixspec models --convert smollm2-135m-instruct
      suffixspec generate --model smollm2-135m-instruct --chat "What is a suffix tree?"
    """
    from suffixspec.gguf_cache import cache_dir, describe
    from suffixspec.models import DEFAULT_MODEL, DEMO_TARGET, KNOWN_MODELS

    for name in convert:
        if name not in KNOWN_MODELS and not name.lower().endswith(".gguf"):
            raise click.BadParameter(f"{name!r} is neither a name from this list nor a .gguf file",
                                     param_hint="--convert")
        from suffixspec.loading import resolve_model_path

        click.echo(f"{name}: {resolve_model_path(name)}", err=True)
        kept = _prepare_weights(name)
        if kept:
            click.echo(f"  {kept}", err=True)

    rows = [describe(m) for m in KNOWN_MODELS.values()]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    table = [("NAME", "INSTALLED", "CACHED", "PACKAGE", "CONVERTED", "SERVED", "LICENCE")]
    table += [(r["name"] + (" (default)" if r["name"] == DEFAULT_MODEL else ""), "yes" if r["installed"] else "no",
               r["cached"], _mb(r["source_bytes"]), _mb(r["cache_bytes"]),
               f"{r['served_gb']:.1f} GB" if r["served_gb"] else "-",
               r["licence"] + (f" (upstream {r['upstream_licence']})" if r["upstream_licence"] else ""))
              for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    click.echo()
    for r in rows:
        click.echo(f"{r['name']}: {r['description']}")
        if not r["installed"]:
            click.echo(f"  install: {r['install']}")
    click.echo(f"\ncache: {cache_dir() / 'models'} (set SUFFIXSPEC_CACHE to move it)")
    click.echo(f"also: any .gguf file, a local folder, a hub id; {DEMO_TARGET} is the embedded 9M-parameter "
               "test model (offline smoke runs, no speed claims)")
