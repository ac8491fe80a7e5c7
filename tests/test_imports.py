"""No import circles: every ``import`` statement of every module under suffixspec/ (at module level, inside functions, under ``TYPE_CHECKING``: a lazy
import still couples two modules both ways) makes an edge; the graph has no cycle.

Parsed, not imported: the test runs in milliseconds and sees imports that a run would not reach.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# package folder -> its import name: the folder tree is the package tree
PACKAGES = {"suffixspec": "suffixspec"}


# Edges of circles not broken yet, each (importer, imported) where the imported module also imports the
# importer; the test fails once such an edge is gone, so its entry goes too. None left.
KNOWN: set[tuple[str, str]] = set()


def modules() -> dict[str, Path]:
    """Import name -> file, for every module of the package."""
    out = {}
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([name, *parts])] = path
    return out


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules ``module`` imports (``from pkg import sub`` counts as ``pkg.sub`` when it is a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b.c` of a known `a.b`
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_circle():
    known = modules()
    assert "suffixspec.runtimes.engine" in known and "suffixspec.index.store" in known and "suffixspec.bench.run" in known
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "suffixspec.core.runner" in graph["suffixspec.core.scheduler"]  # the parse sees relative imports
    for importer, imported in KNOWN:
        assert imported in graph[importer], f"{importer} no longer imports {imported}: drop it from KNOWN"
        graph[importer].discard(imported)
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


@pytest.mark.parametrize("module,forbidden", [("suffixspec.core.runner", "suffixspec.runtimes.engine"),
                                              ("suffixspec.core.lean", "suffixspec.drafting.proposers"),
                                              *((f"suffixspec.drafting.{m}", f"suffixspec.{up}")
                                                for m in ("policy", "costs", "gates", "budget", "judge")
                                                for up in ("scheduler", "sequence", "proposers"))])
def test_the_loop_depends_one_way(module, forbidden):
    """The numerics and the policy know nothing of the loop or the proposers above them."""
    known = modules()
    assert forbidden not in imports(module, known[module], known)


def private_reaches(source: str) -> list[str]:
    """Where ``source`` takes another module's private name (``_x``, not dunders): ``from m import _x``, or
    ``n._x`` where ``n`` is a name it imported from this package (a module, a class, a function)."""
    tree = ast.parse(source)
    imported: set[str] = set()
    out: list[str] = []
    for node in ast.walk(tree):
        ours = isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("suffixspec"))
        if ours:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"line {node.lineno}: from {node.module or '.'} import {alias.name}")
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("suffixspec"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            out.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return out


def test_private_reaches_finds_both_forms():
    assert private_reaches("from suffixspec.core.lean import LeanForward\nf = LeanForward._attend\n") == [
        "line 2: LeanForward._attend"]
    assert private_reaches("from .weights import _kept, Shape\n") == ["line 1: from weights import _kept"]
    assert private_reaches("import os\nos._exit\nfrom typing import _T\nclass A:\n    def f(self): self._x\n") == []


def test_no_module_takes_another_modules_private_names():
    """A module's underscore names are its own: what another module needs is public (named, documented)."""
    found = {name: hits for name, path in modules().items() if (hits := private_reaches(path.read_text()))}
    assert not found, found
