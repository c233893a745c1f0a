#!/usr/bin/env bash
# SGLang's FA3 attention (`--sglang-attention-backend fa3`, SGLang's default on Hopper) for the offline
# GPU machine. The slim set of bench/gpu/build_sglang_wheelset.sh leaves sglang-kernel's FA3 library
# out for its size: sgl_kernel/flash_ops.abi3.so is 1.68 GB, 551 MiB compressed, more than one device
# call takes.
# This writes sglang-kernel 0.4.4 with FA3 (without the Blackwell sm100/ build and FlashMLA, which an
# H200 running Qwen3 never loads; about 567 MiB) as pieces of at most GROUP_MIB (default 56) MiB:
#
#   OUT/fa3-1 .. OUT/fa3-N    one piece each, with the manifest (sha256 of every piece and the whole)
#
# On the GPU machine, after the groups of make_wheels.sh, one piece per call, back to back while the
# machine is warm; the call with the last piece joins, checks and installs the wheel over the slim one:
#
#   bash dev/offline-wheels/install_pieces.sh .whl/fa3-N        # N = 1..N, any order
#
# Usage: dev/offline-wheels/make_fa3_pieces.sh [OUT_DIR]   (default .whl)
set -euo pipefail

OUT=${1:-.whl}
GROUP_MIB=${GROUP_MIB:-56}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../../bench/gpu/common.sh"

echo "downloading sglang-kernel 0.4.4 (615 MB) ..."
download "$WORK/dl" sglang-kernel==0.4.4
wheel=$(ls "$WORK"/dl/sglang_kernel-0.4.4-*.whl)
mkdir -p "$WORK/fa3" "$OUT"
wheeltools repack "$wheel" "$WORK/fa3/$(basename "$wheel")" 'sgl_kernel/flashmla_ops*.so' 'sgl_kernel/sm100/*'
"$PYTHON" "$HERE/pieces.py" split "$WORK/fa3/$(basename "$wheel")" "$OUT" fa3- "$GROUP_MIB"
