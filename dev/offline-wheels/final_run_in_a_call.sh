#!/usr/bin/env bash
# bench/gpu/final_run.sh's jobs inside one device call that is cut off at a fixed time (10 minutes on
# the machine the benches were measured on), where whatever runs at the cut is lost:
#
#   bash dev/offline-wheels/final_run_in_a_call.sh g1          # then g2, g3, "e1 e2 e3", ... one call each
#
# A job starts only when the call has its usual duration left (CALL_S, default 585 s, counted from this
# script's start; the durations below are 2026-12-04's on one H200, rounded up) and runs under
# `timeout` for what is left; otherwise it is skipped, and $OUT/final_run.log says so. The machine's
# first SGLang start compiles flashinfer's kernels (about 3 more minutes): give the first e or g job a
# call of its own, or pair it with a t job only. Last, the log gets the size of the kernels that start
# compiled, to say whether kernel_cache.sh can carry them to the next machine.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
FINAL_RUN=$REPO/bench/gpu/final_run.sh
CALL_S=${CALL_S:-585}
started=$SECONDS
if [ -z "${OUT:-}" ] || [ ! -d "$OUT" ]; then
  echo "final_run_in_a_call.sh: \$OUT must be a folder (the device call's output folder) for the JSON and the log" >&2
  exit 2
fi

expected_s() {  # a job's usual duration on a machine whose first SGLang start is done
  case $1 in
    e[0-9]*) echo 130 ;; t[0-9]*) echo 70 ;; g[0-9]*) echo 330 ;; tests) echo 300 ;; http) echo 60 ;;
    xbatch) echo 220 ;; xtok4|xnotok|xnolog|xgc) echo 130 ;;
  esac
}
for job in "$@"; do
  if [ -z "$(expected_s "$job")" ]; then
    echo "final_run_in_a_call.sh: unknown job '$job'; jobs are eN (rollout), tN (training), gN (GRPO step)," \
         "tests, http, xbatch, xtok4, xnotok, xnolog, xgc" >&2
    exit 2
  fi
done

for job in "$@"; do
  need=$(expected_s "$job")
  left=$((CALL_S - (SECONDS - started)))
  if [ "$left" -lt "$need" ]; then
    echo "$job skipped: ${left} s left in this call, it takes about ${need} s" | tee -a "$OUT/final_run.log"
    continue
  fi
  timeout "$left" bash "$FINAL_RUN" "$job"
  rc=$?
  [ "$rc" -ne 124 ] || echo "$job stopped at the call's end (${left} s)" >>"$OUT/final_run.log"
done
# flashinfer's JIT and triton keep the kernels compiled on the machine's first SGLang start here
{ echo "compiled-kernel caches:"
  du -sh "${FLASHINFER_WORKSPACE_BASE:-$HOME}/.cache/flashinfer" "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" 2>&1; } \
  >>"$OUT/final_run.log"
exit 0
