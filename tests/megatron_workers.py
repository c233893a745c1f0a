"""Spawn megatron worker processes for tests: gloo over 127.0.0.1, a free port, results via files.

Megatron's parallel state and the CPU patches are process-wide, so every test that builds a
Megatron model runs it in freshly spawned processes, never in the pytest process.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

# every rollout in these tests is 8 samples: 4 prompts x 2 samples
ROLLOUT_FLAGS = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--num-rollout", "4"]


def make_args(argv: list[str]) -> argparse.Namespace:
    """slime-ref's flags plus the Megatron group, parsed and validated as the trainer does."""
    from slime_ref.arguments import build_parser, validate_args
    from slime_ref.backends.megatron.megatron_flags import add_megatron_arguments

    parser = add_megatron_arguments(build_parser())
    return validate_args(parser.parse_args([*ROLLOUT_FLAGS, *argv]))


def synthetic_batch(n: int, seed: int, vocab: int = 100) -> dict:
    """A rollout's train data with random prompts/responses (token 0, the tiny model's pad, excluded)."""
    g = torch.Generator().manual_seed(seed)
    tokens, response_lengths, masks, rewards = [], [], [], []
    for _ in range(n):
        prompt = int(torch.randint(3, 9, (1,), generator=g))
        response = int(torch.randint(2, 10, (1,), generator=g))
        tokens.append(torch.randint(1, vocab, (prompt + response,), generator=g).tolist())
        response_lengths.append(response)
        mask = [1] * response
        mask[-1] = int(torch.rand(1, generator=g) > 0.3)  # some masked tokens
        masks.append(mask)
        rewards.append(float(torch.randn(1, generator=g)))
    return dict(tokens=tokens, response_lengths=response_lengths, loss_masks=masks, rewards=rewards,
                raw_reward=list(rewards), truncated=[0] * n, sample_indices=list(range(n)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, fn, world, port, kwargs, out_dir):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    result = fn(rank, world, port, **kwargs)
    with open(Path(out_dir) / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(result, f)


def run_workers(fn, world: int, timeout: float = 600, **kwargs) -> list:
    """Run ``fn(rank, world, port, **kwargs)`` in ``world`` spawned processes; return each rank's result."""
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(_entry, args=(fn, world, free_port(), kwargs, out_dir), nprocs=world,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{fn.__name__} did not finish in {timeout} s")
        finally:
            for p in ctx.processes:  # only the processes started here
                if p.is_alive():
                    p.kill()
                    p.join()
        results = []
        for rank in range(world):
            with open(Path(out_dir) / f"rank{rank}.pkl", "rb") as f:
                results.append(pickle.load(f))
        return results


# ---------------------------------------------------------------------------------------------
# workers (module level, so spawned processes can import them)

PACKED_LENGTHS = [7, 13, 5]


def _hf_logits(model_dir, seqs):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        return torch.cat([hf(s[None]).logits[0] for s in seqs])


def logits_vs_hf(actor, model_dir, vocab) -> float | None:
    """Max |megatron - HF| over the logits of a pack of three sequences (None off TP rank 0 / PP>1)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from slime_ref.backends.megatron.layers import PackedSequence

    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(1, vocab, (n,), generator=g) for n in PACKED_LENGTHS]
    device = next(actor.model.parameters()).device
    actor.model.eval()
    with torch.no_grad():
        logits = actor.model(torch.cat(seqs)[None].to(device), None, None,
                             packed_seq_params=PackedSequence.from_lengths(PACKED_LENGTHS, device))[0]
    actor.model.train()
    tp = ps.get_tensor_model_parallel_world_size()
    if tp > 1:
        parts = [torch.empty_like(logits) for _ in range(tp)]
        dist.all_gather(parts, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
        logits = torch.cat(parts, dim=-1)
    if dist.get_rank() != 0:
        return None
    return (logits[:, :vocab].float().cpu() - _hf_logits(model_dir, seqs)).abs().max().item()


def export_vs_safetensors(actor, model_dir, bucket_bytes) -> dict | None:
    """Export in small buckets; on rank 0 compare with the HF files byte for byte."""
    import torch.distributed as dist
    from safetensors.torch import load_file

    buckets = list(actor.iter_hf_weights(bucket_bytes))
    if dist.get_rank() != 0:
        return None
    source = load_file(f"{model_dir}/model.safetensors")
    exported = {name: t.cpu() for bucket in buckets for name, t in bucket}
    sizes = [sum(t.numel() * t.element_size() for _, t in b) for b in buckets]
    return {
        "same_names": set(exported) == set(source) and sum(len(b) for b in buckets) == len(source),
        "identical": all(torch.equal(exported[k], source[k]) for k in source if k in exported),
        "num_buckets": len(buckets),
        "oversized_multi_tensor_buckets": sum(1 for b, s in zip(buckets, sizes) if s > bucket_bytes and len(b) > 1),
    }


def parallel_worker(rank, world, port, model_dir, argv):
    """Logits, export, step-0 invariants and a short training run of the tiny model under argv."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from slime_ref.backends.megatron.actor import MegatronActor

    args = make_args(["--hf-checkpoint", model_dir, "--use-kl-loss", "--kl-loss-coef", "0.1", "--kl-loss-type", "k2",
                      "--entropy-coef", "0.01", *argv])
    actor = MegatronActor(args, rank=rank, world_size=world, master_port=port)
    out = {"ranks": (ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(),
                     ps.get_data_parallel_rank())}
    if ps.get_pipeline_model_parallel_world_size() == 1:
        out["logits_max_diff"] = logits_vs_hf(actor, model_dir, actor.arch.vocab_size)
    out["export"] = export_vs_safetensors(actor, model_dir, bucket_bytes=400_000)

    batch = synthetic_batch(8, seed=0)
    rollout = actor._to_tensors(batch)
    schedule = actor._schedule(rollout)
    ref = actor.compute_log_probs(rollout, schedule, "ref")
    current = actor.compute_log_probs(rollout, schedule, "actor")
    out["num_scored"] = len(current)
    out["ref_equals_actor"] = set(ref) == set(current) and all(torch.equal(ref[i], current[i]) for i in ref)
    out["metrics"] = [actor.train(0, batch), actor.train(1, synthetic_batch(8, seed=1))]

    # the same actor continues with the supervised loss (the quick start's warm-up)
    sft_batch = synthetic_batch(8, seed=2)
    sft_rollout = actor._to_tensors(sft_batch)
    scored = actor.compute_log_probs(sft_rollout, actor._schedule(sft_rollout))
    if len(scored) == 8:  # the whole rollout on this rank: the first step's NLL can be computed here
        masks = sft_rollout["loss_masks"]
        out["sft_expected_first_loss"] = -sum(
            float((scored[i] * masks[i]).sum() / masks[i].sum().clamp(min=1)) for i in range(4)) / 4
    actor.args.loss_type = "sft_loss"
    out["sft_metrics"] = actor.train(2, sft_batch)

    if world == 1:
        # --use-rollout-logprobs with the engine's log-probs equal to the trainer's: nothing is off-policy
        rl_batch = synthetic_batch(8, seed=3)
        rl_rollout = actor._to_tensors(rl_batch)
        scored = actor.compute_log_probs(rl_rollout, actor._schedule(rl_rollout))
        rl_batch["rollout_log_probs"] = [scored[i].tolist() for i in range(8)]
        actor.args.loss_type, actor.args.use_rollout_logprobs = "policy_loss", True
        out["rollout_logprob_metrics"] = actor.train(3, rl_batch)
    dist.barrier()
    return out


def architecture_worker(rank, world, port, model_dirs):
    """For each HF model dir: logits vs HF and bit-identical export, at TP=world (no actor)."""
    import types

    from slime_ref.backends.megatron import initialize
    from slime_ref.backends.megatron.hf_weights import load_hf_weights
    from slime_ref.backends.megatron.model import build_model, read_hf_architecture, transformer_config

    initialize.init_distributed(rank, world, master_port=port)
    args = make_args(["--global-batch-size", "4", "--tensor-model-parallel-size", str(world)])
    initialize.init_model_parallel(args)
    out = {}
    for model_dir in model_dirs:
        arch = read_hf_architecture(model_dir)
        model = build_model(arch, transformer_config(arch, args), pre_process=True, post_process=True)
        load_hf_weights(model, arch, model_dir)
        shim = types.SimpleNamespace(model=model, iter_hf_weights=lambda b, m=model, a=arch: _buckets(m, a, b))
        out[model_dir] = {
            "logits_max_diff": logits_vs_hf(shim, model_dir, arch.vocab_size),
            "export": export_vs_safetensors(shim, model_dir, bucket_bytes=1 << 30),
        }
    return out


def _buckets(model, arch, bucket_bytes):
    from slime_ref.backends.megatron.hf_weights import iter_hf_weight_buckets

    return iter_hf_weight_buckets(model, arch, bucket_bytes)


def adam_summary(optimizer) -> dict:
    """How the torch Adam inside a megatron optimizer runs: fused or not, and where its step counts live."""
    from slime_ref.backends.megatron.optimizer_kernels import torch_adam_optimizers

    inner = torch_adam_optimizers(optimizer)
    return {"fused": {bool(g["fused"]) for o in inner for g in o.param_groups},
            "steps": {(str(s["step"].device), float(s["step"])) for o in inner for s in o.state.values()}}


def resume_worker(rank, world, port, model_dir, argv, stop, crash_marker=None, crash_at=None):
    """Train rollouts start..stop-1 (saving after each when --save is given); return losses and resume info.

    With ``crash_at``, the save of that rollout writes its files, leaves ``crash_marker`` and hangs
    before completing, so that a test can SIGKILL the job mid-save.
    """
    import torch.distributed as dist

    from slime_ref.backends.megatron.actor import MegatronActor

    if crash_at is not None:
        from slime_ref.backends.megatron import checkpoint

        original = checkpoint._write  # every file of a checkpoint, into its .partial directory

        def write_then_hang(state, directory):
            original(state, directory)
            if f"iter_{crash_at:07d}" in str(directory):
                dist.barrier()
                if rank == 0:
                    Path(crash_marker).write_text("saving")
                while True:
                    time.sleep(1)

        checkpoint._write = write_then_hang

    args = make_args(["--hf-checkpoint", model_dir, *argv])
    actor = MegatronActor(args, rank=rank, world_size=world, master_port=port)
    out = {"start": actor.start_rollout_id, "data_state": actor.data_state, "losses": {},
           "adam": adam_summary(actor.optimizer)}
    for rollout_id in range(actor.start_rollout_id, stop):
        metrics = actor.train(rollout_id, synthetic_batch(8, seed=rollout_id))
        out["losses"][rollout_id] = [m["train/loss"] for m in metrics]
        out.setdefault("lrs", []).extend(m["train/lr"] for m in metrics)
        if args.save:
            actor.save(rollout_id, data_state={"next_offset": rollout_id + 1})
    return out


class HostReads:
    """Counts reads of tensor values by the host (``.item()``, ``.tolist()``, ``bool(t)``, ...).

    On a GPU each of them waits until the device has computed the value: the host stops issuing
    work and the device then idles while it catches up. The methods are wrapped on the Tensor class,
    so calls from autograd backward functions count too (a TorchFunctionMode does not see those).
    """

    NAMES = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__")

    def __enter__(self):
        self.counts: dict[str, int] = {}
        self._inside = 0  # a torch function mode (cpu_compat's) calls the wrapper again: count once
        self._own = {name: torch.Tensor.__dict__.get(name) for name in self.NAMES}
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _name=name, _original=original, **kwargs):
                if not self._inside:
                    self.counts[_name] = self.counts.get(_name, 0) + 1
                self._inside += 1
                try:
                    return _original(tensor, *args, **kwargs)
                finally:
                    self._inside -= 1

            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc):
        for name, own in self._own.items():
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)


def host_reads_worker(rank, world, port, model_dir):
    """Host reads of tensor values in one optimizer step, by loss type and number of micro-batches."""
    from slime_ref.backends.megatron.actor import MegatronActor
    from slime_ref.backends.megatron.optimizer_kernels import use_fused_adam

    actor = MegatronActor(make_args(["--hf-checkpoint", model_dir, "--global-batch-size", "8", "--lr", "1e-3",
                                     "--attention-dropout", "0", "--hidden-dropout", "0"]),
                          rank=rank, world_size=world, master_port=port)
    use_fused_adam(actor.optimizer)  # as on GPU: torch's CPU Adam reads each step count on the host
    batch = synthetic_batch(8, seed=0)
    out = {}
    for loss_type in ("sft_loss", "policy_loss"):
        for micro_batch_size in (8, 2):
            actor.args.loss_type, actor.args.micro_batch_size = loss_type, micro_batch_size
            actor.train(0, batch)  # the first step builds optimizer state; count a later one
            with HostReads() as reads:
                actor.train(1, batch)
            out[loss_type, micro_batch_size] = reads.counts
    return out


def load_and_score_worker(rank, world, port, model_dir, argv):
    """Start an actor from argv's --load and compare its logits with the HF model's."""
    from slime_ref.backends.megatron.actor import MegatronActor

    actor = MegatronActor(make_args(["--hf-checkpoint", model_dir, *argv]), rank=rank, world_size=world,
                          master_port=port)
    return {"start": actor.start_rollout_id, "logits_max_diff": logits_vs_hf(actor, model_dir, actor.arch.vocab_size)}


if __name__ == "__main__":
    # python megatron_workers.py crash MODEL_DIR SAVE_DIR MARKER CRASH_AT: a 2-process job killed by the caller
    import sys

    _, _, model_dir, save_dir, marker, crash_at = sys.argv
    run_workers(resume_worker, 2, model_dir=model_dir, stop=int(crash_at) + 2, crash_marker=marker,
                crash_at=int(crash_at), argv=["--save", save_dir, "--load", save_dir, *sys.argv[0:0],
                                              *__import__("json").loads(os.environ["RESUME_ARGV"])])


def tp_log_probs_worker(rank, world, port):
    """Log-probs, entropies and logit gradients of one vocabulary split over TP ranks, in both layouts
    (dense: every row, one gradient kernel; selected rows in chunks); each rank returns its own."""
    from megatron.core import parallel_state as ps

    from slime_ref.backends.megatron import initialize
    from slime_ref.backends.megatron.logprobs import vocab_parallel_log_probs

    initialize.init_distributed(rank, world, master_port=port)
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    try:
        g = torch.Generator().manual_seed(0)
        full = 3 * torch.randn(12, 2 * 24, generator=g)  # 45 real columns, 3 of padding on the last rank
        rows = torch.tensor([1, 2, 3, 7, 8, 11])
        targets = torch.randint(0, 45, (6,), generator=g)
        weights = torch.randn(6, generator=g)
        out = {}
        for dense in (False, True):
            local = full[:, rank * 24:(rank + 1) * 24].clone().requires_grad_()
            log_prob, entropy = vocab_parallel_log_probs(local, rows, targets, vocab_size=45, temperature=0.8,
                                                         chunk_rows=4, dense=dense)
            ((log_prob * weights).sum() + entropy.sum()).backward()
            out[dense] = (log_prob.detach(), entropy.detach(), local.grad)
        return out
    finally:
        initialize.destroy()


def phases_worker(rank, world, port, model_dir):
    """The phases one policy step runs through: as ``actor.phase`` sees them, and in a torch profile."""
    import contextlib

    from slime_ref.backends.megatron.actor import MegatronActor

    actor = MegatronActor(make_args(["--hf-checkpoint", model_dir, "--global-batch-size", "8", "--lr", "1e-3",
                                     "--micro-batch-size", "4", "--attention-dropout", "0", "--hidden-dropout", "0"]),
                          rank=rank, world_size=world, master_port=port)
    seen = []
    scope = actor.phase

    @contextlib.contextmanager
    def recording(name):
        seen.append(name)
        with scope(name):
            yield

    actor.phase = recording
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        actor.train(0, synthetic_batch(8, seed=0))
    profiled = sorted({e.name for e in prof.events() if e.name.startswith("slime_ref/")})
    return seen, profiled


def te_named_spec_worker(rank, world, port, spec_dir):
    """bench/gpu/te_named_local_spec.py next to Megatron's local spec: the same weights (norms moved into
    the linear layers) give the same logits and gradients; returns names, logits and gradient norms."""
    import sys

    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from slime_ref.backends.megatron import initialize

    sys.path.insert(0, spec_dir)
    from te_named_local_spec import te_named_local_spec

    initialize.init_distributed(rank, world, master_port=port)
    ps.initialize_model_parallel()
    initialize.set_seed(0)
    try:
        config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                                   ffn_hidden_size=48, kv_channels=8, normalization="RMSNorm", layernorm_epsilon=1e-6,
                                   gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                                   add_qkv_bias=True, qk_layernorm=True, use_cpu_initialization=True,
                                   masked_softmax_fusion=False, bias_activation_fusion=False, apply_rope_fusion=False,
                                   gradient_accumulation_fusion=False, persist_layer_norm=False,
                                   attention_dropout=0.0, hidden_dropout=0.0)
        args = argparse.Namespace(qk_layernorm=True, normalization="RMSNorm")
        models = {}
        for name, spec in (("local", get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")),
                           ("te_named", te_named_local_spec(args, config))):
            torch.manual_seed(0)
            models[name] = GPTModel(config, spec, vocab_size=64, max_sequence_length=32,
                                    position_embedding_type="rope", rotary_base=10000)
        local, ours = models["local"], models["te_named"]
        moved = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
                 "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}
        state = {}
        g = torch.Generator().manual_seed(1)
        for key, value in local.state_dict().items():
            if key.endswith("_extra_state"):
                continue
            if key.endswith("layernorm.weight"):  # random norms, so a norm left out would show
                value = 1 + 0.1 * torch.randn(value.shape, generator=g)
                local.state_dict()[key].copy_(value)
            for old, new in moved.items():
                key = key.replace(old, new)
            state[key] = value
        missing, unexpected = ours.load_state_dict(state, strict=False)
        tokens = torch.randint(0, 64, (2, 12), generator=g)
        positions = torch.arange(12).expand(2, 12)
        out = {"ours_names": sorted(n for n, _ in ours.named_parameters()),
               "missing": [k for k in missing if not k.endswith("_extra_state")], "unexpected": list(unexpected)}
        for name, model in models.items():
            logits = model(tokens, positions, attention_mask=None)
            logits.float().square().mean().backward()
            out[name] = (logits.detach(), {n: p.grad.norm().item() for n, p in model.named_parameters()})
        # slime's batches: sequences packed into one THD row; the local spec sees each one alone
        from megatron.core.packed_seq_params import PackedSeqParams

        lengths = [5, 7]
        packed = torch.randint(0, 64, (1, sum(lengths)), generator=g)
        cu = torch.tensor([0, 5, 12], dtype=torch.int32)
        params = PackedSeqParams(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7,
                                 qkv_format="thd")
        packed_positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        with torch.no_grad():
            ours_packed = ours(packed, packed_positions, attention_mask=None, packed_seq_params=params)
            alone = [local(seq, torch.arange(seq.shape[1]).unsqueeze(0), attention_mask=None)
                     for seq in packed.split(lengths, dim=1)]
        out["packed"] = (ours_packed, torch.cat(alone, dim=1))
        return out
    finally:
        initialize.destroy()


def saved_activations_worker(rank, world, port, spec_dir, shape, tokens, sequences=2, pre_norm="hf"):
    """What one layer of bench/gpu/te_named_local_spec.py keeps for backward (bench/gpu/layer_activations.py's
    count on CPU: bf16, one packed micro-batch of ``tokens`` in ``sequences`` equal sequences)."""
    import os
    import sys

    sys.path.insert(0, spec_dir)
    from layer_activations import measure

    os.environ["MASTER_PORT"] = str(port)
    return measure(shape, tokens, sequences, "cpu", pre_norm)


def step_graphs_worker(rank, world, port, model_dir):
    """GRPO steps of one shape through --cuda-graph-impl local (learning rate 0, so every step sees
    the same weights): eager, captured, replayed on other data of that shape, and the same data
    eagerly for comparison; then a step of another shape."""
    from slime_ref.backends.megatron.actor import MegatronActor

    actor = MegatronActor(make_args(["--hf-checkpoint", model_dir, "--bf16", "--lr", "0", "--global-batch-size", "8",
                                     "--micro-batch-size", "4", "--attention-dropout", "0", "--hidden-dropout", "0",
                                     "--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration",
                                     "--no-check-for-nan-in-loss-and-grad", "--cuda-graph-warmup-steps", "1"]),
                          rank=rank, world_size=world, master_port=port)
    a = synthetic_batch(8, seed=0)
    g = torch.Generator().manual_seed(7)
    b = dict(a, tokens=[torch.randint(1, 100, (len(t),), generator=g).tolist() for t in a["tokens"]],
             rewards=[float(x) for x in torch.randn(8, generator=g)])
    b["raw_reward"] = list(b["rewards"])

    def metrics(step):
        return {k: v for k, v in step[0].items() if k.startswith("train/") and k not in ("train/step", "train/lr")}

    graphs = actor.step_graphs
    out = {"a_eager": metrics(actor.train(0, a)), "a_captured": metrics(actor.train(1, a)),
           "b_replayed": metrics(actor.train(2, b)), "a_replayed": metrics(actor.train(3, a))}
    actor.step_graphs = None
    out["b_eager"] = metrics(actor.train(4, b))
    actor.step_graphs = graphs
    out["other_shape"] = metrics(actor.train(5, synthetic_batch(8, seed=1)))
    out["counts"] = dict(graphs.counts)
    return out
