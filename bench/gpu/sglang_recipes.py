"""The SGLang flags the GPU benches and GPU tests start real SGLang with, as slime-ref flags
(``--sglang-*``, passed through to ``python -m sglang.launch_server``)."""

from __future__ import annotations


def sglang_offline_gpu_flags(attention_backend: str = "triton") -> list[str]:
    """Real SGLang 0.5.15.post1 flags known to start on an offline H200 with the slim wheel set
    (bench/gpu/build_sglang_wheelset.sh): triton attention and torch sampling need no FA3 kernels;
    ``fa3`` needs the FA3 library of dev/offline-wheels/make_fa3_pieces.sh."""
    return [
        "--sglang-mem-fraction-static", "0.3", "--sglang-attention-backend", attention_backend,
        "--sglang-sampling-backend", "pytorch", "--sglang-grammar-backend", "none",
    ]


SGLANG_OFFLINE_GPU_FLAGS = sglang_offline_gpu_flags()


def sglang_cuda_graph_flags(enabled: bool = True, max_bs_decode: int = 256) -> list[str]:
    """Decode with CUDA graphs for every batch size up to ``max_bs_decode`` (faster, ~30 s more
    start-up; a decode batch larger than it runs eagerly), or without any graphs."""
    if not enabled:
        return ["--sglang-cuda-graph-backend-decode", "disabled", "--sglang-cuda-graph-backend-prefill", "disabled"]
    return ["--sglang-cuda-graph-backend-prefill", "disabled", "--sglang-cuda-graph-max-bs-decode", str(max_bs_decode)]


SGLANG_CUDA_GRAPH_FLAGS = {True: sglang_cuda_graph_flags(True), False: sglang_cuda_graph_flags(False)}
