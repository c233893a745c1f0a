"""bench/gpu/te_named_local_spec.py: real slime without TransformerEngine.

slime v0.3.1's Qwen/Llama converters refuse Megatron's local layer names (seen on an H200:
tests/fixtures/slime_logs/h200-local-layer-names.log.gz). The spec moves the two pre-norms into the
linear layers after them, under TransformerEngine's names, and attends with torch's SDPA, which takes
slime's packed batches; here, on CPU, it must give the local spec's logits and gradients from the
same weights, packed or not.
"""

from __future__ import annotations

from pathlib import Path

import torch

from megatron_workers import run_workers, saved_activations_worker, te_named_spec_worker

SPEC_DIR = Path(__file__).resolve().parents[2] / "bench" / "gpu"


def test_te_named_spec_has_slimes_names_and_the_local_specs_math():
    (out,) = run_workers(te_named_spec_worker, world=1, timeout=300, spec_dir=str(SPEC_DIR))
    names = out["ours_names"]
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in names
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" in names
    assert not any("input_layernorm" in n or "pre_mlp_layernorm" in n for n in names)
    assert out["missing"] == [] and out["unexpected"] == []
    (local_logits, local_grads), (our_logits, our_grads) = out["local"], out["te_named"]
    torch.testing.assert_close(our_logits, local_logits, rtol=1e-5, atol=1e-5)
    moved = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
             "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}
    renamed = {}
    for name, grad in local_grads.items():
        for old, new in moved.items():
            name = name.replace(old, new)
        renamed[name] = grad
    assert renamed.keys() == our_grads.keys()
    for name, grad in our_grads.items():
        assert abs(grad - renamed[name]) <= 1e-4 * max(1.0, abs(grad)), name
    packed, alone = out["packed"]  # slime's packed batches, which the local DotProductAttention refuses
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)


def test_on_cpu_the_sets_layers_keep_plans_local_mlp_exactly_and_more_elsewhere():
    """bench/gpu/layer_activations.py's count of one layer of the set's spec, on CPU. Its SwiGLU is the
    same PyTorch ops on every device: fc1's output, silu's output, the linear half plus Megatron's
    glu_linear_offset and their product, 10 bytes an FFN unit a token, as plan's local count has it. The
    rest is more than the H100 kept (bench/results/layer-activations-h100-2026-12-07.json, which plan's
    count equals): on CPU torch's RMSNorm is unfused (fp32 copies) and attention is one SDPA a sequence."""
    from slime_check import plan as P
    from slime_check import plan_job as J

    hidden, ffn, heads, kv_heads, head_dim = 1024, 3072, 16, 8, 128  # Qwen3-0.6B
    (kept,) = run_workers(saved_activations_worker, world=1, timeout=300, spec_dir=str(SPEC_DIR), shape="qwen3-0.6B",
                          tokens=512)
    mlp = sum(t["bytes_per_token"] for t in kept["tensors"] if t["shape"][-1] in (ffn, 2 * ffn))
    assert mlp == 10 * ffn
    qwen3 = J.Shape(layers=1, hidden=hidden, ffn=ffn, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                    vocab=128, tied=False, qk_norm=True)
    local = P.layer_activation_per_token(qwen3, J.Parallel(world=1), J.Train(longest=512, layer_impl="local"), False)
    assert local == 64_680
    assert kept["saved_bytes_per_token"] == 95_400  # the CPU's extra: fp32 norm copies, SDPA's per-sequence copies
