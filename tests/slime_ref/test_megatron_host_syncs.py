"""A training step reads tensor values on the host only where it must, never per micro-batch.

On a GPU every such read (``.item()``, ``.tolist()``, ``bool(t)``) stalls the host until the device
catches up. Counted here on CPU, where the same code runs: one optimizer step with 1 and with 4
micro-batches must read the same, and the supervised step only its two unavoidable values.
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


def test_a_supervised_step_reads_only_the_grad_norm_and_the_metrics(reads):
    # the gradient norm decides clipping on the host (megatron's clip_grad_by_total_norm_fp32);
    # the step's metrics come back as floats
    assert reads["sft_loss", 8] == {"item": 1, "tolist": 1}
