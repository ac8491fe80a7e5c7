"""Builders for tiny real tokenizers and tiny random `transformers` models (no network).

Shared by the test fixtures in conftest.py and usable from benchmarks.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import threading
import time
from pathlib import Path

# A small corpus of Python-ish text and prose to train tiny tokenizers on.
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n\tprint(i, i * i)\n",
    "import os\nimport sys\n\nprint(os.path.join('a', 'b'))\n",
    "The quick brown fox jumps over the lazy dog. Héllo wörld! 你好，世界。 🙂🚀\n",
    "Speculative decoding drafts tokens and verifies them in one forward pass.\n",
    "if x is None:\n    raise ValueError('x must be set')\nelse:\n    y = [v for v in x if v]\n",
] * 20


def train_bpe_tokenizer(out_dir: Path, vocab_size: int = 400) -> Path:
    """A byte-level BPE tokenizer (GPT-2 style, with EOS and a chat template) saved for AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return out_dir


def train_unigram_tokenizer(out_dir: Path, vocab_size: int = 300) -> Path:
    """A SentencePiece-style Metaspace/Unigram tokenizer with byte fallback, saved for AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>",
        initial_alphabet=list("abcdefghijklmnopqrstuvwxyz"),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    # the trainer's scores differ in their last digits from run to run and it orders ties as they come, so the
    # same corpus gave different token ids (and a tiny draft model drafting differently) from one test session
    # to the next: the pieces in a fixed order (the special tokens first, as trained), scores rounded
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    specials = [v for v in vocab if v[0] in ("<unk>", "<s>", "</s>")]
    rest = sorted(([t, round(sc, 6)] for t, sc in vocab if t not in ("<unk>", "<s>", "</s>")),
                  key=lambda v: (-v[1], v[0]))
    data["model"]["vocab"] = specials + rest
    data["model"]["unk_id"] = [v[0] for v in specials].index("<unk>")
    tok = Tokenizer.from_str(json.dumps(data))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return out_dir


def build_tiny_model(arch: str, tokenizer_dir: Path, out_dir: Path, seed: int = 0, layers: int = 2,
                     hidden: int = 64) -> Path:
    """A tiny random causal LM of architecture ``arch`` (llama, qwen2, gpt2) saved with the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, LlamaConfig, Qwen2Config

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = len(tok)
    common = dict(vocab_size=vocab, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                  pad_token_id=tok.pad_token_id)
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, **common)
    elif arch == "qwen2":
        cfg = Qwen2Config(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, **common)
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=1024, **common)
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # Random init gives near-uniform logits; scale the output layer up so that the distribution is
    # peaked enough for drafts to be accepted sometimes and for sampling tests to be sharp.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


# Prompts and a logit bias under which a random tiny model's greedy output re-tokenizes to itself.
# a small function the real-model tests ask a model to edit or restate (its answer copies it)
CODE = '''def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order["status"] != "cancelled":
            total += order["amount"]
            count += 1
    average = total / count if count else 0.0
    return {"total": total, "count": count, "average": average}
'''

CANDIDATES = ["class Point:", "def add(a, b):", "import os", "for i in range(10):", "The quick brown"]


def word_bias(tokenizer) -> dict[int, float]:
    """+100 on every token that is a space and letters and encodes alone (" self"): any run of them
    survives decode -> encode, which lone byte tokens of a random model do not."""
    vocab = tokenizer.get_vocab()
    return {i: 100.0 for tok, i in vocab.items() if tok.startswith("\u0120") and tok[1:].isalpha()
            and tokenizer.encode(" " + tok[1:], add_special_tokens=False) == [i]}


def copyable(spec, max_tokens: int) -> tuple[str, str, dict[int, float]]:
    """(prompt, greedy output, logit_bias): with that bias the output re-tokenizes to the same ids, alone
    and after the prompt, so a reference, prediction or document holding the text can draft it."""
    bias = word_bias(spec.tokenizer)
    tok = spec.tokenizer
    for prompt in CANDIDATES:
        res = spec.generate(prompt, max_tokens=max_tokens, temperature=0.0, speculation=False, logit_bias=bias)
        ids = res.token_ids
        joined = tok.encode(prompt + res.text, add_special_tokens=False) == \
            tok.encode(prompt, add_special_tokens=False) + ids
        if tok.encode(res.text, add_special_tokens=False) == ids and joined and len(ids) == max_tokens:
            return prompt, res.text, bias
    raise AssertionError("no candidate prompt gives a re-tokenizable output; add candidates")


def start_server_process(argv: list[str], cwd: Path | str | None = None, env: dict | None = None,
                         timeout: float = 120, where: str = "server") -> tuple[subprocess.Popen, str]:
    """Start ``suffixspec serve`` (any argv) and wait for the address it logs; ``(process, url)``.

    stderr is read on a thread (a full pipe would stall the server); an early exit or no address within
    ``timeout`` seconds fails with what the server printed.
    """
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr] and None, daemon=True)
    reader.start()
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None and not reader.is_alive() and lines.empty():  # exited, all its lines read
                raise AssertionError(f"{where}: the server exited with {proc.returncode}\n{''.join(seen)[-3000:]}") \
                    from None
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"{where}: no address reported in {timeout} s\n{''.join(seen)[-3000:]}") from None
            continue
        seen.append(line)
        m = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if m:
            return proc, m.group(1)
