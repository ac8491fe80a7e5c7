"""Engine overheads on CPU (issue 2's figures), measured side by side in one run.

1. Verify cost: one target forward over ``1 + k`` tokens (a chain draft with the tree mask),
   k = 1..32, relative to one plain decode step at the same context length.
2. Plain decoding throughput: the engine with no proposers against ``transformers``
   ``generate`` (greedy, same model, same prompts), interleaved runs, medians. The engine should
   be within 10% of ``generate``.

    python -m suffixspec.bench.bench_engine [--model suffixspec/demo-target] [--tokens 128] [--repeats 3]

With no model available (or ``--random``), a random Llama of 6 layers x 256 (about 7M parameters)
is built in a temporary folder, the size of the embedded demo target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n",
    "class LRUCache:\n    def __init__(self, capacity):\n        self.capacity = capacity\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


def _random_model_dir() -> str:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from tiny import build_tiny_model, train_bpe_tokenizer

    root = Path(tempfile.mkdtemp(prefix="suffixspec-bench-"))
    tok = train_bpe_tokenizer(root / "tok", vocab_size=400)
    return str(build_tiny_model("llama", tok, root / "model", layers=6, hidden=256))


def verify_cost(engine, context_len: int = 200, ks=(1, 2, 4, 8, 16, 24, 32), repeats: int = 20) -> dict:
    """Median seconds of a verify pass of ``1 + k`` tokens over ``repeats`` (``bench_limits.verify_pass``),
    relative to a plain step's."""
    from suffixspec.bench.bench_limits import verify_pass

    once = verify_pass(engine, context_len)

    def run(k: int) -> float:
        return statistics.median(once(k) for _ in range(repeats))

    run(0)  # warm-up
    base = run(0)
    return {"plain_step_ms": base * 1e3, "relative": {k: run(k) / base for k in ks}}


def throughput(engine, tokens: int, repeats: int) -> dict:
    from suffixspec.config import SamplingParams

    model, tok = engine.model, engine.tokenizer
    sp = SamplingParams(max_tokens=tokens, ignore_eos=True)
    ours, theirs, same = [], [], []
    for _ in range(repeats):
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            t = time.perf_counter()
            with torch.inference_mode():
                hf = model.generate(ids, do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens)
            theirs.append(tokens / (time.perf_counter() - t))
            t = time.perf_counter()
            res = engine.generate(ids[0].tolist(), sp, speculation=False)
            ours.append(len(res.token_ids) / (time.perf_counter() - t))
            same.append(hf[0, ids.shape[1]:].tolist() == res.token_ids)
    return {
        "engine_tokens_per_s": statistics.median(ours),
        "generate_tokens_per_s": statistics.median(theirs),
        "ratio_engine_over_generate": statistics.median(ours) / statistics.median(theirs),
        "identical_outputs": f"{sum(same)}/{len(same)}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target model (default: embedded demo target if present)")
    ap.add_argument("--random", action="store_true", help="use a random 6x256 Llama instead")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()

    from suffixspec.loading import load_model, resolve_model_path
    from suffixspec.models import DEMO_TARGET
    from suffixspec.runtimes.engine import Engine

    name = args.model
    if name is None and not args.random:
        try:
            resolve_model_path(DEMO_TARGET)
            name = DEMO_TARGET
        except FileNotFoundError:
            name = None
    if name is None:
        name = _random_model_dir()
    engine = Engine(load_model(name), threads=torch.get_num_threads())  # torch's count, as printed
    n_params = sum(p.numel() for p in engine.model.parameters())
    print(f"model: {name} ({n_params / 1e6:.1f}M parameters, {torch.get_num_threads()} threads)")
    vc = verify_cost(engine)
    print(f"plain decode step: {vc['plain_step_ms']:.2f} ms at context 200")
    print("| draft tokens k | verify time / plain step |\n|---:|---:|")
    for k, r in vc["relative"].items():
        print(f"| {k} | {r:.2f} |")
    tp = throughput(engine, args.tokens, args.repeats)
    print(f"engine (no proposers): {tp['engine_tokens_per_s']:.1f} tok/s; transformers generate: "
          f"{tp['generate_tokens_per_s']:.1f} tok/s; ratio {tp['ratio_engine_over_generate']:.3f}; "
          f"identical outputs {tp['identical_outputs']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": name, "verify": vc, "throughput": tp}, indent=2))


if __name__ == "__main__":
    main()
