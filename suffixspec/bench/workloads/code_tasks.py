"""The coding workloads: ``code_edit`` (and ``code_edit_prediction``), ``agentic`` (and ``agent_sessions``'s
sessions), ``humaneval_chat`` and ``humaneval``, and ``repo_code`` (the package docstring says what each asks
and answers)."""

from __future__ import annotations

import ast
import importlib.util
import random
import re
from collections import Counter
from pathlib import Path

from suffixspec.bench.workloads.request import Request, chat, fence, fits, user_request
from suffixspec.bench.workloads.sources import (
    REPO_PACKAGE,
    Function,
    code_files,
    functions,
    humaneval_problems,
    package_root,
)


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


def code_edit(
    tokenizer, n: int, max_tokens: int, prediction: bool, max_prompt_tokens: int | None
) -> list[Request]:
    reqs = []
    for fn, old, new, edited in _edits(
        n, "code_edit", lambda fn: fits(tokenizer, fn.code, max_prompt_tokens)
    ):
        user = (
            f"Here is `{fn.name}` from `{fn.path}`:\n\n{fence(fn.code)}\n\nRename `{old}` to `{new}` and "
            f"change nothing else. Reply with the whole edited function in one Python code block."
        )
        answer = fence(edited)
        req = user_request(
            tokenizer,
            user,
            max_tokens,
            max_prompt_tokens,
            prediction=answer if prediction else None,
            answer=answer,
        )
        if req is not None:
            reqs.append(req)
    return reqs


_AGENT = (
    "You are a coding agent in a Python repository. Call exactly one tool per turn, as JSON on one line: "
    '{"name": ..., "arguments": {...}}. Tools: search(pattern) lists the matching lines of the '
    "repository; read_file(path, function) returns a function's source; write_file(path, function) "
    "replaces it with the Python code block that follows the call; finish(summary) ends the task."
)


def _grep(old: str, path: str, limit: int = 12) -> str:
    """Lines of the function's package that mention ``old`` (``path:line: text``), the search tool's answer."""
    pkg = path.split("/", 1)[0]
    spec = importlib.util.find_spec(pkg)
    root = (
        Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None
    )
    hits = []
    for file in sorted(root.rglob("*.py")) if root else []:
        for i, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if re.search(rf"\b{old}\b", line):
                hits.append(f"{pkg}/{file.relative_to(root).as_posix()}:{i}: {line.strip()}")
    return "\n".join(hits[:limit]) or "no matches"


def agentic(tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None) -> list[Request]:
    """Sessions of four assistant turns (search, read, write back, finish), one request per turn (a
    session ends early where its conversation outgrows ``max_prompt_tokens``)."""
    import json

    reqs: list[Request] = []
    for fn, old, new, edited in _edits((n + 3) // 4, "agentic"):
        call = lambda name, **args: json.dumps({"name": name, "arguments": args})  # noqa: E731
        turns = [
            (call("search", pattern=old), f"Tool result:\n{_grep(old, fn.path)}"),
            (call("read_file", path=fn.path, function=fn.name), f"Tool result:\n{fence(fn.code)}"),
            (
                call("write_file", path=fn.path, function=fn.name) + "\n" + fence(edited),
                f"Tool result:\nwrote {len(edited.splitlines())} lines to {fn.path}",
            ),
            (call("finish", summary=f"Renamed `{old}` to `{new}` in `{fn.name}` ({fn.path})."), ""),
        ]
        messages = [
            {"role": "system", "content": _AGENT},
            {"role": "user", "content": f"Rename `{old}` to `{new}` in `{fn.name}` in `{fn.path}`."},
        ]
        for answer, result in turns:
            prompt = chat(tokenizer, messages)
            if not fits(tokenizer, prompt, max_prompt_tokens):
                break
            reqs.append(Request(prompt, max_tokens, answer=answer))
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": result}]
    return reqs[:n]


def humaneval_chat(tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None) -> list[Request]:
    """The first ``n`` problems in order (HumanEval/0, /1, ...), as a chat request each."""
    reqs = []
    for problem in humaneval_problems():
        if len(reqs) == n:
            break
        user = f"Complete the following Python function.\n\n```python\n{problem['prompt']}```"
        answer = fence(problem["prompt"] + problem["canonical_solution"])
        req = user_request(tokenizer, user, max_tokens, max_prompt_tokens, answer=answer)
        if req is not None:
            reqs.append(req)
    return reqs


def humaneval(tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None) -> list[Request]:
    """The first ``n`` HumanEval problems' prompts, as completions (no chat template: the model goes on
    writing the function), answered by their canonical solutions."""
    return [
        Request(p["prompt"], max_tokens, answer=p["canonical_solution"])
        for p in humaneval_problems()
        if fits(tokenizer, p["prompt"], max_prompt_tokens)
    ][:n]


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
                source = "".join(text.splitlines(keepends=True)[start - 1 : node.end_lineno])
                candidates.append(
                    (rel, node.name, ast.unparse(node.args), " ".join(doc.split("\n\n")[0].split()), source)
                )
    rng.shuffle(candidates)
    tasks, used, held = [], set(), set()
    for rel, name, args, summary, source in candidates:
        if rel in used:
            continue
        kind = ("function", "test")[len(tasks) % 2]
        test = (
            f"{rel.rsplit('/', 1)[0]}/tests/test_{rel.rsplit('/', 1)[-1]}"
            if "/" in rel
            else f"tests/test_{rel}"
        )
        if kind == "function":
            answer = fence(source)
        else:
            answer = _tests_calling(root / test, name)
            if not answer:  # no test of it in the package to compare with: another function
                continue
        used.add(rel)
        held.update((rel, test) if kind == "function" else (test,))
        tasks.append(
            (
                kind,
                f"{pkg}/{rel}" if kind == "function" else f"{pkg}/{test}",
                f"{name}({args})",
                summary,
                answer,
            )
        )
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
    parts = [
        "".join(lines[n.lineno - 1 : n.end_lineno])
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
    ]
    body = [
        n
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.ClassDef))
        and n.name.lower().startswith("test")
        and re.search(rf"\b{re.escape(name)}\b", ast.get_source_segment(text, n) or "")
    ]
    if not body:
        return ""
    for n in body:
        start = min([n.lineno] + [d.lineno for d in n.decorator_list])
        parts.append("\n\n" + "".join(lines[start - 1 : n.end_lineno]))
    return fence("".join(parts))


def repo_code(
    tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None
) -> tuple[list[Request], list[tuple[str, str]]]:
    root = package_root(REPO_PACKAGE)
    if root is None:
        raise RuntimeError(
            f"repo_code writes code in {REPO_PACKAGE}, which is not installed: pip install "
            f"'suffixspec[bench]' (or pip install {REPO_PACKAGE})"
        )
    tasks, held = _repo_tasks(root, n)
    reqs = []
    for kind, path, signature, summary, answer in tasks:
        if kind == "function":
            user = (
                f"Add a function to {REPO_PACKAGE}, in `{path}`:\n\n```python\ndef {signature}:\n"
                f'    """{summary}"""\n```\n\nWrite the complete function as {REPO_PACKAGE} would: the imports '
                "it needs, its decorators, a numpydoc docstring (Parameters, Returns, Examples) and the body. "
                "Reply with one Python code block."
            )
        else:
            user = (
                f"Write pytest tests for {REPO_PACKAGE}'s `{signature}` ({summary}), in `{path}`, in the style "
                f"of {REPO_PACKAGE}'s own tests. Reply with one Python code block."
            )
        prompt = chat(tokenizer, [{"role": "user", "content": user}])
        if fits(tokenizer, prompt, max_prompt_tokens):
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
