#!/usr/bin/env bash
# Wheels for `python bench/grpo_step.py --gpu` on an offline GPU machine whose Python 3.12 already has
# torch 2.11.0 (CUDA), triton, transformers 5.17, tokenizers, accelerate, aiohttp, pandas, pyarrow,
# psutil, pyyaml, rich, click, matplotlib and the other common packages, but no network. Run it where
# PyPI is reachable; it writes cp312 manylinux wheels into groups of at most GROUP_MIB (default 56) MiB:
#
#   OUT/gpu1, OUT/gpu2, ...   each small enough to travel in one call to a machine that takes 64 MiB
#                             a call (the repository's own files ride along, about 2 MiB)
#
# What goes in:
#   - the slim SGLang 0.5.15.post1 set of bench/gpu/build_sglang_wheelset.sh (52 MiB; it brings
#     transformers 5.12.1 + tokenizers 0.22.2, SGLang's pins: 5.17 breaks SGLang's start-up);
#   - ray 2.60.0 without ray/jars (the Java workers' 31 MiB jar) and the dashboard's web client
#     build (this package starts Ray with include_dashboard=False): 79 MB -> about 46 MiB;
#   - sglang-router 0.3.2, megatron-core 0.16.1;
#   - trl 1.16.0 with what it needs beyond the machine's packages: datasets 5.2.0, multiprocess
#     0.70.19 (dill comes with the SGLang set), tzdata.
# slime-ref itself needs no wheel: put reference_impl/ on PYTHONPATH.
#
# On the GPU machine, one group per call, into one target directory that stays between calls:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target .whl/site .whl/gpuN/*.whl
# then run with PYTHONPATH=.whl/site:reference_impl (README.md beside this file has the sequence).
#
# Usage: dev/offline-wheels/make_wheels.sh [OUT_DIR]   (default .whl)
set -euo pipefail

OUT=${1:-.whl}
GROUP_MIB=${GROUP_MIB:-56}
GPU=$(cd "$(dirname "$0")/../../bench/gpu" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/all"

source "$GPU/common.sh"

echo "building the slim SGLang set ..."
bash "$GPU/build_sglang_wheelset.sh" "$WORK/sglang" >/dev/null
cp "$WORK"/sglang/*.whl "$WORK/all/"   # not $WORK/sglang/test: the GPU machine has pytest

echo "downloading ray, sglang-router, megatron-core, trl and its missing dependencies ..."
download "$WORK/big" ray==2.60.0
download "$WORK/all" sglang-router==0.3.2 megatron-core==0.16.1 trl==1.16.0 datasets==5.2.0 \
  multiprocess==0.70.19 tzdata==2026.6

echo "slimming ray ..."
ray_wheel=$(ls "$WORK"/big/ray-2.60.0-*.whl)
wheeltools repack "$ray_wheel" "$WORK/all/$(basename "$ray_wheel")" \
  'ray/jars/*' 'ray/dashboard/client/build/*'

echo "grouping into $OUT/gpu* (at most $GROUP_MIB MiB each) ..."
wheeltools group "$WORK/all" "$OUT" gpu "$GROUP_MIB"
