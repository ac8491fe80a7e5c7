"""ArcticInference's suffix decoding as a drafter in our engine (benchmarks only, optional).

``arctic_inference.suffix_decoding.SuffixDecodingCache`` is the engine behind vLLM's ``suffix``
speculative method: a suffix tree per active request (its prompt, then its response as it grows)
and one global tree of responses (earlier requests' and the live one's). ``speculate`` drafts from
both and keeps the draft with the higher score. Wrapped as a :class:`~suffixspec.drafting.proposers.Proposer`
it runs inside our engine, so verification, KV handling and the adaptive budget are the same as for
our suffix proposer and only the drafts differ.

Its nodes are all labelled ``prompt``: the cache returns one tree's draft without saying which.

Install: docs/benchmarks.md, "Installing the peers" (it builds from source, without build isolation).
When it is missing, :func:`available` is False and the benchmark skips the ``arctic_*`` systems.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from suffixspec.drafting.draft import SOURCE_PROMPT, Draft
from suffixspec.drafting.proposers import Proposer, RequestContext


def available() -> bool:
    """Is ArcticInference's suffix decoding importable here?"""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except Exception:  # ImportError, or a build against another torch/Python failing to load
        return False
    return True


@dataclass(frozen=True)
class ArcticParams:
    """``SuffixDecodingCache`` / ``speculate`` settings (its own defaults unless set)."""

    max_tree_depth: int = 64  # deepest suffix kept in its trees (= longest context match)
    max_spec_factor: float = 1.0  # draft length <= match_len * factor + offset
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1  # stop below this estimated path probability
    use_tree_spec: bool = False  # its default: the single most likely path
    history: bool = True  # keep responses in the global tree (max_cached_requests -1; False: 0)

    def label(self) -> str:
        return (f"depth {self.max_tree_depth}, factor {self.max_spec_factor:g}, offset {self.max_spec_offset:g}, "
                f"min prob {self.min_token_prob:g}, {'tree' if self.use_tree_spec else 'path'}"
                + ("" if self.history else ", no global tree"))


ARCTIC_DEFAULT = ArcticParams()
# The best setting of the grid searched by ``python -m suffixspec.bench.bench_drafting --search --costs ...`` (least
# estimated time over the five workloads, replaying SmolLM2-135M-Instruct's own greedy outputs with
# its verify cost curve; history off): a tree, each draft at most as long as its match. The next
# settings of the grid were within 0.3% (docs/benchmarks.md, "Drafting alone: the replay").
ARCTIC_BEST = ArcticParams(max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1, use_tree_spec=True)


class ArcticSuffixProposer(Proposer):
    """Drafts with ArcticInference's ``SuffixDecodingCache`` (one cache for the proposer's life)."""

    name = "arctic_suffix"

    def __init__(self, params: ArcticParams = ARCTIC_DEFAULT) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.params = params
        self.cache = SuffixDecodingCache(max_tree_depth=params.max_tree_depth,
                                         max_cached_requests=-1 if params.history else 0)
        self._req: int | None = None
        self._next = 0

    def begin(self, request: RequestContext) -> None:
        if self._req is not None:  # an earlier request ended without end(): close it
            self.cache.stop_request(self._req)
        self._req = self._next
        self._next += 1
        self.cache.start_request(self._req, list(request.prompt_ids))

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        if self._req is None or budget <= 0:
            return Draft()
        p = self.params
        d = self.cache.speculate(self._req, list(context[-p.max_tree_depth:]), max_spec_tokens=budget,
                                 max_spec_factor=p.max_spec_factor, max_spec_offset=p.max_spec_offset,
                                 min_token_prob=p.min_token_prob, use_tree_spec=p.use_tree_spec)
        n = min(budget, len(d.token_ids))
        return Draft(list(d.token_ids[:n]), list(d.parents[:n]), [SOURCE_PROMPT] * n, score=float(sum(d.probs[:n])))

    def update(self, new_tokens: Sequence[int]) -> None:
        if self._req is not None and len(new_tokens):
            self.cache.add_active_response(self._req, [int(t) for t in new_tokens])

    def end(self, output_ids: Sequence[int]) -> None:
        if self._req is not None:
            self.cache.stop_request(self._req)
            self._req = None
