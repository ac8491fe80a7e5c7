"""The decode loop: one step moves every running request (a batch of rows) forward; one request is a
batch of one.

A step, top to bottom (:meth:`Scheduler.step`):

1. **admit** waiting requests while there is room (each gets a proposer set and a cache row; a
   reused prompt prefix is copied into its row; a model without the lean forward feeds the rest
   of the prompt now, in a pass of its own);
2. **propose**: every decoding row plans its draft (its own proposers, budget and gates); a
   cancelled row, or one out of context, leaves;
3. **choose**: ``gates.choose_drafts`` decides which drafts the pass verifies, from the cost of a
   pass with this step's rows;
4. **pass**: ONE forward over every decoding row's root and verified nodes, plus the prompts of the
   requests that joined since the last step (lean models pack them in), on the thread count
   ``threads.ThreadTuner`` sets (its wall time feeds the tuner's re-checks, its CPU time the cost
   curve of that count);
5. **commit**: every row walks its own tree (``verify_tree``), keeps its accepted keys and values
   and commits its tokens (a stream event for its caller); finished rows leave.

A request's failure stays its own: whatever fails while it joins (its proposers, its state, its prefix
copy, its prefill), drafts, is verified or commits ends that request alone with a
:class:`~suffixspec.errors.RequestFailed` naming the step (its caller's next event), its row and proposers
let go; requests held back a step to share a prefill go back to the line whatever fails; a failed lean
pass of several rows runs each row alone, so only a row that fails alone fails. What no one request can
be blamed for (a padded pass of several rows, the choice of drafts) fails the step's rows.

Nobody owns a thread for this: a caller waiting for its request's next event runs steps itself, one
at a time (a lock held for a step, never across a ``yield``); while one caller steps, the others
wait for its step to end or for their own event. So a request alone runs on its caller's thread as
before batching; a caller that reads one event and pauses holds nobody up (the others step its row
along, its events wait in its queue); a caller that stops reading cancels its request, which leaves
at the next step.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from suffixspec.core.lean import PassRow
from suffixspec.core.prefix import common_prefix
from suffixspec.core.runner import Runner
from suffixspec.core.sequence import Plan, RequestState, StreamEvent
from suffixspec.core.threads import ThreadTuner
from suffixspec.core.verify import verify_tree
from suffixspec.core.weights import trim_heap
from suffixspec.drafting.costs import PassCost, StepCost, cpu_clock
from suffixspec.drafting.draft import Draft
from suffixspec.drafting.gates import choose_drafts
from suffixspec.drafting.policy import Policy
from suffixspec.drafting.proposers import Proposer
from suffixspec.errors import RequestError, RequestFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassRecord:
    """One target pass, as the scheduler's observer sees it (the server's metrics count these)."""

    rows: int  # requests whose drafts (or lone roots) the pass verified
    inputs: int  # their tokens: every such row's root plus its verified draft nodes
    prompt_tokens: int  # prompt tokens of joining requests fed in the same pass (a prefill: all of them)
    cpu_seconds: float  # the pass's CPU time (costs.cpu_clock)


@dataclass
class Handle:
    """A request submitted to the scheduler, and the queue its caller reads."""

    make: Callable[[list[Proposer]], RequestState]  # builds the request's state from the proposer set it is lent
    cancel: threading.Event  # set by the caller (client gone) or when the caller stops reading
    state: RequestState | None = None  # the request's decode state, once admitted
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # StreamEvent..., the final one, or an error
    proposers: list[Proposer] | None = None  # the proposer set lent to this request
    joining: bool = False  # admitted, its prompt (past a reused prefix) not yet in the cache: it rides in the next pass
    reused: int = 0  # prompt positions copied from the prefix store
    prompt: list[int] = field(default_factory=list)  # the prompt's token ids (staggering joiners that share a head)


class Scheduler:
    """Steps up to ``max_num_seqs`` requests together; others wait in line (see the module docstring)."""

    def __init__(self, runner: Runner, proposers: Callable[[], list[Proposer]], max_num_seqs: int,
                 policy: Policy, observer: Callable[[PassRecord], None] | None = None,
                 threads: ThreadTuner | None = None) -> None:
        self.runner = runner
        self.proposers = proposers  # the engine's current proposers (forked for concurrent requests)
        self.max_num_seqs = max_num_seqs
        self.policy = policy
        self.threads = threads  # the thread count of every pass (None: torch's, untouched)
        # pass time by total inputs, learned across requests, at the chosen thread count (a count's passes
        # cost otherwise: one curve each, ``_costs`` keeps the others')
        self.cost: Any = PassCost(policy)
        self._cost_threads = threads.current if threads is not None else None  # the count ``cost`` is of
        self._costs: dict[int | None, Any] = {}  # thread count -> its PassCost (the chosen one's is ``cost``)
        self.observer = observer  # called with every target pass's PassRecord
        self._rows: list[Handle] = []  # row i of the cache
        self._waiting: deque[Handle] = deque()
        self._cond = threading.Condition()  # guards _waiting and _stepping; notified at every step's end
        self._stepping = False  # a caller is running a step
        self._pool: list[list[Proposer]] = []  # proposer sets not in use (forks of the engine's proposers)
        self._pool_of: tuple[int, ...] = ()  # ids of the engine proposers the pool was forked from
        self._forked = 0

    # -- caller side -----------------------------------------------------------------------------------
    def submit(self, make: Callable[[list[Proposer]], RequestState], cancel: threading.Event | None = None,
               prompt: list[int] | None = None) -> Handle:
        """Queue a request; ``make(proposers)`` builds its state when it joins the batch. ``prompt``: its
        token ids, when known (a joiner that shares a head with another joiner then waits for its prefill)."""
        handle = Handle(make, cancel or threading.Event(), prompt=list(prompt or ()))
        with self._cond:
            self._waiting.append(handle)
        return handle

    def stream(self, make: Callable[[list[Proposer]], RequestState], cancel: threading.Event | None,
               prompt: list[int] | None = None) -> Iterator[StreamEvent]:
        """Run a request; yields its StreamEvents (the last carries the result)."""
        handle = self.submit(make, cancel, prompt)
        finished = False
        try:
            while True:
                ev = self.next_event(handle)
                if isinstance(ev, BaseException):
                    finished = True
                    raise ev
                if ev.result is not None:
                    finished = True
                yield ev
                if finished:
                    return
        finally:
            if not finished:  # the caller stopped reading
                handle.cancel.set()
                self._leave(handle)

    def next_event(self, handle: Handle) -> StreamEvent | BaseException:
        """``handle``'s next event, running steps while none is there and no other caller is stepping."""
        while True:
            try:
                return handle.events.get_nowait()
            except queue.Empty:
                pass
            with self._cond:
                if self._stepping:  # another caller's step: it ends, or brings our event, then we look again
                    self._cond.wait()
                    continue
                self._stepping = True
            try:
                if handle.events.empty():
                    self.step()
            finally:
                with self._cond:
                    self._stepping = False
                    self._cond.notify_all()

    def _leave(self, handle: Handle) -> None:
        """A cancelled request leaves now (its proposers told, its row freed) unless a step is running,
        which then lets it leave at the next step (``RequestState.plan`` sees the cancel)."""
        with self._cond:
            if self._stepping:
                return
            if handle in self._waiting:
                self._waiting.remove(handle)
                return
            self._stepping = True
        try:
            if handle in self._rows:
                handle.state.finish = "cancelled"
                self._finish(handle)
        finally:
            with self._cond:
                self._stepping = False
                self._cond.notify_all()

    @property
    def running(self) -> int:
        """Requests in the batch now."""
        return len(self._rows)

    @property
    def waiting(self) -> int:
        """Requests waiting for a row."""
        return len(self._waiting)

    # -- the step --------------------------------------------------------------------------------------
    def step(self) -> None:
        """Admit waiting requests, then run one decode step for the batch (module docstring)."""
        try:
            self._admit()
            plans = self._propose()
            if plans:
                choose_drafts([p.row_draft for _, p in plans], self.cost)
                for _, plan in plans:
                    if not plan.row_draft.verified:
                        plan.draft = Draft()  # not verified: its calls yielded nothing (ProposerGate)
            self._pass_and_commit(plans)
        except Exception as e:  # a failed pass fails its rows, never the callers stepping
            log.exception("decode step failed")
            for h in list(self._rows):
                self._fail(h, failed("its batch's step", e))

    def _admit(self) -> None:
        """Give waiting requests rows while there is room. A request whose join fails gets its error and
        leaves; the requests held back to share another joiner's prefill go back to the head of the line
        whatever happens (they would otherwise be in no queue, their callers waiting forever)."""
        waiting_for_prefill: list[Handle] = []  # another joiner's prefill of the head they share
        try:
            while len(self._rows) < self.max_num_seqs:
                with self._cond:
                    if not self._waiting:
                        break
                    handle = self._waiting.popleft()
                try:
                    if self._shares_a_prefill(handle):
                        waiting_for_prefill.append(handle)
                        continue
                except Exception as e:
                    self._fail(handle, failed("joining the batch", e))
                    continue
                self._join(handle)
        finally:
            with self._cond:
                self._waiting.extendleft(reversed(waiting_for_prefill))

    def _shares_a_prefill(self, handle: Handle) -> bool:
        """Whether a joiner whose prompt is not computed yet shares ``Policy.shared_prefill_min`` more
        tokens with ``handle``'s prompt than the prefix store holds: then ``handle`` waits a step and
        copies them. Example (blocks of 16): A and B share a 300-token head and join together; A's
        prompt rides in the next pass, B joins one step later and copies 288 positions."""
        store = self.runner.prefix_store
        prompt = handle.prompt[:-1]
        if store is None or not prompt or handle.cancel.is_set():
            return False
        stored = store.covered(prompt)
        for other in self._rows:
            if other.joining:
                shared = common_prefix(prompt, other.prompt[:-1])
                if shared - shared % store.block - stored >= self.policy.shared_prefill_min:
                    return True
        return False

    def _join(self, handle: Handle) -> None:
        """Give ``handle`` a row: its state, its proposers, its reused prefix (and, on the padded path, its
        prefill). Whatever fails here fails ``handle`` alone (a ``RequestFailed`` naming the stage): its row
        and proposers are let go, the rows already running are untouched."""
        stage = "joining the batch"
        try:
            handle.proposers = self._proposer_set()
            handle.state = handle.make(handle.proposers)
            handle.state.begin()
            row = self.runner.add_row()
            self._rows.append(handle)
            if handle.cancel.is_set():  # gone while waiting: it leaves at the next step, unprefilled
                return
            prompt = handle.state.request.prompt_ids[:-1]
            handle.prompt = handle.state.request.prompt_ids
            t = time.perf_counter()
            stage = "copying its reused prompt prefix"
            handle.reused = self.runner.reuse(row, prompt)
            if self.runner.packs_prompts:  # the rest rides in the next pass with the others' drafts
                handle.joining = handle.reused < len(prompt)
                if not handle.joining:
                    handle.state.stats.time_prefill_s = time.perf_counter() - t
                return
            stage = "prefilling its prompt"
            if self.threads is not None:
                self.threads.before_pass()
            cpu = cpu_clock()
            self.runner.prefill(row, prompt[handle.reused:], handle.reused)
            if self.observer is not None:
                self.observer(PassRecord(0, 0, len(prompt) - handle.reused, cpu_clock() - cpu))
        except Exception as e:
            log.exception("a request failed while %s", stage)
            self._fail(handle, failed(stage, e))
            return
        self._remember(row, prompt)
        handle.state.stats.time_prefill_s = time.perf_counter() - t

    def _remember(self, row: int, prompt: list[int]) -> None:
        """Store a computed prompt's blocks for later prompts; a failure costs only that reuse, never the
        request (its row holds its prompt whether or not the store took a copy)."""
        try:
            self.runner.remember(row, prompt)
        except Exception:
            log.exception("storing a prompt's prefix failed; the request goes on without storing it")

    def _propose(self) -> list[tuple[Handle, Plan]]:
        """Every decoding row's plan; rows that end here (cancelled, out of context) leave."""
        decoding = [h for h in self._rows if not h.joining or h.cancel.is_set()]
        step = StepCost(self.cost, max(1, len(decoding)))  # the rows this pass will hold
        plans: list[tuple[Handle, Plan]] = []
        for h in decoding:
            try:
                plan = h.state.plan(step)
            except Exception as e:
                log.exception("proposing failed")
                self._fail(h, failed("drafting", e))
                continue
            if plan is None:  # cancelled, or out of context
                self._finish(h)
                continue
            plans.append((h, plan))
        plans.sort(key=lambda hp: self._rows.index(hp[0]))  # cache-row order (a row that left moved the last one)
        return plans

    def _pass_and_commit(self, plans: list[tuple[Handle, Plan]]) -> None:
        runner = self.runner
        rows = [PassRow(self._rows.index(h), [h.state.last, *p.draft.tokens], list(p.draft.parents),
                        h.state.past) for h, p in plans]
        decoding = len(rows)
        joining = [h for h in self._rows if h.joining]
        for h in joining:  # their prompts, past a reused prefix, ride in this pass
            prompt = h.state.request.prompt_ids[:-1]
            rows.append(PassRow(self._rows.index(h), prompt[h.reused:], None, h.reused, "none"))
        if not rows:
            return
        threads = self.threads.before_pass() if self.threads is not None else None
        t_pass, cpu = time.perf_counter(), cpu_clock()
        logits, whole = self._forward(rows)
        cpu, elapsed = cpu_clock() - cpu, time.perf_counter() - t_pass
        inputs = sum(len(r.ids) for r in rows[:decoding])
        # a pass with a prompt in it says little about the cost of drafts; one run row by row, nothing
        measured = whole and not joining and decoding
        if measured:
            self._cost_at(threads).observe(inputs, cpu)
        if self.threads is not None:
            self.threads.after_pass(threads, elapsed, self._shape(inputs) if measured else None)
            self._follow_threads()
        if self.observer is not None:
            self.observer(PassRecord(decoding, inputs, sum(len(r.ids) for r in rows[decoding:]), cpu))
        # rows leave after every row has committed: a row that leaves moves the last one into its place
        done: list[tuple[Handle, BaseException | None]] = []
        for h, row_logits in zip(joining, logits[decoding:], strict=True):
            if isinstance(row_logits, BaseException):
                done.append((h, failed("prefilling its prompt", row_logits)))
                continue
            row = self._rows.index(h)
            prompt = h.state.request.prompt_ids[:-1]
            runner.set_length(row, len(prompt))
            self._remember(row, prompt)
            h.joining = False
            h.state.stats.time_prefill_s = elapsed
        for (h, plan), row, row_logits in zip(plans, rows, logits, strict=False):
            if isinstance(row_logits, BaseException):
                done.append((h, failed("the target's pass", row_logits)))
                continue
            state = h.state
            try:
                t_row = time.perf_counter()
                outcome = verify_tree(plan.draft, row_logits, state.processor, state.rng, position=len(state.output))
                t_verified = time.perf_counter()
                runner.keep(row.row, row.past, [0] + [k + 1 for k in outcome.accepted])
                ev = state.commit(plan, outcome, elapsed + t_verified - t_row, t_verified)
            except Exception as e:
                log.exception("committing a step failed")
                done.append((h, failed("committing its tokens", e)))
                continue
            h.events.put(ev)
            if state.finish is not None:
                done.append((h, None))
        for h, err in done:
            if err is None:
                self._finish(h)
            else:
                self._fail(h, err)

    def _forward(self, rows: list[PassRow]) -> tuple[list[torch.Tensor | None | BaseException], bool]:
        """(per row: its logits, or the error its pass raised; whether the rows' one pass succeeded).

        A failed pass of several rows on the lean forward runs each row alone (a row's logits are the
        same alone or in a batch: ``Runner.batch_problem`` checked it, and a rerun writes the same cache
        positions past every row's length), so only a row that fails alone fails (a joiner's prompt that
        runs out of memory, a draft the model cannot take); the padded forward takes every row at once,
        so there a failed pass fails them all (``step``)."""
        try:
            return self.runner.forward(rows), True
        except Exception as e:
            if len(rows) == 1:
                log.exception("a pass failed")
                return [e], False
            if not self.runner.packs_prompts:
                raise
            log.exception("a pass of %d rows failed; running each row alone to find the one that fails", len(rows))
        out: list[torch.Tensor | None | BaseException] = []
        for r in rows:
            try:
                out.append(self.runner.forward([r])[0])
            except Exception as e:
                log.exception("a row failed alone")
                out.append(e)
        return out, False

    # -- the thread count's cost curves ----------------------------------------------------------------
    def _cost_at(self, threads: int | None) -> Any:
        """The cost curve of passes at ``threads`` (``cost`` for the chosen count)."""
        if threads == self._cost_threads:
            return self.cost
        return self._costs.setdefault(threads, PassCost(self.policy))

    def _shape(self, inputs: int) -> float:
        """A pass of ``inputs`` inputs in plain passes, from the chosen count's curve (1.0 before one is
        measured): what the thread tuner divides a pass's wall time by, so passes of any size compare."""
        lo, hi = self.cost.estimate(1), self.cost.estimate(inputs)
        return hi / lo if lo and hi else 1.0

    def _follow_threads(self) -> None:
        """After the tuner changed the chosen count, the gates read that count's curve."""
        now = self.threads.current if self.threads is not None else None
        if now != self._cost_threads:
            self._costs[self._cost_threads] = self.cost
            self.cost = self._costs.pop(now, None) or PassCost(self.policy)
            self._cost_threads = now

    # -- rows come and go ------------------------------------------------------------------------------
    def _proposer_set(self) -> list[Proposer]:
        proposers = self.proposers()
        current = tuple(id(p) for p in proposers)
        if current != self._pool_of:  # the engine's proposers were replaced: fork the new ones
            self._pool, self._pool_of, self._forked = [], current, 0
        if self._pool:
            return self._pool.pop()
        self._forked += 1
        if self._forked == 1:
            return list(proposers)
        return [p.fork() for p in proposers]

    def _remove(self, handle: Handle) -> None:
        row = self._rows.index(handle)
        self.runner.remove_row(row)
        last = self._rows.pop()
        if last is not handle:
            self._rows[row] = last
        self._release(handle)

    def _release(self, handle: Handle) -> None:
        if handle.proposers is not None and tuple(id(p) for p in self.proposers()) == self._pool_of:
            self._pool.append(handle.proposers)
        handle.proposers = None

    def _finish(self, handle: Handle) -> None:
        try:
            ev: StreamEvent | BaseException = handle.state.close()
        except Exception as e:
            log.exception("ending a request failed")
            ev = failed("ending", e)
        self._remove(handle)
        handle.events.put(ev)
        self._trim_when_empty()

    def _fail(self, handle: Handle, err: BaseException) -> None:
        try:
            if handle.state is not None:
                handle.state.end_proposers()
        except Exception:
            log.exception("ending the proposers of a failed request failed")
        if handle in self._rows:
            self._remove(handle)
        else:
            self._release(handle)
        handle.events.put(err)
        self._trim_when_empty()

    def _trim_when_empty(self) -> None:
        """With no request left in or waiting for the batch, give back the heap its passes freed (after the
        leaving request's last event: it does not wait for this)."""
        if not self._rows and not self._waiting:
            trim_heap()


def failed(stage: str, err: BaseException) -> BaseException:
    """What a request that failed at ``stage`` ends with: a ``RequestFailed`` naming the stage, or its own
    ``RequestError`` (its arguments refused: the caller's to fix, a 400 at the server) as it is."""
    return err if isinstance(err, RequestError) else RequestFailed(stage, err)
