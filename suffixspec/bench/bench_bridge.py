"""Bridged draft model vs transformers' universal assisted generation, side by side in one run.

Same target, same draft (a different tokenizer), same prompts, greedy:

- ``plain``: ``target.generate(ids, do_sample=False)`` (the reference output and speed);
- ``hf-uag``: ``target.generate(ids, assistant_model=draft, tokenizer=target_tok,
  assistant_tokenizer=draft_tok, do_sample=False)`` (skipped, with the reason, on the ``transformers``
  releases that break it: :mod:`suffixspec.bench.uag`);
- ``ours-text`` / ``ours-intersection``: the suffixspec engine with the bridged draft proposer,
  configured as a user gets it: the proposer's defaults (only ``--min-confidence`` is passed, its
  default is the proposer's) and the engine's default ``SpeculationConfig`` (adaptive: the cost
  gates of ``suffixspec/drafting/gates.py``, ``DraftGate`` and ``ProposerGate``, skip a draft, or the
  drafter, whose accepted tokens do not pay for its time, so on a CPU a weak draft is not verified
  at every step);
- with ``--always``, also ``ours-text-always`` / ``ours-intersection-always``: the same with
  ``SpeculationConfig(adaptive=False)`` (a per-request option of the API), which drafts and
  verifies at every step as transformers does: the like-for-like comparison of acceptance.

Reported per system: tokens/s (median over repeats of total new tokens / total time), target
forward passes (counted with a hook on the target model for every system, prefill included),
tokens per step (new tokens / target forward passes: the same count for all, so our separate
prefill pass counts against us), and whether the output equals plain greedy. The issue's
criterion (tokens per step at least transformers' and tokens/s at least 1.3x) is printed per row.
Prompts: the first lines of held-out standard-library files (``tools/training/heldout.txt``),
cut at a line boundary. It runs from a checkout of the repository (the training tools are not installed).

    python -m suffixspec.bench.bench_bridge [--target suffixspec/demo-target] [--draft suffixspec/demo-draft]
                                 [--prompts 8] [--tokens 96] [--repeats 2] [--always] [--baseline]
                                 [--json out.json]

Without the embedded models (or with ``--tiny``), tiny random models stand in: a smoke run whose
acceptance figures mean nothing. ``--trained-tiny STEPS`` trains a small pair with the project's
two tokenizer recipes on standard-library training files first (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # the checkout


def training_data():
    """``tools/training/data.py`` of this checkout: the held-out files and the tokenizer recipes."""
    sys.path.insert(0, str(ROOT))
    from tools.training import data

    return data


def heldout_prompts(n: int, chars: int = 700) -> list[str]:
    """The first ~``chars`` characters (whole lines) of ``n`` held-out stdlib files."""
    data = training_data()
    rels = [ln.strip() for ln in data.HELDOUT_FILE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    out: list[str] = []
    for text in data.read_texts(rels):
        if len(text) < chars + 400:
            continue
        cut = text.rfind("\n", 0, chars) + 1
        out.append(text[:cut])
        if len(out) >= n:
            break
    return out


def tiny_models() -> tuple[str, str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import build_tiny_model, train_bpe_tokenizer, train_unigram_tokenizer

    root = Path(tempfile.mkdtemp(prefix="suffixspec-bench-bridge-"))
    target = build_tiny_model("llama", train_bpe_tokenizer(root / "bpe"), root / "target", layers=6, hidden=256)
    draft = build_tiny_model("llama", train_unigram_tokenizer(root / "uni"), root / "draft", seed=1, hidden=64)
    return str(target), str(draft)


def trained_tiny_models(steps: int = 400, root: Path | None = None) -> tuple[str, str]:
    """A small target (byte-level BPE, 4 x 128) and draft (Metaspace BPE, 2 x 96) trained for a
    few hundred steps on standard-library training files: confident enough for acceptance figures
    to mean something while the embedded models are not there. Cached in ``root``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    data = training_data()

    root = root or Path(tempfile.gettempdir()) / f"suffixspec-bench-bridge-trained-{steps}"
    dirs = (root / "target", root / "draft")
    if all((d / "config.json").exists() for d in dirs):
        return str(dirs[0]), str(dirs[1])
    train, _ = data.split_files(data.stdlib_files())
    texts = data.read_texts(train[::7])[:200]
    text = "\n".join(texts)[:1_500_000]
    g = torch.Generator().manual_seed(0)
    for (tok, layers, hidden), out in zip(
            ((data.train_target_tokenizer(texts, 1024), 4, 128), (data.train_draft_tokenizer(texts, 800), 2, 96)), dirs,
            strict=True):
        ids = torch.tensor(tok.encode(text, add_special_tokens=False))
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 3,
                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=2048, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                          pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
        seq, batch = 128, 16
        for step in range(steps):
            starts = torch.randint(0, len(ids) - seq - 1, (batch,), generator=g)
            x = torch.stack([ids[s : s + seq] for s in starts])
            loss = model(input_ids=x, labels=x).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            for group in opt.param_groups:
                group["lr"] = 3e-3 * (1 - step / steps)
        print(f"[bench_bridge] trained {out.name}: vocab {len(tok)}, loss {float(loss):.2f}", file=sys.stderr)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tok.save_pretrained(out)
    return str(dirs[0]), str(dirs[1])


class ForwardCounter:
    """Counts forward passes of a model (a forward pre-hook)."""

    def __init__(self, model) -> None:
        self.calls = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


def run_hf(target, draft, ids: torch.Tensor, tokens: int, assisted: bool) -> tuple[list[int], float, int]:
    kwargs = dict(do_sample=False, max_new_tokens=tokens, attention_mask=torch.ones_like(ids))
    if assisted:
        kwargs.update(assistant_model=draft.model, tokenizer=target.tokenizer, assistant_tokenizer=draft.tokenizer)
    counter = ForwardCounter(target.model)
    try:
        t = time.perf_counter()
        with torch.inference_mode():
            out = target.model.generate(ids, **kwargs)
        dt = time.perf_counter() - t
    finally:
        counter.handle.remove()
    return out[0, ids.shape[1]:].tolist(), dt, counter.calls


def run_ours(engine, ids: list[int], tokens: int, speculation=None) -> tuple[list[int], float, int, dict]:
    from suffixspec.config import SamplingParams

    counter = ForwardCounter(engine.model)
    try:
        t = time.perf_counter()
        res = engine.generate(ids, SamplingParams(max_tokens=tokens), speculation)
        dt = time.perf_counter() - t
    finally:
        counter.handle.remove()
    return res.token_ids, dt, counter.calls, res.stats.to_dict()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="suffixspec/demo-target")
    ap.add_argument("--draft", default="suffixspec/demo-draft")
    ap.add_argument("--tiny", action="store_true", help="use tiny random models (smoke run)")
    ap.add_argument("--trained-tiny", type=int, default=0, metavar="STEPS",
                    help="train a small target/draft pair for STEPS steps and use it (cached in the temp dir)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="text,intersection")
    ap.add_argument("--device", default=None)
    ap.add_argument("--min-confidence", type=float, default=0.3, help="our drafter's confidence cut-off")
    ap.add_argument("--always", action="store_true",
                    help="also run our drafter with adaptive=False (draft and verify every step, as transformers)")
    ap.add_argument("--baseline", action="store_true",
                    help="also run each of our rows as the drafter was before its lean forward and present defaults "
                         "(the draft model's transformers forward, siblings=2, alternatives=1, first_confidence=0; rows "
                         "suffixed -base): "
                         "before and after in one run")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)

    from suffixspec.config import SpeculationConfig
    from suffixspec.drafting.proposers.bridged_draft import BridgedDraftProposer
    from suffixspec.loading import load_model, resolve_model_path
    from suffixspec.runtimes.engine import Engine

    target_name, draft_name = args.target, args.draft
    smoke = args.tiny
    if args.trained_tiny:
        target_name, draft_name = trained_tiny_models(args.trained_tiny)
    elif not smoke:
        try:
            resolve_model_path(target_name), resolve_model_path(draft_name)
        except FileNotFoundError as exc:
            print(f"[bench_bridge] {exc}; using tiny random models (smoke run)", file=sys.stderr)
            smoke = True
    if smoke:
        target_name, draft_name = tiny_models()
    target = load_model(target_name, device=args.device)
    draft = load_model(draft_name, device=args.device)
    width = int(target.model.get_output_embeddings().weight.shape[0])
    prompts = heldout_prompts(args.prompts)
    encoded = [target.tokenizer(p, return_tensors="pt")["input_ids"].to(target.device) for p in prompts]

    modes = [m for m in args.modes.split(",") if m]
    def ours(mode: str, base: bool = False) -> Engine:
        extra = {"siblings": 2, "alternatives": 1, "first_confidence": 0.0} if base else {}
        proposer = BridgedDraftProposer(draft, target.tokenizer, width, mode=mode, min_confidence=args.min_confidence,
                                        **extra)
        if base:
            proposer.runner.lean = None  # the draft model's own transformers forward
        return Engine(target, [proposer], threads=torch.get_num_threads())

    engines: dict[str, Engine] = {}
    specs: dict[str, SpeculationConfig | None] = {}  # None: the engine's default SpeculationConfig
    for base in (False, True) if args.baseline else (False,):
        tag = "-base" if base else ""
        for m in modes:  # own engines: the engine's learned verify costs stay per system
            engines[f"ours-{m}{tag}"] = ours(m, base)
            specs[f"ours-{m}{tag}"] = None
        if args.always:
            for m in modes:
                engines[f"ours-{m}-always{tag}"] = ours(m, base)
                specs[f"ours-{m}-always{tag}"] = SpeculationConfig(adaptive=False)
    from suffixspec.bench.uag import uag_defect

    broken = uag_defect()  # this transformers' universal assisted generation crashes or is no fair peer
    if broken:
        print(f"[bench_bridge] skipping hf-uag: {broken}", file=sys.stderr)
    systems = ["plain", *([] if broken else ["hf-uag"]), *engines]
    times = {s: [] for s in systems}  # per repeat: total seconds over all prompts
    steps = {s: 0 for s in systems}
    new_tokens = {s: 0 for s in systems}
    outputs: dict[str, list[list[int]]] = {s: [] for s in systems}
    stats: dict[str, list[dict]] = {s: [] for s in engines}
    # warm-up (first calls allocate, build the bridge tables)
    run_hf(target, draft, encoded[0], 8, assisted=not broken)
    for name, e in engines.items():
        run_ours(e, encoded[0][0].tolist(), 8, specs[name])
    for rep in range(args.repeats):
        total = {s: 0.0 for s in systems}
        for ids in encoded:
            for s in systems:  # interleaved, so machine load hits every system alike
                if s in engines:
                    out, dt, n_steps, st = run_ours(engines[s], ids[0].tolist(), args.tokens, specs[s])
                    if rep == 0:
                        stats[s].append(st)
                else:
                    out, dt, n_steps = run_hf(target, draft, ids, args.tokens, assisted=s == "hf-uag")
                total[s] += dt
                if rep == 0:
                    steps[s] += n_steps
                    new_tokens[s] += len(out)
                    outputs[s].append(out)
        for s in systems:
            times[s].append(total[s])
    report: dict = {"target": target_name, "draft": draft_name, "smoke": smoke, "device": target.device,
                    "prompts": len(prompts), "max_new_tokens": args.tokens, "repeats": args.repeats,
                    "coverage": next(iter(engines.values())).proposers[0].bridge.coverage().to_dict() if engines else None,
                    "systems": {}, "skipped": {"hf-uag": broken} if broken else {}}
    base = statistics.median(times["plain"])
    for s in systems:
        med = statistics.median(times[s])
        same = sum(a == b for a, b in zip(outputs[s], outputs["plain"], strict=True))
        report["systems"][s] = {
            "tokens_per_s": round(new_tokens[s] / med, 2),
            "speedup_over_plain": round(base / med, 3),
            "tokens_per_step": round(new_tokens[s] / max(1, steps[s]), 3),
            "target_passes": steps[s],
            "new_tokens": new_tokens[s],
            "outputs_equal_plain": f"{same}/{len(prompts)}",
        }
        if s in stats:
            drafted = sum(x["drafted_tokens"] for x in stats[s])
            accepted = sum(x["accepted_tokens"] for x in stats[s])
            report["systems"][s]["acceptance_rate"] = round(accepted / max(1, drafted), 3)
            verify_steps = sum(x["steps"] for x in stats[s])
            report["systems"][s]["verify_steps"] = verify_steps
            report["systems"][s]["propose_s_per_step"] = round(
                sum(x["time_propose_s"] for x in stats[s]) / max(1, verify_steps), 5)
    if "hf-uag" in report["systems"]:
        uag = report["systems"]["hf-uag"]
        for s in engines:
            r = report["systems"][s]
            r["speed_vs_hf_uag"] = round(r["tokens_per_s"] / uag["tokens_per_s"], 3)
            r["tokens_per_step_vs_hf_uag"] = round(r["tokens_per_step"] / uag["tokens_per_step"], 3)
            r["meets_criterion"] = bool(r["tokens_per_step"] >= uag["tokens_per_step"]
                                        and r["tokens_per_s"] >= 1.3 * uag["tokens_per_s"])
    print(f"target={target_name} draft={draft_name} smoke={smoke} prompts={len(prompts)} tokens={args.tokens}")
    print(f"{'system':30s} {'tok/s':>8s} {'x plain':>8s} {'tok/step':>9s} {'passes':>7s} {'equal':>7s} {'vs uag':>7s}"
          f" {'criterion':>9s}")
    for s, r in report["systems"].items():
        met = {True: "met", False: "not met"}.get(r.get("meets_criterion"), "")
        print(f"{s:30s} {r['tokens_per_s']:8.1f} {r['speedup_over_plain']:8.2f} {r['tokens_per_step']:9.3f} "
              f"{r['target_passes']:7d} {r['outputs_equal_plain']:>7s} {r.get('speed_vs_hf_uag', ''):>7} {met:>9s}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
