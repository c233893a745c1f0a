#!/bin/bash
# A small GRPO run: Qwen2.5-0.5B-Instruct on 1 to 4 GPUs of one node, colocated. For slime v0.3.1.
# The shape of slime's own smallest CI run (tests/test_qwen2.5_0.5B_short.py): dapo-math-17k, the
# deepscaler rule reward, HF weights loaded directly (slime v0.3.1 reads Qwen2 HF checkpoints into
# Megatron with TransformerEngine's layers, as in its image: no torch_dist conversion for this model).
#
# Before running: slime-check prereqs --gpus ${NUM_GPUS} reports no FAIL, and
#   hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir /root/Qwen2.5-0.5B-Instruct
#   hf download --repo-type dataset zhuzilin/dapo-math-17k --local-dir /root/dapo-math-17k
# Then, from the slime checkout:  NUM_GPUS=2 bash scripts/run-qwen2.5-0.5B-grpo-small.sh
# A first test on one GPU: 3 rollouts, and slime checks that its first weight update gives every engine
# back the very tensors it loaded from the checkpoint:
#   NUM_GPUS=1 NUM_ROLLOUT=3 EXTRA_ARGS="--check-weight-update-equal" bash scripts/run-qwen2.5-0.5B-grpo-small.sh
set -euo pipefail

SLIME_DIR=${SLIME_DIR:-/root/slime}
MEGATRON_DIR=${MEGATRON_DIR:-/root/Megatron-LM}
HF_DIR=${HF_DIR:-/root/Qwen2.5-0.5B-Instruct}
SAVE_DIR=${SAVE_DIR:-/root/Qwen2.5-0.5B-Instruct_slime}
TRAIN_DATA=${TRAIN_DATA:-/root/dapo-math-17k/dapo-math-17k.jsonl}
NUM_GPUS=${NUM_GPUS:-4}
NUM_ROLLOUT=${NUM_ROLLOUT:-100}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
# more train.py flags, split at spaces and passed last, so that they win over the ones below
EXTRA=(${EXTRA_ARGS:-})

case "${NUM_GPUS}" in
   1|2|3|4) ;;
   *) echo "NUM_GPUS must be 1 to 4 for this template (got ${NUM_GPUS})" >&2; exit 2 ;;
esac

# slime's scripts/models/qwen2.5-0.5B.sh; must match ${HF_DIR}/config.json (slime checks).
MODEL_ARGS=(
   --swiglu
   --num-layers 24
   --hidden-size 896
   --ffn-hidden-size 4864
   --num-attention-heads 14
   --use-rotary-position-embeddings
   --disable-bias-linear
   --add-qkv-bias
   --normalization "RMSNorm"
   --norm-epsilon 1e-6
   --rotary-base 1000000
   --group-query-attention
   --num-query-groups 2
   --vocab-size 151936
)

CKPT_ARGS=(
   --hf-checkpoint ${HF_DIR}
   # an HF directory as the reference (and the actor's start until ${SAVE_DIR} has a checkpoint)
   --ref-load ${HF_DIR}
   --load ${SAVE_DIR}
   --save ${SAVE_DIR}
   --save-interval 20
)

ROLLOUT_ARGS=(
   --prompt-data ${TRAIN_DATA}
   --input-key prompt
   --label-key label
   --apply-chat-template
   --rollout-shuffle
   --rm-type deepscaler
   --num-rollout ${NUM_ROLLOUT}
   # batch identity: 8 prompts x 8 samples = 64 = global batch 64 x 1 step per rollout
   --rollout-batch-size 8
   --n-samples-per-prompt 8
   --global-batch-size 64
   --rollout-max-response-len 4096
   --rollout-temperature 1
   --balance-data
)

PERF_ARGS=(
   --tensor-model-parallel-size 1
   --pipeline-model-parallel-size 1
   --context-parallel-size 1
   --use-dynamic-batch-size
   --max-tokens-per-gpu 8192
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --use-kl-loss
   --kl-loss-coef 0.00
   --kl-loss-type low_var_kl
   --entropy-coef 0.00
   --eps-clip 0.2
   --eps-clip-high 0.28
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-6
   --lr-decay-style constant
   --weight-decay 0.1
   --adam-beta1 0.9
   --adam-beta2 0.98
)

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 1
   --sglang-mem-fraction-static 0.7
)

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   --attention-backend flash
)

if [ "${SKIP_CHECKS:-0}" != 1 ]; then
   slime-check prereqs --gpus "${NUM_GPUS}" || { echo "slime-check prereqs failed: fix the FAIL lines first" >&2; exit 1; }
   slime-check config --slime-dir "${SLIME_DIR}" "${BASH_SOURCE[0]}" || { echo "slime-check config failed" >&2; exit 1; }
fi

# Never stop or kill a Ray cluster or processes you did not start; stop this job with
# `ray job stop <job id>`.
if ray status --address "${MASTER_ADDR}:6379" >/dev/null 2>&1; then
   echo "Reusing the Ray cluster at ${MASTER_ADDR}:6379; check free GPUs with: ray status"
else
   ray start --head --node-ip-address "${MASTER_ADDR}" --num-gpus "${NUM_GPUS}" \
      --disable-usage-stats --dashboard-host=127.0.0.1 --dashboard-port=8265
fi

RUNTIME_ENV_JSON="{
  \"env_vars\": {
    \"PYTHONPATH\": \"${MEGATRON_DIR}\",
    \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\",
    \"PYTHONUNBUFFERED\": \"1\"
  }
}"

ray job submit --address="http://${MASTER_ADDR}:8265" \
   --runtime-env-json="${RUNTIME_ENV_JSON}" \
   -- python3 "${SLIME_DIR}/train.py" \
   --actor-num-nodes 1 \
   --actor-num-gpus-per-node ${NUM_GPUS} \
   --colocate \
   --num-gpus-per-node ${NUM_GPUS} \
   "${MODEL_ARGS[@]}" \
   "${CKPT_ARGS[@]}" \
   "${ROLLOUT_ARGS[@]}" \
   "${PERF_ARGS[@]}" \
   "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" \
   "${SGLANG_ARGS[@]}" \
   "${MISC_ARGS[@]}" \
   "${EXTRA[@]}"
