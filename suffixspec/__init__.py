"""suffixspec: retrieval-augmented suffix decoding with heterogeneous drafters.

Heavy imports (torch, transformers) happen lazily, when an engine is built.

The repository keeps ``index/``, ``tokenizer_bridge/``, ``bench/`` and ``web/`` beside this package;
a wheel installs them as ``suffixspec.index``, ``suffixspec.tokenizer_bridge``, ``suffixspec.bench``
and ``suffixspec.web`` (setup.py), so ``suffixspec`` is the only top-level name it adds. A checkout
resolves the same names through its editable install (``pip install -e .``: setup.py's folder mapping),
and nothing else of the repository (``tests``, ``examples``, ``tools``) is a part of the package.
"""

from .errors import RequestError

__version__ = "0.1.0"

__all__ = ["RequestError", "SuffixSpec", "__version__"]


def __getattr__(name: str):
    # Lazy: `import suffixspec` stays light; the facade (and torch) load on first use.
    if name == "SuffixSpec":
        from .api import SuffixSpec

        return SuffixSpec
    raise AttributeError(f"module 'suffixspec' has no attribute {name!r}")
