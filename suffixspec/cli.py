"""The `suffixspec` command line. Commands are thin wrappers over the Python API.

Start-up stays light: torch and transformers are imported inside the commands that need them.
"""

from __future__ import annotations

import sqlite3

import click


class _Group(click.Group):
    """Turns a database that refuses writes (read-only file or folder, full disk) into one ``Error:`` line."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except sqlite3.OperationalError as e:
            msg = str(e)
            if "readonly" not in msg and "full" not in msg and "unable to open" not in msg and "disk I/O" not in msg:
                raise
            raise click.ClickException(
                f"the index database refused a write ({msg}); make the file given with --db (default "
                "$SUFFIXSPEC_DB or ~/.local/share/suffixspec/index.db) and its folder writable, free disk "
                "space, or pass --db with another file") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="suffixspec")
def main() -> None:
    """suffixspec: faster generation for any transformers causal LM, with exactly the same output.

    \b
    Examples:
      suffixspec index add docs/ --glob '*.md'
      suffixspec generate "def fibonacci(n):" --max-tokens 64
      suffixspec serve --port 8000
      suffixspec bench --quick
    """


from .cli_serve import generate_cmd, serve_cmd  # noqa: E402  (commands register below the group)

main.add_command(serve_cmd)
main.add_command(generate_cmd)

from .cli_index import index_group  # noqa: E402

main.add_command(index_group)

from .cli_bench import bench_cmd  # noqa: E402

main.add_command(bench_cmd)
