"""Runtimes: what runs the target model, each taking drafters through one request tracker.

- :mod:`.engine`: our own engine (:class:`~.engine.Engine`: the decode core on a ``transformers`` model).
- :mod:`.vllm`: a proposer for vLLM's ``custom_class`` speculative method.
- :mod:`.llama_cpp`: a draft model for ``llama-cpp-python`` and a runtime on a GGUF file.
"""
