"""``python -m suffixspec ...``: the same command line as the ``suffixspec`` console script."""

from suffixspec.cli import main

main()
