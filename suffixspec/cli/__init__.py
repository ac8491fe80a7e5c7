"""The `suffixspec` command line: one module per command group, each a thin wrapper over the Python API.

Start-up stays light: torch and transformers are imported inside the commands that need them.
"""

from __future__ import annotations

import click

from suffixspec.cli.bench import bench_cmd
from suffixspec.cli.generate import generate_cmd
from suffixspec.cli.index import index_group
from suffixspec.cli.models import models_cmd
from suffixspec.cli.process import Group
from suffixspec.cli.serve import serve_cmd


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="suffixspec")
def main() -> None:
    """suffixspec: faster generation for any transformers causal LM, with exactly the same output.

    \b
    Examples:
      suffixspec index add docs/ --glob '*.md'
      suffixspec generate --chat "What is a suffix tree?" --max-tokens 64
      suffixspec serve --port 8000
      suffixspec models
      suffixspec bench --quick
    """


for _command in (serve_cmd, generate_cmd, index_group, bench_cmd, models_cmd):
    main.add_command(_command)
