"""The token bridge on two real, different tokenizers: SmolLM2-135M-Instruct (byte-level BPE, 49,152
tokens) drafting for Gemma 3 270M (SentencePiece with byte fallback, 262,144 tokens).

Greedy output through the bridge (text level and token-level intersection, a draft at every step)
equals plain decoding token for token, and some drafted tokens are accepted. Skipped when either model
is not installed. Model folders: ``SUFFIXSPEC_GEMMA`` / ``SUFFIXSPEC_SMOLLM2`` when set, else the names
``gemma-3-270m`` / ``smollm2-135m-instruct`` as the loader resolves them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.real_model, pytest.mark.gemma, pytest.mark.usefixtures("one_torch_thread")]

PROMPTS = [
    "The capital of France is Paris. The capital of Germany is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Speculative decoding makes a large language model faster by",
]
TOKENS = 24


def real_model_dir(name: str, env: str) -> str:
    """A local folder for ``name``: ``$env``, else what the loader resolves the name to; skip if neither."""
    from suffixspec.loading import resolve_model_path

    path = os.environ.get(env)
    if not path:
        try:
            path = resolve_model_path(name)
        except Exception as exc:  # the package that carries the model is not installed
            pytest.skip(f"{name} is not available: {exc}")
    if not (Path(path) / "config.json").exists():
        pytest.skip(f"{name} is not installed (set {env} to its folder)")
    return path


@pytest.fixture(scope="module")
def pair():
    from suffixspec.loading import load_model

    gemma = load_model(real_model_dir("gemma-3-270m", "SUFFIXSPEC_GEMMA"), device="cpu")
    smol = load_model(real_model_dir("smollm2-135m-instruct", "SUFFIXSPEC_SMOLLM2"), device="cpu")
    return gemma, smol


@pytest.mark.parametrize("mode", ["text", "intersection"])
def test_smollm2_drafts_for_gemma_through_the_bridge(pair, mode, record_property):
    from suffixspec.config import SamplingParams, SpeculationConfig
    from suffixspec.drafting.proposers.draft_model import make_draft_proposer
    from suffixspec.runtimes.engine import Engine

    gemma, smol = pair
    proposer = make_draft_proposer(smol, gemma, mode=mode)
    assert type(proposer).__name__ == "BridgedDraftProposer" and not proposer.bridge.same_vocabulary
    engine = Engine(gemma)
    sp = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
    drafted = accepted = steps = tokens = 0
    for prompt in PROMPTS:
        engine.proposers = []
        plain = engine.generate(prompt, sp, SpeculationConfig(enabled=False))
        engine.proposers = [proposer]
        spec = engine.generate(prompt, sp, SpeculationConfig(adaptive=False))  # a draft at every step
        assert spec.token_ids == plain.token_ids, (mode, prompt)
        drafted += spec.stats.drafted_tokens
        accepted += spec.stats.accepted_tokens
        steps += spec.stats.steps
        tokens += len(spec.token_ids)
    record_property("acceptance", {"drafted": drafted, "accepted": accepted, "tokens_per_pass": tokens / steps})
    print(f"{mode}: drafted {drafted}, accepted {accepted} ({accepted / max(1, drafted):.2f}), "
          f"{tokens / steps:.2f} tokens per target pass")
    assert drafted > 0 and accepted > 0
    assert torch.get_num_threads() == 1
