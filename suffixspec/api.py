"""The Python API: one object that loads the models, keeps the document index and generates.

``SuffixSpec`` is what RAG pipelines embed, what ``suffixspec generate`` wraps and what the HTTP
server holds (one per process, shared by every route). Worked example::

    from suffixspec import SuffixSpec

    spec = SuffixSpec()                           # embedded demo models, index in memory
    spec.add_documents(["def area(r):\\n    return 3.14159 * r * r\\n"])
    chunks = ["def area(r):\\n    return 3.14159 * r * r\\n"]   # what your retriever returned
    res = spec.generate("def area(r):", references=chunks, max_tokens=32)
    print(res.text)
    print(res.stats.to_dict()["mean_accepted_length"])   # tokens per target forward pass

    for ev in spec.stream("def area(r):", references=chunks):
        print(ev.text, end="", flush=True)

Generation is lossless: with speculation on or off the output is the same (greedy) or has the same
distribution (sampling). One generation runs at a time (the engine is batch 1); calls from several
threads wait for each other.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import SamplingParams, SpeculationConfig
from .loading import DEFAULT_DRAFT, DEFAULT_TARGET

log = logging.getLogger(__name__)

AUTO = "auto"  # draft_model default: the embedded draft model when the target is the embedded one


@dataclass
class Message:
    """One chat message (``role`` is system, user, assistant, ...)."""

    role: str
    content: str


class SuffixSpec:
    """Models, drafters, the document index and the engine, built once.

    Args:
        model: target model, a local directory, a hub id, or ``suffixspec/demo-target`` (default).
        draft_model: a draft model with any tokenizer; ``"auto"`` (default) uses the embedded
            draft model when the target is the embedded one and no draft model otherwise;
            ``None`` or ``"none"`` disables it.
        db: path of the SQLite document store; ``None`` keeps documents in memory only.
        device / dtype: as for ``suffixspec.loading.load_model`` (default: cuda if present, else cpu).
        engine: an already built engine (tests, custom proposers); the other model arguments are
            then ignored.
    """

    def __init__(self, model: str = DEFAULT_TARGET, draft_model: str | None = AUTO, db: str | Path | None = None,
                 device: str | None = None, dtype: str | None = None, engine: Any = None) -> None:
        self._lock = threading.RLock()
        self.store: Any = None  # the document store (index package), or None when unavailable
        self.documents: Any = None  # the documents proposer's corpus view, for stats
        self.proposers: list[Any] = []
        if draft_model == AUTO:
            draft_model = DEFAULT_DRAFT if model == DEFAULT_TARGET else None
        if draft_model in ("none", ""):
            draft_model = None
        self.model_name = model
        self.draft_model_name = draft_model
        self.db = str(db) if db is not None else None
        if engine is not None:
            self.engine = engine
            self.proposers = list(getattr(engine, "proposers", []))
        else:
            self.engine = self._build_engine(model, draft_model, device, dtype)
        self.tokenizer = self.engine.tokenizer

    # -- construction -------------------------------------------------------------------------

    def _build_engine(self, model: str, draft_model: str | None, device: str | None, dtype: str | None) -> Any:
        from .engine import Engine
        from .loading import load_model

        target = load_model(model, device=device, dtype=dtype)
        self.proposers = self._build_proposers(target, draft_model, device, dtype)
        return Engine(target, self.proposers)

    def _build_proposers(self, target: Any, draft_model: str | None, device: str | None,
                         dtype: str | None) -> list[Any]:
        """The suffix-index proposer (with the document store) and, if named, the draft-model proposer."""
        proposers: list[Any] = []
        try:
            from .proposers.suffix import SuffixProposer
        except ImportError:  # index package not installed: generation still works, without suffix drafts
            log.warning("suffix proposer unavailable; generating without suffix-index drafts")
        else:
            proposers.append(SuffixProposer())
        return proposers

    # -- tokenization -------------------------------------------------------------------------

    @property
    def max_context(self) -> int:
        return int(self.engine.max_context)

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt, exactly as generation sees them."""
        enc = getattr(self.engine, "encode", None)
        if enc is not None:
            return list(enc(text))
        return list(self.tokenizer(text)["input_ids"])

    def render_chat(self, messages: Sequence[Message | dict]) -> str:
        """The prompt text the tokenizer's chat template makes of ``messages`` (ready for the assistant)."""
        msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
        if not getattr(self.tokenizer, "chat_template", None):
            # No template: a plain transcript, so base models still get a sensible prompt.
            return "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"
        return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    def encode_chat(self, messages: Sequence[Message | dict]) -> list[int]:
        """Token ids of a chat prompt. The template already holds special tokens, so none are added."""
        text = self.render_chat(messages)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- generation ---------------------------------------------------------------------------

    @staticmethod
    def sampling_params(sampling: SamplingParams | None = None, **kw: Any) -> SamplingParams:
        """``sampling`` if given, else ``SamplingParams(**kw)`` (unset keywords keep their defaults)."""
        if sampling is not None:
            return sampling
        return SamplingParams(**{k: v for k, v in kw.items() if v is not None})

    @staticmethod
    def speculation_config(speculation: SpeculationConfig | bool | dict | None) -> SpeculationConfig | None:
        """``False`` -> plain decoding; a dict -> ``SpeculationConfig(**dict)``; ``None``/``True`` -> defaults."""
        if speculation is None or speculation is True:
            return None
        if speculation is False:
            return SpeculationConfig(enabled=False)
        if isinstance(speculation, dict):
            return SpeculationConfig(**speculation)
        return speculation

    def _engine_kwargs(self, prompt: str | list[int] | None, messages: Sequence[Message | dict] | None,
                       sampling: SamplingParams | None, speculation: Any, references: Sequence[str] | None,
                       prediction: str | None, kw: dict) -> dict:
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt= or messages=")
        ids = self.encode_chat(messages) if messages is not None else (
            self.encode(prompt) if isinstance(prompt, str) else list(prompt))
        return dict(prompt=ids, sampling=self.sampling_params(sampling, **kw),
                    speculation=self.speculation_config(speculation),
                    references=list(references) if references else None, prediction=prediction or None)

    def generate(self, prompt: str | list[int] | None = None, *, messages: Sequence[Message | dict] | None = None,
                 sampling: SamplingParams | None = None, speculation: SpeculationConfig | bool | dict | None = None,
                 references: Sequence[str] | None = None, prediction: str | None = None,
                 cancel: threading.Event | None = None, **sampling_kw: Any) -> Any:
        """Generate a completion of ``prompt`` (or of a chat ``messages`` list) and return a GenerationResult.

        ``references`` are retrieved chunks the output may copy from (drafted by the suffix index);
        ``prediction`` is the expected output of a code edit. Sampling keywords (``max_tokens``,
        ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ...) build a ``SamplingParams``.
        """
        kwargs = self._engine_kwargs(prompt, messages, sampling, speculation, references, prediction, sampling_kw)
        return self.engine.generate(cancel=cancel, **kwargs)

    def stream(self, prompt: str | list[int] | None = None, *, messages: Sequence[Message | dict] | None = None,
               sampling: SamplingParams | None = None, speculation: SpeculationConfig | bool | dict | None = None,
               references: Sequence[str] | None = None, prediction: str | None = None,
               cancel: threading.Event | None = None, **sampling_kw: Any) -> Iterator[Any]:
        """Like ``generate`` but yields StreamEvents (``ev.text``, ``ev.pieces``; ``ev.result`` on the last)."""
        kwargs = self._engine_kwargs(prompt, messages, sampling, speculation, references, prediction, sampling_kw)
        yield from self.engine.stream(cancel=cancel, **kwargs)

    def chat(self, messages: Sequence[Message | dict], **kw: Any) -> Any:
        """``generate(messages=messages, ...)``: the reply of a chat model to ``messages``."""
        return self.generate(messages=messages, **kw)

    # -- documents ----------------------------------------------------------------------------

    def _require_store(self) -> Any:
        if self.store is None:
            raise RuntimeError("no document index is available in this installation (index package missing)")
        return self.store

    def add_documents(self, documents: Sequence[str | dict], metadata: dict | None = None) -> list[dict]:
        """Add texts (or ``{"text", "source", "metadata"}`` dicts) to the document index.

        Idempotent by content hash; the next generation drafts from them. Returns one record per
        document (``id``, ``created`` = whether it was new, sizes).
        """
        self._require_store()
        raise NotImplementedError

    def remove_documents(self, ids: Sequence[Any]) -> int:
        """Remove documents by id; returns how many were removed."""
        self._require_store()
        raise NotImplementedError

    def list_documents(self, limit: int = 20, offset: int = 0, query: str | None = None) -> dict:
        """``{"data": [document records], "total": N}``, newest first; ``query`` filters by text or name."""
        self._require_store()
        raise NotImplementedError

    def index_stats(self) -> dict:
        self._require_store()
        raise NotImplementedError

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Flush the output history and the document store to disk. Safe to call twice."""
        with self._lock:
            for obj in [*self.proposers, self.store]:
                for name in ("flush", "close"):
                    fn = getattr(obj, name, None)
                    if callable(fn):
                        try:
                            fn()
                        except Exception:  # keep flushing the others
                            log.exception("closing %r failed", obj)
                        break

    def __enter__(self) -> SuffixSpec:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
