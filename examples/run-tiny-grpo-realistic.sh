#!/bin/bash
# GRPO on the embedded tiny model with the knobs a real run uses: trainer and engine on separate
# devices, KL to the reference logged, clip-higher, truncated importance sampling, DAPO-style dynamic
# sampling, token-level loss, load balancing, periodic eval with pass@k, TensorBoard, and resume.
# Swap models/tiny-qwen3.sh and the paths for a real model; the flag set carries over.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/tiny-qwen3.sh"
RUN_NAME=realistic
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-16}
source "${SCRIPT_DIR}/tiny-grpo-args.sh"

DYNAMIC_SAMPLING_ARGS=(
   # sample 16 prompts, keep groups whose rewards differ (all-same groups give zero advantage),
   # stop once 8 groups are kept; the fallback variant avoids a second sampling round
   --over-sampling-batch-size 16
   --dynamic-sampling-filter-path slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback
)

EVAL_ARGS=(
   --eval-interval 10
   --eval-prompt-data arith ${TINY}/data/eval.jsonl
   --n-samples-per-eval-prompt 8
   --log-passrate
)

GRPO_ARGS=(
   --advantage-estimator grpo
   # KL(actor || reference) is computed and logged; coefficient 0 keeps it out of the loss
   --use-kl-loss
   --kl-loss-coef 0.00
   --kl-loss-type low_var_kl
   --eps-clip 0.2
   --eps-clip-high 0.28
   --entropy-coef 0.0
   # weight the loss by min(exp(old - rollout log-probs), 2): engine and trainer numerics differ
   --use-tis
   --tis-clip 2.0
   # average the loss over tokens rather than over samples
   --calculate-per-token-loss
)

PERF_ARGS=(
   --use-dynamic-batch-size
   --max-tokens-per-gpu 2048
   --balance-data
)

RESOURCE_ARGS=(
   # disaggregated: 1 device trains, 1 device serves rollouts; weights move by broadcast
   --actor-num-nodes 1
   --actor-num-gpus-per-node 1
   --rollout-num-gpus 1
   --rollout-num-gpus-per-engine 1
)

LOG_ARGS=(
   --use-tensorboard
   --tb-project-name ${OUT}/${RUN_NAME}/tensorboard
)

slime-ref train \
   "${MODEL_ARGS[@]}" \
   "${CKPT_ARGS[@]}" \
   "${ROLLOUT_ARGS[@]}" \
   "${DYNAMIC_SAMPLING_ARGS[@]}" \
   "${REWARD_ARGS[@]}" \
   "${EVAL_ARGS[@]}" \
   "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" \
   "${PERF_ARGS[@]}" \
   "${RESOURCE_ARGS[@]}" \
   "${LOG_ARGS[@]}" \
   "${MISC_ARGS[@]}"
