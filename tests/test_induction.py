"""The hand-built copy circuit of the default target (suffixspec/training/induction.py): an untrained
model with it copies text from its context, and training around it (with ``Frozen``) keeps it."""

from __future__ import annotations

import random

import pytest
import torch

from suffixspec.training import induction


def circuit_model(vocab: int = 500, layers: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=256, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=8, head_dim=128, attention_bias=True,
                      rope_theta=induction.ROPE_THETA, max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    induction.install(model, seed=0)
    return model


def greedy_continuation(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def model():
    return circuit_model()


def test_untrained_circuit_copies_a_segment_seen_earlier(model):
    rng = random.Random(1)
    text = [rng.randrange(10, 500) for _ in range(300)]
    seg = text[100:180]
    prompt = text + [3, 4] + seg[:6]  # a separator, then a 6-token cue (fewer than the 16 matched)
    assert greedy_continuation(model, prompt, 60) == seg[6:66]


def test_copy_prefers_the_longest_agreement(model):
    # "A x B" and "A y B" with different continuations: after "A y B" the copy must follow the second.
    rng = random.Random(2)
    a = [rng.randrange(10, 500) for _ in range(12)]
    b = [rng.randrange(10, 500) for _ in range(6)]
    first, second = [rng.randrange(10, 500) for _ in range(20)], [rng.randrange(10, 500) for _ in range(20)]
    noise = [rng.randrange(10, 500) for _ in range(40)]
    ctx = a + [7] + b + first + noise + a + [8] + b + second + noise
    cue = a + [8] + b
    assert greedy_continuation(model, ctx + cue, 10) == second[:10]


def test_frozen_keeps_the_circuit_through_training(model):
    m = circuit_model(layers=4)
    frozen = induction.Frozen(m)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    rng = random.Random(3)
    for _ in range(3):
        ids = torch.tensor([[rng.randrange(10, 500) for _ in range(64)]])
        loss = m(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        frozen.restore()
    after = m.state_dict()
    lay = induction.layout(m.config)
    hd = m.config.head_dim
    assert torch.equal(after["model.embed_tokens.weight"][:, lay["reserved"]],
                       before["model.embed_tokens.weight"][:, lay["reserved"]])
    assert not torch.equal(after["model.embed_tokens.weight"][:, lay["T"]],
                           before["model.embed_tokens.weight"][:, lay["T"]])  # the language model trains
    for layer, heads in induction.circuit_heads(m.config).items():
        rows = slice(0, (max(heads) + 1) * hd)
        for p in ("q_proj", "k_proj", "v_proj"):
            key = f"model.layers.{layer}.self_attn.{p}.weight"
            assert torch.equal(after[key][rows], before[key][rows]), key
    for i in range(4):  # nothing trainable writes into the codes or slots, and layers 0-1 write only the circuit
        rows = slice(None) if i < 2 else lay["reserved"]
        for key in (f"model.layers.{i}.mlp.down_proj.weight", f"model.layers.{i}.self_attn.o_proj.weight"):
            assert torch.equal(after[key][rows], before[key][rows]), key
    # The circuit still finds the source: layer 2's copy heads attend to the copied position.
    rng = random.Random(4)
    text = [rng.randrange(10, 500) for _ in range(200)]
    ids = text + [3, 4] + text[50:80]
    m.config._attn_implementation = "eager"
    with torch.no_grad():
        att = m(input_ids=torch.tensor([ids]), output_attentions=True).attentions[2][0]
    copy = induction.circuit_heads(m.config)[2]
    for k in range(16, 30):  # query at cue token text[50 + k]: the next token is text[51 + k]
        i = 202 + k
        assert att[copy, i].argmax(-1).eq(51 + k).all(), (k, att[copy, i].argmax(-1))
