"""suffixspec: retrieval-augmented suffix decoding with heterogeneous drafters.

Heavy imports (torch, transformers) happen lazily, when an engine is built.
"""

__version__ = "0.1.0"

__all__ = ["SuffixSpec", "__version__"]


def __getattr__(name: str):
    # Lazy: `import suffixspec` stays light; the facade (and torch) load on first use.
    if name == "SuffixSpec":
        from .api import SuffixSpec

        return SuffixSpec
    raise AttributeError(f"module 'suffixspec' has no attribute {name!r}")
