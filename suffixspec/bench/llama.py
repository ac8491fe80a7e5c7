"""llama.cpp in the benchmark: the CPU reference, on the same GGUF file, prompts and settings.

Systems (``llama-cpp-python``, one thread, greedy, the model's own GGUF: SmolLM2's Q4_1 file, which
the ``transformers`` systems read dequantized):

- ``llama_plain``: ``Llama.generate`` without a draft model (``logits_all=False``, as a user runs it);
- ``llama_prompt_lookup``: its ``LlamaPromptLookupDecoding(num_pred_tokens=10)`` (the only drafter
  llama-cpp-python ships; ``max_ngram_size`` 2, its default);
- ``llama_ours``: :class:`suffixspec.runtimes.llama_cpp.SuffixDraftModel`, given the request's references and
  prediction (``with draft.request(...)``), history off as for every system of the run.

Every system has its own ``Llama``, evaluates each prompt afresh (no keys and values kept from the
request before) and decodes the same prompt ids (the ``transformers`` tokenizer's, as the other
systems') through the same loop: ``Llama.generate`` until EOS or ``max_tokens``. Forward
passes are counted as the prefill plus one per draft call (one per token for plain).

When ``llama-cpp-python`` is missing, :func:`available` is False and the runner skips these systems.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

LLAMA_SYSTEMS = ("llama_plain", "llama_prompt_lookup", "llama_ours")


def available() -> bool:
    """Is llama-cpp-python importable here?"""
    try:
        import llama_cpp  # noqa: F401
    except Exception:  # ImportError, or a build failing to load its library
        return False
    return True


class CountingLookup:
    """llama-cpp-python's prompt lookup, counting its calls (one per verify pass)."""

    def __init__(self, num_pred_tokens: int = 10) -> None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.inner = LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens)
        self.calls = 0
        self.drafted = 0

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
        self.calls += 1
        out = self.inner(input_ids, **kwargs)
        self.drafted += len(out)
        return out


@dataclass
class LlamaBench:
    """The three ``Llama`` objects of a run (one per system), built once."""

    model: str  # a model name or .gguf path
    tokenizer: Any  # the transformers tokenizer the prompts are encoded with (same ids as the GGUF's)
    n_ctx: int = 4096
    threads: int = 1
    llms: dict[str, Any] = field(default_factory=dict)

    def llm(self, system: str) -> Any:
        if system not in self.llms:
            from suffixspec.runtimes.llama_cpp.model import load

            if system == "llama_plain":
                self.llms[system] = load(self.model, n_ctx=self.n_ctx, n_threads=self.threads, draft=False)
            elif system == "llama_prompt_lookup":
                self.llms[system] = load(self.model, n_ctx=self.n_ctx, n_threads=self.threads, draft=CountingLookup())
            elif system == "llama_ours":
                from suffixspec.runtimes.llama_cpp.draft import SuffixDraftModel

                drafter = SuffixDraftModel(tokenizer=self.tokenizer, history=False)
                self.llms[system] = load(self.model, n_ctx=self.n_ctx, n_threads=self.threads, draft=drafter)
            else:
                raise ValueError(f"unknown llama.cpp system {system!r}; choose from {list(LLAMA_SYSTEMS)}")
        return self.llms[system]

    def new_workload(self) -> None:
        """Our drafter forgets what it learned from earlier requests (it keeps the measured costs)."""
        llm = self.llms.get("llama_ours")
        if llm is not None:
            llm.draft_model.forget()

    def generate(self, system: str, prompt_ids: list[int], max_tokens: int, references: list[str] | None = None,
                 prediction: str | None = None) -> tuple[list[int], float, float, int, dict[str, Any]]:
        """(tokens, wall s, CPU s of this thread, forward passes, drafter statistics) of one greedy request."""
        llm = self.llm(system)
        draft = llm.draft_model
        eos = int(llm.token_eos())
        calls = getattr(draft, "calls", 0)
        ctx = draft.request(references=references or None, prediction=prediction) \
            if system == "llama_ours" else contextlib.nullcontext()
        out: list[int] = []
        # the whole prompt evaluated afresh, as for the transformers systems: llama.cpp would reuse the keys
        # and values of the previous prompt's common start, computed in a batch of another length, and
        # its batched and one-token evaluations round differently (docs/llama_cpp.md): a system's output
        # would then depend on the request before it
        llm.reset()
        t, c = time.perf_counter(), time.thread_time()
        with ctx:
            gen = llm.generate(prompt_ids, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
            try:
                for tok in gen:
                    out.append(int(tok))
                    if tok == eos or len(out) >= max_tokens:
                        break
            finally:
                gen.close()
            if system == "llama_ours":
                draft.finish(out)
        seconds, cpu = time.perf_counter() - t, time.thread_time() - c
        forwards = 1 + (getattr(draft, "calls", 0) - calls if draft is not None else len(out) - 1)
        stats = draft.last_stats.to_dict() if system == "llama_ours" and draft.last_stats is not None else {}
        return out, seconds, cpu, forwards, stats
