"""The `suffixspec` command line. Commands are thin wrappers over the Python API.

Start-up stays light: torch and transformers are imported inside the commands that need them.
"""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
