"""The drafters, each declared in its own file, listed and built by name.

A drafter is one module that declares, at its top level, what it is::

    DRAFTER = Drafter(
        name="suffix",                                    # what configurations and make_proposer call it
        sources=("prompt", "history", "documents", "references", "prediction"),   # its node sources
        uses=("tokenizer", "store", "history"),           # resources it takes when they are there
        order=0,                                          # proposers run in this order within a step
        build=make_suffix_proposer,                       # factory(**resources and settings) -> Proposer
    )

Every module of :data:`PACKAGE` holding such a declaration is a drafter; nothing else names it. From the
declarations come :func:`source_names` (``DRAFTERS``: the names ``speculation.drafters`` may give), the
API's and the server's drafter list, the CLI's choices, the bench's systems, and the proposers the API,
the vLLM adapter and the llama.cpp drafter build (:func:`build_available`: every drafter whose ``needs``
the runtime offers). A drafter outside the package (a plug-in, a test's toy) calls :func:`register` with
its declaration when its module is imported.

The declarations are read from the files, not imported (:func:`_declared`): their ``name``, ``sources``,
``needs``, ``uses`` and ``order`` are literals, so listing the drafters costs a few milliseconds and no
import of torch (a draft model's module needs it; ``import suffixspec.runtimes.vllm`` and the CLI's start must
stay light). A drafter's module is imported when it is built, and its ``DRAFTER`` must then say what its
file said. Worked example::

    source_names()            -> ("prompt", "history", "documents", "references", "prediction", "draft_model")
    drafter_names()           -> ("suffix", "draft_model")
    build_available({"tokenizer": tok, "store": None, "history": True})
                              -> [SuffixProposer]          (draft_model needs "draft" and "target")
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACKAGE = "suffixspec.drafting.proposers"  # the package whose modules are the built-in drafters
# What a runtime may offer a drafter (``needs`` and ``uses`` name these); a factory takes them as keywords
RESOURCES = {
    "tokenizer": "the target's transformers tokenizer",
    "target": "the target model (loading.LoadedModel)",
    "draft": "a draft model (loading.LoadedModel), when the caller names one",
    "store": "the document store and persisted output history (index.store.IndexStore), or None",
    "history": "whether to draft from earlier outputs and keep them (bool), or a shared OutputHistory",
}
_FIELDS = ("name", "sources", "needs", "uses", "order", "offered")  # the literal fields a declaration is read by


@dataclass(frozen=True)
class Drafter:
    """One drafter's declaration (see the module docstring)."""

    name: str  # what configurations, statistics and make_proposer call it
    sources: tuple[str, ...]  # node sources its drafts carry: the names speculation.drafters may give
    needs: tuple[str, ...] = ()  # RESOURCES it cannot draft without: built only where all are offered
    uses: tuple[str, ...] = ()  # RESOURCES it takes when they are offered
    order: int = 50  # proposers run in this order each step (a cheap drafter's draft informs a costly one's)
    build: Callable[..., Any] | None = field(default=None, compare=False)  # factory(**kwargs) -> Proposer
    offered: bool = True  # built by build_available (False: only by name, as register_proposer's doubles)
    module: str | None = field(default=None, compare=False)  # where it is declared (a built-in's module)

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"a drafter's name is an identifier (it names systems and flags), got {self.name!r}")
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "needs", tuple(self.needs))
        object.__setattr__(self, "uses", tuple(self.uses))
        if self.offered and not self.sources:
            raise ValueError(f"drafter {self.name!r} declares no sources; name the node sources its drafts carry")
        unknown = sorted(set(self.needs + self.uses) - set(RESOURCES))
        if unknown:
            raise ValueError(f"drafter {self.name!r} asks for {unknown}; resources are {sorted(RESOURCES)}")


_lock = threading.Lock()
_registered: dict[str, Drafter] = {}  # register()'s drafters, by name
_builtin: dict[str, Drafter] | None = None  # the package's declarations, read once


def register(drafter: Drafter) -> Drafter:
    """Add a drafter declared outside :data:`PACKAGE` (a name already taken is replaced); returns it."""
    if drafter.build is None:
        raise ValueError(f"register({drafter.name!r}) needs build=, the factory of its proposer")
    with _lock:
        _registered[drafter.name] = drafter
    return drafter


def unregister(name: str) -> None:
    """Drop a drafter :func:`register` added (a test's toy, when the test ends)."""
    with _lock:
        _registered.pop(name, None)


def drafters(offered_only: bool = False) -> tuple[Drafter, ...]:
    """Every drafter, in ``order`` (built-ins before registered ones of the same order)."""
    found = {**_builtins(), **_registered}
    out = sorted(found.values(), key=lambda d: (d.order, d.module is None))
    return tuple(d for d in out if d.offered or not offered_only)


def drafter(name: str) -> Drafter:
    """The declaration of ``name``; ValueError naming the known ones otherwise."""
    found = {d.name: d for d in drafters()}
    if name not in found:
        raise ValueError(f"unknown proposer {name!r}; choose one of {', '.join(found)}")
    return found[name]


def drafter_names() -> tuple[str, ...]:
    """Every drafter's name (what ``make_proposer`` builds)."""
    return tuple(d.name for d in drafters())


def source_names() -> tuple[str, ...]:
    """``DRAFTERS``: every offered drafter's node sources, in drafter order, each once."""
    out: list[str] = []
    for d in drafters(offered_only=True):
        out += [s for s in d.sources if s not in out]
    return tuple(out)


def make(name: str, **kwargs: Any) -> Any:
    """Build drafter ``name``'s proposer: ``build(**kwargs)``."""
    return _factory(drafter(name))(**kwargs)


def build_available(resources: Mapping[str, Any], settings: Mapping[str, Mapping[str, Any]] | None = None,
                    exclude: tuple[str, ...] = ()) -> list[Any]:
    """The proposers of every offered drafter whose ``needs`` are all offered (not None) in ``resources``,
    in order, each built with its ``needs`` and the ``uses`` offered, plus ``settings[name]``; drafters
    named in ``exclude`` are left to the caller (who builds them its own way)."""
    out = []
    for d in drafters(offered_only=True):
        if d.name not in exclude and all(resources.get(k) is not None for k in d.needs):
            kwargs = {k: resources[k] for k in d.needs + d.uses if k in resources}
            out.append(_factory(d)(**kwargs, **dict((settings or {}).get(d.name, {}))))
    return out


def _factory(d: Drafter) -> Callable[..., Any]:
    if d.build is not None:
        return d.build
    declared = getattr(importlib.import_module(d.module or ""), "DRAFTER", None)
    if not isinstance(declared, Drafter) or declared != d or declared.build is None:
        raise RuntimeError(f"{d.module}.DRAFTER does not match what its file declares ({d}); declare name, "
                           f"sources, needs, uses and order as literals and build= a factory")
    return declared.build


def _builtins() -> dict[str, Drafter]:
    global _builtin
    if _builtin is None:
        with _lock:
            if _builtin is None:
                _builtin = {d.name: d for d in _declared(PACKAGE)}
    return _builtin


def _declared(package: str) -> list[Drafter]:
    """The ``DRAFTER = Drafter(...)`` declarations of ``package``'s modules, read from their files."""
    spec = importlib.util.find_spec(package)  # (imports its parents, not the package's own modules)
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    out = []
    for folder in folders:
        for path in sorted(Path(folder).glob("*.py")):
            text = path.read_text(encoding="utf-8")
            if "DRAFTER = Drafter(" not in text:
                continue
            for node in ast.parse(text, str(path)).body:
                if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["DRAFTER"]
                        and isinstance(node.value, ast.Call)):
                    given = {k.arg: ast.literal_eval(k.value) for k in node.value.keywords if k.arg in _FIELDS}
                    out.append(Drafter(**given, module=f"{package}.{path.stem}"))
    return out
