#!/usr/bin/env bash
# The skill's one-GPU workflow on real slime v0.3.1, on the GPU machine, after every group of
# install_slime_set.sh. A Qwen2.5-0.5B-shaped model (random bf16 weights, the embedded tokenizer) and
# the arithmetic prompts are built here first.
#
#   bash bench/gpu/slime_one_gpu.sh template   the small template as the skill prints it: NUM_GPUS=1,
#                                              NUM_ROLLOUT=3, EXTRA_ARGS with --check-weight-update-equal
#   bash bench/gpu/slime_one_gpu.sh smoke      slime-check smoke --with slime on that template
#   bash bench/gpu/slime_one_gpu.sh bad-hook   the same with a reward hook path that does not import
#
# Logs go to LOGS (default $OUT, else WORK/logs); WORK (default /tmp/slime-one-gpu) keeps the model.
# What differs from slime's image is in EXTRA_ARGS below and in bench/README.md.
set -euo pipefail

MODE=${1:?usage: slime_one_gpu.sh template|smoke|bad-hook}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
source /tmp/slime-set/env.sh
WORK=${WORK:-/tmp/slime-one-gpu}
LOGS=${LOGS:-${OUT:-$WORK/logs}}
TEMPLATE=$REPO/skill/templates/run-qwen2.5-0.5B-grpo-small.sh
mkdir -p "$WORK/bin" "$LOGS"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

# slime-check on PATH, as `pip install` of this repository puts it
printf '#!/bin/sh\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec python3 -c "from slime_rehearse.cli import main; main()" "$@"\n' \
  "$REPO/reference_impl" >"$WORK/bin/slime-check"
chmod +x "$WORK/bin/slime-check"
export PATH=$WORK/bin:$PATH

PYTHONPATH=$REPO/reference_impl python3 "$REPO/bench/shaped_model.py" --shape qwen2.5-0.5B --out "$WORK/model" \
  >"$LOGS/model.json"
export NUM_GPUS=1 NUM_ROLLOUT=3 HF_DIR=$WORK/model SAVE_DIR=$WORK/save TRAIN_DATA=$WORK/model-tiny/data/train.jsonl
# The one flag the skill's one-GPU test adds, then what this machine's set needs. No TransformerEngine:
# Megatron's local layers under TransformerEngine's parameter names with torch's attention
# (bench/gpu/te_named_local_spec.py; it and slime_ref reach the job's PYTHONPATH through MEGATRON_DIR),
# and Megatron's fusions that need TransformerEngine off. SGLang without
# FA3 and flashinfer's JIT: triton attention, torch sampling, no grammar backend.
CHECK_ARGS="--check-weight-update-equal"
SET_ARGS="--transformer-impl local --spec te_named_local_spec te_named_local_spec --no-rope-fusion"
SET_ARGS+=" --no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-persist-layer-norm"
SET_ARGS+=" --sglang-attention-backend triton --sglang-sampling-backend pytorch --sglang-grammar-backend none"
export EXTRA_ARGS="$CHECK_ARGS $SET_ARGS"
export MEGATRON_DIR="$MEGATRON_DIR:$REPO/bench/gpu:$REPO/reference_impl"

slime-check prereqs --gpus 1 --json >"$LOGS/prereqs.json" || true
slime-check config --slime-dir "$SLIME_DIR" --env NUM_GPUS=1 --env "HF_DIR=$HF_DIR" --env "TRAIN_DATA=$TRAIN_DATA" \
  --env "EXTRA_ARGS=$EXTRA_ARGS" "$TEMPLATE" >"$LOGS/config.txt" 2>&1 || true

case "$MODE" in
template)
  # A Ray head of our own (stopped by its pid at the end); the template finds it and submits to it.
  env -u PYTHONPATH ray start --head --block --node-ip-address 127.0.0.1 --port 6379 --num-gpus 1 \
    --disable-usage-stats --dashboard-host 127.0.0.1 --dashboard-port 8265 >"$LOGS/ray-head.log" 2>&1 &
  ray_pid=$!
  trap 'kill -TERM $ray_pid 2>/dev/null; wait $ray_pid 2>/dev/null || true' EXIT
  for _ in $(seq 120); do
    python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8265/api/version", timeout=2)' \
      2>/dev/null && break
    kill -0 $ray_pid 2>/dev/null || { echo "the Ray head exited; see $LOGS/ray-head.log" >&2; exit 1; }
    sleep 1
  done
  start=$(date +%s)
  set +e
  SKIP_CHECKS=1 timeout "${RUN_TIMEOUT:-480}" bash "$TEMPLATE" >"$LOGS/slime-run.log" 2>&1
  rc=$?
  set -e
  echo "{\"returncode\": $rc, \"wall_s\": $(( $(date +%s) - start ))}" >"$LOGS/run.json"
  python3 "$REPO/skill/scripts/slime_log_summary.py" "$LOGS/slime-run.log" >"$LOGS/summary.txt" 2>&1 || true
  python3 "$REPO/skill/scripts/slime_log_summary.py" "$LOGS/slime-run.log" --json >"$LOGS/summary.json" 2>&1 || true
  cat "$LOGS/run.json" "$LOGS/summary.txt"
  tail -n 30 "$LOGS/slime-run.log"
  ;;
smoke | bad-hook)
  # --force: this machine's set has no TransformerEngine (prereqs FAIL on it; see bench/README.md)
  envs=(--force --env NUM_GPUS=1 --env "HF_DIR=$HF_DIR" --env "TRAIN_DATA=$TRAIN_DATA" --env "SLIME_DIR=$SLIME_DIR"
        --env "MEGATRON_DIR=$MEGATRON_DIR")
  if [ "$MODE" = smoke ]; then
    extra=$EXTRA_ARGS; more=()
  else  # the seeded failure: a reward hook whose module does not exist
    extra="$EXTRA_ARGS --custom-rm-path no_such_module.reward"; more=(--rollouts 1 --timeout 240)
  fi
  set +e
  # Megatron-LM and the spec reach train.py through the template's runtime env (PYTHONPATH=$MEGATRON_DIR)
  slime-check smoke "$TEMPLATE" --with slime --slime-dir "$SLIME_DIR" --out "$WORK/$MODE" \
    "${envs[@]}" --env "EXTRA_ARGS=$extra" "${more[@]}" --json >"$LOGS/$MODE.json" 2>"$LOGS/$MODE.err"
  echo "slime-check smoke ($MODE) exit $?"
  set -e
  cp "$WORK/$MODE/smoke.log" "$LOGS/$MODE-run.log" 2>/dev/null || true
  tail -n 20 "$LOGS/$MODE-run.log" 2>/dev/null || true
  ps -eo pid,ppid,args | grep -E 'ray::|raylet|gcs_server|sglang' | grep -v grep >"$LOGS/left-after-$MODE.txt" || true
  echo "processes left after smoke ($MODE): $(wc -l <"$LOGS/left-after-$MODE.txt")"
  ;;
*) echo "slime_one_gpu.sh: MODE is template, smoke or bad-hook, not $MODE" >&2; exit 2 ;;
esac
