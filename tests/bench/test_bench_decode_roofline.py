"""bench/decode_roofline.py: the memory-bound decode limit that rollout speed is judged against."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import decode_roofline  # noqa: E402

TINY = dict(vocab_size=10, hidden_size=4, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=2, tie_word_embeddings=True)


def test_bytes_and_limit_by_hand():
    # per layer: q 4x4, k and v 4x2 each, o 4x4 (48), q/k norms 2+2, MLP 3x4x8 (96), two norms 4+4 -> 156;
    # 2 layers + tied embedding 10x4 + final norm 4 = 356 parameters, 712 bf16 bytes
    assert decode_roofline.weight_count(TINY) == 356
    # 1e-12 TB/s is 1 byte/s, so the seconds are the bytes: batch 2, prompt 3, 2 new tokens
    r = decode_roofline.roofline(TINY, batch=2, prompt_tokens=3, new_tokens=2, bandwidth_tbps=1e-12)
    assert r["kv_bytes_per_token"] == 2 * 2 * 1 * 2 * 2 == 16
    assert r["logits_bytes_per_step"] == 2 * 10 * 8
    # steps t=0, 1 read the K/V of 2*(3+0) and 2*(3+1) tokens: 14 tokens, 224 bytes in all
    total = 2 * (712 + 160) + 14 * 16
    assert r["limit_tokens_per_s"] == pytest.approx(2 * 2 / total, rel=1e-12)
    assert r["mean_step_ms"] == pytest.approx(total / 2 * 1e3, rel=1e-12)
    plain = decode_roofline.roofline(TINY, 2, 3, 2, 1e-12, logprobs=False)
    assert plain["limit_tokens_per_s"] == pytest.approx(4 / (2 * 712 + 224), rel=1e-12)


@pytest.mark.parametrize("shape", ["qwen3-0.6B", "qwen2.5-0.5B"])
def test_parameter_count_is_the_hf_models(shape):
    import torch
    import transformers

    config_name, model_name, dims = decode_roofline.SHAPES[shape]
    with torch.device("meta"):
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(**dims))
    assert decode_roofline.weight_count(dims) == sum(p.numel() for p in model.parameters())


def test_the_cli_sets_measured_rates_against_the_limit_and_refuses_a_bad_value():
    run = subprocess.run([sys.executable, str(BENCH / "decode_roofline.py"), "--measured", "40200"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert (out["batch"], out["new_tokens"], out["kv_bytes_per_token"]) == (512, 512, 114688)
    assert out["measured"][0]["fraction_of_limit"] == round(40200 / out["limit_tokens_per_s"], 3)
    bad = subprocess.run([sys.executable, str(BENCH / "decode_roofline.py"), "--bandwidth-tbps", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--bandwidth-tbps must be positive" in bad.stderr
    assert "Traceback" not in bad.stderr
