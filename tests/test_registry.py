"""The drafter registry (suffixspec.drafting.registry): a drafter declared in one module of its own
(tests/toy_drafter.py, no other file touched) is found by the API, the server's ``/v1/models``, the CLI's
``--drafters`` choices and the bench's systems, and drafts inside the llama.cpp and vLLM adapters."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from test_llama_cpp import TEXT, drafter, drive
from test_vllm import LOOP, Batch

from suffixspec.drafting.registry import drafter_names, source_names, unregister

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.fixture
def toy():
    """The toy drafter's module, imported (so registered) for one test and unregistered after it."""
    sys.modules.pop("toy_drafter", None)
    module = importlib.import_module("toy_drafter")
    yield module
    unregister("toy")
    sys.modules.pop("toy_drafter", None)


def test_the_builtin_drafters_are_read_from_their_files_without_importing_them():
    import subprocess

    code = ("import sys; from suffixspec.drafting.registry import source_names, drafter_names; "
            "print(drafter_names(), source_names(), [m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == ("('suffix', 'draft_model') ('prompt', 'history', 'documents', "
                                         "'references', 'prediction', 'draft_model') []")


def test_a_toy_drafter_declared_in_one_module_is_found_everywhere(toy, tiny_model_dirs):
    from suffixspec import SuffixSpec
    from suffixspec.bench.systems import Bench, all_systems
    from suffixspec.cli import main
    from suffixspec.cli.options import DrafterList
    from suffixspec.server import create_app

    assert drafter_names()[-1] == "toy" and source_names()[-1] == "toy"
    # the API builds it (with the resources it uses) and lists its source
    with SuffixSpec(model=str(tiny_model_dirs["llama"]), draft_model=None, db=False, history=False) as spec:
        toys = [p for p in spec.proposers if isinstance(p, toy.ToyProposer)]
        assert len(toys) == 1 and toys[0].resources == {"tokenizer": spec.tokenizer}
        assert spec.drafters == ["prompt", "references", "prediction", "toy"]
        res = spec.generate(PROMPT, max_tokens=24, speculation={"drafters": ["toy"], "adaptive": False})
        plain = spec.generate(PROMPT, max_tokens=24, speculation=False)
        assert res.token_ids == plain.token_ids and res.stats.per_source["toy"]["drafted"] > 0
        # the server: /v1/models lists it, a request may choose it
        app = create_app({"model": "tiny"}, spec=spec)
        http = app.test_client()
        card = http.get("/v1/models").get_json()["data"][0]
        assert "toy" in card["drafters"]
        answer = http.post("/v1/completions", json={"model": "suffixspec", "prompt": PROMPT, "max_tokens": 8,
                                                    "speculation": {"drafters": ["toy"]}})
        assert answer.status_code == 200, answer.get_json()
        # the bench: a system of its own, its proposer built for our engine's systems
        assert "ours_toy" in all_systems()
        bench = Bench(spec.engine.target, None, threads=1)
        assert [p.name for p in bench.other_proposers] == ["toy"]
    # the CLI: a --drafters choice, in the help and when parsed
    assert DrafterList().convert("prompt,toy", None, None) == ("prompt", "toy")
    assert "toy" in CliRunner().invoke(main, ["generate", "--help"]).output


def test_the_toy_drafter_drafts_inside_the_llama_cpp_adapter(toy):
    d, clock = drafter()
    assert [p.name for p in d.proposers] == ["suffix", "toy"]
    with d.request(drafters=["toy"]):  # the suffix index left out: only the toy drafts
        out, passes, drafted = drive(d, [1, 2, *TEXT, 3], TEXT[:60], clock)
    stats = d.last_stats
    assert out == TEXT[:60] and "prompt" not in stats.per_source
    assert stats.per_source["toy"]["accepted"] > 30 and passes < 30, (stats.per_source, passes)  # 59 without drafts


def test_the_toy_drafter_drafts_inside_the_vllm_adapter(toy):
    from suffixspec.runtimes.vllm import SuffixSpecProposer

    p = SuffixSpecProposer(num_speculative_tokens=6, max_model_len=256, max_num_seqs=4, sources=("toy",))
    assert [q.name for q in p.proposers] == ["suffix", "toy"]
    b = Batch()
    b.add("a", [1, 2, *LOOP, *LOOP], LOOP * 3, slot=0)
    b.step(p)
    drafts = b.step(p)[0]
    context = list(b.token_ids[0, :b.num_tokens[0]])
    assert drafts and drafts == toy.ToyProposer().propose(context, 6).tokens
    for _ in range(4):
        b.step(p)
    assert b.accepted["a"] > 12  # the toy's lookup follows the loop
    assert np.array_equal(b.token_ids[0, :b.num_tokens[0]], (list(b.truth["a"]))[:b.num_tokens[0]])
