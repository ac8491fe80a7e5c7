"""The proposer factory and the Draft type's validation."""

from __future__ import annotations

import pytest
from doubles import OracleProposer

from suffixspec.drafting.draft import Draft
from suffixspec.drafting.proposers import Proposer, make_proposer, proposer_names, register_proposer
from suffixspec.drafting.registry import unregister


def test_factory_builds_known_proposers_and_rejects_unknown(bpe_tokenizer_dir):
    from transformers import AutoTokenizer

    assert proposer_names() == ("suffix", "draft_model")  # no test double in the production factory
    with pytest.raises(ValueError, match="unknown proposer 'oracle'; choose one of suffix, draft_model"):
        make_proposer("oracle", expected=[1, 2, 3], vocab_size=10)
    register_proposer("oracle", OracleProposer)
    try:
        assert isinstance(make_proposer("oracle", expected=[1, 2, 3], vocab_size=10), OracleProposer)
        assert "oracle" in proposer_names()
    finally:
        unregister("oracle")  # registered for this test only
    assert proposer_names() == ("suffix", "draft_model")
    suffix = make_proposer("suffix", tokenizer=AutoTokenizer.from_pretrained(bpe_tokenizer_dir))
    assert isinstance(suffix, Proposer) and suffix.name == "suffix"
    with pytest.raises(ValueError, match="unknown proposer 'telepathy'"):
        make_proposer("telepathy")


@pytest.mark.parametrize(
    "tokens,parents,sources,message",
    [
        ([1, 2], [-1], ["prompt", "prompt"], "one parent"),
        ([1, 2], [-1, 1], ["prompt", "prompt"], "parents must come before"),
        ([1], [-2], ["prompt"], "parents must come before"),
    ],
)
def test_draft_rejects_malformed_trees(tokens, parents, sources, message):
    with pytest.raises(ValueError, match=message):
        Draft(tokens, parents, sources)


def test_draft_depths_and_truncation():
    d = Draft([17, 42, 99, 5], [-1, 0, 0, 2], ["prompt"] * 4)
    assert d.depths() == [1, 2, 2, 3]
    assert d.truncated(2).tokens == [17, 42] and d.truncated(2).parents == [-1, 0]
