"""The Megatron backend on CUDA: fused kernels against their eager/reference forms, TP=2 vs TP=1, bf16 training
with fused AdamW and its resume.

and whole training steps replayed from CUDA graphs against the same steps run eagerly.

Skipped without CUDA. The TP=2 test needs two GPUs.
"""

from __future__ import annotations

import math

import pytest
import torch

from megatron_workers import (
    adam_summary,
    make_args,
    parallel_worker,
    resume_worker,
    run_workers,
    step_graphs_worker,
    synthetic_batch,
)

pytestmark = pytest.mark.gpu


def _attention(heads=8, groups=2, head_dim=64):
    from megatron.core.transformer.transformer_config import TransformerConfig

    from slime_ref.backends.megatron.layers import RopeConfig, RopeSDPAttention

    config = TransformerConfig(num_layers=1, hidden_size=heads * head_dim, num_attention_heads=heads,
                               num_query_groups=groups, kv_channels=head_dim, attention_dropout=0.0,
                               bf16=True, params_dtype=torch.bfloat16)
    return RopeSDPAttention(config, 1, None, "self", rope=RopeConfig(head_dim=head_dim, theta=1e6)).cuda()


def test_varlen_flash_attention_matches_one_sdpa_call_per_sequence(monkeypatch):
    from slime_ref.backends.megatron import layers

    lengths = [37, 300, 5, 128]
    packed = layers.PackedSequence.from_lengths(lengths, "cuda")
    attention = _attention()
    torch.manual_seed(0)
    q = torch.randn(sum(lengths), 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(sum(lengths), 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(sum(lengths), 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def run():
        out = attention(q, k, v, None, packed_seq_params=layers.PackedSequence.from_lengths(lengths, "cuda"))
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        return out, grads

    assert layers.varlen_attention() is not None, "this torch has no torch.nn.attention.varlen"
    fused, fused_grads = run()
    assert not layers._varlen_unusable, layers._varlen_unusable  # the varlen kernel really ran
    monkeypatch.setattr(layers, "_varlen_unusable", ["forced"])
    looped, looped_grads = run()
    assert packed.max_seqlen_q == 300
    torch.testing.assert_close(fused.float(), looped.float(), atol=2e-2, rtol=2e-2)
    for a, b in zip(fused_grads, looped_grads):
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)


def test_compiled_kernels_match_their_eager_forms():
    from slime_ref.backends.megatron import layers, logprobs

    torch.manual_seed(0)
    x = torch.randn(300, 16, 128, device="cuda")
    w = torch.randn(128, device="cuda")
    torch.testing.assert_close(
        layers.rms_norm(x, w, 1e-6), layers.rms_norm.__wrapped__(x, w, 1e-6), atol=1e-5, rtol=1e-5
    )
    cos, sin = torch.randn(300, 1, 128, device="cuda"), torch.randn(300, 1, 128, device="cuda")
    k, wk = torch.randn(300, 4, 128, device="cuda"), torch.randn(128, device="cuda")
    for weights in [(w, wk), (None, None)]:
        fused = layers.norm_rope_qk(x, k, cos, sin, *weights, 1e-6)
        eager = layers.norm_rope_qk.__wrapped__(x, k, cos, sin, *weights, 1e-6)
        for a, b in zip(fused, eager):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    logits = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    rows = torch.arange(3, 60, device="cuda")
    target = torch.randint(0, 990, (57,), device="cuda")
    on_rank = torch.ones(57, dtype=torch.bool, device="cuda")
    args = (logits, rows, target, on_rank, 990, 0.8)
    torch.testing.assert_close(logprobs._chunk_stats(*args), logprobs._chunk_stats.__wrapped__(*args),
                               atol=1e-4, rtol=1e-5)
    lse, spx, g1, g2 = (torch.randn(57, device="cuda") for _ in range(4))
    grad_args = (logits, rows, target, on_rank, lse, spx, g1, g2, 990, 0.8, True)
    torch.testing.assert_close(logprobs._chunk_grad(*grad_args).float(),
                               logprobs._chunk_grad.__wrapped__(*grad_args).float(), atol=1e-2, rtol=1e-2)
    dense_target = torch.randint(0, 1024, (64,), device="cuda")
    dense_on_rank = dense_target < 990
    lse, spx, g1, g2 = (torch.randn(64, device="cuda") for _ in range(4))
    dense_args = (logits, dense_target, dense_on_rank, lse, spx, g1, g2, 990, 0.8, True)
    torch.testing.assert_close(logprobs._dense_grad(*dense_args).float(),
                               logprobs._dense_grad.__wrapped__(*dense_args).float(), atol=1e-2, rtol=1e-2)


COMMON = ["--global-batch-size", "4", "--lr", "1e-3", "--lr-decay-style", "constant",
          "--attention-dropout", "0", "--hidden-dropout", "0"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_on_two_gpus_gives_the_same_losses_as_tp1(tiny):
    tp1 = run_workers(parallel_worker, 1, model_dir=str(tiny.model_dir), argv=COMMON + ["--micro-batch-size", "2"])
    tp2 = run_workers(parallel_worker, 2, model_dir=str(tiny.model_dir),
                      argv=COMMON + ["--micro-batch-size", "2", "--tensor-model-parallel-size", "2"])
    losses = [[s["train/loss"] for r in run[0]["metrics"] for s in r] for run in (tp1, tp2)]
    assert len(losses[0]) == 4
    assert max(abs(a - b) for a, b in zip(*losses)) < 1e-4
    for run in (tp1, tp2):
        assert run[0]["logits_max_diff"] < 1e-4
        assert run[0]["export"]["identical"]


def bf16_worker(rank, world, port, model_dir):
    from slime_ref.backends.megatron.actor import MegatronActor

    sft = MegatronActor(make_args(["--hf-checkpoint", model_dir, "--bf16", "--loss-type", "sft_loss", "--lr", "1e-3",
                                   "--global-batch-size", "8", "--micro-batch-size", "4", "--attention-dropout", "0",
                                   "--hidden-dropout", "0", "--lr-decay-style", "constant"]),
                        rank=rank, world_size=world, master_port=port)
    batch = synthetic_batch(8, seed=0)
    sft_losses = [sft.train(i, batch)[0]["train/loss"] for i in range(6)]
    sft.args.loss_type = "policy_loss"  # the same actor, now a GRPO step
    rl = sft.train(6, batch)
    dtypes = {t.dtype for bucket in sft.iter_hf_weights(1 << 30) for _, t in bucket}
    return {"sft": sft_losses, "rl": rl, "dtypes": dtypes, "param_dtype": next(sft.model.parameters()).dtype,
            "adam": adam_summary(sft.optimizer)}


def test_bf16_training_runs_and_learns(tiny):
    result = run_workers(bf16_worker, 1, model_dir=str(tiny.model_dir))[0]
    assert result["param_dtype"] == torch.bfloat16 and result["dtypes"] == {torch.bfloat16}
    assert result["adam"] == {"fused": {True}, "steps": {("cuda:0", 7.0)}}  # fused AdamW, step counts on the GPU
    assert all(math.isfinite(x) for x in result["sft"])
    assert result["sft"][-1] < 0.8 * result["sft"][0]  # six SFT steps on one batch fit it
    assert all(math.isfinite(v) for step in result["rl"] for v in step.values())


def test_bf16_resume_restores_fused_adam_on_the_gpu(tiny, tmp_path):
    # on CUDA the actor runs torch's fused AdamW, whose step counts live on the GPU; a resumed run
    # must bring them back there (a wrong count changes Adam's bias correction, hence the losses)
    argv = ["--bf16", "--global-batch-size", "4", "--micro-batch-size", "2", "--lr", "1e-3",
            "--lr-decay-style", "constant", "--attention-dropout", "0", "--hidden-dropout", "0"]
    save = str(tmp_path / "save")
    whole = run_workers(resume_worker, 1, model_dir=str(tiny.model_dir), argv=argv, stop=4)[0]
    run_workers(resume_worker, 1, model_dir=str(tiny.model_dir), argv=argv + ["--save", save], stop=2)
    resumed = run_workers(resume_worker, 1, model_dir=str(tiny.model_dir), argv=argv + ["--save", save, "--load", save],
                          stop=4)[0]
    assert resumed["start"] == 2
    assert resumed["adam"] == {"fused": {True}, "steps": {("cuda:0", 4.0)}}  # 2 rollouts x 2 steps
    for rollout in (2, 3):
        for a, b in zip(resumed["losses"][rollout], whole["losses"][rollout]):
            assert abs(a - b) <= 5e-3 * abs(b), (rollout, a, b)


def test_a_step_replayed_from_its_cuda_graph_equals_the_eager_step(tiny):
    out = run_workers(step_graphs_worker, 1, model_dir=str(tiny.model_dir))[0]
    # shape A: eager (warm-up), then eager on the graph's own buffers while it is captured; two
    # replays (B, then A again); the eager reference of B bypasses the graphs; the other shape is eager
    assert out["counts"] == {"eager": 2, "captured": 1, "replayed": 2}, out["counts"]
    replayed, eager = out["b_replayed"], out["b_eager"]
    assert set(replayed) == set(eager) and "train/pg_loss" in eager and "train/grad_norm" in eager
    for key in eager:
        assert math.isclose(replayed[key], eager[key], rel_tol=1e-3, abs_tol=1e-6), (key, replayed[key], eager[key])
        assert math.isclose(out["a_replayed"][key], out["a_eager"][key], rel_tol=1e-3, abs_tol=1e-6), key
    # the replay read B's tokens and rewards, not the buffers' A
    assert abs(replayed["train/pg_loss"] - out["a_eager"]["train/pg_loss"]) > 1e-4
    assert abs(replayed["train/grad_norm"] - out["a_eager"]["train/grad_norm"]) > 1e-4
    assert all(math.isfinite(v) for v in out["other_shape"].values())
