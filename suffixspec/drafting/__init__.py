"""Drafting: the registry of drafters and the policy that sizes, gates and judges their drafts.

- :mod:`.registry`: every drafter declares its name, its node sources and what it needs in its own
  file; the registry lists them (``DRAFTERS``, the API's and the server's drafter list, the CLI's
  choices, the bench's systems) and builds them by name.
- :mod:`.policy`: :class:`~.policy.Policy`, every decision's constants as named, commented fields.
- :mod:`.costs`: what a target pass costs by its inputs (:class:`~.costs.PassCost`) and how one row of a
  step sees it (:class:`~.costs.StepCost`).
- :mod:`.gates`: which drafts a pass verifies (:func:`~.gates.choose_drafts`, :class:`~.gates.DraftGate`)
  and which proposers run (:class:`~.gates.ProposerGate`).
- :mod:`.budget`: how many nodes a request may draft this step.
- :mod:`.judge`: a draft model judging its own drafts (:class:`~.judge.ModelDraftJudge`).

The cost model in one paragraph: a pass over ``R`` rows feeds every row's root (its last committed
token) plus the nodes of the drafts it verifies, ``inputs`` tokens in all, and costs ``t(inputs)``
(``PassCost``, measured in the calling thread's CPU time and read as low quantiles, so a busy machine's
wall clock and slow passes do not swing the decisions). A row's plain step costs its share
``F = t(R) / R`` and yields one token; a draft of ``n`` nodes adds ``t(inputs + n) - t(inputs)`` to the
pass and promises ``expected`` tokens, each sparing the row about ``F`` later. So a draft is verified
when ``expected * F >= t(inputs + n) - t(inputs)`` (``choose_drafts``); with one row that is
``(1 + expected) * t(1) >= t(1 + n)``.

Worked example (one row): t(1) = 70 ms, t(9) = 85 ms; a chain of 8 nodes scoring 1.0 with calibration 0.3
promises 0.3 tokens: 0.3 x 70 = 21 ms >= 15 ms -> verified; calibration 0.15: 10.5 ms < 15 ms -> skipped.

Lossless (docs/lossless.md, "Gates and cuts"): every decision here reads what was known before a draft's
tokens were sampled: costs, past outcomes (calibration, acceptance, exploration counters), the
target's sharpness at positions already sampled, a draft's planned size and a score fixed before
sampling (``Draft.gate_size``), and the shape only of drafts without ``q``. Nothing of one row
reaches another's tokens: a row's draft may be skipped because of other rows' drafts (the pass is
shared), which only changes how many passes the row takes, never its tokens. Proposer costs and
yields are shared across requests only for proposers whose drafts carry no ``q`` (their drafts never
change what is sampled). Measured figures behind the defaults: docs/benchmarks.md.
"""
