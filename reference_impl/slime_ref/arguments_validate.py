"""The rules between slime-ref's flags, checked when they are parsed, and the critic's flags.

:func:`validate_args` enforces the constraints slime enforces (plus a few slime leaves to a later
crash) before any GPU time is spent, and fills the defaults derived from other flags. The rules
``slime-check config`` checks too come from one table, :mod:`slime_common.arg_rules`; the ones
here need the parsed values or this machine (files, the checkpoint's config.json, hook imports).
Every violation is a :class:`~slime_ref.errors.UserError`: one line naming the flags and the fix.
"""

from __future__ import annotations

import argparse
import json
import os

from slime_common.arg_rules import NamespaceValues, broken_rules, user_message
from slime_common.model_args import MODEL_ARGS, TIE_KEY, UNTIE_FLAG, hf_value, same_value, text_config
from slime_ref.errors import UserError
from slime_ref.utils.hooks import SLIME_BUILTINS, check_hook_path, load_function

# Rule-based rewards of slime's rm_hub that slime-ref implements (each also with the boxed_ prefix).
RM_TYPES = ("math", "dapo", "deepscaler", "f1", "gpqa", "remote_rm", "random")

# switches of MODEL_ARGS that follow from the model type rather than a config.json key
_TYPE_SWITCHES = ("--qk-layernorm", "--add-qkv-bias")


def check_model_args(args) -> None:
    """Each architecture flag given must match --hf-checkpoint's config.json (UserError otherwise)."""
    values = NamespaceValues(args)
    given = [arg.flag for arg in MODEL_ARGS if values[arg.flag] is not None]
    switches = [s for s in ("--swiglu", UNTIE_FLAG, *_TYPE_SWITCHES) if values[s]]
    if not given and not switches:
        return  # no MODEL_ARGS given: the model is simply what config.json says
    path = os.path.join(args.hf_checkpoint or "", "config.json")
    if not args.hf_checkpoint or not os.path.isfile(path):
        return
    from slime_ref.backends.megatron.model import read_hf_architecture

    arch = read_hf_architecture(args.hf_checkpoint)  # refuses a model type slime-ref cannot build
    with open(path) as f:
        hf = text_config(json.load(f))
    wrong = []
    for flag in given:
        want = hf_value(hf, flag, with_default=True)
        if want is not None and not same_value(values[flag], want):
            wrong.append(f"{flag} {values[flag]} (config.json: {want})")
    # MODEL_ARGS were given, so its switches must match too
    expected_switches = {UNTIE_FLAG: not bool(hf.get(TIE_KEY, False)),
                         "--qk-layernorm": arch.qk_norm, "--add-qkv-bias": arch.qkv_bias}
    for flag, want in expected_switches.items():
        if bool(values[flag]) != want:
            state = "given" if values[flag] else "missing"
            wrong.append(f"{flag} {state} (config.json says {'yes' if want else 'no'})")
    if wrong:
        raise UserError(f"MODEL_ARGS disagree with {args.hf_checkpoint}/config.json: {'; '.join(wrong)}; "
                        "fix the model script or point --hf-checkpoint at the right model")

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

    # --- the rules slime-check config checks too (slime_common.arg_rules), on the flags as given
    if args.load_debug_rollout_data is not None:
        args.debug_train_only = True  # slime: the samples come from the file, no engine is started
    values = NamespaceValues(args)
    broken = broken_rules(values)
    if broken:
        raise UserError(user_message(broken[0], values))

    # --- how long to train
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
        # slime floors the division and drops the rest; slime-ref wants whole steps
        if samples_per_rollout % args.num_steps_per_rollout:
            raise UserError(f"{identity} do not split into --num-steps-per-rollout {args.num_steps_per_rollout} "
                            "equal steps; choose a divisor")
        args.global_batch_size = samples_per_rollout // args.num_steps_per_rollout
    else:  # the table's batch rules leave a --global-batch-size that divides the rollout
        args.num_steps_per_rollout = samples_per_rollout // args.global_batch_size

    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    max_groups = getattr(args, "dynamic_sampling_max_groups", None)
    if max_groups is not None and max_groups < args.rollout_batch_size:
        raise UserError(f"--dynamic-sampling-max-groups {max_groups} must be >= "
                        f"--rollout-batch-size {args.rollout_batch_size} (the groups that fill a starved batch "
                        "come from those that finished)")
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
    if args.debug_rollout_only:  # slime: the engines alone; no trainer, nothing colocated or offloaded
        if args.colocate and args.rollout_num_gpus is None:
            args.rollout_num_gpus = args.actor_num_nodes * args.actor_num_gpus_per_node
        args.colocate = args.offload_train = args.offload_rollout = False
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
        args.eval_datasets = [(items[i], items[i + 1]) for i in range(0, len(items), 2)]
        for name, path in args.eval_datasets:
            if not os.path.isfile(path.split("@[")[0]):
                raise UserError(f"--eval-prompt-data {name} {path}: no such file")

    # --- weight sync
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
