"""`suffixspec index ...`: manage the document corpus the suffix drafter reads from.

Each command is a thin wrapper over :class:`suffixspec.index.DocumentIndex`, the object behind
``SuffixSpec``'s document methods and the server's ``/v1/index`` routes, with the same option names:
``index add PATHS --glob --follow-links --max-bytes`` is ``add_paths(paths, globs, follow_links,
max_bytes)``, ``index list --limit --offset --query`` is ``list_documents(limit, offset, query)``,
``index remove KEYS`` is ``remove_documents(ids)``, ``index stats`` is ``index_stats()``.

Start-up stays light: ``index list`` / ``stats`` / ``remove`` import only click, numpy and sqlite-utils;
``index add`` loads a tokenizer, from the store when it keeps it (the ``tokenizers`` library alone), else
through transformers.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from suffixspec.cli.options import MODEL_NAMES

MODEL_ENV = "SUFFIXSPEC_MODEL"  # the model `index add` indexes for when --model is not given
_DB_HELP = ("SQLite database (default: $SUFFIXSPEC_DB, else $XDG_DATA_HOME/suffixspec/index.db, "
            "i.e. ~/.local/share/suffixspec/index.db)")


def _index(db: str | None, **kw: Any):
    from suffixspec.index import DocumentIndex

    return DocumentIndex(db, **kw)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class _IndexGroup(click.Group):
    """The document index's own errors (a corrupt or foreign database, a writer process that died, a
    database that refuses writes) as one ``Error:`` line with what to do, never a traceback."""

    def invoke(self, ctx: click.Context):
        from suffixspec.index import InvalidDocument, StoreError

        try:
            return super().invoke(ctx)
        except (StoreError, InvalidDocument) as e:
            raise click.ClickException(str(e)) from None


@click.group("index", cls=_IndexGroup, context_settings={"help_option_names": ["-h", "--help"]})
def index_group() -> None:
    """Manage the persistent document corpus used by the suffix drafter.

    Documents are indexed per tokenizer: `index add` indexes for the model named with --model (default:
    $SUFFIXSPEC_MODEL, else the model this store was last served or indexed with); a server of another
    model indexes them for its own tokenizer when it loads them.

    \b
    Examples:
      suffixspec index add docs/ src/ --glob '*.py' --glob '*.md'
      suffixspec index add notes.txt --model smollm2-135m-instruct
      suffixspec index list --query area
      suffixspec index remove 3 docs/old.md
      suffixspec index stats
      suffixspec index merge
      SUFFIXSPEC_DB=./test.db suffixspec index stats
    """


@index_group.command("add")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--glob", "globs", multiple=True, metavar="PATTERN",
              help="Only index file names matching PATTERN (repeatable), e.g. '*.py'.")
@click.option("--db", default=None, metavar="FILE", help=_DB_HELP)
@click.option("--model", default=None, metavar="NAME_OR_PATH",
              help=f"Index for this model's tokenizer: a model name ({MODEL_NAMES}), a folder "
                   f"or a hub id. Default: ${MODEL_ENV}, else the model this store was last served or indexed with, "
                   "else the default model.")
@click.option("--tokenizer", default=None, metavar="NAME_OR_PATH",
              help="Index for this tokenizer alone (a folder or hub id with no model), instead of --model's.")
@click.option("--exclude", "exclude", multiple=True, metavar="PATTERN",
              help="Do not enter directories, nor index files, whose name matches PATTERN (repeatable), e.g. 'test*' "
                   "and 'tests' to leave tests out, 'site-packages'.")
@click.option("--max-bytes", default=None, type=int, metavar="N",
              help="Skip files larger than N bytes (default 2 MiB).")
@click.option("--follow-links", is_flag=True,
              help="Also index files that symlinks point to outside PATHS (skipped by default).")
@click.option("--no-merge", is_flag=True, help="Leave segment merges for later (`index merge`, or a server).")
@click.option("--nice", default=10, show_default=True, type=click.IntRange(0, 19),
              help="CPU niceness of large adds (1 MiB of text or more): their tokenizing and sorting run in a writer "
                   "process in a scheduler group of its own, so that a server on this machine keeps its pace. Smaller "
                   "adds run in this process at its priority. 0: always in this process.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, no per-file warnings.")
def add_cmd(paths: tuple[str, ...], globs: tuple[str, ...], db: str | None, model: str | None,
            tokenizer: str | None, exclude: tuple[str, ...], max_bytes: int | None, follow_links: bool,
            no_merge: bool, nice: int, quiet: bool) -> None:
    """Index text files under PATHS (directories are walked recursively).

    Binary and empty files (binary judged from the first 8 KiB), files over --max-bytes, FIFOs and
    devices, dangling or looping symlinks and symlinks out of PATHS are skipped: each is named in a
    warning and counted in the summary. Hidden directories, __pycache__ and node_modules are not
    walked. Re-adding an unchanged file changes nothing; a changed file replaces its old version.
    Files are read and tokenized as they are streamed into the index (memory stays bounded whatever
    the corpus size); every ~16M tokens a segment is committed, and segments are merged at the end
    (--no-merge: later). Interrupted, the index keeps the segments committed so far (whole files; a
    rerun skips them as unchanged) and nothing half-built. Exits with status 1 when there is nothing
    to index.

    The summary line says how long the add took, what the store holds on disk (and how much of it this
    add wrote) and the peak memory of this command and of its writer process.

    \b
    Examples:
      suffixspec index add docs/
      suffixspec index add . --glob '*.py' --db ./project.db --model smollm2-135m-instruct
      suffixspec index add "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \\
          --glob '*.py' --exclude 'test*' --exclude tests
    """
    import time
    from collections import Counter

    started = time.perf_counter()
    index = _index(db, load_tokenizer=_tokenizer_loader(model, tokenizer, quiet), nice=nice, own_group=True)
    disk_before = _disk_bytes(index.path)
    try:
        files = index.find_files(paths, globs, follow_links, max_bytes, exclude)
    except FileNotFoundError as e:
        raise click.ClickException(str(e)) from e
    skipped: Counter[str] = Counter()  # skip kind -> files
    bar = _bar(quiet or not files.candidates, total=files.total_bytes, desc="indexing", unit="B", unit_scale=True)
    tokens = 0

    def on_skip(path: str, kind: str, reason: str) -> None:
        skipped[kind] += 1
        _note(f"warning: skipped {path}: {reason}", quiet)

    def progress(n_docs: int, n_tokens: int, n_bytes: int) -> None:
        nonlocal tokens
        tokens += n_tokens
        bar.set_postfix_str(f"{tokens:,} tokens", refresh=False)
        bar.update(n_bytes)

    def status(text: str) -> None:
        bar.set_postfix_str(f"{tokens:,} tokens, {text}")

    def why() -> str:
        return ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))

    try:
        with bar:
            summary = index.add_files(files, progress=progress, status=status, on_skip=on_skip)
        if not summary.outcomes:  # nothing to index is a mistake to point out, not a success with zeros
            where = " ".join(paths) + (f" matching {' or '.join(repr(g) for g in globs)}" if globs else "")
            if not files.candidates:
                hint = ("hidden directories, __pycache__ and node_modules are not walked"
                        + ("; --glob matches file names, e.g. '*.md'" if globs else ""))
                raise click.ClickException(f"nothing to index: no files found under {where} ({hint})")
            raise click.ClickException(f"nothing to index: all {len(files.candidates)} file(s) under {where} were "
                                       f"skipped ({why()})" + ("" if quiet else "; see the warnings above"))
        merged = 0 if no_merge else _merge(index, quiet, compact=False)
    except KeyboardInterrupt:
        bar.close()
        n = index.store.documents.count()[0]
        click.echo(f"interrupted: the index keeps what was committed ({n} documents); rerun to add the rest",
                   err=True)
        raise SystemExit(130) from None
    finally:
        index.close()
    click.echo(f"added {summary.added}, updated {summary.updated}, unchanged {summary.unchanged}, "
               f"skipped {summary.skipped}, tokens {summary.tokens}" + (f", {merged} merge(s)" if merged else "")
               + f" for {index.tokenizer().name}  ({index.path})")
    disk = _disk_bytes(index.path)
    self_peak, writer_peak = _peak_memory()
    click.echo(f"took {time.perf_counter() - started:.1f} s; on disk {_human(disk)} ({_human(disk - disk_before):s} "
               f"written by this add); peak memory {_human(self_peak)}"
               + (f", writer process {_human(writer_peak)}" if writer_peak else ""))
    if skipped:
        click.echo(f"skipped: {why()}", err=True)


def _disk_bytes(db) -> int:
    """Bytes the store at ``db`` takes on disk: the database, its WAL, and the arrays folder beside it."""
    from pathlib import Path

    db = Path(db)
    files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
    arrays = Path(f"{db}.arrays")
    if arrays.is_dir():
        files += list(arrays.iterdir())
    return sum(p.stat().st_size for p in files if p.is_file())


def _peak_memory() -> tuple[int, int]:
    """Peak resident memory of this process and of its largest finished child (the writer process), in bytes
    (0 where the platform does not say)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return 0, 0
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is in bytes on macOS, KiB on Linux
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale)


def _tokenizer_loader(model: str | None, tokenizer: str | None, quiet: bool):
    """How ``index add`` picks the tokenizer it indexes for, called once there is a file to index:
    ``--tokenizer``, else ``--model``, else ``$SUFFIXSPEC_MODEL``, else the tokenizer the store was last
    served or indexed with, else the default model. A tokenizer the store keeps (it served it or indexed
    for it before) loads without transformers."""
    from suffixspec.index.document_index import TokenizerChoice

    def load(index) -> TokenizerChoice:
        name, why = tokenizer or model, "--tokenizer" if tokenizer else "--model"
        if not name and os.environ.get(MODEL_ENV):
            name, why = os.environ[MODEL_ENV], f"${MODEL_ENV}"
        label = name
        if not name:
            last = index.last_tokenizer()
            kept = index.stored_tokenizer(last.fingerprint) if last is not None else None
            if kept is not None:
                _note(f"indexing for {last.label} (tokenizer {last.fingerprint[:12]}: the one this store was last "
                      "served or indexed with; --model to choose another)", quiet)
                return TokenizerChoice(kept, last.label)
            if last is not None:  # not kept (a slow tokenizer): loaded from where it was loaded before
                name, label, why = last.name, last.label, "the one this store was last served or indexed with"
        if not name:
            from suffixspec.models import DEFAULT_MODEL

            name, why = DEFAULT_MODEL, "the default model; --model to choose another"
        choice = _load(index, name, label or name)
        _note(f"indexing for {choice.name} (tokenizer {index.store.fingerprint(choice.tokenizer)[:12]}: {why})", quiet)
        return choice

    return load


def _load(index, name: str, label: str):
    """The tokenizer of model ``name`` (called ``label``): the one the store keeps for its folder, else
    loaded by transformers."""
    from suffixspec.index.document_index import TokenizerChoice
    from suffixspec.index.tokenizer_table import source_key
    from suffixspec.loading import load_tokenizer, resolve_model_path

    try:
        folder = resolve_model_path(name)
        source = source_key(folder)
        kept = index.stored_tokenizer(source=source) if source else None
        return TokenizerChoice(kept or load_tokenizer(name), label, source)
    except (OSError, ValueError) as e:
        raise click.ClickException(f"cannot load the tokenizer of {name!r}: {e}\n"
                                   "pass --model with a model name or a local model folder (or --tokenizer with a "
                                   "tokenizer folder)") from e


def _note(text: str, quiet: bool) -> None:
    if not quiet:
        from tqdm import tqdm

        tqdm.write(text, file=sys.stderr)


def _merge(index, quiet: bool, compact: bool) -> int:
    """The pending segment merges, then (``compact``) the compaction, under one progress bar in tokens."""
    if not index.pending_work(compact):
        return 0
    with _bar(quiet, desc="merging segments", unit="tok", unit_scale=True, leave=False) as bar:
        return index.merge(compact, progress=bar.update, status=bar.set_postfix_str)


class _NoBar:
    """What ``--quiet`` shows: nothing (and tqdm, 0.05-0.1 s of imports, is not loaded)."""

    def update(self, *_a: Any) -> None:
        pass

    def set_postfix_str(self, *_a: Any, **_kw: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass


def _bar(hidden: bool, **kw: Any):
    """A progress bar on stderr (plain lines when it is no terminal), or a :class:`_NoBar` when ``hidden``."""
    if hidden:
        return _NoBar()
    from suffixspec.progress import progress_bar

    return progress_bar(**kw)


@index_group.command("merge")
@click.option("--db", default=None, metavar="FILE", help=_DB_HELP)
@click.option("--no-compact", is_flag=True, help="Only the merges an add would run, no compaction.")
@click.option("--nice", default=10, show_default=True, type=click.IntRange(0, 19),
              help="CPU niceness of a large merge (a writer process in a scheduler group of its own; 0: in this "
                   "process).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def merge_cmd(db: str | None, no_compact: bool, nice: int, quiet: bool) -> None:
    """Run the pending segment merges now, then compact: the segments that are not full are rewritten
    as the fewest segments of at most 128M tokens (every lookup asks each segment, so a corpus that is
    read more than written wants few; a server compacts by itself after a minute without writes).

    \b
    Example:
      suffixspec index merge
    """
    with _index(db, nice=nice, own_group=True) as index:
        n = _merge(index, quiet, compact=not no_compact)
    click.echo(f"{n} merge(s) done")


@index_group.command("list")
@click.option("--db", default=None, metavar="FILE", help=_DB_HELP)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1), help="Documents to list.")
@click.option("--offset", default=0, show_default=True, type=click.IntRange(0), help="Documents to skip (newest first).")
@click.option("--query", default=None, metavar="TEXT", help="Only documents whose source, text or metadata contain TEXT.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON record per line instead of a table.")
def list_cmd(db: str | None, limit: int, offset: int, query: str | None, as_json: bool) -> None:
    """List indexed documents, newest first: id, tokens (for the tokenizer the store was last served or
    indexed with), bytes, source.

    \b
    Examples:
      suffixspec index list --db ./project.db
      suffixspec index list --query area --json
    """
    import json

    with _index(db) as index:
        page = index.list_documents(limit, offset, query)
        path = index.path
    rows, total = page["data"], page["total"]
    if as_json:
        for r in rows:
            click.echo(json.dumps(r, ensure_ascii=False))
        return
    if not rows:
        click.echo(f"no documents{f' matching {query!r}' if query else ''} in {path}"
                   + (f" (offset {offset} of {total})" if total else ""))
        return
    click.echo(f"{'id':>6}  {'tokens':>9}  {'bytes':>9}  source")
    for r in rows:
        toks = "-" if r["num_tokens"] is None else str(r["num_tokens"])
        source = r["source"] or "(text) " + r["preview"][:40].replace("\n", " ")
        click.echo(f"{r['id']:>6}  {toks:>9}  {r['n_bytes']:>9}  {source}")
    if offset or len(rows) < total:
        click.echo(f"{offset + 1}-{offset + len(rows)} of {total} (--limit / --offset for more)")


@index_group.command("remove")
@click.argument("keys", nargs=-1, required=True)
@click.option("--db", default=None, metavar="FILE", help=_DB_HELP)
def remove_cmd(keys: tuple[str, ...], db: str | None) -> None:
    """Remove documents by id (as shown by `index list`) or by path.

    \b
    Example:
      suffixspec index remove 3 /home/me/docs/old.md
    """
    with _index(db) as index:
        n = index.remove_documents(list(keys))
    click.echo(f"removed {n} document(s)")
    if n < len(keys):
        click.echo(f"warning: {len(keys) - n} key(s) matched no document", err=True)


@index_group.command("stats")
@click.option("--db", default=None, metavar="FILE", help=_DB_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
def stats_cmd(db: str | None, as_json: bool) -> None:
    """Documents, tokens and segments for the tokenizer the store was last served or indexed with (the
    other tokenizers it indexed for, in one line), pending merges, bytes on disk, memory to serve them.

    \b
    Example:
      suffixspec index stats
    """
    import json

    with _index(db) as index:
        st = index.stats()
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    click.echo(f"database:        {st['db']}")
    click.echo(f"documents:       {st['documents']} ({_human(st['document_bytes'])} of text)")
    info = st["tokenizer"]
    if info is not None:
        click.echo(f"tokenizer:       {info['model'] or info['tokenizer'] or '(not recorded)'} ({st['fingerprint'][:12]}): "
                   f"{info['document_tokens']} document tokens, {info['history_tokens']} history tokens in "
                   f"{info['history_outputs']} outputs"
                   + ("" if info["arrays_current"] else
                      f"  [{st['documents'] - info['documents_tokenized']} document(s) not indexed for it yet: "
                      "done when a server of it loads them]"))
        segs = info["segments"]
        if segs:
            sizes = ", ".join(f"{s['live_tokens']:,}" + (f" ({s['deleted_documents']} deleted)"
                                                         if s["deleted_documents"] else "") for s in segs)
            click.echo(f"  segments:      {len(segs)} ({sizes} tokens)")
            pending = info["pending_merges"]
            click.echo(f"  pending merges: {len(pending)}" + ("  (run `suffixspec index merge`)" if pending else ""))
            if info["compaction"]:
                click.echo(f"  compaction:    {len(info['compaction'])} segments can be rewritten as fewer "
                           "(run `suffixspec index merge`)")
    if st["also_indexed_for"]:
        click.echo("also indexed for: " + ", ".join(f"{o['model'] or o['tokenizer']} ({o['fingerprint'][:12]}, "
                                                    f"{o['document_tokens']} tokens)" for o in st["also_indexed_for"]))
    click.echo(f"bytes on disk:   {_human(st['bytes_on_disk'])} (database {_human(st['db_bytes'])}, "
               f"arrays {_human(st['arrays_bytes'])})")
    click.echo(f"memory estimate: {_human(st['memory_estimate_bytes'])}")
