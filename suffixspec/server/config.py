"""Server settings: which models to load and the limits that protect the one engine."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from suffixspec.models import DEFAULT_MODEL


@dataclass
class ServerConfig:
    """Everything ``create_app`` needs. Unknown keys in a dict config raise ``ValueError``."""

    model: str = DEFAULT_MODEL  # target model: a model name, a .gguf file, a local folder or a hub id
    draft_model: str | None = "auto"  # draft model; "auto" = the one shipped for the target, if any; None = off
    db: str | bool | None = None  # SQLite document store; None = $SUFFIXSPEC_DB or the default path,
    #                               ":memory:" = a temporary store, False = no documents
    device: str | None = None  # torch device; None picks cuda when present, else cpu
    dtype: str | None = None  # older name for a floating weight format (float32, bfloat16, float16)
    weights: str = "auto"  # weight format (suffixspec.core.formats.FORMATS): auto = fastest exact here (int8 on most CPUs)
    runtime: str = "transformers"  # "transformers" (our engine) or "llama-cpp" (the GGUF in llama.cpp, docs/llama_cpp.md)
    threads: int | None = None  # torch threads for the model's passes (llama-cpp: its threads); None = measured (suffixspec.core.threads)
    served_model_name: str | list[str] | None = None  # model id(s) clients may name; the first is the one
    #                                                  /v1/models reports; None = the model argument
    allowed_hosts: list[str] | None = None  # Host header values accepted (DNS-rebinding guard); None = loopback
    #                                         names only (localhost, 127.0.0.1, [::1]); ["*"] = any
    allowed_origins: list[str] | None = None  # browser Origins (besides the page's own) that may POST/DELETE;
    #                                           ["*"] = any
    api_key: str | None = None  # when set, every /v1 route needs `Authorization: Bearer <api_key>`
    max_queue: int = 32  # requests waiting for the engine beyond the running ones; more get 503
    max_num_seqs: int = 4  # requests the engine steps together (continuous batching); 1 = one at a time
    prefix_cache_mb: float = 256  # keys/values of earlier prompts kept for reuse by shared prefixes (0 = off)
    retry_after_s: int = 2  # Retry-After header on a 503 when the queue is full
    max_body_bytes: int = 8 * 1024 * 1024  # larger request bodies get 413
    max_prompt_tokens: int | None = None  # longest prompt accepted; None = the model's context length
    max_tokens_limit: int = 8192  # largest max_tokens a request may ask for
    default_max_tokens: int = 512  # chat default when the request gives no max_tokens (clamped to context)
    default_completion_max_tokens: int = 16  # /v1/completions default, as OpenAI's legacy endpoint
    max_references: int = 64  # most `references` chunks per request
    max_reference_chars: int = 1_000_000  # total characters of references + prediction per request
    max_stop: int = 16  # most stop strings per request
    max_documents_per_request: int = 1000  # most documents in one POST /v1/index/documents
    max_json_depth: int = 64  # deepest nesting of arrays/objects a request body may have
    max_query_chars: int = 1000  # longest ?q= search string for GET /v1/index/documents
    shutdown_timeout_s: float = 10.0  # on shutdown, wait this long for the running request, then cancel it
    disconnect_poll_s: float = 0.2  # how often a waiting request checks whether its client went away

    def __post_init__(self) -> None:
        if not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be a positive integer (1 = one request at a time), "
                             f"got {self.max_num_seqs!r}")
        if isinstance(self.prefix_cache_mb, bool) or not isinstance(self.prefix_cache_mb, (int, float)) \
                or not 0 <= self.prefix_cache_mb < float("inf"):
            raise ValueError(f"prefix_cache_mb must be a number >= 0 (0 = no prompt-prefix reuse), "
                             f"got {self.prefix_cache_mb!r}")
        for name in ("max_queue", "max_body_bytes", "max_tokens_limit", "default_max_tokens",
                     "default_completion_max_tokens", "max_references", "max_stop", "max_json_depth",
                     "max_query_chars"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ValueError(f"threads must be a positive integer (None = measured), got {self.threads!r}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError("max_prompt_tokens must be >= 1 (or None for the model's context length)")
        if self.weights not in ("auto", "float32", "bfloat16", "float16", "int8", "gguf", "gguf16"):  # formats.FORMATS (no torch here)
            raise ValueError(f"weights must be one of auto, float32, bfloat16, float16, int8, gguf, gguf16, got {self.weights!r}")
        if self.api_key == "":
            self.api_key = None
        for name in ("allowed_hosts", "allowed_origins"):
            v = getattr(self, name)
            if isinstance(v, str):
                setattr(self, name, [x.strip() for x in v.split(",") if x.strip()])

    @property
    def served_names(self) -> list[str]:
        """The model names given with ``served_model_name`` (may be empty)."""
        v = self.served_model_name
        if v is None:
            return []
        return [x for x in ([v] if isinstance(v, str) else list(v)) if x]

    @classmethod
    def from_any(cls, config: ServerConfig | dict[str, Any] | None) -> ServerConfig:
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown server setting(s) {unknown}; known: {sorted(known)}")
        return cls(**config)
