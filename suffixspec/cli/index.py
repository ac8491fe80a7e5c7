"""`suffixspec index ...`: manage the document corpus the suffix drafter reads from.

Start-up stays light: ``index list`` / ``stats`` / ``remove`` import only click, numpy and
sqlite-utils; the tokenizer (transformers) is loaded by ``index add`` alone.
"""

from __future__ import annotations

import sys

import click

DEFAULT_TOKENIZER = "suffixspec/demo-target"
_DB_HELP = ("SQLite database (default: $SUFFIXSPEC_DB, else $XDG_DATA_HOME/suffixspec/index.db, "
            "i.e. ~/.local/share/suffixspec/index.db)")


def _open_store(db: str | None, **kw):
    from suffixspec.index.store import IndexStore, StoreError

    try:
        return IndexStore(db, **kw)
    except StoreError as e:  # corrupt or foreign file: one clear line, not a traceback
        raise click.ClickException(str(e)) from None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@click.group("index", context_settings={"help_option_names": ["-h", "--help"]})
def index_group() -> None:
    """Manage the persistent document corpus used by the suffix drafter.

    \b
    Examples:
      suffixspec index add docs/ src/ --glob '*.py' --glob '*.md'
      suffixspec index add notes.txt --tokenizer Qwen/Qwen2.5-0.5B
      suffixspec index list
      suffixspec index remove 3 docs/old.md
      suffixspec index stats
      suffixspec index merge
      SUFFIXSPEC_DB=/tmp/test.db suffixspec index stats
    """


@index_group.command("add")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--glob", "globs", multiple=True, metavar="PATTERN",
              help="Only index file names matching PATTERN (repeatable), e.g. '*.py'.")
@click.option("--db", default=None, metavar="FILE", help=_DB_HELP)
@click.option("--tokenizer", default=DEFAULT_TOKENIZER, show_default=True, metavar="NAME_OR_PATH",
              help="Target tokenizer (hub id, local directory or embedded name) the ids are made for.")
@click.option("--max-bytes", default=None, type=int, metavar="N",
              help="Skip files larger than N bytes (default 2 MiB).")
@click.option("--follow-links", is_flag=True,
              help="Also index files that symlinks point to outside PATHS (skipped by default).")
@click.option("--no-merge", is_flag=True, help="Leave segment merges for later (`index merge`, or a server).")
@click.option("--nice", default=10, show_default=True, type=click.IntRange(0, 19),
              help="CPU niceness of the tokenizing and sorting: a writer process in a scheduler group of its "
                   "own, so that a server on this machine keeps its pace (0: in this process, as it is).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, no per-file warnings.")
def add_cmd(paths: tuple[str, ...], globs: tuple[str, ...], db: str | None, tokenizer: str,
            max_bytes: int | None, follow_links: bool, no_merge: bool, nice: int, quiet: bool) -> None:
    """Index text files under PATHS (directories are walked recursively).

    Binary files (judged from their first 8 KiB), files over --max-bytes, FIFOs and devices,
    dangling or looping symlinks and symlinks out of PATHS are skipped: each is named in a warning
    and counted in the summary. Hidden directories, __pycache__ and node_modules are not walked.
    Re-adding an unchanged file changes nothing; a changed file replaces its old version. Files are
    read and tokenized as they are streamed into the index (memory stays bounded whatever the corpus
    size); every ~16M tokens a segment is committed, and segments are merged at the end (--no-merge:
    later). Interrupted, the index keeps the segments committed so far (whole files; a rerun skips
    them as unchanged) and nothing half-built. Tokenizing and sorting run at a low CPU priority
    (--nice). Exits with status 1 when there is nothing to index.

    \b
    Examples:
      suffixspec index add docs/
      suffixspec index add . --glob '*.py' --db ./project.db
    """
    from collections import Counter

    from tqdm import tqdm

    from suffixspec.index.files import DEFAULT_MAX_BYTES, read_text, walk
    from suffixspec.index.store import DocInput

    limit = max_bytes or DEFAULT_MAX_BYTES
    try:
        candidates = list(walk(paths, globs, follow_links=follow_links))
    except FileNotFoundError as e:
        raise click.ClickException(str(e)) from e
    skipped: Counter[str] = Counter()  # skip kind -> files
    total = sum(min(c.size, limit) for c in candidates)
    bar = tqdm(total=total, desc="indexing", unit="B", unit_scale=True, disable=quiet or not candidates)
    tokens = 0

    def read_all():
        """Indexable documents, read one at a time (skipped files are warned about and counted)."""
        for cand in candidates:
            ft = read_text(cand, limit)
            if ft.text is None:
                skipped[ft.skip_kind or "unreadable"] += 1
                bar.update(min(cand.size, limit))
                if not quiet:
                    tqdm.write(f"warning: skipped {ft.path}: {ft.skip_reason}", file=sys.stderr)
                continue
            yield DocInput(ft.text, str(ft.path), {"size": cand.size})

    def why() -> str:
        return ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))

    docs = read_all()
    first = next(docs, None)  # read up to the first indexable file before loading the tokenizer
    if first is None:  # nothing to index is a mistake to point out, not a success with zeros
        bar.close()
        where = " ".join(paths) + (f" matching {' or '.join(repr(g) for g in globs)}" if globs else "")
        if not candidates:
            hint = ("hidden directories, __pycache__ and node_modules are not walked"
                    + ("; --glob matches file names, e.g. '*.md'" if globs else ""))
            raise click.ClickException(f"nothing to index: no files found under {where} ({hint})")
        raise click.ClickException(f"nothing to index: all {len(candidates)} file(s) under {where} were "
                                   f"skipped ({why()})" + ("" if quiet else "; see the warnings above"))

    def stream():
        yield first
        yield from docs

    def progress(n_docs: int, n_tokens: int, n_bytes: int) -> None:
        nonlocal tokens
        tokens += n_tokens
        bar.set_postfix_str(f"{tokens:,} tokens", refresh=False)
        bar.update(n_bytes)

    def status(text: str) -> None:
        bar.set_postfix_str(f"{tokens:,} tokens, {text}")

    from suffixspec.index import writer
    from suffixspec.index.store import StoreError

    tok = _load_tokenizer(tokenizer)
    store = _open_store(db, auto_merge=False)
    in_child = nice > 0 and writer.available()
    try:
        with bar:
            if in_child:
                summary = writer.add_documents(store.path, stream(), tok, progress=progress, status=status,
                                               nice=nice, own_group=True)
            else:
                summary = store.add_documents(stream(), tok, progress=progress, status=status)
        merged = 0 if no_merge else _merge(store, quiet, nice=nice if in_child else 0)
    except StoreError as e:  # the writer process was killed, the database went bad meanwhile
        bar.close()
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        bar.close()
        n = store.db.execute("SELECT count(*) FROM documents").fetchone()[0]
        click.echo(f"interrupted: the index keeps what was committed ({n} documents); rerun to add the rest",
                   err=True)
        raise SystemExit(130) from None
    finally:
        store.close()
    summary.skipped = sum(skipped.values())
    click.echo(f"added {summary.added}, updated {summary.updated}, unchanged {summary.unchanged}, "
               f"skipped {summary.skipped}, tokens {summary.tokens}"
               + (f", {merged} merge(s)" if merged else "") + f"  ({store.path})")
    if skipped:
        click.echo(f"skipped: {why()}", err=True)


def _merge(store, quiet: bool, compact: bool = False, nice: int = 0) -> int:
    """Run the pending segment merges, then (``compact``) the compaction, under one progress bar in tokens
    (``nice`` > 0: in a writer process at that niceness, as ``index add`` adds)."""
    from tqdm import tqdm

    if not store.pending_merges() and not (compact and store.compaction()):
        return 0
    with tqdm(desc="merging segments", unit="tok", unit_scale=True, disable=quiet, leave=False) as bar:
        if nice > 0:
            from suffixspec.index import writer

            return writer.merge(store.path, compact=compact, progress=bar.update, status=bar.set_postfix_str,
                                nice=nice, own_group=True)
        done = store.merge_pending(progress=bar.update, status=bar.set_postfix_str)
        if compact:
            done += store.compact(progress=bar.update, status=bar.set_postfix_str)
        return done


@index_group.command("merge")
@click.option("--db", default=None, metavar="FILE", help=_DB_HELP)
@click.option("--no-compact", is_flag=True, help="Only the merges an add would run, no compaction.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def merge_cmd(db: str | None, no_compact: bool, quiet: bool) -> None:
    """Run the pending segment merges now, then compact: the segments that are not full are rewritten
    as the fewest segments of at most 128M tokens (every lookup asks each segment, so a corpus that is
    read more than written wants few; a server compacts by itself after a minute without writes).

    \b
    Example:
      suffixspec index merge
    """
    with _open_store(db, auto_merge=False) as store:
        n = _merge(store, quiet, compact=not no_compact)
    click.echo(f"{n} merge(s) done")


def _load_tokenizer(name: str):
    from ..loading import load_tokenizer  # transformers: only on the add path

    try:
        return load_tokenizer(name)
    except (OSError, FileNotFoundError, ValueError) as e:
        raise click.ClickException(f"cannot load tokenizer {name!r}: {e}\n"
                                   "pass --tokenizer with a hub id or a local model directory") from e


@index_group.command("list")
@click.option("--db", default=None, metavar="FILE", help=_DB_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def list_cmd(db: str | None, as_json: bool) -> None:
    """List indexed documents: id, tokens, bytes, path.

    \b
    Example:
      suffixspec index list --db ./project.db
    """
    import json

    with _open_store(db) as store:
        rows = store.list_documents()
    if as_json:
        for r in rows:
            click.echo(json.dumps(r, ensure_ascii=False))
        return
    if not rows:
        click.echo(f"no documents in {store.path}")
        return
    click.echo(f"{'id':>6}  {'tokens':>9}  {'bytes':>9}  path")
    for r in rows:
        toks = max(r["tokens"].values()) if r["tokens"] else 0
        click.echo(f"{r['id']:>6}  {toks:>9}  {r['n_bytes']:>9}  {r['path']}")


@index_group.command("remove")
@click.argument("keys", nargs=-1, required=True)
@click.option("--db", default=None, metavar="FILE", help=_DB_HELP)
def remove_cmd(keys: tuple[str, ...], db: str | None) -> None:
    """Remove documents by id (as shown by `index list`) or by path.

    \b
    Example:
      suffixspec index remove 3 /home/me/docs/old.md
    """
    with _open_store(db, auto_merge=False) as store:
        n = store.remove(list(keys))
    click.echo(f"removed {n} document(s)")
    if n < len(keys):
        click.echo(f"warning: {len(keys) - n} key(s) matched no document", err=True)


@index_group.command("stats")
@click.option("--db", default=None, metavar="FILE", help=_DB_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
def stats_cmd(db: str | None, as_json: bool) -> None:
    """Documents, tokens per tokenizer, segments and pending merges, bytes on disk, memory to serve them.

    \b
    Example:
      suffixspec index stats
    """
    import json

    with _open_store(db) as store:
        st = store.stats()
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    click.echo(f"database:        {st['db']}")
    click.echo(f"documents:       {st['documents']} ({_human(st['document_bytes'])} of text)")
    for fp, info in st["tokenizers"].items():
        click.echo(f"tokenizer {fp[:12]} ({info['tokenizer']}): {info['document_tokens']} document tokens, "
                   f"{info['history_tokens']} history tokens in {info['history_outputs']} outputs"
                   + ("" if info["arrays_current"] else "  [some documents not indexed yet: done on next load]"))
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
    click.echo(f"bytes on disk:   {_human(st['bytes_on_disk'])} (database {_human(st['db_bytes'])}, "
               f"arrays {_human(st['arrays_bytes'])})")
    click.echo(f"memory estimate: {_human(st['memory_estimate_bytes'])}")

