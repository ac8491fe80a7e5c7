"""The benchmark runner end to end on tiny models: every system runs, outputs match plain, files are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from suffixspec.bench.run import run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_bench_runs_all_systems_and_writes_reports(tiny_model_dirs, tiny_draft_dir, tmp_path):
    out = tmp_path / "bench"
    result = run(str(tiny_model_dirs["llama"]), str(tiny_draft_dir), out,
                 workloads=("code_edit_prediction", "rag"),
                 systems=("hf_plain", "hf_prompt_lookup", "hf_assisted", "ours_prompt", "ours_references",
                          "ours_documents", "ours_all"),
                 requests=1, max_tokens=12, log=lambda msg: None)
    rows = result["results"]
    assert set(rows) == {"code_edit_prediction", "rag"}
    for workload, systems in rows.items():
        assert set(systems) == {"hf_plain", "hf_prompt_lookup", "hf_assisted", "ours_prompt", "ours_references",
                                "ours_documents", "ours_all"}, workload
        for system, row in systems.items():
            assert row["identical"], (workload, system)  # lossless: same tokens as transformers greedy
            assert row["tokens"] > 0 and row["tokens_per_s"] > 0
            if system.startswith("ours_"):
                assert row["mean_accepted_length"] >= 1.0
    saved = json.loads((out / "results.json").read_text())
    assert saved["results"] == rows and saved["meta"]["max_tokens"] == 12
    assert "| rag | ours_all |" in (out / "results.md").read_text()
    assert (out / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_arctic_suffix_drafts_in_our_engine_losslessly(tiny_model_dirs, tmp_path):
    pytest.importorskip("arctic_inference.suffix_decoding")
    result = run(str(tiny_model_dirs["llama"]), None, tmp_path / "bench", workloads=("code_edit", "rag"),
                 systems=("hf_plain", "ours_all", "arctic_suffix", "arctic_suffix_best"), requests=1, max_tokens=16,
                 log=lambda msg: None, periodic=False)
    assert result["meta"]["periodic"] is False and result["meta"]["skipped"] == []
    for workload, rows in result["results"].items():
        for system in ("arctic_suffix", "arctic_suffix_best"):
            row = rows[system]
            assert row["identical"], (workload, system)  # same verification: the same greedy tokens
            assert row["mean_accepted_length"] >= 1.0 and row["forward_passes"] <= rows["hf_plain"]["forward_passes"] + 2


def test_replay_counts_the_steps_greedy_verification_takes(tiny_model_dirs):
    from suffixspec.bench.bench_drafting import OracleDrafter, Trace, accepted_path, replay

    from suffixspec.draft import Draft
    from suffixspec.proposers.suffix import SuffixConfig, SuffixProposer

    # the module's worked example: draft [5, 6, 9] against output [5, 6, 7, 8] accepts 5 6
    assert accepted_path(Draft([5, 6, 9], [-1, 0, 1], ["prompt"] * 3), [5, 6, 7, 8]) == 2
    assert accepted_path(Draft([5, 9, 6, 7], [-1, -1, 0, 2], ["prompt"] * 4), [5, 6, 7, 8]) == 3  # tree path
    loop = [1, 2, 3, 4] * 12
    trace = Trace(prompt_ids=[9, 1, 2, 3, 4], output_ids=loop, reference_ids=[], prediction_ids=None)
    oracle = replay(OracleDrafter([trace]), [trace])
    # the engine's budget starts at 32 and stays there while drafts are accepted: 48 tokens = 33 + 15
    assert (oracle.steps, oracle.tokens, oracle.requests) == (2, 48, 1)
    ours = replay(SuffixProposer(config=SuffixConfig(periodic=False), history=False), [trace])
    assert ours.tokens == 48 and oracle.steps <= ours.steps < 48  # drafts from the loop itself
    longest_only = replay(SuffixProposer(config=SuffixConfig(periodic=False, match_lengths=0), history=False), [trace])
    assert ours.steps <= longest_only.steps


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampled_speculation_on_and_off_give_the_same_tokens(tiny_model_dirs, tiny_draft_dir, temperature):
    from suffixspec.bench.bench_sampled import on_off, proposers_for
    from suffixspec.bench.workloads import Request

    from suffixspec.config import SamplingParams
    from suffixspec.engine import Engine
    from suffixspec.loading import load_model

    target, draft = load_model(str(tiny_model_dirs["llama"])), load_model(str(tiny_draft_dir))
    engine = Engine(target)
    prompt = "def f(x):\n    return x + 1\n\ndef g(x):\n    return x + 1\n\ndef f(x):\n"
    for seed in (1, 2):
        r = on_off(engine, proposers_for(target, draft, None), Request(prompt, 24),
                   SamplingParams(max_tokens=24, temperature=temperature, top_p=0.95, seed=seed))
        assert r.identical and r.tokens > 0 and r.forwards >= 2


def test_context_prompts_grow_to_the_asked_length(bpe_tokenizer_dir):
    from suffixspec.bench.bench_context import build_at

    from suffixspec.loading import load_tokenizer

    tok = load_tokenizer(str(bpe_tokenizer_dir))
    for name in ("code_edit", "rag"):
        short = build_at(name, tok, 1, 256, 16)[0][0]
        long = build_at(name, tok, 1, 1024, 16)[0][0]
        n_short, n_long = len(tok.encode(short.prompt)), len(tok.encode(long.prompt))
        # about the asked length (the chat frame and the repeated head are estimated, not fitted)
        assert 80 <= n_short <= 340 and 600 <= n_long <= 1100 and n_long > 2.5 * n_short, (name, n_short, n_long)
        assert bool(long.references) == (name == "rag")


def test_size_projection_arithmetic():
    from suffixspec.bench.bench_size import project, relative_at

    rel = {1: 1.2, 2: 1.3, 4: 1.5, 8: 2.0}
    assert relative_at(rel, 0) == 1.0 and relative_at(rel, 3) == pytest.approx(1.4)
    assert relative_at(rel, 100) == 2.0  # past the largest measured size (drafts never are: 32 = the budget)
    # 10 tokens per step from drafts of 6 nodes, which cost 1.75 plain steps: 10 / 1.75
    got = project({"10M": {"relative": {"1": 1.2, "2": 1.3, "4": 1.5, "8": 2.0}}},
                  {"code_edit": {"mean_accepted_length": 10.0, "mean_draft": 6.0}})
    assert got == {"10M": {"code_edit": pytest.approx(10 / 1.75, abs=0.01)}}


def test_index_bench_reopen_compacts_in_a_child_and_times_both_sets(bpe_tokenizer_dir, tmp_path):
    """``bench_index --sections reopen --compact`` on a small database of two segments: the compaction runs
    in a child process whose peak memory is sampled, both segment sets (and the main checkout's code over
    the old files) draft the same, and one document added is drafted from by another reader."""
    from suffixspec.bench.bench_index import PeakMemory, bench_reopen
    from suffixspec.index.store import DocInput, IndexStore
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bpe_tokenizer_dir))
    body = "def area(radius):\n    return 3.14159 * radius * radius  # circle number {i}\n" * 20
    with IndexStore(tmp_path / "scale.db") as s:
        for part in range(2):
            s.add_documents([DocInput(body.replace("{i}", f"{part}-{i}"), f"{part}-{i}.py") for i in range(5)], tok)
        assert len(s.segment_infos(s.fingerprints()[0])) == 2
    with PeakMemory() as mem:
        res = bench_reopen(tok, tmp_path, n_lookups=30, rounds=2, main_root=str(ROOT), compact=True)
    assert 0 < mem.anon <= mem.rss
    assert res["compaction"]["compactions"] == 1 and 0 < res["compaction"]["peak_anon_bytes"]
    assert len(res["segments"]) == 2 and len(res["segments_after_compaction"]) == 1
    assert res["identical_drafts"] == "30/30"
    for name in ("segments", "largest_segment_alone", "segments_main_code", "compacted"):
        assert res[f"{name}_speculate_median_us"] > 0 and res[f"{name}_alone_speculate_cpu_median_us"] > 0
    assert res["add_one_until_drafted_median_s"] > 0 and res["delete_one_median_s"] > 0


def test_written_traces_are_the_answers_a_person_would_write(bpe_tokenizer_dir):
    from suffixspec.bench.bench_drafting import written_traces

    from suffixspec.loading import load_tokenizer

    tok = load_tokenizer(str(bpe_tokenizer_dir))
    traces = written_traces(str(bpe_tokenizer_dir), ("code_edit", "agentic", "rag", "open_ended"), 2, 64)
    for w, trs in traces.items():
        assert len(trs) == 2 and all(0 < len(t.output_ids) <= 64 for t in trs), w
    edit = traces["code_edit"][0]
    prompt, answer = tok.decode(edit.prompt_ids), tok.decode(edit.output_ids)
    old = prompt.split("# Edit: rename ")[1].split(" to ")[0]
    assert f"{old}_v2" in answer or old not in answer  # the rename applied (if the word is in the first 64)
    rag = traces["rag"][0]
    chunk = tok.decode(rag.reference_ids[0])
    assert tok.decode(rag.output_ids)[:20] in chunk  # the rest of the retrieved chunk
    assert tok.decode(traces["agentic"][0].output_ids)[:30] in tok.decode(traces["agentic"][0].prompt_ids)
