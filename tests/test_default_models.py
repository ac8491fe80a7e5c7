"""The embedded default models load by name, generate Python, copy, and differ in tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from suffixspec.loading import load_model, resolve_model_path
from suffixspec.models import DEMO_DRAFT as DEFAULT_DRAFT
from suffixspec.models import DEMO_TARGET as DEFAULT_TARGET

ROOT = Path(__file__).resolve().parent.parent

SNIPPET = (
    "def parse_header(line):\n"
    "    key, _, value = line.partition(':')\n"
    "    return key.strip().lower(), value.strip()\n"
)


@pytest.fixture(scope="module")
def target():
    return load_model(DEFAULT_TARGET, device="cpu")


@pytest.fixture(scope="module")
def draft():
    return load_model(DEFAULT_DRAFT, device="cpu")


def greedy(lm, text: str, n: int) -> str:
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                pad_token_id=lm.tokenizer.pad_token_id)
    return lm.tokenizer.decode(out[0, ids.shape[1]:])


@pytest.mark.parametrize("name", [DEFAULT_TARGET, DEFAULT_DRAFT])
def test_loads_by_name_in_float32(name, request):
    lm = request.getfixturevalue("target" if name == DEFAULT_TARGET else "draft")
    assert lm.name == name
    assert lm.model.dtype == torch.float32
    assert lm.tokenizer.eos_token_id is not None
    assert lm.model.config.vocab_size == len(lm.tokenizer)


@pytest.mark.parametrize("fixture", ["target", "draft"])
def test_generates_text_greedily(fixture, request):
    lm = request.getfixturevalue(fixture)
    ids = lm.tokenizer("for i in range(", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, min_new_tokens=16,
                                do_sample=False, pad_token_id=lm.tokenizer.pad_token_id)
    assert out.shape[1] == ids.shape[1] + 16
    text = lm.tokenizer.decode(out[0, ids.shape[1]:])
    assert text.strip() and text.isascii(), text


def test_draft_writes_python(draft):
    # The shipped target is too undertrained for a coherence check (see its model card); the draft
    # writes Python-looking lines after a few lines of code (from a bare "for i in range(" it loops).
    text = greedy(draft, SNIPPET + "\n\ndef main(argv):\n    for name in argv:\n", 24)
    assert "\n" in text and any(kw in text for kw in ("if ", "def ", "return", "self", "for ", "None")), text


def test_target_copies_from_context(target):
    # The target starts from a built-in induction circuit (see its model card): code that appeared
    # earlier in the prompt is continued verbatim once a few of its tokens are repeated (the copy follows the longest agreement with the last 16).
    code = SNIPPET + "\ndef render(rows, sep=', '):\n    return '\\n'.join(sep.join(map(str, r)) for r in rows)\n"
    cue = code[: code.index(" value = ")]
    text = greedy(target, code + "\n\n" + cue, 12)
    assert (cue + text).startswith(code[: len(cue) + 20]), text


def test_tokenizers_differ(target, draft):
    t, d = target.tokenizer, draft.tokenizer
    assert len(t) != len(d)
    assert t.convert_ids_to_tokens(t(SNIPPET)["input_ids"]) != d.convert_ids_to_tokens(d(SNIPPET)["input_ids"])
    for tok in (t, d):  # both round-trip ordinary code
        assert tok.decode(tok(SNIPPET)["input_ids"]) == SNIPPET


@pytest.mark.parametrize("fixture", ["target", "draft"])
def test_chat_template(fixture, request):
    tok = request.getfixturevalue(fixture).tokenizer
    assert tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_size_and_model_cards():
    total = 0
    for name in (DEFAULT_TARGET, DEFAULT_DRAFT):
        d = Path(resolve_model_path(name))
        total += sum(f.stat().st_size for f in d.iterdir())
        assert json.loads((d / "config.json").read_text())["dtype"] == "float32"
        card = (d / "README.md").read_text()
        assert "held-out loss" in card and "tokens/s" in card
    assert total <= 60 * 2**20  # the two together ship in the package: at most 60 MB
    assert (ROOT / "tools" / "training" / "heldout.txt").exists()  # the held-out files the cards name


def test_a_local_folder_named_like_an_embedded_model_wins(tmp_path, monkeypatch):
    """``suffixspec/x`` names an embedded model, unless a folder of that relative path exists (as a local
    folder wins over a hub id in transformers); an unknown embedded name says what to pass instead."""
    from suffixspec.models import embedded_path

    assert resolve_model_path(DEFAULT_TARGET) != DEFAULT_TARGET
    (tmp_path / "suffixspec" / "my-model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("suffixspec/my-model") == "suffixspec/my-model"
    with pytest.raises(FileNotFoundError, match="pass a model name, a folder or a .gguf"):
        embedded_path("suffixspec/no-such-model")
