#!/bin/bash
# Quick start, stage 1: a short supervised warm-up of the embedded tiny model (slime's SFT path:
# sft_rollout + sft_loss, training only). GRPO in stage 2 then starts from a model that knows part of
# the addition table but rarely writes the \boxed{} answer the reward asks for.
#
#   slime-ref make-tiny --out ./slime-tiny
#   bash examples/run-tiny-sft-warmup.sh      # writes ./slime-tiny-runs/sft
#   bash examples/run-tiny-grpo.sh            # stage 2
#
# `slime-check quickstart` runs both stages for you and reports the reward before and after.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/tiny-qwen3.sh"

TINY=${TINY:-./slime-tiny}
OUT=${OUT:-./slime-tiny-runs}
SFT_STEPS=${SFT_STEPS:-20}

CKPT_ARGS=(
   --hf-checkpoint ${TINY}/model
   # an HF directory: slime v0.3.1 loads Qwen3 weights from HF directly, no conversion needed
   --ref-load ${TINY}/model
   --save ${OUT}/sft
   --save-interval ${SFT_STEPS}
)

SFT_ARGS=(
   --rollout-function-path slime.rollout.sft_rollout.generate_rollout
   --prompt-data ${TINY}/data/sft.jsonl
   --input-key messages
   --rollout-shuffle
   --num-rollout ${SFT_STEPS}
   --rollout-batch-size 32
   --global-batch-size 32
   --loss-type sft_loss
   --calculate-per-token-loss
   --disable-compute-advantages-and-returns
   # no rollout engines: the data is fixed text
   --debug-train-only
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-3
   --lr-decay-style constant
   --weight-decay 0.0
   --adam-beta1 0.9
   --adam-beta2 0.98
)

PERF_ARGS=(
   --use-dynamic-batch-size
   --max-tokens-per-gpu 2048
)

RESOURCE_ARGS=(
   --actor-num-nodes 1
   --actor-num-gpus-per-node 1
)

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
)

# slime-ref takes slime's flags. With slime on a GPU, submit the same arrays with
# `ray job submit ... -- python3 train_async.py` (slime's SFT scripts use train_async.py).
slime-ref train \
   "${MODEL_ARGS[@]}" \
   "${CKPT_ARGS[@]}" \
   "${SFT_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" \
   "${PERF_ARGS[@]}" \
   "${RESOURCE_ARGS[@]}" \
   "${MISC_ARGS[@]}"
