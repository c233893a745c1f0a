"""The memory-bound limit of batched decode: the most generated tokens/s a GPU's memory bandwidth
allows a model's shape, next to a measured rate. Prints JSON.

Decode is bound by memory, not by FLOPs: each step of a batch of B sequences reads every weight once
and the K and V of every token each sequence holds so far, and with log-probs (``return_logprob``)
the logits are written and read again in fp32. A step cannot take less than its bytes divided by the
bandwidth. For prompts of P tokens and N new tokens each:

    kv_bytes_per_token = 2 (K, V) * layers * kv_heads * head_dim * dtype_bytes
    bytes(t)           = weight_bytes + B * (P + t) * kv_bytes_per_token + B * vocab * 8   (t = 0 .. N-1)
    limit              = B * N / (sum over t of bytes(t) / bandwidth)

Prefill (compute-bound, P tokens per sequence) and the scheduler's host time are left out, so the
limit is an upper bound no engine reaches; the fraction of it a measured rate reaches says how much
an attention kernel or a scheduler can still win.

    python bench/decode_roofline.py                                  # 512 x 512, Qwen3-0.6B, H200
    python bench/decode_roofline.py --measured 40200 --measured 55000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shaped_model import SHAPES  # noqa: E402

LOGITS_BYTES_PER_ENTRY = 8  # fp32 logits written once and read once (log-softmax and sampling)


def weight_count(cfg: dict) -> int:
    """Parameters of a Qwen2/Qwen3-style decoder (biases of Qwen2's q/k/v included, tied embedding once)."""
    h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    attention = h * q + 2 * h * kv + q * h
    if "head_dim" not in cfg:  # Qwen2: q/k/v biases, no q/k norms
        attention += q + 2 * kv
    else:  # Qwen3: RMSNorm on q and k per head
        attention += 2 * head_dim
    per_layer = attention + 3 * h * cfg["intermediate_size"] + 2 * h  # MLP (gate, up, down), two RMSNorms
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings + h  # + the final norm


def roofline(cfg: dict, batch: int, prompt_tokens: int, new_tokens: int, bandwidth_tbps: float,
             dtype_bytes: int = 2, logprobs: bool = True) -> dict:
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * dtype_bytes
    weights = weight_count(cfg) * dtype_bytes
    # The embedding table is read as the LM head (B rows of it as the lookup): counted once in weights.
    logits = batch * cfg["vocab_size"] * LOGITS_BYTES_PER_ENTRY if logprobs else 0
    kv_tokens = batch * (new_tokens * prompt_tokens + new_tokens * (new_tokens - 1) // 2)  # sum over t of B*(P+t)
    total = new_tokens * (weights + logits) + kv_tokens * kv_per_token
    seconds = total / (bandwidth_tbps * 1e12)
    return {
        "kv_bytes_per_token": kv_per_token,
        "weight_bytes": weights,
        "logits_bytes_per_step": logits,
        "mean_kv_bytes_per_step": kv_tokens * kv_per_token / new_tokens,
        "mean_step_ms": seconds / new_tokens * 1e3,
        "limit_tokens_per_s": batch * new_tokens / seconds,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6B", help="the model's shape (bf16)")
    p.add_argument("--batch", type=int, default=512, help="sequences decoding together (64 prompts x 8)")
    p.add_argument("--prompt-tokens", type=int, default=13, help="prompt length (grpo_step.py --gpu's: 13)")
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--bandwidth-tbps", type=float, default=4.8, help="memory bandwidth, TB/s (H200: 4.8)")
    p.add_argument("--no-logprobs", action="store_true", help="leave the fp32 logits traffic out")
    p.add_argument("--measured", type=float, action="append", default=[],
                   help="a measured generated tok/s to set against the limit (repeatable)")
    a = p.parse_args(argv)
    for name in ("batch", "prompt_tokens", "new_tokens", "bandwidth_tbps"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    cfg = SHAPES[a.shape][2]
    result = {"bench": "decode_roofline", "shape": a.shape, "batch": a.batch, "prompt_tokens": a.prompt_tokens,
              "new_tokens": a.new_tokens, "bandwidth_tbps": a.bandwidth_tbps, "logprobs": not a.no_logprobs,
              "parameters": weight_count(cfg),
              **roofline(cfg, a.batch, a.prompt_tokens, a.new_tokens, a.bandwidth_tbps, logprobs=not a.no_logprobs)}
    result["measured"] = [{"tokens_per_s": m, "fraction_of_limit": round(m / result["limit_tokens_per_s"], 3)}
                          for m in a.measured]
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
