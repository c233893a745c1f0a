#!/bin/bash
# GRPO for Qwen3-4B on one node with 8 GPUs; the Megatron trainer and the SGLang engines share
# (colocate on) the same GPUs. For slime v0.3.1 (SGLang 0.5.15.post1, Megatron-LM 1dcf0da).
# The recipe is the one slime's scripts/run-qwen3-4B.sh uses, without its `pkill -9` preamble and
# with checks before anything starts.
#
# Before running (SKILL.md, Workflow 1):
#   - slime-check prereqs --gpus 8 reports no FAIL;
#   - Qwen3-4B is downloaded and converted to Megatron torch_dist (tools/convert_hf_to_torch_dist.py);
#   - dapo-math-17k and aime-2024 are downloaded.
# Then, from the slime checkout:
#   slime-check config --slime-dir . scripts/run-qwen3-4B-grpo-8gpu.sh
#   bash scripts/run-qwen3-4B-grpo-8gpu.sh
set -euo pipefail

SLIME_DIR=${SLIME_DIR:-/root/slime}
MEGATRON_DIR=${MEGATRON_DIR:-/root/Megatron-LM}
HF_DIR=${HF_DIR:-/root/Qwen3-4B}
REF_DIR=${REF_DIR:-/root/Qwen3-4B_torch_dist}
SAVE_DIR=${SAVE_DIR:-/root/Qwen3-4B_slime}
TRAIN_DATA=${TRAIN_DATA:-/root/dapo-math-17k/dapo-math-17k.jsonl}
EVAL_DATA=${EVAL_DATA:-/root/aime-2024/aime-2024.jsonl}
NUM_GPUS=${NUM_GPUS:-8}
NUM_ROLLOUT=${NUM_ROLLOUT:-3000}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}

# Megatron cannot read the architecture from a checkpoint; these are slime's
# scripts/models/qwen3-4B.sh values. They must match ${HF_DIR}/config.json (slime checks).
# For another model: source "${SLIME_DIR}/scripts/models/<model>.sh" instead.
MODEL_ARGS=(
   --swiglu
   --num-layers 36
   --hidden-size 2560
   --ffn-hidden-size 9728
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 8
   --use-rotary-position-embeddings
   --disable-bias-linear
   --normalization "RMSNorm"
   --norm-epsilon 1e-6
   --rotary-base 1000000
   --vocab-size 151936
   --kv-channels 128
   --qk-layernorm
)

CKPT_ARGS=(
   # tokenizer + engine architecture; engines receive the Megatron weights before rollout 0
   --hf-checkpoint ${HF_DIR}
   # reference model, and the actor's start while ${SAVE_DIR} holds no checkpoint
   --ref-load ${REF_DIR}
   # resume: --load equal to --save (it must contain latest_checkpointed_iteration.txt)
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
   # batch identity: 32 prompts x 8 samples = 256 = global batch 256 x 1 step per rollout
   --rollout-batch-size 32
   --n-samples-per-prompt 8
   --global-batch-size 256
   --rollout-max-response-len 8192
   --rollout-temperature 1
   --balance-data
)

EVAL_ARGS=(
   --eval-interval 20
   --eval-prompt-data aime ${EVAL_DATA}
   --n-samples-per-eval-prompt 16
   --eval-max-response-len 16384
   --eval-top-p 1
)

PERF_ARGS=(
   --tensor-model-parallel-size 2
   --sequence-parallel
   --pipeline-model-parallel-size 1
   --context-parallel-size 1
   --expert-model-parallel-size 1
   --expert-tensor-parallel-size 1
   --recompute-granularity full
   --recompute-method uniform
   --recompute-num-layers 1
   # pack variable-length samples up to this many tokens per GPU (the main OOM knob)
   --use-dynamic-batch-size
   --max-tokens-per-gpu 9216
)

GRPO_ARGS=(
   --advantage-estimator grpo
   # KL to the reference is computed and logged; coefficient 0 keeps it out of the loss
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
   # 8 GPUs / 2 per engine = 4 engines behind the router
   --rollout-num-gpus-per-engine 2
   # colocated: leave room for Megatron's residue after offload; lower it on OOM at start-up
   --sglang-mem-fraction-static 0.7
)

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   --attention-backend flash
)

WANDB_ARGS=(
   # --use-wandb
   # --wandb-project slime-qwen3-4B
   # --wandb-group grpo
)

# 1. Checks. Nothing starts unless the machine and this script pass (SKIP_CHECKS=1 skips them).
if [ "${SKIP_CHECKS:-0}" != 1 ]; then
   slime-check prereqs --gpus "${NUM_GPUS}" || { echo "slime-check prereqs failed: fix the FAIL lines first" >&2; exit 1; }
   slime-check config --slime-dir "${SLIME_DIR}" "${BASH_SOURCE[0]}" || { echo "slime-check config failed" >&2; exit 1; }
fi

# 2. NVLink, detected before anything starts: with NVLink between the GPUs, NCCL may use NVLS.
#    No NVLink (PCIe-only hosts) or no `nvidia-smi topo` output means 0; the script goes on.
HAS_NVLINK=0
if TOPOLOGY=$(nvidia-smi topo -m 2>/dev/null) && [[ "${TOPOLOGY}" =~ NV[0-9]+ ]]; then
   HAS_NVLINK=1
fi
echo "NVLink between GPUs: ${HAS_NVLINK} (NCCL_NVLS_ENABLE=${HAS_NVLINK})"

# 3. Ray. Start a head for this node unless one already runs here. Never stop or kill a Ray
#    cluster or processes you did not start; stop this job with `ray job stop <job id>`.
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
    \"NCCL_NVLS_ENABLE\": \"${HAS_NVLINK}\",
    \"PYTHONUNBUFFERED\": \"1\"
  }
}"

# 4. Submit. The job's log streams here; `ray job logs -f <job id>` re-attaches after a disconnect.
ray job submit --address="http://${MASTER_ADDR}:8265" \
   --runtime-env-json="${RUNTIME_ENV_JSON}" \
   -- python3 "${SLIME_DIR}/train.py" \
   --actor-num-nodes 1 \
   --actor-num-gpus-per-node ${NUM_GPUS} \
   --colocate \
   "${MODEL_ARGS[@]}" \
   "${CKPT_ARGS[@]}" \
   "${ROLLOUT_ARGS[@]}" \
   "${EVAL_ARGS[@]}" \
   "${PERF_ARGS[@]}" \
   "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" \
   "${SGLANG_ARGS[@]}" \
   "${MISC_ARGS[@]}" \
   "${WANDB_ARGS[@]}"
