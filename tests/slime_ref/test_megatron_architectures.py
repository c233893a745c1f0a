"""Qwen2 (q/k/v bias, tied embeddings) and Llama (llama3 and linear RoPE scaling) against HF, at TP=2.

The tiny HF models are built here from transformers' config classes with random weights; their
vocabulary (97) does not divide by TP, so the padded-vocabulary path is covered too.
"""

from __future__ import annotations

import pytest
import torch

from megatron_workers import architecture_worker, run_workers

SHAPE = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
LINEAR = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}


def _save(config, out):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # norms away from 1 and biases away from 0, so mapping mistakes show
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(out, safe_serialization=True)
    return str(out)


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    from transformers import LlamaConfig, Qwen2Config

    root = tmp_path_factory.mktemp("archs")
    return {
        "qwen2_tied": _save(Qwen2Config(**SHAPE, tie_word_embeddings=True), root / "qwen2"),
        "llama3_rope": _save(LlamaConfig(**SHAPE, rope_parameters=LLAMA3), root / "llama3"),
        "linear_rope": _save(LlamaConfig(**SHAPE, rope_parameters=LINEAR, head_dim=32), root / "linear"),
    }


@pytest.fixture(scope="module")
def results(hf_models):
    return run_workers(architecture_worker, 2, model_dirs=list(hf_models.values()))[0]


@pytest.mark.parametrize("name", ["qwen2_tied", "llama3_rope", "linear_rope"])
def test_logits_match_hf_at_tp2(hf_models, results, name):
    assert results[hf_models[name]]["logits_max_diff"] < 1e-5


@pytest.mark.parametrize("name", ["qwen2_tied", "llama3_rope", "linear_rope"])
def test_export_round_trips_bit_identically(hf_models, results, name):
    export = results[hf_models[name]]["export"]
    assert export["same_names"] and export["identical"]
