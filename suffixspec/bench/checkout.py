"""Start another checkout's code in a child process (a benchmark's "before" side).

A checkout resolves ``suffixspec.index`` (and ``.tokenizer_bridge``, ``.bench``, ``.web``) through its
editable install, which maps those names to the installed checkout's folders. A child given only
``PYTHONPATH=OTHER`` would run OTHER's ``suffixspec`` on this environment's ``suffixspec/index/``: the comparison
would measure a mix. :func:`command` puts OTHER's folders first on the package's own path, so every
part of the child is OTHER's.

Example: ``command("/src/before", "suffixspec", "index", "stats")`` ->
``[python, "-c", PRELUDE, "/src/before", "suffixspec", "index", "stats"]``, which runs
``python -m suffixspec index stats`` with ``/src/before/index`` as ``suffixspec.index``.
"""

from __future__ import annotations

import sys

PRELUDE = """\
import runpy, sys
root, module = sys.argv[1], sys.argv[2]
del sys.argv[1:3]
sys.path.insert(0, root)
import suffixspec
suffixspec.__path__.append(root)  # <root>/index is suffixspec.index, before any installed mapping
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def command(root: str, module: str, *args: str) -> list[str]:
    """The argv that runs ``python -m MODULE ARGS`` on the code of the checkout at ``root``."""
    return [sys.executable, "-c", PRELUDE, root, module, *args]
