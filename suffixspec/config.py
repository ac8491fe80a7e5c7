"""Configuration dataclasses: sampling parameters per request, speculation settings, engine settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from suffixspec.drafting.draft import PREDICTION_RULE
from suffixspec.drafting.registry import source_names
from suffixspec.errors import RequestError


@dataclass
class SamplingParams:
    """How the target's next-token distribution is processed and sampled (same on every path).

    A value out of range raises :class:`~suffixspec.errors.RequestError` naming the field."""

    max_tokens: int = 128  # generate at most this many tokens (EOS included)
    temperature: float = 0.0  # 0 means greedy (argmax); > 0 samples from softmax(logits / temperature)
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p; 1.0 keeps all
    presence_penalty: float = 0.0  # subtracted once from logits of tokens already generated (OpenAI semantics)
    frequency_penalty: float = 0.0  # subtracted per occurrence from logits of generated tokens
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> value added to its logit
    seed: int | None = None  # seeds the per-position random numbers; None draws a fresh seed
    stop: list[str] = field(default_factory=list)  # stop strings; output ends before the first occurrence
    stop_token_ids: list[int] = field(default_factory=list)  # extra end tokens besides the tokenizer's EOS
    ignore_eos: bool = False  # keep going past EOS (benchmarks that need a fixed length)
    logprobs: int | None = None  # return the top-N log-probabilities of each generated token (0..20)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}", "max_tokens")
        if self.temperature < 0:
            raise RequestError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}", "temperature")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0 (0 = off), got {self.top_k}", "top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise RequestError(f"{name} must be between -2 and 2, got {getattr(self, name)}", name)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not s for s in self.stop):
            raise RequestError("stop strings must be non-empty", "stop")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**63):
            raise RequestError(f"seed must be an integer between 0 and 2**63 - 1, got {self.seed!r}", "seed")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise RequestError(f"logprobs must be between 0 and 20, got {self.logprobs}", "logprobs")
        self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class SpeculationConfig:
    """Which drafters run for a request and how large a draft tree may be."""

    enabled: bool = True  # False: plain decoding, one target token per step
    # subset of the drafters' sources (drafting.registry.source_names) to use; None = every drafter loaded. A request's prediction drafts whenever it is
    # given, named here or not (draft.drafter_allows): send no prediction to run without it
    drafters: tuple[str, ...] | None = None
    max_draft_tokens: int = 32  # node budget for the merged draft tree
    adaptive: bool = True  # shrink/grow the budget from measured acceptance

    def __post_init__(self) -> None:
        if self.drafters is not None:
            self.drafters = tuple(self.drafters)
            known = source_names()
            unknown = [d for d in self.drafters if d not in known]
            if unknown:
                raise RequestError(f"unknown drafter(s) {unknown}; choose from {list(known)} ({PREDICTION_RULE})",
                                   "drafters")
        if not 0 <= self.max_draft_tokens <= 256:
            raise RequestError(f"max_draft_tokens must be between 0 and 256, got {self.max_draft_tokens}",
                               "max_draft_tokens")
