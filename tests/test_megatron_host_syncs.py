"""A training step reads tensor values on the host only where it must, never per micro-batch.

On a GPU every such read (``.item()``, ``.tolist()``, ``bool(t)``) stalls the host until the device
catches up. Counted here on CPU, where the same code runs: one optimizer step with 1 and with 4
micro-batches must read the same, the supervised step only its two unavoidable values, and none
before the optimizer's step has been queued.
"""

from __future__ import annotations

import pytest

from megatron_workers import host_reads_worker, run_workers


@pytest.fixture(scope="module")
def reads(tiny):
    return run_workers(host_reads_worker, 1, model_dir=str(tiny.model_dir))[0]


@pytest.mark.parametrize("loss_type", ["sft_loss", "policy_loss"])
def test_host_reads_do_not_grow_with_micro_batches(reads, loss_type):
    assert reads[loss_type, 2] == reads[loss_type, 8]


def test_a_supervised_step_reads_only_the_metrics_and_the_grad_norm(reads):
    # the step's metrics come back as floats, then the gradient norm (kept on the device until then)
    assert reads["sft_loss", 8] == {"tolist": 1, "__float__": 1}


@pytest.mark.parametrize("loss_type", ["sft_loss", "policy_loss"])
def test_the_optimizer_step_reads_nothing_and_the_step_reads_after_it(reads, loss_type):
    # megatron reads the gradient norm on the host inside its step (get_grad_norm_fp32's .item() and
    # the clipping decision); kept on the device, the optimizer's launches queue behind the backward
    # and the step waits once, at its end
    order = reads[loss_type, 8, "order"]
    assert order[-4:] == ["step begins", "step ends", "tolist", "__float__"], order
