"""The `Draft` type: what every proposer returns and what verification consumes.

A draft is a tree of target-vocabulary tokens. Node ``i`` holds ``tokens[i]``; its parent is
``parents[i]`` (``-1`` means "child of the last accepted token", i.e. the tree root). Parents always
come before their children, so a chain ``a b c`` is ``tokens=[a, b, c], parents=[-1, 0, 1]``.

Worked example (two branches after the root)::

    tokens  = [17, 42, 99, 5]
    parents = [-1,  0,  0, 2]   # 17 -> {42, 99}, 99 -> 5
    depths  = [ 1,  2,  2, 3]

``q`` (optional) holds, per node, the draft distribution over the *target* vocabulary that the
node's token was sampled from (siblings share the same row). Nodes without a known ``q``
(suffix-index, references, text-bridged tokens) are verified with the one-hot rule, which is
lossless for any set of children.

``planned`` (drafts with ``q``): the node count the drafter fixed *before* sampling (its length
budget). Whether a draft is verified may not depend on what was sampled (docs/design.md, "Gates and
cuts"): a gate that kept only short sampled chains would keep only chains that stopped after an
unlikely token, and the kept tokens would no longer be distributed as ``q``. So gates judge
:meth:`gate_size`, which is ``planned`` for such drafts and ``len()`` for deterministic ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch stays out of import time for callers that only build drafts
    import torch

# Where a node came from. Streaming chunks and statistics use these names; every drafter declares the
# sources its drafts carry (suffixspec.drafting.registry: source_names() lists them all, the names a request
# may choose with `speculation.drafters`). The ones here are those other modules name.
SOURCE_PROMPT = "prompt"
SOURCE_HISTORY = "history"
SOURCE_DOCUMENTS = "documents"
SOURCE_REFERENCES = "references"
SOURCE_DRAFT_MODEL = "draft_model"
SOURCE_PREDICTION = "prediction"  # the request's code-edit `prediction` (a reference, counted apart for usage)
SOURCE_TARGET = "target"  # a token sampled by the target itself (bonus or correction), never drafted
# A request's `prediction` drafts whenever the request gives one, whether its `speculation.drafters`
# names "prediction" or not (see drafter_allows).
PREDICTION_RULE = "a request's prediction drafts whenever it is given, listed or not"


def drafter_allows(drafters: Sequence[str] | None, source: str) -> bool:
    """Whether a request whose ``speculation.drafters`` is ``drafters`` lets draft nodes of ``source`` in.

    ``None`` allows every source. The prediction is the exception to the list: a client that sends
    ``prediction`` asks for it to be used (OpenAI's predicted outputs have no other switch), and a list
    such as ``["prompt"]`` written to leave out the server's other drafters must not silently drop it.
    To run without it, send no prediction (or ``speculation: false`` for no drafting at all)::

        drafter_allows(("prompt",), "prompt")      -> True
        drafter_allows(("prompt",), "documents")   -> False
        drafter_allows(("prompt",), "prediction")  -> True   (given, so used)
        drafter_allows(None, "documents")          -> True
    """
    return drafters is None or source == SOURCE_PREDICTION or source in drafters


def root_path(parents: Sequence[int], node: int) -> list[int]:
    """The nodes from a child of the root down to ``node`` (none for ``node`` -1), given each node's parent.

    Example: parents ``[-1, 0, 0, 2]``, node 3 -> ``[0, 2, 3]``."""
    out: list[int] = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def node_depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth, given each node's parent (parents before children); a child of the root is at 1.

    Example: parents ``[-1, 0, 0, 2]`` -> ``[1, 2, 2, 3]``."""
    out: list[int] = []
    for par in parents:
        out.append(1 if par < 0 else out[par] + 1)
    return out


def surest_path(draft: Draft) -> list[int]:
    """The nodes of the draft's most probable path from the root: at each node its child with the highest
    ``probs`` (the first child where the draft carries none). Example: parents ``[-1, -1, 0]``, probs
    ``[0.3, 0.6, 0.2]`` -> ``[1]`` (node 1 beats node 0 at the root and has no children); a chain -> every
    node."""
    kids = draft.children()
    out: list[int] = []
    node = -1
    while kids.get(node):
        options = kids[node]
        node = max(options, key=draft.probs.__getitem__) if draft.probs is not None else options[0]
        out.append(node)
    return out


@dataclass
class Draft:
    """A tree of proposed target tokens. An empty draft means "no proposal" (never ``None``)."""

    tokens: list[int] = field(default_factory=list)  # target-vocabulary id per node
    parents: list[int] = field(default_factory=list)  # parent node index per node; -1 = child of the root
    sources: list[str] = field(default_factory=list)  # per node, a source its drafter declares
    q: torch.Tensor | None = None  # [num_nodes, vocab] float: distribution each node was drawn from, or None
    q_known: list[bool] | None = None  # per node: is q[i] meaningful? None means "all" when q is set
    score: float = 0.0  # expected accepted tokens, as estimated by the proposer (used to pick/merge);
    # for a draft with q, fixed before sampling (it orders merges and feeds the gate)
    planned: int | None = None  # drafts with q: nodes planned before sampling (see gate_size)
    # per node, the proposer's estimate that verification accepts it (its path probability: the node and every
    # node above it accepted; they sum to the expected accepted tokens), or None. Deterministic drafts only: a
    # sampled draft's path probabilities depend on what it sampled, and a merge ranked by them would cut by it
    probs: list[float] | None = None

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.parents) != n or len(self.sources) != n:
            raise ValueError(
                f"Draft needs one parent and one source per token: got {n} tokens, "
                f"{len(self.parents)} parents, {len(self.sources)} sources"
            )
        for i, par in enumerate(self.parents):
            if not -1 <= par < i:
                raise ValueError(f"Draft node {i} has parent {par}; parents must come before children (or be -1)")
        if self.q is not None and self.q.shape[0] != n:
            raise ValueError(f"Draft.q has {self.q.shape[0]} rows for {n} nodes; give one row per node")
        if self.q_known is not None and len(self.q_known) != n:
            raise ValueError("Draft.q_known needs one flag per node")
        if self.probs is not None and (len(self.probs) != n or self.q is not None):
            raise ValueError(f"Draft.probs needs one probability per node ({len(self.probs)} for {n}), and a "
                             "draft carrying q has none (its path probabilities depend on what it sampled)")
        if self.planned is not None and self.planned < n:
            raise ValueError(f"Draft.planned ({self.planned}) is below its {n} nodes; plan at least what is drafted")

    def __len__(self) -> int:
        return len(self.tokens)

    def has_q(self, i: int) -> bool:
        """Whether node ``i`` carries a real draft probability row."""
        if self.q is None:
            return False
        return True if self.q_known is None else self.q_known[i]

    def gate_size(self) -> int:
        """The node count a gate may judge: ``planned`` when set (drafts with ``q`` must set it), else ``len()``."""
        if self.planned is not None:
            return self.planned
        if self.q is not None:
            raise ValueError("a draft carrying q needs `planned` (its size fixed before sampling) to be gated")
        return len(self)

    def gate_shape(self) -> tuple[int, int, int] | None:
        """(first branches, most children of a deeper node, depth) of a draft without ``q``, which a
        gate may judge (``gates.DraftGate.ceiling``); None for an empty draft or one with ``q``, whose
        shape is what it sampled. Example: ``Draft.chain([5, 6, 7], "prompt").gate_shape() == (1, 1, 3)``."""
        if self.q is not None or not len(self):
            return None
        kids = self.children()
        deeper = max((len(c) for parent, c in kids.items() if parent >= 0), default=1)
        return len(kids.get(-1, ())), deeper, max(self.depths())

    def depths(self) -> list[int]:
        """Depth of each node; children of the root have depth 1 (:func:`node_depths`)."""
        return node_depths(self.parents)

    def children(self) -> dict[int, list[int]]:
        """Node indices by parent (``-1``: the root's children), in node order."""
        kids: dict[int, list[int]] = {}
        for i, par in enumerate(self.parents):
            kids.setdefault(par, []).append(i)
        return kids

    def child_with(self, children: list[int], token: int) -> int | None:
        """The first of ``children`` whose token is ``token``, or None."""
        for c in children:
            if self.tokens[c] == token:
                return c
        return None

    def follow(self, tokens: Sequence[int]) -> tuple[int, int]:
        """Walk ``tokens`` down the tree from the root: ``(last node reached, tokens matched)``.

        Example: chain ``[5, 6, 9]`` and tokens ``[5, 6, 7]`` -> ``(1, 2)``; a first token no root child
        holds -> ``(-1, 0)``.
        """
        kids = self.children()
        cur, n = -1, 0
        for tok in tokens:
            nxt = self.child_with(kids.get(cur, []), tok)
            if nxt is None:
                break
            cur, n = nxt, n + 1
        return cur, n

    def truncated(self, budget: int) -> Draft:
        """The first ``budget`` nodes (parents precede children, so the result is still a tree)."""
        if budget >= len(self.tokens) and (self.planned is None or self.planned <= budget):
            return self
        q = self.q[:budget] if self.q is not None else None
        known = self.q_known[:budget] if self.q_known is not None else None
        planned = min(self.planned, budget) if self.planned is not None else None
        probs = self.probs[:budget] if self.probs is not None else None
        return Draft(self.tokens[:budget], self.parents[:budget], self.sources[:budget], q, known, self.score,
                     planned, probs)

    def ending_at(self, stop_ids: set[int] | frozenset[int]) -> Draft:
        """The draft without the nodes below a stop token: a request that accepts a stop token ends there,
        so nothing drafted after it can be output, and the pass would compute it for nothing (a suffix copy
        of the prompt crossed the chat template's end of turn into the answer so far, 16-24 tokens a
        HumanEval answer, in one pass of the largest size). The stop node itself stays. Deterministic drafts
        lose their dropped nodes' probabilities from ``score`` (or its share of them, without ``probs``); a
        draft carrying ``q`` keeps ``score`` and ``planned``, fixed before sampling, so no decision reads what
        it sampled, and the walk over the kept nodes is the walk over all of them up to the end of the
        request: the same outcome. Example: chain ``[5, EOS, 7]`` -> ``[5, EOS]``."""
        if not stop_ids or not any(t in stop_ids for t in self.tokens):
            return self
        keep: list[int] = []
        new_index: dict[int, int] = {}
        cut: set[int] = set()  # nodes below a stop token
        for i, par in enumerate(self.parents):
            if par >= 0 and (par in cut or self.tokens[par] in stop_ids):
                cut.add(i)
                continue
            new_index[i] = len(keep)
            keep.append(i)
        if len(keep) == len(self.tokens):
            return self
        parents = [-1 if self.parents[i] < 0 else new_index[self.parents[i]] for i in keep]
        q = self.q[keep] if self.q is not None else None
        known = [self.q_known[i] for i in keep] if self.q_known is not None else None
        probs = [self.probs[i] for i in keep] if self.probs is not None else None
        if self.q is not None:
            score = self.score
        elif probs is not None:
            score = max(0.0, self.score - sum(self.probs[i] for i in sorted(cut)))  # type: ignore[index]
        else:
            score = self.score * len(keep) / len(self.tokens)
        return Draft([self.tokens[i] for i in keep], parents, [self.sources[i] for i in keep], q, known, score,
                     self.planned, probs)

    @staticmethod
    def chain(tokens: list[int], source: str, q: torch.Tensor | None = None, score: float = 0.0,
              planned: int | None = None, probs: list[float] | None = None) -> Draft:
        """A linear draft ``tokens[0] -> tokens[1] -> ...``."""
        return Draft(list(tokens), list(range(-1, len(tokens) - 1)), [source] * len(tokens), q, None, score,
                     planned, probs)
