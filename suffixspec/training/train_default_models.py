"""Train the embedded default models: ``demo-target`` (byte-level BPE, Llama) and ``demo-draft``
(Unigram/Metaspace, a much smaller Llama), on the Python standard library's source.

    python -m suffixspec.training.train_default_models --out suffixspec/default_models

Schedule (wall-clock budgets, so it ends on time on a slow or shared machine; the step counts actually
run are written into each model's training.json and can be replayed with ``--*-steps``):

1. tokenizers; the draft model on plain code (``--draft-minutes``);
2. the target model: a Llama initialised with a hand-built 16-token induction (copy) circuit
   (``induction.py``; a model this small does not discover copying within a CPU budget of minutes),
   then trained on plain code, code windows copied after a separator or in a chat turn, and random
   full-vocabulary copies (``--target-minutes``);
3. evaluation on the held-out files and the model cards.

The shipped models: ``--draft-steps 483 --target-steps 969`` (the counts in each training.json)
(``--reuse-draft`` retrains only the target and evaluates it against the draft already in ``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from suffixspec.training import data, evaluate, induction

SEED = 1234


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def llama_config(tok, layers: int, hidden: int, heads: int, inter: int, **extra):
    from transformers import LlamaConfig

    kw = {"rope_theta": 10000.0, **extra}
    return LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=2048,
                       tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, **kw)


def masked_loss(model, ids: torch.Tensor, mask: torch.Tensor, restrict: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy on the target tokens where ``mask`` is set; the output layer runs only there, and
    only over the ids in ``restrict`` when given (the 64-symbol alphabet of phase 1)."""
    hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]  # [B, T-1, H]
    sel = mask[:, 1:]
    targets = ids[:, 1:][sel]
    if restrict is None:
        logits = model.lm_head(hidden[sel])  # [n_selected, V]
    else:
        logits = hidden[sel] @ model.lm_head.weight[restrict].T  # [n_selected, len(restrict)]
        lookup = torch.full((model.config.vocab_size,), -100, dtype=torch.long)
        lookup[restrict] = torch.arange(len(restrict))
        targets = lookup[targets]
    return torch.nn.functional.cross_entropy(logits, targets)


def train_loop(model, make_batch, lr: float, minutes: float, max_steps: int | None, name: str,
               warmup: int = 50, decay: bool = True, stop=None, checkpoint=None, restrict=None,
               after_step=None) -> dict:
    """AdamW with warmup and cosine decay over the wall-clock budget (or ``max_steps`` when given);
    ``after_step()`` runs after every optimizer step (the frozen circuit's restore)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    t0 = time.time()
    budget = minutes * 60
    step, ema, last_ckpt = 0, None, t0
    while True:
        elapsed = time.time() - t0
        progress = step / max_steps if max_steps else elapsed / budget
        if progress >= 1.0:
            break
        scale = min(1.0, (step + 1) / warmup)
        if decay:
            scale *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        ids, mask = make_batch(progress)
        loss = masked_loss(model, ids, mask, restrict)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if after_step is not None:
            after_step()
        step += 1
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 50 == 0:
            log(f"{name} step {step} loss {loss.item():.3f} ema {ema:.3f} lr {lr * scale:.2e} "
                f"{(time.time() - t0) / step:.2f}s/step")
        if stop is not None and not max_steps and stop(step, ema):
            break
        if checkpoint is not None and time.time() - last_ckpt > checkpoint[0]:
            checkpoint[1]()
            model.train()
            last_ckpt = time.time()
    return {"steps": step, "minutes": (time.time() - t0) / 60, "final_loss_ema": ema}


def batcher(parts):
    """``parts(progress) -> list of (maker_fn, count)``; stacks one batch of (ids, mask)."""
    def make(progress: float):
        seqs = [fn() for fn, k in parts(progress) for _ in range(k)]
        ids = torch.tensor(np.stack([s[0] for s in seqs]))
        mask = torch.tensor(np.stack([s[1] for s in seqs]))
        return ids, mask
    return make


def grow(model, layers: int):
    """Append layers whose attention and MLP output projections are zero: the same function, more depth."""
    from transformers import LlamaForCausalLM

    cfg = model.config.__class__.from_dict(model.config.to_dict())
    cfg.num_hidden_layers = layers
    torch.manual_seed(SEED + layers)
    new = LlamaForCausalLM(cfg)
    missing, unexpected = new.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected, unexpected
    with torch.no_grad():
        for layer in new.model.layers[model.config.num_hidden_layers:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return new


def save(model, tok, out: Path, info: dict) -> None:
    """safetensors in float16 (half the size); config says float32 so CPU loading upcasts."""
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    half = model.__class__(model.config)
    half.load_state_dict(model.state_dict())
    half.to(torch.float16)
    half.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                              pad_token_id=tok.pad_token_id, do_sample=False)
    half.save_pretrained(out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def train_draft(tok, train_ids, args) -> tuple:
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(llama_config(tok, layers=2, hidden=96, heads=3, inter=256))
    mk = data.ExampleMaker(tok, train_ids, seq_len=256, seed=SEED)
    stats = train_loop(model, batcher(lambda p: [(mk.code_lm, 8)]), lr=3e-3, minutes=args.draft_minutes,
                       max_steps=args.draft_steps, name="draft")
    return model, stats


def target_config(tok):
    """8 heads of 128 dimensions (more than hidden/heads): 96 slowly rotating RoPE dimensions per head
    carry the 16-token match of the induction circuit (see ``induction``), which takes layers 0-2 (with
    free heads beside it); layers 3-4 are the language model's own."""
    return llama_config(tok, layers=5, hidden=256, heads=8, inter=512, head_dim=128, attention_bias=True,
                        rope_theta=induction.ROPE_THETA)


def train_target(tok, train_ids, args, on_checkpoint) -> tuple:
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(target_config(tok))
    induction.install(model, seed=SEED)
    frozen = induction.Frozen(model)
    mk = data.ExampleMaker(tok, train_ids, seq_len=256, seed=SEED + 2)

    def parts(progress: float):
        return [(lambda: mk.code_lm(0.5), 4), (mk.code_copy, 3), (lambda: mk.random_copy(None, 2), 1)]

    stats = train_loop(model, batcher(parts), lr=args.lr, minutes=args.target_minutes, max_steps=args.target_steps,
                       name="target", warmup=30, checkpoint=(300, lambda: on_checkpoint(model, {})),
                       after_step=frozen.restore)
    log(f"target done: {stats}")
    return model, {"target": stats}


@torch.no_grad()
def calibrate_copy(model, tok, train_ids, grid=(1.0, 1.25, 1.5, 2.0, 3.0)) -> float:
    """Training on code lets the language model outgrow the frozen copy output (its scale is fixed), so
    after training the induction heads' output projection is scaled by the smallest factor in ``grid``
    that reaches 90% of the best greedy copy accuracy on 20 segments of *training* files (never the
    held-out ones)."""
    o = induction.copy_output(model)
    base = o.detach().clone()
    sub = train_ids[::10]
    scores = {}
    for k in grid:
        o.copy_(base * k)
        scores[k] = evaluate.copy_accuracy(model, tok, sub, n=20)["greedy_copy_accuracy"]
        log(f"copy boost {k}: greedy copy {scores[k]:.3f} on training files")
    best = max(scores.values())
    k = min(k for k in grid if scores[k] >= 0.9 * best)
    o.copy_(base * k)
    return k


def card(kind: str, info: dict) -> str:
    m = info["metrics"]
    lines = [f"# suffixspec/demo-{kind}", ""]
    if kind == "target":
        lines += ["A small code model shipped inside suffixspec so that every entry point runs offline. "
                  "It is the default *target* model. Not useful for anything but demonstrating and testing "
                  "speculative decoding.", ""]
    else:
        lines += ["A tiny code model shipped inside suffixspec: the default *draft* model. Its tokenizer "
                  "differs from demo-target's (Unigram over Metaspace vs byte-level BPE), so drafting with it "
                  "exercises the token bridge.", ""]
    lines += [
        "## Model", "",
        f"- architecture: `LlamaForCausalLM`, {info['layers']} layers, hidden {info['hidden']}, "
        f"{info['heads']} heads, tied embeddings, {info['params'] / 1e6:.2f}M parameters",
        f"- tokenizer: {info['tokenizer']}, {info['vocab']} entries; ChatML-style chat template "
        "(`<|im_start|>role ... <|im_end|>`)",
        "- weights: safetensors, float16 on disk; `config.json` says float32, so CPU loading upcasts",
        f"- trained context: {info['context']} tokens (`max_position_embeddings` 2048, RoPE)",
        "", "## Data", "",
        "The Python standard library's own source (`sysconfig.get_paths()['stdlib']`, CPython "
        f"{info['python']}), without tests and site-packages: {info['train_files']} training files, "
        f"{info['train_tokens']:,} training tokens. {info['heldout_files']} files are held out (listed in "
        "`suffixspec/training/heldout.txt`) and used for every figure below and by the benchmarks.",
    ]
    if kind == "target":
        lines += [
            "", "Copying (reproducing text seen earlier in the context, what code edits and RAG need) does not "
            "emerge from plain code in a CPU budget of minutes, so the model starts from a hand-built induction "
            "circuit (`suffixspec/training/induction.py`) that matches the last 16 tokens. Each token has a fixed "
            "random 6-dimensional code in reserved residual dimensions (never trained: matching on trained "
            "embeddings halved the copy accuracy, as training makes frequent tokens alike); four previous-token "
            "heads in layer 0 (constant, RoPE-phased queries and keys) write the codes of the tokens 1..4 back into "
            "reserved slots, three heads in layer 1 copy that block from 4, 8 and 12 positions back (slots 5..16), "
            "and seven heads in layer 2 attend to the position whose 16 preceding codes agree most with the last "
            "16 (over the RoPE dimensions that barely rotate: `rope_theta` 1e16, head dimension 128) and copy its "
            "token embedding to the tied output layer. All other residual writes start at zero, so the untrained "
            "model is exactly a copier (greedy copy accuracy 0.95 on the held-out segments below before "
            "training). Training keeps the circuit's heads, the codes and the input norms of layers 0-2 frozen "
            "and every residual write of layers 0-1 (restored after every step; when layers 0-1 learned too, their "
            "writes blurred the match and a checkpoint copied 0.02 of a segment); nothing trains into the reserved "
            "dimensions. Layer 2's free head and MLP and layers 3-4 learn plain code (half the positions in the loss), code "
            "windows copied after a separator or inside a chat turn (user message = code, assistant = copy; "
            "from the start or an offset, sometimes with small edits) and random full-vocabulary copies (loss "
            "on the copies), 4 : 3 : 1 per batch of 8 x 256 tokens. Afterwards the induction heads' output "
            f"projection is scaled by {info.get('copy_boost', 1.0):g} (the smallest factor reaching 90% of the "
            "best copy accuracy on training files; `calibrate_copy`).",
        ]
    else:
        lines += ["", "Plain next-token prediction on the training files."]
    lines += [
        "", "## Training", "",
        f"- command: `python -m suffixspec.training.train_default_models --out suffixspec/default_models` "
        f"(both models, {info['total_minutes']:.1f} minutes in all on 2 shared CPU cores)",
        f"- this model: {info['train_minutes']:.1f} minutes, steps {info['steps']}, seed {SEED} (the budgets are "
        "wall-clock; `--" + "-steps N --".join(info["steps"]) + "-steps N` with the counts above replays them)",
        "", "## Evaluation (held-out files)", "",
        f"- held-out loss {m['heldout']['loss']:.3f} nats/token, perplexity {m['heldout']['perplexity']:.1f}, "
        f"{m['heldout']['bits_per_byte']:.3f} bits per byte ({m['heldout']['tokens']:,} tokens)",
    ]
    if "copy" in m:
        c = m["copy"]
        lines += [
            f"- greedy copy accuracy {c['greedy_copy_accuracy']:.3f}: a 100-token held-out segment seen earlier in "
            f"the context (prompt: 64 tokens before it, the segment, 32 after, `\\n\\n`, then its first "
            f"{c['cue_tokens']} tokens as a cue); fraction of the 100 tokens reproduced before the first error, "
            f"mean over {c['segments']} segments; {c['greedy_full_copies']} of {c['segments']} copied entirely",
            f"- teacher-forced copy token accuracy {c['teacher_forced_token_accuracy']:.3f} on the same segments",
        ]
    if "draft_agreement" in m:
        a = m["draft_agreement"]
        lines += [f"- demo-draft's greedy next-token agreement with this model through text {a['agreement']:.3f} "
                  f"({a['exact_text_match']:.3f} identical text) over {a['positions']} held-out positions"]
    if "agreement" in m:
        a = m["agreement"]
        lines += [
            f"- greedy next-token agreement with demo-target through text {a['agreement']:.3f} (the draft's "
            "greedy token, decoded, and the target's greedy token text are prefix-consistent; "
            f"{a['exact_text_match']:.3f} identical text) over {a['positions']} held-out positions",
        ]
    lines += [f"- plain greedy decoding {m['tokens_per_s']:.0f} tokens/s (batch 1, float32, 2 shared CPU cores, "
              "`generate`, 64 new tokens)", ""]
    if kind == "target":
        off = m.get("heldout_copy_off")
        lines += ["## Limitations", ""]
        if off:
            lines += [f"- the language model around the circuit is weak: only layer 2's free head and MLP and layers 3-4 "
                      "are its own, and part of every batch teaches copying; held-out loss "
                      f"{m['heldout']['loss']:.3f} nats/token ({off['loss']:.3f} with the copy heads silenced: copying "
                      "helps on plain code too, the language model is what is weak);"]
        lines += [
                  "- the copy follows the longest agreement with the last 16 tokens; right after an insertion the "
                  "context agrees with the source only partly, so copying resumes a few tokens later;",
                  f"- the language model itself is small and briefly trained ({sum(info['steps'].values())} steps on 2 shared CPU "
                  "cores): outside copying, greedy outputs are Python-looking but degenerate into repetition "
                  "quickly.", ""]
    return "\n".join(lines)


def describe(model, tok, kind: str) -> dict:
    import platform

    c = model.config
    return {"layers": c.num_hidden_layers, "hidden": c.hidden_size, "heads": c.num_attention_heads,
            "params": sum(p.numel() for p in model.parameters()), "vocab": len(tok), "python": platform.python_version(),
            "tokenizer": "byte-level BPE" if kind == "target" else "Unigram (SentencePiece-style, Metaspace `▁`)"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="suffixspec/default_models", help="directory for demo-target/ and demo-draft/")
    ap.add_argument("--draft-minutes", type=float, default=5.0)
    ap.add_argument("--target-minutes", type=float, default=30.0)
    ap.add_argument("--lr", type=float, default=1e-3, help="target peak learning rate")
    ap.add_argument("--draft-steps", type=int, default=None, help="replay a step count instead of the time budget")
    ap.add_argument("--target-steps", type=int, default=None)
    ap.add_argument("--reuse-draft", action="store_true",
                    help="keep the draft already in --out (evaluate it against the new target) instead of training it")
    ap.add_argument("--evaluate-only", action="store_true",
                    help="load the target saved in --out by an interrupted run, calibrate and evaluate it")
    ap.add_argument("--copy-segments", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    t_start = time.time()
    out = Path(args.out)

    files = data.stdlib_files()
    train_files, held_files = data.split_files(files)
    train_texts, held_texts = data.read_texts(train_files), data.read_texts(held_files)
    log(f"{len(train_texts)} training files, {len(held_texts)} held out")
    ttok = data.train_target_tokenizer(train_texts)
    dtok = data.train_draft_tokenizer(train_texts)
    t_train, t_held = data.encode_files(ttok, train_texts), data.encode_files(ttok, held_texts)
    d_train, d_held = data.encode_files(dtok, train_texts), data.encode_files(dtok, held_texts)
    common = {"train_files": len(train_texts), "heldout_files": len(held_texts), "context": 256}
    log(f"tokenizers done: target {sum(map(len, t_train)):,} tokens, draft {sum(map(len, d_train)):,} tokens")

    t0 = time.time()
    if args.reuse_draft:
        from transformers import LlamaForCausalLM

        draft = LlamaForCausalLM.from_pretrained(out / "demo-draft", dtype=torch.float32)
        dinfo = {k: v for k, v in json.loads((out / "demo-draft" / "training.json").read_text()).items()
                 if k not in ("metrics", "total_minutes")}
        log(f"draft reused from {out / 'demo-draft'} (steps {dinfo['steps']})")
    else:
        draft, dstats = train_draft(dtok, d_train, args)
        dinfo = {**common, **describe(draft, dtok, "draft"), "train_tokens": int(sum(map(len, d_train))),
                 "context": 256, "train_minutes": (time.time() - t0) / 60, "steps": {"draft": dstats["steps"]}}
        save(draft, dtok, out / "demo-draft", dinfo)
        log(f"draft saved: {dstats}")

    t0 = time.time()

    def ckpt(model, stats):
        save(model, ttok, out / "demo-target", {"checkpoint": True, **stats})
        log(f"target checkpoint saved; copy on 10 held-out segments: {evaluate.copy_accuracy(model, ttok, t_held, n=10)}")

    if args.evaluate_only:
        from transformers import LlamaForCausalLM

        target = LlamaForCausalLM.from_pretrained(out / "demo-target", dtype=torch.float32)
        tinfo = {k: v for k, v in json.loads((out / "demo-target" / "training.json").read_text()).items()
                 if k not in ("metrics", "total_minutes")}
        total = tinfo["train_minutes"] + 1.0 + (dinfo["train_minutes"] if args.reuse_draft else 0.0)
    else:
        target, tstats = train_target(ttok, t_train, args, ckpt)
        tinfo = {**common, **describe(target, ttok, "target"), "train_tokens": int(sum(map(len, t_train))),
                 "train_minutes": (time.time() - t0) / 60,
                 "steps": {"target": tstats["target"]["steps"]}, "lr": args.lr, "ngram": induction.NGRAM,
                 "final_train_loss_ema": tstats["target"]["final_loss_ema"]}
        save(target, ttok, out / "demo-target", tinfo)
        total = (time.time() - t_start) / 60 + (dinfo["train_minutes"] if args.reuse_draft else 0.0)
    if "copy_boost" not in tinfo:
        tinfo["copy_boost"] = calibrate_copy(target, ttok, t_train)
        save(target, ttok, out / "demo-target", tinfo)
    log(f"training done in {total:.1f} min; evaluating")
    evaluate_and_write(out, target, ttok, draft, dtok, t_held, d_held, tinfo, dinfo, total, args.copy_segments)


def evaluate_and_write(out, target, ttok, draft, dtok, t_held, d_held, tinfo, dinfo, total, segments) -> None:
    tm = {"heldout": evaluate.heldout_loss(target, ttok, t_held)}
    log(f"target held-out {tm['heldout']}")
    copy_out = induction.copy_output(target)
    kept = copy_out.detach().clone()
    with torch.no_grad():
        copy_out.zero_()
        tm["heldout_copy_off"] = evaluate.heldout_loss(target, ttok, t_held)
        copy_out.copy_(kept)
    log(f"target held-out with the copy heads silenced {tm['heldout_copy_off']}")
    tm["copy"] = evaluate.copy_accuracy(target, ttok, t_held, n=segments)
    log(f"target copy {tm['copy']}")
    tm["tokens_per_s"] = evaluate.greedy_speed(target, ttok, t_held)
    dm = {"heldout": evaluate.heldout_loss(draft, dtok, d_held)}
    log(f"draft held-out {dm['heldout']}")
    dm["agreement"] = evaluate.draft_agreement(target, ttok, draft, dtok, t_held)
    log(f"agreement {dm['agreement']}")
    tm["draft_agreement"] = dm["agreement"]
    dm["tokens_per_s"] = evaluate.greedy_speed(draft, dtok, d_held)
    log(f"speed target {tm['tokens_per_s']:.0f} tok/s, draft {dm['tokens_per_s']:.0f} tok/s")
    for kind, info, metrics in (("target", tinfo, tm), ("draft", dinfo, dm)):
        info = {**info, "metrics": metrics, "total_minutes": total}
        (out / f"demo-{kind}" / "training.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        (out / f"demo-{kind}" / "README.md").write_text(card(kind, info))
    log("model cards written")


if __name__ == "__main__":
    main()
