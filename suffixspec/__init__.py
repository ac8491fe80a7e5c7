"""suffixspec: retrieval-augmented suffix decoding with heterogeneous drafters.

Heavy imports (torch, transformers) happen lazily, when an engine is built. Importing suffixspec
before torch sets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it (``suffixspec.threads``).

The repository keeps ``index/``, ``tokenizer_bridge/``, ``bench/`` and ``web/`` beside this package;
a wheel installs them as ``suffixspec.index``, ``suffixspec.tokenizer_bridge``, ``suffixspec.bench``
and ``suffixspec.web`` (setup.py), so ``suffixspec`` is the only top-level name it adds. In a
checkout (a plain clone, an editable install, a git worktree) the same names resolve to those
folders: the package's search path gains the repository root when the folders sit there.
"""

from pathlib import Path as _Path

from .threads import prepare_openmp as _prepare_openmp

_prepare_openmp()  # before torch is imported: OpenMP's waiting threads sleep (suffixspec.threads)

__version__ = "0.1.0"

__all__ = ["SuffixSpec", "__version__"]

_ROOT = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "index").is_dir() and (_ROOT / "index" / "__init__.py").is_file() \
        and (_ROOT / "pyproject.toml").is_file():
    __path__.append(str(_ROOT))  # noqa: F821 - a checkout: suffixspec.index is <root>/index


def __getattr__(name: str):
    # Lazy: `import suffixspec` stays light; the facade (and torch) load on first use.
    if name == "SuffixSpec":
        from .api import SuffixSpec

        return SuffixSpec
    raise AttributeError(f"module 'suffixspec' has no attribute {name!r}")
