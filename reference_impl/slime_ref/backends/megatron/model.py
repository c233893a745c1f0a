"""A megatron-core GPTModel built from an HF ``config.json`` (Qwen2, Qwen3 and Llama dense families).

:func:`read_hf_architecture` reads the HF config and refuses what we cannot represent exactly
(one clear line naming the field). :func:`build_model` turns it into megatron's
``TransformerConfig`` and a ``GPTModel`` for this pipeline stage, with the layer spec from
``layers.py``: megatron's local modules (column/row-parallel linears, SwiGLU MLP, residuals)
around our RMSNorm and RoPE + fused-attention core.

What maps to what:

===========================  =============================================================
HF                           megatron
===========================  =============================================================
num_key_value_heads          num_query_groups (GQA)
head_dim                     kv_channels
rms_norm_eps                 layernorm_epsilon (RMSNorm everywhere, incl. Qwen3 q/k norm)
hidden_act silu + up/gate    gated_linear_unit + silu (SwiGLU)
Qwen2 q/k/v bias             add_qkv_bias
Qwen3 q_norm/k_norm          qk_layernorm
tie_word_embeddings          share_embeddings_and_output_weights
rope_theta, rope scaling     our RopeConfig (default, linear, llama3)
===========================  =============================================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from slime_ref.backends.megatron.layers import QKNorm, RMSNorm, RopeConfig, RopeSDPAttention
from slime_ref.errors import UserError

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class HFArchitecture:
    """The shape of a dense HF decoder, as far as the Megatron model needs it."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    max_position_embeddings: int


def read_hf_architecture(model_dir: str | Path) -> HFArchitecture:
    """Parse ``model_dir/config.json``; raise UserError for anything we would get wrong."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UserError(f"--hf-checkpoint {model_dir}: no config.json there; point it at an HF model directory")
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config", cfg)
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(
            f"{path}: model_type {model_type!r} is not supported; the Megatron backend builds "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (dense) models"
        )

    def need(key):
        if key not in cfg:
            raise UserError(f"{path}: missing {key!r}")
        return cfg[key]

    if cfg.get("hidden_act", "silu") != "silu":
        raise UserError(f"{path}: hidden_act {cfg['hidden_act']!r} is not supported (only silu / SwiGLU)")
    if cfg.get("use_sliding_window"):
        raise UserError(f"{path}: use_sliding_window is true; sliding-window attention is not supported")
    if model_type == "llama" and (cfg.get("attention_bias") or cfg.get("mlp_bias")):
        raise UserError(f"{path}: Llama attention_bias/mlp_bias are not supported (biases on o_proj/MLP)")
    if model_type == "qwen3" and cfg.get("attention_bias"):
        raise UserError(f"{path}: Qwen3 attention_bias is not supported")

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    head_dim = cfg.get("head_dim") or hidden // heads
    return HFArchitecture(
        model_type=model_type,
        vocab_size=need("vocab_size"),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope=RopeConfig(head_dim=head_dim, **_rope_parameters(cfg, path)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
    )


def _rope_parameters(cfg: dict, path: Path) -> dict:
    """theta and scaling from transformers 5 ``rope_parameters`` or 4.x ``rope_theta``/``rope_scaling``."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling")
    if scaling:
        params = {**scaling, **params}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UserError(f"{path}: partial_rotary_factor != 1 is not supported")
    if kind not in SUPPORTED_ROPE_TYPES:
        raise UserError(
            f"{path}: rope scaling {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if kind == "default":
        return {"theta": float(theta), "scaling": None}
    keys = ["factor"]
    if kind == "llama3":
        keys += ["low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]
    missing = [k for k in keys if k not in params]
    if missing:
        raise UserError(f"{path}: {kind} rope scaling needs {', '.join(missing)}")
    return {"theta": float(theta), "scaling": {"rope_type": kind, **{k: params[k] for k in keys}}}


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    """The smallest multiple of ``tp_size`` >= ``vocab_size`` (rows past the HF vocab are masked)."""
    return -(-vocab_size // tp_size) * tp_size


def transformer_config(arch: HFArchitecture, args, *, use_gpu_fusions: bool | None = None):
    """megatron ``TransformerConfig`` for ``arch`` under the parallel/precision flags in ``args``."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if use_gpu_fusions is None:
        use_gpu_fusions = torch.cuda.is_available()
    bf16 = bool(getattr(args, "bf16", False))
    dtype = torch.bfloat16 if bf16 else torch.float32
    tp = args.tensor_model_parallel_size
    if arch.num_attention_heads % tp or arch.num_key_value_heads % tp:
        raise UserError(
            f"--tensor-model-parallel-size {tp}: must divide num_attention_heads ({arch.num_attention_heads}) "
            f"and num_key_value_heads ({arch.num_key_value_heads})"
        )
    pp = args.pipeline_model_parallel_size
    if arch.num_layers % pp:
        raise UserError(f"--pipeline-model-parallel-size {pp}: must divide num_hidden_layers ({arch.num_layers})")
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.intermediate_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_key_value_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=bf16,
        use_cpu_initialization=not torch.cuda.is_available(),
        perform_initialization=True,
        init_method_std=0.02,
        variable_seq_lengths=True,  # every micro-batch is one pack of a different length
        moe_token_dispatcher_type="alltoall",  # megatron refuses variable lengths with the default
        # megatron's fused SwiGLU and bias-dropout-add are torch.compile'd; on CPU they stay eager.
        # Without dropout (and these layers have no output bias) bias-dropout-add is one residual
        # add, which costs less as a plain add than as a compiled call.
        bias_activation_fusion=use_gpu_fusions,
        bias_dropout_fusion=use_gpu_fusions and args.hidden_dropout > 0,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        # the loss functions already divide by the step's token or sample count
        calculate_per_token_loss=False,
        deterministic_mode=False,
    )


def layer_spec(arch: HFArchitecture):
    """megatron's local transformer-layer spec with our RMSNorm and RoPE + fused-attention core."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = get_gpt_layer_local_spec(qk_layernorm=arch.qk_norm, normalization="RMSNorm")
    layer = spec.submodules
    layer.input_layernorm = RMSNorm
    layer.pre_mlp_layernorm = RMSNorm
    attention = layer.self_attention.submodules
    attention.core_attention = ModuleSpec(module=RopeSDPAttention, params={"rope": arch.rope})
    if arch.qk_norm:
        attention.q_layernorm = QKNorm
        attention.k_layernorm = QKNorm
    return spec


class ValueHead(torch.nn.Module):
    """The critic's last layer: hidden state -> one value per token (replaces GPTModel's output layer).

    Zero-initialised, so a fresh critic predicts 0 everywhere. Called as megatron calls its output
    layer (``weight`` / ``runtime_gather_output`` are ignored) and returns ``(values [S, B, 1], None)``.
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        return torch.nn.functional.linear(hidden_states, self.weight), None


def build_model(arch: HFArchitecture, config, *, pre_process: bool, post_process: bool, value_head: bool = False):
    """The GPTModel chunk for this pipeline stage (logits stay vocab-parallel under TP).

    ``value_head``: the critic's model, with untied embeddings and a :class:`ValueHead` as last layer."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    spec = layer_spec(arch)
    num_local_layers = get_num_layers_to_build(config)
    block = TransformerBlockSubmodules(layer_specs=[spec] * num_local_layers, layer_norm=RMSNorm)
    model = GPTModel(
        config=config,
        transformer_layer_spec=block,
        vocab_size=padded_vocab_size(arch.vocab_size, ps.get_tensor_model_parallel_world_size()),
        max_sequence_length=arch.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tie_word_embeddings and not value_head,
        position_embedding_type="none",  # RoPE is applied in RopeSDPAttention
    )
    if value_head and post_process:
        model.output_layer = ValueHead(config.hidden_size, config.params_dtype)
    for layer in model.decoder.layers:
        attention = layer.self_attention
        if isinstance(attention.q_layernorm, QKNorm):
            attention.core_attention.apply_qk_norm(attention.q_layernorm, attention.k_layernorm)
    if not torch.cuda.is_available():
        return model
    return model.cuda(torch.cuda.current_device())
