"""Corpus, tokenizers and training examples for the embedded default models.

The training corpus is the Python standard library's own source plus the sources of a few large
installed packages (``TRAIN_PACKAGES``: torch, transformers, numpy, ...), each capped and chosen by a
hash of the file path so the same files are picked on every machine with the same versions. A fixed
list of standard-library files (``heldout.txt`` next to this module) is never trained on; benchmarks use
it. The model cards' headline figures are measured on the sources of *other* installed packages
(``EVAL_PACKAGES``: flask, click, werkzeug, jinja2, ...), code neither model has seen in any form.

Copy examples teach the models to reproduce text that appeared earlier in their context, which is
what code edits and RAG need. A token example of a code copy (ids shown as text)::

    W = ["def", " f", "(x", "):\n", "    return", " x"]          # a code window
    seq = W + ["<|im_end|>", "\n"] + W[2:] + <more code>        # copy of W from offset 2
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from pathlib import Path

import numpy as np

HELDOUT_FILE = Path(__file__).parent / "heldout.txt"
SPECIAL_TARGET = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SPECIAL_DRAFT = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Texts put between a code window and its copy (the copy follows as a continuation, an answer, ...).
COPY_SEPARATORS = [
    "\n\n",
    "\n# ---\n",
    "\n\n# The same code again:\n",
    "\n'''\n",
    "<|im_end|>\n<|im_start|>assistant\n",
]


# Installed packages trained on, with a cap on the bytes taken from each (None: all of it).
TRAIN_PACKAGES: dict[str, int | None] = {"torch": 10_000_000, "transformers": 10_000_000, "numpy": None,
                                         "scipy": 5_000_000, "sympy": 5_000_000, "networkx": None}
# Installed packages never trained on: the held-out evaluation code (the Pallets family and friends).
EVAL_PACKAGES = ("flask", "click", "werkzeug", "jinja2", "itsdangerous", "markupsafe", "blinker")


def _skip(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in ("site-packages", "test", "tests", "testing", "idle_test", "_vendor", "vendored") for p in parts)


def package_files(name: str, cap: int | None) -> list[Path]:
    """The .py files of an installed package (no tests, nothing over 400 kB), at most ``cap`` bytes in
    all: files are taken in the order of a hash of their path inside the package, so the choice is the
    same on every machine with the same version installed. Empty when the package is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(list(spec.submodule_search_locations)[0])
    files = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).as_posix()
        size = p.stat().st_size
        if _skip(rel) or size > 400_000 or size < 200:
            continue
        files.append((hashlib.md5(rel.encode()).hexdigest(), rel, p, size))
    files.sort()
    out, total = [], 0
    for _, _, p, size in files:
        if cap is not None and total + size > cap:
            continue
        out.append(p)
        total += size
    return sorted(out)


def package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def read_paths(paths: list[Path]) -> list[str]:
    out = []
    for p in paths:
        try:
            out.append(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return out


def stdlib_files() -> list[str]:
    """Relative paths of the standard library's .py files (no tests, no site-packages), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).as_posix()
        if _skip(rel):
            continue
        if p.stat().st_size > 400_000:
            continue
        out.append(rel)
    return sorted(out)


def split_files(files: list[str]) -> tuple[list[str], list[str]]:
    """(train, heldout). The held-out list is read from heldout.txt; if absent, about 4% of the files
    chosen by a hash of their path (stable across machines) are written there."""
    if HELDOUT_FILE.exists():
        held = [ln.strip() for ln in HELDOUT_FILE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    else:
        held = [f for f in files if int(hashlib.md5(f.encode()).hexdigest(), 16) % 25 == 0]
        HELDOUT_FILE.write_text(
            "# Held-out standard-library files (relative to sysconfig stdlib); never trained on.\n"
            + "\n".join(held) + "\n"
        )
    hs = set(held)
    return [f for f in files if f not in hs], [f for f in held if f in set(files)]


def read_texts(rels: list[str]) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for rel in rels:
        try:
            out.append((root / rel).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return out


def train_target_tokenizer(texts: list[str], vocab_size: int = 8192):
    """Byte-level BPE (GPT-2 style pre-tokenization), EOS, ChatML-style chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TARGET,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", model_max_length=2048)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def train_draft_tokenizer(texts: list[str], vocab_size: int = 2048):
    """Character-level BPE over Metaspace (``▁`` for spaces, SentencePiece style), split into words,
    runs of indentation and newlines: a different vocabulary *and* different pre-tokenization from
    the target's byte-level BPE. ``"    return x"`` -> ``▁▁▁`` ``▁return`` ``▁x``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False),
        pre_tokenizers.Split(Regex(r"▁?[^▁\n]+|▁+(?=▁[^▁\n])|▁+|\n+"), behavior="isolated"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_DRAFT, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>", model_max_length=2048)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def encode_files(tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Token ids of each file followed by EOS."""
    eos = tokenizer.eos_token_id
    enc = tokenizer.backend_tokenizer.encode_batch(texts)
    return [np.array(e.ids + [eos], dtype=np.int64) for e in enc]


class ExampleMaker:
    """Builds training sequences (ids, loss mask) of a fixed length from encoded files."""

    def __init__(self, tokenizer, files: list[np.ndarray], seq_len: int, seed: int):
        self.rng = random.Random(seed)
        self.seq_len = seq_len
        self.vocab = len(tokenizer)
        self.stream = np.concatenate(files)
        self.files = [f for f in files if len(f) >= 64]
        self.seps = [np.array(tokenizer.backend_tokenizer.encode(s).ids, dtype=np.int64) for s in COPY_SEPARATORS]
        self.user_open = np.array(tokenizer.backend_tokenizer.encode("<|im_start|>user\n").ids, dtype=np.int64)
        self.end = np.array(tokenizer.backend_tokenizer.encode("<|im_end|>\n").ids, dtype=np.int64)
        self.assistant_open = np.array(tokenizer.backend_tokenizer.encode("<|im_start|>assistant\n").ids,
                                       dtype=np.int64)
        self.first_id = len(SPECIAL_TARGET)  # ids below are special tokens
        # A fixed small alphabet for the induction-forming phase: frequent code tokens.
        counts = np.bincount(self.stream, minlength=self.vocab)
        counts[: self.first_id + 2] = 0
        self.alphabet = np.argsort(-counts)[:64].copy()

    def _window(self, n: int) -> np.ndarray:
        start = self.rng.randrange(0, len(self.stream) - n)
        return self.stream[start: start + n]

    def code_lm(self, keep: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """A window of code; loss on a random ``keep`` fraction of positions (saves output-layer time)."""
        ids = self._window(self.seq_len)
        return ids, np.array([self.rng.random() < keep for _ in range(self.seq_len)])

    def loop_break(self) -> tuple[np.ndarray, np.ndarray]:
        """A window of code with a degenerate loop spliced in, the way greedy decoding gets stuck: at a
        cut, the last ``p`` tokens (1-12) repeated until the loop is 24-64 tokens long, then the code
        goes on as it was. Loss on the code before and after, never on the loop: the model learns to
        leave a loop (the copy circuit matches all 16 tokens of it, so only the rest of the model can).

        Worked example (p = 3, tokens as text): ``["a", "(n", "):", "\n"]`` cut after ``"):"`` gives
        ``a (n ): \n`` -> ``a (n ): (n ): a (n ): ... \n`` with the loss mask off on the repeats."""
        n = self.seq_len
        w = self._window(n)
        p = self.rng.randint(1, 12)
        length = self.rng.randint(max(24, 2 * p), 64)
        cut = self.rng.randrange(max(p, 32), n - 64)
        loop = np.resize(w[cut - p: cut], length)  # the last p tokens, repeated, cut to length
        ids = np.concatenate([w[:cut], loop, w[cut:]])[:n]
        mask = np.ones(n, dtype=bool)
        mask[cut: cut + length] = False  # a loop token is never a target; the first token after it is
        return ids, mask

    def random_copy(self, symbols: np.ndarray | None, copies: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Random tokens with ``copies`` segments repeated later at random offsets; loss on the copies."""
        n = self.seq_len
        if symbols is None:
            ids = np.array([self.rng.randrange(self.first_id, self.vocab) for _ in range(n)], dtype=np.int64)
        else:
            ids = symbols[np.array([self.rng.randrange(len(symbols)) for _ in range(n)])]
        mask = np.zeros(n, dtype=bool)
        span = n // copies
        for c in range(copies):
            lo = c * span
            seg = self.rng.randint(max(8, span // 8), span * 2 // 5)
            a = lo + self.rng.randrange(0, span - 2 * seg)
            b = self.rng.randrange(a + seg, lo + span - seg + 1)
            ids[b: b + seg] = ids[a: a + seg]
            mask[b + 1: b + seg] = True  # the first copied token is not predictable
        return ids, mask

    def _edit(self, seg: np.ndarray) -> np.ndarray:
        """A copy with a few small edits (replace, insert or delete a short span): copying must resume."""
        seg = seg.copy()
        for _ in range(self.rng.randint(1, 3)):
            if len(seg) < 20:
                break
            i = self.rng.randrange(0, len(seg) - 10)
            k = self.rng.randint(1, 8)
            kind = self.rng.random()
            new = self._window(self.rng.randint(1, 8))
            if kind < 0.4:
                seg = np.concatenate([seg[:i], new, seg[i + k:]])
            elif kind < 0.7:
                seg = np.concatenate([seg[:i], new, seg[i:]])
            else:
                seg = np.concatenate([seg[:i], seg[i + k:]])
        return seg

    def code_copy(self) -> tuple[np.ndarray, np.ndarray]:
        """[code window W] [separator] [W from an offset, maybe edited] [more code]; loss everywhere."""
        n = self.seq_len
        m = self.rng.randint(40, n * 5 // 11)
        f = self.files[self.rng.randrange(len(self.files))]
        if len(f) > m:
            s = self.rng.randrange(0, len(f) - m)
            w = f[s: s + m]
        else:
            w = f
        off = 0 if self.rng.random() < 0.5 else self.rng.randrange(0, len(w) // 2)
        copy = w[off:]
        if self.rng.random() < 0.3:
            copy = self._edit(copy)
        if self.rng.random() < 0.3:
            parts = [self.user_open, w, self.end, self.assistant_open, copy, self.end]
        else:
            parts = [w, self.seps[self.rng.randrange(len(self.seps))], copy]
        ids = np.concatenate(parts)[:n]
        if len(ids) < n:
            ids = np.concatenate([ids, self._window(n - len(ids))])
        return ids, np.ones(n, dtype=bool)
