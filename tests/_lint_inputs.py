"""Inputs for config-lint tests: a launch-script argv as the reader gives it, and a tiny model's config.json."""

from __future__ import annotations

from slime_check.launch_script import Origin, Word

# A two-layer Qwen3 config.json that the MODEL_ARGS checks compare a job's flags with.
TINY_HF_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 128,
    "intermediate_size": 384, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 128,
    "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}


def words(*args: str) -> list[Word]:
    """``args`` as train.py argv words, each at its position on the command line."""
    return [Word([a], Origin("argv", i + 1)) for i, a in enumerate(args)]
