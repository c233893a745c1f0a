"""Megatron's optimizer and its learning-rate and weight-decay schedule, built from slime's flags.

slime counts the schedule in samples, not iterations: every step advances it by the step's sample
count, so ``--lr-warmup-iters``, ``--lr-decay-iters`` and ``--lr-wsd-decay-iters`` are multiplied by
the global batch size here.
"""

from __future__ import annotations

from slime_ref.backends.megatron import optimizer_kernels


def build_optimizer(args, model, params_dtype, use_distributed_optimizer: bool):
    """``--optimizer`` (adam or sgd) over the DDP-wrapped ``model``, with slime's flags."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(
        optimizer=args.optimizer, lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        sgd_momentum=args.sgd_momentum, clip_grad=args.clip_grad, bf16=args.bf16, fp16=False,
        params_dtype=params_dtype, use_distributed_optimizer=use_distributed_optimizer,
    )
    optimizer_kernels.install()  # multi-tensor kernels instead of megatron's per-parameter loops
    # megatron's extra gloo groups serve only the dp_zero checkpoint format, which we do not write
    return get_megatron_optimizer(config, [model], use_gloo_process_groups=False)


def build_scheduler(args, optimizer, global_batch_size: int):
    """Megatron's OptimizerParamScheduler, counted in samples as slime counts it."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    gbs = global_batch_size
    if args.num_rollout:
        train_iters = max(1, args.num_rollout * args.rollout_batch_size * args.n_samples_per_prompt // gbs)
    else:  # --num-epoch: the run's length is known only to the data source
        train_iters = args.lr_decay_iters or 1
    decay_iters = args.lr_decay_iters or train_iters
    if args.lr_warmup_fraction is not None:
        warmup_steps = args.lr_warmup_fraction * decay_iters * gbs
    else:
        warmup_steps = args.lr_warmup_iters * gbs
    wd = args.weight_decay
    return OptimizerParamScheduler(
        optimizer,
        init_lr=args.lr_warmup_init,
        max_lr=args.lr,
        min_lr=args.min_lr,
        lr_warmup_steps=warmup_steps,
        lr_decay_steps=decay_iters * gbs,
        lr_decay_style=args.lr_decay_style,
        start_wd=args.start_weight_decay if args.start_weight_decay is not None else wd,
        end_wd=args.end_weight_decay if args.end_weight_decay is not None else wd,
        wd_incr_steps=train_iters * gbs,
        wd_incr_style=args.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=True,
        override_opt_param_scheduler=False,
        wsd_decay_steps=args.lr_wsd_decay_iters * gbs if args.lr_wsd_decay_iters else None,
        lr_wsd_decay_style=args.lr_wsd_decay_style,
    )
