"""Port of slime v0.3.1 ``tests/test_ppo_logprob_entropy.py`` (THUDM/slime @ a6272da): fused log-probs and entropy.

slime's ``calculate_log_probs_and_entropy(logits, tokens, tp_group, with_entropy, chunk_size,
log_prob_keep_mask)`` is slime-ref's vocab-parallel log-prob/entropy function
(``slime_ref.backends.megatron.logprobs``): ``_VocabParallelLogProbEntropy`` on one rank,
``vocab_parallel_log_probs`` over a tensor-parallel group. The logits, targets, loss weights,
chunk sizes and the two-rank vocabulary split are slime's.

Changed:

- tolerance: float32 (``torch.testing.assert_close``'s float32 defaults), not slime's 1e-8. slime's
  reference replays its own kernel's reduction order to get bit-level agreement; the reference
  here is an independent float64 ``log_softmax``, so only float32 rounding may differ;
- reference gradients come from autograd through that float64 reference, not a hand-written formula;
- ``with_entropy=False``: slime's function then returns ``entropy=None``; slime-ref's always returns
  the entropy, and "without entropy" means the loss does not use it. The port checks the
  gradient for that case (the entropy's backward must be skipped, not added);
- both of slime-ref's layouts are run (selected rows in chunks, and the dense CUDA layout).

Left out: every ``with_mask=True`` case (top-p replay through ``log_prob_keep_mask``; slime-ref does not
replay top-p masks, see ARCHITECTURE.md, "Where slime-ref differs from slime").
"""

from __future__ import annotations

import pytest
import torch

from slime_ref.backends.megatron.logprobs import _VocabParallelLogProbEntropy

LOGPROB_WEIGHTS_1 = [0.25, -0.5, 1.5]
ENTROPY_WEIGHTS_1 = [0.55, -0.2, 1.8]
LOGPROB_WEIGHTS_2 = [0.25, -0.5, 1.5, -0.75]
ENTROPY_WEIGHTS_2 = [0.55, -0.2, 1.8, 0.4]


def _single_rank_logits() -> torch.Tensor:
    return torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 1.0, 0.5, 2.0], [-1.0, 3.0, 2.0, 0.0]])


def _distributed_full_logits() -> torch.Tensor:
    return torch.tensor(
        [
            [1.0, 2.0, 3.0, 4.0, 0.5, -1.0],
            [4.0, 1.0, 0.5, 2.0, 3.0, 0.0],
            [-1.0, 3.0, 2.0, 0.0, 1.0, 5.0],
            [0.2, -0.4, 1.7, -2.0, 3.3, 0.0],
        ]
    )


def _reference(logits: torch.Tensor, tokens: torch.Tensor, with_entropy: bool, logprob_w, entropy_w):
    """float64 log p(token), entropy and d(weighted loss)/d(logits), by log_softmax and autograd."""
    x = logits.detach().double().requires_grad_()
    log_softmax = torch.log_softmax(x, dim=-1)
    log_probs = log_softmax.gather(1, tokens[:, None]).squeeze(1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    loss = (log_probs * torch.tensor(logprob_w, dtype=torch.float64)).sum()
    if with_entropy:
        loss = loss + (entropy * torch.tensor(entropy_w, dtype=torch.float64)).sum()
    loss.backward()
    return log_probs.detach(), entropy.detach(), x.grad


def _weighted_loss(log_probs, entropy, with_entropy: bool, logprob_w, entropy_w) -> torch.Tensor:
    loss = (log_probs * torch.tensor(logprob_w)).sum()
    if with_entropy:
        loss = loss + (entropy * torch.tensor(entropy_w)).sum()
    return loss


def _chunk_rows(chunk_size: int) -> int:
    return 1 << 30 if chunk_size <= 0 else chunk_size  # slime's -1: no chunking


@pytest.mark.parametrize("dense", [False, True], ids=["selected_rows", "dense"])
@pytest.mark.parametrize("chunk_size", [-1, 1, 2, 8])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_calculate_log_probs_and_entropy_matches_unfused_reference_single_rank(chunk_size, with_entropy, dense):
    logits = _single_rank_logits().requires_grad_()
    tokens = torch.tensor([3, 0, 1])
    rows = torch.arange(3)

    log_probs, entropy = _VocabParallelLogProbEntropy.apply(
        logits, rows, tokens, 0, 4, 1.0, None, _chunk_rows(chunk_size), dense
    )
    ref_log_probs, ref_entropy, ref_grad = _reference(logits, tokens, with_entropy, LOGPROB_WEIGHTS_1,
                                                      ENTROPY_WEIGHTS_1)
    torch.testing.assert_close(log_probs.double(), ref_log_probs, rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(entropy.double(), ref_entropy, rtol=1.3e-6, atol=1e-5)

    _weighted_loss(log_probs, entropy, with_entropy, LOGPROB_WEIGHTS_1, ENTROPY_WEIGHTS_1).backward()
    torch.testing.assert_close(logits.grad.double(), ref_grad, rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("dense", [False, True], ids=["selected_rows", "dense"])
def test_calculate_log_probs_and_entropy_handles_empty_input(dense):
    logits = torch.empty((0, 4), dtype=torch.float32, requires_grad=True)
    tokens = torch.empty((0,), dtype=torch.long)
    log_probs, entropy = _VocabParallelLogProbEntropy.apply(logits, tokens, tokens, 0, 4, 1.0, None, 2, dense)
    assert log_probs.shape == (0,)
    assert entropy.shape == (0,)


def vocab_parallel_worker(rank, world, port):
    """This rank's log-probs, entropies and logit gradients for every (with_entropy, chunk_size, dense)."""
    from megatron.core import parallel_state as ps

    from slime_ref.backends.megatron import initialize
    from slime_ref.backends.megatron.logprobs import vocab_parallel_log_probs

    torch.set_num_threads(1)
    initialize.init_distributed(rank, world, master_port=port)
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    try:
        full = _distributed_full_logits()
        tokens = torch.tensor([5, 0, 3, 2])
        per_rank = full.shape[1] // world
        out = {}
        for with_entropy in (False, True):
            for chunk_size in (-1, 2):
                for dense in (False, True):
                    local = full[:, rank * per_rank:(rank + 1) * per_rank].clone().requires_grad_()
                    log_probs, entropy = vocab_parallel_log_probs(
                        local, torch.arange(4), tokens, vocab_size=full.shape[1], chunk_rows=chunk_size, dense=dense
                    )
                    _weighted_loss(log_probs, entropy, with_entropy, LOGPROB_WEIGHTS_2, ENTROPY_WEIGHTS_2).backward()
                    out[with_entropy, chunk_size, dense] = (log_probs.detach(), entropy.detach(), local.grad)
        return out
    finally:
        initialize.destroy()


@pytest.fixture(scope="module")
def vocab_parallel_results():
    from megatron_workers import run_workers

    # one pair of spawned ranks serves every case below (each spawn costs seconds of imports)
    return run_workers(vocab_parallel_worker, 2, timeout=300)


@pytest.mark.parametrize("dense", [False, True], ids=["selected_rows", "dense"])
@pytest.mark.parametrize(
    "with_entropy,chunk_size",
    [
        pytest.param(True, -1, id="unmasked_entropy_no_chunks"),
        pytest.param(False, 2, id="unmasked_logprob_only_chunks"),
        pytest.param(True, 2, id="unmasked_entropy_chunks"),
        pytest.param(False, -1, id="unmasked_logprob_only_no_chunks"),
    ],
)
def test_calculate_log_probs_and_entropy_matches_unfused_reference_vocab_parallel(
    vocab_parallel_results, with_entropy, chunk_size, dense
):
    full = _distributed_full_logits()
    tokens = torch.tensor([5, 0, 3, 2])
    ref_log_probs, ref_entropy, ref_grad = _reference(full, tokens, with_entropy, LOGPROB_WEIGHTS_2,
                                                      ENTROPY_WEIGHTS_2)
    per_rank = full.shape[1] // len(vocab_parallel_results)
    for rank, results in enumerate(vocab_parallel_results):
        log_probs, entropy, grad = results[with_entropy, chunk_size, dense]
        torch.testing.assert_close(log_probs.double(), ref_log_probs, rtol=1.3e-6, atol=1e-5)
        torch.testing.assert_close(entropy.double(), ref_entropy, rtol=1.3e-6, atol=1e-5)
        torch.testing.assert_close(grad.double(), ref_grad[:, rank * per_rank:(rank + 1) * per_rank],
                                   rtol=1.3e-6, atol=1e-5)
