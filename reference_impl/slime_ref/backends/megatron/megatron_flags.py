"""The flags the Megatron backend reads: Megatron-LM's names, with slime v0.3.1's reset defaults.

slime passes Megatron-LM's own flags straight through and resets a few defaults
(slime/utils/arguments.py: ``--lr 1e-6``, ``--clip-grad 1.0``, ``--seed 1234``,
``--micro-batch-size 1``, ``--global-batch-size None``, ``--load/--save/--save-interval None``,
``--distributed-timeout-minutes 10``). The model architecture flags (``--num-layers`` and so on)
are not here: the model is built from ``--hf-checkpoint``'s config.json.

:func:`add_megatron_arguments` also adds the slime flags that only the training backend reads
(``--hf-checkpoint``, ``--ref-load``, ``--save-hf``, ``--update-weight-buffer-size``, the batch
shaping and log-prob flags). Every flag is added only if the parser does not have it yet, so the
shared parser may define any of them first.
"""

from __future__ import annotations

import argparse

from slime_ref.errors import UserError

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")

# (flag, argparse keywords). Megatron-LM defaults unless the comment says slime resets them.
_MEGATRON_FLAGS: list[tuple[str, dict]] = [
    ("--tensor-model-parallel-size", dict(type=int, default=1, help="Tensor-parallel size.")),
    ("--pipeline-model-parallel-size", dict(type=int, default=1, help="Pipeline-parallel size.")),
    ("--context-parallel-size", dict(type=int, default=1, help="Context-parallel size (only 1 is supported).")),
    ("--sequence-parallel", dict(action="store_true", help="Not supported (needs TransformerEngine norms).")),
    ("--use-distributed-optimizer", dict(action="store_true",
                                         help="Shard optimizer state over data-parallel ranks "
                                              "(always on when the data-parallel size is > 1).")),
    ("--accumulate-allreduce-grads-in-fp32", dict(action="store_true",
                                                  help="Accumulate and all-reduce gradients in fp32 (bf16 runs).")),
    ("--optimizer", dict(type=str, default="adam", choices=["adam", "sgd"], help="Optimizer.")),
    ("--lr", dict(type=float, default=1e-6, help="Peak learning rate (slime default 1e-6).")),
    ("--min-lr", dict(type=float, default=0.0, help="Learning rate floor of the decay.")),
    ("--lr-decay-style", dict(type=str, default="linear", choices=LR_DECAY_STYLES, help="Learning-rate decay.")),
    ("--lr-decay-iters", dict(type=int, default=None,
                              help="Optimizer steps to decay over (default: all steps of the run).")),
    ("--lr-wsd-decay-style", dict(type=str, default="exponential",
                                  choices=["exponential", "linear", "cosine", "minus_sqrt"],
                                  help="Decay shape of the WSD schedule's last phase.")),
    ("--lr-wsd-decay-iters", dict(type=int, default=None, help="Steps of the WSD schedule's decay phase.")),
    ("--lr-warmup-iters", dict(type=int, default=0, help="Linear warm-up steps.")),
    ("--lr-warmup-fraction", dict(type=float, default=None, help="Warm-up as a fraction of the decay steps.")),
    ("--lr-warmup-init", dict(type=float, default=0.0, help="Learning rate at the start of warm-up.")),
    ("--clip-grad", dict(type=float, default=1.0, help="Gradient-norm clip (slime default 1.0; 0 disables).")),
    ("--weight-decay", dict(type=float, default=0.01, help="Weight decay (not applied to biases and norms).")),
    ("--start-weight-decay", dict(type=float, default=None, help="Weight decay at the start of the run.")),
    ("--end-weight-decay", dict(type=float, default=None, help="Weight decay at the end of the run.")),
    ("--weight-decay-incr-style", dict(type=str, default="constant", choices=["constant", "linear", "cosine"],
                                       help="How weight decay moves from start to end.")),
    ("--adam-beta1", dict(type=float, default=0.9, help="Adam beta1.")),
    ("--adam-beta2", dict(type=float, default=0.999, help="Adam beta2.")),
    ("--adam-eps", dict(type=float, default=1e-8, help="Adam epsilon.")),
    ("--sgd-momentum", dict(type=float, default=0.9, help="SGD momentum.")),
    ("--bf16", dict(action="store_true", help="bf16 parameters and activations, fp32 master weights.")),
    ("--fp16", dict(action="store_true", help="Not supported: use --bf16.")),
    ("--seed", dict(type=int, default=1234, help="Random seed (slime default 1234).")),
    ("--attention-dropout", dict(type=float, default=0.1, help="Dropout on attention probabilities.")),
    ("--hidden-dropout", dict(type=float, default=0.1, help="Dropout on hidden states.")),
    ("--micro-batch-size", dict(type=int, default=1, help="Samples per micro-batch (slime default 1).")),
    ("--global-batch-size", dict(type=int, default=None,
                                 help="Samples per optimizer step over all data-parallel ranks.")),
    ("--recompute-granularity", dict(type=str, default=None, choices=["full", "selective"],
                                     help="Activation recomputation.")),
    ("--recompute-method", dict(type=str, default=None, choices=["uniform", "block"],
                                help="Which layers --recompute-granularity full recomputes.")),
    ("--recompute-num-layers", dict(type=int, default=None, help="Layers per recomputed chunk.")),
    ("--calculate-per-token-loss", dict(action="store_true",
                                        help="Average the loss over the step's tokens, not its samples.")),
    ("--load", dict(type=str, default=None, help="Checkpoint directory to resume from.")),
    ("--save", dict(type=str, default=None, help="Checkpoint directory to save to.")),
    ("--save-interval", dict(type=int, default=None, help="Save every this many rollouts.")),
    ("--no-save-optim", dict(action="store_true", help="Save weights without optimizer state.")),
    ("--no-load-optim", dict(action="store_true", help="Do not load optimizer state.")),
    ("--no-load-rng", dict(action="store_true", help="Do not load RNG state.")),
    ("--ckpt-step", dict(type=int, default=None, help="Load this iteration instead of the latest.")),
    ("--distributed-timeout-minutes", dict(type=int, default=10, help="Collective timeout (slime default 10).")),
    ("--no-check-for-nan-in-loss-and-grad", dict(
        action="store_false", dest="check_for_nan_in_loss_and_grad",
        help="Megatron-LM's switch for its NaN checks of the loss and gradients, which slime-ref does not "
             "run; Megatron-LM requires it with --cuda-graph-scope full_iteration, and so does slime-ref.")),
    ("--cuda-graph-impl", dict(type=str, default="none", choices=["none", "local", "transformer_engine"],
                               help="CUDA graphs for training: 'local' with --cuda-graph-scope full_iteration "
                                    "replays each step shape's whole forward and backward from one graph, once "
                                    "the shape has run --cuda-graph-warmup-steps times (a small model's step is "
                                    "bound by kernel launches; a GPU is needed)")),
    ("--cuda-graph-scope", dict(type=str, nargs="+", default=[],
                                help="What a CUDA graph captures; slime-ref implements full_iteration.")),
    ("--cuda-graph-warmup-steps", dict(type=int, default=3,
                                       help="Eager steps of a step shape before its CUDA graph is captured.")),
]

# slime flags that only the training backend reads (slime/utils/arguments.py defaults)
_SLIME_TRAIN_FLAGS: list[tuple[str, dict]] = [
    ("--hf-checkpoint", dict(type=str, default=None, help="HF model directory: architecture, tokenizer, weights.")),
    ("--ref-load", dict(type=str, default=None,
                        help="Reference model (HF directory or checkpoint); also the initial weights "
                             "when --load has no checkpoint.")),
    ("--save-hf", dict(type=str, default=None,
                       help="Also save an HF copy at save_hf.format(rollout_id=...) with each checkpoint.")),
    ("--update-weight-buffer-size", dict(type=int, default=512 * 1024**2,
                                         help="Bytes per bucket when exporting weights to the engines.")),
    ("--num-steps-per-rollout", dict(type=int, default=None, help="Optimizer steps per rollout.")),
    ("--use-dynamic-batch-size", dict(action="store_true",
                                      help="Pack micro-batches by --max-tokens-per-gpu instead of a fixed size.")),
    ("--max-tokens-per-gpu", dict(type=int, default=None, help="Token budget of a dynamic micro-batch.")),
    ("--log-probs-chunk-size", dict(type=int, default=-1, help="Rows per log-prob chunk (-1: automatic).")),
    ("--use-rollout-logprobs", dict(action="store_true",
                                    help="Use the engine's log-probs as the old policy's (no extra forward).")),
    ("--loss-type", dict(type=str, default="policy_loss", choices=["policy_loss", "sft_loss", "custom_loss"],
                         help="policy_loss (PPO-style) or sft_loss.")),
]


def add_megatron_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the Megatron flags (and the backend's slime flags) the parser does not have yet."""
    group = parser.add_argument_group("megatron")
    for flag, kwargs in _MEGATRON_FLAGS + _SLIME_TRAIN_FLAGS:
        if flag not in parser._option_string_actions:
            group.add_argument(flag, **kwargs)
    return parser


def validate_megatron_args(args) -> None:
    """Refuse flag values the backend cannot honour; one line naming the flag."""
    if args.fp16:
        raise UserError("--fp16 is not supported by the Megatron backend; use --bf16")
    if args.sequence_parallel:
        raise UserError("--sequence-parallel is not supported without TransformerEngine norms; remove it")
    if args.context_parallel_size != 1:
        raise UserError("--context-parallel-size must be 1 (context parallelism is not supported)")
    if getattr(args, "loss_type", "policy_loss") == "custom_loss":
        raise UserError("--loss-type custom_loss is not supported by slime-ref; use policy_loss or sft_loss")
    # --use-dynamic-batch-size without --max-tokens-per-gpu is a rule of slime_common.arg_rules, checked at parse time
    _validate_cuda_graph_args(args)
    for flag in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be >= 1")


def _validate_cuda_graph_args(args) -> None:
    impl = getattr(args, "cuda_graph_impl", "none")
    if impl == "none":
        return
    if impl == "transformer_engine":
        raise UserError("--cuda-graph-impl transformer_engine needs TransformerEngine, which slime-ref does not use; "
                        "use --cuda-graph-impl local --cuda-graph-scope full_iteration")
    if list(args.cuda_graph_scope) != ["full_iteration"]:
        raise UserError("--cuda-graph-impl local: slime-ref captures whole steps only; "
                        "pass --cuda-graph-scope full_iteration")
    if getattr(args, "check_for_nan_in_loss_and_grad", True):
        raise UserError("--cuda-graph-scope full_iteration needs --no-check-for-nan-in-loss-and-grad "
                        "(Megatron-LM requires it with full-iteration CUDA graphs)")
    if args.cuda_graph_warmup_steps < 0:
        raise UserError("--cuda-graph-warmup-steps must be >= 0")
    if args.tensor_model_parallel_size != 1 or args.pipeline_model_parallel_size != 1:
        raise UserError("--cuda-graph-impl local needs --tensor-model-parallel-size 1 and "
                        "--pipeline-model-parallel-size 1 (data parallelism only)")
    if args.recompute_granularity:
        raise UserError("--cuda-graph-impl local cannot capture recomputed activations; "
                        "remove --recompute-granularity or the CUDA graph flags")
    if args.attention_dropout or args.hidden_dropout:
        raise UserError("--cuda-graph-impl local replays the same random numbers every step; "
                        "pass --attention-dropout 0 --hidden-dropout 0")
