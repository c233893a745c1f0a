"""Host copies of a rank's parameters under tags, swapped into the one model: how the actor keeps a
reference model (slime's TensorBackuper) without a second model on the device."""

from __future__ import annotations

import torch

from slime_ref.backends.megatron.hf_weights import unwrap


class WeightsBackup:
    """CPU copies of this rank's parameters under tags ("actor", "ref"), swapped into the one model.

    slime's TensorBackuper: the reference model costs host memory, not device memory.
    """

    def __init__(self, model):
        self._params = list(unwrap(model).named_parameters())
        self._copies: dict[str, dict[str, torch.Tensor]] = {}

    @property
    def tags(self) -> list[str]:
        return list(self._copies)

    @torch.no_grad()
    def backup(self, tag: str) -> None:
        copies = self._copies.setdefault(tag, {})
        pin = torch.cuda.is_available()
        for name, param in self._params:
            if name not in copies:
                copies[name] = torch.empty(param.shape, dtype=param.dtype, device="cpu", pin_memory=pin)
            copies[name].copy_(param.detach(), non_blocking=pin)
        if pin:
            torch.cuda.synchronize()

    @torch.no_grad()
    def restore(self, tag: str) -> None:
        copies = self._copies[tag]
        for name, param in self._params:
            param.copy_(copies[name], non_blocking=torch.cuda.is_available())
        if torch.cuda.is_available():
            torch.cuda.synchronize()
