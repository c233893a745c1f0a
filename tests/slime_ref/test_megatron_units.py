"""Pure pieces of the Megatron backend, in-process: log-prob maths, schedules, HF config and weight maps."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from slime_ref.backends.megatron import checkpoint as ckpt
from slime_ref.backends.megatron.data import balanced_partition, first_fit_pack, schedule_rollout
from slime_ref.backends.megatron.hf_weights import qkv_to_hf, qkv_to_megatron, shard, to_hf, to_megatron, unshard
from slime_ref.backends.megatron.layers import (
    PackedSequence,
    RopeConfig,
    attention_padded,
    attention_per_sequence,
)
from slime_ref.backends.megatron.logprobs import _VocabParallelLogProbEntropy, response_rows
from slime_ref.backends.megatron.megatron_flags import add_megatron_arguments, validate_megatron_args
from slime_ref.backends.megatron.model import padded_vocab_size, read_hf_architecture
from slime_ref.errors import UserError

# ---------------------------------------------------------------------------------------------
# log-probs


def _reference(logits, rows, targets, valid, temperature):
    log_softmax = torch.log_softmax(logits[rows, :valid].double() / temperature, dim=-1)
    log_prob = log_softmax.gather(1, targets[:, None]).squeeze(1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_prob, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_rows", [1, 3, 1000])
@pytest.mark.parametrize("dense", [False, True], ids=["selected_rows", "dense"])
def test_log_probs_entropy_and_gradients_match_log_softmax(temperature, chunk_rows, dense):
    torch.manual_seed(0)
    logits = torch.randn(20, 40).requires_grad_()
    rows = torch.tensor([2, 3, 4, 9, 10, 15, 18])
    targets = torch.randint(0, 36, (7,))
    # the last 4 columns are vocabulary padding: excluded from the softmax
    log_prob, entropy = _VocabParallelLogProbEntropy.apply(logits, rows, targets, 0, 36, temperature, None,
                                                           chunk_rows, dense)
    ref_log_prob, ref_entropy = _reference(logits, rows, targets, 36, temperature)
    torch.testing.assert_close(log_prob.double(), ref_log_prob, rtol=0, atol=2e-6)
    torch.testing.assert_close(entropy.double(), ref_entropy, rtol=0, atol=2e-6)

    w_lp, w_ent = torch.randn(7), torch.randn(7)
    (grad,) = torch.autograd.grad((log_prob * w_lp).sum() + (entropy * w_ent).sum(), logits)
    (ref_grad,) = torch.autograd.grad((ref_log_prob * w_lp).sum() + (ref_entropy * w_ent).sum(), logits)
    torch.testing.assert_close(grad.double(), ref_grad.double(), rtol=0, atol=2e-6)
    assert grad[:, 36:].abs().sum() == 0 and grad[[0, 1, 5]].abs().sum() == 0


@pytest.mark.parametrize("use_entropy", [False, True])
def test_dense_log_probs_equal_the_selected_rows_path_exactly(use_entropy):
    # the CUDA layout (every row, one gradient kernel) against the CPU one (selected rows, chunks)
    torch.manual_seed(1)
    logits = (3 * torch.randn(30, 50)).bfloat16()
    rows = torch.tensor([0, 1, 7, 8, 9, 20, 28])
    targets = torch.randint(0, 47, (7,))
    results = []
    for dense in (False, True):
        x = logits.clone().requires_grad_()
        log_prob, entropy = _VocabParallelLogProbEntropy.apply(x, rows, targets, 0, 47, 0.9, None, 4, dense)
        loss = (log_prob * torch.linspace(-1, 1, 7)).sum() + (entropy.sum() if use_entropy else 0)
        loss.backward()
        results.append((log_prob, entropy, x.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_bf16_logits_give_fp32_log_probs_and_bf16_grads():
    torch.manual_seed(0)
    logits = torch.randn(6, 16).bfloat16().requires_grad_()
    rows, targets = torch.tensor([0, 2, 4]), torch.tensor([1, 5, 15])
    log_prob, _ = _VocabParallelLogProbEntropy.apply(logits, rows, targets, 0, 16, 1.0, None, 2)
    assert log_prob.dtype == torch.float32
    ref, _ = _reference(logits.float(), rows, targets, 16, 1.0)
    torch.testing.assert_close(log_prob.double(), ref, rtol=0, atol=1e-6)
    log_prob.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_response_rows_score_each_response_token_from_the_previous_position():
    # sample 0: 5 tokens, 2 response (positions 3, 4); sample 1: 4 tokens, 3 response (positions 6, 7, 8)
    assert response_rows([5, 4], [2, 3]).tolist() == [2, 3, 5, 6, 7]


@pytest.mark.parametrize("scale", [None, 0.3])
def test_padded_attention_equals_one_call_per_sequence(scale):
    lengths = [6, 9, 7, 9, 3]
    packed = PackedSequence.from_lengths(lengths, "cpu")
    torch.manual_seed(0)
    q = torch.randn(sum(lengths), 4, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(sum(lengths), 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    index = packed.padded_index()
    assert index is not None and index[2:] == (5, 9) and packed.padded_index() is index  # computed once
    padded = attention_padded(q, k, v, *index, 0.0, scale)
    looped = attention_per_sequence(q, k, v, packed.cu_seqlens_cpu, 0.0, scale)
    torch.testing.assert_close(padded, looped, rtol=0, atol=1e-12)
    w = torch.randn_like(padded)
    for a, b in zip(
        torch.autograd.grad((padded * w).sum(), (q, k, v)), torch.autograd.grad((looped * w).sum(), (q, k, v))
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_padding_is_skipped_when_it_would_cost_more_than_twice_the_exact_attention():
    assert PackedSequence.from_lengths([300, 5, 5], "cpu").padded_index() is None
    assert PackedSequence.from_lengths([16, 14, 12], "cpu").padded_index() is not None


# ---------------------------------------------------------------------------------------------
# micro-batch schedule


def test_fixed_micro_batches_are_dealt_round_robin_over_dp():
    lengths, tokens = [10] * 8, [3] * 8
    steps = [schedule_rollout(lengths, tokens, global_batch_size=4, dp_rank=r, dp_size=2, micro_batch_size=1)
             for r in range(2)]
    assert [s.micro_batches for s in steps[0]] == [[[0], [2]], [[4], [6]]]
    assert [s.micro_batches for s in steps[1]] == [[[1], [3]], [[5], [7]]]
    assert all(s.num_samples == 4 and s.num_tokens == 12 for s in steps[0])


def test_dynamic_micro_batches_respect_the_token_budget_and_cover_each_step_once():
    lengths = [5, 9, 3, 7, 8, 2, 6, 4]
    for dp_size in (1, 2):
        covered = []
        for rank in range(dp_size):
            for step in schedule_rollout(lengths, [1] * 8, global_batch_size=8, dp_rank=rank, dp_size=dp_size,
                                         use_dynamic_batch_size=True, max_tokens_per_gpu=12):
                for mb in step.micro_batches:
                    assert sum(lengths[i] for i in mb) <= 12
                    covered += mb
        assert sorted(covered) == list(range(8))
    assert first_fit_pack([5, 9, 3, 7], 12) == [[0, 2], [1], [3]]


def test_balanced_partition_gives_equal_counts_and_evens_the_cost():
    # LPT: 9 -> r0, 8 -> r1, 7 -> r1 (8 < 9), 1 -> r0 (r1 is full) ... sums 10 / 15 vs round-robin 16 / 9
    assert balanced_partition([9, 8, 7, 1], 2) == [[0, 3], [1, 2]]
    # ties go to the lower index and the lower rank: each rank gets one 5 and one 1
    assert balanced_partition([5, 1, 1, 5, 1, 5], 3) == [[0, 1], [2, 3], [4, 5]]


def test_balance_data_deals_micro_batches_by_workload_not_round_robin():
    lengths = [100, 90, 10, 5]  # round-robin would give rank 0 samples 0 and 2 (110), rank 1 (95)
    kw = dict(global_batch_size=4, dp_size=2, micro_batch_size=1)
    plain = [schedule_rollout(lengths, [1] * 4, dp_rank=r, **kw)[0].micro_batches for r in range(2)]
    assert plain == [[[0], [2]], [[1], [3]]]
    balanced = [schedule_rollout(lengths, [1] * 4, dp_rank=r, workload=lambda n: n * n, **kw)[0].micro_batches
                for r in range(2)]
    # costs 10000, 8100, 100, 25: LPT puts 0 and 3 together, 1 and 2 together
    assert balanced == [[[0], [3]], [[1], [2]]]


def test_dynamic_schedule_gives_every_dp_rank_the_same_number_of_micro_batches():
    lengths = [4, 4, 4]  # one bin of 12 tokens, split to serve 2 ranks
    counts = [len(schedule_rollout(lengths, [1] * 3, global_batch_size=3, dp_rank=r, dp_size=2,
                                   use_dynamic_batch_size=True, max_tokens_per_gpu=100)[0].micro_batches)
              for r in range(2)]
    assert counts == [1, 1]


def test_schedule_errors_name_the_flags():
    with pytest.raises(UserError, match="--global-batch-size 16"):
        schedule_rollout([1] * 8, [1] * 8, global_batch_size=16, dp_rank=0, dp_size=1)
    with pytest.raises(UserError, match="--micro-batch-size 3"):
        schedule_rollout([1] * 8, [1] * 8, global_batch_size=4, dp_rank=0, dp_size=1, micro_batch_size=3)


# ---------------------------------------------------------------------------------------------
# HF config and weight mapping


def _write_config(tmp_path, **cfg):
    base = dict(model_type="qwen3", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    (tmp_path / "config.json").write_text(json.dumps({**base, **cfg}))
    return tmp_path


def test_read_architecture_of_the_tiny_model(tiny):
    arch = read_hf_architecture(tiny.model_dir)
    assert (arch.model_type, arch.num_layers, arch.num_key_value_heads, arch.head_dim) == ("qwen3", 2, 2, 32)
    assert arch.qk_norm and not arch.qkv_bias and not arch.tie_word_embeddings
    assert arch.rope == RopeConfig(head_dim=32, theta=10000.0, scaling=None)


def test_transformers_4_rope_scaling_is_read(tmp_path):
    scaling = {"type": "linear", "factor": 2.0}
    arch = read_hf_architecture(_write_config(tmp_path, model_type="llama", rope_theta=5e5, rope_scaling=scaling))
    assert arch.rope.theta == 5e5 and arch.rope.scaling == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"model_type": "mixtral"}, "model_type 'mixtral' is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4}}, "rope scaling 'yarn'"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8}}, "needs low_freq_factor"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ],
)
def test_unsupported_configs_are_refused_with_the_field_named(tmp_path, cfg, message):
    with pytest.raises(UserError, match=message):
        read_hf_architecture(_write_config(tmp_path, **cfg))


def test_missing_config_names_the_flag(tmp_path):
    with pytest.raises(UserError, match="--hf-checkpoint .*config.json"):
        read_hf_architecture(tmp_path)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ],
)
def test_rope_inverse_frequencies_equal_transformers(rope):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=2048, num_attention_heads=16, rope_parameters=rope)
    if rope["rope_type"] == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        expected = LlamaRotaryEmbedding.compute_default_rope_parameters(config)[0]
    else:
        expected = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu")[0]
    scaling = None if rope["rope_type"] == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}
    ours = RopeConfig(head_dim=128, theta=rope["rope_theta"], scaling=scaling).inv_freq()
    assert torch.equal(ours, expected.float())


def test_qkv_interleave_round_trips_and_groups_heads(tiny):
    arch = read_hf_architecture(tiny.model_dir)  # 4 heads, 2 KV heads, head_dim 32
    q, k, v = torch.randn(128, 8), torch.randn(64, 8), torch.randn(64, 8)
    fused = qkv_to_megatron(arch, q, k, v)
    # group 0 = query heads 0-1, key head 0, value head 0
    assert torch.equal(fused[:64], q[:64]) and torch.equal(fused[64:96], k[:32]) and torch.equal(fused[96:128], v[:32])
    for a, b in zip(qkv_to_hf(arch, fused), (q, k, v)):
        assert torch.equal(a, b)


def test_glu_fc1_shards_hold_their_gate_and_up_rows():
    gate, up = torch.arange(8.0)[:, None], 100 + torch.arange(8.0)[:, None]
    full = torch.cat([gate, up])
    param = torch.nn.Parameter(torch.zeros(8, 1))
    param.tensor_model_parallel, param.partition_dim = True, 0
    shards = [shard("decoder.layers.0.mlp.linear_fc1.weight", full, param, r, 2) for r in range(2)]
    assert shards[1].flatten().tolist() == [4, 5, 6, 7, 104, 105, 106, 107]
    assert torch.equal(unshard("decoder.layers.0.mlp.linear_fc1.weight", shards, True, 0), full)


def test_vocab_rows_are_padded_for_tp_and_stripped_on_export(tiny):
    arch = read_hf_architecture(tiny.model_dir)
    emb = torch.randn(arch.vocab_size, 4)
    padded = to_megatron(arch, "embedding.word_embeddings.weight", [emb], padded_vocab_size(arch.vocab_size, 3))
    assert padded.shape[0] == 129 and padded[128:].abs().sum() == 0
    ((name, back),) = to_hf(arch, "embedding.word_embeddings.weight", padded)
    assert name == "model.embed_tokens.weight" and torch.equal(back, emb)


# ---------------------------------------------------------------------------------------------
# flags and checkpoint discovery


def test_megatron_flags_have_slimes_defaults():
    parser = argparse.ArgumentParser()
    add_megatron_arguments(parser)
    args = parser.parse_args([])
    assert (args.lr, args.clip_grad, args.seed, args.micro_batch_size) == (1e-6, 1.0, 1234, 1)
    assert args.global_batch_size is None and args.save is None and args.update_weight_buffer_size == 512 * 1024**2


def test_flags_the_shared_parser_already_has_are_left_alone():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.5)
    add_megatron_arguments(parser)
    assert parser.parse_args([]).lr == 0.5


_GRAPHS = ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration", "--no-check-for-nan-in-loss-and-grad"]
_NO_DROPOUT = ["--attention-dropout", "0", "--hidden-dropout", "0"]


@pytest.mark.parametrize("argv, message", [
    (["--fp16"], "--fp16"), (["--sequence-parallel"], "--sequence-parallel"),
    (["--cuda-graph-impl", "transformer_engine"], "TransformerEngine.*--cuda-graph-scope full_iteration"),
    (["--cuda-graph-impl", "local"] + _NO_DROPOUT, "pass --cuda-graph-scope full_iteration"),
    (_GRAPHS[:4] + _NO_DROPOUT, "needs --no-check-for-nan-in-loss-and-grad"),
    (["--cuda-graph-impl", "local", "--cuda-graph-scope", "attn"] + _NO_DROPOUT, "--cuda-graph-scope full_iteration"),
    (_GRAPHS, "--attention-dropout 0 --hidden-dropout 0"),
    (_GRAPHS + _NO_DROPOUT + ["--tensor-model-parallel-size", "2"], "--tensor-model-parallel-size 1"),
    (_GRAPHS + _NO_DROPOUT + ["--recompute-granularity", "full"], "--recompute-granularity"),
    (_GRAPHS + _NO_DROPOUT + ["--cuda-graph-warmup-steps", "-1"], "--cuda-graph-warmup-steps"),
])
def test_unsupported_flag_values_are_refused(argv, message):
    parser = argparse.ArgumentParser()
    add_megatron_arguments(parser)
    with pytest.raises(UserError, match=message):
        validate_megatron_args(parser.parse_args(argv))


def test_checkpoint_discovery_follows_the_tracker_and_ignores_partial_saves(tmp_path):
    assert ckpt.find_checkpoint(tmp_path) is None
    done = tmp_path / "iter_0000001"
    done.mkdir()
    (done / "metadata.json").write_text("{}")
    (tmp_path / ".iter_0000002.partial").mkdir()  # a save that crashed
    (tmp_path / ckpt.TRACKER).write_text("1\n")
    assert ckpt.find_checkpoint(tmp_path) == done
    assert ckpt.find_checkpoint(done) == done
    (tmp_path / ckpt.TRACKER).write_text("2\n")
    with pytest.raises(UserError, match="iter_0000002, which is missing"):
        ckpt.find_checkpoint(tmp_path)


def test_dense_log_probs_under_tp2_equal_the_selected_rows_path_and_log_softmax():
    from megatron_workers import run_workers, tp_log_probs_worker

    ranks = run_workers(tp_log_probs_worker, 2, timeout=120)
    for out in ranks:
        for a, b in zip(out[False], out[True]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    g = torch.Generator().manual_seed(0)
    full = 3 * torch.randn(12, 48, generator=g)
    rows, targets = torch.tensor([1, 2, 3, 7, 8, 11]), torch.randint(0, 45, (6,), generator=g)
    ref_log_prob, ref_entropy = _reference(full, rows, targets, 45, 0.8)
    torch.testing.assert_close(ranks[0][True][0].double(), ref_log_prob, rtol=0, atol=2e-6)
    torch.testing.assert_close(ranks[1][True][1].double(), ref_entropy, rtol=0, atol=1e-5)
    assert ranks[1][True][2][:, 21:].abs().sum() == 0  # padding columns get no gradient


def test_cuda_graph_flags_that_slime_ref_implements_pass(tmp_path):
    parser = argparse.ArgumentParser()
    add_megatron_arguments(parser)
    args = parser.parse_args(_GRAPHS + _NO_DROPOUT + ["--cuda-graph-warmup-steps", "1"])
    validate_megatron_args(args)
    assert (args.cuda_graph_impl, args.cuda_graph_scope) == ("local", ["full_iteration"])
    assert args.cuda_graph_warmup_steps == 1
    assert parser.parse_args([]).cuda_graph_warmup_steps == 3  # megatron's default


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_cuda_graphs_on_cpu_are_refused_before_anything_starts(tiny):
    from megatron_workers import make_args
    from slime_ref.backends.megatron.actor import MegatronActor

    args = make_args(["--hf-checkpoint", str(tiny.model_dir), "--global-batch-size", "8"] + _GRAPHS + _NO_DROPOUT)
    with pytest.raises(UserError, match="needs a CUDA GPU; remove the CUDA graph flags"):
        MegatronActor(args, rank=0, world_size=1, master_port=1)


def _micro_batch(lengths, response_lengths, fields):
    from slime_ref.backends.megatron.data import PackedMicroBatch

    return PackedMicroBatch(sample_indices=list(range(len(lengths))), tokens=torch.zeros(1, sum(lengths)),
                            packed=PackedSequence.from_lengths(lengths, "cpu"), total_lengths=lengths,
                            response_lengths=response_lengths, fields=fields)


def test_a_step_shape_holds_everything_a_captured_step_bakes_in():
    from slime_ref.backends.megatron.data import StepSchedule
    from slime_ref.backends.megatron.step_graphs import step_shape

    def shape(lengths=(5, 7), responses=(2, 3), num_tokens=5, advantages=True, dtype=torch.float32):
        fields = {"loss_masks": [torch.ones(r) for r in responses]}
        fields["advantages"] = [torch.zeros(r, dtype=dtype) if advantages else None for r in responses]
        mb = _micro_batch(list(lengths), list(responses), fields)
        return step_shape([mb], StepSchedule([[0, 1]], num_samples=2, num_tokens=num_tokens))

    assert shape() == shape()  # other values, same shape: one graph
    for other in (shape(lengths=(7, 5)), shape(responses=(3, 2)), shape(num_tokens=4), shape(advantages=False),
                  shape(dtype=torch.float64)):
        assert other != shape()


def test_index_tensors_are_built_once_per_list_while_kept():
    from slime_ref.utils.index_cache import keep_indices

    first = response_rows([5, 7], [2, 3])
    assert response_rows([5, 7], [2, 3]) is not first  # outside keep_indices: built every call
    store: dict = {}
    with keep_indices(store):
        kept = response_rows([5, 7], [2, 3])
        assert response_rows([5, 7], [2, 3]) is kept
        assert response_rows([5, 7], [3, 3]) is not kept
    assert torch.equal(kept, first) and len(store) == 2
    assert response_rows([5, 7], [2, 3]) is not kept
