"""suffixspec: retrieval-augmented suffix decoding with heterogeneous drafters.

Heavy imports (torch, transformers) happen lazily, when an engine is built.
"""

__version__ = "0.1.0"
