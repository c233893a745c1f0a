"""Multi-tensor kernels for megatron's optimizer when neither TransformerEngine nor apex is installed.

megatron-core's optimizer runs its gradient-norm, clipping and master-weight copies through
apex-style multi-tensor kernels (``multi_tensor_applier`` with ``multi_tensor_l2norm`` and
``multi_tensor_scale``). Without TE or apex it falls back to ``megatron.core.utils``'s
``local_multi_tensor_l2_norm`` and ``local_multi_tensor_scale``: Python loops with one kernel per
parameter, and the l2-norm builds a host tensor from the per-parameter norms, which copies each of
them to the host (one device sync per parameter, several hundred per step for a 0.6B model).

:func:`install` swaps those two fallbacks for ``torch._foreach_*`` versions: a few multi-tensor
kernels and no host copy. It changes nothing when megatron found TE or apex. The arithmetic is the
same as megatron's loops (per-tensor 2-norms, then the 2-norm of those; ``dst = src * scale`` in
the source dtype), and on CPU, where torch's foreach ops loop over the tensors, bit-identical.

:func:`use_fused_adam` switches the ``torch.optim.Adam``/``AdamW`` that megatron builds without TE
or apex from torch's default multi-tensor path (about ten passes over the fp32 master weights and
moments per step) to torch's fused kernel (one pass). The actor calls it on CUDA only, so CPU runs
keep torch's default path.
"""

from __future__ import annotations

import torch


def foreach_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Drop-in for ``amp_C.multi_tensor_l2norm``: ([1] fp32 2-norm of all tensors in ``tensor_lists[0]``, None)."""
    norms = torch._foreach_norm(tensor_lists[0])
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1).float(), None


def foreach_scale(chunk_size, noop_flag, tensor_lists, scale):
    """Drop-in for ``amp_C.multi_tensor_scale``: ``dst = src * scale`` for each pair of ``tensor_lists``."""
    src, dst = tensor_lists
    if not src:
        return
    if scale == 1.0:  # megatron's copies (fp32 master weights <-> 16-bit params)
        torch._foreach_copy_(dst, src)
    elif all(s is d for s, d in zip(src, dst)):  # gradient clipping, in place
        torch._foreach_mul_(dst, scale)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


def install() -> bool:
    """Use the foreach kernels in megatron's optimizer where it fell back to its Python loops. Idempotent.

    Returns True when megatron is using them (it had no TE or apex).
    """
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as megatron_optimizer

    if clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = foreach_l2_norm
    if clip_grads.multi_tensor_scale_impl is utils.local_multi_tensor_scale:
        clip_grads.multi_tensor_scale_impl = foreach_scale
    if megatron_optimizer.multi_tensor_scale_impl is utils.local_multi_tensor_scale:
        megatron_optimizer.multi_tensor_scale_impl = foreach_scale
    return clip_grads.l2_norm_impl is foreach_l2_norm


def torch_adam_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    """The ``torch.optim.Adam``/``AdamW`` instances inside a megatron (possibly chained) optimizer."""
    found = []
    for megatron_optimizer in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(megatron_optimizer, "optimizer", None)
        if isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            found.append(inner)
    return found


def use_fused_adam(optimizer) -> int:
    """Run the torch Adam/AdamW inside ``optimizer`` (megatron's) with torch's fused kernel.

    Also moves existing per-parameter ``step`` counts next to their parameters, where the fused
    kernel reads them. Call it again after loading optimizer state (a checkpoint's param groups
    carry the fused flag they were saved with). Returns the number of torch optimizers switched.
    """
    switched = torch_adam_optimizers(optimizer)
    for inner in switched:
        inner.defaults.update(fused=True, foreach=False)
        for group in inner.param_groups:
            group["fused"], group["foreach"] = True, False
        for param, state in inner.state.items():
            if "step" in state:
                state["step"] = state["step"].to(device=param.device, dtype=torch.float32)
        inner._step_supports_amp_scaling = True  # as torch's constructor sets it for fused=True
    return len(switched)
