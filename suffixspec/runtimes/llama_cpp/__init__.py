"""suffixspec's drafters inside llama-cpp-python: where CPU users run GGUF models.

- :class:`SuffixDraftModel` (:mod:`.draft`): a ``llama_cpp.llama_speculative.LlamaDraftModel`` drafting
  from the suffix index (the request's prompt and output, per-call references and prediction, the
  output history, the document store), each draft sized by what llama.cpp's passes are measured to cost;
- :func:`load` (:mod:`.model`): a ``llama_cpp.Llama`` for a model name or ``.gguf`` path with that draft
  model bound to it;
- :class:`LlamaCppEngine` (:mod:`.engine`): the engine behind ``SuffixSpec(runtime="llama-cpp")`` and
  ``suffixspec serve --runtime llama-cpp``.

Worked example::

    from suffixspec.runtimes.llama_cpp import load

    llm = load("smollm2-135m-instruct", n_threads=1)
    with llm.draft_model.request(references=[chunk]):
        out = llm.create_chat_completion(messages=[{"role": "user", "content": question}], temperature=0)
    print(llm.draft_model.last_stats.to_dict()["accepted_tokens"])

Needs ``pip install 'suffixspec[llama-cpp]'`` (llama-cpp-python). Nothing here is imported by
``import suffixspec``; the names below load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LlamaCppEngine", "SuffixDraftModel", "load"]


def __getattr__(name: str) -> Any:
    if name == "SuffixDraftModel":
        from suffixspec.runtimes.llama_cpp.draft import SuffixDraftModel

        return SuffixDraftModel
    if name == "load":
        from suffixspec.runtimes.llama_cpp.model import load

        return load
    if name == "LlamaCppEngine":
        from suffixspec.runtimes.llama_cpp.engine import LlamaCppEngine

        return LlamaCppEngine
    raise AttributeError(f"module 'suffixspec.runtimes.llama_cpp' has no attribute {name!r}")
