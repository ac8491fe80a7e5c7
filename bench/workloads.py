"""Benchmark workloads built from the held-out standard-library files (never trained on).

Each workload is a list of ``Request``s run in order (the agentic trace relies on the order:
outputs repeat across requests and the output history learns them).

- ``code_edit``: a chat request whose user message is a code file window plus an edit
  instruction; the answer mostly repeats the file. Run twice: without and with ``prediction``
  (the edited file, as code-edit tools send it).
- ``agentic``: a trace of templated requests (same tool preamble, a changing task line and the
  same code under work); the outputs repeat across requests.
- ``rag``: the held-out files are indexed as documents first; each request carries a retrieved
  chunk as a reference and asks the model to go on from it.
- ``open_ended``: the start of a file, continued freely (little repetition: shows the overhead).
"""

from __future__ import annotations

import random
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from suffixspec.training.data import HELDOUT_FILE as HELDOUT  # found in a checkout and in a wheel alike

WORKLOADS = ("code_edit", "code_edit_prediction", "agentic", "rag", "open_ended")


@dataclass
class Request:
    """One benchmark request."""

    prompt: str  # full prompt text (chat template already applied where used)
    max_tokens: int  # generation length cap
    prediction: str | None = None  # code-edit prediction (OpenAI predicted outputs)
    references: list[str] = field(default_factory=list)  # per-request RAG chunks


def heldout_texts(limit_chars: int = 200_000) -> list[tuple[str, str]]:
    """(relative path, text) of the held-out files that have enough code."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rels = [ln.strip() for ln in HELDOUT.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    out = []
    for rel in rels:
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if 1500 <= len(text) <= limit_chars:
            out.append((rel, text))
    return out


def _window(text: str, chars: int, rng: random.Random) -> str:
    """A window of whole lines of about ``chars`` characters, starting at a line that opens a def/class."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.startswith(("def ", "class ", "    def "))] or [0]
    i = rng.choice(starts)
    out = []
    while i < len(lines) and sum(map(len, out)) < chars:
        out.append(lines[i])
        i += 1
    return "".join(out)


def _chat(tokenizer, user: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                         add_generation_prompt=True)


def build(name: str, tokenizer, n: int, max_tokens: int, seed: int = 0) -> tuple[list[Request], list[tuple[str, str]]]:
    """The requests of workload ``name`` and the documents to index first (path, text)."""
    # with and without prediction are the same requests, so their rows compare one to one
    rng = random.Random(f"{name.removesuffix('_prediction')}-{seed}")
    files = heldout_texts()
    rng.shuffle(files)
    if name in ("code_edit", "code_edit_prediction"):
        reqs = []
        for _rel, text in files[:n]:
            code = _window(text, 1200, rng)
            words = sorted({w for w in code.replace("(", " ").split() if w.isidentifier() and len(w) > 3})
            old = rng.choice(words) if words else "value"
            new = old + "_v2"
            edited = code.replace(old, new)
            prompt = _chat(tokenizer, f"{code}\n# Edit: rename {old} to {new}\n")
            reqs.append(Request(prompt, max_tokens, prediction=edited if name == "code_edit_prediction" else None))
        return reqs, []
    if name == "agentic":
        rel, text = files[0]
        code = _window(text, 900, rng)
        tools = "# Tools: read_file(path), write_file(path, text), run_tests()\n"
        tasks = ["add type hints", "fix the docstring", "rename a variable", "add logging", "simplify the loop",
                 "handle errors", "add a test", "format the code"]
        reqs = [Request(_chat(tokenizer, f"{tools}# File {rel}:\n{code}\n# Step {k + 1}: {tasks[k % len(tasks)]}\n"),
                        max_tokens) for k in range(n)]
        return reqs, []
    if name == "rag":
        docs = files[: max(4, n)]
        reqs = []
        for rel, text in docs[:n]:
            chunk = _window(text, 1000, rng)
            head = "".join(chunk.splitlines(keepends=True)[:3])
            prompt = _chat(tokenizer, f"# Retrieved from {rel}:\n{chunk}\n# Question: write it out again\n") + head
            reqs.append(Request(prompt, max_tokens, references=[chunk]))
        return reqs, docs
    if name == "open_ended":
        return [Request(text[:400], max_tokens) for _, text in files[:n]], []
    raise ValueError(f"unknown workload {name!r}; choose from {list(WORKLOADS)}")
