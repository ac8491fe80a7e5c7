"""The hand-built copy circuit of the default target (tools/training/induction.py): an untrained
model with it copies; with large codes and protected copy dimensions it keeps copying while layers
0-1 write into the residual (what lets every layer train); ``Frozen`` keeps the circuit through
optimizer steps; ``loop_break`` examples take the loss off the spliced loop only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tools.training import data, induction

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 300


def _model(code_rms: float, copy_dims: int | None, erase: bool = False, hidden: int = 192):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    extra = {"circuit_copy_dims": copy_dims} if copy_dims else {}
    if erase:
        extra["circuit_erase"] = True
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=128, attention_bias=True,
                      rope_theta=induction.ROPE_THETA, tie_word_embeddings=True, **extra)
    model = LlamaForCausalLM(cfg)
    induction.install(model, seed=0, code_rms=code_rms)
    return model.eval()


def _copy_accuracy(model, noise_rms: float = 0.0) -> float:
    """Teacher-forced accuracy on the second occurrence of a random 60-token segment (the first 16
    tokens of the repeat are the cue the match needs). ``noise_rms``: random writes into the trained
    dimensions at layer 1's input (what training layers 0-1 adds), taken out again after layer 2."""
    gen = np.random.default_rng(1)
    seg = gen.integers(3, VOCAB, 60)
    ids = torch.tensor(np.concatenate([gen.integers(3, VOCAB, 20), seg, gen.integers(3, VOCAB, 30), seg]))[None]
    lay = induction.layout(model.config)
    box = {}

    def add(mod, args):
        noise = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(2)) * noise_rms
        noise[..., lay["reserved"]] = 0
        noise[..., lay["copy"]] = 0
        box["n"] = noise
        return (args[0] + noise,)

    def take(mod, args, out):
        return (out[0] - box["n"], *out[1:]) if isinstance(out, tuple) else out - box["n"]

    hooks = [model.model.layers[1].register_forward_pre_hook(add), model.model.layers[2].register_forward_hook(take)]
    with torch.no_grad():
        pred = model(input_ids=ids).logits[0].argmax(-1)
    for h in hooks:
        h.remove()
    start = 20 + 60 + 30 + 16  # predictions of the repeat's tokens 17..60
    return (pred[start - 1: -1] == ids[0, start:]).float().mean().item()


def test_the_untrained_circuit_copies():
    assert _copy_accuracy(_model(2.0, None)) > 0.95
    assert _copy_accuracy(_model(64.0, 45)) > 0.95
    assert _copy_accuracy(_model(2.0, None, hidden=384)) > 0.95  # a wider target (8 x 384) keeps it


def test_large_codes_and_protected_copy_dims_keep_the_copy_under_early_writes():
    # with codes of rms 2 the trained dimensions' writes dominate the norms' divisor and the match fades;
    # with codes of rms 64 it does not (held-out code, 6 x 256: 0.000 vs 0.930 greedy copy at noise 20)
    assert _copy_accuracy(_model(2.0, 45), noise_rms=20.0) < 0.5
    assert _copy_accuracy(_model(64.0, 45), noise_rms=20.0) > 0.95


def test_the_eraser_leaves_layers_3_on_the_language_models_dimensions():
    model = _model(64.0, 45, erase=True)
    assert _copy_accuracy(model) > 0.95
    lay = induction.layout(model.config)
    seen = {}
    model.model.norm.register_forward_pre_hook(lambda mod, args: seen.update(x=args[0]))
    with torch.no_grad():
        model(input_ids=torch.arange(3, 60)[None])
    reserved = seen["x"][0, :, lay["reserved"]].pow(2).mean().sqrt()
    assert reserved < 0.01 * 64  # the codes (rms 64) are gone before the final norm


def test_frozen_keeps_the_circuit_while_every_layer_trains():
    model = _model(64.0, 45, erase=True)
    lay = induction.layout(model.config)
    frozen = induction.Frozen(model, train_early=True, train_copy_out=True)
    assert all(p.requires_grad for p in model.parameters())  # layers 0-1 train too
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        ids = torch.randint(3, VOCAB, (2, 64), generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        frozen.restore()
    after = model.state_dict()
    hd = model.config.head_dim
    layers = model.model.layers
    for i, heads in induction.circuit_heads(model.config).items():
        for h in heads:
            for p in ("q_proj", "k_proj", "v_proj"):
                key = f"model.layers.{i}.self_attn.{p}.weight"
                assert torch.equal(after[key][h * hd:(h + 1) * hd], before[key][h * hd:(h + 1) * hd]), (key, h)
    for i, layer in enumerate(layers):
        protected = [lay["reserved"]] + ([lay["copy"]] if i < 2 else [])
        for rows in protected:
            assert torch.equal(layer.mlp.down_proj.weight[rows], before[f"model.layers.{i}.mlp.down_proj.weight"][rows])
        assert torch.equal(layer.input_layernorm.weight[lay["reserved"]],
                           before[f"model.layers.{i}.input_layernorm.weight"][lay["reserved"]])
    # what did train: layer 0's MLP output (outside the protected rows) and the copy heads' output in T
    free = slice(lay["copy_dims"], lay["t_dims"])
    assert not torch.equal(layers[0].mlp.down_proj.weight[free], before["model.layers.0.mlp.down_proj.weight"][free])
    copy_cols = slice(0, induction.copy_heads(model.config) * hd)
    assert not torch.equal(layers[2].self_attn.o_proj.weight[lay["T"], copy_cols],
                           before["model.layers.2.self_attn.o_proj.weight"][lay["T"], copy_cols])
    model.eval()
    assert _copy_accuracy(model) > 0.8


class _Tok:
    """What ``ExampleMaker`` needs of a tokenizer: its length and a backend that encodes separators."""

    class _Enc:
        def __init__(self, n):
            self.ids = list(range(3, 3 + n))

    class _Backend:
        def encode(self, text):
            return _Tok._Enc(len(text) % 5 + 1)

    backend_tokenizer = _Backend()

    def __len__(self):
        return VOCAB


def test_loop_break_takes_the_loss_off_the_loop_only():
    files = [np.arange(i * 1000, i * 1000 + 900) % (VOCAB - 3) + 3 for i in range(4)]
    maker = data.ExampleMaker(_Tok(), files, seq_len=256, seed=5)
    for _ in range(20):
        ids, mask = maker.loop_break()
        assert len(ids) == len(mask) == 256
        off = np.flatnonzero(~mask)
        cut, end = off[0], off[-1] + 1
        assert len(off) == end - cut and 24 <= end - cut <= 64  # one contiguous loop
        body = ids[cut:end]
        period = next(p for p in range(1, 13) if np.array_equal(body[p:], body[:-p]))
        assert np.array_equal(body[:period], ids[cut - period:cut])  # it repeats what came just before it
        assert mask[end]  # the token after the loop is a target


def test_loop_exit_sees_a_pure_copier_stay_in_the_loop():
    # the untrained circuit is nothing but a copier: inside a spliced loop it predicts the loop's next token
    from tools.training import evaluate

    gen = np.random.default_rng(4)
    files = [gen.integers(3, VOCAB, 500) for _ in range(3)]
    r = evaluate.loop_exit(_model(64.0, 45), files, n=12)
    assert r["loops"] == 12 and r["stay"] > 0.9 and r["exit"] < 0.1
