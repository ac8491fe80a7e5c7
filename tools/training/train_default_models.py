"""Train the embedded default models: ``demo-target`` (byte-level BPE, Llama with a hand-built copy
circuit) and ``demo-draft`` (BPE over Metaspace, a much smaller Llama), on Python source (the standard
library and large installed packages; ``data.py``). From the repository root (the training tools are
not part of the installed package)::

    python -m tools.training.train_default_models --ckpt-dir CKPT --out suffixspec/default_models

Phases (``--phases``; each with a wall-clock budget, so it ends on time on a slow or shared machine):

1. tokenizers and token ids (cached in ``--ckpt-dir/data``, so a resumed run sees the same data);
2. ``target``: a Llama initialised with a hand-built 16-token induction (copy) circuit (``induction.py``;
   a model this small does not discover copying within a CPU budget), trained on plain code with copy
   examples mixed in at a constant learning rate for ``--target-minutes``;
3. ``anneal``: from the last ``target`` state, the learning rate decays to 0 over ``--anneal-minutes``;
4. ``draft``: the draft model on plain code of the same corpus (``--draft-minutes`` or ``--draft-steps``);
5. ``final``: the copy output calibrated, evaluation (held-out packages and standard-library files),
   both models and their cards written to ``--out``.

Every phase checkpoints to ``--ckpt-dir`` (model, optimizer, step, time spent, random states) every
``--ckpt-minutes`` and on SIGTERM/Ctrl-C; ``--resume`` goes on from there (``recipe.json`` records the
recipe's flags, and a resume with other ones is refused). To train longer, resume the ``target`` phase
with a larger ``--target-minutes``, then move ``anneal.pt`` aside and anneal again::

    python -m tools.training.train_default_models --ckpt-dir CKPT --resume \
        --phases target,anneal,final --target-minutes 600 --out OUT

The step counts actually run are written into each model's training.json (``--target-steps``,
``--anneal-steps`` and ``--draft-steps`` replay them). ``--device cuda`` trains on a GPU (the batches
are still made on the CPU, the final phase runs there). ``--no-circuit`` trains the target as a plain
Llama, the ablation that shows what the circuit costs the language model.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from tools.training import data, evaluate, induction

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
        lookup = torch.full((model.config.vocab_size,), -100, dtype=torch.long, device=ids.device)
        lookup[restrict] = torch.arange(len(restrict))
        targets = lookup[targets]
    return torch.nn.functional.cross_entropy(logits, targets)


class Checkpointer:
    """A phase's resumable state in ``--ckpt-dir`` (outside the repository): model, optimizer, step,
    wall-clock time spent, the example maker's and torch's random states. Written atomically (a
    temporary file, then a rename), so a run killed at any moment resumes from the last complete one."""

    def __init__(self, directory: Path | None, name: str):
        self.path = None if directory is None else directory / f"{name}.pt"

    def load(self) -> dict | None:
        if self.path is None or not self.path.exists():
            return None
        # on the CPU first: load_state_dict then moves each tensor to its parameter's device, so a state
        # saved on a GPU resumes on a CPU and the other way round
        return torch.load(self.path, weights_only=False, map_location="cpu")

    def save(self, state: dict) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self.path)


_STOP = {"requested": False}


def _request_stop(signum, frame) -> None:  # SIGTERM / SIGINT: checkpoint at the next step, then stop
    _STOP["requested"] = True


def train_loop(model, make_batch, lr: float, minutes: float, max_steps: int | None, name: str,
               warmup: int = 50, schedule: str = "cosine", restrict=None, after_step=None, maker=None,
               ckpt: Checkpointer | None = None, ckpt_minutes: float = 5.0, probe=None,
               probe_minutes: float = 10.0, init: Checkpointer | None = None) -> dict:
    """AdamW over the wall-clock budget (or ``max_steps`` when given) with a learning-rate
    ``schedule``: ``cosine`` (warmup, then down to 10%), ``constant`` (warmup, then the peak: the
    stable part of a warmup-stable-decay schedule, which can be resumed for any length of time) or
    ``decay`` (linear from the peak to 0: the short final part, started from ``init``'s state).
    The loss of one ``make_batch(progress)`` is ``masked_loss`` of its ``(ids, mask)``.
    ``after_step()`` runs after every optimizer step (the frozen circuit's restore).

    Resumable: when ``ckpt`` holds a state of this phase, training goes on from it (same step, same
    time spent, same random states; so the schedule continues where it stopped). A state is written
    every ``ckpt_minutes``, when the phase ends, and when SIGTERM/SIGINT asks to stop (then the phase
    returns early with ``stopped`` set). ``probe()`` (held-out figures for the log) runs every
    ``probe_minutes`` of training time and at the end; its time is not counted in the budget."""
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    step, spent, ema, probes = 0, 0.0, None, []
    state = ckpt.load() if ckpt is not None else None
    if state is None and init is not None:  # a decay phase starts from the stable phase's last state
        start = init.load()
        if start is None:
            raise SystemExit(f"{name}: no state to start from in {init.path}; train that phase first")
        model.load_state_dict(start["model"])
        opt.load_state_dict(start["opt"])
        torch.set_rng_state(start["torch_rng"])
        if maker is not None:
            maker.rng.setstate(start["maker_rng"])
        ema, probes = start["ema"], list(start.get("probes", []))
        log(f"{name}: starting from {init.path} (step {start['step']})")
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, spent, ema, probes = state["step"], state["spent"], state["ema"], state.get("probes", [])
        torch.set_rng_state(state["torch_rng"])
        if maker is not None:
            maker.rng.setstate(state["maker_rng"])
        log(f"{name}: resumed at step {step}, {spent / 60:.1f} min spent")
    budget = minutes * 60
    if state is not None and state.get("done") and (step >= max_steps if max_steps else spent >= budget):
        return {**state["stats"], "stopped": False}  # finished; a larger budget would go on
    model.train()

    def snapshot(done: bool, stats: dict | None = None) -> None:
        if ckpt is None:
            return
        ckpt.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "spent": spent, "ema": ema,
                   "torch_rng": torch.get_rng_state(), "maker_rng": maker.rng.getstate() if maker else None,
                   "probes": probes, "done": done, "stats": stats})
        log(f"{name}: checkpoint at step {step} ({spent / 60:.1f} min) -> {ckpt.path}")

    t_mark = time.time()
    last_ckpt, last_probe = spent, spent
    stopped = False
    while True:
        spent += time.time() - t_mark
        t_mark = time.time()
        progress = step / max_steps if max_steps else spent / budget
        if progress >= 1.0:
            break
        if _STOP["requested"]:
            stopped = True
            break
        if schedule == "decay":
            scale = 1.0 - progress
        else:
            scale = min(1.0, (step + 1) / warmup)
        if schedule == "cosine":
            scale *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        batch = make_batch(progress)  # built on the CPU from the seeded example maker
        ids, mask = batch[0].to(device), batch[1].to(device)
        loss = masked_loss(model, ids, mask, restrict)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if after_step is not None:
            after_step()
        step += 1
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 50 == 0:
            log(f"{name} step {step} loss {loss.item():.3f} ema {ema:.3f} lr {lr * scale:.2e} "
                f"{(spent + time.time() - t_mark) / step:.2f}s/step")
        if probe is not None and spent - last_probe > probe_minutes * 60:
            pause = time.time()
            probes.append({"phase": name, "step": step, "minutes": spent / 60, **probe()})
            log(f"{name} probe: {probes[-1]}")
            model.train()
            t_mark += time.time() - pause
            last_probe = spent
        if spent - last_ckpt > ckpt_minutes * 60:
            pause = time.time()
            snapshot(done=False)
            t_mark += time.time() - pause
            last_ckpt = spent
    if probe is not None and not stopped:
        probes.append({"phase": name, "step": step, "minutes": spent / 60, **probe()})
        log(f"{name} final probe: {probes[-1]}")
    stats = {"steps": step, "minutes": spent / 60, "final_loss_ema": ema, "probes": probes}
    snapshot(done=not stopped, stats=stats)
    return {**stats, "stopped": stopped}


def batcher(parts):
    """``parts(progress) -> list of (maker_fn, count)``; stacks one batch of (ids, mask)."""
    def make(progress: float):
        seqs = [fn() for fn, k in parts(progress) for _ in range(k)]
        ids = torch.tensor(np.stack([s[0] for s in seqs]))
        mask = torch.tensor(np.stack([s[1] for s in seqs]))
        return ids, mask
    return make


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


def train_draft(tok, train_ids, args, ckpt_dir) -> dict:
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(llama_config(tok, layers=args.draft_layers, hidden=args.draft_hidden, heads=3,
                                          inter=args.draft_hidden * 8 // 3)).to(args.device)
    mk = data.ExampleMaker(tok, train_ids, seq_len=256, seed=SEED)
    stats = train_loop(model, batcher(lambda p: [(mk.code_lm, args.draft_batch)]), lr=3e-3, minutes=args.draft_minutes,
                       max_steps=args.draft_steps, name="draft", maker=mk, ckpt=Checkpointer(ckpt_dir, "draft"),
                       ckpt_minutes=args.ckpt_minutes)
    return model, stats


def target_config(tok, args):
    """Heads of 128 dimensions (more than hidden/heads): 96 slowly rotating RoPE dimensions per head carry
    the 16-token match of the induction circuit (see ``induction``), which takes layers 0-2 (with free
    heads and MLP in layer 2); layers 3+ are the language model's own."""
    extra = {"circuit_copy_dims": args.copy_dims} if args.copy_dims else {}
    if args.erase_codes:
        extra["circuit_erase"] = True
    return llama_config(tok, layers=args.target_layers, hidden=args.target_hidden, heads=args.target_heads,
                        inter=args.target_inter,
                        head_dim=128, attention_bias=True, rope_theta=induction.ROPE_THETA, **extra)


def train_target(tok, train_ids, args, ckpt_dir, probe, phases: set[str]) -> tuple:
    """The circuit installed, then plain code (loss everywhere) with copy examples mixed in: in a
    ``--copy-batches`` fraction of the batches of ``--target-batch`` sequences, one sequence is a code
    window copied after a separator or in a chat turn (3 in 4) or random full-vocabulary copies (1 in
    4, loss on the copies), the rest plain code.

    Two phases (warmup-stable-decay): ``target`` trains at the peak learning rate for
    ``--target-minutes`` (resume it for as long as there is time), ``anneal`` starts from its last
    state and decays the learning rate to 0 over ``--anneal-minutes``: the model that is shipped.
    Resuming ``target`` later and annealing again gives a better model without starting over."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    if args.no_circuit:  # the ablation: a plain Llama of the same depth, heads of 64 dimensions
        model = LlamaForCausalLM(llama_config(tok, layers=args.target_layers, hidden=args.target_hidden, heads=4,
                                              inter=args.target_inter)).to(args.device)
        after_step = None
    else:
        model = LlamaForCausalLM(target_config(tok, args))
        induction.install(model, seed=SEED, code_rms=args.code_rms)
        model.to(args.device)  # before Frozen, whose masks and kept values live with the parameters
        after_step = induction.Frozen(model, train_early=args.train_early, train_copy_out=args.train_copy_out).restore
    mk = data.ExampleMaker(tok, train_ids, seq_len=args.seq_len, seed=SEED + 2)

    def copy_example():
        return mk.code_copy() if mk.rng.random() < 0.75 else mk.random_copy(None, 2)

    def plain():
        return mk.loop_break() if args.loop_examples and mk.rng.random() < args.loop_examples else mk.code_lm()

    def parts(progress: float):
        copies = args.copies_per_batch if args.copy_batches >= 1 or mk.rng.random() < args.copy_batches else 0
        return [(plain, args.target_batch - copies), (copy_example, copies)]

    common = {"lr": args.lr, "after_step": after_step, "maker": mk, "ckpt_minutes": args.ckpt_minutes,
              "probe": lambda: probe(model), "probe_minutes": args.probe_minutes}
    stats = {"steps": 0, "minutes": 0.0, "stopped": False}
    if "target" in phases:
        stats = train_loop(model, batcher(parts), minutes=args.target_minutes, max_steps=args.target_steps,
                           name="target", warmup=50, schedule="constant", ckpt=Checkpointer(ckpt_dir, "target"),
                           **common)
        log(f"target (stable learning rate) done: {stats}")
        if stats["stopped"]:
            return model, stats
    if "anneal" in phases:
        decay = train_loop(model, batcher(parts), minutes=args.anneal_minutes, max_steps=args.anneal_steps,
                           name="anneal", schedule="decay", ckpt=Checkpointer(ckpt_dir, "anneal"),
                           init=Checkpointer(ckpt_dir, "target"), **common)
        log(f"target (learning rate decay) done: {decay}")
        stable = Checkpointer(ckpt_dir, "target").load()
        stats = {"steps": stable["step"] + decay["steps"], "minutes": stable["spent"] / 60 + decay["minutes"],
                 "stable_steps": stable["step"], "decay_steps": decay["steps"],
                 "final_loss_ema": decay["final_loss_ema"], "probes": decay["probes"], "stopped": decay["stopped"]}
    return model, stats


@torch.no_grad()
def calibrate_copy(model, tok, train_ids, grid=(0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)) -> float:
    """Training on code lets the language model outgrow the frozen copy output (its scale is fixed), so
    after training the induction heads' output projection is scaled by the smallest factor in ``grid``
    that reaches 97% of the best greedy copy accuracy on 20 segments of *training* files (never the
    held-out ones). A checkpoint of the shipped recipe copied 0.14 of a held-out segment as trained,
    0.92 with the output doubled, 0.25 tripled (10 segments)."""
    o = induction.copy_output(model)
    base = o.detach().clone()
    sub = train_ids[::10]
    scores = {}
    for k in grid:
        o.copy_(base * k)
        scores[k] = evaluate.copy_accuracy(model, tok, sub, n=20)["greedy_copy_accuracy"]
        log(f"copy boost {k}: greedy copy {scores[k]:.3f} on training files")
    best = max(scores.values())
    k = min(k for k in grid if scores[k] >= 0.97 * best)
    o.copy_(base * k)
    return k


def card(kind: str, info: dict) -> str:
    m = info["metrics"]
    steps = sum(info["steps"].values())
    lines = [f"# suffixspec/demo-{kind}", ""]
    if kind == "target":
        lines += ["A small code model shipped inside suffixspec so that every entry point runs offline. It is the "
                  "default *target* model: a small language model of Python with a hand-built copy circuit, for "
                  "demonstrating and testing speculative decoding, not for real work.", ""]
    else:
        lines += ["A tiny code model shipped inside suffixspec: the default *draft* model. Its tokenizer "
                  "differs from demo-target's (BPE over Metaspace vs byte-level BPE), so drafting with it "
                  "exercises the token bridge.", ""]
    pk = ", ".join(f"{n} {v['version']}" for n, v in info["packages"].items())
    ev = ", ".join(f"{n} {v['version']}" for n, v in info["eval_packages"].items())
    lines += [
        "## Model", "",
        f"- architecture: `LlamaForCausalLM`, {info['layers']} layers, hidden {info['hidden']}, "
        f"{info['heads']} heads, tied embeddings, {info['params'] / 1e6:.2f}M parameters",
        f"- tokenizer: {info['tokenizer']}, {info['vocab']} entries; ChatML-style chat template "
        "(`<|im_start|>role ... <|im_end|>`)",
        "- weights: safetensors, float16 on disk; `config.json` says float32, so CPU loading upcasts",
        f"- trained context: {info['context']} tokens (`max_position_embeddings` 2048, RoPE)",
        "", "## Data", "",
        f"Python source, {info['train_bytes'] / 1e6:.1f} MB in {info['train_files']:,} files: the standard library "
        f"(CPython {info['python']}, without tests; {info['stdlib_train_files']} files) and installed packages "
        f"({pk}; each capped, files chosen by a hash of their path: `tools/training/data.py` in the source repository); "
        f"{info['train_tokens']:,} tokens. Never trained on: the {info['heldout_files']} standard-library files "
        "listed in `tools/training/heldout.txt` (the benchmarks use them) and the installed packages "
        f"{ev} ({info['eval_files']} files), on which the headline figures below are measured.",
    ]
    if kind == "target":
        lines += [
            "", "Copying (reproducing text seen earlier in the context, what code edits and RAG need) does not "
            "emerge from plain code in a CPU budget of minutes, so the model starts from a hand-built induction "
            "circuit (`tools/training/induction.py`) that matches the last 16 tokens. Each token has a fixed "
            "random 6-dimensional code in reserved residual dimensions (never trained); four previous-token heads "
            "in layer 0 (constant, RoPE-phased queries and keys) write the codes of the tokens 1..4 back into "
            "reserved slots, three heads in layer 1 copy that block from 4, 8 and 12 positions back (slots 5..16), "
            "and the copy heads of layer 2 attend to the position whose 16 preceding codes agree most with the "
            "last 16 (over the RoPE dimensions that barely rotate: `rope_theta` 1e16, head dimension 128) and copy "
            "its token embedding towards the tied output layer. " + (
                f"The codes are large (rms {info['code_rms']:g} per dimension), so every norm's divisor is theirs "
                "and what the trained dimensions write does not blur the match; the copy heads copy the first "
                f"{info['copy_dims']} dimensions of the token embedding, which layers 0-1 never write"
                + ("; a head of layer 2 erases the codes once the copy heads have read them, so the layers "
                   "after it normalise their own dimensions" if info.get("erase_codes") else "") + ". So every layer "
                "trains (all but the circuit's own heads, codes and slots), the copy heads' output projection "
                "too" if info.get("train_early") else
                "Layers 0-1 are the circuit's alone and do not "
                "train (when they learned too, their writes grew the residual the match is normalised by and the copy "
                "broke: 0.02 of a segment); everything else trains: layer 2's free heads and MLP and layers "
                f"3-{info['layers'] - 1} fully, never writing into the codes or slots") + ". Each batch of "
            f"{info['batch'][0]} x {info['batch'][1]} tokens holds windows of plain code (loss on every token); in "
            f"a fraction {info.get('copy_batches', 1.0):g} of the batches"
            + (f" ({info['copy_history']})" if info.get("copy_history") else "") + " one of them is a copy example "
            "(3 in 4: a code window copied "
            "after a separator or in a "
            "chat turn, from the start or an offset, sometimes with small edits; 1 in 4: random full-vocabulary "
            "copies, loss on the copies)" + (
                f"; {info['loop_examples']:g} of the plain windows have a degenerate loop spliced in (the last 1-12 "
                "tokens repeated to 24-64 tokens, no loss on it, loss on the code after it: leaving a loop is "
                "learned)" if info.get("loop_examples") else "") + ". Afterwards the copy heads' output projection is scaled by "
            f"{info.get('copy_boost', 1.0):g} (the smallest factor reaching 97% of the best copy accuracy on "
            "training files; `calibrate_copy`).",
        ]
    else:
        lines += ["", "Plain next-token prediction on the training files (batches of 8 x 256 tokens)."]
    lines += [
        "", "## Training", "",
        "- command: `python -m tools.training.train_default_models --ckpt-dir CKPT "
        "--out suffixspec/default_models` (resumable: `--resume` goes on from the checkpoints)",
        f"- this model: {info['train_minutes']:.1f} minutes on 2 shared CPU cores, {steps:,} steps "
        f"({steps * info['batch'][0] * info['batch'][1] / 1e6:.1f}M tokens seen), seed {SEED} (the budgets are "
        "wall-clock; " + (f"`--target-steps {info['stable_steps']} --anneal-steps {info['decay_steps']}` replays "
                          "the stable and decay phases)" if info.get("stable_steps") is not None else
                          "`--draft-steps N` with the count above replays it)"),
    ]
    probes = info.get("probes") or []
    if probes:
        lines += ["- held-out packages during training (12 windows, 10 copy segments): " + "; ".join(
            f"{p.get('phase', 'target')} step {p['step']}: loss {p['eval_loss']:.2f}, copy {p['eval_copy']:.2f}"
            + (f", loop exit {p['loop_exit']:.2f}" if "loop_exit" in p else "")
            for p in probes)]
    lines += [
        "", "## Evaluation", "",
        f"On the held-out packages ({ev}), 512-token windows:", "",
        f"- held-out loss {m['eval']['loss']:.3f} nats/token, perplexity {m['eval']['perplexity']:.1f}, "
        f"{m['eval']['bits_per_byte']:.3f} bits per byte ({m['eval']['tokens']:,} tokens); on the held-out "
        f"standard-library files {m['heldout']['loss']:.3f} nats/token",
    ]
    if "copy" in m:
        c, cs = m["copy"], m["copy_stdlib"]
        lines += [
            f"- loss with the copy heads silenced {m['eval_copy_off']['loss']:.3f} nats/token",
            f"- greedy copy accuracy {c['greedy_copy_accuracy']:.3f}: a 100-token segment seen earlier in "
            f"the context (prompt: 64 tokens before it, the segment, 32 after, `\\n\\n`, then its first "
            f"{c['cue_tokens']} tokens as a cue); fraction of the 100 tokens reproduced before the first error, "
            f"mean over {c['segments']} segments; {c['greedy_full_copies']} of {c['segments']} copied entirely "
            f"(held-out standard-library files: {cs['greedy_copy_accuracy']:.3f})",
            f"- teacher-forced copy token accuracy {c['teacher_forced_token_accuracy']:.3f} on the same segments",
        ]
    if "continuations" in m:
        k = m["continuations"]
        lines += [f"- greedy {k['new_tokens']}-token continuations of {len(k['per_prompt'])} ordinary code prompts "
                  "(`evaluate.CONTINUATION_PROMPTS`: a function signature, a class header, an import block, ...): "
                  f"distinct 4-grams / all 4-grams {k['distinct_4grams']:.2f} on average ("
                  + ", ".join(f"{x:.2f}" for x in k["per_prompt"]) + "; 1.0 never repeats, near 0 loops)"]
        if "loop_exit" in m:
            le = m["loop_exit"]
            lines += [f"- leaving a loop: held-out code with its last 1-12 tokens repeated to {le['loop_tokens']} tokens "
                      f"(`evaluate.loop_exit`): the greedy next token is the code's real continuation in "
                      f"{le['exit']:.2f} of {le['loops']} cases, the loop's next token in {le['stay']:.2f}"]
        if "continuations_copy_off" in m:
            lines += [f"- the same with the copy heads silenced: {m['continuations_copy_off']['distinct_4grams']:.2f} "
                      "(the difference is the circuit copying the model's own output)"]
    if "draft_agreement" in m:
        a = m["draft_agreement"]
        lines += [f"- demo-draft's greedy next-token agreement with this model through text {a['agreement']:.3f} "
                  f"({a['exact_text_match']:.3f} identical text) over {a['positions']} positions"]
    if "agreement" in m:
        a = m["agreement"]
        lines += [
            f"- greedy next-token agreement with demo-target through text {a['agreement']:.3f} (the draft's "
            "greedy token, decoded, and the target's greedy token text are prefix-consistent; "
            f"{a['exact_text_match']:.3f} identical text) over {a['positions']} positions",
        ]
    lines += [f"- plain greedy decoding {m['tokens_per_s']:.0f} tokens/s (batch 1, float32, 2 shared CPU cores, "
              "`generate`, 64 new tokens)", ""]
    if kind == "target":
        lines += ["## Limitations", "",
                  f"- a small model trained for {info['train_minutes']:.0f} minutes on two shared CPU cores; greedy "
                  "continuations of ordinary prompts fall into repetition (distinct 4-grams "
                  f"{m['continuations']['distinct_4grams']:.2f} above): once the model repeats a few tokens, the "
                  "circuit finds the earlier occurrence and copies what followed it, which repeats it again "
                  "(with the copy heads silenced the same prompts give "
                  f"{m.get('continuations_copy_off', m['continuations'])['distinct_4grams']:.2f});",
                  "- the copy follows the longest agreement with the last 16 tokens; right after an insertion the "
                  "context agrees with the source only partly, so copying resumes a few tokens later;",
                  "- the copy circuit has no gate on match quality: text that repeats a few tokens of the context "
                  "pulls the continuation towards what followed them there.", ""]
    return "\n".join(lines)


def describe(model, tok, kind: str) -> dict:
    import platform

    c = model.config
    return {"layers": c.num_hidden_layers, "hidden": c.hidden_size, "heads": c.num_attention_heads,
            "params": sum(p.numel() for p in model.parameters()), "vocab": len(tok), "python": platform.python_version(),
            "tokenizer": "byte-level BPE" if kind == "target" else "BPE over Metaspace (SentencePiece-style `▁`)"}


def prepare(cache: Path | None) -> dict:
    """Corpus, both tokenizers and every split's token ids. Cached in ``cache`` (the checkpoint
    directory) so a resumed run continues on exactly the same tokenizers and data."""
    from transformers import PreTrainedTokenizerFast

    names = ("t_train", "t_held", "t_eval", "d_train", "d_held", "d_eval")
    if cache is not None and (cache / "data" / "meta.json").exists():
        d = cache / "data"
        ttok = PreTrainedTokenizerFast.from_pretrained(d / "target-tokenizer")
        dtok = PreTrainedTokenizerFast.from_pretrained(d / "draft-tokenizer")
        arrays = np.load(d / "ids.npz")
        ids = {n: np.split(arrays[n], np.cumsum(arrays[n + "_len"])[:-1]) for n in names}
        log(f"corpus and tokenizers loaded from {d}")
        return {"ttok": ttok, "dtok": dtok, **ids, "meta": json.loads((d / "meta.json").read_text())}
    stdlib_train, stdlib_held = data.split_files(data.stdlib_files())
    train_texts = data.read_texts(stdlib_train)
    meta = {"stdlib_train_files": len(train_texts), "packages": {}}
    for name, cap in data.TRAIN_PACKAGES.items():
        texts = data.read_paths(data.package_files(name, cap))
        train_texts += texts
        meta["packages"][name] = {"version": data.package_version(name), "files": len(texts),
                                  "bytes": sum(len(t.encode()) for t in texts)}
    held_texts = data.read_texts(stdlib_held)
    eval_texts = []
    meta["eval_packages"] = {}
    for name in data.EVAL_PACKAGES:
        texts = data.read_paths(data.package_files(name, None))
        eval_texts += texts
        meta["eval_packages"][name] = {"version": data.package_version(name), "files": len(texts)}
    meta.update(train_files=len(train_texts), heldout_files=len(held_texts), eval_files=len(eval_texts),
                train_bytes=sum(len(t.encode()) for t in train_texts))
    log(f"{len(train_texts)} training files ({meta['train_bytes'] / 1e6:.1f} MB), {len(held_texts)} held-out "
        f"standard-library files, {len(eval_texts)} files of {len(data.EVAL_PACKAGES)} held-out packages")
    ttok = data.train_target_tokenizer(train_texts)
    dtok = data.train_draft_tokenizer(train_texts)
    ids = {}
    for prefix, tok in (("t", ttok), ("d", dtok)):
        for split, texts in (("train", train_texts), ("held", held_texts), ("eval", eval_texts)):
            ids[f"{prefix}_{split}"] = data.encode_files(tok, texts)
    meta["target_train_tokens"] = int(sum(map(len, ids["t_train"])))
    meta["draft_train_tokens"] = int(sum(map(len, ids["d_train"])))
    log(f"tokenizers done: target {meta['target_train_tokens']:,} training tokens, draft "
        f"{meta['draft_train_tokens']:,}")
    if cache is not None:
        d = cache / "data"
        d.mkdir(parents=True, exist_ok=True)
        ttok.save_pretrained(d / "target-tokenizer")
        dtok.save_pretrained(d / "draft-tokenizer")
        np.savez(d / "ids.npz", **{n: np.concatenate(ids[n]) for n in names},
                 **{n + "_len": np.array([len(x) for x in ids[n]]) for n in names})
        (d / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return {"ttok": ttok, "dtok": dtok, **ids, "meta": meta}


# The flags that shape the target model and its frozen circuit: a resumed run must repeat them (the
# checkpoints hold weights, not the recipe); the data mix (--copy-batches, --loop-examples) may change.
RECIPE_FLAGS = ("target_layers", "target_hidden", "target_heads", "target_inter", "code_rms", "train_early", "train_copy_out",
                "copy_dims", "erase_codes", "no_circuit")


def check_recipe(ckpt_dir: Path, args) -> None:
    """``ckpt_dir/recipe.json`` records ``RECIPE_FLAGS`` at the first run; a later run with other values
    raises ``ValueError`` naming the flags to pass (a state loaded into a differently built model would
    train silently wrong: other codes, other frozen entries)."""
    path = ckpt_dir / "recipe.json"
    recipe = {k: getattr(args, k) for k in RECIPE_FLAGS}
    if path.exists():
        saved = json.loads(path.read_text())
        diff = {k: v for k, v in saved.items() if recipe.get(k) != v}
        if diff:
            raise ValueError(f"{ckpt_dir} was trained with {diff} (now {({k: recipe.get(k) for k in diff})}): pass "
                             "the same flags (see its recipe.json) or choose another --ckpt-dir")
        return
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recipe, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    import signal

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="suffixspec/default_models", help="directory for demo-target/ and demo-draft/")
    ap.add_argument("--ckpt-dir", default=str(Path.home() / ".cache" / "suffixspec" / "train"),
                    help="checkpoints (model, optimizer, data position, random states) and the cached corpus; "
                         "keep it outside the repository (default: %(default)s)")
    ap.add_argument("--resume", action="store_true", help="go on from the checkpoints in --ckpt-dir")
    ap.add_argument("--ckpt-minutes", type=float, default=5.0, help="checkpoint every N minutes of training")
    ap.add_argument("--probe-minutes", type=float, default=10.0,
                    help="log held-out loss and copy accuracy every N minutes of training")
    ap.add_argument("--phases", default="target,anneal,draft,final",
                    help="comma-separated: target (train at the peak learning rate), anneal (decay it), "
                         "draft (train), final (calibrate, evaluate, write --out)")
    ap.add_argument("--draft-minutes", type=float, default=8.0)
    ap.add_argument("--target-minutes", type=float, default=60.0,
                    help="the stable phase's budget (constant learning rate; resume to extend it)")
    ap.add_argument("--anneal-minutes", type=float, default=12.0, help="the decay phase's budget")
    ap.add_argument("--anneal-steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=1.5e-3, help="target peak learning rate")
    ap.add_argument("--draft-steps", type=int, default=None, help="replay a step count instead of the time budget")
    ap.add_argument("--target-steps", type=int, default=None)
    ap.add_argument("--target-layers", type=int, default=6)
    ap.add_argument("--target-hidden", type=int, default=256,
                    help="the target's residual width (the circuit reserves 102 dimensions of it)")
    ap.add_argument("--target-heads", type=int, default=4)
    ap.add_argument("--target-inter", type=int, default=768)
    ap.add_argument("--target-batch", type=int, default=3, help="sequences per target batch (the shipped target: 3)")
    ap.add_argument("--copy-batches", type=float, default=1.0,
                    help="fraction of the target's batches that hold one copy example (the rest: plain code); "
                         "fewer copy examples weaken the copy (the trained layers outgrow the frozen copy output)")
    ap.add_argument("--copies-per-batch", type=int, default=1,
                    help="copy examples in a batch that holds any (1 in 3 sequences at the CPU batch of 3; keep "
                         "about a third with a larger --target-batch)")
    ap.add_argument("--copy-history", default="",
                    help="for the model card, when --copy-batches changed on a resume (the checkpoints do not "
                         "record it), e.g. 'steps 0-2445 at 1.0'")
    ap.add_argument("--code-rms", type=float, default=2.0,
                    help="magnitude of the circuit's fixed token codes; large codes (64) dominate every norm's "
                         "divisor so the trained dimensions cannot blur the match (the shipped target: 2)")
    ap.add_argument("--train-early", action=argparse.BooleanOptionalAction, default=False,
                    help="layers 0-1 train too (never writing into the dimensions the copy heads read); needs "
                         "large --code-rms")
    ap.add_argument("--train-copy-out", action=argparse.BooleanOptionalAction, default=False,
                    help="the copy heads' output projection trains (the copy's strength follows the model)")
    ap.add_argument("--erase-codes", action=argparse.BooleanOptionalAction, default=False,
                    help="a head of layer 2 subtracts the codes after the copy heads have read them, so layers "
                         "3+ are normalised over their own dimensions (with large --code-rms)")
    ap.add_argument("--copy-dims", type=int, default=0,
                    help="the first N dimensions of the token embedding are what the copy heads copy (and "
                         "what layers 0-1 never write); 0: all of them (the shipped target)")
    ap.add_argument("--loop-examples", type=float, default=0.0,
                    help="fraction of the plain code sequences with a degenerate loop spliced in (no loss on the "
                         "loop, loss on the code after it: `data.ExampleMaker.loop_break`)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--draft-hidden", type=int, default=96)
    ap.add_argument("--draft-batch", type=int, default=8, help="sequences of 256 tokens per draft batch")
    ap.add_argument("--no-circuit", action="store_true",
                    help="ablation: train the target as a plain Llama without the copy circuit (never shipped)")
    ap.add_argument("--copy-segments", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu",
                    help="where the target and draft train (cpu or cuda); the final "
                         "phase (calibration, the cards' figures) runs on the CPU")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 weights, TF32 matmuls
    torch.manual_seed(SEED)
    ckpt_dir = Path(args.ckpt_dir)
    if ckpt_dir is not None and not args.resume and any(ckpt_dir.glob("*.pt")):
        ap.error(f"{ckpt_dir} holds checkpoints: pass --resume to go on from them, or choose another --ckpt-dir")
    try:
        check_recipe(ckpt_dir, args)
    except ValueError as e:
        ap.error(str(e))
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)
    phases = set(args.phases.split(","))
    out = Path(args.out)
    c = prepare(ckpt_dir)
    ttok, dtok, meta = c["ttok"], c["dtok"], c["meta"]

    def probe(model) -> dict:
        return {"eval_loss": evaluate.heldout_loss(model, ttok, c["t_eval"], n=12, length=512)["loss"],
                "eval_copy": evaluate.copy_accuracy(model, ttok, c["t_eval"], n=10)["greedy_copy_accuracy"],
                "loop_exit": evaluate.loop_exit(model, c["t_eval"], n=20)["exit"]}

    from transformers import LlamaForCausalLM

    target = draft = None
    tstats = dstats = None
    if phases & {"target", "anneal"}:
        target, tstats = train_target(ttok, c["t_train"], args, ckpt_dir, probe, phases)
        if tstats.get("stopped"):
            log("target stopped on request; resume with --resume")
            return
    if "draft" in phases:
        draft, dstats = train_draft(dtok, c["d_train"], args, ckpt_dir)
        if dstats.get("stopped"):
            log("draft stopped on request; resume with --resume")
            return
    if "final" not in phases:
        return
    for m in (target, draft):  # calibration and the cards' figures (speed included) are measured on the CPU
        if m is not None:
            m.to("cpu")
    if target is None:  # the final phase alone: the trained states come from the checkpoints
        target = LlamaForCausalLM(target_config(ttok, args))
        induction.install(target, seed=SEED, code_rms=args.code_rms)
        stable, state = Checkpointer(ckpt_dir, "target").load(), Checkpointer(ckpt_dir, "anneal").load()
        if state is None:
            raise SystemExit("no annealed target in --ckpt-dir: run the anneal phase first")
        target.load_state_dict(state["model"])
        tstats = {"steps": stable["step"] + state["step"], "minutes": (stable["spent"] + state["spent"]) / 60,
                  "stable_steps": stable["step"], "decay_steps": state["step"], "final_loss_ema": state["ema"],
                  "probes": state.get("probes", [])}
    if draft is None:
        draft = LlamaForCausalLM(llama_config(dtok, layers=args.draft_layers, hidden=args.draft_hidden, heads=3,
                                              inter=args.draft_hidden * 8 // 3))
        state = Checkpointer(ckpt_dir, "draft").load()
        draft.load_state_dict(state["model"])
        dstats = state["stats"] or {"steps": state["step"], "minutes": state["spent"] / 60,
                                    "final_loss_ema": state["ema"]}
    common = {"train_files": meta["train_files"], "heldout_files": meta["heldout_files"],
              "eval_files": meta["eval_files"], "packages": meta["packages"], "eval_packages": meta["eval_packages"],
              "stdlib_train_files": meta["stdlib_train_files"], "train_bytes": meta["train_bytes"]}
    tinfo = {**common, **describe(target, ttok, "target"), "train_tokens": meta["target_train_tokens"],
             "context": args.seq_len, "train_minutes": tstats["minutes"], "steps": {"target": tstats["steps"]},
             "stable_steps": tstats.get("stable_steps"), "decay_steps": tstats.get("decay_steps"),
             "batch": [args.target_batch, args.seq_len], "lr": args.lr, "ngram": induction.NGRAM,
             "copy_batches": args.copy_batches, "copy_history": args.copy_history, "code_rms": args.code_rms,
             "train_early": args.train_early, "train_copy_out": args.train_copy_out,
             "copy_dims": induction.layout(target.config)["copy_dims"], "loop_examples": args.loop_examples,
             "erase_codes": induction.erases(target.config),
             "final_train_loss_ema": tstats["final_loss_ema"], "probes": tstats.get("probes", [])}
    dinfo = {**common, **describe(draft, dtok, "draft"), "train_tokens": meta["draft_train_tokens"], "context": 256,
             "train_minutes": dstats["minutes"], "steps": {"draft": dstats["steps"]}, "batch": [args.draft_batch, 256]}
    tinfo["copy_boost"] = calibrate_copy(target, ttok, c["t_train"])
    save(target, ttok, out / "demo-target", tinfo)
    save(draft, dtok, out / "demo-draft", dinfo)
    total = tinfo["train_minutes"] + dinfo["train_minutes"]
    log(f"training took {total:.1f} min; evaluating")
    evaluate_and_write(out, target, ttok, draft, dtok, c, tinfo, dinfo, total, args.copy_segments)


def evaluate_and_write(out, target, ttok, draft, dtok, c, tinfo, dinfo, total, segments) -> None:
    """The model cards' figures: on the held-out packages' code (the headline) and on the held-out
    standard-library files (for comparison with earlier models)."""
    tm = {"eval": evaluate.heldout_loss(target, ttok, c["t_eval"], length=512),
          "heldout": evaluate.heldout_loss(target, ttok, c["t_held"], length=512)}
    log(f"target held-out packages {tm['eval']}, held-out stdlib {tm['heldout']}")
    copy_out = induction.copy_output(target)
    kept = copy_out.detach().clone()
    with torch.no_grad():
        copy_out.zero_()
        tm["eval_copy_off"] = evaluate.heldout_loss(target, ttok, c["t_eval"], length=512)
        tm["continuations_copy_off"] = evaluate.continuation_diversity(target, ttok)  # does the loop come from copying?
        copy_out.copy_(kept)
    log(f"target held-out packages with the copy heads silenced {tm['eval_copy_off']}, continuations' distinct "
        f"4-grams {tm['continuations_copy_off']['per_prompt']}")
    tm["copy"] = evaluate.copy_accuracy(target, ttok, c["t_eval"], n=segments)
    tm["copy_stdlib"] = evaluate.copy_accuracy(target, ttok, c["t_held"], n=segments)
    log(f"target copy: packages {tm['copy']}, stdlib {tm['copy_stdlib']}")
    tm["continuations"] = evaluate.continuation_diversity(target, ttok)
    log(f"target continuations: distinct 4-grams {tm['continuations']['per_prompt']}")
    tm["loop_exit"] = evaluate.loop_exit(target, c["t_eval"], n=60)
    log(f"target loop exit {tm['loop_exit']}")
    tm["tokens_per_s"] = evaluate.greedy_speed(target, ttok, c["t_eval"])
    dm = {"eval": evaluate.heldout_loss(draft, dtok, c["d_eval"], length=512),
          "heldout": evaluate.heldout_loss(draft, dtok, c["d_held"], length=512)}
    log(f"draft held-out packages {dm['eval']}")
    dm["agreement"] = evaluate.draft_agreement(target, ttok, draft, dtok, c["t_eval"])
    log(f"agreement {dm['agreement']}")
    tm["draft_agreement"] = dm["agreement"]
    dm["continuations"] = evaluate.continuation_diversity(draft, dtok)
    dm["tokens_per_s"] = evaluate.greedy_speed(draft, dtok, c["d_eval"])
    log(f"speed target {tm['tokens_per_s']:.0f} tok/s, draft {dm['tokens_per_s']:.0f} tok/s")
    for kind, info, metrics in (("target", tinfo, tm), ("draft", dinfo, dm)):
        info = {**info, "metrics": metrics, "total_minutes": total}
        (out / f"demo-{kind}" / "training.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        (out / f"demo-{kind}" / "README.md").write_text(card(kind, info))
    log("model cards written")


if __name__ == "__main__":
    main()
