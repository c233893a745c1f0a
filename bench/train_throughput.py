"""Training throughput of the Megatron actor vs HF transformers + SDPA, on one GPU; prints JSON.

Model: Qwen3-0.6B shapes (28 layers, hidden 1024, 16 heads, 8 KV heads, head_dim 128, FFN 3072,
vocab 151936, tied embeddings, QK-norm) with random bf16 weights, written once as an HF checkpoint.

- ``ours``: ``MegatronActor.train`` with ``--loss-type sft_loss --bf16``: one optimizer step of
  BATCH packed sequences per call (varlen flash attention, compiled RMSNorm/RoPE/SwiGLU, chunked
  vocab log-probs, megatron's distributed optimizer with fp32 master weights), the actor's real
  training path including packing.
- ``hf_sdpa``: ``Qwen3ForCausalLM(attn_implementation="sdpa")`` in bf16, loss from ``labels``,
  ``torch.optim.AdamW`` on the bf16 parameters (the baseline in ../shared/notes/gpu-baselines.md).
- ``ours_compiled_layers`` (opt-in): ``ours`` with every decoder layer wrapped in torch.compile.

Each step: forward, backward, optimizer. ``--warmup`` steps, then the mean of ``--steps`` steps.
FLOPs per step: 6 * N * tokens + 6 * layers * batch * seq^2 * heads * head_dim (causal attention,
forward and backward); MFU divides TFLOP/s by ``--peak-tflops`` (790: measured dense bf16 on H200).

    python bench/train_throughput.py                     # seq 1024 x batch 8 and 2048 x 4
    python bench/train_throughput.py --variants ours,hf_sdpa,ours_compiled_layers
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

QWEN3_06B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
    tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)


def write_random_checkpoint(out: Path) -> int:
    """Random bf16 Qwen3-0.6B-shaped HF checkpoint in ``out``; returns its parameter count."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_06B)).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


def step_flops(n_params: int, batch: int, seq: int) -> float:
    c = QWEN3_06B
    attention = 6 * c["num_hidden_layers"] * batch * seq**2 * c["num_attention_heads"] * c["head_dim"]
    return 6 * n_params * batch * seq + attention


def timed(step, warmup: int, steps: int) -> tuple[float, float]:
    """(mean seconds per step, peak GiB allocated) over ``steps`` steps after ``warmup``."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps, torch.cuda.max_memory_allocated() / 2**30


def tokens(batch: int, seq: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seq * 1000 + batch)
    return torch.randint(1, QWEN3_06B["vocab_size"], (batch, seq), generator=g)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_ours(model_dir: Path, shapes, warmup: int, steps: int, compile_layers: bool) -> dict:
    from slime_ref.arguments import build_parser, validate_args
    from slime_ref.backends.megatron.actor import MegatronActor
    from slime_ref.backends.megatron.arguments import add_megatron_arguments

    results = {}
    actor = None
    for batch, seq in shapes:
        argv = ["--hf-checkpoint", str(model_dir), "--bf16", "--loss-type", "sft_loss", "--lr", "1e-5",
                "--rollout-batch-size", str(batch), "--n-samples-per-prompt", "1", "--num-rollout", "1000",
                "--global-batch-size", str(batch), "--micro-batch-size", str(batch),
                "--attention-dropout", "0", "--hidden-dropout", "0", "--use-distributed-optimizer"]
        args = validate_args(add_megatron_arguments(build_parser()).parse_args(argv))
        if actor is None:
            actor = MegatronActor(args, rank=0, world_size=1, master_port=free_port())
            if compile_layers:
                for layer in actor.model.module.decoder.layers:
                    layer.compile(dynamic=True)
        actor.args = args
        ids = tokens(batch, seq).tolist()
        data = {"tokens": ids, "response_lengths": [seq - 1] * batch, "loss_masks": [[1] * (seq - 1)] * batch,
                "rewards": [0.0] * batch, "raw_reward": [0.0] * batch, "truncated": [0] * batch,
                "sample_indices": list(range(batch))}
        counter = iter(range(10**6))
        seconds, peak = timed(lambda: actor.train(next(counter), data), warmup, steps)
        results[f"{batch}x{seq}"] = {"step_s": seconds, "peak_gib": peak}
    del actor
    gc.collect()
    torch.cuda.empty_cache()
    return results


def bench_hf(model_dir: Path, shapes, warmup: int, steps: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    results = {}
    for batch, seq in shapes:
        ids = tokens(batch, seq).cuda()

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        seconds, peak = timed(step, warmup, steps)
        results[f"{batch}x{seq}"] = {"step_s": seconds, "peak_gib": peak}
    del model, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="8x1024,4x2048", help="comma-separated BATCHxSEQ")
    parser.add_argument("--variants", default="ours,hf_sdpa", help="ours, hf_sdpa, ours_compiled_layers")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    a = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "needs a CUDA GPU"}))
        sys.exit(2)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    variants = a.variants.split(",")

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "qwen3-0.6b-random"
        n_params = write_random_checkpoint(model_dir)
        raw = {}
        for variant in variants:
            try:
                if variant == "hf_sdpa":
                    raw[variant] = bench_hf(model_dir, shapes, a.warmup, a.steps)
                else:
                    raw[variant] = bench_ours(model_dir, shapes, a.warmup, a.steps,
                                              compile_layers=variant == "ours_compiled_layers")
            except Exception as e:  # report the variant's failure, keep the others
                raw[variant] = {"error": f"{type(e).__name__}: {e}"}

    report = {
        "model": "Qwen3-0.6B shapes, random bf16 weights",
        "parameters": n_params,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "flops_per_step": "6*N*tokens + 6*layers*batch*seq^2*heads*head_dim",
        "peak_tflops": a.peak_tflops,
        "results": {},
    }
    for batch, seq in shapes:
        key = f"{batch}x{seq}"
        row = {}
        for variant, res in raw.items():
            if "error" in res:
                row[variant] = res
                continue
            s = res[key]["step_s"]
            tflops = step_flops(n_params, batch, seq) / s / 1e12
            row[variant] = {"tokens_per_s": round(batch * seq / s), "tflops": round(tflops, 1),
                            "mfu": round(tflops / a.peak_tflops, 4), "step_ms": round(s * 1000, 1),
                            "peak_gib": round(res[key]["peak_gib"], 1)}
        if "tokens_per_s" in row.get("ours", {}) and "tokens_per_s" in row.get("hf_sdpa", {}):
            row["ours_vs_hf_sdpa"] = round(row["ours"]["tokens_per_s"] / row["hf_sdpa"]["tokens_per_s"], 3)
        report["results"][key] = row
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
