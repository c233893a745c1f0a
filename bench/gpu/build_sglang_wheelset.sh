#!/usr/bin/env bash
# Build the slim offline wheel set (about 62 MiB, 38 wheels) that starts real SGLang 0.5.15.post1 on
# a CUDA 13 GPU machine with no network, whose Python 3.12 already has torch 2.11.0 (SGLang's pin),
# triton, aiohttp, numpy and the other common packages. Run it where PyPI is reachable (about 650 MB
# of downloads), carry the folder over, then on the GPU machine:
#
#   python -m pip install --no-index --no-deps --target /tmp/sglang-site OUT/*.whl
#   export PYTHONPATH=/tmp/sglang-site:$PYTHONPATH
#   python -m sglang.launch_server --model-path DIR --attention-backend flashinfer \
#       --sampling-backend pytorch --grammar-backend none --skip-server-warmup ...
#
# (or --attention-backend triton, which compiles nothing at start-up).
#
# What makes it small (measured on an H200, see the repository's notes on offline SGLang):
#   sglang-kernel 0.4.4   615 MB -> ~16 MiB: without flash_ops (FA3), flashmla_ops and sm100/;
#                         the flashinfer and triton attention backends never load them.
#   flashinfer 0.6.12     13 MiB, whole: its attention kernels are compiled on the server's first
#                         start against the CUDA headers it vendors (CCCL, CUTLASS, spdlog); without
#                         them nvcc 13.0 takes the toolkit's newer CCCL and the decode kernel fails
#                         to compile. SGLang's sampler imports flashinfer whatever the backend.
#   sglang 0.5.15.post1   12 MiB -> ~8 MiB: without multimodal_gen/ and the gRPC extension.
#   transformers 5.12.1 + tokenizers 0.22.2 (SGLang's pin; 5.17 breaks start-up with
#   "'qwen3_asr' is already used by a Transformers config").
# Each repacked wheel keeps its name and version; its RECORD lists exactly the files it still has.
# Not included (not needed for Qwen3 / Llama-style models): flashinfer-cubin, flash-attn-4,
# quack-kernels, nvidia-cutlass-dsl, torchao, xgrammar, llguidance, torch_memory_saver (the last
# one is what --enable-memory-saver and the release/resume-memory routes need).
#
# Usage: bench/gpu/build_sglang_wheelset.sh [OUT_DIR]   (default .whl)
#   OUT_DIR/test/ also gets pytest and pytest-timeout, for machines that lack them.
set -euo pipefail

OUT=${1:-.whl}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT" "$OUT/test"

source "$(dirname "$0")/common.sh"

PLAIN=(
  annotated-types==0.8.0 apache-tvm-ffi==0.1.11 cffi==2.1.1 compressed-tensors==0.20.1 dill==0.4.1
  distro==1.9.0 fastapi==0.165.0 gguf==0.19.0 ipython==9.18.1 jiter==0.19.0 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 loguru==0.7.3 msgspec==0.23.0 openai==2.6.1
  opentelemetry-api==1.45.2 orjson==3.13.0 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1
  pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5 python-multipart==0.0.34 pyzmq==27.3.0
  referencing==0.37.0 rpds-py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1 soundfile==0.13.1
  starlette==1.10.0 traitlets==5.16.1 typing-inspection==0.4.5 uvicorn==0.54.0
  transformers==5.12.1 tokenizers==0.22.2
)
echo "downloading ${#PLAIN[@]} plain wheels ..."
download "$OUT" "${PLAIN[@]}"

echo "downloading sglang, sglang-kernel and flashinfer (about 640 MB) ..."
download "$WORK" sglang==0.5.15.post1 sglang-kernel==0.4.4 flashinfer-python==0.6.12

repack() { wheeltools repack "$@"; }
one() { ls "$WORK"/$1 | head -n 1; }
repack "$(one 'sglang_kernel-0.4.4-*.whl')" "$OUT/$(basename "$(one 'sglang_kernel-0.4.4-*.whl')")" \
  'sgl_kernel/flash_ops*.so' 'sgl_kernel/flashmla_ops*.so' 'sgl_kernel/sm100/*'
cp "$(one 'flashinfer_python-0.6.12-*.whl')" "$OUT/"
repack "$(one 'sglang-0.5.15.post1-*.whl')" "$OUT/$(basename "$(one 'sglang-0.5.15.post1-*.whl')")" \
  'sglang/multimodal_gen/*' 'sglang/srt/grpc/_core*.so'

echo "downloading pytest into $OUT/test ..."
download "$OUT/test" pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pytest-timeout==2.4.0 pygments==2.21.0

count=$(ls "$OUT"/*.whl | wc -l)
echo "$OUT: $count wheels, $(du -sh --apparent-size "$OUT" | cut -f1) in all (test tools included)"
