"""A toy drafter declared in this one module and nowhere else: ``tests/test_registry.py`` imports it and
finds it in the API, the server, the CLI, the bench and the vLLM and llama.cpp adapters.

It drafts what followed the last earlier occurrence of the context's last token (a tiny prompt lookup),
node ``i`` of the chain with path probability ``0.9^(i + 1)``. Example: context ``5 6 7 5`` -> the chain
``6 7 5``, probabilities 0.9, 0.81, 0.729, source ``toy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from suffixspec.drafting.draft import Draft
from suffixspec.drafting.proposers import Proposer
from suffixspec.drafting.registry import Drafter, register

LOOKBACK = 256  # context tokens searched for the last token's earlier occurrence


class ToyProposer(Proposer):
    """The toy drafter (see the module docstring)."""

    name = "toy"

    def __init__(self, **resources: Any) -> None:
        self.resources = resources  # what the runtime offered it (its ``uses``: the tokenizer, when there is one)

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        tail = list(context[-LOOKBACK:])
        for i in range(len(tail) - 2, -1, -1):
            if tail[i] == tail[-1]:
                chain = tail[i + 1:i + 1 + budget]
                probs = [0.9 ** (k + 1) for k in range(len(chain))]
                return Draft.chain(chain, "toy", score=sum(probs), probs=probs)
        return Draft()


DRAFTER = register(Drafter(name="toy", sources=("toy",), uses=("tokenizer",), order=20, build=ToyProposer))
