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

from megatron_workers import run_workers, te_named_spec_worker

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
