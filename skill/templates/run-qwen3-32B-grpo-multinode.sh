#!/bin/bash
# GRPO for Qwen3-32B across several nodes of 8 GPUs (default 2 nodes, 16 GPUs), colocated: the
# Megatron trainer (TP 8, data parallel across nodes) and the SGLang engines (8 GPUs each) share
# the GPUs. For slime v0.3.1 (SGLang 0.5.15.post1, Megatron-LM 1dcf0da). The recipe is slime's
# scripts/run-qwen3-32B.sh spread over nodes, without its `pkill -9` preamble or ssh loop.
#
# Run this same script on every node, head first:
#   node 0:      MASTER_ADDR=<node 0 address> NODE_RANK=0 bash run-qwen3-32B-grpo-multinode.sh
#   each other:  MASTER_ADDR=<node 0 address> NODE_RANK=<1..> bash run-qwen3-32B-grpo-multinode.sh
# Node 0 starts the Ray head and submits the job; the others check their machine and join. The job
# waits ("Waiting for placement group") until all NUM_NODES x 8 GPUs have joined.
#
# Before running (SKILL.md, Workflow 1; skill/references/long-runs.md):
#   - slime-check prereqs --gpus 8 reports no FAIL on every node;
#   - Qwen3-32B downloaded and converted to torch_dist; data downloaded; all of it, and this
#     script, at the same paths on every node (a shared filesystem), as --save must be;
#   - NODE_IP: this node's address the other nodes reach (it becomes SLIME_HOST_IP), and
#     SOCKET_IFNAME: its network interface, when a node has several (Docker, SLURM, multi-NIC).
set -euo pipefail

SLIME_DIR=${SLIME_DIR:-/root/slime}
MEGATRON_DIR=${MEGATRON_DIR:-/root/Megatron-LM}
HF_DIR=${HF_DIR:-/root/Qwen3-32B}
REF_DIR=${REF_DIR:-/root/Qwen3-32B_torch_dist}
SAVE_DIR=${SAVE_DIR:-/root/Qwen3-32B_slime}
TRAIN_DATA=${TRAIN_DATA:-/root/dapo-math-17k/dapo-math-17k.jsonl}
EVAL_DATA=${EVAL_DATA:-/root/aime-2024/aime-2024.jsonl}
NUM_NODES=${NUM_NODES:-2}
NUM_ROLLOUT=${NUM_ROLLOUT:-3000}
MASTER_ADDR=${MASTER_ADDR:-}
NODE_RANK=${NODE_RANK:-}
NODE_IP=${NODE_IP:-}
SOCKET_IFNAME=${SOCKET_IFNAME:-}

if [ -z "${MASTER_ADDR}" ] || [ -z "${NODE_RANK}" ]; then
   echo "Set MASTER_ADDR (node 0's address) and NODE_RANK (0 on the head node, 1.. on the others)" >&2
   exit 2
fi
if [ -n "${NODE_IP}" ]; then export SLIME_HOST_IP=${NODE_IP}; fi
if [ -n "${SOCKET_IFNAME}" ]; then
   export GLOO_SOCKET_IFNAME=${SOCKET_IFNAME} NCCL_SOCKET_IFNAME=${SOCKET_IFNAME} TP_SOCKET_IFNAME=${SOCKET_IFNAME}
fi
export no_proxy="127.0.0.1,localhost,${MASTER_ADDR}${NODE_IP:+,${NODE_IP}}"

# slime's scripts/models/qwen3-32B.sh; must match ${HF_DIR}/config.json (slime checks part of it).
MODEL_ARGS=(
   --swiglu
   --num-layers 64
   --hidden-size 5120
   --ffn-hidden-size 25600
   --num-attention-heads 64
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
   --untie-embeddings-and-output-weights
)

CKPT_ARGS=(
   --hf-checkpoint ${HF_DIR}
   --ref-load ${REF_DIR}
   # resume: --load equal to --save (it must contain latest_checkpointed_iteration.txt)
   --load ${SAVE_DIR}
   --save ${SAVE_DIR}
   --save-interval 20
   # a 32B checkpoint with its optimizer state is roughly 450 GB: keep only the newest one on disk
   --save-retain-interval 20
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
   # TP within a node (NVLink); data parallel across the nodes
   --tensor-model-parallel-size 8
   --sequence-parallel
   --pipeline-model-parallel-size 1
   --context-parallel-size 1
   --expert-model-parallel-size 1
   --expert-tensor-parallel-size 1
   --recompute-granularity full
   --recompute-method uniform
   --recompute-num-layers 1
   --use-dynamic-batch-size
   --max-tokens-per-gpu 20480
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
   # Adam on the CPU: the optimizer state of 32B does not fit next to the engines
   --optimizer-cpu-offload
   --overlap-cpu-optimizer-d2h-h2d
   --use-precision-aware-optimizer
)

SGLANG_ARGS=(
   # NUM_NODES x 8 GPUs / 8 per engine = one engine per node
   --rollout-num-gpus-per-engine 8
   --sglang-mem-fraction-static 0.7
)

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   --attention-backend flash
)

# 1. Checks on every node. Nothing starts unless this machine and the script pass (SKIP_CHECKS=1 skips them).
if [ "${SKIP_CHECKS:-0}" != 1 ]; then
   slime-check prereqs --gpus 8 || { echo "slime-check prereqs failed on this node: fix the FAIL lines first" >&2; exit 1; }
   if [ "${NODE_RANK}" = 0 ]; then
      slime-check config --slime-dir "${SLIME_DIR}" "${BASH_SOURCE[0]}" || { echo "slime-check config failed" >&2; exit 1; }
   fi
fi

# 2. NVLink, detected before anything starts (0 on PCIe-only hosts; the script goes on).
HAS_NVLINK=0
if TOPOLOGY=$(nvidia-smi topo -m 2>/dev/null) && [[ "${TOPOLOGY}" =~ NV[0-9]+ ]]; then
   HAS_NVLINK=1
fi
echo "NVLink between GPUs: ${HAS_NVLINK} (NCCL_NVLS_ENABLE=${HAS_NVLINK})"

# 3. Ray. Never stop or kill a Ray cluster or processes you did not start; stop the job with
#    `ray job stop <job id>` on node 0, and shut down only the Ray nodes you started yourself.
if [ "${NODE_RANK}" != 0 ]; then
   if [ -n "${NODE_IP}" ]; then
      ray start --address="${MASTER_ADDR}:6379" --num-gpus 8 --disable-usage-stats --node-ip-address "${NODE_IP}"
   else
      ray start --address="${MASTER_ADDR}:6379" --num-gpus 8 --disable-usage-stats
   fi
   echo "Node ${NODE_RANK} joined the Ray cluster at ${MASTER_ADDR}:6379; node 0 runs the job."
   exit 0
fi
if ray status --address "${MASTER_ADDR}:6379" >/dev/null 2>&1; then
   echo "Reusing the Ray cluster at ${MASTER_ADDR}:6379; check its nodes and free GPUs with: ray status"
else
   ray start --head --node-ip-address "${MASTER_ADDR}" --num-gpus 8 --disable-usage-stats \
      --dashboard-host=127.0.0.1 --dashboard-port=8265
fi
echo "Start the other $((NUM_NODES - 1)) node(s) now with NODE_RANK=1..; the job waits for their GPUs."

IFNAME_ENV=""
if [ -n "${SOCKET_IFNAME}" ]; then
   IFNAME_ENV=",
    \"GLOO_SOCKET_IFNAME\": \"${SOCKET_IFNAME}\",
    \"NCCL_SOCKET_IFNAME\": \"${SOCKET_IFNAME}\",
    \"TP_SOCKET_IFNAME\": \"${SOCKET_IFNAME}\""
fi
RUNTIME_ENV_JSON="{
  \"env_vars\": {
    \"PYTHONPATH\": \"${MEGATRON_DIR}\",
    \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\",
    \"NCCL_NVLS_ENABLE\": \"${HAS_NVLINK}\",
    \"MASTER_ADDR\": \"${MASTER_ADDR}\",
    \"no_proxy\": \"${no_proxy}\",
    \"TORCHINDUCTOR_FORCE_DISABLE_CACHES\": \"1\",
    \"PYTHONUNBUFFERED\": \"1\"${IFNAME_ENV}
  }
}"

# 4. Submit from node 0. `ray job logs -f <job id>` re-attaches after a disconnect.
ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json="${RUNTIME_ENV_JSON}" \
   -- python3 "${SLIME_DIR}/train.py" \
   --actor-num-nodes ${NUM_NODES} \
   --actor-num-gpus-per-node 8 \
   --colocate \
   "${MODEL_ARGS[@]}" \
   "${CKPT_ARGS[@]}" \
   "${ROLLOUT_ARGS[@]}" \
   "${EVAL_ARGS[@]}" \
   "${PERF_ARGS[@]}" \
   "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" \
   "${SGLANG_ARGS[@]}" \
   "${MISC_ARGS[@]}"
