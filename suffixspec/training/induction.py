"""A hand-built induction (copy) circuit written into the initial weights of a Llama model.

Small models trained for minutes on two CPU cores do not reliably discover copying by themselves
(the circuit forms by a late, sudden phase change; see the model card). So the target model starts
from weights that already copy, and training only has to keep the circuit while it learns code:

- residual layout (hidden ``H``): token embeddings live in the first ``H - 2 * M`` dimensions
  ("T"); two ``M``-dimensional slots ``P1``/``P2`` are reserved (zero in the embeddings);
- layer 0, heads 0 and 1: *previous-token heads*. Their queries and keys are constant (attention
  biases) and RoPE-phased so that position ``i`` attends to ``i - 1`` (head 0) and ``i - 2`` (head 1);
  they write a fixed projection ``A`` (``M x T``) of that token's embedding into ``P1`` / ``P2``;
- layer 1, all heads: an *induction head* (two-token match): query ``[A e(t_i), P1_i]``, key
  ``[P1_j, P2_j]``, so position ``i`` attends to the ``j`` whose two preceding tokens equal
  ``t_{i-1} t_i``; the values copy ``e(t_j)`` (each head one slice of T) into the residual, and the
  tied output layer turns it into a high logit for ``t_j``. The match uses only the RoPE pairs whose
  rotation over the context is small (a large ``rope_theta`` makes most pairs nearly static);
- every other output projection (other heads, all MLPs, layers 2+) starts at zero, so the initial
  model is exactly the copy circuit, and training adds the language model on top.
"""

from __future__ import annotations

import math

import torch

MATCH_FIRST_PAIR = 16  # with head_dim 128, RoPE pairs >= 16 rotate by < 0.3 rad over 256 positions
ROPE_THETA = 1e12


def _orthonormal_rows(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, n, generator=gen))
    return q.T.contiguous()  # [n, d], orthonormal rows


def layout(cfg, ngram: int) -> tuple[int, int]:
    """(T, M): token dimensions and slot width for an ``ngram``-token match."""
    half = cfg.head_dim // 2
    match_dims = 2 * (half - MATCH_FIRST_PAIR)
    assert match_dims % ngram == 0
    m = match_dims // ngram
    return cfg.hidden_size - ngram * m, m


@torch.no_grad()
def install(model, ngram: int = 3, seed: int = 0, match_scale: float = 2.0, copy_scale: float = 3.0,
            prev_amp: float = 12.0, sink: float = 0.0) -> None:
    cfg = model.config
    H, nh, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    half = hd // 2
    T, M = layout(cfg, ngram)
    assert cfg.attention_bias and cfg.num_hidden_layers >= 2 and ngram <= nh and T % nh == 0
    gen = torch.Generator().manual_seed(seed)
    emb = model.model.embed_tokens.weight
    emb[:, T:] = 0
    sigma = emb[:, :T].pow(2).mean().sqrt().item() * math.sqrt(T / H)  # rms of an embedding row over H dims
    A = _orthonormal_rows(M, T, gen)
    low = list(range(MATCH_FIRST_PAIR, half))
    match = low + [f + half for f in low]  # head dims used for matching, ngram chunks of M
    chunks = [match[c * M:(c + 1) * M] for c in range(ngram)]
    slots = [slice(T + s * M, T + (s + 1) * M) for s in range(ngram)]  # P1..Pn

    for layer in model.model.layers:  # zero every residual write; the circuit's writes are set below
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        if layer.self_attn.o_proj.bias is not None:
            layer.self_attn.o_proj.bias.zero_()
    for layer in model.model.layers[:2]:
        for p in ("q_proj", "k_proj", "v_proj"):
            getattr(layer.self_attn, p).bias.zero_()

    # Layer 0: previous-token heads (constant query/key, RoPE-phased to peak at distance d).
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2).float() / hd))  # [half]
    att = model.model.layers[0].self_attn
    for h in range(ngram):
        d = h + 1
        rows = slice(h * hd, (h + 1) * hd)
        for w in (att.q_proj.weight, att.k_proj.weight, att.v_proj.weight):
            w[rows] = 0
        qb = torch.zeros(hd)
        kb = torch.zeros(hd)
        for f in range(6):
            qb[f] = prev_amp
            kb[f] = prev_amp * math.cos(d * inv_freq[f].item())
            kb[f + half] = prev_amp * math.sin(d * inv_freq[f].item())
        att.q_proj.bias[rows] = qb
        att.k_proj.bias[rows] = kb
        att.v_proj.weight[h * hd: h * hd + M, :T] = A
        att.o_proj.weight[slots[h], h * hd: h * hd + M] = torch.eye(M) * sigma

    # Layer 1: induction heads (all heads share the match; each copies one slice of T).
    att = model.model.layers[1].self_attn
    width = T // nh
    for h in range(nh):
        base = h * hd
        for w in (att.q_proj.weight, att.k_proj.weight, att.v_proj.weight):
            w[base: base + hd] = 0
        for c in range(ngram):
            qrows = [base + r for r in chunks[c]]
            src = A if c == 0 else torch.eye(M)
            if c == 0:
                att.q_proj.weight[qrows, :T] = A * match_scale
            else:
                att.q_proj.weight[qrows, slots[c - 1]] = src * match_scale
            att.k_proj.weight[qrows, slots[c]] = torch.eye(M)
        if sink:  # a score of ``sink`` on the position itself (fading over the previous few): no match -> self
            amp = math.sqrt(sink * math.sqrt(hd) / MATCH_FIRST_PAIR)
            att.q_proj.bias[base: base + MATCH_FIRST_PAIR] = amp
            att.k_proj.bias[base: base + MATCH_FIRST_PAIR] = amp
        cols = slice(h * width, (h + 1) * width)
        att.v_proj.weight[base: base + width, cols] = torch.eye(width)
        att.o_proj.weight[cols, base: base + width] = torch.eye(width) * sigma * copy_scale


def freeze(model, ngram: int = 3) -> None:
    """Keep the circuit while training: layers 0-1 attention and input norms frozen; the embeddings and
    layer 0's MLP never write into the reserved slots (their gradients there are zeroed)."""
    T, _ = layout(model.config, ngram)
    for layer in model.model.layers[:2]:
        for p in layer.self_attn.parameters():
            p.requires_grad_(False)
        layer.input_layernorm.weight.requires_grad_(False)

    def no_slots_cols(g):
        g = g.clone()
        g[:, T:] = 0
        return g

    def no_slots_rows(g):
        g = g.clone()
        g[T:] = 0
        return g

    model.model.embed_tokens.weight.register_hook(no_slots_cols)
    model.model.layers[0].mlp.down_proj.weight.register_hook(no_slots_rows)
