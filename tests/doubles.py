"""Test doubles of proposers: an oracle that knows the plain output, an always-wrong one, a random tree.

They exercise verification (full acceptance, full rejection, arbitrary tree shapes); the package's
factory does not know them (a test that wants one by name registers it: ``register_proposer``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from suffixspec.drafting.draft import SOURCE_DRAFT_MODEL, Draft
from suffixspec.drafting.proposers import Proposer, RequestContext


class OracleProposer(Proposer):
    """Proposes the continuation of a known reference sequence (e.g. the plain greedy output).

    With ``corrupt_every=k`` every k-th drafted token is replaced by a wrong one, so drafts are
    accepted partly. ``branch`` adds a wrong sibling next to every correct node (a tree draft).
    """

    name = "oracle"

    def __init__(self, expected: Sequence[int], vocab_size: int, corrupt_every: int = 0, branch: bool = False,
                 source: str = SOURCE_DRAFT_MODEL) -> None:
        self.expected = list(expected)
        self.vocab_size = vocab_size
        self.corrupt_every = corrupt_every
        self.branch = branch
        self.source = source
        self._prompt_len = 0

    def begin(self, request: RequestContext) -> None:
        self._prompt_len = len(request.prompt_ids)

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        done = len(context) - self._prompt_len
        want = self.expected[done : done + (budget // 2 if self.branch else budget)]
        tokens: list[int] = []
        parents: list[int] = []
        prev = -1
        for k, tok in enumerate(want):
            good = tok
            if self.corrupt_every and (done + k) % self.corrupt_every == self.corrupt_every - 1:
                good = (tok + 1) % self.vocab_size
            if self.branch:  # a wrong sibling first, so the correct child is not always node 0
                tokens.append((good + 7) % self.vocab_size)
                parents.append(prev)
            tokens.append(good)
            parents.append(prev)
            prev = len(tokens) - 1
        return Draft(tokens, parents, [self.source] * len(tokens), score=float(len(want)))


class WrongProposer(Proposer):
    """Always proposes tokens that differ from ``avoid`` (e.g. the plain output): nothing is accepted."""

    name = "wrong"

    def __init__(self, avoid: Sequence[int], vocab_size: int, length: int = 4) -> None:
        self.avoid = list(avoid)
        self.vocab_size = vocab_size
        self.length = length
        self._prompt_len = 0

    def begin(self, request: RequestContext) -> None:
        self._prompt_len = len(request.prompt_ids)

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        done = len(context) - self._prompt_len
        tok = self.avoid[done] if done < len(self.avoid) else 0
        wrong = [(tok + 1 + k) % self.vocab_size for k in range(min(self.length, budget))]
        if wrong and wrong[0] == tok:
            wrong[0] = (tok + 2) % self.vocab_size
        return Draft.chain(wrong, SOURCE_DRAFT_MODEL, score=0.1)


class RandomTreeProposer(Proposer):
    """A random tree of random tokens (seeded), drawn from a small token pool so matches happen."""

    name = "random"

    def __init__(self, pool: Sequence[int], seed: int = 0, max_nodes: int = 12) -> None:
        self.pool = list(pool)
        self.rng = random.Random(seed)
        self.max_nodes = max_nodes

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        n = self.rng.randint(0, min(self.max_nodes, budget))
        tokens, parents = [], []
        for i in range(n):
            parents.append(self.rng.randint(-1, i - 1))
            tokens.append(self.rng.choice(self.pool))
        # siblings must be distinct tokens: drop duplicates (and their subtrees)
        seen: set[tuple[int, int]] = set()
        remap: dict[int, int] = {}
        out_t, out_p = [], []
        for i, (tok, par) in enumerate(zip(tokens, parents, strict=True)):
            if par >= 0 and par not in remap:
                continue
            mpar = remap[par] if par >= 0 else -1
            if (mpar, tok) in seen:
                continue
            seen.add((mpar, tok))
            remap[i] = len(out_t)
            out_t.append(tok)
            out_p.append(mpar)
        return Draft(out_t, out_p, [SOURCE_DRAFT_MODEL] * len(out_t), score=1.0)
