"""suffixspec.runtimes.llama_cpp: the suffix drafter as llama-cpp-python's ``draft_model``, and the llama.cpp runtime.

Two parts:

1. The draft model driven the way ``Llama.generate`` drives it (:func:`drive`: the tokens so far in,
   a draft out; a toy greedy target keeps the draft's matching prefix plus one token), with a clock
   that advances by a llama.cpp-like cost per pass: requests start and end, references and the
   prediction are drafted from, drafts are sent only where they pay. Runs everywhere.
2. llama-cpp-python itself on SmolLM2's GGUF (marker ``llama_cpp``): greedy outputs against plain
   llama.cpp's, drafts reaching it, references drafted from, prompts evaluated without every token's
   logits, ``suffixspec serve --runtime llama-cpp`` under the official client. Without llama-cpp-python
   these skip locally and FAIL in CI (``CI=true``; ``.ci/run`` installs its cached wheel).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny import start_server_process

from suffixspec.drafting.draft import Draft
from suffixspec.drafting.tracked import chain_of
from suffixspec.runtimes.llama_cpp.draft import IDLE_MAX, SuffixDraftModel

ROOT = Path(__file__).resolve().parent.parent
T1, SLOPE = 0.0083, 0.0055  # SmolLM2 Q4_1 in llama.cpp, one thread, here: t(n) = T1 + SLOPE * (n - 1) seconds


class Clock:
    """A CPU clock that only the toy target's passes advance."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def drafter(**kw) -> tuple[SuffixDraftModel, Clock]:
    """A draft model on a fake clock with llama.cpp's measured cost curve."""
    d = SuffixDraftModel(**kw)
    clock = Clock()
    d.clock = clock
    for n in (1, 2, 3, 5, 9, 17, 33):
        for _ in range(d.policy.cost_min_passes):  # fewer count as the prior slope at most (PassCost)
            d.cost.observe(n, T1 + SLOPE * (n - 1))
    return d, clock


def drive(d: SuffixDraftModel, prompt: list[int], truth: list[int], clock: Clock | None = None
          ) -> tuple[list[int], int, int]:
    """``Llama.generate``'s protocol with a greedy target whose output is ``truth``: the first token is
    sampled after the prompt; then per pass the draft model gets the tokens so far, the pass evaluates the
    last token plus the draft, and the draft's prefix that ``truth`` continues with is kept plus one token.
    Returns (output, passes after the prefill, drafted tokens)."""
    ids = [*prompt, truth[0]]
    passes = drafted = 0
    while len(ids) - len(prompt) < len(truth):
        draft = d(np.asarray(ids, dtype=np.intc)).tolist()
        k = len(ids) - len(prompt)
        a = 0
        while a < len(draft) and k + a < len(truth) and draft[a] == truth[k + a]:
            a += 1
        if clock is not None:
            clock.t += T1 + SLOPE * len(draft)
        ids += truth[k:k + a + 1]
        passes += 1
        drafted += len(draft)
    return ids[len(prompt):], passes, drafted


RNG = np.random.default_rng(0)
TEXT = RNG.integers(100, 5000, 120).tolist()  # a "file" the output copies
NOISE = RNG.integers(100, 5000, 200).tolist()  # text nobody wrote before


def test_a_copying_output_is_drafted_and_sent():
    d, clock = drafter()
    out, passes, drafted = drive(d, [1, 2, *TEXT, 3], TEXT, clock)
    assert out[:len(TEXT)] == TEXT
    stats = d.finish()
    assert passes < len(TEXT) / 3, passes  # the copy goes out in long verified drafts
    assert stats.accepted_tokens > 0.8 * len(TEXT) and stats.per_source["prompt"]["accepted"] > 0


def test_text_with_nothing_to_copy_sends_nothing_and_queries_the_index_rarely():
    d, clock = drafter()
    _, passes, drafted = drive(d, [1, 2, 3], NOISE, clock)
    assert drafted == 0 and passes == len(NOISE) - 1
    stats = d.finish()
    # while the index yields nothing worth sending it is asked at most every IDLE_MAX-th step
    assert stats.propose_calls["suffix"] <= len(NOISE) / IDLE_MAX + 4


def test_a_copy_that_starts_late_is_found_at_once():
    """Idle (asked rarely) after 60 tokens of new text, the drafter sees the last 4 tokens repeat the prompt
    and asks the index at once: the copy goes out in long drafts from its first tokens."""
    d, clock = drafter()
    _, passes, _ = drive(d, [1, 2, *TEXT, 3], NOISE[:60] + TEXT, clock)
    stats = d.finish()
    assert stats.propose_calls["suffix"] < 60 / 2  # idle while nothing repeats
    assert passes < 60 + len(TEXT) / 3 and stats.per_source["prompt"]["accepted"] > 0.8 * len(TEXT)


def test_drafts_that_do_not_pay_are_not_sent():
    """Every other token is 7, followed each time by a token never seen after it: the index drafts what
    followed 7 last, which never comes true; at t(2) = 1.66 t(1) such drafts stop being sent."""
    d, clock = drafter()
    prompt = [7, 11, 7, 12, 7, 13, 7, 14]
    truth = [t for x in range(100, 180) for t in (7, x)]
    _, passes, drafted = drive(d, prompt, truth, clock)
    assert drafted <= 8 and passes >= len(truth) - 2  # the gate explores a little, then stops


def test_requests_are_told_apart_by_their_tokens_and_end_in_the_history():
    d, clock = drafter()
    drive(d, [1, 2, 3], TEXT[:40], clock)
    first = d.stats
    # a new prompt: the first request ends, its output goes into the history (as far as the calls showed
    # it: the token sampled after the last call is not seen; finish(output) passes the whole output)
    drive(d, [9, 8, 7], NOISE[:20], clock)
    assert d.last_stats is first and d.suffix.history.num_tokens == 39
    # the history drafts the first answer again for a new prompt
    d.finish()
    _, passes, _ = drive(d, [4, 5, 6], TEXT[:40], clock)
    stats = d.finish()
    assert stats.per_source.get("history", {}).get("accepted", 0) > 15 and passes < 15


def test_references_and_prediction_are_drafted_from():
    d, clock = drafter()
    with d.request(references=[TEXT[:60]]):
        _, passes, _ = drive(d, [1, 2, 3], TEXT[:60], clock)
    refs = d.last_stats.per_source["references"]["accepted"]
    assert refs > 30 and passes < 25  # the first ~5 tokens match too little to pay, then drafts grow
    with d.request(prediction=NOISE[:60]):
        drive(d, [4, 5, 6], NOISE[:60], clock)
    assert d.last_stats.per_source["prediction"]["accepted"] > 30
    with pytest.raises(ValueError, match="tokenizer"):  # text needs a tokenizer (or bind(llm))
        with d.request(references=["some text"]):
            pass


def test_speculation_off_and_a_fixed_budget():
    d, clock = drafter()
    with d.request(enabled=False):
        _, passes, drafted = drive(d, [1, 2, *TEXT, 3], TEXT, clock)
    assert drafted == 0 and passes == len(TEXT) - 1
    with d.request(adaptive=False, max_draft_tokens=4):
        _, passes, drafted = drive(d, [1, 2, *TEXT, 3], TEXT, clock)
    assert 0 < drafted <= 4 * passes and passes >= len(TEXT) / 5 - 1


def test_finish_counts_the_tokens_after_the_last_call():
    d, clock = drafter()
    drive(d, [1, 2, 3], NOISE[:10], clock)
    stats = d.finish(NOISE[:12])  # the caller took two more tokens before it stopped
    assert stats.output_tokens == 12 and d.suffix.history.num_tokens == 12


def test_the_documents_gate_weighs_llama_cpp_pass_costs():
    """The documents hold ``1 2 3 4 5 6 7 8``; the output writes ``6x 1 2`` over and over (the documents'
    ``2`` after ``1`` comes true, their ``3 4 ...`` after ``2`` never). Told llama.cpp's costs (a draft token
    0.66 of a step), the corpus' record ends far lower than where an extra token costs nothing (a flat
    curve), on the same drafts: the measured costs reach the documents' gate (Proposer.observe_costs)."""
    from suffixspec.drafting.proposers.suffix import SuffixProposer, single_chain_config
    from suffixspec.index.retrieval import RetrievalParams
    from suffixspec.index.suffix_array import SuffixArray
    from suffixspec.runtimes.llama_cpp.draft import RequestArgs

    truth = [t for i in range(60) for t in (60 + i % 5, 1, 2)]

    def corpus_value(flat: bool) -> float:
        d, clock = drafter()
        if flat:  # every pass as dear as one token: a draft token costs nothing
            for n in (1, 2, 3, 5, 9, 17, 33):
                for _ in range(2 * d.policy.cost_min_passes):  # the majority of each bucket
                    d.cost.observe(n, T1)
        cfg = single_chain_config(min_token_prob=0.0, retrieval=RetrievalParams(min_match=1))
        d.suffix = SuffixProposer(documents=SuffixArray.build([[1, 2, 3, 4, 5, 6, 7, 8]]), config=cfg,
                                  history=False)
        assert d.step_cost().per_node(8) == (0.0 if flat else pytest.approx(SLOPE))
        d.expect(RequestArgs(drafters=("documents",), adaptive=False))  # the documents' drafts alone
        drive(d, [9, 1, 2], truth, clock)
        d.finish()
        return d.suffix.documents_yield.value

    steep, flat = corpus_value(False), corpus_value(True)
    assert steep < flat - 0.1, (steep, flat)  # here about 0.10 against 0.34 (from the prior 0.25)


def test_chain_of_keeps_the_first_path():
    tree = Draft([5, 6, 9, 7], [-1, 0, 0, 1], ["prompt"] * 4)
    assert chain_of(tree).tokens == [5, 6]
    assert chain_of(Draft.chain([1, 2, 3], "prompt")).tokens == [1, 2, 3]


def test_import_stays_light():
    code = ("import sys, suffixspec.runtimes.llama_cpp.draft; bad = [m for m in ('torch', 'transformers', 'flask') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
    code = "import sys, suffixspec; suffixspec.__version__; print('llama_cpp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


# ----- llama-cpp-python itself ---------------------------------------------------------------------
SMOLLM2 = "smollm2-135m-instruct"
CODE = '''def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "paid":
            total += order.amount
            count += 1
    average = total / count if count else 0.0
    return {"total": total, "count": count, "average": average}
'''
PROMPTS = [
    [{"role": "user", "content": "Rename the variable `total` to `subtotal` in this function. Reply with the "
                                 f"code only.\n\n```python\n{CODE}```"}],
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [{"role": "user", "content": f"Repeat this code exactly:\n\n```python\n{CODE}```"}],
]


def _need_llama_cpp() -> None:
    from suffixspec.gguf_cache import describe
    from suffixspec.models import KNOWN_MODELS

    if importlib.util.find_spec("llama_cpp") is None:
        msg = "llama-cpp-python is not installed: pip install 'suffixspec[llama-cpp]' (.ci/run installs it)"
    elif not describe(KNOWN_MODELS[SMOLLM2])["installed"]:
        msg = f"{SMOLLM2} is not installed: {describe(KNOWN_MODELS[SMOLLM2])['install']}"
    else:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail("CI must run the llama.cpp tests: " + msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def llamas():
    """(plain llama.cpp, llama.cpp with our draft model, the transformers tokenizer), one thread each."""
    _need_llama_cpp()
    from suffixspec.runtimes.llama_cpp.model import gguf_tokenizer, load

    tok = gguf_tokenizer(SMOLLM2)
    plain = load(SMOLLM2, n_ctx=2048, n_threads=1, draft=False)
    ours = load(SMOLLM2, n_ctx=2048, n_threads=1, tokenizer=tok, history=False)
    return plain, ours, tok


def chat_ids(tok, messages: list[dict]) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def greedy(llm, ids: list[int], max_tokens: int) -> list[int]:
    out = []
    gen = llm.generate(ids, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    try:
        for tok in gen:
            out.append(int(tok))
            if tok == llm.token_eos() or len(out) >= max_tokens:
                break
    finally:
        gen.close()
    return out


def last_logits(llm) -> np.ndarray:
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()


def plain_logits(plain, ids: list[int], out: list[int]) -> list[np.ndarray]:
    """Plain llama.cpp's logits before each token of ``out``, on its own path: the prompt in one batch, then
    one token per evaluation (what its greedy decoding computed)."""
    plain.reset()
    plain.eval(ids)
    rows = [last_logits(plain)]
    for tok in out[:-1]:
        plain.eval([tok])
        rows.append(last_logits(plain))
    return rows


def batch_rounding(model_path: str, ids: list[int], out: list[int], rows: list[np.ndarray], width: int = 8) -> float:
    """The largest difference between a logit evaluated one token at a time (``rows``) and the same logit
    evaluated in a batch of ``width`` tokens, as a verify pass does (measured: 0.4-1.4 for SmolLM2 Q4_1)."""
    import llama_cpp

    ref = llama_cpp.Llama(model_path=model_path, n_ctx=1024, n_threads=1, n_threads_batch=1, logits_all=True,
                          verbose=False)
    ref.eval(ids + out[:1])
    worst = 0.0
    for start in range(1, min(len(out) - 1, 4 * width), width):
        chunk = out[start:start + width]
        ref.eval(chunk)
        for j in range(len(chunk)):
            worst = max(worst, float(np.abs(ref.scores[len(ids) + start + j - 1] - rows[start + j]).max()))
    return worst


def replay(model_path: str, calls: list[tuple[int, list[int]]], start: int, n: int) -> np.ndarray:
    """Logits rows ``start .. start + n - 1`` of a fresh ``Llama`` that evaluates the recorded ``calls``
    ((position, tokens) per evaluation of a run) as that run did: the first (the prompt) with its last logits
    only (``lean_prompt_eval``), the others (a token and its draft) with every token's."""
    import llama_cpp

    ref = llama_cpp.Llama(model_path=model_path, n_ctx=2048, n_threads=1, n_threads_batch=1, logits_all=True,
                          verbose=False)
    (at, prompt), *verify = calls
    assert at == 0
    ref._logits_all = False
    ref.eval(prompt)
    ref._logits_all = True
    ref.scores[len(prompt) - 1] = last_logits(ref)
    for at, tokens in verify:
        ref.n_tokens = at  # eval() drops the cache past n_tokens (a rejected draft's tail) before it evaluates
        ref.eval(tokens)
    return ref.scores[start : start + n].copy()


@pytest.mark.slow
@pytest.mark.llama_cpp
def test_greedy_outputs_are_llama_cpps_own_and_equal_plain_where_llama_cpp_guarantees_it(llamas):
    """What llama.cpp guarantees, tested exactly, on every prompt:

    - without a draft (speculation off) every evaluation is plain llama.cpp's (the prompt in one batch with
      its last logits, then one token at a time): the output is plain's, token for token;
    - with drafts, every output token is the argmax of the logits llama.cpp computed for its position in
      this run (a draft token is kept only where it is that argmax), and those logits are llama.cpp's own:
      a fresh ``Llama`` evaluating the same batches at the same positions gives them bit for bit;
    - up to the first evaluation of several tokens (a token and its draft) the logits are plain's bit for
      bit, so the output equals plain's at least that far.

    What it does not guarantee: a token's logits computed in a batch of several tokens equal the same
    logits computed one token at a time (its matrix kernels round otherwise; measured up to 1.5 for SmolLM2
    Q4_1), so from the first batch on, an argmax may flip on a near tie and the outputs part (llama.cpp's
    own prompt lookup parts from plain decoding the same way). Where they part, plain's own margin between
    the two tokens is within that measured rounding."""
    plain, ours, tok = llamas
    batched = 0
    for messages in PROMPTS:
        ids = chat_ids(tok, messages)
        plain.reset()
        want = greedy(plain, ids, 96)
        ours.reset()  # (else Llama.generate keeps the cached prefix of the last prompt)
        with ours.draft_model.request(enabled=False):
            assert greedy(ours, ids, 96) == want, messages
        calls: list[tuple[int, list[int]]] = []  # (position, tokens) of each evaluation of the drafted run
        lean = ours.eval

        def recording(tokens, lean=lean, calls=calls):
            calls.append((ours.n_tokens, [int(t) for t in tokens]))
            return lean(tokens)

        ours.reset()
        ours.eval = recording
        try:
            with ours.draft_model.request(adaptive=False):  # every draft sent: the most batches
                got = greedy(ours, ids, 96)
        finally:
            ours.eval = lean
        rows = ours.scores[len(ids) - 1 : len(ids) - 1 + len(got)].copy()  # row of output token j: len(ids) - 1 + j
        assert [int(np.argmax(r)) for r in rows] == got, messages
        assert np.array_equal(rows, replay(ours.model_path, calls, len(ids) - 1, len(got))), messages
        first = min((at for at, tokens in calls[1:] if len(tokens) > 1), default=len(ids) + len(got))
        same = first - len(ids) + 1  # output tokens sampled from rows computed before the first batch
        batched += first < len(ids) + len(got)
        plain_rows = plain_logits(plain, ids, want)
        assert np.array_equal(rows[:same], np.stack(plain_rows[:same])), messages
        assert got[:same] == want[:same], messages
        if got != want:
            i = next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), min(len(got), len(want)))
            assert i >= same
            if i < min(len(got), len(want)):  # (else one output stopped early: an EOS, the same near-tie story)
                margin = float(plain_rows[i][want[i]] - plain_rows[i][got[i]])
                rounding = batch_rounding(ours.model_path, ids, want, plain_rows)
                assert 0.0 <= margin <= rounding, (messages, i, margin, rounding)
    assert batched >= 2  # drafts were verified in batches on most prompts: the guarantees above were exercised


@pytest.mark.slow
@pytest.mark.llama_cpp
def test_calibration_times_what_verification_computes(llamas, monkeypatch):
    """A verify pass evaluates a token and its draft with every token's logits (checked position by
    position); the calibration must time the same. ``bind`` used to install the prompt shortcut
    (``lean_prompt_eval``) first, which took each calibration batch for a prompt and computed its last
    logits only: t(32) came out cheaper than a 32-token verification is. Every batch the calibration
    evaluates computes every token's logits, whether or not the shortcut is installed."""
    import llama_cpp

    from suffixspec.drafting.costs import PassCost
    from suffixspec.runtimes.llama_cpp.draft import CALIBRATION_SIZES, calibrate_cost
    from suffixspec.runtimes.llama_cpp.model import gguf_path

    seen: list[tuple[int, bool]] = []  # (tokens, whether every token's logits were computed) per evaluation
    evaluate = llama_cpp.Llama.eval

    def recording(self, tokens):
        seen.append((len(tokens), bool(self._logits_all)))
        return evaluate(self, tokens)

    monkeypatch.setattr(llama_cpp.Llama, "eval", recording)
    llm = llama_cpp.Llama(model_path=str(gguf_path(SMOLLM2)), n_ctx=512, n_threads=1, n_threads_batch=1,
                          logits_all=True, verbose=False)
    drafter = SuffixDraftModel()
    drafter.bind(llm)  # calibrates (and installs the prompt shortcut)
    sizes = [n for n, _ in seen[1:]]  # after the 16-token context
    assert sorted(set(sizes)) == sorted(CALIBRATION_SIZES) and all(full for _, full in seen[1:]), seen
    seen.clear()
    calibrate_cost(llm, PassCost(drafter.policy))  # again, with the shortcut installed now
    assert len(seen) > len(CALIBRATION_SIZES) and all(full for _, full in seen[1:]), seen
    seen.clear()
    llm.reset()
    llm.eval(llm.tokenize(b"The three primary colors are"))  # a prompt still takes the shortcut
    assert seen == [(len(llm.tokenize(b"The three primary colors are")), False)]


@pytest.mark.slow
@pytest.mark.llama_cpp
def test_drafts_reach_llama_cpp_and_references_are_drafted_from(llamas):
    """Every draft sent (``adaptive=False``: whether one pays depends on the costs measured on this
    machine, which the toy tests above fix): the copy goes out in fewer passes than tokens, and the
    references are drafted from."""
    plain, ours, tok = llamas
    draft = ours.draft_model
    ids = chat_ids(tok, PROMPTS[2])
    with draft.request(adaptive=False):
        got = greedy(ours, ids, 96)
    stats = draft.last_stats
    assert stats.accepted_tokens > 30 and stats.steps < len(got) - 30, stats.to_dict()
    # the plain answer to another question, given as a reference: drafted from the reference, not the prompt
    ids = chat_ids(tok, [{"role": "user", "content": "Write four lines about the sea."}])
    answer = greedy(plain, ids, 64)
    with draft.request(references=[tok.decode(answer, skip_special_tokens=True)], adaptive=False):
        greedy(ours, ids, 64)
    # (only as long as the output stays on the plain answer: here it parts at token 6 on a near tie, 0.04)
    assert draft.last_stats.per_source["references"]["accepted"] >= 5, draft.last_stats.to_dict()


@pytest.mark.slow
@pytest.mark.llama_cpp
def test_prompts_are_evaluated_without_every_tokens_logits(llamas):
    """``lean_prompt_eval``: the prompt's rows of ``scores`` stay unwritten, the last one is there, and
    ``create_completion``'s logprobs still work (their first token reads that row)."""
    plain, ours, tok = llamas
    prompt = "The three primary colors are"
    ours.reset()
    ours.scores[:64] = 0.0
    out = ours.create_completion(prompt, max_tokens=8, temperature=0.0, logprobs=1)
    n = len(ours.tokenize(prompt.encode()))
    assert not ours.scores[0].any()  # an early prompt row: not computed
    assert ours.scores[n - 1].any()  # the row the first token was sampled from
    ref = __import__("llama_cpp").Llama(model_path=ours.model_path, n_ctx=512, n_threads=1, n_threads_batch=1,
                                        logits_all=True, verbose=False)
    want = ref.create_completion(prompt, max_tokens=8, temperature=0.0, logprobs=1)
    assert out["choices"][0]["text"] == want["choices"][0]["text"]
    got_lp = out["choices"][0]["logprobs"]["token_logprobs"][0]
    assert abs(got_lp - want["choices"][0]["logprobs"]["token_logprobs"][0]) < 1e-3


@pytest.mark.slow
@pytest.mark.llama_cpp
def test_chat_completion_api_with_per_call_references(llamas):
    plain, ours, tok = llamas
    ref = "The tide tables list high water at 06:12 and 18:40, and low water at 00:05 and 12:27."
    with ours.draft_model.request(references=[ref], adaptive=False):
        chunks = list(ours.create_chat_completion(
            messages=[{"role": "user", "content": f"{ref}\n\nRepeat the sentence above."}], temperature=0.0,
            max_tokens=40, stream=True))
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert "06:12" in text
    assert ours.draft_model.last_stats.accepted_tokens > 5


@pytest.mark.slow
@pytest.mark.llama_cpp
def test_the_runtime_behind_suffixspec_and_its_refusals(tmp_path):
    _need_llama_cpp()
    from suffixspec.api import SuffixSpec

    with pytest.raises(ValueError, match="draft model"):
        SuffixSpec(model=SMOLLM2, runtime="llama-cpp", draft_model="gemma-3-270m", db=False)
    with SuffixSpec(model=SMOLLM2, runtime="llama-cpp", db=tmp_path / "i.db", threads=1) as spec:
        assert spec.drafters == ["prompt", "history", "documents", "references", "prediction"]
        assert spec.threads["threads"] == 1 and spec.threads["how"] == "given"  # llama.cpp's, as given
        # every draft sent: whether one pays depends on this machine's measured costs
        res = spec.generate(messages=PROMPTS[2], max_tokens=64, temperature=0.0, speculation={"adaptive": False})
        assert res.stats.accepted_tokens > 20 and sum(s != "target" for s in res.token_sources) > 20
        assert res.finish_reason in ("stop", "length") and res.text.startswith(spec.tokenizer.decode(
            res.token_ids[:5], skip_special_tokens=True))
        text = "".join(ev.text for ev in spec.stream("def fib(n):", max_tokens=30, stop=["return"]))
        assert "return" not in text
        with pytest.raises(ValueError, match="logprobs"):
            spec.generate("x", max_tokens=2, logprobs=1)
        assert spec.index_stats()["served"]["history_outputs"] == 2


@pytest.mark.slow
@pytest.mark.llama_cpp
def test_serve_runtime_llama_cpp_answers_the_openai_client(tmp_path):
    import openai

    _need_llama_cpp()
    cmd = [sys.executable, "-c", "from suffixspec.cli import main; main()", "serve", "--runtime", "llama-cpp",
           "--model", SMOLLM2, "--db", str(tmp_path / "serve.db"), "--port", "0"]
    proc, url = start_server_process(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == [SMOLLM2]
        resp = client.chat.completions.create(model=SMOLLM2, messages=PROMPTS[2], max_tokens=64, temperature=0,
                                              extra_body={"speculation": {"adaptive": False}})
        assert "def summarize" in resp.choices[0].message.content
        assert resp.speculative_decoding["accepted_tokens"] > 20
        chunks = list(client.chat.completions.create(
            model=SMOLLM2, messages=PROMPTS[1], max_tokens=24, temperature=0, stream=True,
            extra_body={"references": ["Paris is the capital of France."]}))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


@pytest.mark.slow
@pytest.mark.llama_cpp
def test_the_benchmark_runs_llama_cpp_systems_side_by_side(tmp_path):
    """``suffixspec bench`` with the llama.cpp systems alone: speedups against llama.cpp plain and its
    prompt lookup, the share of outputs equal to llama.cpp plain's, a table of their own."""
    from suffixspec.bench.run import run

    _need_llama_cpp()
    result = run(SMOLLM2, None, tmp_path, workloads=("code_edit", "open_ended"),
                 systems=("llama_plain", "llama_prompt_lookup", "llama_ours"), requests=1, max_tokens=24,
                 log=lambda msg: None)
    rows = {(r["workload"], r["system"]): r for r in result["rows"]}
    assert set(rows) == {(w, s) for w in ("code_edit", "open_ended")
                         for s in ("llama_plain", "llama_prompt_lookup", "llama_ours")}
    for (_, s), row in rows.items():
        assert row["baseline"] == "llama_plain" and row["tokens"] > 0 and 0.0 <= row["identical_share"] <= 1.0
        if s == "llama_plain":
            assert row["identical_share"] == 1.0
        else:
            assert row["vs_llama_plain_median"] > 0 and row["vs_llama_plain_cpu_median"] > 0
    assert rows[("code_edit", "llama_ours")]["vs_llama_prompt_lookup_median"] > 0
    assert "| smollm2-135m-instruct | code_edit | llama_ours |" in result["markdown"]
