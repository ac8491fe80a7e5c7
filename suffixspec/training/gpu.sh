#!/usr/bin/env bash
# Train the default models on one CUDA GPU: the recipe of train_default_models.py (the hand-built copy
# circuit, layers 0-1 frozen, a copy example in a third of the sequences), scaled to what a GPU does in
# minutes. PREPARED, NOT YET RUN ON A GPU (no session with one has run it; the CPU path of every flag is
# tested). Run from the repository root:
#
#     bash suffixspec/training/gpu.sh                       # checkpoints and models under /tmp/suffixspec-gpu
#     CKPT=/data/ckpt MINUTES=20 bash suffixspec/training/gpu.sh --resume   # go on for longer
#
# Why these sizes: the CPU runs (suffixspec/training/MEASUREMENTS.md) flatten near 3.4 nats/token on the
# held-out packages for 8.8M parameters, so the GPU run trains a larger target (8 x 384, about 20M
# parameters, 40 MB in float16; the two models must stay under 60 MB together) on batches of 48 x 512
# tokens with 16 copy examples (the CPU recipe's third). The corpus is rebuilt from the installed
# packages (data.TRAIN_PACKAGES): other versions than the model cards name give another corpus.
# The final phase (copy calibration, evaluation, the model cards) runs on the CPU, with --threads.
set -euo pipefail
CKPT=${CKPT:-/tmp/suffixspec-gpu}
OUT=${OUT:-$CKPT/out}
MINUTES=${MINUTES:-8}
PY=${PY:-python}
"$PY" -m suffixspec.training.train_default_models --device cuda --ckpt-dir "$CKPT" --out "$OUT" \
    --target-layers 8 --target-hidden 384 --target-inter 1152 --target-batch 48 --copies-per-batch 16 \
    --lr 2e-3 --target-minutes "$MINUTES" --anneal-minutes 2 --probe-minutes 2 --ckpt-minutes 2 \
    --draft-minutes 2 --draft-batch 64 --threads "$(nproc)" "$@"
