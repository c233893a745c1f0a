"""slime-ref's command-line flags: slime v0.3.1's names and defaults, and the rules between them.

Flags are declared in groups, one ``add_<group>_arguments(parser)`` function each, so other parts of
slime-ref (Megatron, cluster placement, eval, logging, weight sync) add their own groups the same way
and :func:`build_parser` wires them in. Attribute names are slime's flag names with underscores.

:func:`validate_args` (in :mod:`slime_ref.arguments_validate`) enforces the constraints slime
enforces (plus a few slime leaves to a later crash) when the flags are parsed, before any GPU time is
spent. Every violation is a :class:`~slime_ref.errors.UserError`: one line naming the flags and the
fix; the CLIs exit with 2.

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
from slime_ref.arguments_validate import (  # noqa: F401  (importable from here, where callers look)
    RM_TYPES,
    check_model_args,
    critic_args,
    megatron_role_overrides,
    validate_args,
)
from slime_ref.errors import UserError


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
    # slime's fault tolerance (RolloutHealthMonitor); slime's defaults. The watch (ray/server_watch.py)
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
    from slime_ref.backends.megatron.megatron_flags import add_megatron_arguments

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
