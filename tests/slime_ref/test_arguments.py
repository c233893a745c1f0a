"""Flag names, slime's defaults, and every parse-time rule as a one-line UserError naming the flags."""

from __future__ import annotations

import argparse

import pytest

from slime_ref.arguments import add_algo_arguments, build_parser, parse_args
from slime_ref.errors import UserError

MINIMAL = [
    "--rollout-batch-size", "4", "--n-samples-per-prompt", "8", "--global-batch-size", "32", "--num-rollout", "2",
]


def test_slime_defaults():
    args = parse_args(MINIMAL)
    expected = {
        "input_key": "input", "label_key": None, "metadata_key": "metadata", "tool_key": "tools",
        "apply_chat_template": False, "apply_chat_template_kwargs": {}, "rollout_shuffle": False, "rollout_seed": 42,
        "rollout_global_dataset": True, "micro_batch_size": 1, "use_dynamic_batch_size": False,
        "rollout_temperature": 1.0, "rollout_top_p": 1.0, "rollout_top_k": -1, "rollout_stop": None,
        "rollout_stop_token_ids": None, "advantage_estimator": "grpo", "loss_type": "policy_loss",
        "eps_clip": 0.2, "eps_clip_high": 0.2, "eps_clip_c": None, "value_clip": 0.2, "kl_coef": 0.0,
        "use_kl_loss": False, "kl_loss_coef": 0.0, "kl_loss_type": "k1", "use_unbiased_kl": False,
        "entropy_coef": 0.0, "gamma": 1.0, "lambd": 1.0, "normalize_advantages": False,
        "grpo_std_normalization": True, "rewards_normalization": True, "calculate_per_token_loss": False,
        "use_rollout_logprobs": False, "use_tis": False, "tis_clip": 2.0, "tis_clip_low": 0.0,
        "rm_type": None, "reward_key": None, "group_rm": False, "rm_url": None, "partial_rollout": False,
        "mask_offpolicy_in_partial_rollout": False, "buffer_filter_path": None,
        "dynamic_sampling_filter_path": None, "over_sampling_batch_size": 4, "num_steps_per_rollout": 1,
        "data_source_path": "slime_ref.data.source.RolloutDataSourceWithBuffer",
    }
    assert {name: getattr(args, name) for name in expected} == expected


def test_global_batch_size_is_derived_from_num_steps_per_rollout():
    args = parse_args(["--rollout-batch-size", "4", "--n-samples-per-prompt", "8", "--num-steps-per-rollout", "4",
                       "--num-rollout", "1"])
    assert (args.global_batch_size, args.num_steps_per_rollout) == (8, 4)


def test_derived_defaults():
    args = parse_args([*MINIMAL, "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096",
                       "--rollout-max-context-len", "2048", "--eps-clip", "0.1", "--reward-key", "score"])
    assert args.log_probs_max_tokens_per_gpu == 4096
    assert args.rollout_max_prompt_len == 2047
    assert args.eps_clip_high == 0.1
    assert args.eval_reward_key == "score"


def test_reference_model_falls_back_to_the_hf_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    args = parse_args([*MINIMAL, "--use-kl-loss", "--kl-loss-coef", "0.01", "--hf-checkpoint", str(tmp_path)])
    assert args.ref_load == str(tmp_path)


# (extra argv, pattern the one-line message must match)
RULES = [
    (["--global-batch-size", "12"], "rollout_batch_size 4 x n_samples_per_prompt 8 = 32 is not a multiple of "
                                    "global_batch_size 12"),
    (["--global-batch-size", "64"], "--global-batch-size 64 is larger than the 32 samples"),
    (["--num-steps-per-rollout", "3"], "--global-batch-size 32 but .* // num_steps_per_rollout 3 = 10"),
    (["--num-steps-per-rollout", "2"], "--global-batch-size 32 but .* // num_steps_per_rollout 2 = 16"),
    (["--over-sampling-batch-size", "2"], "--over-sampling-batch-size 2 is below --rollout-batch-size 4"),
    (["--kl-coef", "0.1", "--kl-loss-coef", "0.1"], "--kl-coef .*--kl-loss-coef"),
    (["--use-kl-loss"], "--use-kl-loss needs a reference model: pass --ref-load"),
    (["--kl-coef", "0.05"], "--kl-coef 0.05 needs a reference model"),
    (["--use-kl-loss", "--ref-load", "/no/such/ref"], "--ref-load /no/such/ref: no such directory"),
    (["--use-tis", "--use-rollout-logprobs"], "--use-rollout-logprobs and --use-tis cannot be combined"),
    (["--tis-clip-low", "3"], "--tis-clip-low 3.0 must be <= --tis-clip 2.0"),
    (["--advantage-estimator", "reinforce_plus_plus"], "reinforce_plus_plus needs --normalize-advantages"),
    (["--advantage-estimator", "reinforce_plus_plus_baseline"], "--normalize-advantages"),
    (["--num-critic-only-steps", "1"], "--num-critic-only-steps needs a critic: add --advantage-estimator ppo"),
    (["--advantage-estimator", "ppo", "--num-critic-only-steps", "-1"], "--num-critic-only-steps must be >= 0"),
    (["--advantage-estimator", "ppo", "--loss-type", "sft_loss"], "--loss-type sft_loss has no policy"),
    (["--advantage-estimator", "ppo", "--megatron-config-path", "/no/such.yaml"],
     "--megatron-config-path /no/such.yaml: No such file"),
    (["--use-dynamic-batch-size"], "--use-dynamic-batch-size without --max-tokens-per-gpu"),
    (["--rollout-max-context-len", "100", "--rollout-max-prompt-len", "100"],
     "--rollout-max-prompt-len 100 leaves no room for a response in --rollout-max-context-len 100"),
    (["--rollout-temperature", "0"], "--rollout-temperature must be > 0"),
    (["--rollout-temperature", "-1"], "--rollout-temperature must be > 0"),
    (["--rollout-top-p", "0"], "--rollout-top-p must be in \\(0, 1\\]"),
    (["--rollout-top-p", "0.95"], "--rollout-top-p 0.95: below 1, slime v0.3.1 turns on top-p replay"),
    (["--rollout-top-k", "0"], "--rollout-top-k must be -1"),
    (["--eps-clip-c", "1.0"], "--eps-clip-c 1.0 must be > 1.0"),
    (["--eps-clip", "-0.1"], "--eps-clip must be >= 0"),
    (["--loss-type", "custom_loss"], "--loss-type custom_loss needs --custom-loss-function-path"),
    (["--rm-type", "ifbench"], "--rm-type ifbench: not a built-in reward"),  # slime has it; slime-ref does not
    (["--rm-type", "remote_rm"], "--rm-type remote_rm needs --rm-url"),
    (["--save-interval", "5"], "--save-interval without --save. .*Add --save DIR"),
    (["--micro-batch-size", "0"], "--micro-batch-size must be a positive integer"),
    (["--prompt-data", "/no/such/prompts.jsonl"], "--prompt-data /no/such/prompts.jsonl: no such file"),
    (["--custom-rm-path", "rewards.py"], "--custom-rm-path 'rewards.py': a file path"),
    (["--buffer-filter-path", "nowhere_pkg_xyz.fn"], "--buffer-filter-path .*no module named 'nowhere_pkg_xyz'"),
    (["--rollout-temperature", "hot"], "argument --rollout-temperature: invalid float value: 'hot'"),
    (["--advantage-estimator", "a2c"], "argument --advantage-estimator: invalid choice: 'a2c'"),
    (["--apply-chat-template-kwargs", "[1]"], "argument --apply-chat-template-kwargs: must be a JSON object"),
    (["--no-such-flag"], "unknown flag: --no-such-flag"),
]


@pytest.mark.parametrize("extra, pattern", RULES)
def test_every_rule_is_a_one_line_user_error_naming_the_flags(extra, pattern):
    with pytest.raises(UserError, match=pattern) as e:
        parse_args([*MINIMAL, *extra])
    assert "\n" not in str(e.value)


def test_training_length_and_batch_flags_are_required():
    with pytest.raises(UserError, match="--num-rollout .*--num-epoch"):
        parse_args(MINIMAL[:-2])
    with pytest.raises(UserError, match="--global-batch-size .*--num-steps-per-rollout"):
        parse_args(["--rollout-batch-size", "4", "--num-rollout", "1"])
    with pytest.raises(UserError, match="32 samples per rollout do not split into --num-steps-per-rollout 3"):
        parse_args(["--rollout-batch-size", "4", "--n-samples-per-prompt", "8", "--num-steps-per-rollout", "3",
                    "--num-rollout", "1"])
    with pytest.raises(UserError, match="required: --rollout-batch-size"):
        parse_args(["--num-rollout", "1", "--global-batch-size", "1"])
    with pytest.raises(UserError, match="--num-epoch .*--disable-rollout-global-dataset"):
        parse_args([*MINIMAL[:-2], "--disable-rollout-global-dataset", "--num-epoch", "1"])


def test_one_sample_per_prompt_disables_std_normalisation():
    args = parse_args(["--rollout-batch-size", "4", "--global-batch-size", "4", "--num-rollout", "1"])
    assert args.grpo_std_normalization is False


def test_groups_can_be_composed_by_other_parts():
    # another part of slime-ref builds its own parser from the same group functions
    parser = add_algo_arguments(argparse.ArgumentParser())
    assert parser.parse_args(["--eps-clip-high", "0.28"]).eps_clip_high == 0.28
    flags = {opt for action in build_parser()._actions for opt in action.option_strings}
    assert {"--use-kl-loss", "--rollout-max-response-len", "--over-sampling-batch-size", "--rm-url"} <= flags


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--help"])
    assert e.value.code == 0
    assert "--disable-grpo-std-normalization" in capsys.readouterr().out


def test_parsing_flags_does_not_import_torch():
    import subprocess
    import sys

    code = f"import sys; import slime_ref.arguments as a; a.parse_args({MINIMAL!r}); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_placement_defaults_follow_slime(tmp_path):
    colocated = parse_args([*MINIMAL, "--colocate", "--actor-num-gpus-per-node", "4"])
    assert (colocated.rollout_num_gpus, colocated.offload_train, colocated.offload_rollout) == (4, True, True)
    kept_on = parse_args([*MINIMAL, "--colocate", "--no-offload-rollout", "--actor-num-gpus-per-node", "2"])
    assert (kept_on.offload_train, kept_on.offload_rollout) == (True, False)
    disaggregated = parse_args([*MINIMAL, "--rollout-num-gpus-per-engine", "2"])
    assert (disaggregated.rollout_num_gpus, disaggregated.offload_train) == (2, False)
    train_only = parse_args([*MINIMAL, "--debug-train-only"])
    assert train_only.rollout_num_gpus == 0
    # slime: the engines alone, on the actor's GPU count when colocated, nothing offloaded, no trainer's bundles
    engines_only = parse_args([*MINIMAL, "--colocate", "--actor-num-gpus-per-node", "4", "--debug-rollout-only"])
    assert (engines_only.rollout_num_gpus, engines_only.colocate, engines_only.offload_train,
            engines_only.offload_rollout) == (4, False, False, False)
    from slime_ref.ray.placement import placement_layout

    assert placement_layout(engines_only) == (4, 0) and placement_layout(disaggregated) == (10, 8)


def test_eval_sets_are_name_path_pairs_in_one_flag(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("{}\n")
    b.write_text("{}\n")
    args = parse_args([*MINIMAL, "--eval-prompt-data", "aime", str(a), "gsm8k", str(b), "--eval-interval", "5"])
    assert args.eval_datasets == [("aime", str(a)), ("gsm8k", str(b))]
    assert parse_args([*MINIMAL, "--eval-prompt-data", str(a)]).eval_datasets == [("eval", str(a))]


@pytest.mark.parametrize(
    "argv, pattern",
    [
        (["--eval-interval", "5"], "--eval-interval without --eval-prompt-data"),
        (["--eval-prompt-data", "aime", "x.jsonl", "gsm8k"], "NAME PATH pairs; it has an odd number of words \\(3"),
        (["--eval-prompt-data", "aime", "/no/such.jsonl"], "--eval-prompt-data aime /no/such.jsonl: no such file"),
        (["--update-weight-transport", "disk"], "--update-weight-transport disk needs --update-weight-disk-dir"),
        (["--rollout-num-gpus", "3", "--rollout-num-gpus-per-engine", "2"], "--rollout-num-gpus 3 is not a multiple"),
        (["--sglang-router-ip", "127.0.0.1"], "--sglang-router-ip and --sglang-router-port"),
        (["--debug-train-only", "--debug-rollout-only"], "cannot both be set"),
        (["--actor-num-gpus-per-node", "0"], "--actor-num-gpus-per-node must be a positive integer"),
    ],
)
def test_cluster_eval_and_sync_rules(argv, pattern):
    with pytest.raises(UserError, match=pattern):
        parse_args([*MINIMAL, *argv])


def test_typos_get_a_did_you_mean_and_are_never_ignored():
    with pytest.raises(UserError, match=r"unknown flag: --rollout-batchsize \(did you mean --rollout-batch-size\?\)"):
        parse_args([*MINIMAL, "--rollout-batchsize", "4"])
    with pytest.raises(UserError, match=r"--eps-clipp \(did you mean --eps-clip\?\)"):
        parse_args([*MINIMAL, "--eps-clipp", "0.2"])
    with pytest.raises(UserError, match="a value with no flag before it"):
        parse_args([*MINIMAL, "stray"])


def test_slime_flags_slime_ref_does_not_implement_are_listed():
    with pytest.raises(UserError, match="slime flags slime-ref does not implement: --keep-old-actor, "
                                        "--offload-optimizer-states"):
        parse_args([*MINIMAL, "--keep-old-actor", "--offload-optimizer-states"])


def test_sglang_and_router_flags_pass_through():
    args = parse_args([*MINIMAL, "--sglang-mem-fraction-static", "0.7", "--sglang-enable-dp-attention",
                       "--router-balance-abs-threshold", "4"])
    assert args.sglang_extra == {"sglang_mem_fraction_static": "0.7", "sglang_enable_dp_attention": True}
    assert args.router_extra == {"router_balance_abs_threshold": "4"}
    with pytest.raises(UserError, match="--sglang-mem-fraction-statik"):
        parse_args([*MINIMAL, "--sglang-mem-fraction-statik", "0.7"])


def test_model_args_are_checked_against_the_hf_config(tiny):
    good = ["--num-layers", "2", "--hidden-size", "128", "--ffn-hidden-size", "384", "--num-attention-heads", "4",
            "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "32", "--swiglu",
            "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--rotary-base", "10000", "--vocab-size", "128",
            "--qk-layernorm", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
            "--use-rotary-position-embeddings"]
    parse_args([*MINIMAL, "--hf-checkpoint", str(tiny.model_dir), *good])
    bad = [x if x != "384" else "512" for x in good]
    with pytest.raises(UserError, match=r"--ffn-hidden-size 512 \(config.json: 384\)"):
        parse_args([*MINIMAL, "--hf-checkpoint", str(tiny.model_dir), *bad])
    tied = [x for x in good if x != "--untie-embeddings-and-output-weights"]
    with pytest.raises(UserError, match="--untie-embeddings-and-output-weights missing"):
        parse_args([*MINIMAL, "--hf-checkpoint", str(tiny.model_dir), *tied])


def test_ppo_turns_on_the_critic_and_offloads_the_trainer():
    args = parse_args([*MINIMAL, "--advantage-estimator", "ppo"])
    assert args.use_critic and args.offload_train and args.num_critic_only_steps == 0
    assert not parse_args(MINIMAL).use_critic


def test_critic_flags_come_from_the_critic_entry_of_the_megatron_config(tmp_path):
    from slime_ref.arguments import critic_args

    config = tmp_path / "megatron.yaml"
    config.write_text("megatron:\n"
                      "  - {name: default, role: actor, overrides: {lr: 3.0e-6}}\n"
                      "  - name: value\n    role: critic\n"
                      "    overrides: {lr: 1e-5, lr_warmup_iters: 2, actor_num_gpus_per_node: 7}\n")
    args = parse_args([*MINIMAL, "--advantage-estimator", "ppo", "--megatron-config-path", str(config),
                       "--save", str(tmp_path / "ck"), "--lr", "2e-6"])
    args.kl_coef, args.use_kl_loss = 0.1, True  # (set here: parse_args would want a reference model)
    critic = critic_args(args)
    assert critic.role == "critic" and critic.lr == 1e-5 and critic.lr_warmup_iters == 2
    assert critic.actor_num_gpus_per_node == args.actor_num_gpus_per_node  # placement follows the CLI
    assert critic.kl_coef == 0 and not critic.use_kl_loss and critic.ref_load is None
    assert critic.untie_embeddings_and_output_weights
    assert critic.save == str(tmp_path / "ck" / "critic")
    assert args.lr == 2e-6 and args.kl_coef == 0.1  # the actor's own flags are untouched
    bad = tmp_path / "bad.yaml"
    bad.write_text("megatron:\n  - {role: critic, overrides: {no_such_flag: 1}}\n")
    args.megatron_config_path = str(bad)
    with pytest.raises(UserError, match="no_such_flag"):
        critic_args(args)
