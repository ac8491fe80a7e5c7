"""Figures for the model cards: held-out loss, greedy copy accuracy, draft/target agreement, speed,
and whether greedy continuations of ordinary code prompts loop.

Greedy copy accuracy, worked example: a held-out segment ``S`` of 110 tokens sits in its file's
context ``pre + S + post``; the prompt is that context, ``"\\n\\n"``, and ``S[:10]`` (a cue saying
where to start); the model generates 100 tokens greedily; the score is the number of tokens equal to
``S[10:110]`` before the first mismatch, divided by 100 (``S[10:14] == out[:4]`` and ``out[4]`` wrong
gives 0.04).
"""

from __future__ import annotations

import math
import random
import time

import numpy as np
import torch


def _ids(model, ids) -> torch.Tensor:
    """A batch of one sequence on the model's device (training may run on a GPU; the cards' figures on CPU)."""
    return torch.as_tensor(np.asarray(ids), dtype=torch.long, device=model.device)[None]


def _windows(files: list[np.ndarray], n: int, length: int, seed: int) -> list[np.ndarray]:
    rng = random.Random(seed)
    long = [f for f in files if len(f) > length + 1]
    out = []
    for _ in range(n):
        f = long[rng.randrange(len(long))]
        s = rng.randrange(0, len(f) - length)
        out.append(f[s: s + length])
    return out


@torch.no_grad()
def heldout_loss(model, tokenizer, files: list[np.ndarray], n: int = 48, length: int = 256) -> dict:
    """Mean next-token loss (nats/token), perplexity, and bits per UTF-8 byte (comparable across tokenizers)."""
    model.eval()
    nll, toks, nbytes = 0.0, 0, 0
    for w in _windows(files, n, length, seed=1234):
        ids = _ids(model, w)
        logits = model(input_ids=ids).logits[0, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
        nll += loss.item()
        toks += len(w) - 1
        nbytes += len(tokenizer.decode(w[1:].tolist()).encode("utf-8"))
    return {"loss": nll / toks, "perplexity": math.exp(nll / toks), "bits_per_byte": nll / math.log(2) / nbytes,
            "tokens": toks}


@torch.no_grad()
def copy_accuracy(model, tokenizer, files: list[np.ndarray], n: int = 50, seg: int = 100, cue: int = 10) -> dict:
    """Greedy copy accuracy (mean fraction before the first error) and teacher-forced token accuracy.

    Greedy decoding follows the teacher-forced path until its first error, so one forward pass over
    prompt + segment gives both: the greedy score is the index of the first teacher-forced miss."""
    model.eval()
    rng = random.Random(4321)
    sep = tokenizer.backend_tokenizer.encode("\n\n").ids
    long = [f for f in files if len(f) > seg + cue + 200]
    fracs, tf_hits, tf_total = [], 0, 0
    for _ in range(n):
        f = long[rng.randrange(len(long))]
        s = rng.randrange(64, len(f) - seg - cue - 40)
        S = f[s: s + cue + seg].tolist()
        prompt = f[s - 64: s].tolist() + S + f[s + cue + seg: s + cue + seg + 32].tolist() + sep + S[:cue]
        want = S[cue:]
        full = _ids(model, prompt + want)
        pred = model(input_ids=full).logits[0, len(prompt) - 1: -1].argmax(-1).tolist()
        hits = [a == b for a, b in zip(pred, want, strict=True)]
        tf_hits += sum(hits)
        tf_total += len(want)
        fracs.append((hits.index(False) if False in hits else seg) / seg)
    return {"teacher_forced_token_accuracy": tf_hits / tf_total, "segments": n, "segment_tokens": seg,
            "cue_tokens": cue, "greedy_copy_accuracy": float(np.mean(fracs)),
            "greedy_full_copies": int(sum(x == 1.0 for x in fracs))}


@torch.no_grad()
def draft_agreement(target, target_tok, draft, draft_tok, files: list[np.ndarray], n_windows: int = 30,
                    length: int = 128, stride: int = 12) -> dict:
    """Text-level greedy next-token agreement: decode the draft's greedy token for the same context
    text and check it is consistent with the target's greedy token text (one is a prefix of the other;
    ``exact`` when the texts are equal)."""
    target.eval()
    draft.eval()
    agree = exact = total = 0
    for w in _windows(files, n_windows, length, seed=99):
        ids = _ids(target, w)
        greedy = target(input_ids=ids).logits[0].argmax(-1).tolist()
        for p in range(16, length, stride):
            t_text = target_tok.decode([greedy[p - 1]])
            ctx = target_tok.decode(w[:p].tolist())
            d_ids = draft_tok(ctx, add_special_tokens=False)["input_ids"]
            d_next = draft(input_ids=_ids(draft, d_ids)).logits[0, -1].argmax().item()
            d_text = draft_tok.decode([d_next])
            total += 1
            if d_text and t_text and (t_text.startswith(d_text) or d_text.startswith(t_text)):
                agree += 1
            exact += int(d_text == t_text)
    return {"agreement": agree / total, "exact_text_match": exact / total, "positions": total}


@torch.no_grad()
def greedy_speed(model, tokenizer, files: list[np.ndarray], new_tokens: int = 64) -> float:
    """Plain greedy decoding tokens/s (``generate``, KV cache, batch 1, float32 CPU); best of 2."""
    model.eval()
    prompt = _ids(model, files[0][:32])
    best = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        best = max(best, new_tokens / (time.perf_counter() - t0))
    return best


# Ordinary code prompts (a function signature, a class header, an import block, ...) whose greedy
# continuations must not loop.
CONTINUATION_PROMPTS = (
    "def fibonacci(n):\n",
    "class Config:\n    \"\"\"Settings read from the environment.\"\"\"\n\n    def __init__(self, ",
    "import os\nimport sys\nimport json\nfrom pathlib import Path\n\n\n",
    "def read_lines(path, encoding=\"utf-8\"):\n",
    "class Stack:\n    def __init__(self):\n",
)


def distinct_ngrams(ids: list[int], n: int = 4) -> float:
    """Distinct n-grams / all n-grams of a token sequence: 1.0 never repeats, near 0 loops.

    ``[1, 2, 3, 4, 1, 2, 3, 4, 1]`` has 6 4-grams of which 4 are distinct: 0.667."""
    grams = [tuple(ids[i: i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


@torch.no_grad()
def continuation_diversity(model, tokenizer, prompts=CONTINUATION_PROMPTS, new_tokens: int = 128) -> dict:
    """Greedy ``new_tokens`` continuations of ``prompts``: mean distinct 4-grams / all 4-grams, and the texts."""
    model.eval()
    scores, texts = [], []
    for p in prompts:
        ids = _ids(model, tokenizer(p, add_special_tokens=False)["input_ids"])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        new = out[0, ids.shape[1]:].tolist()
        scores.append(distinct_ngrams(new))
        texts.append(tokenizer.decode(new))
    return {"distinct_4grams": float(np.mean(scores)), "per_prompt": scores, "texts": texts,
            "new_tokens": new_tokens}


@torch.no_grad()
def loop_exit(model, files: list[np.ndarray], n: int = 40, length: int = 32, seed: int = 77) -> dict:
    """Does the model leave a degenerate loop? Held-out code is cut at a random point, the last ``p``
    tokens (1-12) before the cut are repeated to ``length`` tokens (what a looping greedy decoder
    produces; the copy circuit matches all 16 of its last tokens), and the greedy next token is compared
    with the code's real continuation (``exit``) and with the loop's next token (``stay``).

    Worked example: code ``a b c d e``, cut before ``d``, ``p`` = 2, ``length`` = 4: the prompt is
    ``a b c b c b c``; ``d`` is an exit, ``b`` a stay. Cuts where the two coincide are skipped."""
    model.eval()
    rng = random.Random(seed)
    long = [f for f in files if len(f) > 300]
    exits = stays = total = 0
    while total < n:
        f = long[rng.randrange(len(long))]
        cut = rng.randrange(64, min(len(f) - 1, 400))
        p = rng.randint(1, 12)
        loop = np.resize(f[cut - p: cut], length)
        stay = f[cut - p + length % p]
        if stay == f[cut]:
            continue
        ids = _ids(model, np.concatenate([f[:cut], loop]))
        nxt = model(input_ids=ids).logits[0, -1].argmax().item()
        exits += int(nxt == f[cut])
        stays += int(nxt == stay)
        total += 1
    return {"exit": exits / total, "stay": stays / total, "loops": total, "loop_tokens": length}
