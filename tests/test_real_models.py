"""The real models on stage: SmolLM2-135M-Instruct and Gemma 3 270M, installed from the package registry.

What a user gets from ``--model smollm2-135m-instruct`` / ``--model gemma-3-270m``: the GGUF converted
once into the cache (``$SUFFIXSPEC_CACHE``; .ci/run keeps it under .ci/cache, so a clean CI run pays
the conversion once), then

- greedy output identical to ``transformers`` ``generate`` on the same weights, on a chat prompt with
  the template, a completion, and a copy-heavy edit where drafts are really accepted (Gemma: a prompt
  longer than its 512-token sliding window, and its 262k vocabulary);
- seeded sampling identical with speculation on and off for the suffix drafters;
- one HTTP round trip with the official ``openai`` client against a real ``suffixspec serve``;
- a conversion killed with SIGKILL leaves nothing half-made, and the next load is correct.

tests/test_models.py shows on a tiny GGUF that a converted folder is exactly what ``transformers``
reads from the GGUF itself. Without the packages these tests skip, saying the pip command (in CI,
where .ci/run installs SmolLM2, they fail instead). The Gemma cases (marker ``gemma``) cost minutes of
CPU: CI deselects them and the benchmark run executes them (``python -m pytest -m gemma``).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import CODE, start_server_process

from suffixspec.gguf_cache import cache_dir, describe
from suffixspec.models import KNOWN_MODELS

pytestmark = [pytest.mark.slow, pytest.mark.real_model, pytest.mark.usefixtures("one_torch_thread")]

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2, GEMMA = "smollm2-135m-instruct", "gemma-3-270m"

EDIT = CODE.replace("total", "subtotal")


def long_file(n: int = 40) -> str:
    """About 900 Gemma tokens of plain Python: longer than Gemma 3's 512-token sliding window."""
    return "".join(f"def scale_{i}(values):\n    return [v * {i} + {i * i % 17} for v in values]\n\n\n"
                   for i in range(n))


# per model: (case id, prompt text or chat messages, generation keywords, drafts must be accepted)
CASES = {
    SMOLLM2: [
        ("chat", [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
         {"max_tokens": 40}, False),
        ("completion", "The three primary colors are", {"max_tokens": 32}, False),
        ("code_edit", [{"role": "user", "content": "Rename the variable `total` to `subtotal` in this function. "
                                                     f"Reply with the code only.\n\n```python\n{CODE}```"}],
         {"max_tokens": 96, "prediction": EDIT}, True),
    ],
    GEMMA: [
        ("completion", "The capital of France is", {"max_tokens": 24}, False),
        ("copy_past_window", long_file() + "\n# The same functions again:\n\n" + long_file(3)[:60],
         {"max_tokens": 64}, True),
    ],
}


def require(name: str) -> None:
    info = describe(KNOWN_MODELS[name])
    if not info["installed"]:
        msg = f"{name} is not installed: {info['install']}"
        if os.environ.get("CI"):
            pytest.fail(msg + " (.ci/run installs it)")
        pytest.skip(msg)


@pytest.fixture(scope="module", params=[(SMOLLM2, "float32"), (SMOLLM2, "int8"), (SMOLLM2, "gguf"), (SMOLLM2, "gguf16"),
                                        pytest.param((GEMMA, "float32"), marks=pytest.mark.gemma),
                                        pytest.param((GEMMA, "gguf"), marks=pytest.mark.gemma)], ids=str)
def model(request):
    """(SuffixSpec on the named model at a weight format, its converted folder loaded by plain ``transformers``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from suffixspec.api import SuffixSpec
    from suffixspec.loading import resolve_model_path

    name, weights = request.param
    require(name)
    with SuffixSpec(model=name, draft_model=None, db=False, history=False, weights=weights) as spec:
        assert spec.weights == weights
        ref = AutoModelForCausalLM.from_pretrained(resolve_model_path(name), dtype=torch.float32).eval()
        yield spec, ref


def prompt_ids(spec, prompt) -> list[int]:
    return spec.encode_chat(prompt) if isinstance(prompt, list) else spec.encode(prompt)


def cases_of(spec):
    return CASES[spec.model_name]


def test_greedy_output_equals_transformers_generate(model):
    """float32: transformers' own generate, token for token; int8, gguf, gguf16: that format's own plain decoding."""
    import torch

    spec, ref = model
    for case, prompt, kw, copies in cases_of(spec):
        ids = prompt_ids(spec, prompt)
        if spec.weights == "float32":
            with torch.no_grad():
                out = ref.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=kw["max_tokens"],
                                   pad_token_id=spec.tokenizer.eos_token_id)
            expected = out[0, len(ids):].tolist()
        else:
            expected = spec.generate(ids, temperature=0.0, speculation=False, **kw).token_ids
        res = spec.generate(ids, temperature=0.0, **kw)
        assert res.token_ids == expected, (case, spec.tokenizer.decode(res.token_ids), spec.tokenizer.decode(expected))
        if copies:  # the suffix drafters really drafted, and the target really accepted
            assert res.stats.accepted_tokens > 0, (case, res.stats.to_dict())
    if spec.model_name == GEMMA:
        assert ref.config.vocab_size == 262144 and "sliding_attention" in ref.config.layer_types
        assert len(prompt_ids(spec, CASES[GEMMA][1][1])) > ref.config.sliding_window  # the window really slides


def test_seeded_sampling_is_identical_with_speculation_on_and_off(model):
    spec, _ = model
    case, prompt, kw, _ = cases_of(spec)[-1]  # the copy-heavy one: drafts on every step
    ids = prompt_ids(spec, prompt)
    drafters = {"drafters": ("prompt", "history", "documents", "references")}
    kw = {**kw, "max_tokens": 64, "temperature": 0.8, "top_p": 0.95, "seed": 7}
    on = spec.generate(ids, speculation=drafters, **kw)
    off = spec.generate(ids, speculation=False, **kw)
    assert on.token_ids == off.token_ids, (case, spec.tokenizer.decode(on.token_ids), spec.tokenizer.decode(off.token_ids))
    assert on.stats.drafted_tokens > 0 and off.stats.drafted_tokens == 0


def test_openai_client_against_a_real_server(tmp_path):
    """`suffixspec serve --model smollm2-135m-instruct` in a subprocess on 127.0.0.1; the official client."""
    import openai

    from suffixspec.api import SuffixSpec

    require(SMOLLM2)
    messages = CASES[SMOLLM2][0][1]
    with SuffixSpec(model=SMOLLM2, draft_model=None, db=False, history=False) as spec:
        expected = spec.generate(messages=messages, max_tokens=24, temperature=0.0)
    cmd = [sys.executable, "-c", "from suffixspec.cli import main; main()", "serve", "--model", SMOLLM2,
           "--db", str(tmp_path / "serve.db"), "--port", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # one torch thread, as in this process
    proc, url = start_server_process(cmd, env=env, timeout=600)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == [SMOLLM2]
        resp = client.chat.completions.create(model=SMOLLM2, messages=messages, max_tokens=24, temperature=0)
        assert resp.choices[0].message.content == expected.text
        assert resp.usage.completion_tokens == len(expected.token_ids)
        assert resp.usage.prompt_tokens == len(expected.prompt_token_ids)
        assert resp.model == SMOLLM2 and resp.speculative_decoding["steps"] > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def test_a_conversion_killed_with_sigkill_leaves_nothing_half_made(tmp_path, monkeypatch):
    """SIGKILL from outside while SmolLM2's GGUF is being converted; the next load converts it again
    into the same files as the shared cache holds."""
    from suffixspec.loading import resolve_model_path

    require(SMOLLM2)
    shared = Path(resolve_model_path(SMOLLM2))  # converted already (the fixtures), or now
    cache = tmp_path / "cache"
    env = {**os.environ, "SUFFIXSPEC_CACHE": str(cache)}
    code = "from suffixspec.loading import resolve_model_path; resolve_model_path('smollm2-135m-instruct')"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    seen = b""
    while b"dequantizing the weights" not in seen:  # the tokenizer is written: a folder half made
        chunk = proc.stderr.read1(4096)
        assert chunk, f"the conversion ended before it could be killed: {seen[-2000:]!r}"
        seen += chunk
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    models = cache / "models"
    assert not (models / SMOLLM2).exists()
    leftover = next(models.glob(f".{SMOLLM2}.tmp-*"))
    assert (leftover / "tokenizer.json").exists() and not (leftover / "source.json").exists()

    monkeypatch.setenv("SUFFIXSPEC_CACHE", str(cache))
    again = Path(resolve_model_path(SMOLLM2, progress=False))
    assert again == models / SMOLLM2 and not list(models.glob(".*.tmp-*"))
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert _sha256(again / name) == _sha256(shared / name), name
    assert cache_dir() == cache


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
