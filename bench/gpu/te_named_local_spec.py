"""A Megatron layer spec without TransformerEngine whose parameters carry TransformerEngine's names.

slime v0.3.1's Qwen/Llama/GLM-4 weight converters (``hf_to_megatron/qwen.py``, ``megatron_to_hf/
qwen2.py``) know the layer norms only as TransformerEngine fuses them: ``linear_qkv.layer_norm_weight``
and ``linear_fc1.layer_norm_weight``. Megatron's local spec (``--transformer-impl local``) keeps them as
separate ``input_layernorm`` / ``pre_mlp_layernorm`` modules, which those converters refuse. This spec
is the local one with each of those norms moved into the linear layer after it, so a machine without
TransformerEngine runs real slime unchanged:

    --transformer-impl local --spec te_named_local_spec te_named_local_spec   (this folder on PYTHONPATH)

Attention is torch's: slime packs each micro-batch into one THD sequence, which Megatron's local
``DotProductAttention`` refuses, so the core attention here is causal SDPA per sequence, or torch's
varlen flash attention on CUDA in 16 bits (slime-ref's own kernels, from ``slime_ref``: reference_impl/
goes on PYTHONPATH too). Same math as the local spec (tests/bench/test_bench_te_named_spec.py compares them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import ColumnParallelLinear
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.module import MegatronModule

from slime_ref.backends.megatron.layers import attention_per_sequence, rms_norm, varlen_attention


class NormedColumnParallelLinear(ColumnParallelLinear):
    """RMSNorm (or LayerNorm) then Megatron's ColumnParallelLinear; the norm's weight is
    ``layer_norm_weight`` (and ``layer_norm_bias``), as in TransformerEngine's
    ``TELayerNormColumnParallelLinear``. Input [s, b, h] -> ([s, b, out / tp], bias)."""

    def __init__(self, input_size: int, output_size: int, *, config, **kwargs):
        super().__init__(input_size, output_size, config=config, **kwargs)
        self.rms = config.normalization == "RMSNorm"
        self.eps = config.layernorm_epsilon
        factory = {"device": self.weight.device if self.weight is not None else None, "dtype": config.params_dtype}
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(input_size, **factory))
        self.layer_norm_bias = None if self.rms else torch.nn.Parameter(torch.zeros(input_size, **factory))
        for p in (self.layer_norm_weight, self.layer_norm_bias):
            if p is not None:  # replicated over TP ranks; their grads are reduced like other norms'
                p.sequence_parallel = config.sequence_parallel

    def forward(self, input_: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output=None):
        if self.rms:
            x = rms_norm(input_, self.layer_norm_weight, self.eps)
        else:
            x = torch.nn.functional.layer_norm(input_, (input_.shape[-1],), self.layer_norm_weight,
                                               self.layer_norm_bias, self.eps)
        return super().forward(x, weight=weight, runtime_gather_output=runtime_gather_output)


class PackedSDPAttention(MegatronModule):
    """Megatron core attention, causal with GQA, for packed and unpadded batches. Packed (THD):
    query [T, np, hn], key/value [T, ng, hn] -> [T, np*hn]; else [s, b, np, hn] -> [s, b, np*hn]."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, cp_comm_type=None, pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("PackedSDPAttention: context parallelism is not supported")
        self.softmax_scale = softmax_scale
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        dropout = self.dropout if self.training else 0.0
        if packed_seq_params is None:
            s, b = query.shape[:2]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [s, b, h, d] -> [b, h, s, d]
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True,
                                                 scale=self.softmax_scale, enable_gqa=True)
            return out.permute(2, 0, 1, 3).reshape(s, b, -1)
        cu, longest = packed_seq_params.cu_seqlens_q, packed_seq_params.max_seqlen_q
        varlen = varlen_attention()
        if (query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and dropout == 0.0 and varlen
                and (self.softmax_scale is None or varlen[2])):
            fn, kwargs, _ = varlen
            kwargs = {**kwargs, **({"scale": self.softmax_scale} if self.softmax_scale is not None else {})}
            out = fn(query, key, value.contiguous(), cu, cu, longest, longest, **kwargs)
        else:
            out = attention_per_sequence(query, key, value, cu.tolist(), dropout, self.softmax_scale)
        return out.reshape(out.shape[0], -1)


def te_named_local_spec(args, config, vp_stage=None):
    """slime's ``--spec`` entry (called as ``spec(args, config, vp_stage)``): the local GPT layer spec of
    ``args`` with the two pre-norms fused into the linear layers that follow them, and torch's attention."""
    spec = get_gpt_layer_local_spec(qk_layernorm=args.qk_layernorm, normalization=args.normalization)
    layer = spec.submodules
    layer.input_layernorm = IdentityOp
    layer.self_attention.submodules.linear_qkv = NormedColumnParallelLinear
    layer.self_attention.submodules.core_attention = PackedSDPAttention
    layer.pre_mlp_layernorm = IdentityOp
    layer.mlp.submodules.linear_fc1 = NormedColumnParallelLinear
    return spec
