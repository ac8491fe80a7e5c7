"""suffixspec.bench.bench_quality: HumanEval's tests executed in a limited subprocess, and greedy agreement
teacher-forced through the engine's own runner."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from suffixspec.bench.bench_quality import evaluate, extract_code, markdown, program, run_tests

INC = {"task_id": "T/0", "prompt": "from typing import List\n\n\ndef inc(xs: List[int]) -> List[int]:\n"
       "    \"\"\"Add one to each.\"\"\"\n", "entry_point": "inc",
       "test": "def check(candidate):\n    assert candidate([1, 2]) == [2, 3]\n    assert candidate([]) == []\n",
       "canonical_solution": "    return [x + 1 for x in xs]\n"}


def test_a_whole_function_in_a_fence_redefines_the_stub_and_passes():
    reply = "Here it is:\n```python\ndef inc(xs: List[int]) -> List[int]:\n    return [x + 1 for x in xs]\n```\nDone."
    assert extract_code(reply, "inc").startswith("def inc(")
    assert run_tests(program(INC, reply)) == (True, "passed")


def test_a_body_alone_completes_the_prompt():
    assert run_tests(program(INC, "    return [x + 1 for x in xs]\n"))[0]
    assert run_tests(program(INC, "def inc(xs):\n    return xs\n")) == (False, "AssertionError")


def test_the_runner_stops_loops_memory_hogs_and_reads_nothing_of_ours(tmp_path):
    assert run_tests("while True: pass", {"timeout_s": 1.5}) == (False, "timed out after 2 s")
    ok, why = run_tests("x = bytearray(3 * 2**30)")  # past the 2 GiB address-space limit
    assert not ok and "MemoryError" in why
    ok, why = run_tests("import os\nassert os.getcwd() != " + repr(str(tmp_path)) + "\nassert 'PYTHONPATH' not in os.environ")
    assert ok, why


@pytest.mark.slow
def test_canonical_solutions_pass_and_an_empty_body_fails():
    from suffixspec.bench.workloads.sources import humaneval_problems

    try:
        problems = humaneval_problems()[:12]
    except RuntimeError as e:
        pytest.skip(str(e))
    for p in problems:
        fenced = f"```python\n{p['prompt']}{p['canonical_solution']}```"
        assert run_tests(program(p, fenced)) == (True, "passed"), p["task_id"]
        assert not run_tests(program(p, "    return None\n"))[0], p["task_id"]


@pytest.mark.slow
def test_evaluate_on_the_tiny_model(tmp_path, monkeypatch):
    path = tmp_path / "HumanEval.jsonl.gz"
    path.write_bytes(gzip.compress((json.dumps(INC) + "\n" + json.dumps({**INC, "task_id": "T/1"}) + "\n").encode()))
    monkeypatch.setenv("SUFFIXSPEC_HUMANEVAL", str(path))
    result = evaluate("suffixspec/demo-target", ["float32", "bfloat16"], n=2, max_tokens=24, agree_tokens=16,
                      log=lambda msg: None)
    f32, bf16 = result["formats"]["float32"], result["formats"]["bfloat16"]
    assert f32["problems"] == bf16["problems"] == 2 and f32["agreement_tokens"] == bf16["agreement_tokens"] > 0
    assert f32["agreement"] == 1.0  # the engine's greedy tokens are its runner's argmax, teacher-forced
    assert 0.5 <= bf16["agreement"] <= 1.0
    assert all(a["why"] for a in f32["answers"]) and f32["output_tokens"] > 0
    assert "| bfloat16 |" in markdown(result)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["int_mm", "fbgemm"])
def test_an_int8_format_can_name_its_kernel(kernel, monkeypatch):
    """``int8@<kernel>`` builds the engine's int8 matrices on that kernel, whatever the probe chose, and
    leaves the environment as it was."""
    from suffixspec.bench.bench_quality import _kernel, load_format

    monkeypatch.delenv("SUFFIXSPEC_INT8_KERNEL", raising=False)
    spec = load_format("suffixspec/demo-target", f"int8@{kernel}")
    try:
        lean = spec.engine._runner().lean
        assert lean.int8 and lean.head.kernel == kernel
        assert {layer.kernel for layer in lean.layers[0].__dict__.values() if hasattr(layer, "kernel")} == {kernel}
    finally:
        spec.close()
    assert "SUFFIXSPEC_INT8_KERNEL" not in os.environ and _kernel(f"int8@{kernel}") == kernel
    with pytest.raises(ValueError, match="only int8 has kernels"):
        load_format("suffixspec/demo-target", "bfloat16@fbgemm")
