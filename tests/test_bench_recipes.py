"""The bench scripts' recipes stay valid slime-ref flag sets (the GPU one cannot run here)."""

from __future__ import annotations

import sys
from pathlib import Path

from slime_ref.arguments import parse_args
from slime_ref.utils.hooks import load_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def test_gpu_recipe_parses_colocated_on_real_sglang_with_forced_lengths(tiny, tmp_path):
    import grpo_step

    args = parse_args(grpo_step.gpu_flags(tiny.model_dir, tiny.train_path, tmp_path, 4))
    assert args.colocate and args.rollout_engine == "sglang" and args.bf16
    assert args.rollout_batch_size * args.n_samples_per_prompt == args.global_batch_size == 512
    assert args.rollout_max_response_len == 512 and args.sglang_server_concurrency == 512
    assert args.sglang_extra["sglang_attention_backend"] == "triton"
    assert load_function(args.custom_generate_function_path, "x") is grpo_step.generate_ignore_eos


def test_vs_trl_recipe_parses(tiny, tmp_path):
    import vs_trl

    args = parse_args(vs_trl.ours_flags(tiny.model_dir, tiny.train_path, tmp_path, 0, 60, 2, 1))
    assert (args.rollout_batch_size, args.n_samples_per_prompt, args.rollout_max_response_len) == (8, 8, 8)
    assert args.lr == 5e-4 and args.kl_coef == 0 and not args.use_kl_loss and args.colocate
