"""suffixspec's suffix drafter as llama-cpp-python's ``draft_model``, drafting only what pays.

``Llama(model_path=..., draft_model=SuffixDraftModel())``: llama-cpp-python calls the draft model
once per step with the tokens so far (prompt + output, a numpy array) and appends the returned draft
tokens to the next batch it evaluates; it keeps the longest prefix of the draft its sampler agrees
with, plus the sampler's own token (``Llama.generate``). Drafts come from every registered drafter that
needs nothing but the tokenizer, the store and the history (``drafting.registry.build_available``; a
draft model is not one of them), through the request tracker vLLM uses too
(:class:`~suffixspec.drafting.tracked.TrackedRequest`): the suffix index drafts from the request's prompt and
output, its references and prediction (:meth:`SuffixDraftModel.request`), the output history and the
document store, configured for the single chain llama.cpp verifies (as :mod:`suffixspec.runtimes.vllm`).

Request identity: the interface gives tokens, no request. A call whose tokens extend the last call's
by the accepted part of the last draft plus one token continues that request; any other call starts
a new one, whose prompt is all but its last token (llama.cpp calls the draft model first right after
sampling the first output token). The request before it then ends: its output goes to the history.

Sizing, from measured costs (:mod:`suffixspec.drafting`, one row): a pass of ``n`` tokens costs ``t(n)``
(:class:`~suffixspec.drafting.costs.PassCost`), measured here as the time between two calls of one request (the
evaluation of the batch this model's last draft was part of, and the sampling after it), plus a short
calibration when bound to a ``Llama`` (:meth:`SuffixDraftModel.bind`). The index drafts up to the
engine's momentum budget (:func:`~suffixspec.drafting.budget.momentum_budget`); the chain is cut to the prefix
with the most tokens per second by its own node probabilities (:func:`~suffixspec.drafting.budget.best_chain_prefix`)
and sent only when it pays: ``(1 + expected) * t(1) >= t(1 + k)``
(:func:`~suffixspec.drafting.gates.choose_drafts`, with its calibration and bounded exploration). While the
index yields nothing worth sending it is asked less and less often, down to every :data:`IDLE_MAX`-th
step, and at once when the last 4 tokens repeat the request's own text. On text with nothing to copy
nothing is sent: llama.cpp evaluates one token per step, as without a draft model.

Worked example (SmolLM2 Q4_1, one thread, as measured here): t(1) = 8.3 ms, t(2) = 14 ms, t(9) = 52 ms
(a batch costs nearly as much per token as a step: ~5.5 ms). A copy whose next 8 tokens the index
holds at 0.98 each (score 7.6, calibration 1): 8.6 x 8.3 = 71 ms >= 52 ms -> sent; a 1-token match at
0.45: 1.45 x 8.3 = 12 ms < 14 ms -> not sent.

Lossless as llama.cpp is: its sampler draws every output token whether or not a draft was there (a
draft token is kept only where it equals that draw), so outputs equal llama.cpp's without a draft
model, up to the rounding of a batched evaluation against a one-token one (docs/llama_cpp.md gives the
measured share of identical outputs).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from suffixspec.core.stats import RequestStats
from suffixspec.drafting.budget import best_chain_prefix, momentum_budget
from suffixspec.drafting.costs import PassCost, StepCost
from suffixspec.drafting.draft import Draft
from suffixspec.drafting.gates import RowDraft, choose_drafts
from suffixspec.drafting.policy import DEFAULT, Policy
from suffixspec.drafting.proposers.base import Proposer, RequestContext
from suffixspec.drafting.proposers.suffix import SuffixConfig, SuffixProposer, single_chain_config
from suffixspec.drafting.registry import build_available
from suffixspec.drafting.tracked import ContextView, DraftRecord, TrackedRequest
from suffixspec.index.store import IndexStore

try:  # the base class when llama-cpp-python is installed (it is an ABC with __call__ only)
    from llama_cpp.llama_speculative import LlamaDraftModel as _Base
except ImportError:  # pragma: no cover - the module still imports (tests of the pieces, docs)
    _Base = object

INSTALL = "pip install 'suffixspec[llama-cpp]'"
# draft lengths the calibration evaluates (PassCost pools sizes 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64)
CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32)
# While the index yields nothing worth sending, it is asked every 2nd, 4th, then IDLE_MAX-th step, and at
# once when the context's last 4 tokens occurred before in the request's own texts (prompt, output,
# references, prediction: a copy may be starting). A query costs 0.1-0.5 ms of CPU between two llama.cpp
# passes (cold caches after a pass: 4x what it costs in a loop), 1.5-6% of an 8 ms SmolLM2 step, where
# open-ended text gains nothing from it. A copy of the history or the documents is found at most
# IDLE_MAX - 1 tokens late; every step after an accepted token asks again. Replayed SmolLM2 outputs
# (llama.cpp's costs): 8 kept RAG's gain, which 16 lost a third of, and asks half as often as 4.
IDLE_MAX = 8
_EMPTY = np.empty(0, dtype=np.intc)  # no draft (llama-cpp-python copies what it is given)
_NO_DRAFT = Draft()  # shared, never changed


@dataclass
class RequestArgs:
    """What :meth:`SuffixDraftModel.request` tells the drafter about the next request."""

    reference_ids: list[list[int]] = field(default_factory=list)  # RAG chunks, tokenized
    prediction_ids: list[int] | None = None  # the expected output of a code edit, tokenized
    drafters: tuple[str, ...] | None = None  # sources allowed (speculation.drafters); None = all
    enabled: bool = True  # False: no drafts for this request (speculation off)
    adaptive: bool = True  # False: every draft is sent, whatever it costs (tests; a fixed budget)
    max_draft_tokens: int | None = None  # the request's cap (None: the model's)


@dataclass(eq=False)
class ServedRequest:
    """The request the draft model is serving: its tokens and drafters, what its drafts taught, when to ask."""

    args: RequestArgs  # what was told about it
    tracked: TrackedRequest  # its tokens (what recognises it: _continues) and its drafters
    record: DraftRecord  # its statistics, the budget's momentum and its draft gate
    draft: Draft = field(default_factory=Draft)  # the draft returned at the last call (empty: none)
    last_call: float = 0.0  # clock at the start of the last call (the next call times the pass between)
    proposed: bool = False  # the last call asked the drafters (which learn from the very next tokens)
    idle: int = 0  # steps to skip between index queries while they yield nothing worth sending (backoff)
    wait: int = 0  # steps left to skip now
    seen: set[tuple[int, ...]] = field(default_factory=set)  # every 4 tokens in a row of its own texts so far
    tail: tuple[int, ...] = ()  # the context's last 4 tokens
    repeat: bool = False  # they occurred before in its own texts: a copy may be starting, ask the index now
    started: float = field(default_factory=time.perf_counter)


class SuffixDraftModel(_Base):
    """llama-cpp-python ``draft_model`` drafting from suffixspec's drafters (the suffix index, and any
    registered drafter that needs no model), sized by measured costs.

    Args:
        db: the document store (``suffixspec index add --db``) and persisted output history: an
            ``IndexStore``, a path, or None (no documents; the history is kept in memory).
        tokenizer: the model's ``transformers`` tokenizer (the one ``suffixspec`` loads for the same
            GGUF): needed with ``db`` (it names the documents' token ids) and for text matching at
            tokenization seams; None drafts from token matches only.
        config: the suffix settings (default :func:`single_chain_config`).
        history: draft from earlier outputs (and keep them).
        max_draft_tokens: the longest draft.
        adaptive: size and gate drafts by cost (False: send every draft the index makes).
        policy: the decision constants (``suffixspec.drafting.policy.Policy``).

    Per call: ``with draft.request(references=[...], prediction="..."):`` around a completion tells the
    drafter that call's references and prediction; :meth:`bind` gives it the ``Llama``'s tokenizer
    and context size and calibrates the cost curve (:func:`suffixspec.runtimes.llama_cpp.load` does both).
    """

    name = "suffix"

    def __init__(self, db: Any = None, tokenizer: Any = None, config: SuffixConfig | None = None,
                 history: bool = True, max_draft_tokens: int = 32, adaptive: bool = True,
                 policy: Policy | None = None) -> None:
        if not 0 <= max_draft_tokens <= 256:
            raise ValueError(f"max_draft_tokens must be between 0 and 256, got {max_draft_tokens}")
        self.policy = policy or DEFAULT
        self.db = db if db is None or isinstance(db, IndexStore) else IndexStore(db)  # (a path: opened here)
        self.history, self.tokenizer = history, tokenizer
        self.config = config or single_chain_config()  # the suffix index's settings
        self.proposers = self._build()  # the drafters every request is served by (one request at a time)
        self.max_draft_tokens = max_draft_tokens
        self.adaptive = adaptive
        self.cost = PassCost(self.policy)  # llama.cpp's pass time by tokens evaluated (shared by requests)
        self.n_ctx: int | None = None  # the Llama's context (bind): drafts never run past it
        self.clock = time.thread_time  # CPU time of the calling thread (bind: the process's with more threads)
        self._tokenize: Any = None  # text -> ids, as the bound Llama tokenizes (else the tokenizer's)
        self._next = RequestArgs()  # for the next request that starts
        self._live: ServedRequest | None = None
        self._lock = threading.Lock()  # one Llama drives this at a time; the lock makes misuse safe
        self.last_stats: RequestStats | None = None  # statistics of the last finished request
        self.on_pass: Any = None  # called with (tokens evaluated, seconds) for every pass timed (metrics)
        self.calls = 0

    # ----- set-up ------------------------------------------------------------------------------------
    def bind(self, llm: Any, calibrate: bool = True, lean_prompt: bool = True) -> SuffixDraftModel:
        """Use ``llm``'s tokenizer for references and predictions, its context size and thread counts;
        with ``calibrate``, time its evaluation of 1, 2, 4, ..., 32 tokens (a few hundred ms) so the first
        request already sizes its drafts by cost; with ``lean_prompt``, evaluate prompts as llama.cpp does
        without a draft model (:func:`lean_prompt_eval`). Returns self."""
        self.n_ctx = int(llm.n_ctx())
        params = getattr(llm, "context_params", None)
        threads = max(int(getattr(params, "n_threads", 1) or 1), int(getattr(params, "n_threads_batch", 1) or 1))
        self.clock = time.thread_time if threads == 1 else time.process_time
        self._tokenize = lambda text: llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        if calibrate:
            calibrate_cost(llm, self.cost, self.clock)
        if lean_prompt:
            lean_prompt_eval(llm, self)
        return self

    def _build(self, documents: Any = None) -> list[Proposer]:
        """Every registered drafter this runtime can feed (``documents``: arrays the suffix index has loaded)."""
        suffix = {"config": self.config, **({"documents": documents} if documents is not None else {})}
        return build_available({"tokenizer": self.tokenizer, "store": self.db, "history": self.history},
                               {"suffix": suffix})

    @property
    def suffix(self) -> SuffixProposer | None:
        """The suffix-index drafter (the API reads its history and documents), or None."""
        return next((p for p in self.proposers if isinstance(p, SuffixProposer)), None)

    @suffix.setter
    def suffix(self, proposer: SuffixProposer) -> None:
        self.proposers = [proposer if isinstance(p, SuffixProposer) else p for p in self.proposers]

    def forget(self) -> None:
        """Drop what was learned from earlier requests (each source's continuation rates, the output history
        in memory; nothing stored is deleted); the measured costs stay. Benchmarks start each workload so."""
        with self._lock:
            self._end()
            old = self.suffix
            self.proposers = self._build(old.documents if old is not None else None)

    def encode(self, text: str) -> list[int]:
        """Token ids of a reference or prediction text (no BOS), as the bound ``Llama`` tokenizes it."""
        if self._tokenize is not None:
            return list(self._tokenize(text))
        if self.tokenizer is not None:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        raise ValueError("text references need a tokenizer: call draft.bind(llm) (suffixspec.runtimes.llama_cpp.load does), "
                         "pass tokenizer= or give token ids")

    def _ids(self, text_or_ids: str | Sequence[int]) -> list[int]:
        return self.encode(text_or_ids) if isinstance(text_or_ids, str) else [int(t) for t in text_or_ids]

    @contextlib.contextmanager
    def request(self, references: Sequence[str | Sequence[int]] | None = None,
                prediction: str | Sequence[int] | None = None, drafters: Sequence[str] | None = None,
                enabled: bool = True, adaptive: bool | None = None,
                max_draft_tokens: int | None = None) -> Iterator[SuffixDraftModel]:
        """The completion run inside this block drafts from ``references`` (RAG chunks) and
        ``prediction`` (a code edit's expected output) besides its prompt, the history and documents;
        ``drafters`` limits the sources (names of ``speculation.drafters``); ``enabled=False`` drafts
        nothing. When the block ends, the request's output goes to the history::

            with draft.request(references=chunks):
                out = llm.create_chat_completion(messages=messages, temperature=0)
        """
        self.expect(RequestArgs([self._ids(r) for r in references or ()],
                                self._ids(prediction) if prediction else None,
                                tuple(drafters) if drafters is not None else None, enabled,
                                self.adaptive if adaptive is None else adaptive, max_draft_tokens))
        try:
            yield self
        finally:
            self.finish()

    def expect(self, args: RequestArgs) -> None:
        """The next request that starts is described by ``args`` (the current one, if any, ends now)."""
        with self._lock:
            self._end()
            self._next = args

    def finish(self, output: Sequence[int] | None = None) -> RequestStats | None:
        """End the current request (its output goes to the history); its statistics. ``output``: its
        full output when the caller knows it (tokens after the last draft call included)."""
        with self._lock:
            live = self._live
            if live is not None and output is not None:
                tail = [int(t) for t in list(output)[live.tracked.n - live.tracked.prompt_len:]]
                if tail:
                    self._observe(live, tail, None)
            stats = self._end()
            self._next = RequestArgs()
            return stats

    def _end(self) -> RequestStats | None:
        live, self._live = self._live, None
        if live is None:
            return None
        out = live.tracked.end()
        stats = live.record.stats
        stats.output_tokens = len(out)
        stats.time_total_s = time.perf_counter() - live.started
        self.last_stats = stats
        return stats

    @property
    def stats(self) -> RequestStats | None:
        """The current request's statistics, else the last finished one's."""
        live = self._live
        return live.record.stats if live is not None else self.last_stats

    @property
    def current_draft(self) -> Draft:
        """The draft returned at the last call (what llama.cpp is verifying now)."""
        live = self._live
        return live.draft if live is not None else Draft()

    # ----- llama-cpp-python's interface --------------------------------------------------------------
    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        """The draft continuing ``input_ids`` (prompt + output so far); empty for none."""
        with self._lock:
            t0 = self.clock()  # (one read: on a VM a thread's CPU clock costs ~5 us, a tenth of an idle call)
            wall = time.perf_counter()
            self.calls += 1
            ids = np.asarray(input_ids)
            n = len(ids)
            live = self._live
            if live is not None and self._continues(live, ids, n):
                self._observe(live, ids[live.tracked.n:n].tolist(), t0)
            else:
                self._end()
                live = self._begin(ids, n)
            draft = self._draft(live, ids, n)
            live.draft = draft
            live.record.stats.time_propose_s += time.perf_counter() - wall
            live.last_call = t0
            return np.asarray(draft.tokens, dtype=np.intc) if draft.tokens else _EMPTY

    # ----- requests ----------------------------------------------------------------------------------
    @staticmethod
    def _continues(live: ServedRequest, ids: np.ndarray, n: int) -> bool:
        """Whether ``ids[:n]`` is the live request one step on: its tokens, then an accepted prefix of its
        last draft and one sampled token (anything else is another request, or a new completion of a
        prompt that starts with this one)."""
        known = live.tracked
        m = known.n  # tokens known
        new = n - m
        if (new < 1 or new > len(live.draft.tokens) + 1 or ids.item(m - 1) != known.tokens.item(m - 1)
                or ids.item(0) != known.tokens.item(0)):
            return False  # (a few scalar reads: numpy calls are slow between two passes, the caches cold)
        return new == 1 or ids[m:n - 1].tolist() == live.draft.tokens[:new - 1]

    def _begin(self, ids: np.ndarray, n: int) -> ServedRequest:
        """A new request: ``ids[:n-1]`` its prompt, ``ids[n-1]`` its first output token."""
        args, self._next = self._next, RequestArgs()
        request = RequestContext(prompt_ids=ids[:n - 1].tolist(), reference_ids=args.reference_ids,
                                 prediction_ids=args.prediction_ids, drafters=args.drafters)
        cap = args.max_draft_tokens if args.max_draft_tokens is not None else self.max_draft_tokens
        # as the engine: start by trusting the index (sequence.RequestState)
        live = ServedRequest(args, TrackedRequest.new(self.proposers, ids, n, request), DraftRecord(self.policy, cap / 2))
        for seq in (ids[:n].tolist(), *args.reference_ids, args.prediction_ids or ()):
            live.seen.update(zip(seq, seq[1:], seq[2:], seq[3:], strict=False))
        live.tail = tuple(ids[max(0, n - 4):n].tolist())
        self._live = live
        return live

    def _observe(self, live: ServedRequest, new: list[int], t0: float | None) -> None:
        """``new`` = the accepted part of the last draft + the sampler's own token: record the step (its
        pass time when ``t0`` is given), feed the budget's means, the gate and the drafters."""
        draft, record = live.draft, live.record
        k = len(draft.tokens)
        if t0 is not None:  # the pass between two calls (and this drafter's own call, ~1% of it)
            seconds = max(0.0, t0 - live.last_call)
            if k or not record.stats.steps % 4:  # one-token passes are most of them: every 4th is plenty
                self.cost.observe(1 + k, seconds)
            if self.on_pass is not None:
                self.on_pass(1 + k, seconds)
        accepted = 0
        while accepted < min(k, len(new)) and new[accepted] == draft.tokens[accepted]:
            accepted += 1
        record.observe(draft, list(range(1, k + 1)), draft.sources[:accepted])
        if accepted:
            live.idle = live.wait = 0  # a copy is on: ask the drafters at every step
        live.tracked.append(new)
        for tok in new:  # (a tuple and a set lookup per token: far cheaper than asking the index)
            live.tail = (*live.tail[1:], tok)
            live.repeat = live.tail in live.seen
            live.seen.add(live.tail)
        if live.proposed:  # they learn what came of their drafts from exactly the tokens that followed them
            live.tracked.tell()

    def _draft(self, live: ServedRequest, ids: np.ndarray, n: int) -> Draft:
        """The chain to send: the drafters' best path within the budget, if the gate says it pays."""
        args, record = live.args, live.record
        cap = args.max_draft_tokens if args.max_draft_tokens is not None else self.max_draft_tokens
        if self.n_ctx is not None:
            cap = min(cap, self.n_ctx - n - 1)
        live.proposed = False
        if not args.enabled or cap <= 0:
            return _NO_DRAFT
        if live.wait > 0 and not live.repeat:
            live.wait -= 1
            return _NO_DRAFT
        budget = momentum_budget(cap, record.mean_accepted, record.copy_run, self.policy) if args.adaptive else cap
        # (the pass cost: the suffix index's documents gate weighs their nodes and lookups in passes)
        draft = live.tracked.propose(ContextView(ids, n), budget, self.step_cost(), record.stats)
        live.proposed = True
        if not args.adaptive:
            return draft
        if len(draft):
            if draft.probs is not None:  # its surest head, sized by its own probabilities against the cost curve
                probs = draft.probs
                k = best_chain_prefix(probs, record.gate.calibration, self.cost)
                draft = Draft(draft.tokens[:k], draft.parents[:k], draft.sources[:k], score=sum(probs[:k]))
            row = RowDraft(len(draft), record.gate.expected(draft.score), gate=record.gate)
            choose_drafts([row], self.cost)
            if row.verified:
                return draft
        # nothing worth sending: ask the drafters every 2nd, 4th, then 8th step until something is (IDLE_MAX)
        live.idle = min(IDLE_MAX, 2 * live.idle or 1)
        live.wait = live.idle
        return _NO_DRAFT

    def step_cost(self) -> StepCost:
        """What a plain llama.cpp step and more verified draft tokens cost, as the engine tells a proposer
        (``Proposer.observe_costs``). Example: t(1) = 8.3 ms, t(9) = 52 ms -> at a budget of 8 a draft token
        adds 5.5 ms, 0.66 of a step, where the engine's batched passes on a CPU make it a few hundredths."""
        return StepCost(self.cost)


def lean_prompt_eval(llm: Any, drafter: SuffixDraftModel) -> None:
    """Make ``llm`` compute a prompt's logits at its last token only, as it does without a draft model.

    With a draft model, llama-cpp-python evaluates every batch with the logits of every token (a draft
    is verified position by position), prompts included: the output layer runs once per prompt token
    (49k x 576 multiply-adds per token for SmolLM2, ~20% of its evaluation; measured here +0.4 s of CPU
    on a 300-token prompt, one thread) and the logits are copied out. ``llm.eval`` is wrapped so that a
    batch which is not ``[token] + the draft just returned`` is evaluated with its last logits only, which
    are then stored where the full evaluation would have put them (``llm.scores``: what
    ``create_completion``'s ``logprobs`` reads for the first generated token). Verify batches are
    evaluated as before. Prompt tokens' own logprobs (``echo=True`` with ``logprobs``) need
    ``bind(llm, lean_prompt=False)``. Relies on llama-cpp-python 0.3's ``Llama._logits_all``, which
    tests/test_llama_cpp.py checks."""
    import llama_cpp

    inner = llm.eval
    n_vocab = int(llm.n_vocab())

    def eval(tokens: Sequence[int]) -> None:  # noqa: A001 - it replaces Llama.eval
        draft = drafter.current_draft.tokens
        if len(tokens) <= 1 or (draft and len(tokens) == len(draft) + 1 and list(tokens[1:]) == draft):
            return inner(tokens)
        llm._logits_all = False
        try:
            inner(tokens)
        finally:
            llm._logits_all = True
        last = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        llm.scores[llm.n_tokens - 1, :] = np.ctypeslib.as_array(last, shape=(n_vocab,))

    llm.eval = eval


def calibrate_cost(llm: Any, cost: PassCost, clock: Any = time.thread_time, context: int = 16,
                   sizes: Sequence[int] = CALIBRATION_SIZES, repeats: int | None = None) -> None:
    """Time ``llm``'s evaluation of ``sizes`` tokens after a ``context``-token prefix (``repeats`` times each,
    smallest first) into ``cost``; the model's state is reset after. A few hundred ms for a 135M model.
    Each batch is evaluated as a verify pass is, by ``Llama.eval`` itself with every token's logits (a
    ``logits_all`` model): never through :func:`lean_prompt_eval`'s shortcut on the instance, which takes
    a calibration batch for a prompt and computes its last logits only (drafts would look cheaper than
    their verification is).
    ``repeats`` defaults to ``Policy.cost_min_passes``: fewer passes of a size count at most as the prior
    slope says (``PassCost``), and the first requests would take every draft for nearly free."""
    repeats = repeats or cost.policy.cost_min_passes
    filler = llm.tokenize(b" the", add_bos=False, special=False)[:1] or [0]
    evaluate = type(llm).eval.__get__(llm)  # the class's own, past any wrapper on the instance
    llm.reset()
    evaluate(filler * context)
    for _ in range(repeats):
        for k in sizes:
            if context + k >= int(llm.n_ctx()):
                break
            llm.n_tokens = context  # eval() drops the cache past n_tokens before it evaluates
            t = clock()
            evaluate(filler * k)
            cost.observe(k, clock() - t)
    llm.reset()
