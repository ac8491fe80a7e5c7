"""What every command shares about the process: one error line for a database that refuses writes or a
model whose package is missing, and the fast exit of a finished command (no interpreter teardown once torch is loaded)."""

from __future__ import annotations

import os
import sqlite3
import sys

import click

_fast_exit = False  # set by a command whose files are all closed: skip the interpreter's teardown


def allow_fast_exit() -> None:
    """Let the process end without Python's teardown once the command returns (see ``Group.main``)."""
    global _fast_exit
    _fast_exit = True


class Group(click.Group):
    """Turns a database that refuses writes (read-only file or folder, full disk) into one ``Error:`` line,
    and ends a finished ``generate`` at once: after torch and transformers are loaded, the interpreter's
    teardown (freeing thousands of modules and the model) took 6.5 s of a 49 s run on a loaded 2-core
    machine, after the answer was printed."""

    def main(self, args=None, *a, **kw):
        try:
            return super().main(args, *a, **kw)
        except SystemExit as e:
            # only in a real process (args=None: the console script), never in-process (CliRunner, tests)
            if args is None and _fast_exit and isinstance(e.code, (int, type(None))):
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(e.code or 0)
            raise

    def invoke(self, ctx: click.Context):
        from suffixspec.models import ModelNotInstalledError, UnknownModelError

        try:
            return super().invoke(ctx)
        except (ModelNotInstalledError, UnknownModelError) as e:  # one line: the pip command, or the names
            raise click.ClickException(str(e)) from None
        except sqlite3.OperationalError as e:
            msg = str(e)
            if "readonly" not in msg and "full" not in msg and "unable to open" not in msg and "disk I/O" not in msg:
                raise
            raise click.ClickException(
                f"the index database refused a write ({msg}); make the file given with --db (default "
                "$SUFFIXSPEC_DB or ~/.local/share/suffixspec/index.db) and its folder writable, free disk "
                "space, or pass --db with another file") from None
