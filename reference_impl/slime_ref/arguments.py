"""slime-ref's command-line flags: slime v0.3.1's names and defaults, and the rules between them.

Flags are declared in groups, one ``add_<group>_arguments(parser)`` function each, so other parts of
slime-ref (Megatron, cluster placement, eval, logging, weight sync) add their own groups the same way
and :func:`build_parser` wires them in. Attribute names are slime's flag names with underscores.

:func:`validate_args` enforces the constraints slime enforces (plus a few slime leaves to a later
crash) when the flags are parsed, before any GPU time is spent. Every violation is a
:class:`~slime_ref.errors.UserError`: one line naming the flags and the fix; the CLIs exit with 2.

Where slime-ref differs from slime v0.3.1, on purpose:

- A reference model is needed for ``--use-kl-loss`` or ``--kl-coef != 0``. slime requires
  ``--ref-load``; slime-ref takes ``--ref-load`` (a Megatron checkpoint or an HF directory) or,
  without it, the initial weights of ``--hf-checkpoint`` (``args.ref_load`` is set to that path).
- The batch identity ``rollout_batch_size * n_samples_per_prompt == global_batch_size *
  num_steps_per_rollout`` must hold exactly (slime floors the division and silently drops the rest).
  One of ``--global-batch-size`` / ``--num-steps-per-rollout`` is required; the other is derived.
- ``--rollout-temperature`` must be > 0 (slime checks this only after v0.3.1).
- Hook paths are checked for shape (dotted ``module.function``, not a ``.py`` file) and for an
  importable top-level package; the module itself is imported when the hook is first used.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
from collections.abc import Sequence

from slime_ref.algo.choices import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS
from slime_ref.errors import UserError
from slime_ref.utils.hooks import SLIME_BUILTINS, check_hook_path, load_function

# Rule-based rewards of slime's rm_hub that slime-ref implements (each also with the boxed_ prefix).
RM_TYPES = ("math", "dapo", "deepscaler", "f1", "gpqa", "remote_rm", "random")


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a one-line UserError instead of printing usage and exiting."""

    def error(self, message: str):
        raise UserError(f"{message} (run with --help for the flag list)")


def _json_object(text: str) -> dict:
    example = """pass an object like '{"enable_thinking": false}'"""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}); {example}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object; {example}")
    return value


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("checkpoints")
    group.add_argument("--hf-checkpoint", type=str, default=None,
                       help="HF model directory: the engines' model and the tokenizer.")
    group.add_argument("--ref-load", type=str, default=None,
                       help="Reference model for the KL terms (Megatron checkpoint or HF directory). "
                       "Default: the initial --hf-checkpoint weights.")
    group.add_argument("--load", type=str, default=None, help="Checkpoint directory to resume from.")
    group.add_argument("--save", type=str, default=None, help="Checkpoint directory to write.")
    group.add_argument("--save-interval", type=int, default=None, help="Save every N rollouts (needs --save).")
    return parser


def add_data_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("prompt data")
    group.add_argument("--prompt-data", type=str, default=None,
                       help="Prompt file, .jsonl or .parquet (optionally path@[start:end] for a row slice).")
    group.add_argument("--input-key", type=str, default="input", help="Row key of the prompt.")
    group.add_argument("--label-key", type=str, default=None, help="Row key of the label (reference answer).")
    group.add_argument("--metadata-key", type=str, default="metadata", help="Row key of per-prompt metadata.")
    group.add_argument("--tool-key", type=str, default="tools",
                       help="Row key of tool schemas passed to the chat template.")
    group.add_argument("--apply-chat-template", action="store_true", default=False,
                       help="Render prompts (OpenAI-style message lists) with the tokenizer's chat template.")
    group.add_argument("--apply-chat-template-kwargs", type=_json_object, default="{}",
                       help="JSON object of extra chat-template arguments, e.g. '{\"enable_thinking\": false}'.")
    group.add_argument("--rollout-shuffle", action="store_true", default=False,
                       help="Shuffle prompts each epoch.")
    group.add_argument("--rollout-seed", type=int, default=42, help="Seed of the prompt shuffle.")
    group.add_argument("--num-rollout", type=int, default=None, help="Number of rollouts (wins over --num-epoch).")
    group.add_argument("--num-epoch", type=int, default=None,
                       help="Epochs over the prompts: num_rollout = num_epoch * (prompts // rollout_batch_size).")
    group.add_argument("--disable-rollout-global-dataset", action="store_false", dest="rollout_global_dataset",
                       help="Do not read --prompt-data; a custom rollout function supplies prompts.")
    group.add_argument("--data-source-path", type=str, default="slime_ref.data.source.RolloutDataSourceWithBuffer",
                       help="Data source class (dotted path).")
    return parser


def add_batch_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("batch sizes")
    group.add_argument("--rollout-batch-size", type=int, required=True, help="Prompts per rollout.")
    group.add_argument("--n-samples-per-prompt", type=int, default=1, help="Responses per prompt (the group size).")
    group.add_argument("--global-batch-size", type=int, default=None,
                       help="Samples (not prompts) per optimizer step.")
    group.add_argument("--num-steps-per-rollout", type=int, default=None,
                       help="Optimizer steps per rollout; sets global batch = rollout batch * n samples / steps.")
    group.add_argument("--micro-batch-size", type=int, default=1,
                       help="Samples per micro-batch (ignored with --use-dynamic-batch-size).")
    group.add_argument("--use-dynamic-batch-size", action="store_true", default=False,
                       help="Pack micro-batches up to --max-tokens-per-gpu tokens.")
    group.add_argument("--max-tokens-per-gpu", type=int, default=None, help="Token budget of a packed micro-batch.")
    group.add_argument("--log-probs-max-tokens-per-gpu", type=int, default=None,
                       help="Token budget when only computing log-probs (default: --max-tokens-per-gpu).")
    group.add_argument("--balance-data", action="store_true", default=False,
                       help="Deal each step's micro-batches to data-parallel ranks by estimated FLOPs "
                            "(same count per rank) instead of round-robin.")
    return parser


def add_rollout_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("rollout sampling")
    group.add_argument("--rollout-max-response-len", type=int, default=None,
                       help="Most new tokens per response (SGLang max_new_tokens).")
    group.add_argument("--rollout-max-prompt-len", type=int, default=None,
                       help="Drop prompts longer than this many tokens when the data is loaded.")
    group.add_argument("--rollout-max-context-len", type=int, default=None,
                       help="Most prompt + response tokens; prompts default to at most this - 1.")
    group.add_argument("--rollout-temperature", type=float, default=1.0, help="Sampling temperature (> 0).")
    group.add_argument("--rollout-top-p", type=float, default=1.0, help="Nucleus sampling p.")
    group.add_argument("--rollout-top-k", type=int, default=-1, help="Top-k sampling (-1: off).")
    group.add_argument("--rollout-stop", type=str, nargs="+", default=None, help="Stop strings.")
    group.add_argument("--rollout-stop-token-ids", type=int, nargs="+", default=None, help="Stop token ids.")
    return parser


def add_dynamic_sampling_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("dynamic sampling and partial rollout")
    group.add_argument("--over-sampling-batch-size", type=int, default=None,
                       help="Prompts requested per sampling round (default and minimum: --rollout-batch-size).")
    group.add_argument("--dynamic-sampling-filter-path", type=str, default=None,
                       help="Group filter f(args, samples) -> DynamicFilterOutput, e.g. "
                       "slime_ref.rollout.filters.check_reward_nonzero_std.")
    group.add_argument("--partial-rollout", action="store_true", default=False,
                       help="Put aborted, half-generated groups back into the buffer to continue later.")
    group.add_argument("--mask-offpolicy-in-partial-rollout", action="store_true", default=False,
                       help="Train only on tokens generated after a partial group is resumed.")
    group.add_argument("--buffer-filter-path", type=str, default=None,
                       help="f(args, rollout_id, buffer, num_samples) -> groups taken from the buffer "
                       "(default: pop the first ones).")
    group.add_argument("--rollout-sample-filter-path", type=str, default=None,
                       help="f(args, groups) after a rollout's groups are kept; sets sample.remove_sample "
                       "on samples to leave out of the loss.")
    group.add_argument("--rollout-all-samples-process-path", type=str, default=None,
                       help="f(args, all_groups, data_source) after a rollout: every finished group, "
                       "dynamically filtered ones included; data_source is the data source's get_samples.")
    group.add_argument("--rollout-data-postprocess-path", type=str, default=None,
                       help="f(args, rollout_id, rollout_data) in each training rank, after log-probs and "
                       "advantages and before the optimizer steps; may edit rollout_data in place.")
    return parser


def add_algo_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("algorithm")
    group.add_argument("--advantage-estimator", type=str, choices=ADVANTAGE_ESTIMATORS, default="grpo")
    group.add_argument("--loss-type", type=str, choices=["policy_loss", "sft_loss", "custom_loss"],
                       default="policy_loss")
    group.add_argument("--custom-loss-function-path", type=str, default=None,
                       help="Loss for --loss-type custom_loss (dotted path).")
    group.add_argument("--eps-clip", type=float, default=0.2, help="PPO clip range (lower side).")
    group.add_argument("--eps-clip-high", type=float, default=None,
                       help="PPO clip range, upper side (DAPO clip-higher; default --eps-clip).")
    group.add_argument("--eps-clip-c", type=float, default=None, help="Dual-clip PPO bound (> 1).")
    group.add_argument("--value-clip", type=float, default=0.2, help="Critic value clip range.")
    group.add_argument("--num-critic-only-steps", type=int, default=0,
                       help="With --advantage-estimator ppo: train only the critic for the first N rollouts "
                            "(>= --num-rollout: a critic-only run).")
    group.add_argument("--megatron-config-path", type=str, default=None,
                       help="YAML with a top-level 'megatron' list of role-tagged entries; the one with "
                            "role: critic overrides the critic's flags (e.g. lr, load, save), the rest inherit.")
    group.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty folded into the reward.")
    group.add_argument("--use-kl-loss", action="store_true", default=False, help="Add a KL-to-reference loss term.")
    group.add_argument("--kl-loss-coef", type=float, default=0.0, help="Weight of the KL loss term.")
    group.add_argument("--kl-loss-type", type=str, choices=KL_ESTIMATORS, default="k1",
                       help="KL estimator, for the loss term and the reward penalty.")
    group.add_argument("--use-unbiased-kl", action="store_true", default=False,
                       help="Weight the KL loss by the importance ratio pi_theta / pi_old.")
    group.add_argument("--entropy-coef", type=float, default=0.0, help="Entropy bonus weight.")
    group.add_argument("--gamma", type=float, default=1.0, help="Discount (PPO GAE, REINFORCE++).")
    group.add_argument("--lambd", type=float, default=1.0, help="GAE lambda.")
    group.add_argument("--normalize-advantages", action="store_true", default=False,
                       help="Whiten advantages over the data-parallel batch.")
    group.add_argument("--disable-grpo-std-normalization", action="store_false", dest="grpo_std_normalization",
                       help="Do not divide by the group std (Dr.GRPO, arXiv 2503.20783).")
    group.add_argument("--disable-rewards-normalization", action="store_false", dest="rewards_normalization",
                       help="Do not subtract the group mean either.")
    group.add_argument("--calculate-per-token-loss", action="store_true", default=False,
                       help="Average the loss over all tokens of the step instead of per sample.")
    group.add_argument("--use-rollout-logprobs", action="store_true", default=False,
                       help="Use the engine's log-probs as the old policy instead of recomputing them.")
    group.add_argument("--use-tis", action="store_true", default=False,
                       help="Truncated importance sampling between trainer and engine log-probs.")
    group.add_argument("--tis-clip", type=float, default=2.0, help="Upper clip of the TIS weight.")
    group.add_argument("--tis-clip-low", type=float, default=0.0, help="Lower clip of the TIS weight.")
    return parser


def add_reward_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("rewards")
    group.add_argument("--rm-type", type=str, default=None,
                       help=f"Built-in reward: {', '.join(RM_TYPES)}; a boxed_ prefix grades the last \\boxed{{}}.")
    group.add_argument("--reward-key", type=str, default=None, help="Key of the scalar in a dict reward.")
    group.add_argument("--eval-reward-key", type=str, default=None, help="--reward-key for eval (default: same).")
    group.add_argument("--group-rm", action="store_true", default=False,
                       help="Score a whole group at once: the reward function gets the list of samples.")
    group.add_argument("--rm-url", type=str, default=None, help="Reward service URL for --rm-type remote_rm.")
    group.add_argument("--custom-rm-path", type=str, default=None,
                       help="async def f(args, sample, **kwargs) -> float (a list of samples with --group-rm).")
    group.add_argument("--custom-reward-post-process-path", type=str, default=None,
                       help="f(args, samples) -> (raw_rewards, rewards), replacing group normalisation.")
    return parser


def add_cluster_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Placement (slime's names). On a machine without GPUs, "GPU" counts mean CPU slots."""
    group = parser.add_argument_group("cluster and placement")
    group.add_argument("--actor-num-nodes", type=int, default=1, help="Nodes for the training actor.")
    group.add_argument("--actor-num-gpus-per-node", type=int, default=8,
                       help="GPUs (CPU slots without GPUs) per node for the training actor.")
    group.add_argument("--rollout-num-gpus", type=int, default=None,
                       help="GPUs for the engines (with --colocate: default the actor's GPU count).")
    group.add_argument("--rollout-num-gpus-per-engine", type=int, default=1,
                       help="GPUs per engine (its tensor-parallel size).")
    group.add_argument("--num-gpus-per-node", type=int, default=8,
                       help="GPUs per node for rollout; set it when a node has fewer than 8.")
    group.add_argument("--colocate", action="store_true", default=False,
                       help="Engines and trainer share devices; turns on --offload-train and --offload-rollout.")
    group.add_argument("--offload", action="store_true", default=False,
                       help="Same as --offload-train --offload-rollout.")
    group.add_argument("--offload-train", action=argparse.BooleanOptionalAction, default=None,
                       help="Release the trainer's device memory while engines generate.")
    group.add_argument("--offload-rollout", action=argparse.BooleanOptionalAction, default=None,
                       help="Release the engines' memory (weights, KV cache) while the trainer trains.")
    group.add_argument("--debug-train-only", action="store_true", default=False,
                       help="Train only, no engines (with a rollout function that needs none, e.g. SFT).")
    group.add_argument("--debug-rollout-only", action="store_true", default=False,
                       help="Generate only, no trainer.")
    return parser


def add_rollout_function_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("rollout function and engines")
    group.add_argument("--rollout-function-path", type=str,
                       default="slime_ref.rollout.sglang_rollout.generate_rollout",
                       help="generate_rollout(args, rollout_id, data_source, evaluation=False).")
    group.add_argument("--custom-generate-function-path", type=str, default=None,
                       help="async generate(args, sample, sampling_params) -> Sample, replacing the "
                            "per-sample /generate call (multi-turn, tools).")
    group.add_argument("--rollout-skip-special-tokens", action="store_true", default=False,
                       help="Drop special tokens from the response text.")
    group.add_argument("--sglang-server-concurrency", type=int, default=512,
                       help="Requests in flight per engine.")
    group.add_argument("--sglang-router-ip", type=str, default=None,
                       help="Use a router already running here instead of starting one.")
    group.add_argument("--sglang-router-port", type=int, default=None, help="Port of that router.")
    group.add_argument("--router-policy", type=str, default="round_robin",
                       choices=["random", "round_robin", "cache_aware", "power_of_two"],
                       help="sglang-router load-balancing policy.")
    # slime's fault tolerance (RolloutHealthMonitor); slime's defaults. The watch (ray/rollout_manager.py)
    # also checks engines without --use-fault-tolerance, and then ends the run instead of hanging.
    group.add_argument("--use-fault-tolerance", action="store_true", default=False,
                       help="Restart a rollout engine that dies or stops answering /health_generate: the rollout "
                            "goes on with the other engines, and the engine restarts before the next weight "
                            "update. Without it such an engine ends the run with an error naming it.")
    group.add_argument("--rollout-health-check-interval", type=float, default=30.0,
                       help="Seconds between /health_generate checks of every engine while rollouts run.")
    group.add_argument("--rollout-health-check-timeout", type=float, default=30.0,
                       help="Seconds an engine has to answer /health_generate before it counts as failed.")
    group.add_argument("--rollout-health-check-first-wait", type=float, default=0.0,
                       help="Seconds before the first health check (engines that compile kernels on first use).")
    group.add_argument("--disable-compute-advantages-and-returns", action="store_false",
                       dest="compute_advantages_and_returns", default=True,
                       help="Skip advantages (SFT runs).")
    return parser


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("evaluation")
    group.add_argument("--eval-interval", type=int, default=None, help="Evaluate every N rollouts.")
    group.add_argument("--eval-prompt-data", type=str, nargs="+", default=None,
                       help="Eval sets as NAME PATH pairs in ONE flag: aime /p/aime.jsonl gsm8k /p/g.jsonl "
                            "(a single PATH is named 'eval').")
    group.add_argument("--skip-eval-before-train", action="store_true", default=False,
                       help="No eval at rollout 0, before training.")
    group.add_argument("--n-samples-per-eval-prompt", type=int, default=1,
                       help="Responses per eval prompt (pass@k uses them).")
    group.add_argument("--eval-temperature", type=float, default=None, help="Default: --rollout-temperature.")
    group.add_argument("--eval-top-p", type=float, default=None, help="Default: --rollout-top-p.")
    group.add_argument("--eval-top-k", type=int, default=None, help="Default: --rollout-top-k.")
    group.add_argument("--eval-max-response-len", type=int, default=None,
                       help="Default: --rollout-max-response-len.")
    return parser


def add_weight_sync_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("weight sync (trainer -> engines)")
    group.add_argument("--update-weight-transport", type=str, choices=["nccl", "disk"], default="nccl",
                       help="Disaggregated: 'nccl' broadcasts buckets over a process group (gloo on CPU), "
                            "'disk' writes an HF checkpoint engines reload. --colocate passes tensor handles.")
    group.add_argument("--update-weight-disk-dir", type=str, default=None,
                       help="Directory for --update-weight-transport disk (shared by trainer and engines).")
    group.add_argument("--update-weight-buffer-size", type=int, default=512 * 1024**2,
                       help="Bytes per weight-sync bucket.")
    group.add_argument("--update-weights-interval", type=int, default=1,
                       help="train_async: sync weights every N rollouts.")
    group.add_argument("--check-weight-update-equal", action="store_true", default=False,
                       help="After each sync, check every engine's weights equal the trainer's.")
    return parser


def add_logging_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("logging")
    group.add_argument("--use-tensorboard", action="store_true", default=False, help="Log to TensorBoard.")
    group.add_argument("--tb-project-name", type=str, default=None, help="TensorBoard project directory.")
    group.add_argument("--tb-experiment-name", type=str, default=None, help="TensorBoard run name.")
    group.add_argument("--log-passrate", action="store_true", default=False,
                       help="Log passrate/pass@k (k = 1, 2, 4, .. <= --n-samples-per-prompt) of each rollout's groups.")
    group.add_argument("--log-multi-turn", action="store_true", default=False,
                       help="Log multi_turn/* metrics: response lengths with and without masked "
                            "(environment) tokens, and metadata['round_number'] statistics.")
    group.add_argument("--use-wandb", action="store_true", default=False, help="Log to Weights & Biases.")
    group.add_argument("--wandb-mode", type=str, choices=["online", "offline", "disabled"], default=None,
                       help="offline needs no network (sync later with `wandb sync`).")
    group.add_argument("--wandb-project", type=str, default=None)
    group.add_argument("--wandb-group", type=str, default=None)
    group.add_argument("--wandb-dir", type=str, default=None)
    return parser


def add_model_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Megatron's architecture flags (slime's ``scripts/models/*.sh`` MODEL_ARGS).

    slime-ref builds the model from ``--hf-checkpoint``'s config.json; these flags are accepted so a
    slime launch script runs unchanged, and each one given is checked against config.json (as slime's
    ``_hf_validate_args`` does), so a wrong MODEL_ARGS fails before training instead of silently
    training another shape.
    """
    group = parser.add_argument_group("model architecture (checked against --hf-checkpoint's config.json)")
    for flag, kind in (("--num-layers", int), ("--hidden-size", int), ("--ffn-hidden-size", int),
                       ("--num-attention-heads", int), ("--num-query-groups", int), ("--kv-channels", int),
                       ("--vocab-size", int), ("--norm-epsilon", float), ("--rotary-base", float),
                       ("--max-position-embeddings", int), ("--seq-length", int),
                       ("--rotary-scaling-factor", float), ("--rotary-percent", float),
                       ("--make-vocab-size-divisible-by", int)):
        group.add_argument(flag, type=kind, default=None)
    group.add_argument("--normalization", type=str, choices=["RMSNorm", "LayerNorm"], default=None)
    group.add_argument("--position-embedding-type", type=str, default=None)
    for switch in ("--swiglu", "--group-query-attention", "--use-rotary-position-embeddings",
                   "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm",
                   "--untie-embeddings-and-output-weights", "--use-rope-scaling"):
        group.add_argument(switch, action="store_true", default=False)
    group.add_argument("--attention-backend", type=str, default=None,
                       help="Megatron's attention kernel choice; slime-ref uses SDPA / varlen flash attention.")
    group.add_argument("--attention-softmax-in-fp32", action="store_true", default=False,
                       help="Megatron's switch for an fp32 softmax in unfused attention. slime-ref's attention keeps "
                            "its softmax in fp32 already (flash attention on CUDA; CPU runs are float32), so it "
                            "changes nothing here.")
    return parser


def check_model_args(args) -> None:
    """Each architecture flag given must match --hf-checkpoint's config.json (UserError otherwise)."""
    names = (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "kv_channels",
        "norm_epsilon",
        "rotary_base",
        "vocab_size",
        "swiglu",
        "untie_embeddings_and_output_weights",
        "qk_layernorm",
        "add_qkv_bias",
    )
    if not any(getattr(args, n, None) not in (None, False) for n in names):
        return  # no MODEL_ARGS given: the model is simply what config.json says
    if not args.hf_checkpoint or not os.path.isfile(os.path.join(args.hf_checkpoint, "config.json")):
        return
    from slime_ref.backends.megatron.model import read_hf_architecture

    arch = read_hf_architecture(args.hf_checkpoint)
    expected = {
        "num_layers": arch.num_layers, "hidden_size": arch.hidden_size, "ffn_hidden_size": arch.intermediate_size,
        "num_attention_heads": arch.num_attention_heads, "num_query_groups": arch.num_key_value_heads,
        "kv_channels": arch.head_dim, "norm_epsilon": arch.rms_norm_eps, "rotary_base": arch.rope.theta,
        "vocab_size": arch.vocab_size,
    }
    wrong = []
    for attr, want in expected.items():
        given = getattr(args, attr, None)
        if given is not None and not _same(given, want):
            wrong.append(f"{_flag(attr)} {given} (config.json: {want})")
    # MODEL_ARGS were given, so its switches must match too
    switches = {"untie_embeddings_and_output_weights": not arch.tie_word_embeddings,
                "qk_layernorm": arch.qk_norm, "add_qkv_bias": arch.qkv_bias}
    for attr, want in switches.items():
        if bool(getattr(args, attr)) != want:
            wrong.append(f"{_flag(attr)} {'given' if getattr(args, attr) else 'missing'} "
                         f"(config.json says {'yes' if want else 'no'})")
    if wrong:
        raise UserError(f"MODEL_ARGS disagree with {args.hf_checkpoint}/config.json: {'; '.join(wrong)}; "
                        "fix the model script or point --hf-checkpoint at the right model")


def _same(a, b) -> bool:
    return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))


def add_slime_ref_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """slime-ref's own flags (not slime's): where the run writes, and which engine serves rollouts."""
    group = parser.add_argument_group("slime-ref only")
    group.add_argument("--output-dir", type=str, default="slime-ref-run",
                       help="Run directory: metrics.jsonl, curves.png, engine and router logs.")
    group.add_argument("--rollout-engine", type=str, choices=["auto", "builtin", "sglang"], default="auto",
                       help="auto: real SGLang where CUDA and sglang are present, else the built-in engine.")
    group.add_argument("--train-num-threads", type=int, default=max(1, os.cpu_count() or 1),
                       help="CPU threads per training rank on machines without GPUs.")
    group.add_argument("--rollout-num-threads", type=int, default=None,
                       help="CPU threads per built-in engine (default: cores / engines).")
    group.add_argument("--save-debug-rollout-data", type=str, default=None,
                       help="slime's flag: dump each rollout's samples to this path, formatted with "
                            "{rollout_id} (torch.save of {'rollout_id', 'samples'}).")
    group.add_argument("--load-debug-rollout-data", type=str, default=None,
                       help="slime's flag: train on the samples --save-debug-rollout-data wrote (this path, "
                            "formatted with {rollout_id}) instead of generating; implies --debug-train-only.")
    group.add_argument("--save-debug-train-data", type=str, default=None,
                       help="slime's flag: after each rollout's training, every rank writes the data it trained "
                            "on (tokens, masks, log-probs, advantages) to this path, formatted with {rollout_id} "
                            "and {rank} (torch.save of {'rollout_id', 'rank', 'rollout_data'}).")
    group.add_argument("--ray-object-store-mb", type=int, default=1024,
                       help="Object store size of a local Ray cluster slime-ref starts.")
    group.add_argument("--dynamic-sampling-max-groups", type=int, default=None,
                       help="With --dynamic-sampling-filter-path: once this many groups have finished in one "
                            "rollout and fewer than --rollout-batch-size were kept, stop sampling and fill the "
                            "batch with the dropped groups of the largest reward spread (then mean reward); "
                            "logged as rollout/dynamic_filter/starved and /filled. Default: no limit, as slime. "
                            "At least --rollout-batch-size.")
    return parser


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="slime-ref", allow_abbrev=False,
                            description="slime-ref flags (slime v0.3.1 names and defaults).")
    for add in (
        add_checkpoint_arguments,
        add_data_arguments,
        add_batch_arguments,
        add_rollout_arguments,
        add_dynamic_sampling_arguments,
        add_algo_arguments,
        add_reward_arguments,
        add_cluster_arguments,
        add_rollout_function_arguments,
        add_eval_arguments,
        add_weight_sync_arguments,
        add_logging_arguments,
        add_model_arguments,
        add_slime_ref_arguments,
    ):
        add(parser)
    from slime_ref.backends.megatron.arguments import add_megatron_arguments

    add_megatron_arguments(parser)  # Megatron-LM's flags the trainer reads, with slime's reset defaults
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` (default: sys.argv[1:]) and validate; raises UserError on any problem.

    Flags slime-ref does not declare are sorted with slime v0.3.1's flag registry:
    ``--sglang-*`` / ``--router-*`` flags SGLang or the router accept pass through to them
    (``args.sglang_extra``, ``args.router_extra``); any other flag of slime's is refused with the
    list of such flags (slime-ref does not implement them); anything else is a typo, refused with a
    did-you-mean. Nothing is ignored silently.
    """
    import sys

    parser = build_parser()
    args, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    args.sglang_extra, args.router_extra = sort_unknown_flags(parser, unknown)
    return validate_args(args)


def sort_unknown_flags(parser: argparse.ArgumentParser, unknown: list[str]) -> tuple[dict, dict]:
    """Split leftover argv into pass-through SGLang and router settings; UserError for everything else."""
    from slime_common.registry import load_registry

    registry = load_registry()
    passthrough: dict[str, dict] = {"sglang": {}, "router": {}}
    unsupported, typos = [], []
    i = 0
    while i < len(unknown):
        token = unknown[i]
        name, eq, inline = token.partition("=")
        values = [inline] if eq else []
        i += 1
        if not name.startswith("--"):
            typos.append(f"{token!r} (a value with no flag before it)")
            continue
        while not eq and i < len(unknown) and not unknown[i].startswith("--"):
            values.append(unknown[i])
            i += 1
        flag = registry.lookup(name)
        if flag is not None and flag.source in ("sglang", "sglang-patch", "router"):
            kind = "router" if flag.source == "router" else "sglang"
            key = name[2:].replace("-", "_")
            passthrough[kind][key] = values[0] if len(values) == 1 else (values or True)
        elif flag is not None:
            unsupported.append(name)
        else:
            ours = list(parser._option_string_actions)
            close = difflib.get_close_matches(name, ours, n=1, cutoff=0.75) or registry.suggest(name, n=1)
            typos.append(f"{name} (did you mean {close[0]}?)" if close else name)
    if typos:
        raise UserError(f"unknown flag{'s' if len(typos) > 1 else ''}: {', '.join(typos)}; "
                        "slime would ignore it silently, slime-ref refuses it (see slime-ref train --help)")
    if unsupported:
        raise UserError(f"slime flag{'s' if len(unsupported) > 1 else ''} slime-ref does not implement: "
                        f"{', '.join(unsupported)}; remove {'them' if len(unsupported) > 1 else 'it'} to run "
                        "the rest of the config at small scale (slime itself accepts them)")
    return passthrough["sglang"], passthrough["router"]


# keys a critic entry cannot change: GPU allocation follows the command line (as slime ignores them)
_CRITIC_IGNORED_KEYS = ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus", "colocate")


def megatron_role_overrides(path: str, role: str) -> dict:
    """The ``overrides`` (or ``args``) of the one ``role`` entry of a ``--megatron-config-path`` YAML
    (slime's ``parse_megatron_role_args`` format); {} when the file has no such entry."""
    import yaml

    try:
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
    except OSError as e:
        raise UserError(f"--megatron-config-path {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise UserError(f"--megatron-config-path {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    example = "megatron: [{name: critic, role: critic, overrides: {lr: 1e-5}}]"
    if not isinstance(raw, dict) or not isinstance(raw.get("megatron"), list):
        raise UserError(f"--megatron-config-path {path}: needs a top-level 'megatron' list, e.g. {example}")
    entries = [e for e in raw["megatron"] if isinstance(e, dict) and e.get("role") == role]
    if len(entries) > 1:
        raise UserError(f"--megatron-config-path {path}: {len(entries)} entries with role: {role}; keep one")
    if not entries:
        return {}
    overrides = entries[0].get("overrides") or entries[0].get("args") or {}
    if not isinstance(overrides, dict):
        raise UserError(f"--megatron-config-path {path}: the role: {role} entry's overrides must be a mapping")
    return overrides


def critic_args(args: argparse.Namespace) -> argparse.Namespace:
    """The critic's flags: the actor's, with the ``role: critic`` entry of ``--megatron-config-path``
    applied, and (as slime) no KL terms, no custom advantages and an output layer of its own.

    Checkpoints: unless the entry sets ``save`` / ``load``, the critic saves to ``<--save>/critic``
    and resumes from ``<--load>/critic``, beside the actor's."""
    import copy

    critic = copy.deepcopy(args)
    overrides = megatron_role_overrides(args.megatron_config_path, "critic") if args.megatron_config_path else {}
    for key, value in overrides.items():
        key = key.replace("-", "_")
        if key in _CRITIC_IGNORED_KEYS:
            continue
        if not hasattr(critic, key):
            raise UserError(f"--megatron-config-path: the critic entry sets {key!r}, which is not a slime-ref flag")
        original = getattr(critic, key)
        if isinstance(value, str) and isinstance(original, (int, float)) and not isinstance(original, bool):
            try:  # YAML reads 1e-5 as a string
                value = type(original)(value)
            except ValueError:
                raise UserError(f"--megatron-config-path: critic {key}: {value!r} is not a number") from None
        setattr(critic, key, value)
    critic.role = "critic"
    if "save" not in overrides and args.save:
        critic.save = os.path.join(args.save, "critic")
    if "load" not in overrides and args.load:
        critic.load = os.path.join(args.load, "critic")
    critic.kl_coef = 0.0
    critic.use_kl_loss = False
    critic.kl_loss_coef = 0.0
    critic.ref_load = None
    critic.save_hf = None
    critic.custom_advantage_function_path = None
    critic.untie_embeddings_and_output_weights = True
    return critic


def _flag(attr: str) -> str:
    return "--" + attr.replace("_", "-")


def validate_args(args: argparse.Namespace) -> argparse.Namespace:
    """Check the rules between flags and fill derived defaults, in place; returns ``args``."""
    for attr in ("rollout_batch_size", "n_samples_per_prompt", "micro_batch_size", "global_batch_size",
                 "num_steps_per_rollout", "over_sampling_batch_size", "dynamic_sampling_max_groups",
                 "num_rollout", "num_epoch",
                 "max_tokens_per_gpu", "log_probs_max_tokens_per_gpu", "rollout_max_response_len",
                 "rollout_max_prompt_len", "rollout_max_context_len", "save_interval"):
        value = getattr(args, attr, None)
        if value is not None and value < 1:
            raise UserError(f"{_flag(attr)} must be a positive integer, got {value}")

    # --- how long to train
    if args.num_rollout is None and args.num_epoch is None:
        raise UserError("set --num-rollout (number of rollouts) or --num-epoch (passes over --prompt-data)")
    if args.num_rollout is None and not args.rollout_global_dataset:
        raise UserError("--num-epoch counts passes over --prompt-data; with --disable-rollout-global-dataset "
                        "set --num-rollout instead")
    if args.rollout_global_dataset and args.prompt_data is not None:
        path = args.prompt_data.split("@[")[0]
        if not os.path.isfile(path):
            raise UserError(f"--prompt-data {args.prompt_data}: no such file; give a .jsonl or .parquet prompt file")

    # --- batch identity: every rollout is used up by whole optimizer steps
    samples_per_rollout = args.rollout_batch_size * args.n_samples_per_prompt
    identity = (f"--rollout-batch-size {args.rollout_batch_size} x --n-samples-per-prompt "
                f"{args.n_samples_per_prompt} = {samples_per_rollout} samples per rollout")
    if args.num_steps_per_rollout is not None:
        if samples_per_rollout % args.num_steps_per_rollout:
            raise UserError(f"{identity} do not split into --num-steps-per-rollout {args.num_steps_per_rollout} "
                            "equal steps; choose a divisor")
        derived = samples_per_rollout // args.num_steps_per_rollout
        if args.global_batch_size is not None and args.global_batch_size != derived:
            raise UserError(f"--global-batch-size {args.global_batch_size} x --num-steps-per-rollout "
                            f"{args.num_steps_per_rollout} != {identity}; set only one of the two")
        args.global_batch_size = derived
    elif args.global_batch_size is not None:
        if samples_per_rollout % args.global_batch_size:
            raise UserError(f"{identity}, not a multiple of --global-batch-size {args.global_batch_size}; "
                            "the global batch counts samples, not prompts")
        args.num_steps_per_rollout = samples_per_rollout // args.global_batch_size
    else:
        raise UserError(f"set --global-batch-size (samples per optimizer step) or --num-steps-per-rollout; "
                        f"{identity}")

    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if args.over_sampling_batch_size < args.rollout_batch_size:
        raise UserError(f"--over-sampling-batch-size {args.over_sampling_batch_size} must be >= "
                        f"--rollout-batch-size {args.rollout_batch_size}")
    max_groups = getattr(args, "dynamic_sampling_max_groups", None)
    if max_groups is not None and max_groups < args.rollout_batch_size:
        raise UserError(f"--dynamic-sampling-max-groups {max_groups} must be >= "
                        f"--rollout-batch-size {args.rollout_batch_size} (the groups that fill a starved batch "
                        "come from those that finished)")
    if args.use_dynamic_batch_size and args.max_tokens_per_gpu is None:
        raise UserError("--use-dynamic-batch-size needs --max-tokens-per-gpu (the token budget per micro-batch)")
    if args.log_probs_max_tokens_per_gpu is None:
        args.log_probs_max_tokens_per_gpu = args.max_tokens_per_gpu

    # --- sampling
    if not args.rollout_temperature > 0:
        raise UserError(f"--rollout-temperature must be > 0, got {args.rollout_temperature} "
                        "(RL needs sampled responses; use a small value like 0.01 for near-greedy)")
    if not 0 < args.rollout_top_p <= 1:
        raise UserError(f"--rollout-top-p must be in (0, 1], got {args.rollout_top_p}")
    if args.rollout_top_p != 1.0:
        # slime v0.3.1 (GenerateState, ray/rollout.py, megatron_utils/loss.py): a top-p below 1 asks its
        # patched SGLang for each step's nucleus and trains on log-probs renormalised over it
        raise UserError(f"--rollout-top-p {args.rollout_top_p}: below 1, slime v0.3.1 turns on top-p replay "
                        "(the trainer's log-probs renormalised over each step's nucleus, which its patched "
                        "SGLang returns), and slime-ref does not implement it; use --rollout-top-p 1.0 "
                        "(--eval-top-p may stay below 1)")
    if args.rollout_top_k == 0 or args.rollout_top_k < -1:
        raise UserError(f"--rollout-top-k must be -1 (off) or >= 1, got {args.rollout_top_k}")
    if args.rollout_max_context_len is not None:
        if args.rollout_max_prompt_len is None:
            args.rollout_max_prompt_len = args.rollout_max_context_len - 1
        if args.rollout_max_prompt_len > args.rollout_max_context_len - 1:
            raise UserError(f"--rollout-max-prompt-len {args.rollout_max_prompt_len} must be < "
                            f"--rollout-max-context-len {args.rollout_max_context_len}, leaving room for a response")

    # --- rewards and group normalisation
    if args.n_samples_per_prompt == 1:
        args.grpo_std_normalization = False  # the std of a one-sample group is undefined
    if args.rm_type is not None:
        base = args.rm_type.strip().removeprefix("boxed_")
        if base not in RM_TYPES:
            raise UserError(f"--rm-type {args.rm_type}: not a built-in reward; choose one of {', '.join(RM_TYPES)} "
                            "(optionally with a boxed_ prefix) or write one and pass --custom-rm-path")
        if base == "remote_rm" and not args.rm_url:
            raise UserError("--rm-type remote_rm needs --rm-url (the reward service, e.g. http://127.0.0.1:8000/score)")
    if args.eval_reward_key is None:
        args.eval_reward_key = args.reward_key

    # --- KL terms and the reference model
    if args.kl_coef != 0 and args.kl_loss_coef != 0:
        raise UserError("set only one of --kl-coef (KL in the reward) and --kl-loss-coef (KL as a loss term)")
    if args.use_kl_loss or args.kl_coef != 0:
        source = "--ref-load" if args.ref_load else "--hf-checkpoint"
        if not args.ref_load:
            args.ref_load = args.hf_checkpoint
        why = "--use-kl-loss" if args.use_kl_loss else f"--kl-coef {args.kl_coef}"
        if not args.ref_load:
            raise UserError(f"{why} needs a reference model: pass --ref-load (or --hf-checkpoint, whose "
                            "initial weights are then the reference)")
        if not os.path.exists(args.ref_load):
            raise UserError(f"{source} {args.ref_load}: no such directory (needed as the reference model for {why})")

    # --- estimator and loss rules
    args.use_critic = args.advantage_estimator == "ppo"
    if args.num_critic_only_steps < 0:
        raise UserError(f"--num-critic-only-steps must be >= 0, got {args.num_critic_only_steps}")
    if args.num_critic_only_steps and not args.use_critic:
        raise UserError("--num-critic-only-steps needs a critic: add --advantage-estimator ppo")
    if args.megatron_config_path is not None:
        if not args.use_critic:
            raise UserError("--megatron-config-path configures the critic; it needs --advantage-estimator ppo")
        megatron_role_overrides(args.megatron_config_path, "critic")  # fail now on a malformed file
    if args.use_critic and args.loss_type != "policy_loss":
        raise UserError(f"--advantage-estimator ppo trains a critic beside a policy; --loss-type {args.loss_type} "
                        "has no policy to train (use policy_loss)")
    if args.advantage_estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline") and \
            not args.normalize_advantages:
        raise UserError(f"--advantage-estimator {args.advantage_estimator} needs --normalize-advantages")
    if args.use_tis and args.use_rollout_logprobs:
        raise UserError("--use-tis corrects trainer log-probs towards the engine's; it cannot be combined with "
                        "--use-rollout-logprobs (which trains on the engine's log-probs directly)")
    if args.tis_clip_low > args.tis_clip:
        raise UserError(f"--tis-clip-low {args.tis_clip_low} must be <= --tis-clip {args.tis_clip}")
    if args.eps_clip < 0:
        raise UserError(f"--eps-clip must be >= 0, got {args.eps_clip}")
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.eps_clip_c is not None and args.eps_clip_c <= 1.0:
        raise UserError(f"--eps-clip-c {args.eps_clip_c} must be > 1.0 (dual-clip bound on the ratio)")
    if args.loss_type == "custom_loss" and not args.custom_loss_function_path:
        raise UserError("--loss-type custom_loss needs --custom-loss-function-path")

    # --- placement (slime's arithmetic)
    for attr in ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine", "num_gpus_per_node",
                 "update_weights_interval", "n_samples_per_eval_prompt", "eval_interval", "sglang_server_concurrency"):
        value = getattr(args, attr, None)
        if value is not None and value < 1:
            raise UserError(f"{_flag(attr)} must be a positive integer, got {value}")
    if args.load_debug_rollout_data is not None:
        args.debug_train_only = True  # slime: the samples come from the file, no engine is started
    if args.debug_train_only and args.debug_rollout_only:
        raise UserError("--debug-train-only and --debug-rollout-only exclude each other")
    actor_gpus = args.actor_num_nodes * args.actor_num_gpus_per_node
    if args.colocate:
        if args.rollout_num_gpus is None:
            args.rollout_num_gpus = actor_gpus
        args.offload_train = True if args.offload_train is None else args.offload_train
        args.offload_rollout = True if args.offload_rollout is None else args.offload_rollout
    if args.offload:
        args.offload_train = args.offload_rollout = True
    if getattr(args, "use_critic", False):
        args.offload_train = True  # slime: a critic always offloads the trainer
    args.offload_train = bool(args.offload_train)
    args.offload_rollout = bool(args.offload_rollout)
    if args.rollout_num_gpus is None:
        args.rollout_num_gpus = 0 if args.debug_train_only else args.rollout_num_gpus_per_engine
    if args.rollout_num_gpus % args.rollout_num_gpus_per_engine:
        raise UserError(f"--rollout-num-gpus {args.rollout_num_gpus} is not a multiple of "
                        f"--rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine}")
    if (args.sglang_router_ip is None) != (args.sglang_router_port is None):
        raise UserError("give both --sglang-router-ip and --sglang-router-port (an existing router), or neither")

    # --- evaluation
    args.eval_datasets = []
    if args.eval_prompt_data:
        items = args.eval_prompt_data
        if len(items) == 1:
            items = ["eval", items[0]]
        if len(items) % 2:
            raise UserError(f"--eval-prompt-data takes NAME PATH pairs in one flag; got {len(items)} values: "
                            f"{' '.join(items)}")
        args.eval_datasets = [(items[i], items[i + 1]) for i in range(0, len(items), 2)]
        for name, path in args.eval_datasets:
            if not os.path.isfile(path.split("@[")[0]):
                raise UserError(f"--eval-prompt-data {name} {path}: no such file")
    if args.eval_interval is not None and not args.eval_datasets:
        raise UserError("--eval-interval needs eval data: --eval-prompt-data NAME PATH [NAME PATH ...]")

    # --- weight sync
    if args.update_weight_transport == "disk" and not args.colocate and not args.update_weight_disk_dir:
        raise UserError("--update-weight-transport disk needs --update-weight-disk-dir (a directory the trainer "
                        "and every engine can read)")
    if args.update_weight_buffer_size < 1:
        raise UserError(f"--update-weight-buffer-size must be a positive number of bytes, got "
                        f"{args.update_weight_buffer_size}")

    # --- the model: a local directory, checked now rather than after Ray and the engines have started
    if args.hf_checkpoint is not None and not os.path.isfile(os.path.join(args.hf_checkpoint, "config.json")):
        what = "no config.json in it" if os.path.isdir(args.hf_checkpoint) else "no such directory"
        raise UserError(f"--hf-checkpoint {args.hf_checkpoint}: {what}; pass a local HF checkpoint directory "
                        "(config.json, weights, tokenizer files). slime-ref never downloads from a model hub")
    for attr in ("rollout_health_check_interval", "rollout_health_check_timeout"):
        if not getattr(args, attr) > 0:
            raise UserError(f"{_flag(attr)} must be > 0 seconds, got {getattr(args, attr)}")
    if args.rollout_health_check_first_wait < 0:
        raise UserError(f"--rollout-health-check-first-wait must be >= 0 seconds, got "
                        f"{args.rollout_health_check_first_wait}")

    check_model_args(args)

    # --- checkpoints and hooks
    if args.save_interval is not None and not args.save:
        raise UserError("--save-interval needs --save (the directory to write checkpoints to)")
    if args.load:  # a damaged or incomplete checkpoint is refused now, before Ray and the engines start
        from slime_ref.backends.megatron.checkpoint import check_load

        check_load(args.load, getattr(args, "ckpt_step", None))
    # every user hook resolves now, before Ray starts: a missing module or a missing function is one
    # line here rather than an error from inside an actor once the engines are up (slime-ref's own
    # hooks are left to import where they run: they pull in torch)
    from slime_common.registry import load_registry

    hook_flags = set(load_registry().hook_flags())
    for attr in [a for a in vars(args) if _flag(a) in hook_flags]:  # the hook flags slime-ref declares
        paths = getattr(args, attr, None)
        for path in paths if isinstance(paths, list) else [paths]:
            if path:
                check_hook_path(path, _flag(attr))
                if not SLIME_BUILTINS.get(path, path).startswith("slime_ref."):
                    load_function(path, _flag(attr))
    return args
