#!/usr/bin/env bash
# The final run for the GPU speed targets: each JOB is one bench process, its JSON written to
# $OUT/JOB.json and a line of what happened to $OUT/final_run.log. Run the jobs in separate processes,
# three of each, orders alternated (t1 t2 t3: ours first, HF first, ours first).
#
#   bash bench/gpu/final_run.sh e1 e2 e3     # eN     engine_throughput at 512 x 512 (the rollout), 64
#                                            #        requests of 8 prompts, as the GRPO rollout sends them
#   bash bench/gpu/final_run.sh t1 t2 t3     # tN     train_throughput, ours first for odd N, HF first for even
#   bash bench/gpu/final_run.sh g1 g2 g3     # gN     grpo_step.py --gpu, ours then TRL (GRPO_FLAGS="..."
#                                            #        adds its flags, e.g. "--trl-steps 2": one TRL step
#                                            #        timed, about 30 s less a process)
#   bash bench/gpu/final_run.sh tests        # tests  the GPU tests (pytest -m gpu)
#   bash bench/gpu/final_run.sh http         # http   rollout_http.py on the host's CPUs (no GPU): the HTTP
#                                            #        and JSON share of a round in the rollout manager's
#                                            #        process shape, with Python's garbage-collector
#                                            #        defaults (http.json) and the manager's setting
#                                            #        (http-frozen.json)
#   bash bench/gpu/final_run.sh xbatch       # the rollout's idle edges (not part of the final run):
#                                            #   xbatch  the eN bench with 1, 8, 64 and 512 prompts a request
#                                            #   and at one prompt a request:
#                                            #   xtok4   SGLang with 4 tokenizer workers
#                                            #   xnotok  SGLang with --skip-tokenizer-init
#                                            #   xnolog  SGLang's HTTP log at warning
#                                            #   xgc     SGLang's /freeze_gc after warm-up
#
# On one H200 a rollout process takes about 2 minutes, a training one 1, a GRPO one 5, plus about 3
# minutes for the machine's first SGLang start (flashinfer compiles its kernels).
# Afterwards: python bench/speed_targets.py --train t*.json --rollout e*.json --grpo g*.json
set -uo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "${OUT:-}" ] || [ ! -d "$OUT" ]; then
  echo "final_run.sh: \$OUT must be a folder for the JSON and the log" >&2
  exit 2
fi
export PYTHONPATH=$REPO/reference_impl:$REPO/bench${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$REPO"

for job in "$@"; do
  case $job in
    e[0-9]*|t[0-9]*|g[0-9]*|tests|http|xbatch|xtok4|xnotok|xnolog|xgc) ;;
    *) echo "final_run.sh: unknown job '$job'; jobs are eN (rollout), tN (training), gN (GRPO step), tests, http," \
            "xbatch, xtok4, xnotok, xnolog, xgc" >&2
       exit 2 ;;
  esac
done

rollout() {  # the rollout bench (eN's), with the job's own flags after it
  python3 bench/engine_throughput.py --engine sglang --concurrency 512 --prompt-tokens 13 \
    --new-tokens 512 --skip-hf --logprob-only --gpu-util "$@" --work-dir "/tmp/final-run-$job" \
    >"$OUT/$job.json" 2>"/tmp/final-run-$job.err"
}
for job in "$@"; do
  t0=$SECONDS
  case $job in
    e[0-9]*) rollout --prompts-per-request 8 ;;
    t[0-9]*) order=ours,hf_sdpa; [ $(( ${job#t} % 2 )) -eq 0 ] && order=hf_sdpa,ours
        python3 bench/train_throughput.py --variants "$order" --out "$OUT/$job.json" \
          >/dev/null 2>"/tmp/final-run-$job.err" ;;
    g[0-9]*) python3 bench/grpo_step.py --gpu ${GRPO_FLAGS:-} --workdir "/tmp/final-run-$job" \
          >"$OUT/$job.json" 2>"/tmp/final-run-$job.err" ;;
    tests) python3 -m pytest -q -m gpu -p no:cacheprovider tests/slime_ref/test_megatron_gpu.py \
             tests/slime_ref/test_sglang_gpu.py >"/tmp/final-run-$job.err" 2>&1 ;;
    xbatch) rollout --prompts-per-request 1 8 64 512 ;;
    # --sglang-flags=...: argparse would take a lone "--sglang-..." after --sglang-flags for an option
    xtok4) rollout "--sglang-flags=--sglang-tokenizer-worker-num 4" ;;
    xnotok) rollout "--sglang-flags=--sglang-skip-tokenizer-init" ;;
    xnolog) rollout "--sglang-flags=--sglang-log-level-http warning" ;;
    xgc) rollout --freeze-gc ;;
    http) python3 bench/rollout_http.py --prompts-per-request 1 8 --rollout-imports \
            >"$OUT/http.json" 2>"/tmp/final-run-$job.err" &&
          python3 bench/rollout_http.py --prompts-per-request 1 8 --rollout-imports --freeze-gc \
            >"$OUT/http-frozen.json" 2>>"/tmp/final-run-$job.err" ;;
  esac
  rc=$?
  { echo "$job rc=$rc $((SECONDS - t0)) s, done at $(date +%T)"
    grep -v "Health check" "/tmp/final-run-$job.err" | grep -v '^\s*$' | tail -8; } >>"$OUT/final_run.log"
done
if command -v nvidia-smi >/dev/null; then  # the clocks and temperature the processes ended at
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >>"$OUT/final_run.log" 2>&1
fi
exit 0
