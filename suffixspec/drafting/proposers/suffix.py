"""The model-free suffix proposer: drafts from the request itself, earlier outputs and the document corpus.

Sources (docs/design.md, "Suffix index"), each a suffix index with its own lifetime:

=============  =======================================  ==========================================
node source    what it indexes                          lifetime
=============  =======================================  ==========================================
prompt         this request's prompt + output so far    built in ``begin``, grows in ``update``
references     this request's references (RAG chunks)   the request
prediction     this request's code-edit prediction      the request
history        earlier requests' outputs                token budget, oldest evicted, persisted
documents      the corpus added with ``index add``      persistent (SQLite + memory-mapped arrays)
=============  =======================================  ==========================================

Every allowed source speculates from the longest suffix of the context it contains (path or tree,
SuffixDecoding's rules, see :mod:`index.speculate`); the request, reference and history indexes
also try a few shorter match lengths and keep the best-scoring draft (``match_lengths``); when the
output copies the request's own text and departs from it (an edit), :class:`~.copy_tracker.CopyTracker` adds
drafts that resume the copy and re-applies the edits it learned (``resume``). The drafts are then either *merged* (default): one tree keyed by token paths, each node keeping its
best probability and the source that gave it, cut to the budget best-first (:func:`~.suffix_drafts.merge_tree`); or
*picked*: the single draft with the highest score (expected accepted tokens).

A node's probability is its count ratio times the continuation rates of its source (see
:mod:`index.speculate`), which the proposer learns from what the output did with its drafts
(:meth:`SuffixProposer._learn`; per source, and for text-match and copy-resume drafts apart): drafts
shrink where they have not been coming true and run on where they have, and ``min_token_prob`` cuts
the unlikely tail, so a draft holds fewer, likelier tokens.

The documents draft by ranked retrieval (:mod:`index.retrieval`: a minimum match length that grows with
the corpus, a match's few occurrences smoothed), and only while they pay: each step the draft with them
is compared with the draft without them, and a corpus that has not been adding accepted tokens worth
its nodes and lookup time is left out, looked up in the shadow now and then (:mod:`.source_gate`).

Worked example (``max_spec_factor=1``, count ratios alone: ``learn_rates=False``): context ``... 7 8``; the prompt holds ``7 8 9 10`` once
(node probs 1, 1) and the documents hold ``7 8 9 11`` twice and ``7 8 5`` once (a match of 3 occurrences,
smoothed: 2 / (3 + 1) = 0.5 for 9 and 11 after it, 0.25 for 5). Merged with budget 3: ``9`` (1.0, prompt),
``10`` (1.0, prompt), ``11`` (0.5, documents), with parents ``[-1, 0, 0]`` and score 2.5.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from suffixspec.drafting.draft import (
    SOURCE_DOCUMENTS,
    SOURCE_HISTORY,
    SOURCE_PREDICTION,
    SOURCE_PROMPT,
    SOURCE_REFERENCES,
    Draft,
    drafter_allows,
)
from suffixspec.drafting.proposers.base import Proposer, RequestContext
from suffixspec.drafting.proposers.copy_tracker import (
    RESUME,
    RESUME_MATCH,
    RESUME_PRIOR,
    CopyTracker,
    token_text,
)
from suffixspec.drafting.proposers.source_gate import SourceGate, SourceYield
from suffixspec.drafting.proposers.suffix_drafts import (
    chain_probs,
    confirmed_run,
    extend_periodic,
    merge_tree,
    node_match_lengths,
)
from suffixspec.drafting.registry import Drafter
from suffixspec.index.fingerprint import tokenizer_fingerprint
from suffixspec.index.history import OutputHistory
from suffixspec.index.incremental import IncrementalIndex
from suffixspec.index.retrieval import DocumentRetrieval, RetrievalParams
from suffixspec.index.speculate import AcceptanceRates, SpecParams, SpecResult
from suffixspec.index.store import IndexStore
from suffixspec.index.suffix_array import SuffixArray

if TYPE_CHECKING:
    from suffixspec.drafting.costs import StepCost

PROPOSER_NAME = "suffix"


@dataclass
class SuffixConfig:
    """Settings of the suffix proposer."""

    max_depth: int = 64  # longest context suffix matched
    max_spec_factor: float = 4.0  # draft length <= match_len * factor + offset (SuffixDecoding; 4: see README)
    max_spec_offset: float = 0.0  # see max_spec_factor
    min_token_prob: float = 0.1  # drop draft nodes whose path probability is below this
    tree: bool = True  # tree speculation (best-first); False = the single most likely path
    merge: bool = True  # merge all sources' drafts into one tree; False = pick the best-scoring draft
    history_tokens: int = 1_000_000  # output-history budget in tokens (oldest outputs evicted)
    # Occurrences examined per lookup in the incremental indexes, newest first. 128 cost 2-3x as much
    # per step on looping output as 32 for the same forward passes (suffixspec/bench/bench_drafting.py replays).
    max_candidates: int = 32
    # Shorter match lengths tried after the longest in the request, reference and history indexes
    # (index.speculate.speculate_lengths); the best-scoring draft wins. The longest match of a
    # looping or copying output often runs into the live end; a shorter one reaches further back.
    # 0 = the longest match only. Measured (suffixspec/bench/bench_drafting.py, periodic off): 102 -> 48
    # forward passes on code_edit, 73 -> 44 on agentic.
    match_lengths: int = 2
    # The request's own references and prediction are text the output is expected to repeat, so
    # their drafts may run longer than the match that found them (match_len * factor + offset).
    reference_spec_factor: float = 4.0
    reference_spec_offset: float = 8.0
    # Copy regime: when the output confirmed the last draft to its end, the next draft may be
    # ``copy_growth`` times as long as the confirmed run whatever its match length (doubling, as a
    # slow start does); the first miss ends the regime and the match-length cap applies again.
    copy_growth: float = 2.0
    # A draft from the request's own text that ran into the live end of the context (the output
    # repeats itself with period = the draft's length) continues periodically up to its cap.
    periodic: bool = True
    # Copy resume: while the output copies the request's own text, the proposer follows the copied
    # position; when the output departs from it (an edit: "local" written as "local_v2"), it drafts
    # where the copy may pick up again (the source right after the departure, or after the next
    # occurrence of the last written token within ``resume_window`` tokens of it), as extra
    # branches. The longest match after such an edit usually finds the edit instruction or nothing.
    resume: bool = True
    resume_window: int = 16
    # The first draft of an output also comes from how the newest earlier outputs began (their
    # shared start at its count's probability): no suffix of the prompt matches an answer's first
    # tokens in the history, which holds outputs only. Written agentic answers (bench_drafting):
    # 27 -> 25 forward passes (Arctic: 29).
    answer_starts: bool = True
    # When no token suffix of the context matches the request's own texts (4+ tokens), match the
    # last 8 tokens as text and draft the text after them re-tokenized: where the prompt ends in the
    # middle of text the output goes on copying, the two are tokenized differently at the seam (needs
    # the target tokenizer). RAG written answers (bench_drafting): 35 -> 27 forward passes (the oracle).
    text_match: bool = True
    # Learn each source's continuation rates (index.speculate.AcceptanceRates) from what the output
    # did with the drafts: a node's probability becomes its count ratio times the rates along its
    # path, and min_token_prob cuts the unlikely tail. False: count ratios alone (SuffixDecoding's
    # estimate, where every single-occurrence path is "certain").
    learn_rates: bool = True
    # How the documents draft (index.retrieval): the shortest match drafted from (by default from the
    # corpus size) and the smoothing of a match's few occurrences.
    retrieval: RetrievalParams = field(default_factory=RetrievalParams)
    # Measure what the documents add to each step against the draft without them (source_gate) and leave
    # them out, looked up in the shadow now and then, while they have not been paying (this request, and
    # this corpus across requests). False: they draft whenever they match.
    gate_documents: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.max_depth <= 256:
            raise ValueError(f"max_depth must be between 1 and 256, got {self.max_depth}")
        if self.copy_growth < 0:
            raise ValueError(f"copy_growth must be >= 0 (0 = off), got {self.copy_growth}")
        if self.history_tokens < 1:
            raise ValueError(f"history_tokens must be >= 1, got {self.history_tokens}")
        if self.match_lengths < 0:
            raise ValueError(f"match_lengths must be >= 0 (0 = the longest match only), got {self.match_lengths}")
        SpecParams(0, self.max_spec_factor, self.max_spec_offset, self.min_token_prob)  # validates
        if isinstance(self.retrieval, dict):  # from JSON (SUFFIXSPEC_VLLM_CONFIG): {"min_match": 4, ...}
            self.retrieval = RetrievalParams(**self.retrieval)


class SuffixProposer(Proposer):
    """Suffix-index drafter over the request, the output history and the document corpus.

    ``db``: an :class:`~suffixspec.index.store.IndexStore`, a database path, or None (no documents, history kept in
    memory only). The tokenizer fingerprint selects the token ids of the corpus and history: pass the
    target ``tokenizer`` (also lets documents added under another tokenizer be tokenized) or its
    ``fingerprint``.
    """

    name = PROPOSER_NAME

    def __init__(self, db: IndexStore | str | os.PathLike | None = None, fingerprint: str | None = None,
                 tokenizer: Any = None, config: SuffixConfig | None = None,
                 documents: SuffixArray | None = None, history: bool | OutputHistory = True) -> None:
        self.config = config or SuffixConfig()
        self.tokenizer = tokenizer
        # text matching needs a real tokenizer (some callers pass only enough of one for the fingerprint)
        self._can_decode = all(callable(getattr(tokenizer, f, None)) for f in ("encode", "convert_ids_to_tokens"))
        if isinstance(db, IndexStore) or db is None:
            self.store = db
        else:
            self.store = IndexStore(db)
        # through the store's cache when there is a store: loading the documents asks it again (45 ms for
        # SmolLM2's vocabulary, paid twice at every start before)
        fp_of = self.store.fingerprint if self.store is not None else tokenizer_fingerprint
        self.fingerprint = fingerprint or (fp_of(tokenizer) if tokenizer is not None else None)
        if self.store is not None and not self.fingerprint:
            raise ValueError("SuffixProposer with a database needs the target tokenizer (tokenizer=...) "
                             "or its fingerprint (fingerprint=index.fingerprint.tokenizer_fingerprint(tok))")
        self.documents = documents
        self._origin: SuffixProposer | None = None  # set on forks: the proposer whose documents they share
        self._docs_version = -1
        self._doc_retrieval: DocumentRetrieval | None = None  # ranked retrieval over ``documents``
        self.documents_yield = SourceYield()  # what the documents have been worth per step, across requests (forks share it)
        self._doc_gate = SourceGate(self.documents_yield)  # this request's judgement (made again in begin)
        self._doc_lookup_s = 0.0  # CPU seconds of this step's document lookup
        # the last step's draft with and without the documents, and whether they were left out (a shadow)
        self._doc_trial: tuple[Draft, Draft, bool] | None = None
        self._plain_s: float | None = None  # what the engine says a plain step costs (observe_costs)
        self._node_s: float | None = None  # and one more verified node
        self._step: StepCost | None = None  # the pass cost the engine told for the next propose
        if self.store is not None and documents is None:
            self.reload_documents()
        if isinstance(history, OutputHistory):  # shared with other proposers (a runtime's, across requests)
            self.history: OutputHistory | None = history
        else:
            self.history = (OutputHistory(self.config.history_tokens, self.store, self.fingerprint,
                                          max_candidates=self.config.max_candidates) if history else None)
        self._request: IncrementalIndex | None = None
        self._references: IncrementalIndex | None = None
        self._prediction: IncrementalIndex | None = None
        self._ctx_len = 0
        self._prompt_len = -1  # the request's prompt length (the output starts there)
        self._text_ids: list[tuple[str, Sequence[int]]] = []  # (source, token ids) of the request's own texts
        self._decoded: list[tuple[str, bytes]] | None = None  # the same as bytes, on first use (_texts)
        # the target tokenizer's per-token bytes (tokenizer_bridge.VocabTable), built here, once per
        # tokenizer: built on the first text match instead, its 0.3 s (49k tokens; seconds for 262k) were
        # charged to one request's propose time (the "prompt drafter alone 1.3-6 ms per propose" of issue 30)
        self._vocab: Any = None
        if self.config.text_match and self._can_decode:
            from suffixspec.tokenizer_bridge.bridge import vocab_table

            self._vocab = vocab_table(tokenizer)
        self._allowed: tuple[str, ...] | None = None
        self._doc_hint: int | None = None
        self._last: Draft | None = None  # the draft of the last step, to see how much of it came true
        self._last_probs: list[float] = []  # its nodes' probabilities
        self._last_match_lengths: list[int] = []  # its nodes' match lengths (what predicted them: AcceptanceRates)
        # per source, learned across this proposer's requests (forks share them)
        self.rates = ({**{src: AcceptanceRates() for src in DRAFTER.sources}, _TEXT: AcceptanceRates(),
                       RESUME: AcceptanceRates(RESUME_PRIOR)} if self.config.learn_rates else {})
        self._last_keys: list[str] = []  # its nodes' keys into ``rates``
        self._copy_run = 0  # tokens of the last draft the output confirmed to its end (0: no copy regime)
        self._copy_source: str | None = None  # the source of that confirmed path: it leads the next merge
        self._copy = self._copy_tracker()  # where the output copies the request's text

    # ----- corpus ------------------------------------------------------------------------------------
    def reload_documents(self) -> None:
        """Pick up documents added or removed since the last load (cheap when nothing changed)."""
        if self._origin is not None:  # a fork reads its origin's index (loaded once per process)
            self._origin.reload_documents()
            self.documents = self._origin.documents
            return
        if self.store is None:
            return
        version = self.store.docs_version()
        if version != self._docs_version:
            self.documents = self.store.document_index(self.tokenizer if self.tokenizer is not None
                                                       else self.fingerprint)
            if self._docs_version != -1:  # a corpus that changed: its record across requests starts again
                self.documents_yield.forget()
            self._docs_version = version

    def live_sources(self) -> tuple[str, ...]:
        """The request's own texts always; the history when it is kept, the documents with a store or arrays."""
        have = {SOURCE_PROMPT, SOURCE_REFERENCES, SOURCE_PREDICTION}
        if self.history is not None:
            have.add(SOURCE_HISTORY)
        if self.store is not None or self.documents is not None:
            have.add(SOURCE_DOCUMENTS)
        return tuple(s for s in DRAFTER.sources if s in have)

    def documents_pending(self) -> bool:
        """Whether documents were added or removed since the last load (they load at the next request)."""
        origin = self._origin or self
        return origin.store is not None and origin.store.docs_version() != origin._docs_version

    def fork(self) -> SuffixProposer:
        """A twin for a concurrent request: the same history and document index, its own request index."""
        twin = copy.copy(self)
        twin._origin = self._origin or self
        return twin

    # ----- lifecycle ---------------------------------------------------------------------------------
    def begin(self, request: RequestContext) -> None:
        self.reload_documents()
        self._allowed = request.drafters
        self._request = IncrementalIndex(self.config.max_candidates)
        self._request.extend(request.prompt_ids)
        self._ctx_len = len(request.prompt_ids)
        self._prompt_len = len(request.prompt_ids)
        self._text_ids = [(SOURCE_REFERENCES, ids) for ids in request.reference_ids]
        self._text_ids += [(SOURCE_PREDICTION, request.prediction_ids or []), (SOURCE_PROMPT, request.prompt_ids)]
        self._decoded = None
        self._references = None
        if request.reference_ids:
            self._references = IncrementalIndex.from_sequences(request.reference_ids, self.config.max_candidates)
        self._prediction = None
        if request.prediction_ids:
            self._prediction = IncrementalIndex.from_sequences([request.prediction_ids], self.config.max_candidates)
        self._doc_hint = None
        self._doc_gate = SourceGate(self.documents_yield)
        self._doc_trial = None
        self._last, self._copy_run, self._copy_source = None, 0, None
        self._copy = self._copy_tracker()

    def update(self, new_tokens: Sequence[int]) -> None:
        if self._request is None:
            return
        if self.config.resume:
            self._copy.update(self._request, self._ctx_len, list(new_tokens), self.config.max_depth)
        self._request.extend(list(new_tokens))
        self._ctx_len += len(new_tokens)
        if self._last is not None and self.rates:
            self._learn(self._last, new_tokens)
        if self._doc_trial is not None:
            with_docs, without, shadow = self._doc_trial
            self._doc_gate.observe(with_docs.follow(new_tokens)[1] - without.follow(new_tokens)[1],
                                   len(with_docs) - len(without), self._doc_lookup_s, self._plain_s, self._node_s,
                                   shadow)
            self._doc_trial = None
        self._copy_run, self._copy_source = confirmed_run(self._last, new_tokens) if self._last else (0, None)
        self._last = None
        if self._doc_hint is not None:
            self._doc_hint += len(new_tokens)

    def end(self, output_ids: Sequence[int]) -> None:
        if self.history is not None and len(output_ids):
            self.history.add(list(output_ids))
        self._request = self._references = self._prediction = None

    def flush(self) -> None:
        """Write outputs still waiting for the store (it was locked by a long ``index add``)."""
        if self.history is not None:
            self.history.flush()

    def _copy_tracker(self) -> CopyTracker:
        """A new request's copy tracker (edits learned as words where the tokens' texts are known)."""
        return CopyTracker(self.config.resume_window, self._vocab.token_bytes if self._vocab is not None else None)

    def _allows(self, source: str) -> bool:
        return drafter_allows(self._allowed, source)  # the prediction drafts whenever given

    def observe_costs(self, step: StepCost | None) -> None:
        self._step = step

    # ----- drafting ----------------------------------------------------------------------------------
    def propose(self, context: Sequence[int], budget: int) -> Draft:
        if budget <= 0 or not context:
            return Draft()
        cfg = self.config
        step, self._step = self._step, None  # told for this step only
        self._plain_s = step.plain() if step is not None else None
        self._node_s = step.per_node(budget) if step is not None else None  # one more node, at this budget
        if self._request is None or self._ctx_len != len(context):  # not begun, or out of step: resync
            self._request = IncrementalIndex(cfg.max_candidates)
            self._request.extend(list(context))
            self._ctx_len = len(context)
        offset = max(cfg.max_spec_offset, cfg.copy_growth * self._copy_run)
        params = SpecParams(budget, cfg.max_spec_factor, offset, cfg.min_token_prob, cfg.tree)
        gated = cfg.gate_documents and self.documents is not None and self._allows(SOURCE_DOCUMENTS)
        results = self.speculate_all(context, params, documents=not gated or self._doc_gate.look_up())
        if self.config.resume and self._allows(SOURCE_PROMPT):
            resumed = self._copy.drafts(self._request, context, budget)
            source_params = self._with_rates(params, RESUME)
            for r in resumed:  # its own rates: how often a resumed copy came true (the first token) and went on
                chain_probs(r, source_params, source_params.rate(RESUME_MATCH) * r.probs[0] / 0.3)
            results += [(SOURCE_PROMPT, r) for r in resumed if len(r)]
            for source, res in results:
                if source == SOURCE_PROMPT:
                    self._copy.apply(res, context)
        self._doc_trial = None
        if gated and any(src == SOURCE_DOCUMENTS for src, _ in results):
            # the draft with the documents and without them: the gate measures the difference
            with_docs = self._combine(results, budget)
            without = self._combine([r for r in results if r[0] != SOURCE_DOCUMENTS], budget)
            shadow = not self._doc_gate.on
            self._doc_trial = (with_docs[0], without[0], shadow)
            chosen = without if shadow else with_docs
        elif gated and self._doc_lookup_s:  # looked up, nothing found: the lookup's time is its cost
            chosen = self._combine(results, budget)
            self._doc_trial = (chosen[0], chosen[0], not self._doc_gate.on)
        else:
            chosen = self._combine(results, budget)
        draft, self._last_probs, self._last_match_lengths, self._last_keys = chosen
        draft.probs = list(self._last_probs)  # what a merge with other proposers' drafts ranks its nodes by
        self._last = draft if len(draft) else None
        return draft

    @property
    def last_probs(self) -> list[float]:
        """The path probability of each node of the last draft (what its score sums), in node order."""
        return self._last_probs

    def _combine(self, results: list[tuple[str, SpecResult]], budget: int
                 ) -> tuple[Draft, list[float], list[int], list[str]]:
        """The draft of the sources' results: merged into one tree (``merge``) or the best-scoring one; with
        per node its probability, match length and rates key (see :func:`merge_tree`)."""
        if not results:
            return Draft(), [], [], []
        if self.config.merge and len(results) > 1:
            return merge_tree(results, budget, prefer=self._copy_source)
        source, best = max(results, key=lambda r: r[1].score)
        draft = Draft(best.token_ids, best.parents, [source] * len(best), score=best.score)
        return draft, best.probs, node_match_lengths(best), [best.kind or source] * len(best)

    def _learn(self, draft: Draft, new_tokens: Sequence[int]) -> None:
        """Feed each source's continuation rates with what the output did at each level of the last
        draft it can judge: the levels the new tokens reach (the accepted path and the node after
        it; one level when the engine did not verify the draft). Per level, the drafted children of
        the node reached so far are one trial (their count ratios summed), a hit if the output took
        one of them. Example: draft ``5 -> 6 -> 7`` and new tokens ``5 6 9``: hits at the levels of
        5 and 6, a miss at 7's."""
        probs, matched_lengths, tokens, keys = self._last_probs, self._last_match_lengths, draft.tokens, self._last_keys
        kids: dict[int, list[int]] = {}
        for i, par in enumerate(draft.parents):
            kids.setdefault(par, []).append(i)
        cur, cur_prob = -1, 1.0
        for tok in new_tokens:
            level = kids.get(cur)
            if not level:
                return
            hit = next((k for k in level if tokens[k] == tok), None)
            ref = hit if hit is not None else max(level, key=probs.__getitem__)
            rates = self.rates.get(keys[ref])
            if rates is None:
                return
            rate = rates.table()[min(matched_lengths[ref], len(rates.table()) - 1)]
            drafted = sum(probs[k] for k in level if keys[k] == keys[ref])
            rates.observe(matched_lengths[ref], hit is not None, drafted / (cur_prob * rate) if rate > 0 else 1.0)
            if hit is None:
                return
            cur, cur_prob = hit, probs[hit]

    def speculate_all(self, context: Sequence[int], params: SpecParams, documents: bool = True
                      ) -> list[tuple[str, SpecResult]]:
        """Non-empty drafts of every allowed source, as ``(source, SpecResult)`` (``documents``: look the
        corpus up too; its lookup's CPU time is kept for the gate)."""
        depth = self.config.max_depth
        out: list[tuple[str, SpecResult]] = []
        candidates: list[tuple[str, Any]] = [(SOURCE_PROMPT, self._request), (SOURCE_REFERENCES, self._references),
                                             (SOURCE_PREDICTION, self._prediction)]
        if self.history is not None and self.history.num_tokens:
            candidates.append((SOURCE_HISTORY, self.history.index))
        ref_params = replace(params, max_spec_factor=max(params.max_spec_factor, self.config.reference_spec_factor),
                             max_spec_offset=max(params.max_spec_offset, self.config.reference_spec_offset))
        for source, idx in candidates:
            if idx is not None and self._allows(source):
                source_params = self._with_rates(ref_params if source in (SOURCE_REFERENCES, SOURCE_PREDICTION) else params,
                                       source)
                res = idx.speculate(context, source_params, depth, lengths=self.config.match_lengths)
                if source == SOURCE_PROMPT and self.config.periodic:
                    extend_periodic(context, res, source_params.limit(res.match_len), source_params)
                if len(res):
                    out.append((source, res))
        if self.config.text_match and self._can_decode and max(
                (r.match_len for s, r in out if s != SOURCE_HISTORY), default=0) < _TEXT_MATCH_BELOW:
            found = self._text_draft(context, params, ref_params)
            if found is not None:  # a longer match than any token-level one: the short ones only crowd it
                out = [(s, r) for s, r in out if s == SOURCE_HISTORY] + [found]
        if (self.history is not None and self.history.num_tokens and self._allows(SOURCE_HISTORY)
                and len(context) == self._prompt_len and self.config.answer_starts):
            res = self.history.speculate_start(self._with_rates(params, SOURCE_HISTORY))  # how earlier answers began
            if len(res):
                out.append((SOURCE_HISTORY, res))
        self._doc_lookup_s = 0.0
        if documents and self.documents is not None and self._allows(SOURCE_DOCUMENTS):
            t = time.thread_time()
            res = self._retrieval().speculate(context, self._with_rates(params, SOURCE_DOCUMENTS), depth,
                                              hint=self._doc_hint)
            self._doc_lookup_s = time.thread_time() - t
            self._doc_hint = res.match_len or None
            if len(res):
                out.append((SOURCE_DOCUMENTS, res))
        elif not documents:
            self._doc_hint = None  # a step without a lookup: the last match length says nothing of the next
        return out

    def _retrieval(self) -> DocumentRetrieval:
        """Ranked retrieval over the current document index (made again when the index is reloaded)."""
        r = self._doc_retrieval
        if r is None or r.index is not self.documents:
            r = self._doc_retrieval = DocumentRetrieval(self.documents, self.config.retrieval)
        return r

    def _with_rates(self, params: SpecParams, source: str) -> SpecParams:
        """``params`` with ``source``'s learned continuation rates (unchanged when not learning)."""
        rates = self.rates.get(source)
        if rates is None:
            return params
        # a shallow copy by hand: dataclasses.replace and copy.copy took a third of a propose call (three sources)
        source_params = SpecParams.__new__(SpecParams)
        source_params.__dict__.update(params.__dict__)
        source_params.rates = rates.table()  # valid by construction (AcceptanceRates), no check needed
        return source_params

    def _texts(self) -> list[tuple[str, bytes]]:
        """The request's own texts as bytes (each token's bytes joined; a special token is ``\\xff``, a
        byte no UTF-8 text holds), built once per request when first needed: ``(source, bytes)``,
        references and prediction before the prompt."""
        if self._decoded is None:
            self._decoded = [(src, self._bytes(ids)) for src, ids in self._text_ids if len(ids) and self._allows(src)]
        return self._decoded

    def _bytes(self, ids: Sequence[int]) -> bytes:
        return token_text(self._vocab.token_bytes, ids)

    def _text_draft(self, context: Sequence[int], params: SpecParams, ref_params: SpecParams
                    ) -> tuple[str, SpecResult] | None:
        """Continue the context's last tokens matched as *text* in the request's own texts.

        Where the output starts to copy text that the prompt ends in the middle of, the two are
        tokenized differently around the seam, and no token suffix matches: a RAG prompt ending with
        ``"... On\\n"`` before the chunk's next line, which the chunk holds as ``" On"``,
        ``"\\n       "`` (newline and indent in one token), so the output's first token ``"       "``
        occurs nowhere. The bytes of the last ``_TEXT_TAIL`` tokens are found in the texts (the newest
        occurrence, not the live end itself), and the text after them is encoded with the target's
        tokenizer: ``["       ", " Windows", ",", ...]``. Its last token is dropped, since the text
        was cut there. Example: context ``[..., " unchanged", ".", " On", "\\n"]``, chunk ``"...
        unchanged. On\\n        Windows, use"`` -> draft ``["       ", " Windows", ","]`` (the last
        token ``" use"`` dropped), probability 1 each.
        """
        from suffixspec.tokenizer_bridge.vocab import utf8_complete_prefix

        texts = self._texts()
        tail = self._bytes(context[-_TEXT_TAIL:])
        if len(tail.strip()) < _TEXT_MIN_CHARS:
            return None
        output_empty = len(context) == self._prompt_len
        for source, text in texts:
            # before any output the prompt's text ends with the tail itself: that is no occurrence
            stop = len(text) - 1 if source == SOURCE_PROMPT and output_empty else len(text)
            pos = text.rfind(tail, 0, stop)
            if pos < 0:
                continue
            source_params = ref_params if source in (SOURCE_REFERENCES, SOURCE_PREDICTION) else params
            limit = source_params.limit(_TEXT_TAIL)
            start = pos + len(tail)
            cont = text[start:start + 8 * limit]  # tokens here average 3-4 bytes
            cut = start + len(cont) < len(text)
            if b"\xff" in cont:  # a special token ends the text to copy
                cont, cut = cont[:cont.index(b"\xff")], False
            cont = cont[:utf8_complete_prefix(cont)]
            ids = self._vocab.encode_exact(cont) or self._vocab.encode_text(cont.decode("utf-8", "replace"))
            if cut:
                ids = ids[:-1]
            ids = ids[:limit]
            if ids:
                res = SpecResult(ids, list(range(-1, len(ids) - 1)), [1.0] * len(ids), float(len(ids)), _TEXT_TAIL,
                                 _TEXT)
                source_params = self._with_rates(source_params, _TEXT)
                chain_probs(res, source_params, source_params.rate(_TEXT_TAIL))
                return (source, res) if len(res) else None
        return None


# Kind of a text match's drafts (SpecResult.kind): it learns continuation rates of its own.
_TEXT = "text"
# Text matching (SuffixProposer._text_draft): tried when no token-level match of the request's own
# sources is this long; matches the last _TEXT_TAIL tokens, when they hold this many non-space bytes.
_TEXT_MATCH_BELOW = 4
_TEXT_TAIL = 8
_TEXT_MIN_CHARS = 12


def single_chain_config(**overrides: Any) -> SuffixConfig:
    """The settings for a runtime that verifies one chain (llama.cpp, vLLM): every source drafts its most
    likely path and the best-scoring path wins (``overrides``: other SuffixConfig fields)."""
    return SuffixConfig(**{"tree": False, "merge": False, **overrides})


def make_suffix_proposer(db: IndexStore | str | os.PathLike | None = None, tokenizer: Any = None,
                         fingerprint: str | None = None, store: IndexStore | None = None,
                         history: bool | OutputHistory = True, config: SuffixConfig | None = None,
                         documents: SuffixArray | None = None, **settings: Any) -> SuffixProposer:
    """Factory hook (``make_proposer("suffix", ...)``): ``store`` is the registry's name for ``db``; a
    whole ``config``, or keyword settings of :class:`SuffixConfig`."""
    if config is not None and settings:
        raise ValueError(f"give config= or SuffixConfig settings, not both ({sorted(settings)})")
    return SuffixProposer(db=db if db is not None else store, fingerprint=fingerprint, tokenizer=tokenizer,
                          config=config or SuffixConfig(**settings), documents=documents, history=history)


# This drafter (suffixspec.drafting.registry): each of its sources learns its own continuation rates
DRAFTER = Drafter(
    name="suffix",
    sources=("prompt", "history", "documents", "references", "prediction"),
    uses=("tokenizer", "store", "history"),
    order=0,  # first: its microsecond drafts tell a draft model what is already covered (observe_lead)
    build=make_suffix_proposer,
)
