"""``python -m suffixspec ...``: the same command line as the ``suffixspec`` console script."""

from .cli import main

main()
