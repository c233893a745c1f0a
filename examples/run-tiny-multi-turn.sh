#!/bin/bash
# Multi-turn GRPO on the embedded tiny model: a custom generate function runs an episode (answer,
# environment feedback, answer again) and a custom reward scores it. Hooks: examples/arith_task/.
# Environment tokens are masked out of the loss; only the model's tokens are trained on.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/tiny-qwen3.sh"
RUN_NAME=multi-turn
# room for two answers and the feedback turn between them
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-48}
source "${SCRIPT_DIR}/tiny-grpo-args.sh"

export PYTHONPATH="${SCRIPT_DIR}:${PYTHONPATH:-}"

REWARD_ARGS=(
   # async def generate_with_feedback(args, sample, sampling_params) -> Sample
   --custom-generate-function-path arith_task.multi_turn.generate_with_feedback
   # async def boxed_answer_reward(args, sample, **kwargs) -> float; reads metadata["feedback_turns"]
   --custom-rm-path arith_task.reward.boxed_answer_reward
   --log-multi-turn
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
