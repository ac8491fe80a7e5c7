"""The Python API: one object that loads the models, keeps the document index and generates.

``SuffixSpec`` is what RAG pipelines embed, what ``suffixspec generate`` wraps and what the HTTP
server holds (one per process, shared by every route). Worked example::

    from suffixspec import SuffixSpec

    spec = SuffixSpec(db=":memory:")              # SmolLM2-135M-Instruct, index in memory
    spec.add_documents(["def area(r):\\n    return 3.14159 * r * r\\n"])
    chunks = ["def area(r):\\n    return 3.14159 * r * r\\n"]   # what your retriever returned
    res = spec.generate("def area(r):", references=chunks, max_tokens=32)
    print(res.text)
    print(res.stats.to_dict()["mean_accepted_length"])   # tokens per target forward pass

    for ev in spec.stream("def area(r):", references=chunks):
        print(ev.text, end="", flush=True)

Generation is lossless: with speculation on or off the output is the same (greedy) or has the same
distribution (sampling). With ``max_num_seqs > 1`` calls from several threads share the target's
forward passes (continuous batching), each getting exactly the output it would get alone; with 1
they run one at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.errors import RequestError
from suffixspec.models import DEFAULT_MODEL, check_model_name, default_draft

log = logging.getLogger(__name__)

AUTO = "auto"  # draft_model default: the draft model shipped for the target (models.default_draft), if any
# what runs the target: our engine over transformers, or llama.cpp (llama-cpp-python) with our drafter in it
RUNTIMES = ("transformers", "llama-cpp")


@dataclass
class Message:
    """One chat message (``role`` is system, user, assistant, ...)."""

    role: str
    content: str


def _check_unicode(text: Any, param: str) -> None:
    """A RequestError for a string no tokenizer takes: one holding a lone UTF-16 surrogate ("\\ud800")."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise RequestError(f"'{param}' holds a lone UTF-16 surrogate ({text[e.start]!r} at character {e.start}); "
                               "give valid Unicode text", param) from None


class SuffixSpec:
    """Models, drafters, the document index and the engine, built once.

    Args:
        model: target model: a model name (``smollm2-135m-instruct``, the default, or
            ``gemma-3-270m``: installed from the package registry, converted once into the cache),
            a ``.gguf`` file, a local folder, a hub id, or the embedded test fixture
            ``suffixspec/demo-target``. ``suffixspec models`` lists the names.
        draft_model: a draft model with any tokenizer (named as ``model``); ``"auto"`` (default)
            uses the draft model shipped for the target (the embedded ``suffixspec/demo-draft``
            for ``suffixspec/demo-target``) and none when there is none; ``None`` or ``"none"``
            disables it.
        db: the SQLite document store (the one ``suffixspec index add --db`` fills). ``None``
            (default) uses ``$SUFFIXSPEC_DB`` or ``~/.local/share/suffixspec/index.db``;
            ``":memory:"`` uses a temporary store deleted on ``close()``; ``False`` runs without
            documents and without a persisted output history.
        device / dtype: as for ``suffixspec.loading.load_model`` (default: cuda if present, else cpu).
        weights: the weight format of the target and the draft model: ``"auto"`` (default: on a CPU ``gguf`` for
            a model named by its GGUF file (``gguf16`` where gguf is measured to lose quality: SmolLM2), else the
            fastest exact int8 kernel measured there; on a GPU bfloat16/float16), ``"float32"`` (exactly
            ``transformers``' output), ``"bfloat16"``, ``"float16"`` (not exact: a token may change with the
            batch), ``"gguf"`` (the GGUF file's own blocks with 8-bit activations), ``"gguf16"`` (the same blocks
            with ~15-bit activations) and ``"int8"`` (int8 rows): each its own output, identical with speculation
            on and off, batched or alone. docs/formats.md.
            ``spec.weights`` says the format chosen.
        history: ``True`` (default) drafts from earlier outputs and saves every output in the store's
            history (so it persists across runs: prompts' completions are stored in ``db``);
            ``False`` neither reads nor writes the output history: nothing generated is stored, and
            earlier runs do not change what is drafted.
        engine: an already built engine (tests, custom proposers); model, draft_model and db are
            then only used for the document store (``db=False`` for none).
        max_num_seqs: generations stepped together when called from several threads (1 = one at a
            time, as ``suffixspec serve --max-num-seqs 1``).
        prefix_cache_mb: memory for the target's keys/values of earlier prompts, reused by a prompt that
            starts with the same tokens (0 = recompute every prompt).
        threads: torch threads for the model's passes on a CPU. ``None`` (default): measured when the
            object is built (one thread or every core, whichever passes faster) and re-checked while
            decoding, as the machine's load changes; ``OMP_NUM_THREADS`` in the environment fixes it
            too. ``spec.threads`` says what was chosen. On the llama-cpp runtime: llama.cpp's threads
            (``None``: llama-cpp-python's default, the physical cores).
        runtime: ``"transformers"`` (default: our engine) or ``"llama-cpp"``: the model's GGUF in llama.cpp
            with the suffix drafter as its draft model (``pip install 'suffixspec[llama-cpp]'``; no draft
            model, one request at a time; docs/llama_cpp.md).

    Building it pays a start's one-time costs (loading, packing the weights, the batching probe, the
    thread measurement), so the first request runs as fast as the later ones.
    """

    def __init__(self, model: str = DEFAULT_MODEL, draft_model: str | None = AUTO,
                 db: str | Path | None | bool = None, device: str | None = None, dtype: str | None = None,
                 engine: Any = None, history: bool = True, max_num_seqs: int = 1,
                 prefix_cache_mb: float = 256, threads: int | None = None, runtime: str = "transformers",
                 weights: str = "auto") -> None:
        if runtime not in RUNTIMES:
            raise ValueError(f"unknown runtime {runtime!r}; choose from {', '.join(RUNTIMES)}")
        self._lock = threading.RLock()  # close()
        self.proposers: list[Any] = []
        self._tmpdir: Any = None
        self._closed = False
        self.weights = weights  # the weight format asked for; after loading, the one chosen (formats.FORMATS)
        if draft_model == AUTO:
            draft_model = default_draft(model) if runtime == "transformers" else None
        if draft_model in ("none", ""):
            draft_model = None
        if engine is None:  # a name nothing can load fails now, not after importing torch
            for name in (model, draft_model):
                if name:
                    check_model_name(name)
        self.model_name = model
        self.draft_model_name = draft_model
        self.history = bool(history)  # draft from and save the output history
        self.db_path = self._db_path(db)  # None: no store
        self.store: Any = None  # IndexStore the suffix proposer reads (only from inside the decode loop)
        self.documents: Any = None  # suffixspec.index.DocumentIndex: the document methods below go through it
        if engine is not None:
            self.engine = engine
            self.proposers = list(getattr(engine, "proposers", []))
            self.model_name = getattr(engine, "model_name", model)
        elif runtime == "llama-cpp":
            self.engine = self._build_llama_cpp(model, draft_model, device, dtype, threads)
        else:
            self.engine = self._build_engine(model, draft_model, device, dtype, max_num_seqs, prefix_cache_mb,
                                             threads)
            self.engine.warm_up()
            log.info("torch threads: %s", self.engine.threads.describe())
        self.tokenizer = self.engine.tokenizer
        self.suffix = next((p for p in self.proposers if getattr(p, "name", "") == "suffix"), None)
        if self.store is None and self.db_path is not None:  # an engine was given: open the store for documents
            from suffixspec.index.store import IndexStore

            self.store = IndexStore(self.db_path)
        if self.db_path is not None:
            self.documents = self._document_index()

    def _db_path(self, db: str | Path | None | bool) -> str | None:
        if db is False:
            return None
        if db == ":memory:":
            import tempfile

            self._tmpdir = tempfile.TemporaryDirectory(prefix="suffixspec-")
            return str(Path(self._tmpdir.name) / "index.db")
        if db is None or db is True:
            from suffixspec.index.database import default_db_path

            return str(default_db_path())
        return str(db)

    # -- construction -------------------------------------------------------------------------

    def _build_engine(self, model: str, draft_model: str | None, device: str | None, dtype: str | None,
                      max_num_seqs: int = 1, prefix_cache_mb: float = 256, threads: int | None = None) -> Any:
        from suffixspec.loading import load_model
        from suffixspec.runtimes.engine import Engine

        target = load_model(model, device=device, dtype=dtype, weights=self.weights)
        self.weights = target.weights
        self.proposers = self._build_proposers(target, draft_model, device, dtype)
        return Engine(target, self.proposers, max_num_seqs=max_num_seqs, prefix_cache_mb=prefix_cache_mb,
                      threads=threads)

    def _build_llama_cpp(self, model: str, draft_model: str | None, device: str | None, dtype: str | None,
                         threads: int | None) -> Any:
        """llama.cpp runs the model's GGUF, the suffix drafter (over this object's store) its draft model."""
        if draft_model:
            raise ValueError(f"the llama-cpp runtime drafts with the suffix index only; drop the draft model "
                             f"{draft_model!r} (--draft-model none)")
        if device not in (None, "cpu") or dtype is not None or self.weights not in ("auto", None):
            raise ValueError("device, dtype and weights are the transformers runtime's settings; llama.cpp runs the GGUF "
                             "as it is quantized, on the CPU")
        from suffixspec.runtimes.llama_cpp.engine import build_engine

        if self.db_path is not None:
            from suffixspec.index.store import IndexStore

            self.store = IndexStore(self.db_path)
        engine = build_engine(model, self.store, history=self.history, n_threads=threads)
        self.proposers = list(engine.proposers)
        return engine

    def _build_proposers(self, target: Any, draft_model: str | None, device: str | None,
                         dtype: str | None) -> list[Any]:
        """Every drafter whose needs this object has (``drafting.registry.build_available``): the suffix
        index (request, references, prediction, history, documents) and, when a draft model is named, the
        draft-model proposer (bridged if its tokenizer differs)."""
        from suffixspec.drafting.registry import build_available

        if self.db_path is not None:
            from suffixspec.index.store import IndexStore

            self.store = IndexStore(self.db_path)
        draft = None
        if draft_model:
            from suffixspec.core.formats import draft_weights
            from suffixspec.loading import load_model

            # the draft follows the target's format (an int8 draft runs the kernel measured fastest for it)
            draft = load_model(draft_model, device=target.device, weights=draft_weights(target.weights), draft=True,
                               share_tokenizer=target)  # one tokenizer where they tokenize alike (Qwen's pair)
        return build_available({"tokenizer": target.tokenizer, "target": target, "draft": draft,
                                "store": self.store, "history": self.history})

    # -- tokenization -------------------------------------------------------------------------

    @property
    def threads(self) -> dict:
        """The torch thread count and how it was chosen: ``{"threads", "how", "measured_ms", "wait_policy",
        "rechecks", "switches"}`` (``how``: measured, given, OMP_NUM_THREADS, device or one core)."""
        tuner = getattr(self.engine, "threads", None)
        return tuner.to_dict() if tuner is not None else {}

    @property
    def numerics(self) -> dict:
        """The target's weight format, int8 kernel and attention path (``Engine.numerics``; a llama.cpp engine:
        its format alone)."""
        report = getattr(self.engine, "numerics", None)
        return dict(report) if report is not None else {"weights": self.weights}

    @property
    def max_context(self) -> int:
        return int(self.engine.max_context)

    @property
    def drafters(self) -> list[str]:
        """The drafters this object has, named as ``speculation.drafters`` names them (in the registry's
        order, ``drafting.registry.source_names``): each proposer's ``live_sources`` (the suffix index's
        request sources, ``history`` when outputs are kept, ``documents`` with a store; ``draft_model``
        when one is loaded). ``SuffixSpec(draft_model=None, db=False, history=False).drafters ==
        ["prompt", "references", "prediction"]``."""
        from suffixspec.drafting.registry import source_names

        have: set[str] = set()
        for p in self.proposers:
            live = getattr(p, "live_sources", None)
            have.update(live() if callable(live) else ())
        return [name for name in source_names() if name in have]

    @property
    def has_chat_template(self) -> bool:
        """Whether the target's tokenizer has a chat template (else ``render_chat`` writes a plain transcript)."""
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt, exactly as generation sees them."""
        enc = getattr(self.engine, "encode", None)
        if enc is not None:
            return list(enc(text))
        return list(self.tokenizer(text)["input_ids"])

    def render_chat(self, messages: Sequence[Message | dict]) -> str:
        """The prompt text the tokenizer's chat template makes of ``messages`` (ready for the assistant).

        ``developer`` (OpenAI's newer name for the role) reaches the template as ``system``, which chat
        templates know. A template that refuses the conversation (roles out of order, say) raises
        ``RequestError``."""
        msgs = [dict(m) if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
        for m in msgs:
            if m.get("role") == "developer":
                m["role"] = "system"
        if not self.has_chat_template:
            # No template: a plain transcript, so base models still get a sensible prompt.
            return "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"
        from jinja2 import TemplateError  # what a template's raise_exception (and any template fault) raises

        try:
            return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        except TemplateError as e:
            raise RequestError(f"the model's chat template rejected these messages: {e}", "messages") from None

    def encode_chat(self, messages: Sequence[Message | dict], check: Callable[[str], None] | None = None
                    ) -> list[int]:
        """Token ids of a chat prompt: ``render_chat``'s text, tokenized with no special tokens added (the
        template holds them). HTTP and Python requests both encode messages here. ``check``, if given, sees
        the rendered text before it is tokenized and may refuse it (the server's length bounds)."""
        text = self.render_chat(messages)
        if check is not None:
            check(text)
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
            raise RequestError("give exactly one of prompt= or messages=", "prompt")
        texts = [("prompt", prompt), ("prediction", prediction)] + [("references", r) for r in references or ()]
        texts += [("messages", m.get("content") if isinstance(m, dict) else m.content) for m in messages or ()]
        for param, text in texts:
            _check_unicode(text, param)
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

    def _document_index(self) -> Any:
        """The document index the methods below use (``suffixspec index`` uses the same one): it indexes
        for this model's tokenizer, and large adds and merges run in a writer process at the lowest
        priority, merges in the background."""
        import copy

        from suffixspec.index.document_index import DocumentIndex, TokenizerChoice

        def own_tokenizer(_index: Any) -> TokenizerChoice:  # not the tokenizer the generating threads use
            return TokenizerChoice(copy.deepcopy(self.tokenizer), self.model_name)

        index = DocumentIndex(self.db_path, load_tokenizer=own_tokenizer, background_merges=True)
        index.serve(self.tokenizer, self.model_name, fingerprint=getattr(self.suffix, "fingerprint", None))
        return index

    def _docs(self) -> Any:
        if self.documents is None:
            from suffixspec.index.errors import NoDocumentStore

            raise NoDocumentStore("this SuffixSpec runs without a document store (db=False); give db=PATH to add "
                                  "documents")
        return self.documents

    def add_documents(self, documents: Sequence[str | dict]) -> list[dict]:
        """Add texts, or ``{"text", "source", "metadata"}`` dicts, to the document index.

        A document's identity is its ``source`` (a path or name) or, without one, its content hash:
        re-adding the same text changes nothing, a new text under the same source replaces the old.
        The next generation drafts from them. Returns one record per document (``id``, ``status``
        = added / updated / unchanged, sizes). A document without text raises ``InvalidDocument``.
        """
        return self._docs().add_documents(documents)

    def add_paths(self, paths: Sequence[str | Path], globs: Sequence[str] = (), follow_links: bool = False,
                  max_bytes: int | None = None, exclude: Sequence[str] = ()) -> list[dict]:
        """Add text files (directories are walked, filtered by ``globs`` such as ``"*.py"``; directories and
        files named like one of ``exclude``, such as ``"tests"``, left out), as ``suffixspec index add``
        does with the same options.

        Skips binary and empty files, files over ``max_bytes`` (2 MiB by default), FIFOs and devices,
        dangling or looping symlinks, and symlinks out of ``paths`` unless ``follow_links``. Returns one
        record per file: the added ones as ``add_documents`` gives them, each skipped one as
        ``{"object": "document", "id": None, "source", "status": "skipped", "reason"}`` (also logged as
        a warning). A path that does not exist raises FileNotFoundError.
        """
        index = self._docs()
        summary = index.add_paths([str(p) for p in paths], globs, follow_links, max_bytes, exclude,
                                  on_skip=lambda path, _kind, why: log.warning("skipped %s: %s", path, why))
        return index.records(summary) + [{"object": "document", "id": None, "source": path, "status": "skipped",
                                          "reason": why} for path, _kind, why in summary.skipped_files]

    def remove_documents(self, ids: Sequence[int | str]) -> int:
        """Remove documents by id (or source path); returns how many were removed."""
        return self._docs().remove_documents(ids)

    def list_documents(self, limit: int = 20, offset: int = 0, query: str | None = None) -> dict:
        """``{"data": [records], "total": N}``, newest first; ``query`` filters by source or text."""
        return self._docs().list_documents(limit, offset, query)

    def index_stats(self) -> dict:
        """Corpus statistics of the store for this model's tokenizer (other tokenizers the documents are
        indexed for under ``also_indexed_for``), plus what this process holds in memory (``served``)."""
        stats = self._docs().stats()
        if self.suffix is not None:
            hist = getattr(self.suffix, "history", None)
            docs = getattr(self.suffix, "documents", None)
            stats["served"] = {
                "history_outputs": hist.num_outputs if hist is not None else 0,
                "history_tokens": hist.num_tokens if hist is not None else 0,
                "documents_loaded_tokens": int(getattr(docs, "num_tokens", 0) or 0),
                # added/removed since the drafter last loaded them: they load at the next generation
                "documents_pending": bool(self.suffix.documents_pending()),
            }
        return stats

    def history_status(self) -> dict:
        """Whether outputs are being saved: ``{"enabled", "persisted", "error", "write_failures"}``.

        ``error`` is set while the database refuses writes (read-only, full): generation goes on and
        the outputs are kept in memory only; ``write_failures`` counts them."""
        hist = getattr(self.suffix, "history", None) if self.suffix is not None else None
        return {"enabled": hist is not None,
                "persisted": hist is not None and hist.store is not None and not hist.write_error,
                "error": getattr(hist, "write_error", None), "write_failures": getattr(hist, "write_failures", 0)}

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Flush the output history and close the document store. Safe to call twice.

        Call it once no generation is running (the server stops its worker first)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            calls = [getattr(self.engine, "close", None)]  # a given engine's resources (ours holds none)
            calls += [getattr(p, "flush", None) for p in self.proposers]  # history is written as it goes
            calls += [s.close for s in (self.documents, self.store) if s is not None]
            for fn in calls:
                if callable(fn):
                    try:
                        fn()
                    except Exception:  # keep closing the others
                        log.exception("closing failed: %r", fn)
            if self._tmpdir is not None:
                self._tmpdir.cleanup()

    def __enter__(self) -> SuffixSpec:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

