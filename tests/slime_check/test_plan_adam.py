"""plan's training step beyond the backward: the Adam update with torch's AdamW, and the micro-batches
a smoke's equal-length samples pack into. Exact values, checked against torch's own optimizer."""

from __future__ import annotations

import weakref

import pytest

from slime_check import plan as P
from slime_check import plan_job as J

QWEN3_06B = J.Shape(layers=28, hidden=1024, ffn=3072, heads=16, kv_heads=8, head_dim=128, vocab=151936,
                    tied=True, qk_norm=True)
H200 = J.Card("H200-141GB", *J.CARDS["H200-141GB"][:2], "test")
PARAMS_06B = 596_049_920  # tests/slime_check/test_plan.py::test_qwen3_parameter_counts_by_hand


def _job(par=None, **train) -> J.Job:
    tr = J.Train(**{"longest": 1280, "dynamic": True, "max_tokens": 8192, "global_batch": 8,
                    "grad_fp32": True, **train})
    return J.Job(shape=QWEN3_06B, par=par or J.Parallel(world=1), train=tr, rollout=None, card=H200)


def _phase(job: J.Job, start: str) -> J.Phase | None:
    return next((p for p in P.make_plan(job).phases if p.name.startswith(start)), None)


class LiveBytes:
    """The bytes of tensors created inside a block and still alive, and their peak: each new storage
    counted once, until its last tensor is freed (torch's dispatcher sees every allocation of an op)."""

    def __init__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                before = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs or {}))
                          if isinstance(t, torch.Tensor)}
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in before:
                        counter.born(t)
                return out

        self.mode = Mode()
        self.live = self.peak = 0
        self.storages: dict[int, int] = {}  # data_ptr -> tensors alive on it

    def born(self, t) -> None:
        ptr, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        if ptr not in self.storages:
            self.storages[ptr] = 0
            self.live += size
            self.peak = max(self.peak, self.live)
        self.storages[ptr] += 1
        weakref.finalize(t, self.died, ptr, size)

    def died(self, ptr: int, size: int) -> None:
        self.storages[ptr] -= 1
        if not self.storages[ptr]:
            del self.storages[ptr]
            self.live -= size


def _adam_update_peak(kernel: str) -> tuple[int, int, int]:
    """(peak bytes made during AdamW's second update, fp32 elements of the decay group, of the other),
    with Megatron's two parameter groups (weight decay on matrices, none on norms)."""
    import torch

    torch.manual_seed(0)
    decay = [torch.nn.Parameter(torch.randn(n, 64)) for n in (300, 200, 100)]
    no_decay = [torch.nn.Parameter(torch.randn(64)) for _ in range(3)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.98), **{kernel: True})
    for p in decay + no_decay:
        p.grad = torch.randn_like(p)
    opt.step()  # the first update makes the moments (part of the state plan counts, 8 B/param)
    counter = LiveBytes()
    with counter.mode:
        opt.step()
    return counter.peak, sum(p.numel() for p in decay), sum(p.numel() for p in no_decay)


def test_torchs_multi_tensor_adamw_update_makes_four_bytes_a_parameter_of_a_group():
    peak, decay, _ = _adam_update_peak("foreach")  # torch's default for CUDA tensors
    # sqrt of every second moment of the larger group at once, fp32; beside it only per-tensor scalars
    assert 4 * decay <= peak < 4 * decay + 64 * 6
    assert _adam_update_peak("fused")[0] == 0  # a fused kernel updates in place, as FusedAdam does


def test_plan_adds_the_adam_update_with_torch_adam_only():
    assert _phase(_job(), "actor training step: Adam update") is None  # FusedAdam: in place
    update = _phase(_job(adam_kernel="torch"), "actor training step: Adam update")
    items = {i.label: i.bytes for i in update.items}
    sqrt = items["sqrt of the second moments (torch's multi-tensor AdamW)"]
    assert sqrt == 4 * PARAMS_06B
    # beside the whole state: bf16 weights 2 + fp32 gradients 4 + master and moments 12 bytes a parameter
    state = sum(b for label, b in items.items() if label.startswith("actor "))
    assert state == 18 * PARAMS_06B
    # beside the context, the three NCCL communicators the step has opened by its end
    assert update.total == 22 * PARAMS_06B + (P.CUDA_CONTEXT + 3 * P.NCCL_COMMUNICATOR) * J.GIB
    # the distributed optimizer shards the state and the update over DP: 2 GPUs, half each
    dp2 = _phase(_job(par=J.Parallel(world=2), adam_kernel="torch"), "actor training step: Adam update")
    assert dict((i.label, i.bytes) for i in dp2.items)["sqrt of the second moments (torch's multi-tensor AdamW)"] \
        == 4 * PARAMS_06B / 2
    # all of Adam on the host (--optimizer-cpu-offload): no GPU update
    assert _phase(_job(adam_kernel="torch", cpu_adam=True), "actor training step: Adam update") is None


def test_the_adam_update_sets_the_training_peak_of_a_big_model_with_short_micro_batches():
    # Qwen3-4B, 3,102-token micro-batches, full recompute: measured 87.62 GiB on an H200 with torch's AdamW
    # (bench/results/memory-fit-h200-2026-12-06.json, q4-1k-4k-rc), the update its peak
    qwen3_4b = J.Shape(layers=36, hidden=2560, ffn=9728, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                       tied=True, qk_norm=True)
    train = J.Train(longest=1034, dynamic=True, max_tokens=4096, global_batch=8, sample_tokens=1034, grad_fp32=True,
                    recompute="full", recompute_method="uniform", recompute_layers=1, adam_kernel="torch")
    job = J.Job(shape=qwen3_4b, par=J.Parallel(world=1), train=train, rollout=None, card=H200)
    update = _phase(job, "actor training step: Adam update")
    assert P.peak_train(job) == update.total == 22 * 4_022_468_096 + (P.CUDA_CONTEXT + 1.5) * J.GIB
    assert update.total > _phase(job, "actor training step").total
    # with FusedAdam the backward is the peak again
    fused = P.with_train(job, adam_kernel="fused")
    assert P.peak_train(fused) == _phase(fused, "actor training step").total


@pytest.mark.parametrize(("max_tokens", "sample", "batch", "tokens"), [
    (16384, 1034, 16, 15 * 1034),  # first-fit: 15 samples in the first micro-batch, 1 in the second
    (16384, 1034, 8, 8 * 1034),  # all of a smaller step fits in one
    (16384, 8202, 8, 8202),  # two do not fit: one sample a micro-batch, half the worst case
    (4096, 1034, 8, 3 * 1034),
    (4096, 5000, 8, 5000),  # a sample longer than the cap lands alone
])
def test_equal_samples_pack_as_slimes_first_fit(max_tokens, sample, batch, tokens):
    train = J.Train(longest=sample, dynamic=True, max_tokens=max_tokens, global_batch=batch, sample_tokens=sample)
    assert P.micro_batch_tokens(train, J.Parallel(world=1)) == tokens
    # the worst case (samples of mixed lengths) fills the cap
    worst = J.Train(longest=sample, dynamic=True, max_tokens=max_tokens, global_batch=batch)
    assert P.micro_batch_tokens(worst, J.Parallel(world=1)) == max(max_tokens, sample)


def test_a_smoke_reads_the_adam_kernel_from_the_machines_packages(monkeypatch):
    from importlib import metadata

    from slime_rehearse.smoke_memory import adam_kernel

    class Dist:
        def __init__(self, name):
            self.metadata = {"Name": name}

    for names, kernel in ((["torch", "megatron-core"], "torch"), (["torch", "transformer_engine_torch"], "fused"),
                          (["torch", "apex"], "fused")):
        monkeypatch.setattr(metadata, "distributions", lambda names=names: [Dist(n) for n in names])
        assert adam_kernel("slime") == kernel
    assert adam_kernel("slime-ref") == "fused"  # slime-ref runs torch's fused kernel on CUDA


def test_where_fused_adam_alone_fits_plan_names_transformer_engine_first():
    from slime_check.plan_report import train_fixes

    qwen3_4b = J.Shape(layers=36, hidden=2560, ffn=9728, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                       tied=True, qk_norm=True)
    train = J.Train(longest=1034, dynamic=True, max_tokens=4096, global_batch=8, grad_fp32=True, recompute="full",
                    recompute_method="uniform", recompute_layers=1, adam_kernel="torch")
    card = J.Card("85GiB", 85 * J.GIB, 87040, "test")  # FusedAdam's 74.8 GiB within 90% of it; torch's 83.3 not
    job = J.Job(shape=qwen3_4b, par=J.Parallel(world=1), train=train, rollout=None, card=card)
    fixes = train_fixes(job, P.peak_train(job))
    assert fixes[0].startswith("`pip install --no-build-isolation 'transformer_engine[pytorch]==")
    assert "no sqrt of the moments" in fixes[0]
    assert not any("transformer_engine" in f for f in train_fixes(P.with_train(job, adam_kernel="fused"),
                                                                  P.peak_train(P.with_train(job, adam_kernel="fused"))))


def test_local_layers_are_counted_as_the_gpu_measured_them_and_only_mla_or_moe_is_a_floor(tmp_path):
    from slime_check.launch_script import Origin, Word
    from slime_check.plan_inputs import plan_argv
    from slime_common.registry import load_registry

    base = ["--num-layers", "28", "--hidden-size", "1024", "--ffn-hidden-size", "3072", "--num-attention-heads",
            "16", "--group-query-attention", "--num-query-groups", "8", "--kv-channels", "128", "--vocab-size",
            "151936", "--swiglu", "--qk-layernorm", "--rollout-max-response-len", "1024", "--use-dynamic-batch-size",
            "--max-tokens-per-gpu", "8192", "--actor-num-gpus-per-node", "1", "--colocate", "--hidden-dropout", "0"]

    def planned(extra):
        words = [Word([a], Origin("argv", i + 1)) for i, a in enumerate(base + extra)]
        return plan_argv(words, load_registry("v0.3.1"), "v0.3.1", "argv", H200, None, None)

    def activations(p):
        phase = next(ph for ph in p.plan.phases if ph.name == "actor training step")
        return next(i.bytes for i in phase.items if i.label == "activations kept for backward")

    te, local = planned([]), planned(["--transformer-impl", "local"])
    tokens = P.micro_batch_tokens(te.plan.job.train, te.plan.job.par)
    assert activations(te) == 28 * 45_120 * tokens
    assert activations(local) == 28 * 64_680 * tokens  # bytes a token a layer, as an H100 measured them
    assert not any("floor" in n for n, major in local.notes)
    moe = planned(["--transformer-impl", "local", "--num-experts", "8", "--moe-ffn-hidden-size", "768"])
    assert any("--transformer-impl local" in n and "floor" in n for n, major in moe.notes if major)
    selective = planned(["--transformer-impl", "local", "--recompute-granularity", "selective"])
    assert any("floor" in n for n, major in selective.notes if major)


def test_local_layer_count_equals_the_h100_capture_of_the_sets_layers():
    """bench/results/layer-activations-h100-2026-12-07.json: every storage autograd saved in one layer of
    the set's spec on an H100 (torch 2.11, slime's Megatron-LM), for three Qwen3 shapes."""
    import json
    from pathlib import Path

    capture = Path(__file__).resolve().parents[2] / "bench" / "results" / "layer-activations-h100-2026-12-07.json"
    shapes = {"qwen3-0.6B": (1024, 3072, 16), "qwen3-1.7B": (2048, 6144, 16), "qwen3-4B": (2560, 9728, 32)}
    runs = json.loads(capture.read_text())["runs"]
    assert {r["shape"] for r in runs} == set(shapes)
    for run in runs:
        hidden, ffn, heads = shapes[run["shape"]]
        shape = J.Shape(layers=1, hidden=hidden, ffn=ffn, heads=heads, kv_heads=8, head_dim=128, vocab=128,
                        tied=False, qk_norm=True)
        counted = P.layer_activation_per_token(shape, J.Parallel(world=1), J.Train(longest=8192, layer_impl="local"),
                                               False)
        # the varlen kernel's sequence offsets and RNG state: a few bytes a micro-batch, not a token
        assert counted == pytest.approx(run["saved_bytes_per_token"], abs=0.01), run["shape"]
        assert counted / P.layer_activation_per_token(shape, J.Parallel(world=1), J.Train(longest=8192), False) \
            == pytest.approx(1.44, abs=0.03)


def test_logits_count_equals_the_h100_capture_of_slimes_log_prob_path():
    """bench/results/logprob-memory-h100-2026-12-07.json: slime v0.3.1's own log-prob function after a bf16
    output layer and its fp32 cast, on an H100. What is alive at once is plan's count; what the caching
    allocator reserves is that plus the freed bf16 block. Micro-batches of 7k tokens and more: at 1,034 the
    harness's own cached set-up blocks take the requests, and the reserved figure reads low."""
    import json
    from pathlib import Path

    capture = Path(__file__).resolve().parents[2] / "bench" / "results" / "logprob-memory-h100-2026-12-07.json"
    runs = [r for r in json.loads(capture.read_text())["runs"] if r["tokens"] >= 7000]
    assert len(runs) >= 30 and {r["mode"] for r in runs} == {"forward_only", "train"}
    for run in runs:
        train = J.Train(longest=run["tokens"], temperature=run["temperature"], entropy_coef=run["entropy_coef"],
                        logprob_chunk=run["log_probs_chunk_size"])
        forward_only = run["mode"] == "forward_only"
        alive = P.logits_bytes_per_element(train, forward_only, run["tokens"])
        cached = P.cached_logits_bytes_per_element(train, forward_only, run["tokens"])
        case = {k: run[k] for k in ("shape", "tokens", "mode", "temperature", "log_probs_chunk_size")}
        assert alive == pytest.approx(run["allocated_bytes_per_logit"], abs=0.07), case
        # the kept softmax chunks of training partly land in blocks the set-up left cached: up to 0.5 B less
        assert alive + cached == pytest.approx(run["reserved_bytes_per_logit"], abs=0.5), case


def test_the_trainers_nccl_communicators_count_where_slime_opens_them():
    # slime opens a group's communicator on its first collective, even on one GPU, and destroys its groups
    # at every sleep: the log-prob pass opens the tensor-parallel group's (the vocab-parallel log-softmax),
    # the step's end the data-parallel and model-parallel groups' (gradients and metrics, the grad norm).
    # Each holds 0.50 GiB on an H100 (bench/results/process-overhead-h100-2026-12-07.json); the step's
    # last rise in the two-step traces is exactly 1.00 GiB.
    def communicators(phase: J.Phase) -> float:
        return sum(i.bytes for i in phase.items if i.label.startswith("NCCL communicators"))

    job = _job(adam_kernel="torch")
    assert communicators(_phase(job, "log-prob pass")) == 0.5 * J.GIB
    assert communicators(_phase(job, "actor training step")) == 1.5 * J.GIB
    assert communicators(_phase(job, "actor training step: Adam update")) == 1.5 * J.GIB
