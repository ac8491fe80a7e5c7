"""A retrieval-augmented generation pipeline on suffixspec, offline.

A toy retriever picks the chunks that share the most words with the question; the chunks go to
`generate(references=...)`, so the suffix drafter can propose the passages the model copies.
The same request without speculation shows the output is identical and how many target forward
passes speculation saved.

    python examples/rag_pipeline.py                          # embedded demo models
    python examples/rag_pipeline.py --model path/to/model --draft-model none
"""

from __future__ import annotations

import argparse
import re

from suffixspec import SuffixSpec

CHUNKS = [
    "def read_config(path):\n    with open(path) as f:\n        return json.load(f)\n",
    "def write_config(path, config):\n    with open(path, 'w') as f:\n        json.dump(config, f, indent=2)\n",
    "class Cache:\n    def __init__(self, size):\n        self.size = size\n        self.items = {}\n",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
]


def retrieve(question: str, chunks: list[str], k: int = 2) -> list[str]:
    """The k chunks sharing the most words with the question (stands in for a vector store)."""
    words = set(re.findall(r"\w+", question.lower()))
    return sorted(chunks, key=lambda c: -len(words & set(re.findall(r"\w+", c.lower()))))[:k]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="suffixspec/demo-target")
    ap.add_argument("--draft-model", default="auto")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    # db=":memory:" keeps this example's documents out of your persistent index.
    with SuffixSpec(model=args.model, draft_model=args.draft_model, db=":memory:") as spec:
        # A persistent corpus (what `suffixspec index add` or POST /v1/index/documents fill) ...
        spec.add_documents([{"text": c, "source": f"chunk{i}.py"} for i, c in enumerate(CHUNKS)])
        # ... and per-request references: the retriever's chunks for this question.
        prompt = "# Save the configuration as JSON.\ndef write_config(path, config):\n"
        refs = retrieve(prompt, CHUNKS)

        fast = spec.generate(prompt, references=refs, max_tokens=args.max_tokens)
        plain = spec.generate(prompt, speculation=False, max_tokens=args.max_tokens)
        s = fast.stats.to_dict()
        print(prompt + fast.text)
        print("---")
        print(f"identical to plain decoding: {fast.token_ids == plain.token_ids}")
        print(f"target forward passes: {s['steps']} with speculation, {plain.stats.steps} without")
        print(f"mean accepted length: {s['mean_accepted_length']:.2f} tokens/step; "
              f"acceptance rate {s['acceptance_rate']:.0%}")
        for source, d in s["per_source"].items():
            print(f"  {source:<12} drafted {d['drafted']:>4}  accepted {d['accepted']:>4}")

        print("--- streaming, with provenance:")
        for ev in spec.stream(prompt, references=refs, max_tokens=args.max_tokens // 2):
            print("".join(f"[{src}]{text}" if src != "target" else text for text, src in ev.pieces), end="")
        print()


if __name__ == "__main__":
    main()
