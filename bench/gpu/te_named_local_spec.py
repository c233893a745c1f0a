"""A Megatron layer spec without TransformerEngine whose parameters carry TransformerEngine's names.

slime v0.3.1's Qwen/Llama/GLM-4 weight converters (``hf_to_megatron/qwen.py``, ``megatron_to_hf/
qwen2.py``) know the layer norms only as TransformerEngine fuses them: ``linear_qkv.layer_norm_weight``
and ``linear_fc1.layer_norm_weight``. Megatron's local spec (``--transformer-impl local``) keeps them as
separate ``input_layernorm`` / ``pre_mlp_layernorm`` modules, which those converters refuse. This spec
is the local one with each of those norms moved into the linear layer after it, so a machine without
TransformerEngine runs real slime unchanged:

    --transformer-impl local --spec te_named_local_spec te_named_local_spec   (this folder on PYTHONPATH)

Same math as the local spec (tests/test_bench_te_named_spec.py compares the two); attention stays
Megatron's local ``DotProductAttention``.
"""

from __future__ import annotations

import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import ColumnParallelLinear
from megatron.core.transformer.identity_op import IdentityOp


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
            x = input_.float()
            x = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(input_.dtype) * self.layer_norm_weight
        else:
            x = torch.nn.functional.layer_norm(input_, (input_.shape[-1],), self.layer_norm_weight,
                                               self.layer_norm_bias, self.eps)
        return super().forward(x, weight=weight, runtime_gather_output=runtime_gather_output)


def te_named_local_spec(args, config, vp_stage=None):
    """slime's ``--spec`` entry (called as ``spec(args, config, vp_stage)``): the local GPT layer spec of
    ``args`` with the two pre-norms fused into the linear layers that follow them."""
    spec = get_gpt_layer_local_spec(qk_layernorm=args.qk_layernorm, normalization=args.normalization)
    layer = spec.submodules
    layer.input_layernorm = IdentityOp
    layer.self_attention.submodules.linear_qkv = NormedColumnParallelLinear
    layer.pre_mlp_layernorm = IdentityOp
    layer.mlp.submodules.linear_fc1 = NormedColumnParallelLinear
    return spec
