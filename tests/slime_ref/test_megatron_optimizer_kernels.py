"""The foreach kernels that replace megatron's per-parameter optimizer loops, and the fused-Adam switch.

megatron's own loops (``megatron.core.utils.local_multi_tensor_*``) are the reference: on CPU the
foreach versions must give bit-identical results.
"""

from __future__ import annotations

import types

import pytest
import torch
from megatron.core import utils
from megatron.core.optimizer import clip_grads
from megatron.core.optimizer import optimizer as megatron_optimizer

from slime_ref.backends.megatron import cpu_compat
from slime_ref.backends.megatron import optimizer_kernels as ok


def _tensors(seed: int, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(7,), (3, 5), (1000,), (2, 3, 4), (1,)]
    return [(torch.randn(s, generator=g) * (i + 1) ** 3).to(dtype) for i, s in enumerate(shapes)]


def test_l2_norm_is_bit_identical_to_megatrons_loop():
    grads = _tensors(0)
    ours, _ = ok.foreach_l2_norm(2048 * 32, None, [grads], False)
    with cpu_compat._CudaToCpuMode():  # megatron's loop puts its result on device="cuda"
        reference, _ = utils.local_multi_tensor_l2_norm(2048 * 32, None, [grads], False)
    assert ours.shape == (1,) and ours.dtype == torch.float32
    assert torch.equal(ours, reference)


@pytest.mark.parametrize("scale", [1.0, 0.37])
@pytest.mark.parametrize("dst_dtype", [torch.float32, torch.bfloat16])
def test_scale_into_other_tensors_is_bit_identical_to_megatrons_loop(scale, dst_dtype):
    src = _tensors(1)
    ours = [torch.full_like(t, 5.0, dtype=dst_dtype) for t in src]
    reference = [t.clone() for t in ours]
    ok.foreach_scale(0, None, [src, ours], scale)
    utils.local_multi_tensor_scale(0, None, [src, reference], scale)
    assert all(torch.equal(a, b) for a, b in zip(ours, reference))


def test_in_place_scale_is_bit_identical_to_megatrons_loop():
    ours, reference = _tensors(2), _tensors(2)
    ok.foreach_scale(0, None, [ours, ours], 0.123)
    utils.local_multi_tensor_scale(0, None, [reference, reference], 0.123)
    assert all(torch.equal(a, b) for a, b in zip(ours, reference))
    assert not torch.equal(ours[0], _tensors(2)[0])


def test_install_replaces_only_megatrons_fallbacks(monkeypatch):
    for module, name in [(clip_grads, "l2_norm_impl"), (clip_grads, "multi_tensor_scale_impl"),
                         (megatron_optimizer, "multi_tensor_scale_impl")]:
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    assert clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm  # no TE/apex in this environment
    assert ok.install() and ok.install()  # idempotent
    assert clip_grads.l2_norm_impl is ok.foreach_l2_norm
    assert clip_grads.multi_tensor_scale_impl is ok.foreach_scale
    assert megatron_optimizer.multi_tensor_scale_impl is ok.foreach_scale

    # with a real multi-tensor kernel (TE or apex) in place, nothing changes
    kernel = object()
    monkeypatch.setattr(clip_grads, "l2_norm_impl", kernel)
    assert not ok.install()
    assert clip_grads.l2_norm_impl is kernel


def _adam_run(make_optimizer, switch: bool) -> list[torch.Tensor]:
    params = [torch.nn.Parameter(t) for t in _tensors(3)]
    inner = make_optimizer(params)
    megatron_like = types.SimpleNamespace(chained_optimizers=[types.SimpleNamespace(optimizer=inner)])
    if switch:
        assert ok.use_fused_adam(megatron_like) == 1
    for step in range(3):
        for i, p in enumerate(params):
            p.grad = torch.sin(p.detach() * (step + 1) + i)
        inner.step()
    return params, inner


def test_switching_to_fused_adam_equals_an_optimizer_built_fused():
    # torch has fused AdamW on CPU too, so the switch can be checked against the real thing here
    kwargs = dict(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    switched, inner = _adam_run(lambda ps: torch.optim.AdamW(ps, **kwargs), switch=True)
    built, _ = _adam_run(lambda ps: torch.optim.AdamW(ps, fused=True, **kwargs), switch=False)
    default, _ = _adam_run(lambda ps: torch.optim.AdamW(ps, **kwargs), switch=False)
    assert all(torch.equal(a, b) for a, b in zip(switched, built))
    assert all(g["fused"] and not g["foreach"] for g in inner.param_groups)
    assert all(s["step"].dtype == torch.float32 and float(s["step"]) == 3 for s in inner.state.values())
    # the same update as torch's default path, up to rounding
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(switched, default))


def test_fused_adam_takes_over_state_with_host_step_counts():
    # a restored checkpoint leaves float step counts on the host; the switch moves them beside the params
    params, inner = _adam_run(lambda ps: torch.optim.AdamW(ps, lr=1e-2), switch=False)
    for state in inner.state.values():
        state["step"] = torch.tensor(3.0, dtype=torch.float64)
    ok.use_fused_adam(types.SimpleNamespace(optimizer=inner))
    assert all(s["step"].dtype == torch.float32 and s["step"].device == p.device
               for p, s in inner.state.items())
    for p in params:
        p.grad = torch.ones_like(p)
    inner.step()
    assert all(float(s["step"]) == 4 for s in inner.state.values())
