"""The training actor on megatron-core (slime/backends/megatron_utils/actor.py, at reference size).

One ``MegatronActor`` runs in each training process (a Ray actor in the trainer, a spawned process
in tests). All ranks are constructed with the same flags and call the same methods in the same
order; the methods are collective.

``train(rollout_id, batch)`` takes the whole rollout's train data (slime's
``_convert_samples_to_train_data`` dict) on every rank and:

1. splits it into optimizer steps, micro-batches and data-parallel shares (``data.py``);
2. with a reference model (``--use-kl-loss`` or ``--kl-coef``), swaps the reference weights in from
   their CPU copy, scores the responses, and swaps the actor back;
3. scores the responses with the current weights: the old policy's log-probs (skipped with
   ``--use-rollout-logprobs``, or when a single on-policy step can reuse the training forward);
4. computes advantages and returns;
5. runs ``--num-steps-per-rollout`` optimizer steps of ``--global-batch-size`` samples.

``--loss-type sft_loss`` skips 2-4 and trains on the response tokens' log-likelihood.

With ``--advantage-estimator ppo`` a second group of these runs the critic (``args.role ==
"critic"``, see ``slime_ref.arguments.critic_args``): a model whose last layer projects to one value
per token. Its ``train`` scores the rollout (the old values), turns rewards and values into GAE
returns, trains on the clipped value loss and returns the old values, which the actor's ``train``
takes as ``values`` for its GAE advantages (slime's ``train_critic`` / ``external_data``).

Each part of a step runs inside ``actor.phase(name)``: a ``torch.profiler`` scope named
``slime_ref/<name>`` (pack, forward, log_probs, loss, metrics, optimizer, scheduler, advantages), so a
profile or trace shows where a step's time goes. ``bench/train_throughput.py`` replaces ``phase`` to
time the parts.
"""

from __future__ import annotations

import contextlib
import logging
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from slime_ref.backends.megatron import checkpoint as ckpt
from slime_ref.backends.megatron import initialize, optimizer_kernels
from slime_ref.backends.megatron.data import PackedMicroBatch, StepSchedule, pack_micro_batch, schedule_rollout
from slime_ref.backends.megatron.hf_weights import iter_hf_weight_buckets, load_hf_weights, save_hf_checkpoint, unwrap
from slime_ref.backends.megatron.layers import to_device
from slime_ref.backends.megatron.logprobs import response_log_probs, response_rows
from slime_ref.backends.megatron.megatron_flags import validate_megatron_args
from slime_ref.backends.megatron.micro_batch_losses import (
    advantages_and_returns,
    micro_batch_loss,
    value_micro_batch_loss,
)
from slime_ref.backends.megatron.model import build_model, read_hf_architecture, transformer_config
from slime_ref.backends.megatron.optimizer_setup import build_optimizer, build_scheduler
from slime_ref.backends.megatron.step_graphs import StepGraphs
from slime_ref.backends.megatron.weights_backup import WeightsBackup
from slime_ref.errors import UserError
from slime_ref.utils.hooks import load_function

logger = logging.getLogger(__name__)

# per-sample response tensors that travel with a micro-batch into the loss
_LOSS_KEYS = ("loss_masks", "advantages", "returns", "log_probs", "ref_log_probs", "rollout_log_probs", "values")


def profiler_scope(name: str):
    """The part ``name`` of a training step as a ``torch.profiler`` scope ``slime_ref/<name>``
    (recorded only while a profiler runs)."""
    return torch.profiler.record_function(f"slime_ref/{name}")


class MegatronActor:
    """Model, optimizer and checkpoints of one training rank.

    Args:
        args: flags parsed and validated by ``slime_ref.arguments`` with the group from
            ``arguments.add_megatron_arguments`` added.
        rank, world_size: this process's place in the training job (not needed when
            torch.distributed is already initialised).
        master_port: rendezvous port on ``master_addr`` (default: MASTER_PORT from the environment).
        with_ref: keep a reference model; default: when ``--use-kl-loss`` or ``--kl-coef`` asks for it.

    After construction, ``start_rollout_id`` is the first rollout to run and ``data_state`` the
    data-source state a resumed checkpoint carried (None for a fresh run).
    """

    def __init__(self, args, *, rank: int | None = None, world_size: int | None = None,
                 master_addr: str = "127.0.0.1", master_port: int | None = None, with_ref: bool | None = None):
        validate_megatron_args(args)
        if getattr(args, "cuda_graph_impl", "none") == "local" and not torch.cuda.is_available():
            raise UserError("--cuda-graph-impl local needs a CUDA GPU; remove the CUDA graph flags on CPU")
        self.args = args
        initialize.init_distributed(rank, world_size, master_addr, master_port,
                                    timeout_minutes=args.distributed_timeout_minutes)
        initialize.init_model_parallel(args)
        if not args.hf_checkpoint:
            raise UserError("--hf-checkpoint is required: the model is built from its config.json")
        self.arch = read_hf_architecture(args.hf_checkpoint)
        self.config = transformer_config(self.arch, args)
        if args.recompute_granularity:
            self.config.recompute_granularity = args.recompute_granularity
            self.config.recompute_method = args.recompute_method
            self.config.recompute_num_layers = args.recompute_num_layers
        self.dp_size = ps.get_data_parallel_world_size()
        self.role = getattr(args, "role", "actor")
        # --cuda-graph-impl local: the steps' forward-backward from CUDA graphs, on a stream of
        # their own that the DDP wrapper is built on as well (step_graphs.py says why)
        graphs = getattr(args, "cuda_graph_impl", "none") == "local"
        self.step_graphs = StepGraphs(args.cuda_graph_warmup_steps) if graphs else None
        with torch.cuda.stream(self.step_graphs.stream) if graphs else contextlib.nullcontext():
            self.model = self._wrap_ddp(
                build_model(self.arch, self.config, pre_process=ps.is_pipeline_first_stage(),
                            post_process=ps.is_pipeline_last_stage(), value_head=self.role == "critic")
            )
        if graphs:
            torch.cuda.current_stream().wait_stream(self.step_graphs.stream)
        self.optimizer = build_optimizer(args, self.model, self.config.params_dtype, self.use_distributed_optimizer)
        self.scheduler = build_scheduler(args, self.optimizer, self.global_batch_size)
        self.device = next(self.model.parameters()).device
        self.weights = WeightsBackup(self.model)
        self.phase = profiler_scope  # the context each part of a step runs in (see the module docstring)

        if with_ref is None:
            with_ref = args.use_kl_loss or args.kl_coef != 0
        self.data_state: dict | None = None
        self.start_rollout_id = self._load_initial_weights(with_ref)
        if torch.cuda.is_available():
            # after loading: a checkpoint's param groups bring the fused flag they were saved with
            optimizer_kernels.use_fused_adam(self.optimizer)

    # -----------------------------------------------------------------------------------------
    # construction

    def _wrap_ddp(self, model):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=self.args.accumulate_allreduce_grads_in_fp32 or not self.args.bf16,
            overlap_grad_reduce=False,
            use_distributed_optimizer=self.use_distributed_optimizer,
        )
        return DistributedDataParallel(config=self.config, ddp_config=ddp_config, module=model)

    @property
    def use_distributed_optimizer(self) -> bool:
        return bool(self.args.use_distributed_optimizer) or ps.get_data_parallel_world_size() > 1

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step (slime_ref.arguments derives it from --num-steps-per-rollout)."""
        if not self.args.global_batch_size:
            raise UserError("set --global-batch-size (samples per optimizer step) or --num-steps-per-rollout")
        return self.args.global_batch_size

    def _load_weights_from(self, path: str, flag: str) -> None:
        """HF directory or checkpoint (weights only) into the model; ``flag`` named ``path``."""
        found = ckpt.find_checkpoint(path) if ckpt.is_megatron_checkpoint(path) else None
        if found is not None:
            ckpt.load_checkpoint(found, unwrap(self.model), load_optimizer=False, load_rng=False,
                                 flag=f"{flag} {path}")
        elif (Path(path) / "config.json").is_file():
            load_hf_weights(self.model, self.arch, path)
        else:
            raise UserError(f"{path}: neither an HF model directory nor a checkpoint (no tracker / metadata.json)")

    def _load_initial_weights(self, with_ref: bool) -> int:
        """Reference copy, then the actor's weights: resume from --load, else start from the initial model.

        Returns the first rollout id to run.
        """
        args = self.args
        if args.ref_load:
            initial, initial_flag = args.ref_load, "--ref-load"
        else:
            initial, initial_flag = args.hf_checkpoint, "--hf-checkpoint"
        if with_ref:
            self._load_weights_from(initial, initial_flag)
            self.weights.backup("ref")
        # a --load directory with checkpoints but no usable tracker is refused, never trained over from scratch
        resume = ckpt.find_checkpoint(args.load, args.ckpt_step) if args.load and Path(args.load).is_dir() else None
        if resume is not None and resume.name != ckpt.RELEASE:
            loaded = ckpt.load_checkpoint(
                resume, unwrap(self.model), self.optimizer, self.scheduler,
                load_optimizer=not args.no_load_optim, load_rng=not args.no_load_rng, flag=f"--load {args.load}",
            )
            self.data_state = loaded.data_state
            return int(loaded.rollout_id) + 1
        if resume is not None or (args.load and (Path(args.load) / "config.json").is_file()):
            source = args.load  # a converted (release) checkpoint or an HF directory: fine-tune from it
        else:
            source = initial  # --load names an empty save directory: a fresh run
        if not (with_ref and source == initial):
            self._load_weights_from(source, "--load" if source == args.load else initial_flag)
        self.optimizer.reload_model_params()
        return 0

    # -----------------------------------------------------------------------------------------
    # forward passes

    @contextmanager
    def _weights(self, tag: str):
        """Run with the ``tag`` weights in the model, then put the actor's back.

        The actor's copy is taken here, at the swap, so runs without a reference model never
        copy their weights to the host.
        """
        if tag == "actor":
            yield
            return
        self.weights.backup("actor")
        self.weights.restore(tag)
        try:
            yield
        finally:
            self.weights.restore("actor")

    def _forward(self, mb: PackedMicroBatch):
        with self.phase("forward"):
            return self.model(mb.tokens, None, None, packed_seq_params=mb.packed)

    def _score(self, mb: PackedMicroBatch, logits, temperature: float | None = None):
        """(log-probs, entropies) of each response token, with the rollout's sampling temperature."""
        with self.phase("log_probs"):
            return response_log_probs(
                logits, mb.tokens, mb.total_lengths, mb.response_lengths,
                vocab_size=self.arch.vocab_size,
                temperature=self.args.rollout_temperature if temperature is None else temperature,
                chunk_rows=self.args.log_probs_chunk_size,
            )

    def _pack(self, rollout: dict, step: StepSchedule, keys: tuple[str, ...] = ()) -> list[PackedMicroBatch]:
        """The step's micro-batches of this rank, packed (``keys``: per-sample tensors to carry along)."""
        with self.phase("pack"):
            return [pack_micro_batch(rollout, m, self.device, keys) for m in step.micro_batches]

    def _run_schedule(self, micro_batches: list[PackedMicroBatch], loss_fn, *, forward_only: bool) -> list[dict]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            return self._forward(mb), partial(loss_fn, mb)

        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=[self.model],
            num_microbatches=len(micro_batches),
            seq_length=max(mb.tokens.shape[1] for mb in micro_batches),
            micro_batch_size=1,
            forward_only=forward_only,
        )

    @torch.no_grad()
    def compute_log_probs(
        self, rollout: dict, schedule: list[StepSchedule], tag: str = "actor"
    ) -> dict[int, torch.Tensor]:
        """Response log-probs of this rank's samples under the ``tag`` weights (eval mode).

        Returns {sample index: [R_i] fp32 tensor} on the last pipeline stage, {} elsewhere.
        """

        def collect(mb, logits):
            log_probs, _ = self._score(mb, logits)
            return logits.new_zeros(()), {"indices": mb.sample_indices, "log_probs": log_probs}

        out: dict[int, torch.Tensor] = {}
        self.model.eval()
        with self._weights(tag):
            for step in schedule:
                mbs = self._pack(rollout, step)
                for result in self._run_schedule(mbs, collect, forward_only=True):
                    out.update(zip(result["indices"], result["log_probs"]))
        self.model.train()
        return out

    def _response_values(self, mb: PackedMicroBatch, output) -> list[torch.Tensor]:
        """The critic's value of each response token's state (the rows that score the token)."""
        values = output.reshape(-1).float()
        rows = response_rows(mb.total_lengths, mb.response_lengths, device=values.device)
        return list(values.index_select(0, rows).split(mb.response_lengths))

    @torch.no_grad()
    def compute_values(self, rollout: dict, schedule: list[StepSchedule]) -> dict[int, torch.Tensor]:
        """The critic's values of this rank's samples (eval mode): {sample index: [R_i]} on the
        last pipeline stage, {} elsewhere."""

        def collect(mb, output):
            return output.new_zeros(()), {"indices": mb.sample_indices, "values": self._response_values(mb, output)}

        out: dict[int, torch.Tensor] = {}
        self.model.eval()
        for step in schedule:
            for result in self._run_schedule(self._pack(rollout, step), collect, forward_only=True):
                out.update(zip(result["indices"], result["values"]))
        self.model.train()
        return out

    @torch.no_grad()
    def score_sequence(self, tokens: list[int], response_length: int) -> list[float]:
        """Log-probs (temperature 1) of the last ``response_length`` of ``tokens`` under the actor's
        weights; collective, and every rank returns them. Engines score the same way
        (``/generate`` with ``logprob_start_len``), so after a weight sync the two must agree."""
        rollout = self._to_tensors({"tokens": [tokens], "response_lengths": [response_length],
                                    "loss_masks": [[1] * response_length]})
        mb = pack_micro_batch(rollout, [0], self.device)

        def collect(mb, logits):
            log_probs, _ = self._score(mb, logits, temperature=1.0)
            return logits.new_zeros(()), {"log_probs": log_probs}

        self.model.eval()
        results = self._run_schedule([mb], collect, forward_only=True)
        self.model.train()
        values = [float(x) for x in results[0]["log_probs"][0].tolist()] if results else None
        if ps.get_pipeline_model_parallel_world_size() > 1:
            box = [values]
            group = ps.get_pipeline_model_parallel_group()
            dist.broadcast_object_list(box, src=dist.get_process_group_ranks(group)[-1], group=group)
            values = box[0]
        return values

    def offload(self) -> None:
        """Colocated runs, before the engines generate: return cached device memory to the driver.

        Weights and optimizer state stay where they are; moving them off the device as slime does
        needs torch_memory_saver, which slime-ref does not use. On CPU there is nothing to free."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Colocated runs, before training: nothing was moved by :meth:`offload`."""

    # -----------------------------------------------------------------------------------------
    # training

    def _to_tensors(self, batch: dict) -> dict:
        """The train-data dict with per-sample tensors on this rank's device."""
        rollout = dict(batch)
        n = len(batch["tokens"])
        rollout["tokens"] = [torch.as_tensor(t, dtype=torch.long) for t in batch["tokens"]]
        rollout["response_lengths"] = [int(r) for r in batch["response_lengths"]]
        masks = batch.get("loss_masks") or [[1] * r for r in rollout["response_lengths"]]
        # each sample's weight in a per-token mean, counted on the host (no device syncs)
        rollout["loss_token_counts"] = [max(int(sum(m)), 1) for m in masks]
        rollout["loss_masks"] = self._per_sample_on_device(masks)
        for i in range(n):
            if rollout["loss_masks"][i].numel() != rollout["response_lengths"][i]:
                raise UserError(f"sample {i}: loss mask has {rollout['loss_masks'][i].numel()} entries for "
                                f"{rollout['response_lengths'][i]} response tokens")
            if rollout["response_lengths"][i] >= rollout["tokens"][i].numel():
                raise UserError(f"sample {i}: the response must leave at least one prompt token")
        if batch.get("rollout_log_probs") is not None:
            rollout["rollout_log_probs"] = self._per_sample_on_device(batch["rollout_log_probs"])
        return rollout

    def _per_sample_on_device(self, values: list) -> list[torch.Tensor]:
        """Per-sample fp32 tensors on this rank's device, moved in one copy (views of one buffer)."""
        host = [torch.as_tensor(v, dtype=torch.float32) for v in values]
        if not host:
            return []
        return list(to_device(torch.cat(host), self.device).split([t.numel() for t in host]))

    def _schedule(self, rollout: dict) -> list[StepSchedule]:
        return schedule_rollout(
            [int(t.numel()) for t in rollout["tokens"]],
            rollout["loss_token_counts"],
            global_batch_size=self.global_batch_size,
            dp_rank=ps.get_data_parallel_rank(),
            dp_size=self.dp_size,
            micro_batch_size=self.args.micro_batch_size,
            use_dynamic_batch_size=self.args.use_dynamic_batch_size,
            max_tokens_per_gpu=self.args.max_tokens_per_gpu,
            workload=self._forward_flops if self.args.balance_data else None,
        )

    def _forward_flops(self, length: int) -> float:
        """--balance-data's cost of one sequence, from the HF config so every rank agrees: the
        per-token matmuls (2 FLOPs per weight) plus causal attention scores and values
        (2 * L^2 * heads * head_dim per layer)."""
        h = self.arch
        attn_width = h.num_attention_heads * h.head_dim
        kv_width = h.num_key_value_heads * h.head_dim
        per_layer = h.hidden_size * (attn_width + 2 * kv_width) + attn_width * h.hidden_size \
            + 3 * h.hidden_size * h.intermediate_size
        weights = h.num_layers * per_layer + h.vocab_size * h.hidden_size
        return 2.0 * length * weights + 2.0 * length * length * attn_width * h.num_layers

    def train(self, rollout_id: int, batch: dict, values: dict | None = None) -> list[dict[str, float]]:
        """Train on one rollout (see the module docstring). Returns each optimizer step's metrics.

        The metrics are slime's ``train/*`` names, reduced over all ranks; every rank returns them.
        The last step's also carry slime's timers of this rank (host wall seconds): ``perf/
        data_preprocess_time``, ``perf/ref_log_probs_time`` and ``perf/log_probs_time`` (when those
        passes run), ``perf/actor_train_time`` (the optimizer steps, which end by reading their
        metrics, so device work is included) and ``perf/actor_train_tok_per_s`` (this rank's tokens).
        """
        args = self.args
        start = time.perf_counter()
        with self.phase("pack"):
            rollout = self._to_tensors(batch)
            schedule = self._schedule(rollout)
        timers = {"perf/data_preprocess_time": time.perf_counter() - start}
        if self.role == "critic":
            return self._train_critic(rollout_id, rollout, schedule, timers)
        if values is not None:  # the critic's values of every sample, by index (ppo)
            n = len(rollout["tokens"])
            rollout["values"] = [None if values.get(i) is None else
                                 torch.as_tensor(values[i], dtype=torch.float32, device=self.device)
                                 for i in range(n)]
        if args.loss_type == "policy_loss" and args.compute_advantages_and_returns:
            self._prepare_policy_data(rollout, schedule, timers)
        if getattr(args, "rollout_data_postprocess_path", None):
            # slime's hook point: this rank's rollout data, log-probs and advantages in, before training
            postprocess = load_function(args.rollout_data_postprocess_path, "--rollout-data-postprocess-path")
            postprocess(args, rollout_id, rollout)
        start = time.perf_counter()
        metrics = self._train_steps(rollout_id, rollout, schedule)
        timers["perf/actor_train_time"] = time.perf_counter() - start
        trained = sum(int(rollout["tokens"][i].numel()) for step in schedule for mb in step.micro_batches for i in mb)
        timers["perf/actor_train_tok_per_s"] = trained / max(timers["perf/actor_train_time"], 1e-9)
        metrics[-1].update(timers)
        if args.save_debug_train_data:
            save_debug_train_data(args.save_debug_train_data, rollout_id, torch.distributed.get_rank(), rollout)
        return metrics

    def _train_steps(self, rollout_id: int, rollout: dict, schedule: list[StepSchedule]) -> list[dict[str, float]]:
        """The optimizer steps of one rollout (actor or critic: the loss follows the model's role)."""
        self.model.train()
        metrics = []
        for step_id, step in enumerate(schedule):
            step_metrics = self._train_step(rollout, step)
            step_metrics["train/step"] = rollout_id * len(schedule) + step_id
            metrics.append(step_metrics)
        return metrics

    def _train_critic(self, rollout_id: int, rollout: dict, schedule: list[StepSchedule],
                      timers: dict[str, float]) -> tuple[list[dict[str, float]], dict[int, list[float]]]:
        """slime's ``train_critic``: old values, GAE returns, value-loss steps. Returns (each step's
        metrics, this rank's old values by sample index) -- the values feed the actor's advantages."""
        n = len(rollout["tokens"])
        start = time.perf_counter()
        old_values = self.compute_values(rollout, schedule)
        timers["perf/critic_values_time"] = time.perf_counter() - start
        if ps.is_pipeline_last_stage():
            mine = [i for step in schedule for mb in step.micro_batches for i in mb]
            rollout["values"] = _by_index(old_values, n)
            with self.phase("advantages"):
                _, returns = advantages_and_returns(self.args, rollout, mine,
                                                    process_group=ps.get_data_parallel_group())
            rollout["returns"] = [None] * n
            for i, ret in zip(mine, returns):
                rollout["returns"][i] = ret
        start = time.perf_counter()
        metrics = self._train_steps(rollout_id, rollout, schedule)
        timers["perf/critic_train_time"] = time.perf_counter() - start
        metrics[-1].update(timers)
        return metrics, {i: v.tolist() for i, v in old_values.items()}

    def _prepare_policy_data(self, rollout: dict, schedule: list[StepSchedule], timers: dict[str, float]) -> None:
        """ref/old log-probs and advantages of this rank's samples, stored per sample in ``rollout``."""
        args = self.args
        n = len(rollout["tokens"])
        if "ref" in self.weights.tags:
            start = time.perf_counter()
            rollout["ref_log_probs"] = _by_index(self.compute_log_probs(rollout, schedule, "ref"), n)
            timers["perf/ref_log_probs_time"] = time.perf_counter() - start
        # one on-policy step can take the old log-probs from its own (detached) training forward
        reuse_training_forward = len(schedule) == 1 and args.kl_coef == 0 and args.advantage_estimator != "gspo"
        if not args.use_rollout_logprobs and not reuse_training_forward:
            start = time.perf_counter()
            rollout["log_probs"] = _by_index(self.compute_log_probs(rollout, schedule, "actor"), n)
            timers["perf/log_probs_time"] = time.perf_counter() - start
        if not ps.is_pipeline_last_stage():
            return
        mine = [i for step in schedule for mb in step.micro_batches for i in mb]
        with self.phase("advantages"):
            advantages, returns = advantages_and_returns(
                args, rollout, mine, process_group=ps.get_data_parallel_group()
            )
        rollout["advantages"], rollout["returns"] = [None] * n, [None] * n
        for i, adv, ret in zip(mine, advantages, returns):
            rollout["advantages"][i], rollout["returns"][i] = adv, ret

    def _train_step(self, rollout: dict, step: StepSchedule) -> dict[str, float]:
        from megatron.core.distributed import finalize_model_grads

        args = self.args
        num_mb = len(step.micro_batches)
        scale = num_mb * self.dp_size  # undo megatron's 1/num_microbatches and DDP's 1/dp: partials add up

        def loss_fn(mb, logits):
            if self.role == "critic":  # logits are the value head's output
                with self.phase("loss"):
                    loss, metrics = value_micro_batch_loss(args, mb, self._response_values(mb, logits), step)
                return loss * scale, metrics
            log_probs, entropy = self._score(mb, logits)
            with self.phase("loss"):
                loss, metrics = micro_batch_loss(args, mb, log_probs, entropy, step)
            return loss * scale, metrics

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        self.config.grad_scale_func = self.optimizer.scale_loss
        # with CUDA graphs the data-parallel reduce runs after the (captured) schedule, outside the graph
        self.config.finalize_model_grads_func = finalize_model_grads if self.step_graphs is None else None
        mbs = self._pack(rollout, step, _LOSS_KEYS)
        if self.step_graphs is None:
            results = self._run_schedule(mbs, loss_fn, forward_only=False)
        else:
            results = self.step_graphs.run(mbs, step, lambda m: self._run_schedule(m, loss_fn, forward_only=False))
            finalize_model_grads([self.model], None)
        # read the metrics before the optimizer runs: the read waits for the backward only (the
        # optimizer's gradient-norm read waits there anyway), and the optimizer's kernels then
        # overlap whatever the host does next instead of being waited for
        with self.phase("metrics"):
            metrics = self._reduce_metrics(results)
        lr = float(self.optimizer.param_groups[0]["lr"])  # the rate this step uses
        with self.phase("optimizer"):
            update_ok, grad_norm, _ = self.optimizer.step()
        if not update_ok:
            raise RuntimeError("optimizer step failed (non-finite gradients)")
        with self.phase("scheduler"):
            self.scheduler.step(increment=step.num_samples)
        metrics["train/grad_norm"] = float(grad_norm)
        metrics["train/lr"] = lr
        return metrics

    def _reduce_metrics(self, results: list[dict]) -> dict[str, float]:
        """Sum the micro-batch partials over micro-batches and DP ranks; share from the last PP stage."""
        payload = None
        if ps.is_pipeline_last_stage():
            names = sorted(results[0])
            sums = torch.stack([sum(r[k].float() for r in results) for k in names]).to(self.device)
            if self.dp_size > 1:
                dist.all_reduce(sums, group=ps.get_data_parallel_group())
            payload = {f"train/{k}": float(v) for k, v in zip(names, sums.tolist())}
        if ps.get_pipeline_model_parallel_world_size() > 1:
            box = [payload]
            ranks = dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group())
            dist.broadcast_object_list(box, src=ranks[-1], group=ps.get_pipeline_model_parallel_group())
            payload = box[0]
        return payload

    # -----------------------------------------------------------------------------------------
    # weights out, checkpoints

    def iter_hf_weights(self, bucket_bytes: int | None = None):
        """The actor's weights as HF-named full tensors, in buckets (collective; see hf_weights.py)."""
        return iter_hf_weight_buckets(self.model, self.arch, bucket_bytes or self.args.update_weight_buffer_size)

    def save_hf(self, out_dir: str | Path) -> None:
        save_hf_checkpoint(self.model, self.arch, self.args.hf_checkpoint, out_dir, self.args.update_weight_buffer_size)

    def save(self, rollout_id: int, data_state: dict | None = None) -> Path:
        """Checkpoint after ``rollout_id`` (and ``--save-hf``); ``data_state`` is the data source's state."""
        if not self.args.save:
            raise UserError("saving needs --save DIR")
        path = ckpt.save_checkpoint(self.args.save, rollout_id, unwrap(self.model), self.optimizer, self.scheduler,
                                    data_state=data_state, save_optimizer=not self.args.no_save_optim)
        if self.args.save_hf:
            self.save_hf(self.args.save_hf.format(rollout_id=rollout_id))
        return path


# what --save-debug-train-data keeps of a rollout's train data: per-sample lists (None: not this rank's)
DEBUG_TRAIN_KEYS = ("tokens", "response_lengths", "loss_masks", "rewards", "raw_reward", "sample_indices",
                    "rollout_log_probs", "ref_log_probs", "log_probs", "advantages", "returns", "values")


def save_debug_train_data(path_template: str, rollout_id: int, rank: int, rollout: dict) -> None:
    """slime's --save-debug-train-data: this rank's train data of one rollout, on the host, atomically."""
    import io

    from slime_ref.utils.fileio import atomic_write_bytes

    def host(value):
        if isinstance(value, torch.Tensor):
            return value.detach().cpu()
        if isinstance(value, list):
            return [host(v) for v in value]
        return value

    data = {key: host(rollout[key]) for key in DEBUG_TRAIN_KEYS if key in rollout}
    buffer = io.BytesIO()
    torch.save({"rollout_id": rollout_id, "rank": rank, "rollout_data": data}, buffer)
    atomic_write_bytes(path_template.format(rollout_id=rollout_id, rank=rank), buffer.getvalue())


def _by_index(values: dict[int, torch.Tensor], n: int) -> list[torch.Tensor | None]:
    return [values.get(i) for i in range(n)]

