"""The systems of ``suffixspec bench`` and what they run on: their names (the module docstring of
:mod:`suffixspec.bench.run` says what each is), the models and proposers loaded once for a run (:class:`Bench`,
:func:`load_bench`), and one request's measurements (:class:`Run`).

Example: ``all_systems(("b",))`` -> ``("hf_plain", "hf_prompt_lookup", "hf_assisted", "ours_off", ...,
"hf_assisted:b", "ours_draft_model:b", "llama_plain", ...)``: a second draft model ``b`` adds its own
``hf_assisted`` and ``ours_draft_model``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suffixspec.bench.llama import LLAMA_SYSTEMS

HF_SYSTEMS = ("hf_plain", "hf_prompt_lookup", "hf_assisted")
ARCTIC_SYSTEMS = ("arctic_suffix", "arctic_suffix_best")
# ours_all is judged against the faster of these (assisted generation too when it runs)
BASELINES = ("hf_prompt_lookup", "arctic_suffix_best", "hf_assisted")
DRAFT_SYSTEMS = ("hf_assisted", "ours_draft_model")  # one per draft model (the first's names carry no suffix)
# agent_sessions: ours with the output history in SQLite and ArcticInference's global tree, each once
# without a restart and once restarted half-way (ours reopens its store, theirs starts empty)
SESSION_SYSTEMS = (
    "hf_plain",
    "ours_history",
    "arctic_suffix_best",
    "ours_history_restart",
    "arctic_suffix_best_restart",
)


def baseline(systems: tuple[str, ...]) -> str:
    """What every speedup is taken against: ``transformers`` plain ``generate``, or in a run of llama.cpp
    systems alone, llama.cpp plain (in a separate process of our systems alone: its first system)."""
    for base in ("hf_plain", "llama_plain"):
        if base in systems:
            return base
    return systems[0]


def no_documents() -> tuple[str, ...]:
    """Every drafter source of the registry but the documents: what ``ours_no_documents`` drafts with."""
    from suffixspec.drafting.draft import SOURCE_DOCUMENTS
    from suffixspec.drafting.registry import source_names

    return tuple(d for d in source_names() if d != SOURCE_DOCUMENTS)


# ``ours_no_documents``: every drafter but the documents (what the documents add is ours_all over it)
NO_DOCUMENTS = no_documents()


def our_systems() -> tuple[str, ...]:
    """``ours_off``, ``ours_<drafter>`` for every drafter switch of the engine (the registry's sources),
    ``ours_suffix`` (every suffix-index drafter, no draft model), ``ours_all``."""
    from suffixspec.drafting.registry import source_names

    return (
        "ours_off",
        *(f"ours_{d}" for d in source_names()),
        "ours_suffix",
        "ours_no_documents",
        "ours_all",
    )


def all_systems(extra_drafts: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every system name; ``extra_drafts``: labels of the draft models after the first (``hf_assisted:<label>``,
    ``ours_draft_model:<label>``)."""
    more = tuple(f"{s}:{d}" for d in extra_drafts for s in DRAFT_SYSTEMS)
    return HF_SYSTEMS + our_systems() + ARCTIC_SYSTEMS + more + LLAMA_SYSTEMS


@dataclass
class Run:
    """One request served by one system."""

    seconds: float  # wall time of the whole request (prefill included)
    cpu_s: float  # CPU time of this thread over the request (one torch thread: the whole computation)
    tokens: list[int]  # generated ids
    forwards: int  # target forward passes, prefill included (every system)
    steps: int | None = None  # verify steps (ours only)
    stats: dict[str, Any] = field(default_factory=dict)  # RequestStats.to_dict() (ours only)


@dataclass
class Bench:
    """Models and drafters loaded once for the whole run (or for one phase of it)."""

    target: Any  # LoadedModel
    draft: Any | None  # LoadedModel of the (first) draft model (any tokenizer), or None
    history: bool = False  # drafters learn from earlier requests' outputs
    threads: int | None = None  # torch threads of our engine (None: measured, as a user's engine)
    draft_proposer: Any | None = None
    engine: Any = None
    forwards: Any = None  # ForwardCounter on the target model
    llama: Any = None  # bench.llama.LlamaBench when llama.cpp systems run (same GGUF, same prompt ids)
    drafts: list[Any] = field(default_factory=list)  # LoadedModel per draft model (the first is ``draft``)
    draft_proposers: list[Any] = field(default_factory=list)  # our proposer per draft model
    other_proposers: list[Any] = field(
        default_factory=list
    )  # every other registered drafter the target allows
    proposers: bool = (
        True  # build our draft proposers (a phase of transformers' systems only needs the models)
    )
    # transformers' systems' own float32 copies of the target and drafts where ours run a quantized format (its
    # float weights are released once quantized); None: they share ``target`` / ``drafts``
    hf_target: Any | None = None
    hf_drafts: list[Any] | None = None

    def __post_init__(self) -> None:
        from suffixspec.bench.bench_bridge import ForwardCounter
        from suffixspec.drafting.proposers.draft_model import make_draft_proposer
        from suffixspec.runtimes.engine import Engine

        self.engine = Engine(self.target, prefix_cache_mb=0, threads=self.threads)
        self.forwards = ForwardCounter(self.target.model)
        self.hf_forwards = (
            ForwardCounter(self.hf_target.model) if self.hf_target is not None else self.forwards
        )
        if self.draft is not None and not self.drafts:
            self.drafts = [self.draft]
        self.draft = self.drafts[0] if self.drafts else None
        if self.proposers:
            from suffixspec.drafting.registry import build_available

            self.draft_proposers = [make_draft_proposer(d, self.target) for d in self.drafts]
            self.other_proposers = build_available(
                {"tokenizer": self.target.tokenizer, "target": self.target, "history": self.history},
                exclude=("suffix", "draft_model"),
            )
        self.draft_proposer = self.draft_proposers[0] if self.draft_proposers else None

    def draft_index(self, system: str) -> int:
        """Which of ``drafts`` a system runs (:func:`draft_index`)."""
        return draft_index(system, [model_label(d.name) for d in self.drafts])


def draft_index(system: str, labels: list[str]) -> int:
    """Which draft model a system runs, given the drafts' labels: 0 for the plain names, the label's place for
    ``name:label``. Example: ``draft_index("hf_assisted:b", ["a", "b"])`` -> 1."""
    if ":" not in system:
        return 0
    return labels.index(system.split(":", 1)[1])


def model_label(model: str) -> str:
    """The model's name in the tables: a folder's last part (``models/gemma-3-270m`` -> ``gemma-3-270m``)."""
    return Path(model).name if os.sep in model and Path(model).exists() else model


def draft_names(draft_model: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """``"a,b"`` or a list -> ``["a", "b"]``; None or "none" -> ``[]``."""
    if draft_model is None:
        return []
    names = draft_model.split(",") if isinstance(draft_model, str) else list(draft_model)
    return [n.strip() for n in names if n.strip() and n.strip() != "none"]


def broken_uag(model: str, drafts: list[str], systems: tuple[str, ...]) -> tuple[list[str], str | None]:
    """The ``hf_assisted`` systems whose draft has another vocabulary (so ``transformers`` runs universal assisted
    generation) where the installed release breaks it (:func:`suffixspec.bench.uag.uag_defect`), and why; ``([], None)``
    on the others (then no tokenizer is loaded)."""
    from suffixspec.bench.uag import uag_defect
    from suffixspec.loading import load_tokenizer
    from suffixspec.tokenizer_bridge import TokenBridge

    why = uag_defect()
    assisted = [s for s in systems if s.split(":", 1)[0] == "hf_assisted"]
    if why is None or not assisted or not drafts:
        return [], None
    target, labels = load_tokenizer(model), [model_label(d) for d in drafts]
    broken = [
        s
        for s in assisted
        if not TokenBridge.cached(target, load_tokenizer(drafts[draft_index(s, labels)])).same_vocabulary
    ]
    return broken, why if broken else None


def bench_weights(weights: str, model: str) -> str:
    """The format ``weights`` resolves to for ``model`` on this machine's CPU (``auto`` -> int8 or float32, as a
    user's ``auto`` resolves: a named model whose int8 loses agreement stays float32)."""
    from suffixspec.core.formats import resolve

    return resolve(weights, "cpu", model=model)


def load_bench(
    model: str,
    drafts: list[str],
    history: bool,
    threads: int | str,
    log,
    proposers: bool = True,
    engine: bool = True,
    weights: str = "float32",
    hf: bool = True,
) -> Bench:
    """The models loaded (the target at ``weights``, ``drafts``, and with ``proposers`` our draft proposer per
    draft model; ``hf``: float32 copies for transformers' systems where ``weights`` is quantized), and
    (``engine``) our engine warmed up at its thread count, held from here for every system
    (``threads="auto"``: measured at start, as a user's engine; a count: as given). ``history``: our suffix
    proposers remember earlier outputs; ``log``: where progress lines go (``print``)."""
    import torch

    from suffixspec.core.formats import QUANTIZED, draft_weights
    from suffixspec.loading import load_model

    if threads != "auto" and threads:
        torch.set_num_threads(int(threads))
    fmt = bench_weights(weights, model)
    own = fmt in QUANTIZED and hf  # transformers' systems need float weights of their own
    bench = Bench(
        load_model(model, weights=fmt),
        None,
        history,
        None if threads == "auto" else torch.get_num_threads(),
        drafts=[load_model(d, weights=draft_weights(fmt), draft=True) for d in drafts],
        proposers=proposers,
        hf_target=load_model(model) if own else None,
        hf_drafts=[load_model(d) for d in drafts] if own else None,
    )
    if engine:
        bench.engine.warm_up()  # the lean forward packed (a large model's own weights paged out) now
        bench.engine.threads.hold()  # measured ("auto") or given: one count for every system from here
        torch.set_num_threads(bench.engine.threads.current or torch.get_num_threads())
        log(f"torch threads: {bench.engine.threads.describe()}")
    return bench
