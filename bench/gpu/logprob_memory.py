"""What slime's log-prob path holds on the GPU for one packed micro-batch, per logit: the output layer's bf16
logits, Megatron's Float16Module cast to fp32, then slime's own ``calculate_log_probs_and_entropy`` (imported
from slime's source), forward only (the reference and old-actor passes, under ``torch.no_grad``) or forward and
backward (the training step: entropy computed for its metric, its gradient only with ``--entropy-coef``).
Prints JSON beside ``slime-check plan``'s count.

    tar -xzf src-slime-v0.3.1.tar.gz -C /tmp
    PYTHONPATH=/tmp/slime:reference_impl python bench/gpu/logprob_memory.py --tokens 7238 8192 --out $OUT

Two figures a case, both above what was allocated before the pass: torch's peak allocated memory (the
tensors alive at once) and its peak reserved memory (what the caching allocator holds from the driver, which
is what NVML and the memory smoke see). A freed block is kept reserved and reused only for a request that fits
in it, so the bf16 logits freed after their fp32 cast are still reserved when the larger fp32 buffers come.
Each case runs twice on one allocator, as the reference and old-actor passes do, and reports the larger.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

# Qwen3 shapes (hidden, vocabulary): what sets the output layer's logits
SHAPES = {"qwen3-0.6B": (1024, 151936), "qwen3-1.7B": (2048, 151936), "qwen3-4B": (2560, 151936)}
GIB = 1 << 30


def slime_log_probs():
    try:
        from slime.utils.ppo_utils import calculate_log_probs_and_entropy
    except ImportError as e:
        sys.exit(f"logprob_memory.py: slime's source is not importable ({e}); put slime's checkout on PYTHONPATH")
    return calculate_log_probs_and_entropy


def one_pass(log_probs_fn, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, train: bool,
             temperature: float, chunk: int, entropy_coef: float) -> None:
    with torch.set_grad_enabled(train):
        # the output layer's GEMM in bf16, [s, 1, V] -> [1, s, V] (a view for one packed sequence), and the fp32
        # cast Float16Module makes on the last stage; the bf16 tensor is garbage once the cast returns
        output = F.linear(hidden, weight).transpose(0, 1).contiguous().float()
        # Megatron's forward step holds the model's output while it calls the loss function on it
        logits = output.squeeze(0)
        if temperature != 1.0:
            logits = logits / temperature  # slime's get_log_probs_and_entropy: a new [s, V] buffer
        log_prob, entropy = log_probs_fn(logits.contiguous(), targets, None, with_entropy=train, chunk_size=chunk,
                                         with_entropy_grad=train and entropy_coef != 0)
        del logits, output
        if train:
            loss = -log_prob.mean() - (entropy_coef * entropy.mean() if entropy_coef else 0)
            loss.backward()


def measure(fn, shape: str, tokens: int, train: bool, temperature: float, chunk: int, entropy_coef: float) -> dict:
    h, vocab = SHAPES[shape]
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    hidden = torch.randn(tokens, 1, h, device="cuda", dtype=torch.bfloat16, requires_grad=train)
    weight = (torch.randn(vocab, h, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_(False)
    targets = torch.randint(0, vocab, (tokens,), device="cuda")
    torch.cuda.synchronize()
    base_alloc, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    passes = []
    for _ in range(2):
        torch.cuda.reset_peak_memory_stats()
        one_pass(fn, hidden, weight, targets, train=train, temperature=temperature, chunk=chunk,
                 entropy_coef=entropy_coef)
        torch.cuda.synchronize()
        passes.append((torch.cuda.max_memory_allocated() - base_alloc,
                       torch.cuda.max_memory_reserved() - base_reserved))
        hidden.grad = None
    logits = tokens * vocab
    allocated, reserved = max(p[0] for p in passes), max(p[1] for p in passes)
    out = {"shape": shape, "tokens": tokens, "vocab": vocab, "mode": "train" if train else "forward_only",
           "temperature": temperature, "log_probs_chunk_size": chunk, "entropy_coef": entropy_coef,
           "allocated_peak_gib": allocated / GIB, "reserved_peak_gib": reserved / GIB,
           "allocated_bytes_per_logit": allocated / logits, "reserved_bytes_per_logit": reserved / logits,
           "passes_bytes_per_logit": [[a / logits, r / logits] for a, r in passes]}
    del hidden, weight, targets
    return out


def plan_count(run: dict) -> float | None:
    try:
        from slime_check import plan as P
        from slime_check import plan_job as J
    except ImportError:
        return None
    train = J.Train(longest=run["tokens"], temperature=run["temperature"], logprob_chunk=run["log_probs_chunk_size"],
                    entropy_coef=run["entropy_coef"])
    return P.logits_bytes_per_element(train, run["mode"] == "forward_only", run["tokens"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["qwen3-1.7B"])
    p.add_argument("--tokens", type=int, nargs="+", default=[8192], help="tokens in the packed micro-batch")
    p.add_argument("--mode", choices=["forward_only", "train"], nargs="+", default=["forward_only", "train"])
    p.add_argument("--temperature", type=float, nargs="+", default=[1.0], help="--rollout-temperature")
    p.add_argument("--chunk", type=int, nargs="+", default=[-1], help="--log-probs-chunk-size (-1: whole)")
    p.add_argument("--entropy-coef", type=float, default=0.0, help="--entropy-coef (training: its gradient)")
    p.add_argument("--out", type=Path, default=None, help="folder for logprob-memory.json")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("logprob_memory.py: needs a CUDA GPU (the caching allocator is what it measures)")
    fn = slime_log_probs()
    runs = []
    for shape in a.shape:
        for tokens in a.tokens:
            for mode in a.mode:
                for temperature in a.temperature:
                    for chunk in a.chunk:
                        r = measure(fn, shape, tokens, mode == "train", temperature, chunk, a.entropy_coef)
                        r["plan_bytes_per_logit"] = plan_count(r)
                        r["gpu"], r["torch"] = torch.cuda.get_device_name(), torch.__version__
                        runs.append(r)
                        print(f"{shape} {tokens} {mode} T={temperature} chunk={chunk}: allocated "
                              f"{r['allocated_bytes_per_logit']:.2f} B/logit, reserved "
                              f"{r['reserved_bytes_per_logit']:.2f}, plan {r['plan_bytes_per_logit']}",
                              file=sys.stderr)
    text = json.dumps(runs, indent=1)
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "logprob-memory.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
