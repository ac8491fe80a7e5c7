"""lean.py: every family the lean forward claims gives ``transformers``' own logits.

Tiny random models per model type (norm weights and biases made non-zero, so a missed ``1 + w`` or
bias shows), and the real SmolLM2-135M-Instruct and Gemma 3 270M (``slow``, ``real_model``): a
prompt prefilled in one pass, then a tree of draft nodes after it, in two rows of different
lengths; each node's logits against the model's forward over that node's whole path. Windows of 8
(tiny) and Gemma's 512 are passed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from suffixspec.core.kv import SlotCache
from suffixspec.core.lean import LeanForward, PassRow, lean_forward
from suffixspec.core.lean_weights import FAMILIES, unsupported
from suffixspec.core.weights import _onednn_packs, linear, packed

VOCAB = 300
REAL = {"smollm2": "smollm2-135m-instruct", "gemma3": "gemma-3-270m"}  # names of suffixspec.models


def _tiny(model_type: str):
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
    cfg = {"llama": lambda: LlamaConfig(**common),
           "qwen2": lambda: Qwen2Config(**common),
           "mistral": lambda: MistralConfig(sliding_window=8, **common),
           "gemma3_text": lambda: Gemma3TextConfig(head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                                                   layer_types=["sliding_attention", "full_attention",
                                                                "sliding_attention"], **common)}[model_type]()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("bias"):
                p.copy_(torch.randn_like(p))
        model.get_output_embeddings().weight.mul_(4.0)
    return model


def _path_logits(model, prompt: list[int], tokens: list[int], parents: list[int]) -> list[torch.Tensor]:
    """The model's own last-position logits after ``prompt`` and each draft node's path (root first)."""
    out = []
    for k in range(len(tokens) + 1):
        path, node = [], k - 1
        while node >= 0:
            path.append(tokens[node])
            node = parents[node]
        with torch.inference_mode():
            out.append(model(input_ids=torch.tensor([prompt + path[::-1]], device=model.device)).logits[0, -1].float())
    return out


def _compare(model, prompt: list[int], short: int, tol: float) -> None:
    lean = LeanForward(model)
    cache = SlotCache(2, capacity=16)  # small: it grows on the way
    rows = [cache.add_row(), cache.add_row()]
    with torch.inference_mode():
        ref = model(input_ids=torch.tensor([prompt])).logits[0].float()
    out = lean([PassRow(rows[0], prompt[:-1], None, 0, "all"), PassRow(rows[1], prompt[:short], None, 0, "last")],
               cache)
    scale = max(1.0, float(ref.abs().max()))
    assert float((out[0] - ref[:-1]).abs().max()) <= tol * scale
    assert float((out[1][0] - ref[short - 1]).abs().max()) <= tol * scale
    cache.lengths[:] = [len(prompt) - 1, short]
    tokens, parents = [5, 6, 7, 8, 9], [-1, 0, 0, 2, -1]  # 5 -> {6, 7 -> 8}, 9
    got = lean([PassRow(rows[1], [prompt[short]], [], short),  # rows in any order
                PassRow(rows[0], [prompt[-1], *tokens], parents, len(prompt) - 1)], cache)
    for k, want in enumerate(_path_logits(model, prompt, tokens, parents)):
        assert float((got[1][k] - want).abs().max()) <= tol * scale, k
    assert float((got[0][0] - ref[short]).abs().max()) <= tol * scale
    # a pass over one token alone (a plain step: with packed weights it runs on the model's own matrices)
    one = lean([PassRow(rows[1], [prompt[short]], [], short)], cache)
    assert float((one[0][0] - ref[short]).abs().max()) <= tol * scale


def test_every_claimed_family_is_tested():
    assert set(FAMILIES) == {"llama", "qwen2", "mistral", "gemma3_text"}


@pytest.mark.parametrize("onednn", ["1", "0"])  # weights packed for oneDNN (where it works), or plain
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_lean_equals_transformers(model_type, onednn, monkeypatch):
    """A 20-token prompt (past the tiny windows of 8) and a tree after it, in two rows of different lengths."""
    monkeypatch.setenv("SUFFIXSPEC_ONEDNN", onednn)
    model = _tiny(model_type)
    weights = LeanForward(model).layers[0]
    packs = onednn == "1" and _onednn_packs("cpu", torch.float32)
    assert weights.w_qkv.is_mkldnn == weights.wd.is_mkldnn == (weights.plain is not None) == packs
    assert unsupported(model) is None
    prompt = [int(t) for t in np.random.RandomState(1).randint(3, VOCAB, size=20)]
    _compare(model, prompt, short=5, tol=1e-5)


@pytest.mark.parametrize("model_type", ["qwen2", "gemma3_text"])
def test_a_large_model_steps_on_packed_weights_and_pages_its_own_out(model_type, monkeypatch, tmp_path):
    """Past PLAIN_ONE_TOKEN_MAX_PARAMS (the Qwen pair) a one-token pass runs on the packed matrices, the
    model's own are paged out (a memory-mapped safetensors file, as a converted folder loads), and both the
    lean forward and the model's own forward still give transformers' logits; the model's forward inside
    ``paging_own_forward`` too (its outputs untouched by the hooks)."""
    from safetensors.torch import load_file

    import suffixspec.core.lean_weights as lean_weights

    if not _onednn_packs("cpu", torch.float32):
        pytest.skip("this torch has no working oneDNN linear: nothing is packed, nothing paged out")
    monkeypatch.setattr(lean_weights, "PLAIN_ONE_TOKEN_MAX_PARAMS", 0)
    model = _tiny(model_type)
    model.save_pretrained(tmp_path)
    model.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False, assign=True)  # mmap-backed
    model.tie_weights()
    prompt = [int(t) for t in np.random.RandomState(2).randint(3, VOCAB, size=20)]
    with torch.inference_mode():
        ref = model(input_ids=torch.tensor([prompt])).logits[0].float()
    lean = LeanForward(model)
    assert all(L.plain is None for L in lean.layers)
    assert lean.paged_out > 0  # Linux: madvise(MADV_PAGEOUT) was accepted for whole pages of the matrices
    _compare(model, prompt, short=5, tol=1e-5)
    with torch.inference_mode():
        assert torch.equal(model(input_ids=torch.tensor([prompt])).logits[0].float(), ref)  # values never change
        with lean_weights.paging_own_forward(model) as _:
            assert torch.equal(model(input_ids=torch.tensor([prompt])).logits[0].float(), ref)


def test_page_out_is_safe_on_memory_no_file_backs():
    from suffixspec.core.lean_weights import page_out

    w = torch.randn(4096, 64)
    before = w.clone()
    page_out([w, w[:, :3], torch.empty(0)])  # anonymous memory: nothing to drop without swap; a view: skipped
    assert torch.equal(w, before)


def test_packed_weights_give_the_plain_product():
    """Where oneDNN works here (a CPU torch built with it: this machine's), a packed weight's product equals
    ``x @ w.T + b`` for 1 to 40 rows, and other dtypes stay unpacked (only float32 is measured to pay)."""
    if not _onednn_packs("cpu", torch.float32):
        pytest.skip("this torch has no working oneDNN linear: weights stay plain, tested by the other cases")
    gen = torch.Generator().manual_seed(3)
    w, b = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    p = packed(w)
    assert p.is_mkldnn and tuple(p.shape) == (96, 64)
    for rows in (1, 2, 3, 9, 40):
        x = torch.randn(rows, 64, generator=gen)
        torch.testing.assert_close(linear(x, p, b), x @ w.t() + b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(linear(x, w, b), x @ w.t() + b, rtol=1e-5, atol=1e-5)
    assert not packed(w.to(torch.bfloat16)).is_mkldnn and not packed(w.double()).is_mkldnn


def test_other_models_have_no_lean_forward_and_say_why():
    from transformers import AutoModelForCausalLM, GPT2Config

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    assert lean_forward(gpt2) is None and "gpt2" in unsupported(gpt2)
    with pytest.raises(ValueError, match="no lean forward"):
        LeanForward(gpt2)


def test_one_lean_forward_per_model():
    """Its fused weights exist once, however many runners (target, draft) use the model."""
    model = _tiny("llama")
    assert lean_forward(model) is lean_forward(model)


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("name", ["smollm2", pytest.param("gemma3", marks=pytest.mark.gemma)])
def test_lean_equals_transformers_on_real_models(name, one_torch_thread):
    """SmolLM2-135M-Instruct (Llama) and Gemma 3 270M (sliding windows of 512): a 600-token prompt."""
    from test_real_models import require

    from suffixspec.loading import load_model

    require(REAL[name])  # skips (fails in CI) with the install command when the model is not installed
    loaded = load_model(REAL[name], device="cpu")
    text = (Path(__file__).resolve().parent.parent / "suffixspec" / "core" / "scheduler.py").read_text()
    prompt = loaded.tokenizer.encode(text)[:600]
    assert len(prompt) == 600
    _compare(loaded.model, prompt, short=100, tol=2e-4)


@pytest.mark.parametrize("node", [None, 2])  # the root's logits, or one node of the probe's tree
def test_the_batching_probe_catches_a_lean_forward_that_differs(node):
    """Runner.batch_problem checks the root and every tree node against the model's own forward: a lean
    forward off by a little at one position makes the runner refuse to batch, and say why."""
    from suffixspec.core.runner import Runner

    runner = Runner(_tiny("llama"), rows=2)
    assert runner.batch_problem() is None
    lean = runner.lean

    def off(rows, cache):
        out = lean(rows, cache)
        if len(rows) == 2 and rows[1].ids:  # the probe's batched pass (not the prefills)
            out[0] = out[0].clone()
            out[0][0 if node is None else node + 1] += 0.5
        return out

    runner.lean = off
    assert "differ from the model's own" in runner.batch_problem()


# -- a transformers release that renames what the lean forward reads ---------------------------------------

def _rename_rms_norm_eps(model, monkeypatch) -> None:
    """As a release that renamed ``LlamaConfig.rms_norm_eps`` would leave a loaded model: neither the config
    class nor the model's config has the name. The model's own norms keep the epsilon they were built with,
    so its forward is untouched; the lean build, which reads the name, fails."""
    monkeypatch.delattr(type(model.config), "rms_norm_eps", raising=False)  # transformers 5: a class default
    monkeypatch.delattr(model.config, "rms_norm_eps")


def test_a_start_with_a_renamed_internal_serves_the_same_tokens(tiny_model_dirs, monkeypatch, caplog):
    """A real tiny Llama whose lean build reads a name its transformers lacks: the engine starts, says why in
    one warning, serves through the model's own forward, and greedy, seeded and speculative outputs equal
    those of the intact model on the lean forward."""
    import logging

    from doubles import OracleProposer

    from suffixspec.config import SamplingParams, SpeculationConfig
    from suffixspec.loading import load_model
    from suffixspec.runtimes.engine import Engine

    path = str(tiny_model_dirs["llama"])
    params = [SamplingParams(max_tokens=24, ignore_eos=True),
              SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, seed=3)]
    intact = Engine(load_model(path, device="cpu"))
    assert intact.scheduler.runner.lean is not None
    want = [intact.generate("def add(a, b):", sp, speculation=False).token_ids for sp in params]

    loaded = load_model(path, device="cpu")
    _rename_rms_norm_eps(loaded.model, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="suffixspec"):
        engine = Engine(loaded)
        got = [engine.generate("def add(a, b):", sp, speculation=False).token_ids for sp in params]
        for sp, plain in zip(params, want, strict=True):  # speculation on: a tree verified on the fallback path
            engine.proposers = [OracleProposer(plain, engine.vocab_size, corrupt_every=3, branch=True)]
            res = engine.generate("def add(a, b):", sp, SpeculationConfig(adaptive=False))
            assert res.token_ids == plain and res.stats.accepted_tokens > 0
        engine.proposers = []
    assert got == want
    assert engine.scheduler.runner.lean is None and engine.batchable
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "rms_norm_eps" in warnings[0] and "model's own forward" in warnings[0]


def test_a_draft_model_whose_lean_build_fails_drafts_with_its_own_forward(tiny_model_dirs, monkeypatch):
    """The draft model's runner falls back the same way: the same logits from its own forward and cache."""
    from suffixspec.drafting.proposers.model_drafter import DraftRunner
    from suffixspec.loading import load_model

    path = str(tiny_model_dirs["llama"])
    intact, broken = load_model(path, device="cpu"), load_model(path, device="cpu")
    _rename_rms_norm_eps(broken.model, monkeypatch)
    lean, own = DraftRunner(intact), DraftRunner(broken)
    assert lean.lean is not None and own.lean is None
    ids = [5, 9, 30, 7, 12, 40, 3]
    for n in (4, 7, 6):  # a prompt, its extension, a rewrite (the cache is cropped)
        torch.testing.assert_close(own.logits_after(ids[:n]), lean.logits_after(ids[:n]), rtol=1e-5, atol=1e-5)


# -- attention in one call per group of rows -------------------------------------------------------------

def _rows_pass(lean: LeanForward, prompts: list[list[int]], drafts: list[tuple[list[int], list[int]]],
               order: list[int]) -> list[torch.Tensor]:
    """Each prompt prefilled into its own cache row, then one pass over the rows in ``order`` (root + draft)."""
    cache = SlotCache(len(prompts), capacity=16)
    rows = [cache.add_row() for _ in prompts]
    for r, p in zip(rows, prompts, strict=True):
        lean([PassRow(r, p[:-1], None, 0, "none")], cache)
        cache.lengths[r] = len(p) - 1
    out = lean([PassRow(rows[j], [prompts[j][-1], *drafts[j][0]], drafts[j][1], len(prompts[j]) - 1) for j in order],
               cache)
    return [out[order.index(j)] for j in range(len(prompts))]


@pytest.mark.parametrize("model_type", ["llama", "mistral", "gemma3_text"])  # full attention; windows of 8
def test_rows_grouped_in_one_attention_call_equal_each_row_alone(model_type, monkeypatch):
    """Six rows (trees of one shape, chains, lone roots; contexts inside and past the windows) in one pass:
    every grouping (all in one call per layer, padded and masked; each alone; the cost rule's) gives each
    row the logits it gets alone and transformers' own."""
    import suffixspec.core.lean as lean_module

    model = _tiny(model_type)
    lean = LeanForward(model)
    rng = np.random.RandomState(2)
    prompts = [[int(t) for t in rng.randint(3, VOCAB, size=n)] for n in (12, 13, 21, 6, 14, 30)]
    tree = ([5, 6, 7], [-1, 0, 0])
    drafts = [tree, tree, ([8, 9, 10], [-1, 0, 1]), ([], []), tree, ([], [])]
    order = [3, 0, 5, 1, 4, 2]  # cache rows out of order in the pass: keys gathered, not sliced
    alone = [_rows_pass(lean, [prompts[j]], [drafts[j]], [0])[0] for j in range(len(prompts))]
    for scores in (10**12, 0, lean_module.CALL_SCORES):
        monkeypatch.setattr(lean_module, "CALL_SCORES", scores)
        got = _rows_pass(lean, prompts, drafts, order)
        for j, (want, row) in enumerate(zip(alone, got, strict=True)):
            torch.testing.assert_close(row, want, rtol=1e-5, atol=1e-5 * max(1.0, float(want.abs().max())),
                                       msg=f"row {j}, CALL_SCORES {scores}")
    refs = _path_logits(model, prompts[0], *tree)  # and transformers' own, for one row of the one-call grouping
    monkeypatch.setattr(lean_module, "CALL_SCORES", 10**12)
    got = _rows_pass(lean, prompts, drafts, order)[0]
    for k, want in enumerate(refs):
        assert float((got[k] - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max())), k


def test_grouping_follows_the_cost_of_a_call(monkeypatch):
    """Rows share a call where padding them costs fewer scores than the calls saved (on a CPU: none, so rows of
    one shape only); a prompt over an empty cache stays alone; groups in cache-row order."""
    import suffixspec.core.lean as lean_module

    lean = LeanForward(_tiny("llama"))  # 4 heads
    one = (np.zeros(1, dtype=np.int64), np.ones((1, 1), bool))
    steps = [PassRow(j, [5], [], past) for j, past in enumerate((400, 400, 400, 900))]
    assert lean._grouping(steps, [one] * 4) == [[0, 1, 2], [3]]
    tree = (np.array([0, 1, 2]), np.tril(np.ones((3, 3), bool)))
    rows = [PassRow(0, [5, 6, 7], [-1, 0], 40), PassRow(1, [5], [], 40), PassRow(2, list(range(3, 23)), None, 0),
            PassRow(3, [8, 9, 10], [-1, 0], 40)]
    blocks = [tree, one, (np.arange(20), None), tree]
    assert lean._grouping(rows, blocks) == [[2], [1], [0, 3]]
    # a lone root padded to 3 queries at 40 keys: 352 more scores than apart
    monkeypatch.setattr(lean_module, "CALL_SCORES", 400)
    assert lean._grouping(rows, blocks) == [[2], [0, 1, 3]]
    monkeypatch.setattr(lean_module, "CALL_SCORES", 300)
    assert lean._grouping(rows, blocks) == [[2], [1], [0, 3]]


@pytest.mark.parametrize("window", [None, 3, 8])
def test_masks_built_on_the_device_equal_tree_masks(window):
    """LeanForward._masks (one row, and rows padded to a group's shape) against kv.tree_mask, random trees."""
    from suffixspec.core.kv import additive, tree_block, tree_mask

    lean = LeanForward(_tiny("llama"))
    rng = np.random.RandomState(window or 0)
    sel = []
    for past in (0, 2, 9, 15):
        n = int(rng.randint(1, 7))
        parents = [int(rng.randint(-1, i)) for i in range(n - 1)]
        sel.append(PassRow(0, [5] * n, parents, past))
    blocks = [tree_block(r.parents) for r in sel]
    width, end = max(len(r.ids) for r in sel), max(r.past + len(r.ids) for r in sel)
    start = min(0 if window is None else max(0, r.past - window + 1) for r in sel)
    group = lean._masks(sel, blocks, window, start, 1, end, width)  # [B, 1, width, end - start]
    for b, r in enumerate(sel):
        n = len(r.ids)
        first, allowed = tree_mask(r.parents, r.past, (window,))[1][window].first, None
        allowed = tree_mask(r.parents, r.past, (window,))[1][window].allowed
        if allowed is None:  # the root alone: every key from first on
            allowed = np.ones((1, r.past + 1 - first), dtype=bool)
        want = additive(allowed, lean.dtype, "cpu")
        assert torch.equal(lean._masks([r], [blocks[b]], window, first, 1)[0, 0], want)
        row = group[b, 0, :n]
        assert torch.equal(row[:, first - start : r.past + n - start], want)
        assert bool((row[:, : first - start] < 0).all()) and bool((row[:, r.past + n - start :] < 0).all())
        assert bool((group[b, 0, n:, r.past - start] == 0).all())  # padding queries see their row's root
