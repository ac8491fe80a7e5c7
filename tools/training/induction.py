"""A hand-built induction (copy) circuit written into the initial weights of a Llama model.

Small models trained for minutes on two CPU cores do not reliably discover copying by themselves
(the circuit forms by a late, sudden phase change; see the model card). So the target model starts
from weights that already copy, and training only adds the language model around the circuit.

The circuit matches the last ``NGRAM`` (16) tokens: position ``i`` attends to the earlier position
``j`` whose 16 preceding tokens agree most with ``t_i, t_{i-1}, ..., t_{i-15}`` and copies ``t_j``.
Sixteen tokens rarely repeat with another continuation in code (8 do often: an 8-token exact match
caps greedy copying of held-out code near 0.70, 16 near 0.94), and a sum over 16 slots averages out
the cross-talk of small token codes.

Residual layout (hidden ``H``): ``[T | C | P1 .. P16]``

- ``T`` (``H - 17 * M`` dimensions): trained token embeddings, where the language model lives;
- ``C`` (``M`` = 6 dimensions): a *fixed* random code per token, never trained. Matching on the
  trained embeddings does not work: training makes frequent tokens' embeddings alike, and a copy
  circuit reading them lost half its accuracy (0.67 -> 0.33 greedy copy) without any other change;
- ``Pd``: the code of the token ``d`` positions back, written by the circuit.

Which layers train (``Frozen``). First recipes: the circuit's heads, the input norms of layers 0-2 and
every residual write of layers 0-1 frozen, so the residual that layer 2 matches on is exactly embedding
+ codes + slots; layer 2's free head and MLP and layers 3+ trained, never writing into ``C`` or the
slots. Letting layers 0-1 learn broke the copy (a checkpoint copied 0.02 of a held-out segment
greedily, 0.76 with those writes removed again), in two ways: their writes grew the residual every
norm divides by, so the match faded, and they changed the ``T`` the copy heads copy at the matched
position. Both are removed by (1) large codes (``install(code_rms=64)``: the codes dominate every
norm's divisor) and (2) a ``copy`` part of ``T`` (``circuit_copy_dims`` in the config) that only the
embedding writes before layer 2 and the copy heads copy. Then every layer trains: the untrained
circuit, with random writes of rms 20 into the rest of ``T`` before layer 2, still copies 0.93 of a
held-out segment greedily (0.000 with codes of rms 2, 0.000 with large codes but all of ``T`` copied).

- layer 0, heads 0-3: previous-token heads. Constant, RoPE-phased queries and keys (attention
  biases) peak at distance ``d`` = 1..4; the value is ``C``; the output goes to ``Pd``;
- layer 1, heads 0-2: block heads, the same construction at distances 4, 8 and 12, copying the block
  ``P1..P4`` of that position into ``P5..P8``, ``P9..P12`` and ``P13..P16`` (doubling: four layer-0
  heads and three layer-1 heads give sixteen slots);
- layer 2, heads 0-6: induction heads. Query ``[C, P1..P15]`` at ``i``, key ``[P1..P16]`` at ``j``
  over the RoPE pairs that barely rotate (``rope_theta`` 1e16); each head copies one slice of ``T``
  of the matched position to the tied output layer.

All other residual writes start at zero, so the untrained model is exactly a copier.
"""

from __future__ import annotations

import math

import torch

NGRAM = 16
M = 6  # code / slot width
ROPE_THETA = 1e16
MATCH_FIRST_PAIR = 16  # with theta 1e16 and head_dim 128, pairs >= 16 rotate < 0.2 rad over 2,000 positions
PREV_PAIRS = 6  # fast pairs that phase the previous-token and block heads
PREV_HEADS = 4  # layer 0: distances 1..4
BLOCK_DISTANCES = (4, 8, 12)  # layer 1: block P1..P4 from these distances -> P5..P16
CIRCUIT_LAYERS = 3
CODE_RMS_REF = 2.0  # the code magnitude the norm weights were laid out for (the first recipes' codes)


def layout(cfg) -> dict:
    """Residual slices of the circuit for a model config. ``copy`` (the first ``circuit_copy_dims``
    dimensions of ``T``, all of ``T`` when the config does not say) is what the copy heads read at the
    matched position: layers 0-1 may train but never write there, so it holds the token embedding alone."""
    H = cfg.hidden_size
    T = H - (NGRAM + 1) * M
    copy = getattr(cfg, "circuit_copy_dims", None) or T
    return {"T": slice(0, T), "C": slice(T, T + M), "P": [slice(T + (d + 1) * M, T + (d + 2) * M) for d in range(NGRAM)],
            "reserved": slice(T, H), "t_dims": T, "copy": slice(0, copy), "copy_dims": copy}


def copy_heads(cfg) -> int:
    """Layer-2 heads that copy: as many as split the ``copy`` dimensions into equal slices, at most all
    heads (each slice fits a head: ``copy_dims / heads <= head_dim``)."""
    c = layout(cfg)["copy_dims"]
    return max(h for h in range(1, cfg.num_attention_heads + 1) if c % h == 0 and c // h <= cfg.head_dim)


def _phased(hd: int, inv_freq: torch.Tensor, d: int, amp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(query bias, key bias) of a head whose score peaks at distance ``d`` (constant, RoPE-phased)."""
    half = hd // 2
    qb, kb = torch.zeros(hd), torch.zeros(hd)
    for f in range(PREV_PAIRS):
        qb[f] = amp
        kb[f] = amp * math.cos(d * inv_freq[f].item())
        kb[f + half] = amp * math.sin(d * inv_freq[f].item())
    return qb, kb


@torch.no_grad()
def install(model, seed: int = 0, match_scale: float = 4.0, copy_logit: float = 15.0, prev_amp: float = 12.0,
            code_rms: float = CODE_RMS_REF) -> None:
    """Write the circuit into ``model`` (a ``LlamaForCausalLM`` with attention biases, >= 3 layers,
    head_dim >= 128, >= 4 heads, ``rope_theta`` = ``ROPE_THETA``). A matching slot adds about
    ``match_scale`` * 1.3 to the attention score; the copied token gets a logit of about ``copy_logit``.

    ``code_rms``: the codes' magnitude per dimension. Every RMSNorm divides by the rms of the whole
    residual; with large codes that divisor is the codes' (fixed), so what the trained dimensions
    write barely changes how the circuit's heads see the codes (at 64, a trained residual of rms 10
    in ``T`` moves the divisor by 2%; at 2, by a factor 7). The norms' weights on ``T`` are scaled
    by ``code_rms / CODE_RMS_REF`` so that the untrained model computes the same function either way."""
    cfg = model.config
    H, nh, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    half = hd // 2
    lay = layout(cfg)
    T = lay["t_dims"]
    assert cfg.attention_bias and cfg.num_hidden_layers >= CIRCUIT_LAYERS and nh >= max(PREV_HEADS, 3)
    assert 2 * (half - MATCH_FIRST_PAIR) >= NGRAM * M, "head_dim too small for the match"
    gen = torch.Generator().manual_seed(seed)
    emb = model.model.embed_tokens.weight
    V = emb.shape[0]
    emb[:, lay["reserved"]] = 0
    code = torch.randn(V, M, generator=gen)
    emb[:, lay["C"]] = code / code.norm(dim=1, keepdim=True) * math.sqrt(M) * code_rms
    rms_emb = emb.pow(2).mean(dim=1).sqrt().mean().item()  # the input norm's divisor at layer 0
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2).float() / hd))

    for layer in model.model.layers:  # every residual write starts at zero; the circuit's are set below
        layer.self_attn.o_proj.weight.zero_()
        layer.self_attn.o_proj.bias.zero_()
        layer.mlp.down_proj.weight.zero_()
    model.model.norm.weight[lay["reserved"]] = 0  # codes and slots never reach the logits
    erase = erases(cfg)
    scale = code_rms / CODE_RMS_REF
    if erase:  # the codes are in the residual up to layer 2's attention only: the norms before it compensate
        seeing = [x for layer in model.model.layers[:CIRCUIT_LAYERS - 1]
                  for x in (layer.input_layernorm, layer.post_attention_layernorm)]
        seeing.append(model.model.layers[CIRCUIT_LAYERS - 1].input_layernorm)
    else:
        seeing = [model.model.norm] + [x for layer in model.model.layers
                                       for x in (layer.input_layernorm, layer.post_attention_layernorm)]
    for norm in seeing:
        norm.weight[lay["T"]] *= scale

    def clear(att, h):
        rows = slice(h * hd, (h + 1) * hd)
        for p in ("q_proj", "k_proj", "v_proj"):
            getattr(att, p).weight[rows] = 0
            getattr(att, p).bias[rows] = 0
        return rows

    # Layer 0: previous-token heads, C of position i-d -> Pd (same magnitude as C).
    att = model.model.layers[0].self_attn
    for h in range(PREV_HEADS):
        rows = clear(att, h)
        att.q_proj.bias[rows], att.k_proj.bias[rows] = _phased(hd, inv_freq, h + 1, prev_amp)
        att.v_proj.weight[h * hd: h * hd + M, lay["C"]] = torch.eye(M)
        att.o_proj.weight[lay["P"][h], h * hd: h * hd + M] = torch.eye(M) * rms_emb

    # Layer 1: block heads, P1..P4 of position i-d -> P(d+1)..P(d+4).
    att = model.model.layers[1].self_attn
    block = slice(lay["P"][0].start, lay["P"][PREV_HEADS - 1].stop)
    width = PREV_HEADS * M
    rms1 = math.sqrt(rms_emb ** 2 + PREV_HEADS * M * code_rms ** 2 / H)  # residual rms here: embedding + 4 slots
    for h, d in enumerate(BLOCK_DISTANCES):
        rows = clear(att, h)
        att.q_proj.bias[rows], att.k_proj.bias[rows] = _phased(hd, inv_freq, d, prev_amp)
        att.v_proj.weight[h * hd: h * hd + width, block] = torch.eye(width)
        dst = slice(lay["P"][d].start, lay["P"][d + PREV_HEADS - 1].stop)
        att.o_proj.weight[dst, h * hd: h * hd + width] = torch.eye(width) * rms1

    # Layer 2: induction heads. Query chunk c = C (c = 0) or Pc, key chunk c = P(c+1).
    att = model.model.layers[2].self_attn
    low = list(range(MATCH_FIRST_PAIR, half))
    match = low + [f + half for f in low]
    chunks = [match[c * M:(c + 1) * M] for c in range(NGRAM)]
    n_copy = copy_heads(cfg)
    slice_w = lay["copy_dims"] // n_copy
    rms2 = math.sqrt(rms_emb ** 2 + NGRAM * M * code_rms ** 2 / H)  # residual rms here: embedding, C, 16 slots
    # The copied embedding e_T(t_j) lands in the final hidden state (divided by the final norm's rms, about
    # rms2), where the tied output layer turns it into a logit of ``copy_logit`` for t_j at initialisation.
    e2 = emb[:, lay["copy"]].pow(2).sum(dim=1).mean().item()
    gain = copy_logit * rms2 / e2
    for h in range(n_copy):
        rows = clear(att, h)
        base = h * hd
        for c in range(NGRAM):
            qrows = [base + r for r in chunks[c]]
            src = lay["C"] if c == 0 else lay["P"][c - 1]
            att.q_proj.weight[qrows, src] = torch.eye(M) * match_scale
            att.k_proj.weight[qrows, lay["P"][c]] = torch.eye(M)
        cols = slice(h * slice_w, (h + 1) * slice_w)
        att.v_proj.weight[base: base + slice_w, cols] = torch.eye(slice_w)
        # divided by the norm weights' scale twice: once for the value (read through layer 2's norm), once
        # for the final norm (scaled up with the codes; with the eraser, the write then has the size it had
        # with codes of rms 2, about 6, which the language model's writes can match)
        att.o_proj.weight[cols, base: base + slice_w] = torch.eye(slice_w) * rms2 * gain / scale ** 2
    if erase:
        # The eraser: a head attending to its own position subtracts the codes and slots from the residual
        # (value: the reserved dimensions divided by the norm's divisor, about rms2; output: minus them
        # times rms2), so layers 3+ and the final norm see the language model's dimensions alone.
        h = n_copy
        rows = clear(att, h)
        att.q_proj.bias[rows], att.k_proj.bias[rows] = _phased(hd, inv_freq, 0, prev_amp)
        R = H - T
        att.v_proj.weight[h * hd: h * hd + R, lay["reserved"]] = torch.eye(R)
        att.o_proj.weight[lay["reserved"], h * hd: h * hd + R] = -torch.eye(R) * rms2


def copy_output(model) -> torch.Tensor:
    """The induction heads' output projection (a view of layer 2's ``o_proj`` weight): scaling it
    scales the copy."""
    cfg = model.config
    return model.model.layers[2].self_attn.o_proj.weight[:, : copy_heads(cfg) * cfg.head_dim]


def erases(cfg) -> bool:
    """Whether layer 2 has the eraser head (``circuit_erase`` in the config): large codes dominate every
    norm they pass through, which the circuit's layers need and the language model's do not (with the
    codes kept to the end, a run's loss rose again after 600 steps: its trained dimensions, rms 6-10
    under codes of rms 40, were not normalised at all)."""
    return bool(getattr(cfg, "circuit_erase", False))


def circuit_heads(cfg) -> dict[int, list[int]]:
    """Layer -> the circuit's heads: previous-token heads, block heads, copy heads (+ the eraser)."""
    return {0: list(range(PREV_HEADS)), 1: list(range(len(BLOCK_DISTANCES))),
            2: list(range(copy_heads(cfg) + int(erases(cfg))))}


def _pass_gradient_straight(module, args, output):
    """Forward hook of a frozen circuit layer: its output is ``input + delta`` with the gradient
    passed along the residual only (``delta`` detached). The delta depends on the trained embedding
    only through the input norm's divisor, so the backward pass through the layer is skipped for a
    negligible part of the embedding's gradient."""
    hidden = args[0] if args else None
    out = output[0] if isinstance(output, tuple) else output
    if hidden is None or not torch.is_grad_enabled():
        return output
    out = hidden + (out - hidden).detach()
    return (out, *output[1:]) if isinstance(output, tuple) else out


class Frozen:
    """Keeps the circuit while the rest trains: after each optimizer step, ``restore()`` writes back
    every frozen entry (the circuit's heads, the codes, the norm weights the circuit reads through, and
    the zeros that keep trained writes out of ``C`` and the slots; AdamW's weight decay would otherwise
    shrink them too). Gradients of frozen entries are zeroed so Adam's moments stay clean.

    ``train_early=False`` (the first recipes): layers 0-1 do not train at all (``requires_grad`` off),
    layer 2's input norm neither: a trained write there grew the residual the match is normalised by
    (with codes of rms 2) and the copy broke. ``train_early=True`` (with large codes, ``install(...,
    code_rms=64)``): every layer trains except the circuit's own entries; layers 0-1 never write into
    the ``copy`` dimensions (what the copy heads read must stay the token embedding), and the norms of
    layers 0-2 keep their weights on the reserved dimensions. ``train_copy_out``: the copy heads'
    output projection trains too (into ``T`` only), so the copy's strength follows the language model
    around it instead of being fixed at initialisation."""

    def __init__(self, model, train_early: bool = False, train_copy_out: bool = False):
        cfg = model.config
        hd = cfg.head_dim
        lay = layout(cfg)
        self.entries: list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]] = []
        H = cfg.hidden_size

        def keep(p, mask):
            mask = mask.to(p.device)  # built on the CPU; the model may train on a GPU
            self.entries.append((p, mask, p.detach()[mask].clone()))
            p.register_hook(lambda g, m=mask: g.masked_fill(m, 0))

        res = torch.zeros(H, dtype=torch.bool)
        res[lay["reserved"]] = True
        early_rows = res.clone()  # what layers 0-1 may not write: the reserved dims, and the copied ones
        early_rows[lay["copy"]] = True
        emb = model.model.embed_tokens.weight
        keep(emb, res.expand_as(emb).clone())
        keep(model.model.norm.weight, res.clone())
        heads = circuit_heads(cfg)
        for i, layer in enumerate(model.model.layers):
            att = layer.self_attn
            if i < CIRCUIT_LAYERS - 1 and not train_early:  # layers 0-1 write nothing but the circuit
                for p in layer.parameters():
                    p.requires_grad_(False)
                layer.register_forward_hook(_pass_gradient_straight)
                continue
            out_rows = early_rows if i < CIRCUIT_LAYERS - 1 else res
            o_mask = out_rows[:, None].expand_as(att.o_proj.weight).clone()
            for h in heads.get(i, []):
                if not (train_copy_out and i == CIRCUIT_LAYERS - 1 and h < copy_heads(cfg)):
                    o_mask[:, h * hd:(h + 1) * hd] = True
            keep(att.o_proj.weight, o_mask)
            keep(att.o_proj.bias, out_rows.clone())
            keep(layer.mlp.down_proj.weight, out_rows[:, None].expand_as(layer.mlp.down_proj.weight).clone())
            if i in heads:
                for p in ("q_proj", "k_proj", "v_proj"):
                    w, b = getattr(att, p).weight, getattr(att, p).bias
                    wm = torch.zeros_like(w, dtype=torch.bool)
                    bm = torch.zeros_like(b, dtype=torch.bool)
                    for h in heads[i]:
                        wm[h * hd:(h + 1) * hd] = True
                        bm[h * hd:(h + 1) * hd] = True
                    keep(w, wm)
                    keep(b, bm)
                if train_early:
                    keep(layer.input_layernorm.weight, res.clone())
                else:
                    layer.input_layernorm.weight.requires_grad_(False)

    @torch.no_grad()
    def restore(self) -> None:
        for p, mask, values in self.entries:
            p[mask] = values
