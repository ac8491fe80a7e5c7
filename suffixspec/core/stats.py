"""Per-request speculative-decoding statistics (``to_dict`` is the response's ``speculative_decoding``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestStats:
    """What happened while serving one request. Times are wall-clock seconds."""

    steps: int = 0  # target forward passes after the prefill (one per decode step)
    drafted_tokens: int = 0  # draft nodes sent to verification
    accepted_tokens: int = 0  # draft tokens that ended up in the output
    output_tokens: int = 0  # tokens generated (accepted drafts + target tokens)
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> {"drafted", "accepted"}
    drafted_per_position: list[int] = field(default_factory=list)  # [d]: steps whose draft reached depth d+1
    accepted_per_position: list[int] = field(default_factory=list)  # [d]: steps that accepted depth d+1
    accepted_per_step: list[int] = field(default_factory=list)  # accepted draft tokens of each step
    # ... and by source ({} for a step that accepted none): the web page's step chart, exact per step
    sources_per_step: list[dict[str, int]] = field(default_factory=list)
    time_prefill_s: float = 0.0  # prompt forward pass
    time_propose_s: float = 0.0  # all proposers, gates and merge included
    # per proposer (by name: "suffix", "draft_model", ...): wall seconds of its calls (a draft model's prompt
    # prefill at its first call included) and how many calls; a proposer the gates did not call is absent
    propose_s_per_drafter: dict[str, float] = field(default_factory=dict)
    propose_calls: dict[str, int] = field(default_factory=dict)
    time_verify_s: float = 0.0  # target forward passes and the tree walk
    time_update_s: float = 0.0  # KV compaction, proposer updates, detokenization
    time_total_s: float = 0.0  # whole request

    def record_step(self, draft_sources: list[str], draft_depths: list[int], accepted_sources: list[str]) -> None:
        self.steps += 1
        self.drafted_tokens += len(draft_sources)
        self.accepted_tokens += len(accepted_sources)
        self.accepted_per_step.append(len(accepted_sources))
        by_source: dict[str, int] = {}
        for src in accepted_sources:
            by_source[src] = by_source.get(src, 0) + 1
        self.sources_per_step.append(by_source)
        for src in draft_sources:
            self.per_source.setdefault(src, {"drafted": 0, "accepted": 0})["drafted"] += 1
        for src in accepted_sources:
            self.per_source.setdefault(src, {"drafted": 0, "accepted": 0})["accepted"] += 1
        max_depth = max(draft_depths, default=0)
        _grow(self.drafted_per_position, max_depth)
        _grow(self.accepted_per_position, len(accepted_sources))
        for d in range(max_depth):
            self.drafted_per_position[d] += 1
        for d in range(len(accepted_sources)):
            self.accepted_per_position[d] += 1

    def record_call(self, drafter: str, seconds: float) -> None:
        """One call of proposer ``drafter`` took ``seconds``."""
        self.propose_s_per_drafter[drafter] = self.propose_s_per_drafter.get(drafter, 0.0) + seconds
        self.propose_calls[drafter] = self.propose_calls.get(drafter, 0) + 1

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per target forward pass (accepted drafts + the target's own token)."""
        return self.output_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "output_tokens": self.output_tokens,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "per_source": {k: dict(v) for k, v in self.per_source.items()},
            "drafted_per_position": list(self.drafted_per_position),
            "accepted_per_position": list(self.accepted_per_position),
            "accepted_per_step": list(self.accepted_per_step),
            "sources_per_step": [dict(d) for d in self.sources_per_step],
            "time_prefill_s": round(self.time_prefill_s, 6),
            "time_propose_s": round(self.time_propose_s, 6),
            "propose_s_per_drafter": {k: round(v, 6) for k, v in self.propose_s_per_drafter.items()},
            "propose_calls": dict(self.propose_calls),
            "time_verify_s": round(self.time_verify_s, 6),
            "time_update_s": round(self.time_update_s, 6),
            "time_total_s": round(self.time_total_s, 6),
        }


def _grow(values: list[int], size: int) -> None:
    if len(values) < size:
        values.extend([0] * (size - len(values)))
