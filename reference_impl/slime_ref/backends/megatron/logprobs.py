"""Log-probs and entropy of response tokens, straight from vocab-parallel logits of a packed batch.

A micro-batch is one pack: samples concatenated into T tokens (see ``layers.PackedSequence``).
Logit row j predicts token j+1, so sample i's R_i response tokens are scored by the R_i rows
that end one before the sample ends. Only those rows are ever read: prompt rows cost nothing.

Under tensor parallelism every rank holds logits for its slice of the vocabulary, [T, V/tp].
Each rank reduces its slice to four numbers per row (its max m_r, sum exp(x - m_r), the target's
logit if the target is in its slice, and sum exp(x - m_r) * x); one all-gather over the TP group
combines them into the exact full-vocabulary log-sum-exp, target logit and entropy. The
full-vocabulary logits are never gathered. The maths runs in fp32 a chunk of rows at a time, so
bf16 logits are never copied to fp32 whole; the backward recomputes each chunk's softmax from the
saved logits and the fp32 log-sum-exp. Vocabulary rows past the HF vocabulary (padding so that TP
divides it) are left out, so scores equal HF's exactly.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# target size of one chunk's fp32 scratch: rows * local_vocab * 4 bytes
_CHUNK_BYTES = 256 * 1024**2


def response_rows(total_lengths: list[int], response_lengths: list[int], device=None) -> torch.Tensor:
    """[sum R_i] indices of the packed logit rows that score each sample's response tokens."""
    rows, offset = [], 0
    for total, response in zip(total_lengths, response_lengths, strict=True):
        end = offset + total
        rows.append(torch.arange(end - response - 1, end - 1))
        offset = end
    out = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
    return out.to(device) if device is not None else out


def _scaled_chunk(logits, rows, valid_cols, temperature):
    x = logits.index_select(0, rows)[:, :valid_cols].float()
    if temperature != 1.0:
        x.div_(temperature)
    return x


class _VocabParallelLogProbEntropy(torch.autograd.Function):
    """(log p(target), entropy) for selected rows of vocab-parallel logits."""

    @staticmethod
    def forward(ctx, logits, rows, targets, vocab_start, valid_cols, temperature, group, chunk_rows):
        n = rows.numel()
        local_target = targets - vocab_start
        on_rank = (local_target >= 0) & (local_target < valid_cols)
        local_target = local_target.clamp(0, valid_cols - 1)
        # per row: local max, sum exp(x - max), target logit (0 off this rank), sum exp(x - max) * x
        stats = torch.zeros(n, 4, dtype=torch.float32, device=logits.device)
        for start in range(0, n, chunk_rows):
            sl = slice(start, min(start + chunk_rows, n))
            x = _scaled_chunk(logits, rows[sl], valid_cols, temperature)
            m = x.max(dim=-1).values
            e = torch.exp(x - m[:, None])
            stats[sl, 0] = m
            stats[sl, 1] = e.sum(dim=-1)
            stats[sl, 2] = torch.where(on_rank[sl], x.gather(1, local_target[sl, None]).squeeze(1), 0.0)
            stats[sl, 3] = (e * x).sum(dim=-1)
        if group is not None and dist.get_world_size(group) > 1:
            parts = [torch.empty_like(stats) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, stats, group=group)
            stats = torch.stack(parts)  # [tp, n, 4]
        else:
            stats = stats[None]
        m_r, s_r, t_r, sx_r = stats.unbind(-1)
        m = m_r.max(dim=0).values
        w = torch.exp(m_r - m)  # rescales each rank's sums to the global max
        s = (s_r * w).sum(dim=0)
        lse = m + torch.log(s)
        sum_px = (sx_r * w).sum(dim=0) / s  # sum_j p_j x_j
        log_prob = t_r.sum(dim=0) - lse
        entropy = lse - sum_px
        ctx.save_for_backward(logits, rows, local_target, on_rank, lse, sum_px)
        ctx.args = (valid_cols, temperature, chunk_rows)
        return log_prob, entropy

    @staticmethod
    def backward(ctx, grad_log_prob, grad_entropy):
        logits, rows, local_target, on_rank, lse, sum_px = ctx.saved_tensors
        valid_cols, temperature, chunk_rows = ctx.args
        grad = torch.zeros_like(logits)
        use_entropy = grad_entropy is not None and bool(grad_entropy.ne(0).any())
        n = rows.numel()
        for start in range(0, n, chunk_rows):
            sl = slice(start, min(start + chunk_rows, n))
            x = _scaled_chunk(logits, rows[sl], valid_cols, temperature)
            p = torch.exp(x - lse[sl, None])
            # d log p_t / dx_j = [j == t] - p_j ;  d H / dx_j = p_j (sum_k p_k x_k - x_j)
            g = p * (-grad_log_prob[sl, None])
            if use_entropy:
                g += grad_entropy[sl, None] * p * (sum_px[sl, None] - x)
            hit = on_rank[sl].nonzero().squeeze(1)
            g[hit, local_target[sl][hit]] += grad_log_prob[sl][hit]
            if temperature != 1.0:
                g.div_(temperature)
            grad[rows[sl], :valid_cols] = g.to(grad.dtype)
        return grad, None, None, None, None, None, None, None


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    rows: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and the entropy, for the given rows of this rank's logits.

    Args:
        logits: [T, V_local] this TP rank's vocabulary slice (any float dtype; maths in fp32).
        rows: [N] row indices into ``logits``.
        targets: [N] token ids (global vocabulary) predicted by those rows.
        vocab_size: the real (HF) vocabulary size; padded columns beyond it are ignored.
        temperature: logits are divided by it first (the rollout sampling temperature).
        chunk_rows: rows per fp32 chunk (default: about 256 MiB of scratch).

    Returns:
        (log_probs [N], entropy [N]) in fp32, differentiable with respect to ``logits``.
    """
    from megatron.core import parallel_state as ps

    tp_rank = ps.get_tensor_model_parallel_rank()
    local_vocab = logits.shape[-1]
    vocab_start = tp_rank * local_vocab
    valid_cols = max(0, min(local_vocab, vocab_size - vocab_start))
    if valid_cols == 0:
        raise ValueError(f"TP rank {tp_rank} holds only padding columns; vocab {vocab_size} is too small to split")
    if chunk_rows is None or chunk_rows <= 0:
        chunk_rows = max(1, _CHUNK_BYTES // (4 * local_vocab))
    group = ps.get_tensor_model_parallel_group() if ps.get_tensor_model_parallel_world_size() > 1 else None
    return _VocabParallelLogProbEntropy.apply(
        logits, rows, targets, vocab_start, valid_cols, float(temperature), group, int(chunk_rows)
    )


def response_log_probs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    total_lengths: list[int],
    response_lengths: list[int],
    *,
    vocab_size: int,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-sample response log-probs and entropies from one packed micro-batch.

    Args:
        logits: [T, V_local] or [1, T, V_local] logits of the pack (this TP rank's vocab slice).
        tokens: [T] the packed token ids.
        total_lengths: prompt + response length of each sample, in pack order (sum = T).
        response_lengths: response length of each sample.

    Returns:
        (log_probs, entropy): lists of [R_i] fp32 tensors, one per sample.
    """
    if logits.dim() == 3:
        logits = logits.squeeze(0)
    tokens = tokens.reshape(-1)
    rows = response_rows(total_lengths, response_lengths, device=logits.device)
    targets = tokens.index_select(0, rows + 1)
    log_probs, entropy = vocab_parallel_log_probs(
        logits, rows, targets, vocab_size=vocab_size, temperature=temperature, chunk_rows=chunk_rows
    )
    return list(log_probs.split(response_lengths)), list(entropy.split(response_lengths))
