"""``slime-check config``'s checks of slime's argument rules (``slime_validate_args`` and the FAQ), hook
paths, the critic, and the Megatron and SGLang settings slime relies on.

The rules slime-ref enforces too live in one table, :mod:`slime_common.arg_rules`; the ones here
are those only a launch script can be judged by (flags slime-ref does not implement).
"""

from __future__ import annotations

import json
import re

from slime_check.config_argv import (
    ARGS_DOC,
    BATCH_DOC,
    DOTTED,
    GRPO_DOC,
    HOOK_DOC,
    PERF_DOC,
    UNKNOWN,
    Config,
    known,
    rule_findings,
)
from slime_check.config_files import existing_path
from slime_check.findings import Finding, Status, slime_doc
from slime_common.arg_rules import RULES as ARG_RULES

# ---------------------------------------------------------------------------------------------
# slime_validate_args and FAQ rules
# ---------------------------------------------------------------------------------------------


def check_kl(cfg: Config) -> list[Finding]:
    id_ = "config.kl"
    kl_coef, kl_loss_coef = cfg.number("--kl-coef"), cfg.number("--kl-loss-coef")
    use_kl_loss = cfg.get("--use-kl-loss") is True
    out = rule_findings(cfg, ids=(id_,))  # the rules slime-ref enforces too (slime_common.arg_rules)
    needs_ref = use_kl_loss or (kl_coef is not UNKNOWN and kl_coef not in (None, 0))
    if needs_ref and not cfg.has("--ref-load"):
        why = "--use-kl-loss" if use_kl_loss else f"--kl-coef {kl_coef}"
        out.append(
            Finding(
                id_,
                Status.FAIL,
                f"{why} without --ref-load: slime loads the reference model from --ref-load "
                "and stops when it is missing.",
                "Add --ref-load (the Megatron checkpoint of the initial model), or drop the KL flags.",
                GRPO_DOC,
            )
        )
    if not use_kl_loss and known(kl_loss_coef) and kl_loss_coef != 0:
        out.append(Finding(id_, Status.WARN, f"--kl-loss-coef {kl_loss_coef} has no effect without --use-kl-loss.",
                           "Add --use-kl-loss, or drop --kl-loss-coef.", GRPO_DOC))
    if not out:
        state = "KL loss on" if use_kl_loss else ("KL reward penalty on" if needs_ref else "no KL term")
        out.append(Finding(id_, Status.PASS, f"KL settings are consistent ({state})."))
    return out


def _rule(cfg: Config, id_: str, broken: bool, finding: str, fix: str, doc: str = ARGS_DOC) -> Finding | None:
    return Finding(id_, Status.FAIL, finding, fix, doc) if broken else None


def check_validate_args(cfg: Config) -> list[Finding]:
    """The remaining assertions of slime_validate_args (and slime's SGLang checks), one finding each
    when broken, one PASS line otherwise."""
    g, has, num = cfg.get, cfg.has, cfg.number
    pp, per_engine, dp = num("--sglang-pp-size"), num("--rollout-num-gpus-per-engine"), num("--sglang-dp-size")
    transport, mode = g("--update-weight-transport"), g("--update-weight-mode")
    opd_type = g("--opd-type")
    checks = [
        _rule(
            cfg,
            "config.dynamic_batch",
            g("--balance-by-flops") is True and g("--use-dynamic-batch-size") is not True,
            "--balance-by-flops needs --use-dynamic-batch-size.",
            "Add --use-dynamic-batch-size.",
            PERF_DOC,
        ),
        _rule(
            cfg,
            "config.mismatch_metrics",
            g("--get-mismatch-metrics") is True and not has("--custom-tis-function-path"),
            "--get-mismatch-metrics needs --custom-tis-function-path.",
            "Add --custom-tis-function-path.",
            GRPO_DOC,
        ),
        _rule(
            cfg,
            "config.param_filters",
            has("--only-train-params-name-list") and has("--freeze-params-name-list"),
            "--only-train-params-name-list and --freeze-params-name-list exclude each other.",
            "Keep one.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.weight_sync",
            mode == "delta"
            and (transport != "disk" or g("--colocate") is True or not has("--update-weight-local-checkpoint-dir")),
            "--update-weight-mode delta needs --update-weight-transport disk, no --colocate, and "
            "--update-weight-local-checkpoint-dir.",
            "Fix the delta-sync flags or use the full mode.",
            slime_doc("docs/en/advanced/delta-weight-sync.md"),
        ),
        _rule(
            cfg,
            "config.release_train",
            g("--release-train") is True and (not has("--save") or transport != "disk" or mode != "full"),
            "--release-train needs --save and full weight sync over disk.",
            "Add --save and --update-weight-transport disk, or drop --release-train.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.mtp",
            g("--enable-mtp-training") is True and not has("--mtp-num-layers"),
            "--enable-mtp-training needs --mtp-num-layers.",
            "Add --mtp-num-layers.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.opd",
            g("--use-opd") is True and opd_type is None,
            "--use-opd needs --opd-type sglang or megatron.",
            "Add --opd-type.",
            slime_doc("docs/en/advanced/on-policy-distillation.md"),
        ),
        _rule(
            cfg,
            "config.opd",
            g("--use-opd") is True and opd_type == "megatron" and not has("--opd-teacher-load"),
            "--opd-type megatron needs --opd-teacher-load.",
            "Add --opd-teacher-load.",
            slime_doc("docs/en/advanced/on-policy-distillation.md"),
        ),
        _rule(
            cfg,
            "config.opd",
            has("--opd-teacher-load") and (g("--use-opd") is not True or opd_type == "sglang"),
            "--opd-teacher-load is set but unused (it needs --use-opd with --opd-type megatron).",
            "Drop --opd-teacher-load or enable Megatron OPD.",
            slime_doc("docs/en/advanced/on-policy-distillation.md"),
        ),
        _rule(
            cfg,
            "config.sglang_parallel",
            known(pp, per_engine) and pp > 1 and per_engine % pp,
            f"--rollout-num-gpus-per-engine {per_engine} is not divisible by --sglang-pp-size {pp}.",
            "Make GPUs per engine a multiple of the SGLang pipeline size.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.sglang_parallel",
            known(dp) and dp > 1 and g("--sglang-enable-dp-attention") is not True,
            f"--sglang-dp-size {dp} needs --sglang-enable-dp-attention.",
            "Add --sglang-enable-dp-attention.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.sglang_parallel",
            has("--prefill-num-servers") and has("--sglang-config"),
            "--prefill-num-servers and --sglang-config exclude each other.",
            "Use server_groups in the YAML config.",
            slime_doc("docs/en/advanced/pd-disaggregation.md"),
        ),
    ]
    # the rules slime-ref enforces too come from slime_common.arg_rules; batch and KL ones have their own check
    shared = rule_findings(cfg, skip=("config.batch_identity", "config.kl"))
    broken = shared + [c for c in checks if c is not None]
    if broken:
        return broken
    count = len(checks) + sum(rule.id not in ("config.batch_identity", "config.kl") for rule in ARG_RULES)
    return [Finding("config.validate_args", Status.PASS, f"The other {count} rules of slime's argument checks hold.")]


def check_hooks(cfg: Config) -> list[Finding]:
    out = []
    for name in cfg.reg.hook_flags():  # values slime loads with load_function: module.attribute
        for g in cfg.given(name):
            for word in g.values:
                if not word.known:
                    continue
                value = word.text
                # "my_rm.py" parses as module.attribute, but nobody names a function "py".
                if not DOTTED.fullmatch(value) or value.endswith(".py"):
                    module = re.sub(r"\.py$", "", value).replace("/", ".").lstrip(".")
                    fix = (f"Give a dotted import path such as {module}.<function>, with the module's folder on "
                           "PYTHONPATH." if value.endswith(".py") or "/" in value
                           else "Give module.function (a dotted import path).")
                    out.append(
                        Finding(
                            "config.hooks",
                            Status.FAIL,
                            f"{g.name} {value} ({g.where}) is not a dotted import "
                            "path: slime loads hooks with importlib (module.function), not from files.",
                            fix,
                            HOOK_DOC,
                        )
                    )
    return out


CRITIC_DOC = GRPO_DOC  # algorithm flags; the skill explains the critic in references/algorithms.md


def check_critic(cfg: Config) -> list[Finding]:
    """slime's critic rules: ``use_critic`` follows from ``--advantage-estimator ppo``; the critic takes
    the actor's GPUs, forces ``offload_train``, reads its own flags from ``--megatron-config-path``'s
    ``role: critic`` entry, and cannot run with ``--release-train``."""
    id_ = "config.critic"
    ppo = cfg.get("--advantage-estimator") == "ppo"
    critic_only = cfg.number("--num-critic-only-steps")
    out = []
    if ppo and cfg.get("--release-train") is True:
        out.append(Finding(id_, Status.FAIL, "--release-train with --advantage-estimator ppo: slime stops at start-up "
                                             "(release-train does not support critic training).",
                           "Drop --release-train, or use a critic-free estimator (grpo, gspo, ...).", ARGS_DOC))
    if not ppo and known(critic_only) and critic_only:
        out.append(Finding(id_, Status.WARN, f"--num-critic-only-steps {critic_only} has no effect without a critic.",
                           "Add --advantage-estimator ppo, or drop --num-critic-only-steps.", CRITIC_DOC))
    if not ppo and cfg.has("--megatron-config-path"):
        out.append(Finding(id_, Status.WARN, "--megatron-config-path is read only for the critic "
                                             "(--advantage-estimator ppo); this run ignores it.",
                           "Add --advantage-estimator ppo, or drop --megatron-config-path.", CRITIC_DOC))
    if ppo and cfg.get("--offload-train") is False:
        out.append(Finding(id_, Status.WARN, "--no-offload-train with a critic: slime turns --offload-train on "
                                             "anyway (actor and critic take turns on the same GPUs).",
                           "Drop --no-offload-train.", CRITIC_DOC))
    if ppo and not out:
        num_rollout = cfg.number("--num-rollout")
        only = known(critic_only, num_rollout) and critic_only and critic_only >= num_rollout
        out.append(Finding(id_, Status.PASS, "PPO critic on the actor's GPUs, --offload-train on"
                                             + (" (critic-only run: the actor never trains)." if only else ".")))
    return out


def check_transformer_impl(cfg: Config) -> list[Finding]:
    """``--transformer-impl local`` builds Megatron's local layer spec, whose layer norms are separate
    modules (``input_layernorm``, ``pre_mlp_layernorm``). slime v0.3.1's weight converters for Qwen2/3,
    Qwen3-MoE, Llama and GLM-4 know only TransformerEngine's names for them (the norm fused into
    ``linear_qkv`` / ``linear_fc1``): ``hf_to_megatron/qwen.py`` raises KeyError on the HF load, and
    ``megatron_to_hf/qwen2.py`` ValueError on the weight update. DeepSeek-V3's converters take both."""
    id_ = "config.transformer_impl"
    if cfg.get("--transformer-impl") != "local" or cfg.has("--spec"):
        return []
    folder = existing_path(cfg, "--hf-checkpoint")
    model_type = None
    if folder is not None and (folder / "config.json").is_file():
        try:
            hf = json.loads((folder / "config.json").read_text())
            model_type = str(hf.get("text_config", {}).get("model_type") or hf.get("model_type") or "") or None
        except (OSError, ValueError, AttributeError):
            model_type = None
    if model_type is not None and "deepseek" in model_type:
        return [Finding(id_, Status.PASS, f"--transformer-impl local with a {model_type} checkpoint: slime's "
                                          "DeepSeek-V3 converters know the local layer names.")]
    what = f"a {model_type} checkpoint" if model_type else "a Qwen, Llama or GLM-4 checkpoint"
    finding = (f"--transformer-impl local{cfg.where('--transformer-impl')} with {what}: slime v0.3.1's weight "
               "converters know only TransformerEngine's layer names, so loading the HF weights stops with "
               "KeyError: \"Unsupported Qwen/Llama Megatron parameter 'decoder.layers.0.input_layernorm.weight'\", "
               "and the weight update to SGLang with ValueError: Unknown parameter name.")
    fix = ("Install TransformerEngine (slime's image has 2.16.1) and drop --transformer-impl local; without it, "
           "only a --spec whose layers carry TransformerEngine's parameter names loads.")
    return [Finding(id_, Status.FAIL if model_type else Status.WARN, finding, fix, slime_doc("docker/Dockerfile"))]


def check_cuda_graphs(cfg: Config) -> list[Finding]:
    """Megatron-LM's training CUDA-graph flags as slime v0.3.1 sees them. With ``--cuda-graph-impl local
    --cuda-graph-scope full_iteration``, Megatron-LM's ``validate_args`` (which slime runs) asserts
    ``--no-check-for-nan-in-loss-and-grad``. And the full-iteration graph is Megatron-LM's
    ``FullCudaGraphWrapper``, applied only in its own training loop (``megatron/training/training.py``);
    slime's actor calls megatron-core's schedule itself, and that scope graphs no layer, so slime's
    training steps run eagerly with these flags."""
    id_ = "config.cuda_graphs"
    scope = cfg.get("--cuda-graph-scope")
    scopes = [str(s) for s in scope] if isinstance(scope, list) else [str(scope)] if scope else []
    if cfg.get("--cuda-graph-impl") != "local" or not any(s.endswith("full_iteration") for s in scopes):
        return []
    where = cfg.where("--cuda-graph-scope")
    if not cfg.has("--no-check-for-nan-in-loss-and-grad"):
        return [Finding(id_, Status.FAIL,
                        f"--cuda-graph-scope full_iteration{where} without --no-check-for-nan-in-loss-and-grad: "
                        "Megatron-LM's argument check stops slime at start-up (AssertionError: "
                        "--no-check-for-nan-in-loss-and-grad should be set with full_iteration CUDA graph).",
                        "Add --no-check-for-nan-in-loss-and-grad, or drop the CUDA graph flags.", ARGS_DOC)]
    return [Finding(id_, Status.WARN,
                    f"--cuda-graph-impl local --cuda-graph-scope full_iteration{where}: slime v0.3.1 runs its "
                    "training steps eagerly with these flags; Megatron-LM's full-iteration graph wraps only "
                    "Megatron-LM's own training loop, which slime's actor does not use.",
                    "Drop the flags on slime (they change nothing there but turn off the NaN checks); slime-ref "
                    "replays each repeated step shape from a CUDA graph with them.", ARGS_DOC)]


def check_top_p_replay(cfg: Config) -> list[Finding]:
    """slime v0.3.1 turns on top-p replay at a rollout top-p below 1: GenerateState asks SGLang for each
    step's nucleus, ray/rollout.py asserts that every sample carries it, and the loss renormalises the
    log-probs over it. Only SGLang with slime's patch (sglang-top_p.patch) returns the nucleus."""
    top_p = cfg.number("--rollout-top-p")
    if not known(top_p) or top_p == 1.0:
        return []
    hook = (" A --custom-generate-function-path must keep them on each sample too: pass SGLang's meta_info to "
            "sample.append_response_tokens." if cfg.has("--custom-generate-function-path") else "")
    return [Finding("config.top_p_replay", Status.WARN,
                    f"--rollout-top-p {top_p}{cfg.where('--rollout-top-p')} is below 1, which turns on slime's "
                    "top-p replay: every sample must carry the nucleus token ids that only SGLang with slime's "
                    "patch returns (slime's image). With a stock SGLang the run stops on an assertion as the "
                    f"first rollout becomes training data.{hook}",
                    "Run on slime's image (its patched SGLang), or set --rollout-top-p 1.0.", BATCH_DOC)]

