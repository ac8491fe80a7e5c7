"""suffixspec.bench.bench_servers: servers end to end through the OpenAI API, one at a time on loopback.

1. Ours against itself on the embedded tiny model (``suffixspec/demo-target``): real ``suffixspec serve``
   processes, rounds interleaved, speculative outputs equal to speculation off, resident memory read from
   ``/proc``; the llama-server systems skipped with the reason when no binary is given.
2. llama.cpp's ``llama-server`` on SmolLM2's GGUF beside ours, only where the binary is given
   (``$SUFFIXSPEC_LLAMA_SERVER``; docs/llama_cpp.md says how to build it). CI builds no llama-server, so there
   (and wherever the binary is missing) it SKIPS with the reason; it never fails for a missing binary.
"""

from __future__ import annotations

import json

import pytest

from suffixspec.bench import bench_servers
from suffixspec.bench.bench_servers import LLAMA_SERVER_ENV, LLAMA_SYSTEMS, llama_server_binary, main, run

pytestmark = pytest.mark.slow  # server processes that import torch and load a model, each


def test_ours_against_itself_on_the_tiny_model_rounds_interleaved(tmp_path, monkeypatch):
    monkeypatch.delenv(LLAMA_SERVER_ENV, raising=False)  # the llama-server systems: skipped with the reason
    logged: list[str] = []
    result = run("suffixspec/demo-target", [*LLAMA_SYSTEMS, "ours_off", "ours_all"], ["code_edit"], n=1,
                 max_tokens=16, rounds=2, weights=["float32"], log=logged.append)
    assert [s.split(":")[0] for s in result["skipped"]] == list(LLAMA_SYSTEMS)
    assert all("no llama-server binary" in s for s in result["skipped"])
    # one server at a time, every system once per round, round 1 before round 2
    assert [(r["round"], r["system"]) for r in result["runs"]] == [
        (1, "ours_off@float32"), (1, "ours_all@float32"), (2, "ours_off@float32"), (2, "ours_all@float32")]
    rows = {r["system"]: r for r in result["rows"]}
    assert set(rows) == {"ours_off@float32", "ours_all@float32"}
    for r in rows.values():
        assert r["tokens"] > 0 and r["tokens_per_s"] > 0 and len(r["tokens_per_s_rounds"]) == 2
        assert r["identical_ours_off"] == "1/1" and r["same_every_round"]  # greedy: speculation changes nothing
        assert r["vs_llama_plain"] is None and r["identical_llama_plain"] is None
        assert 0.05 < r["rss_gb"] < 8 and r["rss_anon_gb"] > 0  # a Python process with torch and a tiny model
        assert isinstance(r["threads"], dict) and r["threads"]["threads"] >= 1  # /health's report
    assert rows["ours_off@float32"]["drafted"] == 0 and rows["ours_all@float32"]["drafted"] > 0
    assert "| code_edit | ours_all@float32 |" in bench_servers.markdown(result["rows"])


def test_main_writes_json_and_markdown(tmp_path, monkeypatch):
    monkeypatch.delenv(LLAMA_SERVER_ENV, raising=False)
    main(["--model", "suffixspec/demo-target", "--systems", "ours_off", "--workloads", "open_ended",
          "--requests", "1", "--max-tokens", "8", "--rounds", "1", "--out", str(tmp_path)])
    got = json.loads((tmp_path / "servers.json").read_text())
    assert got["meta"]["history"] is False and got["meta"]["temperature"] == 0.0
    assert [r["system"] for r in got["rows"]] == ["ours_off@float32"]
    assert "| open_ended | ours_off@float32 |" in (tmp_path / "servers.md").read_text()


def test_a_wrong_binary_path_is_an_error_not_a_skip(tmp_path):
    with pytest.raises(FileNotFoundError, match="no executable llama-server"):
        llama_server_binary(str(tmp_path / "llama-server"))


@pytest.mark.real_model
def test_llama_server_beside_ours_on_smollm2(tmp_path):
    binary = llama_server_binary()
    if binary is None:  # CI (CI=true) too: it builds no llama-server; a skip, never a failure
        pytest.skip(f"no llama-server binary: set ${LLAMA_SERVER_ENV} to one built as docs/llama_cpp.md says")
    from suffixspec.gguf_cache import describe
    from suffixspec.models import KNOWN_MODELS

    model = "smollm2-135m-instruct"
    if not describe(KNOWN_MODELS[model])["installed"]:
        pytest.skip(f"{model} is not installed: {describe(KNOWN_MODELS[model])['install']}")
    result = run(model, ["llama_server_plain", "llama_server_spec_default", "llama_server_draft", "ours_off"],
                 ["code_edit"], n=1, max_tokens=24, rounds=1, weights=["float32"], llama_server=str(binary))
    assert any(s.startswith("llama_server_draft:") and "no draft model" in s for s in result["skipped"])
    rows = {r["system"]: r for r in result["rows"]}
    assert set(rows) == {"llama_server_plain", "llama_server_spec_default", "ours_off@float32"}
    plain, spec = rows["llama_server_plain"], rows["llama_server_spec_default"]
    assert plain["identical_llama_plain"] == "1/1" and plain["vs_llama_plain"] == 1.0
    assert plain["threads"] == 2 and plain["tokens"] > 0 and plain["drafted"] == 0
    assert spec["llama_best"] in ("llama_server_plain", "llama_server_spec_default")
    assert plain["rss_file_gb"] > 0.05  # the mapped GGUF (98 MB) is resident once it has run
    assert rows["ours_off@float32"]["vs_llama_plain"] > 0
