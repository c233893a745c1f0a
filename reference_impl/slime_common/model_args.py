"""MODEL_ARGS: the Megatron architecture flags of slime's ``scripts/models/*.sh`` and the HF config.json
keys each must equal. ``slime-check config`` compares a launch script's flags with the checkpoint's
config.json; ``slime-ref`` refuses a run whose flags disagree with it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelArg:
    flag: str
    hf_keys: tuple[str, ...]  # the first one config.json has wins; "a.b" reads key b of the mapping a
    # what the model takes when config.json has none of the keys (None: no value to compare)
    default: Callable[[dict], object] | None = None


def _head_dim_default(hf: dict):
    hidden, heads = hf.get("hidden_size"), hf.get("num_attention_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


MODEL_ARGS: tuple[ModelArg, ...] = (
    ModelArg("--num-layers", ("num_hidden_layers",)),
    ModelArg("--hidden-size", ("hidden_size",)),
    ModelArg("--num-attention-heads", ("num_attention_heads",)),
    ModelArg("--ffn-hidden-size", ("intermediate_size",)),
    ModelArg("--moe-ffn-hidden-size", ("moe_intermediate_size",)),
    ModelArg("--moe-shared-expert-intermediate-size", ("shared_expert_intermediate_size",)),
    ModelArg("--num-query-groups", ("num_key_value_heads",), lambda hf: hf.get("num_attention_heads")),
    ModelArg("--kv-channels", ("head_dim",), _head_dim_default),
    ModelArg("--vocab-size", ("vocab_size",)),
    ModelArg("--rotary-base", ("rope_parameters.rope_theta", "rope_theta"), lambda hf: 10000.0),
    ModelArg("--norm-epsilon", ("rms_norm_eps",), lambda hf: 1e-6),
)
BY_FLAG = {arg.flag: arg for arg in MODEL_ARGS}

# the switch that says the output layer has weights of its own: config.json's tie_word_embeddings, negated
UNTIE_FLAG, TIE_KEY = "--untie-embeddings-and-output-weights", "tie_word_embeddings"


def text_config(hf: dict) -> dict:
    """The language model's part of a config.json (multimodal configs nest it under text_config)."""
    return hf["text_config"] if isinstance(hf.get("text_config"), dict) else hf


def hf_value(hf: dict, flag: str, with_default: bool = False):
    """The config.json value ``flag`` must equal (``hf`` already :func:`text_config`); None if absent."""
    arg = BY_FLAG[flag]
    for key in arg.hf_keys:
        outer, _, inner = key.partition(".")
        value = hf.get(outer)
        if inner:
            value = value.get(inner) if isinstance(value, dict) else None
        if value is not None:
            return value
    return arg.default(hf) if with_default and arg.default is not None else None


def same_value(a, b) -> bool:
    """Equal as MODEL_ARGS compare: numbers to a relative 1e-9 (1e6 and 1000000.0 match), the rest exactly."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b
