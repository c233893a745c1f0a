#!/bin/bash
# Quick start, stage 2: GRPO on the embedded tiny model, starting from the warm-up checkpoint.
# Reward: --rm-type math (only an answer written as \boxed{8} counts).
#
#   bash examples/run-tiny-grpo.sh                      # after run-tiny-sft-warmup.sh
#   WARM=./slime-tiny/model bash examples/run-tiny-grpo.sh   # from the untrained model instead
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/tiny-qwen3.sh"
source "${SCRIPT_DIR}/tiny-grpo-args.sh"

# slime-ref takes slime's flags. With slime on a GPU, submit the same arrays with
# `ray job submit ... -- python3 train.py`, as the skill's templates do.
slime-ref train \
   "${MODEL_ARGS[@]}" \
   "${CKPT_ARGS[@]}" \
   "${ROLLOUT_ARGS[@]}" \
   "${REWARD_ARGS[@]}" \
   "${EVAL_ARGS[@]}" \
   "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" \
   "${PERF_ARGS[@]}" \
   "${RESOURCE_ARGS[@]}" \
   "${MISC_ARGS[@]}"
