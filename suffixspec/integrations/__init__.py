"""Framework integrations: the retrieved chunks of a RAG pipeline become drafts (``references``).

- :mod:`suffixspec.integrations.llama_index`: ``SuffixSpecLLM``, a LlamaIndex LLM
  (``pip install 'suffixspec[llama-index]'``);
- :mod:`suffixspec.integrations.langchain`: ``ChatSuffixSpec``, a LangChain chat model, and
  ``prompt_with_references``, the LCEL step that carries a retriever's documents to it
  (``pip install 'suffixspec[langchain]'``).

Both run on a :class:`suffixspec.SuffixSpec` in this process or on a ``suffixspec serve`` URL
(:mod:`.backend`, which imports neither framework). Nothing in the core imports this package:
the frameworks load only when one of the two modules is imported.
"""
