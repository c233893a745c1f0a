"""``slime-check plan``'s Megatron arithmetic against megatron-core's own model and optimizer.

Small GPT models (GQA, QK-norm, SwiGLU, RMSNorm, RoPE; dense and MoE with shared experts) are built
on CPU with megatron-core's local layer spec, wrapped in its DistributedDataParallel and given its
distributed optimizer, in two processes over gloo, under TP 2, DP 2, PP 2, EP 2 and TP 2 with MoE.
Each rank reports what megatron-core allocated: its parameters by name, the fp32 master weights and
Adam moments of its optimizer shard after one step, and the gradient buffers. The plan's per-GPU
parameter list must equal the parameters by name and size; its optimizer bytes must equal the shard
up to megatron's padding of a bucket (at most 64 elements a parameter), and the shards over the
data-parallel ranks must add up to the model exactly.

These layouts are measured on CPU only; no GPU measurement stands behind them. (slime builds its
layers with TransformerEngine's spec, which fuses each norm into the following linear layer under
another name; the sizes are the same.)
"""

from __future__ import annotations

import pytest

from slime_check import plan as P
from slime_check import plan_job as J

VOCAB = 250  # padded to 256 by megatron's rule, so the padding is exercised
LAYOUTS = {
    "tp2": {"tp": 2, "pp": 1, "ep": 1, "tied": True, "experts": 0},
    "dp2": {"tp": 1, "pp": 1, "ep": 1, "tied": False, "experts": 0},
    "pp2": {"tp": 1, "pp": 2, "ep": 1, "tied": True, "experts": 0},
    "ep2": {"tp": 1, "pp": 1, "ep": 2, "tied": False, "experts": 4},
    "tp2_moe": {"tp": 2, "pp": 1, "ep": 1, "tied": False, "experts": 4},
}
WORLD = 2


def shape_of(layout: dict) -> J.Shape:
    moe = layout["experts"]
    return J.Shape(layers=2, hidden=64, ffn=128, heads=4, kv_heads=2, head_dim=16, vocab=VOCAB, tied=layout["tied"],
                   qk_norm=True, experts=moe, moe_ffn=32 if moe else 0, topk=2 if moe else 0,
                   shared_ffn=48 if moe else 0)


def parallel_of(layout: dict) -> J.Parallel:
    return J.Parallel(world=WORLD, tp=layout["tp"], pp=layout["pp"], ep=layout["ep"])


def megatron_worker(rank, world, port, layouts):
    """Build each layout with megatron-core, take one optimizer step, report what was allocated."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    from slime_ref.backends.megatron import initialize

    initialize.init_distributed(rank, world, master_port=port)  # gloo, with slime-ref's CPU shims
    out = {}
    for name, layout in layouts.items():
        shape = shape_of(layout)
        ps.initialize_model_parallel(tensor_model_parallel_size=layout["tp"],
                                     pipeline_model_parallel_size=layout["pp"],
                                     expert_model_parallel_size=layout["ep"])
        model_parallel_cuda_manual_seed(0)
        moe = shape.experts or None
        config = TransformerConfig(
            num_layers=shape.layers, hidden_size=shape.hidden, ffn_hidden_size=shape.ffn,
            num_attention_heads=shape.heads, num_query_groups=shape.kv_heads, kv_channels=shape.head_dim,
            normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
            add_bias_linear=False, qk_layernorm=True, tensor_model_parallel_size=layout["tp"],
            pipeline_model_parallel_size=layout["pp"], expert_model_parallel_size=layout["ep"],
            num_moe_experts=moe, moe_ffn_hidden_size=shape.moe_ffn or None, moe_router_topk=shape.topk or 2,
            moe_shared_expert_intermediate_size=shape.shared_ffn or None,
            moe_token_dispatcher_type="allgather",  # the alltoall dispatcher asks for CUDA streams
            params_dtype=torch.bfloat16, bf16=True, pipeline_dtype=torch.bfloat16, use_cpu_initialization=True,
            hidden_dropout=0.0, attention_dropout=0.0, gradient_accumulation_fusion=False,
            bias_activation_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
            masked_softmax_fusion=False)
        spec = get_gpt_layer_local_spec(num_experts=moe, qk_layernorm=True, normalization="RMSNorm")
        model = GPTModel(config=config, transformer_layer_spec=spec,
                         vocab_size=P.padded_vocab(VOCAB, layout["tp"]), max_sequence_length=64,
                         pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                         share_embeddings_and_output_weights=shape.tied, parallel_output=True,
                         position_embedding_type="rope")
        params = {n: p.numel() for n, p in model.named_parameters()}
        ddp = DistributedDataParallel(
            config=config, module=model,
            ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True))
        optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True, params_dtype=torch.bfloat16,
                            use_distributed_optimizer=True), [ddp], use_gloo_process_groups=False)
        for p in ddp.parameters():
            p.main_grad.zero_()
        optimizer.step()  # Adam's moments exist from the first step on
        shards = []
        for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
            groups = inner.optimizer.param_groups
            state = inner.optimizer.state
            main = [p for g in groups for p in g["params"]]
            shards.append({
                "master_bytes": sum(p.numel() * p.element_size() for p in main),
                "moment_bytes": sum(s[k].numel() * s[k].element_size() for s in state.values()
                                    for k in ("exp_avg", "exp_avg_sq")),
                "master_numel": sum(p.numel() for p in main),
                "dtypes": sorted({str(p.dtype) for p in main}),
            })
        buffers = [{"grad_numel": b.grad_data.numel(), "grad_dtype": str(b.grad_data.dtype),
                    "param_dtype": str(b.param_dtype)} for b in [*ddp.buffers, *ddp.expert_parallel_buffers]]
        out[name] = {"params": params, "shards": shards, "buffers": buffers,
                     "stage": ps.get_pipeline_model_parallel_rank(), "dp_rank": ps.get_data_parallel_rank(),
                     "expert_dp": ps.get_expert_data_parallel_world_size()}
        ps.destroy_model_parallel()
    return out


@pytest.fixture(scope="module")
def ranks():
    from megatron_workers import run_workers

    return run_workers(megatron_worker, WORLD, layouts=LAYOUTS)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_plan_lists_the_parameters_megatron_core_builds_on_each_rank(ranks, name):
    layout = LAYOUTS[name]
    for rank in ranks:
        got = rank[name]["params"]
        planned = {t.name: t.numel for t in P.param_tensors(shape_of(layout), parallel_of(layout),
                                                            rank[name]["stage"])}
        assert planned == got, name


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_optimizer_state_is_the_shard_of_master_weights_and_two_moments(ranks, name):
    layout = LAYOUTS[name]
    shape, par = shape_of(layout), parallel_of(layout)
    job = J.Job(shape=shape, par=par, train=J.Train(longest=64, max_tokens=64, grad_fp32=True), rollout=None,
                card=J.Card("test", 80 * J.GIB, 81920, "test"))
    for rank in ranks:
        shards = rank[name]["shards"]
        assert all(s["dtypes"] == ["torch.float32"] for s in shards)  # fp32 master weights of bf16 parameters
        for s in shards:
            assert s["moment_bytes"] == 2 * s["master_bytes"]  # exp_avg and exp_avg_sq, fp32, same shard
        items, counts = P.state_items(job, rank[name]["stage"])
        optimizer = items[2].bytes
        actual = sum(s["master_bytes"] + s["moment_bytes"] for s in shards)
        tensors = len(counts["tensors"])
        assert abs(actual - optimizer) <= 12 * 64 * tensors, (name, actual, optimizer)  # megatron's bucket padding
        if par.dp == 1 and (not shape.experts or par.edp == 1):
            assert actual == optimizer == 12 * counts["params"]  # nothing to shard: exact
        grads = sum(b["grad_numel"] for b in rank[name]["buffers"])
        assert all(b["grad_dtype"] == "torch.float32" for b in rank[name]["buffers"])  # grad_reduce_in_fp32
        assert counts["params"] <= grads <= counts["params"] + 64 * tensors + 2 * 128 * par.dp
        assert items[1].bytes == 4 * counts["params"]


def test_shards_over_data_parallel_ranks_add_up_to_the_model_exactly(ranks):
    # DP 2: the two optimizer shards together are every parameter once
    shape, par = shape_of(LAYOUTS["dp2"]), parallel_of(LAYOUTS["dp2"])
    assert par.dp == 2
    total = sum(t.numel for t in P.param_tensors(shape, par, 0))
    assert sum(s["master_numel"] for r in ranks for s in r["dp2"]["shards"]) == total
    assert sorted(r["dp2"]["dp_rank"] for r in ranks) == [0, 1]
    # EP 2: dense parameters sharded over DP 2, each rank's two local experts over expert-DP 1
    shape, par = shape_of(LAYOUTS["ep2"]), parallel_of(LAYOUTS["ep2"])
    assert par.edp == 1 and all(r["ep2"]["expert_dp"] == 1 for r in ranks)
    tensors = P.param_tensors(shape, par, 0)
    dense = sum(t.numel for t in tensors if not t.expert)
    expert = sum(t.numel for t in tensors if t.expert)
    masters = sorted(s["master_numel"] for r in ranks for s in r["ep2"]["shards"])
    assert sum(masters) == dense + 2 * expert  # the dense shards once, each rank's experts whole
    assert masters.count(expert) == 2
