"""The benchmark runner end to end on tiny models: every system runs, outputs match plain, files are written."""

from __future__ import annotations

import json

from bench.run import run


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
