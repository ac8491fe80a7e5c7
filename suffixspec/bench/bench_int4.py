"""Would a 4-bit weight format pay on this CPU? One model in ``transformers``, every decoder matrix and the
head replaced by a module that runs either this project's int8 product (``RowInt8Weight``, the probe's
kernel) or torch's CPU kernel for 4-bit weights in groups (``torch._weight_int4pack_mm_for_cpu``,
bfloat16 activations, asymmetric min-max groups quantized from the float32 weights). Reported: CPU time of a
one-token step and of a ``--rows``-token pass after a ``--context``-token prompt (one thread, median of
``--repeats``), the two formats interleaved for ``--rounds``; and whether a row's 4-bit product is
bit-identical alone and among the others (the exactness a speculative format needs).

    python -m suffixspec.bench.bench_int4 --model qwen2.5-coder-1.5b-instruct

Figures and what they decided: docs/formats.md ("Why the gguf format has a kernel of its own").
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn

from suffixspec.core.formats import int8_kernel
from suffixspec.core.weights import RowInt8Weight


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed weight, scales and zeros [in / group, out, 2] bfloat16) for ``_weight_int4pack_mm_for_cpu``:
    per group of ``group`` inputs, ``w ~ (q - 8) * scale + zero`` with ``q`` in 0..15 spanning the group's
    minimum to maximum."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15)
    packed = torch._convert_weight_to_int4pack_for_cpu(q.reshape(n, k).to(torch.int32), 1)
    return packed, torch.stack([scale.t(), (lo + 8 * scale).t()], -1).bfloat16().contiguous()


class TwoFormats(nn.Module):
    """A ``Linear`` held at int8 and at 4 bits; ``fmt`` says which one runs."""

    def __init__(self, linear: nn.Linear, group: int, kernel: str) -> None:
        super().__init__()
        w = linear.weight.detach().contiguous()
        self.bias = None if linear.bias is None else linear.bias.detach().clone()
        self.group = group
        self.int8 = RowInt8Weight(w, kernel)
        self.packed, self.scales = quantize_int4(w, group)
        self.fmt = "int8"

    def int4(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int4pack_mm_for_cpu(x.bfloat16(), self.packed, self.group, self.scales).float()
        return y if self.bias is None else y + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y = self.int8.mm(x2, self.bias) if self.fmt == "int8" else self.int4(x2)
        return y.reshape(*x.shape[:-1], y.shape[-1])


def replace_linears(model: nn.Module, group: int, kernel: str) -> list[TwoFormats]:
    out = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, m := TwoFormats(child, group, kernel))
                out.append(m)
    return out


@torch.inference_mode()
def pass_ms(model: nn.Module, ids: torch.Tensor, rows: int, repeats: int) -> dict[int, float]:
    """Median CPU ms of a 1-token and a ``rows``-token pass on the prompt's cache (cropped back each time)."""
    out = model(ids, use_cache=True)
    cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    res = {}
    for k in (1, rows):
        times = []
        for _ in range(repeats):
            t = time.thread_time()
            model(nxt.repeat(1, k), past_key_values=cache, use_cache=True)
            times.append(time.thread_time() - t)
            cache.crop(-k)
        res[k] = 1e3 * sorted(times)[repeats // 2]
    return res


def rows_alone_equal(m: TwoFormats, rows: int) -> bool:
    x = torch.randn(rows, m.scales.shape[0] * m.group)  # [rows, in]
    together = m.int4(x)
    return all(torch.equal(m.int4(x[i:i + 1])[0], together[i]) for i in range(rows))


def main(argv: list[str] | None = None) -> None:
    from suffixspec.loading import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--group", type=int, default=128, help="inputs per 4-bit group (32, 64, 128, 256)")
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--rows", type=int, default=17, help="tokens in the verify-sized pass")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    lm = load_model(args.model, weights="float32")
    mods = replace_linears(lm.model, args.group, int8_kernel())
    text = " ".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n" for i in range(200))
    ids = torch.tensor([lm.tokenizer.encode(text)[: args.context]])
    print(f"{args.model}: {len(mods)} matrices, 4-bit groups of {args.group}; a row alone == the row among "
          f"{args.rows}: {all(rows_alone_equal(m, args.rows) for m in mods[:8])} (first 8 matrices)")
    for r in range(args.rounds):
        for fmt in ("int8", "int4"):
            for m in mods:
                m.fmt = fmt
            ms = pass_ms(lm.model, ids, args.rows, args.repeats)
            print(f"round {r} {fmt}: step {ms[1]:.1f} ms, {args.rows}-token pass {ms[args.rows]:.1f} ms "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
