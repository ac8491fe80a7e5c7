"""One request tracker for the runtimes that hand a drafter only tokens: vLLM and llama.cpp.

vLLM's ``custom_class`` proposer (:mod:`suffixspec.runtimes.vllm`) and llama-cpp-python's ``draft_model``
(:mod:`suffixspec.runtimes.llama_cpp`) are handed the tokens so far (prompt + output) at every step, never a
request id. Both recognise a request by its tokens and keep a :class:`TrackedRequest`: a copy of its
tokens, keyed by its first ones (:meth:`TrackedRequest.holds` tells in O(1) whether a new call's tokens
still extend it: its first and last tokens compared), and its drafters: forks of the runtime's proposers
(every registered drafter whose needs the runtime offers, ``drafting.registry.build_available``), driven
through the :class:`~suffixspec.drafting.proposers.base.Proposer` interface as the engine drives them (``begin``,
``update``, ``propose``, ``end``). So a new drafter reaches both runtimes with nothing written for either.
:class:`DraftRecord` is what a request learned from its drafts, kept alike by the engine
(``sequence.RequestState``) and the llama.cpp drafter. :class:`ContextView` hands the runtime's token array
to the drafters without copying it. Worked example::

    req = TrackedRequest.new([suffix.fork()], np.array([5, 6, 7, 8]), 4, RequestContext([5, 6, 7]))
    req.holds(np.array([5, 6, 7, 8, 9, 4]), 6)    # True: same start, ends with ... 8
    req.append([9, 4])                            # req.n == 6; the drafters learn 9 4 at the next propose
    req.propose(ContextView(row, 6), 8)           # the best-scoring chain of its drafters
    req.holds(np.array([1, 2, 3]), 3)             # False: another request
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from suffixspec.core.stats import RequestStats
from suffixspec.drafting.costs import StepCost
from suffixspec.drafting.draft import Draft, drafter_allows
from suffixspec.drafting.gates import DraftGate
from suffixspec.drafting.policy import Policy
from suffixspec.drafting.proposers.base import Proposer, RequestContext

KEY_TOKENS = 16  # leading tokens that key a request (its prompt's start)
EDGE_TOKENS = 8  # trailing tokens compared to confirm that a row still holds the same request


def token_key(row: np.ndarray, n: int) -> bytes:
    """The bytes of ``row[:n]`` as int32, whatever the row's own integer type: the one way requests are keyed
    and compared, so that a runtime handing int64 rows finds the requests it keyed (a key of raw int64
    bytes never equals an int32 one). Example: ``token_key(np.array([5, 6, 7]), 2) == np.array([5, 6],
    dtype=np.int32).tobytes()``."""
    return row[:n].astype(np.int32, copy=False).tobytes()


class ContextView(Sequence):
    """Tokens ``row[:n]`` as a read-only sequence whose slices are lists of ints.

    The index lookups only read the context's tail (``context[-64:]``), so this spares copying the
    whole row (up to the model's context) on every step.
    """

    __slots__ = ("row", "n")

    def __init__(self, row: np.ndarray, n: int) -> None:
        self.row, self.n = row, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):  # a list's slice semantics, reversed and negative steps included
            return self.row[:self.n][i].tolist()
        return int(self.row[range(self.n)[i]])

    def __iter__(self) -> Iterator[int]:
        return iter(self.row[:self.n].tolist())


def chain_of(draft: Draft) -> Draft:
    """The draft's first path from the root (a chain: what vLLM and llama.cpp verify); the draft itself when
    it is one. Example: parents ``[-1, 0, 0, 1]`` -> nodes 0, 1 (node 2 is a sibling of 1, and 3 comes after it)."""
    k = 0
    while k < len(draft) and draft.parents[k] == k - 1:
        k += 1
    return draft.truncated(k)


@dataclass(eq=False)
class TrackedRequest:
    """One request a runtime knows by its tokens: the tokens and the request's drafters."""

    proposers: list[Proposer]  # its drafters (forks of the runtime's), begun with its prompt
    tokens: np.ndarray  # prompt + output so far (capacity grows by doubling; valid up to n)
    n: int  # tokens known
    prompt_len: int  # tokens before the first sampled one (the output starts here)
    committed: int  # tokens[prompt_len:committed] are already in the output history
    key: bytes  # its first key_len tokens, to find it again when it moves to another slot or resumes
    key_len: int  # KEY_TOKENS, or fewer for a request that started shorter
    allowed: tuple[str, ...] | None = None  # the sources its drafts may carry (speculation.drafters); None: all
    pending: list[int] = field(default_factory=list)  # tokens appended that the drafters were not told yet

    @classmethod
    def new(cls, proposers: Sequence[Proposer], row: np.ndarray, n: int, request: RequestContext
            ) -> TrackedRequest:
        """A request whose tokens are ``row[:n]``, ``request.prompt_ids`` their start: its drafters begin
        with ``request`` and learn the output so far."""
        prompt_len = len(request.prompt_ids)
        tokens = np.empty(max(64, 2 * n), dtype=np.int32)
        tokens[:n] = row[:n]
        key_len = min(n, KEY_TOKENS)
        req = cls(list(proposers), tokens, n, prompt_len, prompt_len, token_key(tokens, key_len), key_len,
                  request.drafters)
        for p in req.proposers:
            p.begin(request)
        if n > prompt_len:
            req.pending = tokens[prompt_len:n].tolist()
            req.tell()
        return req

    def holds(self, row: np.ndarray, n: int) -> bool:
        """Whether ``row[:n]`` still extends this request (cheap: start and end compared)."""
        m = self.n
        if n < m or token_key(row, self.key_len) != self.key:
            return False
        lo = max(0, m - EDGE_TOKENS)  # bytes, not np.array_equal: 10x faster on 8 tokens (once per step)
        return token_key(row[lo:m], m - lo) == self.tokens[lo:m].tobytes()

    def prefix_of(self, row: np.ndarray, n: int) -> bool:
        """Full check: this request's tokens are a prefix of ``row[:n]`` (its end first: cheap misses)."""
        m = self.n
        return self.holds(row, n) and bool(np.array_equal(row[:m], self.tokens[:m]))

    def append(self, new: Sequence[int] | np.ndarray) -> None:
        """Tokens the request gained; the drafters learn them at :meth:`tell` (or the next :meth:`propose`)."""
        end = self.n + len(new)
        if end > len(self.tokens):
            grown = np.empty(max(end, 2 * len(self.tokens)), dtype=np.int32)
            grown[:self.n] = self.tokens[:self.n]
            self.tokens = grown
        self.tokens[self.n:end] = new
        self.n = end
        self.pending += new.tolist() if isinstance(new, np.ndarray) else list(new)

    def tell(self) -> None:
        """Tell the drafters the tokens appended since they were last told (``Proposer.update``)."""
        if self.pending:
            pending, self.pending = self.pending, []
            for p in self.proposers:
                p.update(pending)

    def propose(self, context: Sequence[int], budget: int, step: StepCost | None = None,
                stats: RequestStats | None = None) -> Draft:
        """The chain to verify: each active drafter's first path (``step``: the pass cost, told to each
        before it proposes; ``stats``: where the calls are timed), the best-scoring one whose sources the
        request allows (the first of equals), or an empty draft."""
        self.tell()
        best = Draft()
        for p in self.proposers:
            if not p.active():
                continue
            if step is not None:
                p.observe_costs(step)
            t = time.perf_counter()
            draft = chain_of(p.propose(context, budget)).truncated(budget)
            if stats is not None:
                stats.record_call(p.name, time.perf_counter() - t)
            allowed = all(drafter_allows(self.allowed, s) for s in draft.sources)
            if len(draft) and allowed and (not len(best) or draft.score > best.score):
                best = draft
        return best

    def output(self) -> list[int]:
        """The output so far (``tokens[prompt_len:n]``)."""
        return self.tokens[self.prompt_len:self.n].tolist()

    def uncommitted(self) -> np.ndarray:
        """The output not yet in the history (``tokens[committed:n]``); marks it committed."""
        out = self.tokens[self.committed:self.n].astype(np.uint32)
        self.committed = self.n
        return out

    def end(self) -> list[int]:
        """The request ended: its drafters are told its output (``Proposer.end``), which it returns."""
        self.tell()
        out = self.output()
        for p in self.proposers:
            p.end(out)
        return out


@dataclass(eq=False)
class DraftRecord:
    """What one request learned from its drafts, kept alike by every runtime that judges them: the
    statistics, the budget's momentum (``drafting.budget``) and the draft gate (``drafting.gates.DraftGate``).

    Example (``accepted_rate`` 0.3): mean 4.0; a chain of 3 accepted whole -> mean 3.7, copy run 3; a draft
    rejected at its first token -> mean 2.59, copy run 0."""

    policy: Policy  # the decision constants
    mean_accepted: float  # running mean of accepted tokens per step (the budget's momentum)
    stats: RequestStats = field(default_factory=RequestStats)
    gate: DraftGate | None = None  # the request's draft gate (made from the policy when not given)
    copy_run: int = 0  # accepted tokens of the last step when it accepted its whole draft path, else 0
    copy_sources: set[str] = field(default_factory=set)  # the sources of that path

    def __post_init__(self) -> None:
        if self.gate is None:
            self.gate = DraftGate(self.policy)

    def observe(self, draft: Draft, depths: list[int], accepted_sources: list[str]) -> None:
        """A step verified ``draft`` (its nodes' ``depths``) and accepted nodes of ``accepted_sources``."""
        self.stats.record_step(draft.sources, depths, accepted_sources)
        rate, accepted = self.policy.accepted_rate, len(accepted_sources)
        self.mean_accepted = (1 - rate) * self.mean_accepted + rate * accepted
        self.copy_run = accepted if len(draft) and accepted == max(depths) else 0
        self.copy_sources = set(accepted_sources) if self.copy_run else set()
        if len(draft):
            self.gate.observe(draft.score, accepted)  # type: ignore[union-attr]
