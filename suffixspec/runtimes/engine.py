"""The speculative decode engine: the Python API over the decode loop.

``Engine.generate`` / ``Engine.stream`` check and tokenize a request (``sequence.prepare``) and run
it in the :class:`~suffixspec.core.scheduler.Scheduler`, the one decode loop: one request alone is a
batch of one, several concurrent callers (``max_num_seqs > 1``) share every target pass and each
gets what it gets alone: the same tokens for greedy requests and seeded requests with deterministic
drafts, the same law for requests whose drafts carry ``q`` (``sequence`` says exactly why). Per step:
propose -> choose (``gates.choose_drafts``) -> one pass over every row (``runner.Runner``) -> verify -> commit.

Module map (imports point down this list; ``tests/test_imports.py`` fails on a circle)::

    engine.py      this facade: arguments, the scheduler made on first use, the batching probe
    scheduler.py   the step loop: joins and leaves, cancellation, callers stepping in turn
    sequence.py    one request's state: propose, commit, stream events, the result
    probe_cache.py the probe's passing verdict, remembered in a converted model's folder
    threads.py     how many threads the target's passes run on (measured at start, re-checked)
    runner.py      the target: cache rows, the lean or padded pass, prefill, prefix reuse, the probe
    lean.py        lean forwards per architecture family (the target's passes and draft models)
    drafting/      which drafts are verified, which proposers run, the draft budget, the cost model
    kv.py          the slot cache and ``tree_mask``
    verify.py      the lossless tree walk; sampling.py the target's distribution and randomness

Worked example (greedy, chain draft): committed "... a", draft [b, c, d]; the target's argmax after
a, b, c is b, c, x -> accept b c, emit x: three tokens for one pass.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch

from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.core.prefix import PrefixStore
from suffixspec.core.probe_cache import batch_problem
from suffixspec.core.runner import Runner
from suffixspec.core.scheduler import PassRecord, Scheduler
from suffixspec.core.sequence import (
    GenerationResult,
    RequestState,
    StreamEvent,
    Target,
    encode,
    prepare,
    result_of,
)
from suffixspec.core.threads import ThreadTuner
from suffixspec.drafting.gates import ProposerRecord
from suffixspec.drafting.policy import Policy
from suffixspec.drafting.proposers import Proposer, RequestContext
from suffixspec.drafting.proposers.model_drafter import ModelDrafter
from suffixspec.loading import LoadedModel, max_context

log = logging.getLogger(__name__)

__all__ = ["Engine", "GenerationResult", "StreamEvent"]


class SharedRecords:
    """Proposer records (``drafting.gates.ProposerRecord`` by index) shared by an engine's requests, one set per
    proposer set, keyed by the proposers themselves through weak references: a set's records go when one
    of its proposers is dropped, so a new set never inherits them. Keyed by ``id()`` alone, a new proposer
    that Python put at a dead one's address took its records (41 of 50 fresh suffix proposers did).

    Example: ``records.of([a, b])`` -> ``{}``, filled by the requests; ``records.of([a, b])`` again -> the
    same dict; ``records.of([b, a])`` -> another; once ``a`` is dropped, a new ``[a2, b]`` starts empty."""

    def __init__(self) -> None:
        # ids of a live set's proposers -> (weak references to them, the set's records); an entry leaves
        # when one of its proposers dies, before its id can be reused
        self._sets: dict[tuple[int, ...], tuple[tuple[weakref.ref, ...], dict[int, ProposerRecord]]] = {}

    def of(self, proposers: Sequence[Proposer]) -> dict[int, ProposerRecord]:
        """The records of the proposer set ``proposers`` (in this order), made empty on first use."""
        key = tuple(id(p) for p in proposers)
        entry = self._sets.get(key)
        if entry is not None and all(ref() is p for ref, p in zip(entry[0], proposers, strict=True)):
            return entry[1]
        refs = tuple(weakref.ref(p, lambda ref, key=key: self._drop(key, ref)) for p in proposers)
        records: dict[int, ProposerRecord] = {}
        self._sets[key] = (refs, records)
        return records

    def _drop(self, key: tuple[int, ...], dead: weakref.ref) -> None:
        entry = self._sets.get(key)
        if entry is not None and any(ref is dead for ref in entry[0]):  # not a later set at the same ids
            del self._sets[key]

    def __len__(self) -> int:
        return len(self._sets)


class Engine:
    """Generates with a target model, speculating with the given proposers.

    ``max_num_seqs``: requests stepped together when called from several threads (1 = one at a time);
    ``prefix_cache_mb``: memory for the keys and values of earlier prompts' prefixes (0 = none);
    ``policy``: the decision constants (``policy.Policy``); ``threads``: torch threads for the target's
    passes (None: measured on a CPU, see ``threads.ThreadTuner``)."""

    def __init__(self, target: LoadedModel, proposers: Sequence[Proposer] = (), max_draft_tokens: int = 32,
                 max_num_seqs: int = 1, prefix_cache_mb: float = 256, policy: Policy | None = None,
                 threads: int | None = None) -> None:
        if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be a positive integer (1 = one request at a time), got {max_num_seqs!r}")
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 = no prompt-prefix reuse), got {prefix_cache_mb!r}")
        self.target = target
        self.model = target.model
        self.tokenizer = target.tokenizer
        self.model_name = target.name
        self.device = torch.device(target.device)
        self.proposers = list(proposers)
        self.default_speculation = SpeculationConfig(max_draft_tokens=max_draft_tokens)
        self.policy = policy or Policy()
        self.max_context = max_context(self.model.config)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.eos_ids = self._eos_ids()
        self.max_num_seqs = max_num_seqs  # requests stepped together
        self.step_observer: Callable[[PassRecord], None] | None = None  # called with every target pass
        # keys/values of earlier prompts' prefixes; None: every prompt prefilled in full
        self.prefix_store = PrefixStore(max_bytes=int(prefix_cache_mb * 2**20)) if prefix_cache_mb else None
        # proposer costs and yields shared across requests, per proposer set (``proposers`` when a request
        # joins): a caller that swaps the set (the benchmark, one system after another) never lends one
        # proposer's record to another, nor a dropped set's records to a new one
        self._shared = SharedRecords()
        self._scheduler: Scheduler | None = None
        self._lock = threading.Lock()  # making the scheduler
        self._target = Target(self.tokenizer, self.eos_ids, self.vocab_size, self.device, self.max_context,
                              self.policy)
        self._batch_problem: str | None = None  # why passes cannot hold several rows (set by the probe)
        self.threads = ThreadTuner(threads, device=str(target.device))  # the passes' thread count

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for value in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    # ----------------------------------------------------------------- public API
    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    def generate(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None,
                 speculation: SpeculationConfig | bool | None = None, references: Sequence[str] | None = None,
                 prediction: str | None = None, cancel: threading.Event | None = None) -> GenerationResult:
        """Generate to completion and return the result."""
        return result_of(self.stream(prompt, sampling, speculation, references, prediction, cancel))

    def stream(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None,
               speculation: SpeculationConfig | bool | None = None, references: Sequence[str] | None = None,
               prediction: str | None = None, cancel: threading.Event | None = None) -> Iterator[StreamEvent]:
        """Generate step by step, yielding new text and tokens; the last event carries the result.

        With ``max_num_seqs > 1`` concurrent callers share passes; each gets what it would get alone
        (the same tokens, or for drafts with ``q`` the same law: see ``sequence``). A caller may pause
        between events: the other requests go on meanwhile."""
        request, spec = self.prepare(prompt, sampling, speculation, references, prediction)
        yield from self.scheduler.stream(self.state_maker(request, spec, cancel), cancel, request.prompt_ids)

    def prepare(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None,
                speculation: SpeculationConfig | bool | None = None, references: Sequence[str] | None = None,
                prediction: str | None = None) -> tuple[RequestContext, SpeculationConfig]:
        """Check and tokenize a request's arguments (a ``RequestError`` says what to change)."""
        return prepare(self.tokenizer, self.max_context, self.default_speculation, prompt, sampling, speculation,
                       references, prediction)

    def state_maker(self, request: RequestContext, spec: SpeculationConfig, cancel: threading.Event | None
                    ) -> Callable[[list[Proposer]], RequestState]:
        """What the scheduler calls when the request joins, with the proposer set it lends it."""
        def make(proposers: list[Proposer]) -> RequestState:
            for p in proposers:  # a draft model judges its drafts by the engine's policy (ModelDraftJudge)
                if isinstance(p, ModelDrafter):
                    p.policy = self.policy
            return RequestState(self._target, request, spec, cancel, proposers, self._shared.of(self.proposers))

        return make

    def use_policy(self, policy: Policy) -> None:
        """Decide with ``policy`` from the next request on (``Policy`` is frozen: make one with
        ``dataclasses.replace``, which validates it): the engine's gates and budget, its cost model, and the
        draft models' own judgement, which every request joining is lent. The pass-cost curves already made
        keep theirs (``cost_window``, ``prior_slope``, ``cost_min_passes``: what was measured stays).
        Example: ``engine.use_policy(replace(engine.policy, model_value_shared=False))``."""
        self.policy = self._target.policy = policy
        if self._scheduler is not None:
            self._scheduler.policy = policy

    def close(self) -> None:
        """Nothing to end: the engine runs no thread of its own (callers step the loop in turn)."""

    def warm_up(self) -> None:
        """Pay the one-time costs of a start now rather than in the first request: the target's runner
        (packed weights), the batching probe and the thread count, whose timed passes also warm the
        kernels (``SuffixSpec`` calls this; otherwise the first request does)."""
        _ = self.scheduler

    @property
    def scheduler(self) -> Scheduler:
        """The decode loop, made (and the target probed) on first use."""
        with self._lock:
            if self._scheduler is None:
                runner = self._runner()
                rows = self.max_num_seqs if self._batch_problem is None else 1
                self._scheduler = Scheduler(runner, lambda: self.proposers, rows, self.policy, self._observe,
                                            self.threads)
            return self._scheduler

    @property
    def numerics(self) -> dict:
        """What the target computes with, as ``/health`` reports it: ``{"weights", "kernel", "attention"}``.
        ``kernel``: the integer product (``fbgemm`` or ``int_mm`` at int8, ``blockq`` at gguf; None for a floating
        format); ``attention``:
        ``native`` (an exact format's compiled kernel, core/exact_attention), ``sdpa per query`` (an exact format
        without it), ``sdpa`` (the lean forward's grouped calls) or ``own forward`` (the model's). Example on this
        CPU: ``{"weights": "int8", "kernel": "fbgemm", "attention": "native"}``."""
        lean = self.scheduler.runner.lean
        exact = lean is not None and lean.exact
        attention = ("own forward" if lean is None else "sdpa" if not exact
                     else "native" if lean.native is not None else "sdpa per query")
        return {"weights": self.target.weights, "kernel": getattr(lean.head, "kernel", None) if exact else None,
                "attention": attention}

    @property
    def batchable(self) -> bool:
        """Whether several requests can share a pass (the probe in ``Runner.batch_problem``)."""
        return self.scheduler is not None and self._batch_problem is None

    def _observe(self, record: PassRecord) -> None:
        if self.step_observer is not None:
            self.step_observer(record)

    def _runner(self) -> Runner:
        """The target's runner: the lean forward when the model has one and it passes the probe, else
        the model's own forward; one row at a time when even that fails the probe (said in the log). A
        converted model's passing verdict is remembered for the next start (``probe_cache``)."""
        folder = self.target.cache_folder  # a converted model's: a passing verdict is remembered there
        runner = Runner(self.model, self.max_num_seqs, self.prefix_store, weights=self.target.lean_kind)
        problem = batch_problem(runner, folder)
        if problem is not None and runner.lean is not None and self.target.lean_kind == "float":
            log.warning("the lean forward is off for %s (%s)", self.model_name, problem)
            runner = Runner(self.model, self.max_num_seqs, self.prefix_store, lean=False)
            problem = batch_problem(runner, folder)
        self._batch_problem = problem
        if problem is not None and self.max_num_seqs > 1:
            log.warning("%s cannot be batched (%s); serving one request at a time", self.model_name, problem)
        tp = self.threads.policy
        with runner.sample_pass(tp.probe_inputs, tp.probe_context) as run:
            self.threads.calibrate(run)
        return runner
