"""SuffixProposer: sources, drafter switches, merge vs pick, learning, persistence, and engine equality."""

from __future__ import annotations

from dataclasses import replace

import pytest

from suffixspec.drafting.costs import StepCost
from suffixspec.drafting.draft import (
    SOURCE_DOCUMENTS,
    SOURCE_HISTORY,
    SOURCE_PREDICTION,
    SOURCE_PROMPT,
    SOURCE_REFERENCES,
)
from suffixspec.drafting.proposers import RequestContext
from suffixspec.drafting.proposers.suffix import SuffixConfig, SuffixProposer, make_suffix_proposer
from suffixspec.drafting.proposers.suffix_drafts import merge_by_probability
from suffixspec.index.store import DocInput, IndexStore
from suffixspec.index.suffix_array import SuffixArray


def docs_example() -> SuffixArray:
    return SuffixArray.build([[7, 8, 9, 11], [7, 8, 9, 11], [7, 8, 5]])


def test_worked_example_merges_prompt_and_documents():
    p = SuffixProposer(documents=docs_example(), config=SuffixConfig(max_spec_factor=1.0, learn_rates=False))
    p.begin(RequestContext(prompt_ids=[7, 8, 9, 10, 3, 7, 8]))
    d = p.propose([7, 8, 9, 10, 3, 7, 8], 3)
    assert (d.tokens, d.parents, d.sources) == ([9, 10, 11], [-1, 0, 0], [SOURCE_PROMPT, SOURCE_PROMPT,
                                                                           SOURCE_DOCUMENTS])
    assert d.score == pytest.approx(1 + 1 + 2 / (3 + 1))  # the documents' match of 3 occurrences, smoothed


def test_pick_mode_takes_the_best_scoring_source():
    p = SuffixProposer(documents=docs_example(), config=SuffixConfig(merge=False, max_spec_factor=1.0,
                                                                     learn_rates=False))
    p.begin(RequestContext(prompt_ids=[7, 8, 9, 10, 3, 7, 8]))
    d = p.propose([7, 8, 9, 10, 3, 7, 8], 8)
    # prompt: [9, 10], score 2 beats documents: [9, 11], score 4/3 (match "7 8" caps drafts at 2 nodes)
    assert set(d.sources) == {SOURCE_PROMPT} and d.tokens == [9, 10] and d.score == 2


@pytest.mark.parametrize("drafters, expected", [
    (None, {SOURCE_PROMPT, SOURCE_REFERENCES, SOURCE_PREDICTION, SOURCE_DOCUMENTS}),
    # a given prediction drafts whatever the list says (draft.drafter_allows)
    ((SOURCE_PROMPT,), {SOURCE_PROMPT, SOURCE_PREDICTION}),
    ((SOURCE_REFERENCES,), {SOURCE_REFERENCES, SOURCE_PREDICTION}),
    ((SOURCE_PREDICTION,), {SOURCE_PREDICTION}),
    ((SOURCE_PROMPT, SOURCE_PREDICTION), {SOURCE_PROMPT, SOURCE_PREDICTION}),
    ((SOURCE_DOCUMENTS, SOURCE_HISTORY), {SOURCE_DOCUMENTS, SOURCE_PREDICTION}),
    (("draft_model",), {SOURCE_PREDICTION}),
])
def test_request_drafters_switch_sources(drafters, expected):
    docs = SuffixArray.build([[1, 2, 3, 40, 41]])
    p = SuffixProposer(documents=docs, config=SuffixConfig(max_spec_factor=4, min_token_prob=0.0))
    req = RequestContext(prompt_ids=[1, 2, 3, 30, 31, 1, 2, 3], reference_ids=[[1, 2, 3, 50, 51]],
                         prediction_ids=[2, 3, 60, 61], drafters=drafters)
    p.begin(req)
    got = {s for s, _ in p.speculate_all(req.prompt_ids, p_params(16))}
    assert got == expected
    d = p.propose(req.prompt_ids, 16)
    assert set(d.sources) == expected
    first_tokens = {d.tokens[i] for i, par in enumerate(d.parents) if par < 0}
    want = {SOURCE_PROMPT: 30, SOURCE_REFERENCES: 50, SOURCE_PREDICTION: 60, SOURCE_DOCUMENTS: 40}
    assert first_tokens == {want[s] for s in expected}


def p_params(budget):
    from suffixspec.index.speculate import SpecParams

    return SpecParams(budget, 4.0, 0.0, 0.0, True)


def test_learns_output_into_history_and_follows_updates():
    p = SuffixProposer(config=SuffixConfig(max_spec_factor=4, learn_rates=False))
    template = [100, 101, 102, 103, 104, 105]
    p.begin(RequestContext(prompt_ids=[1, 2]))
    assert len(p.propose([1, 2], 8)) == 0
    p.update([100, 101])
    p.update(template[2:])
    p.end(template)
    assert p.history.num_tokens == len(template)
    p.begin(RequestContext(prompt_ids=[5, 100, 101]))
    d = p.propose([5, 100, 101], 8)
    assert d.tokens[:4] == [102, 103, 104, 105] and set(d.sources) == {SOURCE_HISTORY}
    # the request's own output is drafted from as soon as it is appended
    p.update([7, 8, 9, 5])
    d = p.propose([5, 100, 101, 7, 8, 9, 5], 8)
    assert d.tokens[0] == 100 and SOURCE_PROMPT in d.sources


def test_out_of_step_context_is_resynchronised():
    p = SuffixProposer()
    p.begin(RequestContext(prompt_ids=[1, 2, 3]))
    d = p.propose([1, 2, 3, 9, 1, 2], 4)  # update() was never called for 9, 1, 2
    assert d.tokens[:1] == [3]


def test_merge_keeps_best_probability_and_budget():
    from suffixspec.index.speculate import SpecResult

    a = SpecResult([5, 6, 7], [-1, 0, 1], [0.9, 0.5, 0.4], 1.8, 3)
    b = SpecResult([5, 9], [-1, 0], [1.0, 0.6], 1.6, 2)
    d = merge_by_probability([(SOURCE_PROMPT, a), (SOURCE_DOCUMENTS, b)], budget=3)
    assert (d.tokens, d.parents) == ([5, 9, 6], [-1, 0, 0])
    assert d.sources == [SOURCE_DOCUMENTS, SOURCE_DOCUMENTS, SOURCE_PROMPT]
    assert d.score == pytest.approx(1.0 + 0.6 + 0.5)


class IdsTok:
    """A tokenizer whose text is its token ids, space-separated ("1 2 3" -> [1, 2, 3])."""

    fingerprint = "ids-v1"

    def encode(self, text):
        return [int(w) for w in text.split()]


def test_store_backed_documents_and_persistent_history(tmp_path):
    db = tmp_path / "index.db"
    with IndexStore(db) as store:
        store.add_documents([DocInput("1 2 3 4 5 6", "doc.txt")], IdsTok())
    p = make_suffix_proposer(db=db, tokenizer=IdsTok(), max_spec_factor=4)
    assert p.documents is not None and p.documents.num_tokens == 6
    p.begin(RequestContext(prompt_ids=[9, 2, 3]))
    assert p.propose([9, 2, 3], 3).tokens == [4, 5, 6]
    p.end([70, 71, 72, 73])
    # new documents appear at the next request; history survives a restart
    with IndexStore(db) as store:
        store.add_documents([DocInput("20 21 22 23", "more.txt")], IdsTok())
    p.begin(RequestContext(prompt_ids=[20, 21]))
    d = p.propose([20, 21], 3)  # beside how the earlier answer began (70): a match found once is no certainty
    assert [t for t, s in zip(d.tokens, d.sources, strict=True) if s == SOURCE_DOCUMENTS] == [22, 23]
    q = SuffixProposer(db=str(db), fingerprint="ids-v1", config=SuffixConfig(max_spec_factor=4))
    q.begin(RequestContext(prompt_ids=[70, 71]))
    d = q.propose([70, 71], 2)
    assert d.tokens == [72, 73] and d.sources == [SOURCE_HISTORY] * 2
    with pytest.raises(ValueError, match="tokenizer"):
        SuffixProposer(db=str(db))


# ----- engine: speculation with the suffix proposer never changes greedy output ---------------------
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "for i in range(10):\n\tprint(i, i * i)\nfor i in range(10):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown",
]


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    engine_mod = pytest.importorskip("suffixspec.runtimes.engine")
    from suffixspec.loading import load_model

    return engine_mod, load_model(str(tiny_model_dirs["llama"]), device="cpu", dtype="float32")


@pytest.mark.slow  # a tiny model through the engine, ~9 CPU s per case
@pytest.mark.parametrize("tree", [True, False])
def test_engine_greedy_equality(llama, tmp_path, tree):
    engine_mod, target = llama
    from suffixspec.config import SamplingParams, SpeculationConfig

    with IndexStore(tmp_path / "index.db") as store:
        store.add_documents([DocInput(text * 3, f"doc{i}.txt") for i, text in enumerate(PROMPTS)], target.tokenizer)
    proposer = SuffixProposer(db=tmp_path / "index.db", tokenizer=target.tokenizer,
                              config=SuffixConfig(tree=tree, max_spec_factor=2.0, min_token_prob=0.05))
    spec_engine = engine_mod.Engine(target, [proposer])
    plain_engine = engine_mod.Engine(target)
    sampling = SamplingParams(max_tokens=24, ignore_eos=True)
    drafted = accepted = 0
    for round_ in range(2):  # the second round also drafts from the first round's outputs (history)
        for prompt in PROMPTS:
            plain = plain_engine.generate(prompt, sampling, speculation=False)
            fast = spec_engine.generate(prompt, sampling, references=[PROMPTS[0]], prediction=prompt,
                                        # not adaptive: time-based gates on a loaded machine may skip
                                        # every draft, and the proposer must be exercised here
                                        speculation=SpeculationConfig(max_draft_tokens=16, adaptive=False))
            assert fast.token_ids == plain.token_ids, (round_, prompt)
            stats = fast.stats.to_dict()
            drafted += stats["drafted_tokens"]
            accepted += stats["accepted_tokens"]
    assert drafted > 0 and accepted > 0  # the proposer was exercised, not idle
    assert proposer.history.num_outputs == 2 * len(PROMPTS)


def test_extend_periodic_worked_example_and_refusals():
    from suffixspec.drafting.proposers.suffix_drafts import extend_periodic
    from suffixspec.index.speculate import SpecResult

    context = [1, 2, 3, 7, 8, 9, 7, 8]
    res = SpecResult([9, 7, 8], [-1, 0, 1], [1.0, 1.0, 1.0], 3.0, 2)
    extend_periodic(context, res, 7)
    assert (res.token_ids, res.parents) == ([9, 7, 8, 9, 7, 8, 9], [-1, 0, 1, 2, 3, 4, 5])
    assert res.score == pytest.approx(7.0)
    for tokens, parents in (([9, 7, 5], [-1, 0, 1]),  # not a copy of the context's tail
                            ([9, 7, 8], [-1, 0, 0])):  # a tree, not a chain
        res = SpecResult(list(tokens), list(parents), [1.0] * 3, 3.0, 2)
        extend_periodic(context, res, 7)
        assert res.token_ids == tokens


@pytest.mark.parametrize("periodic,expected", [(True, [3, 4, 1, 2, 3, 4]), (False, [3, 4, 1, 2])])
def test_looping_output_drafts_past_the_live_end(periodic, expected):
    loop = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]  # match "1 2 3 4 1 2" (6 tokens) ends 4 tokens back
    p = SuffixProposer(config=SuffixConfig(periodic=periodic, max_spec_factor=1.0), history=False)
    p.begin(RequestContext(prompt_ids=loop))
    assert p.propose(loop, 16).tokens == expected


@pytest.mark.parametrize("tokens,expected", [([12, 13, 14], (2, SOURCE_HISTORY)), ([12, 99], (0, None)),
                                             ([50], (0, None)), ([12], (1, SOURCE_PROMPT))])
def test_confirmed_run(tokens, expected):
    from suffixspec.drafting.draft import Draft
    from suffixspec.drafting.proposers.suffix_drafts import confirmed_run

    # chain [12, 13]: confirmed to its leaf (2), missed (0), or a prefix that was all the output had (1)
    draft = Draft([12, 13], [-1, 0], [SOURCE_PROMPT, SOURCE_HISTORY])
    assert confirmed_run(draft, tokens) == expected


def test_merge_gives_the_copied_source_the_budget_first():
    from suffixspec.index.speculate import SpecResult

    a = SpecResult([5, 6, 7], [-1, 0, 1], [1.0, 1.0, 1.0], 3.0, 3)  # two single-occurrence paths
    b = SpecResult([5, 8, 9], [-1, 0, 1], [1.0, 1.0, 1.0], 3.0, 3)
    both = [(SOURCE_PREDICTION, a), (SOURCE_PROMPT, b)]
    d = merge_by_probability(both, budget=3)  # shared 5, then the paths share the depth
    assert (d.tokens, d.parents) == ([5, 6, 8], [-1, 0, 0])
    d = merge_by_probability(both, budget=3, prefer=SOURCE_PROMPT)  # 5 is the prediction's: 8, 9 still follow it
    assert (d.tokens, d.parents, d.sources) == ([5, 8, 9], [-1, 0, 1], [SOURCE_PREDICTION, SOURCE_PROMPT,
                                                                          SOURCE_PROMPT])
    d = merge_by_probability([(SOURCE_PROMPT, b), (SOURCE_PREDICTION, a)], budget=4, prefer=SOURCE_PREDICTION)
    assert (d.tokens, d.parents) == ([5, 6, 7, 8], [-1, 0, 1, 0])


def test_copy_regime_grows_the_draft_past_its_match_and_ends_at_a_miss():
    prompt = list(range(10, 60))
    p = SuffixProposer(config=SuffixConfig(copy_growth=2.0, max_spec_factor=1.0), history=False)
    p.begin(RequestContext(prompt_ids=prompt))
    context = prompt + [10, 11]  # the output starts copying the prompt: match "10 11"
    assert p.propose(context, 32).tokens == [12, 13]  # match_len 2 -> 2 tokens
    p.update([12, 13, 14])  # both accepted, then the target's own 14
    context += [12, 13, 14]
    d = p.propose(context, 32)
    assert d.tokens == list(range(15, 24))  # match 5 + 2 * 2 confirmed = 9 tokens (5 without the regime)
    p.update([15, 16, 99])  # a miss ends the regime
    context += [15, 16, 99]
    p.update([10, 11])
    context += [10, 11]
    assert p.propose(context, 32).tokens == [12, 13]


def test_shorter_match_drafts_past_the_live_end_of_a_loop():
    from suffixspec.index.incremental import IncrementalIndex
    from suffixspec.index.speculate import SpecParams

    loop = [1, 2, 3, 4] * 3 + [1, 2]
    idx = IncrementalIndex()
    idx.extend(loop)
    params = SpecParams(16, 4.0, 0.0, 0.1, True)
    # the longest match (the 10 tokens before the last period) continues 3 4 1 2 and reaches the live end
    assert idx.speculate(loop, params).token_ids == [3, 4, 1, 2]
    # its 6-token suffix also ends a period earlier, 8 tokens before the live end: one of its two
    # occurrences goes on
    res = idx.speculate(loop, params, lengths=2)
    assert (res.token_ids, res.match_len) == ([3, 4, 1, 2, 3, 4, 1, 2], 6)
    assert res.probs == pytest.approx([1.0] * 4 + [0.5] * 4) and res.score == pytest.approx(6.0)
    # the proposer uses it with the periodic rule off: a copy of the loop, not a copy of the draft
    p = SuffixProposer(config=SuffixConfig(periodic=False), history=False)
    p.begin(RequestContext(prompt_ids=loop))
    assert p.propose(loop, 16).tokens == [3, 4, 1, 2, 3, 4, 1, 2]
    p = SuffixProposer(config=SuffixConfig(periodic=False, match_lengths=0), history=False)
    p.begin(RequestContext(prompt_ids=loop))
    assert p.propose(loop, 16).tokens == [3, 4, 1, 2]
    with pytest.raises(ValueError, match="match_lengths"):
        SuffixConfig(match_lengths=-1)


@pytest.mark.parametrize("seed", range(8))
def test_match_lengths_pick_the_best_score_of_every_length(seed):
    """With every length allowed, the draft scores as well as the best single match length would
    (SuffixDecoding's rule), checked against a brute-force count over the sequences."""
    import random

    from test_suffix_tree import ref_match_len, ref_tree

    from suffixspec.index.incremental import IncrementalIndex
    from suffixspec.index.speculate import SpecParams

    rng = random.Random(seed)
    alphabet = rng.randint(2, 4)
    seqs = [[rng.randrange(alphabet) for _ in range(rng.randint(5, 40))] for _ in range(rng.randint(1, 4))]
    idx = IncrementalIndex.from_sequences(seqs, max_candidates=10_000)
    for _ in range(30):
        ctx = [rng.randrange(alphabet) for _ in range(rng.randint(3, 12))]
        params = SpecParams(rng.choice([4, 8, 16]), rng.choice([1.0, 4.0]), 0.0, rng.choice([0.05, 0.2]), True)
        longest = ref_match_len(seqs, ctx)
        if longest == 0:
            continue
        # below the trigram, lengths come from the trigram's occurrences only when there are some
        shortest = 3 if longest >= 3 else 1

        best = max(sum(sorted(ref_tree(seqs, ctx[-n:], params).values(), reverse=True)[:params.limit(n)])
                   for n in range(shortest, longest + 1))
        res = idx.speculate(ctx, params, lengths=64)
        assert res.score == pytest.approx(best), (seqs, ctx)
        assert res.score >= idx.speculate(ctx, params).score - 1e-9
        # and the draft is that match length's own tree
        tree = ref_tree(seqs, ctx[-res.match_len:], params)
        paths: list[tuple[int, ...]] = []
        for tok, par in zip(res.token_ids, res.parents, strict=True):
            paths.append((paths[par] if par >= 0 else ()) + (tok,))
        assert all(tree[path] == pytest.approx(prob) for path, prob in zip(paths, res.probs, strict=True))


def _edited_copy() -> tuple[list[int], list[int]]:
    """A "file" with the word 7 in four places, and the file with 7 renamed to 7 90 91 everywhere."""
    file = [10, 11, 40, 41, 42, 7, 12, 13, 14, 15, 16, 17, 18, 7, 19, 20, 21, 22, 23, 24, 7, 25, 26, 27, 28, 29,
            30, 7, 31, 32]
    edited: list[int] = []
    for tok in file:
        edited += [tok, 90, 91] if tok == 7 else [tok]
    return [1, 2, *file, 3], edited  # the request: the file between two marker tokens


def test_copy_resumes_after_an_edit_learns_it_and_forgets_it():
    from suffixspec.bench.bench_drafting import accepted_path

    prompt, _ = _edited_copy()
    # count ratios alone: the resumed copy's whole chain (learned rates would first cut it to its first token)
    p = SuffixProposer(config=SuffixConfig(periodic=False, learn_rates=False), history=False)
    p.begin(RequestContext(prompt_ids=prompt))
    context = list(prompt)

    def step(new: list[int]) -> None:
        context.extend(new)
        p.update(new)

    step([10, 11, 40, 41])  # a draft was accepted: the output copies the file (followed from here)
    assert p.propose(context, 32).tokens[:3] == [42, 7, 12]
    step([42, 7, 90])  # the target wrote 90 where the file has 12: the copy is interrupted at 12
    step([91])
    d = p.propose(context, 32)  # "91" occurs nowhere: only the copy's resumption drafts
    assert d.tokens[:4] == [12, 13, 14, 15]
    step([12, 13, 14, 15, 16, 17, 18, 7, 90])  # picked up at 12: "after 7, write 90 91" is learned
    assert p._copy.edits == [(7, [], [90, 91])]
    step([91])
    d = p.propose(context, 32)  # the longest match ("7 90 91" at the first place) leads the tree; the
    # resumed copy is a branch, and the next 7 in it is drafted renamed
    assert accepted_path(d, [19, 20, 21, 22, 23, 24, 7, 90, 91, 25, 26]) == 11
    step([19, 20, 21, 22, 23, 24, 7, 25])  # the target did not rename this one: the edit is forgotten
    assert p._copy.edits == []


def test_copy_resume_saves_steps_on_a_rename_and_costs_little_when_not_repeated():
    from suffixspec.bench.bench_drafting import Trace, replay

    prompt, edited = _edited_copy()

    def steps(resume: bool, output: list[int]) -> int:
        p = SuffixProposer(config=SuffixConfig(periodic=False, resume=resume), history=False)
        return replay(p, [Trace(prompt, output, [], None)]).steps

    # without the rule every rename costs a miss and a restart from a short match
    assert steps(True, edited) < steps(False, edited)
    once = edited[:9] + prompt[9:-1]  # only the first place renamed
    assert steps(True, once) <= steps(False, once) + 1


def test_history_drafts_an_answer_start_from_how_earlier_outputs_began():
    from suffixspec.index.history import OutputHistory
    from suffixspec.index.speculate import SpecParams

    h = OutputHistory(1000)
    h.add([4, 5, 6])
    h.add([4, 5, 7])
    res = h.speculate_start(SpecParams(8, 4.0, 0.0, 0.1, True))  # half the budget: 4 nodes
    # both outputs begin "4 5" (2/3: two of two agree, by the rule of succession), then 6 or 7 (1/3 each)
    assert res.token_ids[:2] == [4, 5] and sorted(res.token_ids[2:]) == [6, 7]
    assert res.parents == [-1, 0, 1, 1]
    assert res.probs == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    # a budget of 1 (the engine's cost-aware budget often is, on a first step) still drafts the shared first token
    assert h.speculate_start(SpecParams(1, 4.0, 0.0, 0.1, True)).token_ids == [4]
    assert len(h.speculate_start(SpecParams(0, 4.0, 0.0, 0.1, True))) == 0
    # learned rates: a small budget cuts a start but does not read it as a 1-token match (rate 0.18), which
    # min_token_prob would prune where half the earlier outputs began alike (0.5 x 0.18 < 0.1)
    from suffixspec.index.speculate import AcceptanceRates

    h.add([8, 1])
    h.add([9, 2])
    rates = AcceptanceRates().table()
    small, large = (h.speculate_start(SpecParams(n, 4.0, 0.0, 0.1, True, rates=rates)) for n in (1, 8))
    assert small.token_ids == [4] and large.token_ids[:1] == [4]


@pytest.mark.parametrize("answer_starts", [True, False])
def test_first_draft_of_an_output_comes_from_earlier_answers_starts(answer_starts):
    p = SuffixProposer(config=SuffixConfig(answer_starts=answer_starts))
    p.begin(RequestContext(prompt_ids=[1, 2, 3]))
    p.end([10, 11, 12, 13, 14, 15])
    p.begin(RequestContext(prompt_ids=[7, 8, 9]))  # nothing of this prompt occurs anywhere
    first = p.propose([7, 8, 9], 8)
    if answer_starts:
        assert first.tokens == [10, 11, 12, 13] and set(first.sources) == {SOURCE_HISTORY}
    else:
        assert first.tokens == []
    p.update([20])  # the output began otherwise: later steps draft from matches only
    assert p.propose([7, 8, 9, 20], 8).tokens == []


SEAM_CHUNK = ("def fsdecode(filename):\n    \"\"\"Decode filename (an os.PathLike, bytes, or str) from the filesystem\n"
              "        encoding with 'surrogateescape' error handler, return str unchanged. On\n"
              "        Windows, use 'strict' error handler if the file system encoding is\n"
              "        'mbcs' (which is the default encoding).\n        \"\"\"\n    filename = fspath(filename)\n")


@pytest.mark.parametrize("text_match", [True, False])
def test_text_match_drafts_across_a_tokenization_seam(text_match):
    from suffixspec.loading import load_tokenizer

    tok = load_tokenizer("suffixspec/demo-target")
    cut = SEAM_CHUNK.index("On\n") + 3  # the prompt ends with the newline, the chunk merges it with the indent
    prompt = tok.encode("# Retrieved chunk, go on:\n" + SEAM_CHUNK[:cut], add_special_tokens=False)
    chunk = tok.encode(SEAM_CHUNK, add_special_tokens=False)
    answer = tok.encode(SEAM_CHUNK[cut:], add_special_tokens=False)
    assert tok.decode(prompt[-1:]) == "\n" and answer[0] not in chunk  # a seam: no token suffix leads on
    p = SuffixProposer(tokenizer=tok, config=SuffixConfig(text_match=text_match), history=False)
    p.begin(RequestContext(prompt_ids=prompt, reference_ids=[chunk]))
    d = p.propose(prompt, 16)
    if text_match:
        assert d.tokens == answer[:16] and set(d.sources) == {SOURCE_REFERENCES}
        assert d.parents == list(range(-1, 15))
    else:
        assert answer[0] not in d.tokens


@pytest.mark.slow  # a tiny model through the engine, ~8 CPU s per case
@pytest.mark.parametrize("case", [dict(), dict(temperature=1.0, seed=3), dict(temperature=0.7, top_p=0.9, seed=4)],
                         ids=["greedy", "t1.0", "t0.7-top-p"])
def test_text_match_and_answer_starts_keep_engine_output_with_gates_on(llama, case):
    """Both rules draft in the engine (spied on: they returned drafts) and the tokens equal plain decoding."""
    engine_mod, target = llama
    from suffixspec.config import SamplingParams

    proposer = SuffixProposer(tokenizer=target.tokenizer)
    drafts = {"text": 0, "starts": 0}
    text_draft, speculate_start = proposer._text_draft, proposer.history.speculate_start

    def spy_text(*a):
        found = text_draft(*a)
        drafts["text"] += found is not None
        return found

    def spy_starts(*a):
        res = speculate_start(*a)
        drafts["starts"] += len(res) > 0
        return res

    proposer._text_draft, proposer.history.speculate_start = spy_text, spy_starts
    spec_engine, plain_engine = engine_mod.Engine(target, [proposer]), engine_mod.Engine(target)
    sampling = SamplingParams(max_tokens=24, ignore_eos=True, **case)
    for round_ in range(2):
        for text in PROMPTS:
            prompt = "# go on:\n" + text[:len(text) // 2]
            plain = plain_engine.generate(prompt, sampling, speculation=False)
            fast = spec_engine.generate(prompt, sampling, references=[text])
            assert fast.token_ids == plain.token_ids, (round_, prompt)
    assert drafts["text"] > 0 and drafts["starts"] > 0


def test_acceptance_rates_worked_example_and_fading():
    from suffixspec.index.speculate import PRIOR_RATES, RATE_EDGES, AcceptanceRates

    rates = AcceptanceRates(weight=8.0, decay=1.0)
    prior = PRIOR_RATES[RATE_EDGES.index(3)]
    assert rates.table()[3] == prior == 0.65
    rates.observe(3, True)
    rates.observe(3, False)
    assert rates.table()[3] == pytest.approx((1 + 8 * prior) / (2 + 8))  # the docstring's 0.62
    assert rates.table()[2] == PRIOR_RATES[1]  # other buckets keep their prior
    for _ in range(20):
        rates.observe(3, True)
    assert rates.table()[3] == pytest.approx((21 + 8 * prior) / 30)
    fading, lasting = AcceptanceRates(decay=0.5), AcceptanceRates(decay=1.0)
    for hit in [False] * 10 + [True] * 3:  # old trials fade: after ten misses, three hits weigh more
        fading.observe(20, hit)
        lasting.observe(20, hit)
    assert fading.table()[20] > lasting.table()[20]
    with pytest.raises(ValueError, match="rates"):
        AcceptanceRates(prior=(0.5,))


def test_proposer_learns_rates_from_what_the_output_did_with_its_drafts():
    """Levels of the last draft that the new tokens reach are trials for the rates of the source that
    drafted them: ``5 6 7`` from a 3-token match, output ``5 6 9``: hits at match lengths 3 and 4, a
    miss at 5. An output that keeps copying raises the rates (longer drafts from the same match); one
    that never does lowers them (shorter drafts)."""
    prompt = [1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    p = SuffixProposer(history=False, config=SuffixConfig(resume=False))
    p.begin(RequestContext(prompt_ids=prompt + [1, 2, 3]))
    rates = p.rates[SOURCE_PROMPT]
    before = list(rates.table())
    d = p.propose(prompt + [1, 2, 3], 3)
    assert d.tokens == [5, 6, 7] and set(d.sources) == {SOURCE_PROMPT}
    p.update([5, 6, 9])
    after = rates.table()
    assert after[3] > before[3] and after[4] > before[4] and after[5] < before[5]

    def draft_after(output_copies: bool) -> int:
        q = SuffixProposer(history=False, config=SuffixConfig(resume=False, max_spec_factor=8))
        for k in range(30):  # requests whose output copies the prompt after a 2-token match (or never does)
            ctx = [100 + k] + list(range(300, 340)) + [300, 301]
            q.begin(RequestContext(prompt_ids=ctx))
            draft = q.propose(ctx, 16)
            q.update(draft.tokens[:3] + [0] if output_copies else [999])
            q.end([])
        ctx = [1] + list(range(300, 340)) + [300, 301]
        q.begin(RequestContext(prompt_ids=ctx))
        return len(q.propose(ctx, 16))

    assert draft_after(True) > draft_after(False)


class _LinearCost:
    """A pass cost of ``plain`` seconds plus ``node`` per further input (what ``StepCost`` reads)."""

    def __init__(self, plain: float, node: float) -> None:
        self.plain, self.node = plain, node

    def estimate(self, inputs: int) -> float:
        return self.plain + self.node * (inputs - 1)


def _documents_steps(p: SuffixProposer, output_step, steps: int) -> list[bool]:
    """Propose and update ``steps`` times (the engine's costs told first: a plain step 70 ms, a node 5 ms);
    ``output_step(i)`` gives the tokens the output adds at step i. Whether each draft held document nodes."""
    ctx = [9, 1, 2]
    p.begin(RequestContext(prompt_ids=list(ctx), drafters=(SOURCE_DOCUMENTS,)))
    had = []
    for i in range(steps):
        p.observe_costs(StepCost(_LinearCost(0.070, 0.005)))
        d = p.propose(ctx, 8)
        had.append(SOURCE_DOCUMENTS in d.sources)
        new = output_step(i)
        p.update(new)
        ctx += new
    p.end(ctx[3:])
    return had


def test_documents_step_aside_where_the_output_never_follows_them():
    from suffixspec.index.retrieval import RetrievalParams

    docs = SuffixArray.build([[1, 2, 3, 4, 5, 6, 7, 8]])
    cfg = SuffixConfig(min_token_prob=0.0, retrieval=RetrievalParams(min_match=1))
    p = SuffixProposer(documents=docs, config=cfg, history=False)
    had = _documents_steps(p, lambda i: [60 + i % 5, 1, 2], 200)  # after every "1 2", never "3"
    assert had[0] and 5 < sum(had) < 60 and not any(had[100:])
    # the corpus' record moves slower: after a few such requests, the next starts without the documents
    requests = 0
    while _documents_steps(p.fork(), lambda i: [60 + i % 5, 1, 2], 40)[0] and requests < 10:
        requests += 1
    assert 0 < requests < 10 and p.documents_yield.value < 0
    off = SuffixProposer(documents=docs, config=replace(cfg, gate_documents=False), history=False)
    assert all(_documents_steps(off, lambda i: [60 + i % 5, 1, 2], 50))  # ungated: drafts whenever it matches


def test_documents_added_start_the_corpus_record_again(tmp_path):
    """A corpus whose record went negative (its documents never paid) drafts again at the first request
    after documents were added: the record is about the corpus before, and the new ones may pay."""
    from suffixspec.index.retrieval import RetrievalParams

    db = tmp_path / "index.db"
    with IndexStore(db) as store:
        store.add_documents([DocInput("1 2 3 4 5 6 7 8", "doc.txt")], IdsTok())
    cfg = SuffixConfig(min_token_prob=0.0, retrieval=RetrievalParams(min_match=1))
    p = SuffixProposer(db=db, tokenizer=IdsTok(), config=cfg, history=False)
    for _ in range(20):
        if not _documents_steps(p.fork(), lambda i: [60 + i % 5, 1, 2], 40)[0]:
            break
    assert p.documents_yield.value < 0 and not _documents_steps(p.fork(), lambda i: [3, 1, 2], 1)[0]
    _documents_steps(p, lambda i: [3, 1, 2], 1)  # nothing changed: the record stays
    assert p.documents_yield.value < 0
    with IndexStore(db) as store:
        store.add_documents([DocInput("1 2 9 9 9", "new.txt")], IdsTok())
    assert _documents_steps(p.fork(), lambda i: [9, 9, 9], 1)[0]  # the first step of the next request drafts
    assert p.documents_yield.steps <= 1


def test_documents_that_the_output_copies_keep_drafting():
    from suffixspec.index.retrieval import RetrievalParams

    docs = SuffixArray.build([[1, 2, 3, 4, 5, 6, 7, 8]])
    cfg = SuffixConfig(min_token_prob=0.0, retrieval=RetrievalParams(min_match=1))
    p = SuffixProposer(documents=docs, config=cfg, history=False)
    had = _documents_steps(p, lambda i: [3, 4, 5, 6, 7, 8, 1, 2], 100)
    assert all(had) and p.documents_yield.value > 1


@pytest.mark.slow  # a tiny model through the engine
@pytest.mark.usefixtures("one_torch_thread")
def test_gated_documents_keep_greedy_and_seeded_outputs(llama, tmp_path, monkeypatch):
    """The documents' gate on, with the engine's gates on and a pinned verify cost that makes a node cost
    half a step: it measures, steps aside and shadows; greedy and seeded sampled outputs are plain
    decoding's, token for token (the gate only chooses deterministic drafts)."""
    from suffixspec.config import SamplingParams, SpeculationConfig
    from suffixspec.drafting.costs import PassCost
    from suffixspec.drafting.proposers import source_gate

    class Pinned(PassCost):
        def observe(self, inputs, seconds):
            pass

        def estimate(self, inputs):
            return 1.0 + 0.5 * (inputs - 1)

    seen = {"on": 0, "shadow": 0}
    observe = source_gate.SourceGate.observe

    def counting(self, gain, nodes, lookup_s, plain_s, node_s, shadow):
        seen["shadow" if shadow else "on"] += 1
        assert plain_s == pytest.approx(1.0) and node_s == pytest.approx(0.5)  # what the engine measured
        return observe(self, gain, nodes, lookup_s, plain_s, node_s, shadow)

    monkeypatch.setattr(source_gate.SourceGate, "observe", counting)
    engine_mod, target = llama
    with IndexStore(tmp_path / "index.db") as store:
        store.add_documents([DocInput(text * 3, f"doc{i}.txt") for i, text in enumerate(PROMPTS)]
                            + [DocInput("class Node:\n    pass\n" * 20, "other.py")], target.tokenizer)
    proposer = SuffixProposer(db=tmp_path / "index.db", tokenizer=target.tokenizer, history=False)
    spec_engine = engine_mod.Engine(target, [proposer], prefix_cache_mb=0)
    spec_engine.scheduler.cost = Pinned()
    plain_engine = engine_mod.Engine(target, prefix_cache_mb=0)
    only_documents = SpeculationConfig(drafters=(SOURCE_DOCUMENTS,), adaptive=True)
    for seed, temperature in [(None, 0.0), (1, 1.0), (2, 0.7), (None, 0.0)]:
        for prompt in PROMPTS:
            sampling = SamplingParams(max_tokens=24, ignore_eos=True, temperature=temperature, seed=seed)
            plain = plain_engine.generate(prompt, sampling, speculation=False)
            fast = spec_engine.generate(prompt, sampling, speculation=only_documents)
            assert fast.token_ids == plain.token_ids, (prompt, temperature)
    assert seen["on"] > 0 and seen["shadow"] > 0, seen  # measured while drafting, and while left out


def test_retrieval_settings_come_as_an_object_or_as_json_fields():
    from suffixspec.index.retrieval import RetrievalParams

    assert SuffixConfig(retrieval={"min_match": 3, "pseudo_count": 0.5}).retrieval == RetrievalParams(
        pseudo_count=0.5, min_match=3)
    with pytest.raises(ValueError, match="min_count"):
        SuffixConfig(retrieval={"min_count": 0})


def test_a_rename_learned_once_is_drafted_wherever_the_identifier_recurs(monkeypatch):
    """A rename learned at ``(frame`` (the token ``frame``) is drafted at `` frame`` (another token) too, and not
    at ``obj.frame`` (an attribute, which the rename of a local leaves alone): fewer steps than the edit learned
    by its token alone, the same output (replay accepts only what the output holds)."""
    import re

    from suffixspec.bench.bench_drafting import Trace, replay
    from suffixspec.drafting.proposers import copy_tracker as S
    from suffixspec.loading import load_tokenizer

    tok = load_tokenizer("suffixspec/demo-target")
    code = ("def draw(frame, scale):\n    size = measure(frame) * scale\n    if frame is None:\n"
            "        return obj.frame\n    return render(frame, size) + frame.area\n")
    edited = re.sub(r"(?<![.\w])frame\b", "frame_value", code)
    prompt = tok.encode("Rename it:\n" + code, add_special_tokens=False)
    output = tok.encode(edited, add_special_tokens=False)
    # the identifier is two tokens in the source: "frame" after "(" and "." , " frame" after a space
    pieces = [tok.decode([t]) for t in prompt]
    assert "frame" in pieces and " frame" in pieces

    def steps(words: bool) -> int:
        p = SuffixProposer(tokenizer=tok, config=SuffixConfig(learn_rates=False), history=False)
        if not words:
            monkeypatch.setattr(p, "_copy_tracker", lambda: S.CopyTracker(p.config.resume_window, None))
        return replay(p, [Trace(prompt, output, [], None)]).steps

    assert steps(True) < steps(False)
    # the rule itself: a whole identifier, an attribute only where the learned one was one
    assert S.ends_with_word(b"render(frame", b"frame") and S.ends_with_word(b"if frame", b"frame")
    assert not S.ends_with_word(b"obj.frame", b"frame") and not S.ends_with_word(b"subframe", b"frame")
    assert S.ends_with_word(b"obj.frame", b".frame") and not S.ends_with_word(b"x = frame", b".frame")
