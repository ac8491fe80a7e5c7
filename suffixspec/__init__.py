"""suffixspec: retrieval-augmented suffix decoding with heterogeneous drafters.

Heavy imports (torch, transformers) happen lazily, when an engine is built.

The folder tree is the package tree: ``suffixspec.X`` lives at ``suffixspec/X`` in a checkout and in a
wheel alike, and ``suffixspec`` is the only top-level name a wheel adds; nothing else of the repository
(``tests``, ``examples``, ``tools``) is a part of the package.
"""

from suffixspec.errors import RequestError

__version__ = "0.1.0"

__all__ = ["RequestError", "SuffixSpec", "__version__"]


def __getattr__(name: str):
    # Lazy: `import suffixspec` stays light; the facade (and torch) load on first use.
    if name == "SuffixSpec":
        from suffixspec.api import SuffixSpec

        return SuffixSpec
    raise AttributeError(f"module 'suffixspec' has no attribute {name!r}")
