"""Which ``transformers`` releases run universal assisted generation (UAG) well enough to be measured.

UAG is ``generate(ids, assistant_model=draft, tokenizer=target_tok, assistant_tokenizer=draft_tok)``: a draft
model of another vocabulary. The benchmark runs it as ``hf_assisted`` (:mod:`suffixspec.bench.run`, where the draft's
vocabulary differs) and ``hf-uag`` (:mod:`suffixspec.bench.bench_bridge`). Two ranges of ``transformers`` releases
break it, both in ``transformers/generation/candidate_generator.py``,
``AssistedCandidateGeneratorDifferentTokenizers``:

- before 5.14.0 the assistant is handed the target's ``position_ids``, sized in the target's tokens, so an
  assistant whose re-encoding of the text is longer crashes ("The size of tensor a (13) must match the size
  of tensor b (6)"); huggingface/transformers#46936 fixed it in 5.14.0.
- from 5.25.0 ``get_candidates`` records the length the assistant's KV cache is rolled back from
  (``_last_ids_length``) in the *target's* tokens, and ``AssistedCandidateGenerator._update_past_and_masks``
  subtracts the assistant's input length, in the *assistant's* tokens (5.24 cropped to the assistant input's
  own length). Where the assistant's tokens outnumber the target's the cache is never cropped: it keeps the
  entries of rejected drafts and of re-tokenized tokens, and once it is as long as the next input the
  assistant is prefilled with no tokens ("cannot reshape tensor of 0 elements"); where they are fewer, it is
  cropped too far and re-prefilled. The outputs that do come out stay the target's (it verifies every
  token), but the assistant drafts from a wrong context and its cost is not UAG's. No release fixes it yet
  (5.25.0 is the newest).

On such a release the benchmark skips those systems and says why (:func:`uag_defect`), rather than crash on
some prompts and time a broken peer on the others. Same-vocabulary assisted generation is not affected.
``tests/test_bench.py`` runs UAG on the tests' tiny pair and fails when a release runs it where
:data:`DEFECTS` says it does not, or the reverse: then move the bounds here.
"""

from __future__ import annotations

# (version range, what breaks): the releases whose UAG is no baseline to measure; the rest run it
DEFECTS: tuple[tuple[str, str], ...] = (
    ("<5.14", "the assistant gets the target's position_ids, so an assistant that re-encodes the text into more "
              "tokens crashes (fixed in 5.14.0: huggingface/transformers#46936)"),
    (">=5.25", "AssistedCandidateGeneratorDifferentTokenizers.get_candidates (transformers/generation/"
               "candidate_generator.py) counts the assistant's KV-cache rollback in the target's tokens, so the "
               "assistant's cache keeps stale entries (a crash once it is as long as the next input) or is cropped "
               "too far"),
)
WORKING = ">=5.14,<5.25"  # the releases between the two, told to the user in the message


def uag_defect(version: str | None = None) -> str | None:
    """Why ``transformers`` ``version`` (default: the installed one) cannot run universal assisted generation as
    a baseline, or None where it can.

    Example: ``uag_defect("5.24.0")`` -> None; ``uag_defect("5.25.0")`` -> "transformers 5.25.0 breaks universal
    assisted generation: ...; install transformers>=5.14,<5.25 to measure it"; development builds count as the
    release they lead to (``"5.26.0.dev0"`` is in ``">=5.25"``).
    """
    from importlib.metadata import version as installed

    from packaging.specifiers import SpecifierSet

    version = version or installed("transformers")
    for releases, why in DEFECTS:
        if SpecifierSet(releases).contains(version, prereleases=True):
            return (f"transformers {version} breaks universal assisted generation: {why}; install "
                    f"transformers{WORKING} to measure it")
    return None
