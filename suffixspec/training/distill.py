"""Distil a draft model from a real target (SmolLM2-135M-Instruct): teacher data, training, export.

Steps, each resumable (``--out`` keeps the state; a killed step starts again where it stopped):

1. ``generate``: chat answers of the target to training prompts (``prompts/``, people's questions
   outside this project), batched sampling (far faster per token than one stream on a CPU), with the
   target's top-``k`` log-probabilities at every generated position. One file per batch; batches
   already written are skipped.
2. ``train``: a shallow draft (:mod:`suffixspec.training.shallow`) learns the target's next-token
   distribution on those positions (KL to the target's top-``k``), with the target's embedding and
   head frozen; checkpoints every few minutes (``train_default_models.train_loop``).
3. ``export``: the trained layers only (float16 safetensors) into a model folder.
4. ``measure``: acceptance per position of a draft against the target's greedy answers to the
   benchmark prompts (``EVAL_IDS``), teacher-forced: at each position of the greedy answer, does the
   draft's argmax equal the target's token; a chain of ``k`` tokens is accepted to depth ``d`` when the
   first ``d`` positions after its start all agree.

Worked example (measure): target greedy answer ``[A, B, C, D]``; draft argmax given the same prefixes
``[A, B, X, D]`` -> position agreement ``[1, 1, 0, 1]``; a chain drafted before ``A`` is accepted to
depth 2, one drafted before ``D`` to depth 1: acceptance per position is read off these runs.

    python -m suffixspec.training.distill generate --target /work/models/smollm2-135m-instruct --out /work/ckpt/distill
    python -m suffixspec.training.distill train --target ... --out /work/ckpt/distill --minutes 30
    python -m suffixspec.training.distill export --target ... --out /work/ckpt/distill --to suffixspec/default_models/NAME
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

PROMPTS_DIR = Path(__file__).parent / "prompts"
# the open-ended chat benchmark: every eighth MT-bench question (81, 89, ..., 153), first turn; 10 prompts
# across writing, roleplay, reasoning, math, coding, extraction, STEM and humanities. Never trained on.
EVAL_IDS = tuple(range(81, 161, 8))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _mt_bench() -> list[dict]:
    with open(PROMPTS_DIR / "mt_bench.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def eval_prompts() -> list[str]:
    """The 10 benchmark questions (first turns of ``EVAL_IDS``)."""
    by_id = {q["question_id"]: q for q in _mt_bench()}
    return [by_id[i]["turns"][0] for i in EVAL_IDS]


def train_prompts() -> list[str]:
    """Every other MT-bench turn (each asked on its own) and the Self-Instruct seed tasks: 315 prompts."""
    out = [t for q in _mt_bench() if q["question_id"] not in EVAL_IDS for t in q["turns"]]
    with open(PROMPTS_DIR / "self_instruct_seed.jsonl", encoding="utf-8") as f:
        for line in f:
            task = json.loads(line)
            out.append(task["instruction"] + (f"\n\n{task['input']}" if task["input"] else ""))
    return out


def chat_ids(tokenizer: Any, user: str) -> list[int]:
    """The prompt ids a chat request sends: the target's template, the assistant's turn opened."""
    return list(tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=True,
                                              add_generation_prompt=True, return_dict=False))


def load_target(path: str, device: str = "cpu") -> tuple[Any, Any]:
    """The target in float32 on ``device`` (a GPU, when a run has one, trains and generates far faster)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from suffixspec.loading import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(path))
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(path), dtype=torch.float32).to(device).eval()
    return model, tok


@torch.inference_mode()
def generate_batch(model: Any, tok: Any, prompts: list[str], new_tokens: int, temperature: float, keep_top: int,
                   seed: int) -> list[dict]:
    """Answers to ``prompts`` in one batched ``generate`` (left padding), each with the target's top
    ``keep_top`` log-probabilities (temperature 1) at every generated position, cut after its EOS.

    Row layout: ``ids`` = prompt + answer (int32), ``start`` = prompt length, ``top_ids`` /
    ``top_logp`` = [answer length, keep_top]: row ``j`` is the target's distribution for ``ids[start + j]``.
    """
    rows = [chat_ids(tok, p) for p in prompts]
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    device = model.get_input_embeddings().weight.device
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    torch.manual_seed(seed)
    sample = temperature > 0
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=sample,
                         temperature=temperature if sample else None, top_k=0 if sample else None,
                         top_p=1.0 if sample else None, output_logits=True, return_dict_in_generate=True,
                         pad_token_id=pad)
    gen = out.sequences[:, width:]  # [batch, steps]
    logits = torch.stack(out.logits, dim=1)  # [batch, steps, vocab]
    eos = {tok.eos_token_id, *([model.generation_config.eos_token_id] if isinstance(
        model.generation_config.eos_token_id, int) else model.generation_config.eos_token_id or [])}
    result = []
    for b, prompt in enumerate(rows):
        toks = gen[b].tolist()
        n = next((i + 1 for i, t in enumerate(toks) if t in eos), len(toks))
        logp = torch.log_softmax(logits[b, :n].float(), dim=-1)
        top = torch.topk(logp, keep_top, dim=-1)
        result.append({"ids": torch.tensor(prompt + toks[:n], dtype=torch.int32), "start": len(prompt),
                       "top_ids": top.indices.to(torch.int32).cpu(), "top_logp": top.values.to(torch.float16).cpu()})
    return result


def cmd_generate(args: argparse.Namespace) -> None:
    """Write ``out/teacher/s{sample}-b{batch}.pt`` files; existing ones are kept (resume)."""
    torch.set_num_threads(args.threads)
    model, tok = load_target(args.target, args.device)
    prompts = train_prompts()
    folder = Path(args.out) / "teacher"
    folder.mkdir(parents=True, exist_ok=True)
    lengths = [len(chat_ids(tok, p)) for p in prompts]
    for s in range(args.samples):  # every prompt once before any twice: a run stopped early still covers them
        # one batch pads every prompt to its longest (prefill and attention grow with it): batches are
        # stretches of similar lengths (the order among equal lengths drawn per sample), run in random order
        draw = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(1000 + s)).tolist()
        order = sorted((i for i in draw if lengths[i] <= args.max_prompt), key=lengths.__getitem__)
        batches = [order[b:b + args.batch] for b in range(0, len(order), args.batch)]
        visit = torch.randperm(len(batches), generator=torch.Generator().manual_seed(2000 + s)).tolist()
        for b in visit:
            path = folder / f"s{s:02d}-b{b:04d}.pt"
            if path.exists():
                continue
            group = batches[b]
            t = time.time()
            rows = generate_batch(model, tok, [prompts[i] for i in group], args.new_tokens, args.temperature,
                                  args.keep_top, seed=s * 100_003 + b)
            tmp = path.with_suffix(".tmp")
            torch.save(rows, tmp)
            tmp.replace(path)
            n = sum(len(r["top_ids"]) for r in rows)
            log(f"{path.name}: {n} positions in {time.time() - t:.0f} s ({n / (time.time() - t):.1f}/s), "
                f"load {os.getloadavg()[0]:.1f}")


def cmd_references(args: argparse.Namespace) -> None:
    """The target's greedy answers to the benchmark prompts (``out/eval_greedy.pt``), for ``measure``."""
    torch.set_num_threads(args.threads)
    path = Path(args.out) / "eval_greedy.pt"
    if path.exists():
        return
    model, tok = load_target(args.target, args.device)
    rows = generate_batch(model, tok, eval_prompts(), args.new_tokens, 0.0, args.keep_top, seed=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(rows, path)
    log(f"{path}: {sum(len(r['top_ids']) for r in rows)} greedy positions")


def load_teacher(out: str | Path) -> list[dict]:
    """Every answer written by ``generate`` so far (file order, so the same files give the same list)."""
    rows: list[dict] = []
    for path in sorted((Path(out) / "teacher").glob("*.pt")):
        rows.extend(torch.load(path, weights_only=False))
    return rows


def head_vocabulary(rows: list[dict], size: int, always: Sequence[int] = ()) -> torch.Tensor:
    """The ``size`` target tokens a shallow draft's head keeps: those the target ranks first most often
    in the teacher answers (then the answers' own tokens), plus ``always`` (EOS); sorted ids."""
    counts = torch.zeros(max(int(r["top_ids"].max()) for r in rows) + 1, dtype=torch.float64)
    for r in rows:
        counts.index_add_(0, r["top_ids"][:, 0].long(), torch.ones(len(r["top_ids"]), dtype=torch.float64))
        counts.index_add_(0, r["top_ids"][:, 1:4].reshape(-1).long(),
                          torch.full((r["top_ids"][:, 1:4].numel(),), 1e-3, dtype=torch.float64))
    keep = set(int(t) for t in always)
    for t in torch.argsort(counts, descending=True).tolist():
        if len(keep) >= size or counts[t] <= 0:
            break
        keep.add(t)
    return torch.tensor(sorted(keep), dtype=torch.long)


class TeacherBatches:
    """Batches of teacher answers for KL training: ``(ids [B, T], targets [B, T, k] head indices,
    probs [B, T, k])``; position ``t`` of row ``b`` is trained to give ``probs`` over ``targets``
    for the token after it (zero rows: no loss there). The row order comes from ``rng`` (its state is
    checkpointed, so a resumed run sees the same batches)."""

    def __init__(self, rows: list[dict], head_tokens: torch.Tensor, batch: int, max_len: int, seed: int) -> None:
        import random

        self.rows = rows
        self.batch = batch
        self.max_len = max_len
        self.rng = random.Random(seed)
        self.lookup = torch.full((int(head_tokens.max()) + 1,), -1, dtype=torch.long)
        self.lookup[head_tokens] = torch.arange(len(head_tokens))

    def _map(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()
        out = torch.full_like(ids, -1)
        inside = ids < len(self.lookup)
        out[inside] = self.lookup[ids[inside]]
        return out

    def __call__(self, progress: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        picked = [self.rows[self.rng.randrange(len(self.rows))] for _ in range(self.batch)]
        T = min(self.max_len, max(len(r["ids"]) for r in picked))
        k = picked[0]["top_ids"].shape[1]
        ids = torch.zeros(self.batch, T, dtype=torch.long)
        targets = torch.zeros(self.batch, T, k, dtype=torch.long)
        probs = torch.zeros(self.batch, T, k)
        for b, r in enumerate(picked):
            cut = max(0, len(r["ids"]) - T)  # a long prompt loses its start, never the answer's positions
            seq = r["ids"][cut:].long()
            ids[b, : len(seq)] = seq
            start = r["start"] - cut  # index of the first answer token in seq
            n = len(r["top_ids"])
            tgt = self._map(r["top_ids"])  # [n, k]
            p = torch.softmax(r["top_logp"].float(), dim=-1) * (tgt >= 0)
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
            targets[b, start - 1: start - 1 + n] = tgt.clamp_min(0)
            probs[b, start - 1: start - 1 + n] = p
        return ids, targets, probs


def kl_loss(model: Any, batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of the draft's head distribution against the teacher's (top-k, renormalized over
    the head's tokens) at the answer positions: the KL up to the teacher's entropy."""
    ids, targets, probs = batch
    hidden = model.model(input_ids=ids).last_hidden_state  # [B, T, hidden]
    sel = probs.sum(-1) > 0  # [B, T]
    logq = torch.log_softmax(model.lm_head(hidden[sel]).float(), dim=-1)  # [n, head]
    return -(probs[sel] * logq.gather(1, targets[sel])).sum(-1).mean()


def new_shallow(target: Any, layers: Sequence[int], head_tokens: torch.Tensor) -> Any:
    """A shallow draft whose layers start as copies of the target's ``layers`` (and its final norm)."""
    from suffixspec.proposers.shallow_draft import build_draft_model

    cfg = target.config.__class__.from_dict({**target.config.to_dict(), "num_hidden_layers": len(layers)})
    model = build_draft_model(cfg, target, head_tokens)
    for mine, theirs in zip(model.model.layers, layers, strict=True):
        mine.load_state_dict(target.model.layers[theirs].state_dict())
    model.model.norm.load_state_dict(target.model.norm.state_dict())
    model.model.embed_tokens.weight.requires_grad_(False)
    return model


@torch.inference_mode()
def agreement(model: Any, rows: list[dict], head_tokens: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per answer, whether the model's argmax equals the target's greedy token at each position
    (teacher forcing on the target's own greedy answer)."""
    out = []
    for r in rows:
        ids = r["ids"].long()[None].to(model.get_input_embeddings().weight.device)
        logits = model(input_ids=ids).logits[0]  # [T, head or vocab]
        pred = logits.argmax(-1)
        if head_tokens is not None:
            pred = head_tokens.to(pred.device)[pred]
        start = r["start"]
        out.append((pred[start - 1: len(r["ids"]) - 1] == ids[0, start:]).float().cpu())
    return out


def acceptance(agree: list[torch.Tensor], depth: int = 8) -> list[float]:
    """P(a chain started at a random answer position is accepted to depth d), d = 1..depth."""
    hits = [0.0] * depth
    starts = [0] * depth  # chains that could reach depth d (an answer's last positions cannot go deep)
    for a in agree:
        for s in range(len(a)):
            for d in range(min(depth, len(a) - s)):
                starts[d] += 1
            for d in range(depth):
                if s + d >= len(a) or a[s + d] == 0:
                    break
                hits[d] += 1
    return [h / max(1, n) for h, n in zip(hits, starts, strict=True)]


def cmd_train(args: argparse.Namespace) -> None:
    from suffixspec.training.train_default_models import Checkpointer, train_loop

    torch.set_num_threads(args.threads)
    target, tok = load_target(args.target, args.device)
    rows = load_teacher(args.out)
    if not rows:
        raise SystemExit(f"no teacher data in {args.out}/teacher: run `generate` first")
    work = Path(args.out) / args.name
    work.mkdir(parents=True, exist_ok=True)
    vocab_path = work / "head_tokens.pt"
    if not vocab_path.exists():  # fixed at the first run, so a resumed run trains the same head
        torch.save(head_vocabulary(rows, args.head, [tok.eos_token_id]), vocab_path)
    head_tokens = torch.load(vocab_path)
    layers = [int(x) for x in args.init_layers.split(",")]
    model = new_shallow(target, layers, head_tokens)
    (work / "spec.json").write_text(json.dumps({"init_layers": layers, "head": len(head_tokens),
                                                "rows": len(rows)}), encoding="utf-8")
    batches = TeacherBatches(rows, head_tokens, args.batch, args.max_len, seed=0)
    refs = torch.load(Path(args.out) / "eval_greedy.pt", weights_only=False)

    def probe() -> dict:
        model.eval()
        acc = acceptance(agreement(model, refs, model.head_tokens), 4)
        return {"accept@1..4": [round(a, 3) for a in acc]}

    log(f"{args.name}: {len(rows)} answers, {sum(len(r['top_ids']) for r in rows)} positions, head {len(head_tokens)}, "
        f"layers from {layers}, {sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6:.2f}M trained")
    stats = train_loop(model, batches, args.lr, args.minutes, args.steps, args.name, warmup=20,
                       schedule="cosine", maker=batches, ckpt=Checkpointer(work, "train"), ckpt_minutes=3,
                       probe=probe, probe_minutes=args.probe_minutes, loss_fn=kl_loss)
    log(f"{args.name}: {stats}")


def trained_model(args: argparse.Namespace, target: Any) -> Any:
    """The draft of ``--out/--name`` with its latest checkpoint's weights."""
    work = Path(args.out) / args.name
    spec = json.loads((work / "spec.json").read_text(encoding="utf-8"))
    model = new_shallow(target, spec["init_layers"], torch.load(work / "head_tokens.pt"))
    state = torch.load(work / "train.pt", weights_only=False, map_location="cpu") if (work / "train.pt").exists() else None
    if state is not None:
        model.load_state_dict(state["model"])
    return model.eval(), spec, state


def _untrained(args: argparse.Namespace, target: Any, tok: Any) -> Any:
    """A draft of the target layers ``--init-layers``, untrained (for cost measurements and baselines);
    its head: the teacher answers' most frequent tokens, or the first ``--head`` ids without any."""
    rows = load_teacher(args.out)
    head = head_vocabulary(rows, args.head, [tok.eos_token_id]) if rows else torch.arange(args.head)
    return new_shallow(target, [int(x) for x in args.init_layers.split(",")], head).eval()


def cmd_export(args: argparse.Namespace) -> None:
    """The trained layers into a model folder (``save_shallow_draft``), with the training record."""
    from suffixspec.proposers.shallow_draft import save_shallow_draft

    target, tok = load_target(args.target, args.device)
    if args.init_layers:
        model, info = _untrained(args, target, tok), {"init_layers": args.init_layers, "untrained": True}
    else:
        model, spec, state = trained_model(args, target)
        info = {"init_layers": spec["init_layers"], "teacher_answers": spec["rows"],
                "steps": state["step"] if state else 0, "minutes": round(state["spent"] / 60, 1) if state else 0.0,
                "probes": state.get("probes", []) if state else []}
    save_shallow_draft(model, args.to, args.target_name, info)
    if args.with_tokenizer:
        tok.save_pretrained(args.to)
    log(f"exported {args.to}: {info}")


def cmd_measure(args: argparse.Namespace) -> None:
    """Teacher-forced acceptance per position on the benchmark answers: the draft of ``--name`` (or,
    with ``--init-layers``, an untrained one: target layers copied, no training)."""
    torch.set_num_threads(args.threads)
    target, tok = load_target(args.target, args.device)
    refs = torch.load(Path(args.out) / "eval_greedy.pt", weights_only=False)
    if args.init_layers:
        model = _untrained(args, target, tok)
    else:
        model = trained_model(args, target)[0]
    acc = acceptance(agreement(model, refs, model.head_tokens), args.depth)
    log(f"{args.name if not args.init_layers else 'layers ' + args.init_layers}: accepted to depth 1..{args.depth}: "
        f"{[round(a, 3) for a in acc]}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m suffixspec.training.distill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("generate", "references"):
        p = sub.add_parser(name)
        p.add_argument("--target", required=True, help="target model folder (SmolLM2-135M-Instruct)")
        p.add_argument("--out", required=True, help="working folder (teacher data, checkpoints)")
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--new-tokens", type=int, default=128)
        p.add_argument("--keep-top", type=int, default=32, help="target log-probabilities kept per position")
        if name == "generate":
            p.add_argument("--batch", type=int, default=32)
            p.add_argument("--samples", type=int, default=4, help="answers per prompt")
            p.add_argument("--temperature", type=float, default=0.8)
            p.add_argument("--max-prompt", type=int, default=384, help="skip prompts longer than this (tokens)")
    p = sub.add_parser("train")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--name", default="shallow", help="sub-folder of --out for this draft's checkpoints")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--init-layers", default="0,29", help="target layers the draft's layers start from")
    p.add_argument("--head", type=int, default=8192, help="tokens the draft's head keeps")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--probe-minutes", type=float, default=10.0)
    p = sub.add_parser("export")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--name", default="shallow")
    p.add_argument("--to", required=True, help="model folder to write (suffixspec/default_models/NAME)")
    p.add_argument("--target-name", default="smollm2-135m-instruct")
    p.add_argument("--with-tokenizer", action="store_true")
    p.add_argument("--init-layers", default=None, help="export an untrained draft of these target layers")
    p.add_argument("--head", type=int, default=8192)
    p = sub.add_parser("measure")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--name", default="shallow")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--init-layers", default=None, help="measure an untrained draft made of these target layers")
    p.add_argument("--head", type=int, default=8192)
    p.add_argument("--depth", type=int, default=6)
    for p in sub.choices.values():
        p.add_argument("--device", default="cpu", help="cpu, or cuda when the run has a GPU")
    args = ap.parse_args(argv)
    {"generate": cmd_generate, "references": cmd_references, "train": cmd_train, "export": cmd_export,
     "measure": cmd_measure}[args.cmd](args)


if __name__ == "__main__":
    main()
