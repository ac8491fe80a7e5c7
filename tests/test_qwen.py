"""Qwen2.5-Coder-1.5B-Instruct with its draft models: the real coder pair (marker ``qwen``).

The target loads as 1.78B float32 parameters (7.1 GB), so this tier runs apart from CI
(``python -m pytest -m qwen``; .ci/run deselects it, as it does ``gemma``), one process at a time:

- greedy output identical to ``transformers`` ``generate`` on the same weights, with each draft model
  (its 0.5B sibling, same tokenizer, int8 and judging its own drafts; SmolLM2-135M-Instruct bridged
  across vocabularies) and with every drafter merged in one tree;
- seeded sampling identical with speculation on and off, the 0.5B drafting its argmax tokens;
- the lean forward's packed weights replace the model's own in memory (paged out), so the pair fits
  where both copies of the target would not.

The references are computed first, while only the model's own weights are resident; the engine packs
its copy after (paging the model's out layer by layer). Without the packages these tests skip, saying
the pip command.
"""

from __future__ import annotations

import pytest
from tiny import CODE

from suffixspec.gguf_cache import describe
from suffixspec.models import KNOWN_MODELS

pytestmark = [pytest.mark.slow, pytest.mark.real_model, pytest.mark.qwen, pytest.mark.usefixtures("one_torch_thread")]

TARGET, SIBLING, SMOLLM2 = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
FUNCTION = '''def truncate_number(number: float) -> float:
    """ Given a positive floating point number, it can be decomposed into
    and integer part (largest integer smaller than given number) and decimals
    (leftover part always smaller than 1).

    Return the decimal part of the number.
    >>> truncate_number(3.5)
    0.5
    """
'''
# (case, chat messages, new tokens)
CASES = [
    ("complete", [{"role": "user", "content": f"Complete the following Python function.\n\n```python\n{FUNCTION}```"}],
     64),
    ("edit", [{"role": "user", "content": "Rename the variable `total` to `subtotal` in this function. Reply with the "
                                          f"code only.\n\n```python\n{CODE}```"}], 64),
    ("explain", [{"role": "user", "content": "In two sentences, what is a suffix tree used for?"}], 48),
]


def require(*names: str) -> None:
    for name in names:
        info = describe(KNOWN_MODELS[name])
        if not info["installed"]:
            pytest.skip(f"{name} is not installed: {info['install']}")


@pytest.fixture(scope="module")
def pair():
    """(the target, the drafts, transformers' greedy tokens per case): the references computed before any
    lean forward packs the target."""
    import torch

    from suffixspec.loading import load_model

    require(TARGET, SIBLING, SMOLLM2)
    target = load_model(TARGET)
    expected = {}
    for case, messages, tokens in CASES:
        text = target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = list(target.tokenizer(text)["input_ids"])
        with torch.inference_mode():
            out = target.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                        do_sample=False, max_new_tokens=tokens,
                                        pad_token_id=target.tokenizer.eos_token_id)
        expected[case] = (ids, out[0, len(ids):].tolist())
    return target, {"sibling": load_model(SIBLING), "smollm2": load_model(SMOLLM2)}, expected


def _engine(target, drafts, which: str | None, **draft_kw):
    from suffixspec.drafting.proposers import make_proposer
    from suffixspec.drafting.proposers.draft_model import make_draft_proposer
    from suffixspec.runtimes.engine import Engine

    proposers = [make_proposer("suffix", db=None, tokenizer=target.tokenizer, history=False)]
    if which is not None:
        proposers.append(make_draft_proposer(drafts[which], target, **draft_kw))
    return Engine(target, proposers, prefix_cache_mb=0)


@pytest.mark.parametrize(("draft", "drafters"), [("sibling", ("draft_model",)), ("smollm2", ("draft_model",)),
                                                 ("sibling", None)], ids=["sibling", "smollm2-bridged", "merged"])
def test_greedy_output_equals_transformers_generate_with_each_draft(pair, draft, drafters):
    from suffixspec.config import SamplingParams, SpeculationConfig

    target, drafts, expected = pair
    engine = _engine(target, drafts, draft)
    accepted = 0
    for case, _, tokens in CASES:
        ids, want = expected[case]
        res = engine.generate(ids, SamplingParams(max_tokens=tokens), SpeculationConfig(drafters=drafters))
        assert res.token_ids == want, (draft, case, target.tokenizer.decode(res.token_ids), target.tokenizer.decode(want))
        accepted += res.stats.per_source.get("draft_model", {}).get("accepted", 0)
    assert accepted > 0  # the draft model really drafted, and the target really accepted
    runner = engine.scheduler.runner
    assert runner.lean is not None and runner.lean.paged_out > 5 * 2**30  # the model's own copy left memory
    if draft == "sibling":
        assert engine.proposers[1].runner.int8  # a draft this large runs on int8 matrices


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_seeded_sampling_is_identical_with_the_siblings_argmax_drafts(pair, temperature):
    from suffixspec.config import SamplingParams, SpeculationConfig

    target, drafts, expected = pair
    engine = _engine(target, drafts, "sibling", sample=False)
    for case in ("complete", "edit"):
        ids, _ = expected[case]
        sp = SamplingParams(max_tokens=48, temperature=temperature, top_p=0.95, seed=7)
        on = engine.generate(ids, sp, SpeculationConfig())
        off = engine.generate(ids, sp, SpeculationConfig(enabled=False))
        assert on.token_ids == off.token_ids, (case, target.tokenizer.decode(on.token_ids))
        assert on.stats.drafted_tokens > 0 and on.stats.steps < off.stats.steps


def test_llama_cpp_reads_the_pairs_file_joined_from_its_part_packages(tmp_path, monkeypatch):
    """llama.cpp runs the GGUF as it is: for the part packages that is the parts joined in order (the
    stated size and sha256), kept once in the cache, not a package's ``assemble()`` (they have none)."""
    from suffixspec.models import gguf_source
    from suffixspec.runtimes.llama_cpp.model import gguf_path

    require(SIBLING)
    monkeypatch.setenv("SUFFIXSPEC_CACHE", str(tmp_path))
    path = gguf_path(SIBLING)
    parts = gguf_source(SIBLING).model.parts
    assert path.is_file() and path.stat().st_size == parts.size and path.is_relative_to(tmp_path)
    assert gguf_path(SIBLING) == path  # the second call finds it
