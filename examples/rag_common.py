"""What the two framework RAG examples share: the model choice, the documentation set, the questions,
a local embedding and the measuring loop.

The documentation set is Node.js's API reference in Markdown, as Debian's ``nodejs`` package installs
it (``/usr/share/doc/nodejs/api/*.md``, 70 files, 4 MB): real third-party documentation nobody here
wrote. The questions ask about functions whose documentation answers them in a sentence, so a good
answer quotes the retrieved section.

The embedding is a hashed bag of words (no model download: nothing but the package registries is
reachable here). Code identifiers stay whole (``path.basename``), so a question naming a function
finds its section.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

NODE_DOCS = Path("/usr/share/doc/nodejs/api")
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_FOLDER = Path("/work/models/smollm2-135m-instruct")  # until the name resolves in suffixspec.loading

QUESTIONS = [
    "What does path.basename() return?",
    "What does path.dirname() return?",
    "What does path.extname() return?",
    "What does path.isAbsolute() determine?",
    "What does path.normalize() do?",
    "What does path.relative() return?",
    "What does os.homedir() return?",
    "What does os.tmpdir() return?",
    "What does os.uptime() return?",
    "What does querystring.escape() do?",
]

EMBED_DIM = 4096
_WORD = re.compile(r"[a-z_$][\w$]*(?:\.[a-z_$][\w$]*)*")
_STOP = set("a an and are as at be by can do does for from how if in is it its of on or that the this to "
            "what when which will with".split())


def default_model() -> str:
    """SmolLM2-135M-Instruct by name when suffixspec knows it, else its converted folder, else the demo."""
    from suffixspec.loading import resolve_model_path

    try:
        if resolve_model_path(SMOLLM2) != SMOLLM2:
            return SMOLLM2
    except FileNotFoundError:
        pass
    return str(SMOLLM2_FOLDER) if (SMOLLM2_FOLDER / "config.json").is_file() else "suffixspec/demo-target"


def hashed_embedding(text: str, dim: int = EMBED_DIM) -> list[float]:
    """A unit vector of hashed word counts (1 + log tf); dotted names count whole and by their parts."""
    words: Counter[str] = Counter()
    for w in _WORD.findall(text.lower()):
        parts = w.split(".")
        words.update(p for p in ([w] + parts if len(parts) > 1 else parts) if p not in _STOP)
    vec = [0.0] * dim
    for w, n in words.items():
        h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
        vec[h % dim] += (1.0 + math.log(n)) * (1 if (h >> 63) & 1 else -1)
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def one_torch_thread() -> None:
    """Benchmarks on a shared machine: one thread, so the pipelines compared get the same share."""
    import torch

    torch.set_num_threads(1)


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def cpu_seconds() -> float:
    """This process's CPU time (all threads: an in-process server's request handling included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class Timing:
    """One pipeline's totals over the questions."""

    tokens: int = 0  # output tokens
    cpu_s: float = 0.0  # process CPU seconds
    wall_s: float = 0.0  # wall-clock seconds
    texts: list[str] = field(default_factory=list)  # the answers, in question order

    def add(self, text: str, tokens: int, cpu_s: float, wall_s: float) -> None:
        self.texts.append(text)
        self.tokens += tokens
        self.cpu_s += cpu_s
        self.wall_s += wall_s

    def rate(self, by: str = "cpu") -> float:
        return self.tokens / (self.cpu_s if by == "cpu" else self.wall_s)


def timed(fn, *args, **kw):  # noqa: ANN001, ANN201 - any callable
    """``(fn(*args, **kw), cpu seconds, wall seconds)``."""
    c, w = cpu_seconds(), time.perf_counter()
    out = fn(*args, **kw)
    return out, cpu_seconds() - c, time.perf_counter() - w
