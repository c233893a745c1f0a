#!/bin/bash
# GRPO on the embedded tiny model with a custom reward function instead of a built-in --rm-type.
# The hook is examples/arith_task/reward.py, passed as a dotted import path.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/tiny-qwen3.sh"
RUN_NAME=custom-reward
source "${SCRIPT_DIR}/tiny-grpo-args.sh"

# The hook's package must be importable where rollouts run. With slime, put this folder in the
# PYTHONPATH of `ray job submit --runtime-env-json`, next to Megatron-LM.
export PYTHONPATH="${SCRIPT_DIR}:${PYTHONPATH:-}"

REWARD_ARGS=(
   # async def boxed_answer_reward(args, sample, **kwargs) -> float
   --custom-rm-path arith_task.reward.boxed_answer_reward
)

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
