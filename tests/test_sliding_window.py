"""Sliding-window models (Mistral, Gemma 2) past their window: tree verification equals plain decoding.

The first verify pass after the sequence passed the window used to crash (a shape mismatch, or a
sliding cache layer that cannot crop). Tiny models with a 16-token window (Mistral: every layer;
Gemma 2: alternating sliding and full layers) generate 48 tokens after a ~10-token prompt, so most
verify passes are past the window; drafts are chains and trees, fully and partly accepted, and
random trees mostly rejected. A model whose cache cannot drop rejected tokens is refused at load.
"""

from __future__ import annotations

import pytest
import torch
from doubles import OracleProposer, RandomTreeProposer

from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.drafting.proposers.draft_model import DraftModelProposer
from suffixspec.loading import load_model
from suffixspec.runtimes.engine import Engine

WINDOW = 16
PROMPTS = ["def add(a, b):\n    return", "The quick brown fox jumps"]


def _build(arch: str, tokenizer_dir, out_dir, seed: int = 0):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma2Config, MistralConfig

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  sliding_window=WINDOW, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                  pad_token_id=tok.pad_token_id)
    if arch == "mistral":
        cfg = MistralConfig(**common)
    else:  # Gemma 2: layer 0 sliding, layer 1 full attention, logit soft-capping
        cfg = Gemma2Config(head_dim=16, layer_types=["sliding_attention", "full_attention"], **common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)  # peaked, so drafts of the model's own tokens matter
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def windowed(tiny_dir, bpe_tokenizer_dir) -> dict[str, Engine]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield {arch: Engine(load_model(str(_build(arch, bpe_tokenizer_dir, tiny_dir / f"tiny-{arch}-window")),
                                   device="cpu"))
           for arch in ("mistral", "gemma2")}
    torch.set_num_threads(before)


def _gen(engine, proposers, prompt, sp, spec):
    engine.proposers = list(proposers)
    try:
        return engine.generate(prompt, sp, spec)
    finally:
        engine.proposers = []


def _kinds(plain: list[int], vocab: int):
    return {"oracle-chain": OracleProposer(plain, vocab),
            "oracle-partial-tree": OracleProposer(plain, vocab, corrupt_every=3, branch=True),
            "random-tree": RandomTreeProposer(sorted(set(plain)), seed=7)}


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
@pytest.mark.parametrize("params", [dict(), dict(temperature=1.0, seed=11)], ids=["greedy", "seeded"])
def test_equals_plain_past_the_window(windowed, arch, params):
    engine = windowed[arch]
    sp = SamplingParams(max_tokens=48, ignore_eos=True, **params)
    for prompt in PROMPTS:
        assert len(engine.encode(prompt)) < WINDOW  # the window is passed during generation
        plain = _gen(engine, [], prompt, sp, False)
        for kind, proposer in _kinds(plain.token_ids, engine.vocab_size).items():
            spec = _gen(engine, [proposer], prompt, sp, SpeculationConfig(adaptive=False))
            assert spec.token_ids == plain.token_ids, (arch, kind, prompt)
            assert spec.stats.drafted_tokens > 0
            if kind.startswith("oracle"):
                assert spec.stats.accepted_tokens > 0 and spec.stats.steps < plain.stats.steps


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_plain_path_equals_transformers_generate(windowed, arch):
    """Speculation off (the engine's own cache and masks) is ``generate``'s greedy output past the window."""
    engine = windowed[arch]
    ids = engine.encode(PROMPTS[0])
    plain = _gen(engine, [], ids, SamplingParams(max_tokens=40, ignore_eos=True), False)
    out = engine.model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, min_new_tokens=40)
    assert plain.token_ids == out[0, len(ids):].tolist()


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_windowed_draft_model(windowed, arch):
    """A sliding-window model as the draft model: its own cache is rewound past the window too."""
    engine = windowed[arch]
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = _gen(engine, [], PROMPTS[1], sp, False)
    draft = DraftModelProposer(engine.target, min_confidence=0.0)  # the model drafting for itself
    spec = _gen(engine, [draft], PROMPTS[1], sp, SpeculationConfig(adaptive=False))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.mean_accepted_length > 1.5


def test_unsupported_cache_is_refused_at_load(tmp_path, bpe_tokenizer_dir):
    """A model with layers whose cache cannot drop rejected tokens (here chunked attention) fails at
    load with a message that names them, not mid-generation."""
    from transformers import AutoTokenizer, LlamaConfig

    tok = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, layer_types=["chunked_attention", "full_attention"])
    cfg.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="chunked_attention.*full or sliding-window"):
        load_model(str(tmp_path), device="cpu")


def _configs() -> dict:
    from transformers import Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2)
    return {
        "llama": LlamaConfig(**common),
        "mistral (every layer sliding)": MistralConfig(sliding_window=WINDOW, **common),
        "qwen2 (upper layers sliding)": Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2,
                                                    **common),
        "qwen2 (no window)": Qwen2Config(sliding_window=WINDOW, **common),
        "gemma2": Gemma2Config(head_dim=16, sliding_window=WINDOW, **common),
        "gemma3": Gemma3TextConfig(head_dim=16, sliding_window=WINDOW, **common),
    }


@pytest.mark.parametrize("name", sorted(_configs()))
def test_layer_types_read_without_transformers_helper_agree(name, monkeypatch):
    """kv.layer_types reads transformers' cache_utils.get_layer_types_and_kwargs where it exists (not public
    API; transformers 5.6 has none): without it, the config's documented fields give the same types and
    windows per layer, for every family with windows."""
    import transformers.cache_utils

    from suffixspec.core.kv import layer_types

    cfg = _configs()[name]
    with_helper = layer_types(cfg)
    if not hasattr(transformers.cache_utils, "get_layer_types_and_kwargs"):
        pytest.skip("this transformers has no get_layer_types_and_kwargs: every test already runs without it")
    monkeypatch.delattr(transformers.cache_utils, "get_layer_types_and_kwargs")
    assert layer_types(cfg) == with_helper
    assert len(with_helper) == 4 and {w for _, w in with_helper} <= {None, WINDOW}
