#!/usr/bin/env bash
# The offline set for real slime v0.3.1 on one GPU machine with no network, whose Python 3.12 already
# has torch 2.11.0 (CUDA 13), triton, numpy, aiohttp, psutil, requests, pyyaml, tensorboard,
# prometheus-client, grpcio, protobuf, six and the other common packages. Run it where PyPI is
# reachable, with your own git clones of slime and Megatron-LM (any checkout: the tag and the commit
# are read from their history):
#
#   git clone https://github.com/THUDM/slime.git ~/src/slime
#   git clone https://github.com/NVIDIA/Megatron-LM.git ~/src/Megatron-LM
#   bash bench/gpu/make_slime_set.sh ~/src/slime ~/src/Megatron-LM .whl
#
# It writes OUT/slime1, OUT/slime2, ... of at most GROUP_MIB (default 56) MiB each, one device call
# apiece, installed on the GPU machine by bench/gpu/install_slime_set.sh. What goes in, next to what
# slime's docker/Dockerfile (v0.3.1) builds:
#   - slime v0.3.1 (tag, a6272da), its source without docs/ and imgs/   as in the image: ~/slime
#   - Megatron-LM 1dcf0da's megatron/ package with slime's                 as in the image
#     docker/patch/v0.5.15.post1/megatron.patch applied
#   - SGLang 0.5.15.post1: bench/gpu/build_sglang_wheelset.sh's slim set, its sglang wheel with
#     slime's four SGLang patches of the same folder applied, in the Dockerfile's order, and flashinfer
#     without its vendored CUDA headers (triton attention compiles nothing)
#   - sglang-router 0.3.2 from PyPI                     the image: a slime build of 0.3.2 (GitHub)
#   - ray 2.60.0 (without its Java jar and the web client's source maps) and what `ray start` needs for
#     the dashboard and `ray job submit` (ray[default]'s imports; not py-spy, smart_open, virtualenv)
#   - slime's requirements that its training path imports: torch_memory_saver 0.0.10 (PyPI; the
#     image: a GitHub build), wandb 0.27.2 (protobuf 4 to 7) with its needs, pylatexenc 2.11
#   - numpy 1.26.4 and scipy 1.17.1, the image's pins: slime asserts NumPy 1.x when its Megatron
#     actor starts ("Megatron does not support numpy 2.x"), and SciPy 1.18+ needs NumPy 2
#   - megatron-core 0.16.1, for slime-ref beside slime (bench/vs_slime.py); installed apart from
#     slime's Megatron-LM so that each trainer imports its own
# Not in the set, and why (bench/README.md lists every difference from slime's image):
#   TransformerEngine, flash-attn 2/3, apex: CUDA builds of several hundred MiB that need compiling
#   against this torch; runs use slime's own --transformer-impl local path. DeepEP, DeepGEMM, FLA,
#   FlashQLA, tilelang, int4_qat, nvidia-modelopt: MoE, linear attention and quantisation only.
#   omegaconf (--megatron-config-path, YAML SGLang configs), datasets, anthropic, openai-agents, mcp,
#   e2b, memray, qwen_vl_utils, ring_flash_attn, blobfile, blake3, zstandard: not imported on a text
#   GRPO run's path (each is imported inside the function that needs it).
#
# Usage: bench/gpu/make_slime_set.sh SLIME_GIT MEGATRON_GIT [OUT_DIR]   (default OUT_DIR .whl)
set -euo pipefail

if [ $# -lt 2 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
SLIME_GIT=$1
MEGATRON_GIT=$2
OUT=${3:-.whl}
GROUP_MIB=${GROUP_MIB:-56}
SLIME_TAG=v0.3.1
SLIME_COMMIT=a6272da0d4f3d0a08520c99a2f3b4f6c887960dc
MEGATRON_COMMIT=1dcf0dafa884ad52ffb243625717a3471643e087
PATCHES=docker/patch/v0.5.15.post1
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/all" "$WORK/patches" "$OUT"

commit_of() {  # commit_of GIT REV: the full commit id, or exit 2 naming what is missing
  git -C "$1" rev-parse --verify --quiet "$2^{commit}" || {
    echo "make_slime_set.sh: $1 has no $2 (git -C $1 fetch --tags origin, then run again)" >&2
    exit 2
  }
}
[ "$(commit_of "$SLIME_GIT" "$SLIME_TAG")" = "$SLIME_COMMIT" ] || {
  echo "make_slime_set.sh: $SLIME_GIT's $SLIME_TAG is not $SLIME_COMMIT, slime's release commit" >&2
  exit 2
}
commit_of "$MEGATRON_GIT" "$MEGATRON_COMMIT" >/dev/null

echo "slime $SLIME_TAG: source ..."
mkdir -p "$WORK/slime"
git -C "$SLIME_GIT" archive "$SLIME_COMMIT" | tar -x -C "$WORK/slime"
rm -rf "$WORK/slime/docs" "$WORK/slime/imgs"
for p in megatron.patch sglang.patch sglang-top_p.patch sglang-release_hicache.patch sglang-pull_weights.patch; do
  cp "$WORK/slime/$PATCHES/$p" "$WORK/patches/$p"
done
tar -C "$WORK" -czf "$WORK/all/src-slime-$SLIME_TAG.tar.gz" slime

echo "Megatron-LM ${MEGATRON_COMMIT:0:7} with slime's megatron.patch ..."
mkdir -p "$WORK/Megatron-LM"
git -C "$MEGATRON_GIT" archive "$MEGATRON_COMMIT" megatron | tar -x -C "$WORK/Megatron-LM"
(cd "$WORK/Megatron-LM" && git apply "$WORK/patches/megatron.patch") || {
  echo "make_slime_set.sh: slime's $PATCHES/megatron.patch does not apply to Megatron-LM $MEGATRON_COMMIT" >&2
  exit 1
}
tar -C "$WORK" -czf "$WORK/all/src-megatron-lm-${MEGATRON_COMMIT:0:7}.tar.gz" Megatron-LM

echo "SGLang 0.5.15.post1 (slim) with slime's four SGLang patches ..."
bash "$HERE/build_sglang_wheelset.sh" "$WORK/sglang" >/dev/null
sglang_wheel=$(ls "$WORK"/sglang/sglang-0.5.15.post1-*.whl)
mkdir -p "$WORK/sglang/patched"
# the patches are written against SGLang's repository (python/sglang/...); the wheel holds sglang/...
wheeltools patch "$sglang_wheel" "$WORK/sglang/patched/$(basename "$sglang_wheel")" 2 \
  "$WORK/patches/sglang.patch" "$WORK/patches/sglang-top_p.patch" \
  "$WORK/patches/sglang-release_hicache.patch" "$WORK/patches/sglang-pull_weights.patch"
mv "$WORK/sglang/patched/$(basename "$sglang_wheel")" "$sglang_wheel"
# slime's runs here use triton attention (bench/gpu/slime_one_gpu.sh), which compiles nothing: flashinfer
# goes without the CUDA headers its own kernels compile against (13 MiB -> 4 MiB), as the set was measured
flashinfer_wheel=$(ls "$WORK"/sglang/flashinfer_python-0.6.12-*.whl)
wheeltools repack "$flashinfer_wheel" "$WORK/sglang/patched/$(basename "$flashinfer_wheel")" \
  'flashinfer/data/cutlass/*' 'flashinfer/data/cccl/*' 'flashinfer/data/spdlog/*'
mv "$WORK/sglang/patched/$(basename "$flashinfer_wheel")" "$flashinfer_wheel"
cp "$WORK"/sglang/*.whl "$WORK/all/"   # not $WORK/sglang/test: the GPU machine has pytest

echo "ray 2.60.0 (slim), its dashboard's imports, sglang-router and slime's requirements ..."
download "$WORK/big" ray==2.60.0
wheeltools repack "$(ls "$WORK"/big/ray-2.60.0-*.whl)" "$WORK/all/$(basename "$(ls "$WORK"/big/ray-2.60.0-*.whl)")" \
  'ray/jars/*' 'ray/dashboard/client/build/*.map'   # `ray job submit` needs the dashboard and its build/
download "$WORK/all" \
  aiohttp_cors==0.8.1 colorful==0.5.8 opencensus==0.11.4 opencensus-context==0.1.3 googleapis-common-protos==1.76.0 \
  opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2 \
  opentelemetry-exporter-prometheus==0.66b2 \
  sglang-router==0.3.2 torch_memory_saver==0.0.10 pylatexenc==2.11 numpy==1.26.4 scipy==1.17.1 \
  wandb==0.27.2 gitpython==3.1.45 gitdb==4.0.12 smmap==5.0.2 sentry-sdk==2.42.1 platformdirs==4.5.0
download "$WORK/all" megatron-core==0.16.1   # install_slime_set.sh puts it apart, for slime-ref

echo "grouping into $OUT/slime* (at most $GROUP_MIB MiB each) ..."
wheeltools group "$WORK/all" "$OUT" slime "$GROUP_MIB"
