"""The proposer interface: what every drafter implements and what it may know of a request.

Lifecycle for one request::

    p.begin(request)                  # prompt ids, per-request references, sampling settings
    loop:
        draft = p.propose(context, budget)   # context = prompt + output so far (target ids)
        ...verify...
        p.update(new_tokens)          # tokens appended to the context this step
    p.end(output_ids)

Proposer modules import this one (never the package, whose factory imports them).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from suffixspec.config import SamplingParams
from suffixspec.drafting.draft import Draft

if TYPE_CHECKING:
    from suffixspec.drafting.costs import StepCost


@dataclass
class RequestContext:
    """What a proposer may know about the request it serves."""

    prompt_ids: list[int]  # target-tokenizer ids of the prompt
    reference_ids: list[list[int]] = field(default_factory=list)  # per-request references (RAG chunks), tokenized
    prediction_ids: list[int] | None = None  # code-edit prediction (OpenAI `prediction`), tokenized
    sampling: SamplingParams = field(default_factory=SamplingParams)  # the request's sampling settings
    drafters: tuple[str, ...] | None = None  # sources this request allows; None = all


class Proposer(ABC):
    """One drafter. ``name`` is used in configuration; node sources come from ``Draft.sources``."""

    name: str = "proposer"
    # seconds of the last propose() spent on one-off request setup (a draft model's lazy prefill of the
    # prompt): the engine's ProposerGate judges a proposer by its per-step cost, without it
    setup_s: float = 0.0

    def live_sources(self) -> tuple[str, ...]:
        """The node sources it can draft as built (what ``SuffixSpec.drafters`` and ``/v1/models`` list): its
        drafter's declared sources (``DRAFTER.sources``); a drafter whose sources depend on what it was
        given (the suffix index without a store has no documents) narrows them."""
        from suffixspec.drafting.registry import drafter

        try:
            return drafter(self.name).sources
        except ValueError:  # a proposer no drafter declares (a test's double): no source to list
            return ()

    def begin(self, request: RequestContext) -> None:  # noqa: B027 - optional hook
        """A request starts; reset per-request state."""

    @abstractmethod
    def propose(self, context: Sequence[int], budget: int) -> Draft:
        """Return a draft of at most ``budget`` nodes continuing ``context`` (empty draft if none)."""

    def drafts_with_q(self) -> bool:
        """Whether this request's drafts carry ``q`` (tokens sampled from a draft distribution).

        Drafts without it are deterministic given the context (verified by the one-hot rule), so
        the engine's gates may judge them by their shape and hold the proposer back when the target
        is too unsure for any of them to pay (``gates.DraftGate.hopeless``); drafts with ``q`` may
        be judged only by what was fixed before sampling. Called after ``begin``."""
        return False

    # whether the proposer weighs its own cost against its yield (a draft model, per drafted token:
    # judge.ModelDraftJudge), so the engine's ProposerGate does not judge its calls' yields
    judges_own_cost: bool = False

    def observe_costs(self, step: StepCost | None) -> None:  # noqa: B027 - optional hook
        """The pass cost as this request's row sees it this step (``costs.StepCost``: a plain step's CPU
        seconds, what more verified nodes add; None: the engine judges no costs), told before ``propose``,
        for a proposer that weighs what its drafts cost against what they yield (a draft model plans its
        draft from it, the suffix proposer its documents)."""

    def observe_lead(self, tokens: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """A chain the proposers before this one are sure of this step (a suffix copy), told before
        ``propose``: a draft model checks it in one forward rather than drafting it token by token."""

    def observe_promise(self, tokens: float) -> None:  # noqa: B027 - optional hook
        """The accepted tokens the drafts of the proposers before this one promise this step (their scores,
        each times its proposer's trust), told before ``propose``: a draft model values its own tokens by it."""

    def active(self) -> bool:
        """Whether it may draft anything for this request (called after ``begin``): a proposer the request's
        ``speculation.drafters`` leave out is neither called nor timed, so the costs and yields the engine
        remembers across requests (``gates.ProposerGate``'s shared records) are never those of a no-op call."""
        return True

    def setup_pending(self) -> bool:
        """Whether the next ``propose`` pays a one-off setup for this request (``setup_s``: a draft
        model's prefill of the prompt); the engine defers such a call while it cannot tell whether
        a draft would be worth anything (a sampled request's first step)."""
        return False

    def update(self, new_tokens: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """``new_tokens`` (accepted draft tokens plus the target's own token) were appended to the context."""

    def end(self, output_ids: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """The request finished with these output ids."""

    def fork(self) -> Proposer:
        """A twin for another request running at the same time (continuous batching).

        It shares what serves every request (models, document index, output history) and owns
        the per-request state that ``begin`` resets. The default is a shallow copy, right for
        proposers whose per-request state is only reassigned in ``begin``/``update``."""
        return copy.copy(self)
