"""The target's next-token distribution, computed identically on the plain and speculative paths.

Processing order (as vLLM and OpenAI document it): logit bias, presence/frequency penalties on the
tokens generated *along this row's own path*, then temperature, top-k, top-p, softmax.

Randomness is keyed by output position: a request with seed ``s`` draws, for output position ``t``,
one exponential number ``E[t, v]`` per vocabulary entry from ``(s, t)`` alone and takes the token
that wins the race ``argmax_v p(v) / E[t, v]``, which is exactly a draw from ``p`` (the exponential
race, i.e. the Gumbel-max trick; vLLM's sampler draws the same way). So a token drawn at position 7
uses the same noise whether it came from a plain step or from a tree walk. Accept tests of drafts
with a known ``q`` draw from a separate stream keyed by ``(seed, position, attempt)``.

Why a race and not one uniform and the inverse CDF: a multi-token verify pass computes ``p`` with
rounding differences around 1e-6 from a one-token step. The inverse CDF changes its token when the
uniform falls within that distance of any of the vocabulary's boundaries, and there are as many
boundaries as tokens: measured on the embedded target at temperature 1, the inverse CDF gives
different tokens on the two paths with probability 7.5e-4 per position (a 128-token seeded run
differs about one time in ten). The race changes its winner only when the two best scores are
that close: 0 flips in 64,000 draws on the same logits.

Worked example (race): ``p = [0.1, 0.6, 0.3]``, noise ``E = [0.05, 2.0, 0.5]`` -> scores
``[2.0, 0.3, 0.6]`` -> token 0 (an unlikely token wins when its noise is small, as often as ``p`` says).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import torch

from suffixspec.config import SamplingParams


class PositionRNG:
    """Uniform random numbers keyed by (seed, output position[, stream, attempt])."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**63)

    def race(self, position: int, vocab: int) -> torch.Tensor:
        """The exponential noise of output position ``position``: ``[vocab]`` float32 on the CPU, each Exp(1).

        Used by every plain and one-hot draw (:func:`sample_race`, which moves it to the logits' device);
        generated where needed, since a position is sampled once per step that reaches it. Made on the
        CPU from the seed alone, so a seeded request draws the same noise on every device (a GPU's own
        generator would give other numbers: other tokens for the same seed). What that costs on a GPU:
        generating ``vocab`` exponentials here (about 0.3 ms for a 49k vocabulary, 1.5 ms for 262k, on
        this project's CPU) and copying them over (200 KB to 1 MB) once per sampled position.
        """
        noise = np.random.default_rng([self.seed, 2, position]).standard_exponential(vocab, dtype=np.float32)
        return torch.from_numpy(noise)

    def aux(self, position: int, attempt: int) -> float:
        """A uniform for known-q accept tests and residual samples, independent of :meth:`race`."""
        return float(np.random.default_rng([self.seed, 1, position, attempt]).random())


class LogitsProcessor:
    """Turns raw logits rows into processed logits for one request's SamplingParams."""

    def __init__(self, params: SamplingParams, vocab_size: int, device: torch.device | str = "cpu") -> None:
        self.params = params
        self.vocab_size = vocab_size
        self.bias: torch.Tensor | None = None  # [vocab] additive logit bias
        if params.logit_bias:
            bad = [t for t in params.logit_bias if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"logit_bias has token ids outside the vocabulary (size {vocab_size}): {bad[:5]}")
            self.bias = torch.zeros(vocab_size, dtype=torch.float32, device=device)
            ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=device)
            self.bias[ids] = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32, device=device)
        self.uses_penalties = params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)  # generated-token counts

    def observe(self, token: int) -> None:
        """A token was appended to the output (feeds the penalties)."""
        if self.uses_penalties and 0 <= token < self.vocab_size:
            self.counts[token] += 1

    def process(self, logits: torch.Tensor, paths: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        """Processed logits, before temperature: bias and penalties.

        logits: [rows, vocab] float32; ``paths[r]`` = tokens generated along row r's path beyond the
        committed output (the draft tokens between the root and that row), for the penalties.
        """
        out = logits[:, : self.vocab_size].float()  # [rows, vocab]
        if self.bias is not None:
            out = out + self.bias
        if self.uses_penalties:
            counts = self.counts.expand(out.shape[0], -1).clone()  # [rows, vocab]
            if paths is not None and any(paths):
                # each row's path tokens, counted in one indexed add on the counts' device
                rows = [r for r, path in enumerate(paths) for _ in path]
                toks = [tok for path in paths for tok in path]
                index = torch.tensor([rows, toks], dtype=torch.long, device=counts.device)
                counts.index_put_((index[0], index[1]), torch.ones(len(toks), dtype=counts.dtype, device=counts.device),
                                  accumulate=True)
            p = self.params
            out = out - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()
        return out

    def probs(self, processed: torch.Tensor) -> torch.Tensor:
        """Sampling distribution from processed logits: temperature, top-k, top-p, softmax. [rows, vocab]"""
        return warp(processed, self.params)


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p, then softmax in float64, over the last dimension ([..., vocab]).

    The target's sampler and the draft models share it, so a draft's q is processed like p.
    """
    x = logits / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = mass_before >= params.top_p  # keep the smallest prefix whose mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x.double(), dim=-1)


def sample_inverse_cdf(p: torch.Tensor, u: float) -> int:
    """The first token whose cumulative probability exceeds ``u`` times the total mass. p: [vocab].

    The search runs on ``p``'s device (one value read back: the token)."""
    cdf = torch.cumsum(p.double(), dim=-1)
    idx = int(torch.searchsorted(cdf, cdf[-1:] * u, right=True)[0])
    return min(idx, p.shape[-1] - 1)


def sample_race(p: torch.Tensor, noise: torch.Tensor) -> int:
    """The token winning the race ``argmax p / noise`` (p: [vocab] probabilities; noise: [vocab] Exp(1)).

    A token with ``p = 0`` scores 0 and cannot win while any token has mass; the noise is floored
    at the smallest normal float so that a noise of exactly 0 cannot divide by zero. The noise
    (made on the CPU, :meth:`PositionRNG.race`) moves to ``p``'s device and dtype; the division and
    the argmax (ties to the lowest id) are exact IEEE operations on every device, so the same ``p``
    gives the same token anywhere.
    """
    floor = torch.finfo(noise.dtype).tiny
    return int(torch.argmax(p / noise[: p.shape[-1]].to(device=p.device, dtype=p.dtype).clamp_min(floor)))


def greedy_token(processed: torch.Tensor) -> int:
    """Argmax of a processed logits row; ties go to the lowest id (torch.argmax's documented rule)."""
    return int(torch.argmax(processed, dim=-1))
