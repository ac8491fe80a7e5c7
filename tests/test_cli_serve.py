"""`suffixspec generate` and `suffixspec serve` (a real subprocess under waitress, stopped with SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import sys

import openai
import pytest
from click.testing import CliRunner
from tiny import start_server_process

from suffixspec.cli import main


def test_generate_json(tiny_model_dirs, tmp_path):
    args = ["generate", "def add(a, b):", "--model", str(tiny_model_dirs["llama"]), "--draft-model", "none",
            "--db", str(tmp_path / "i.db"), "--max-tokens", "12", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["completion_tokens"] <= 12 and out["finish_reason"] in ("stop", "length")
    assert out["speculative_decoding"]["steps"] >= 1


def test_generate_streams_text_then_stats(tiny_model_dirs, tmp_path):
    ref = tmp_path / "ref.txt"
    ref.write_text("def add(a, b):\n    return a + b\n")
    args = ["generate", "def add(a, b):", "--model", str(tiny_model_dirs["llama"]), "--draft-model", "none",
            "--db", str(tmp_path / "i.db"), "--max-tokens", "8", "--reference", str(ref),
            "--drafters", "prompt,references"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "mean accepted length" in res.stderr and "tokens/s" in res.stderr
    plain = CliRunner().invoke(main, args[:-2] + ["--no-speculation", "--no-stream"])
    assert plain.stdout == res.stdout  # same text with and without speculation


def test_generate_usage_errors(tiny_model_dirs, tmp_path):
    res = CliRunner().invoke(main, ["generate"])
    assert res.exit_code == 2 and "PROMPT" in res.output
    res = CliRunner().invoke(main, ["generate", "x", "--model", str(tiny_model_dirs["llama"]), "--draft-model",
                                    "none", "--db", str(tmp_path / "i.db"), "--drafters", "magic"])
    assert res.exit_code == 2 and "magic" in res.output  # refused before the model loads


def test_generate_reports_decode_speed_apart_from_prefill_and_first_step(tiny_model_dirs, tmp_path):
    args = ["generate", "def add(a, b):", "--model", str(tiny_model_dirs["llama"]), "--draft-model", "none",
            "--db", str(tmp_path / "i.db"), "--max-tokens", "12", "--drafters", "prompt"]
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    timing = out["timing"]
    assert timing["first_step_tokens"] + timing["decode_tokens"] == out["completion_tokens"]
    assert min(timing["load_s"], timing["prefill_s"], timing["first_step_s"]) > 0
    if out["speculative_decoding"]["steps"] > 1:
        assert timing["decode_tokens_per_s"] == round(timing["decode_tokens"] / timing["decode_s"], 2)
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert "decode: " in text.stderr and "prefill " in text.stderr and "first step " in text.stderr
    one = CliRunner().invoke(main, [*args[:-4], "--max-tokens", "1"])  # one step: no decode speed to give
    assert one.exit_code == 0 and "ended in its first step" in one.stderr, one.output


def test_generate_compare_runs_both_and_states_the_threads(tiny_model_dirs, tmp_path):
    """--compare: the request with speculation, then without; both speeds, tokens per step, identical
    outputs (greedy); the thread count and how it was chosen; --threads fixes it."""
    args = ["generate", "def add(a, b):", "--model", str(tiny_model_dirs["llama"]), "--draft-model", "none",
            "--db", str(tmp_path / "i.db"), "--max-tokens", "24", "--compare", "--threads", "1"]
    out = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    cmp = out["compare"]
    assert cmp["identical"] is True and cmp["plain"]["tokens_per_step"] == 1.0
    assert cmp["plain"]["steps"] == cmp["plain"]["completion_tokens"] == out["completion_tokens"]
    assert cmp["speculative"]["steps"] == out["speculative_decoding"]["steps"]
    assert out["threads"]["threads"] == 1 and out["threads"]["how"] == "given"
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    line = next(x for x in text.stderr.splitlines() if x.startswith("-- compare: "))
    assert "speculative " in line and "plain " in line and line.endswith("outputs identical"), line
    assert "-- threads: 1 thread (as given)" in text.stderr
    res = CliRunner().invoke(main, [*args, "--no-speculation"])
    assert res.exit_code == 2 and "drop --no-speculation" in res.output


@pytest.mark.parametrize("extra", [["--no-speculation"], ["--max-tokens", "1"], ["--drafters", "prompt"]])
def test_generate_loads_no_draft_model_it_cannot_use(tiny_model_dirs, tmp_path, extra):
    """A request that cannot draft from the draft model does not wait for it to load (a missing one shows it)."""
    args = ["generate", "def add(a, b):", "--model", str(tiny_model_dirs["llama"]), "--draft-model",
            str(tmp_path / "no-such-draft-model"), "--db", str(tmp_path / "i.db"), "--max-tokens", "4"]
    assert CliRunner().invoke(main, args).exit_code != 0  # it is loaded when it can draft
    res = CliRunner().invoke(main, [*args, *extra])
    assert res.exit_code == 0, res.output


def test_serve_help_defaults_to_localhost():
    res = CliRunner().invoke(main, ["serve", "--help"])
    assert res.exit_code == 0 and "127.0.0.1" in res.output and "SUFFIXSPEC_API_KEY" in res.output


@pytest.mark.slow
def test_serve_subprocess_answers_and_stops_cleanly(tiny_model_dirs, tmp_path):
    env = dict(os.environ, SUFFIXSPEC_API_KEY="k1", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-c", "from suffixspec.cli import main; main()", "serve", "--model",
           str(tiny_model_dirs["llama"]), "--draft-model", "none", "--db", str(tmp_path / "i.db"), "--port", "0"]
    proc, url = start_server_process(cmd, env=env)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="k1", max_retries=0, timeout=60)
        chunks = list(client.completions.create(model="suffixspec", prompt="x", max_tokens=4, temperature=0, stream=True))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        try:
            openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0).models.list()
            raise AssertionError("a wrong key was accepted")
        except openai.AuthenticationError:
            pass
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
