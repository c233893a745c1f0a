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

On CUDA the work is laid out for the device rather than for memory: the forward reduces every row
of the pack in blocks of contiguous rows (prompt rows cost one extra read, and no gather of the
selected rows is materialised), and the backward is one compiled pointwise kernel over the whole
[T, V_local] gradient, rows without a gradient written as zeros. Gathering the selected rows and
scattering each chunk's gradient back cost about as much device time as the output layer's matmuls
did (and a launch per chunk). On CPU, where the maths runs eagerly, only the selected rows are
touched, a chunk at a time, so fp32 scratch stays bounded.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from slime_ref.backends.megatron.layers import cuda_compiled, to_device
from slime_ref.utils.index_cache import cached_index

# rows per chunk: rows * local_vocab * 4 bytes of fp32 scratch stays near this
_CHUNK_BYTES = 512 * 1024**2


def response_rows(total_lengths: list[int], response_lengths: list[int], device=None) -> torch.Tensor:
    """[sum R_i] indices of the packed logit rows that score each sample's response tokens."""
    return cached_index(("response_rows", tuple(total_lengths), tuple(response_lengths), str(device)),
                        lambda: _response_rows(total_lengths, response_lengths, device))


def _response_rows(total_lengths: list[int], response_lengths: list[int], device) -> torch.Tensor:
    rows, offset = [], 0
    for total, response in zip(total_lengths, response_lengths, strict=True):
        end = offset + total
        rows.append(torch.arange(end - response - 1, end - 1))
        offset = end
    out = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
    return to_device(out, device) if device is not None else out


@cuda_compiled
def _chunk_stats(logits, rows, local_target, on_rank, valid_cols: int, temperature: float):
    """[n, 4] per row of one chunk: local max m, sum exp(x - m), target logit (0 off-rank), sum exp(x - m) x.
    ``rows`` None: every row of ``logits``."""
    x = _scaled((logits if rows is None else logits[rows])[:, :valid_cols], temperature)
    m = x.amax(dim=-1)
    e = torch.exp(x - m[:, None])
    target = torch.where(on_rank, x.gather(1, local_target[:, None]).squeeze(1), 0.0)
    return torch.stack([m, e.sum(dim=-1), target, (e * x).sum(dim=-1)], dim=-1)


def _scaled(logits, temperature: float):
    x = logits.float()
    return x / temperature if temperature != 1.0 else x


def _softmax_grad(x, lse, sum_px, grad_log_prob, grad_entropy, use_entropy: bool):
    """The gradient's softmax terms for rows x [n, V] (fp32, temperature applied); the target's
    one-hot term is added by the caller."""
    p = torch.exp(x - lse[:, None])
    # d log p_t / dx_j = [j == t] - p_j ;  d H / dx_j = p_j (sum_k p_k x_k - x_j)
    g = p * (-grad_log_prob[:, None])
    if use_entropy:
        g = g + grad_entropy[:, None] * p * (sum_px[:, None] - x)
    return g


@cuda_compiled
def _chunk_grad(logits, rows, local_target, on_rank, lse, sum_px, grad_log_prob, grad_entropy,
                valid_cols: int, temperature: float, use_entropy: bool):
    """d loss / d logits for one chunk of rows, [n, valid_cols] in the logits' dtype."""
    x = _scaled(logits[rows, :valid_cols], temperature)
    g = _softmax_grad(x, lse, sum_px, grad_log_prob, grad_entropy, use_entropy)
    g = g.scatter_add(1, local_target[:, None], (grad_log_prob * on_rank)[:, None])
    if temperature != 1.0:
        g = g / temperature
    return g.to(logits.dtype)


@cuda_compiled
def _dense_grad(logits, local_target, on_rank, lse, sum_px, grad_log_prob, grad_entropy,
                valid_cols: int, temperature: float, use_entropy: bool):
    """d loss / d logits for every row, [T, V_local] in the logits' dtype: ``_chunk_grad``'s maths on
    all rows at once (rows with zero incoming gradients get zeros) and zeros in the padding columns."""
    x = _scaled(logits, temperature)
    g = _softmax_grad(x, lse, sum_px, grad_log_prob, grad_entropy, use_entropy)
    cols = torch.arange(x.shape[1], device=x.device)[None, :]
    # the target's one-hot as a comparison, not a scatter, so the whole gradient is one pointwise kernel
    g = g + torch.where(cols == local_target[:, None], (grad_log_prob * on_rank)[:, None], 0.0)
    g = torch.where(cols < valid_cols, g, 0.0)
    if temperature != 1.0:
        g = g / temperature
    return g.to(logits.dtype)


def _spread(values: torch.Tensor, rows: torch.Tensor, total: int) -> torch.Tensor:
    """[N] values of the selected rows -> [total], zeros elsewhere."""
    out = values.new_zeros(total)
    out[rows] = values
    return out


class _VocabParallelLogProbEntropy(torch.autograd.Function):
    """(log p(target), entropy) for selected rows of vocab-parallel logits."""

    @staticmethod
    def forward(ctx, logits, rows, targets, vocab_start, valid_cols, temperature, group, chunk_rows, dense=False):
        local_target = targets - vocab_start
        on_rank = (local_target >= 0) & (local_target < valid_cols)
        local_target = local_target.clamp(0, valid_cols - 1)
        if dense:  # every row, in blocks of contiguous rows; the selected rows are picked at the end
            n = logits.shape[0]
            local_target, on_rank = _spread(local_target, rows, n), _spread(on_rank, rows, n)
        else:
            n = rows.numel()
        stats = torch.empty(n, 4, dtype=torch.float32, device=logits.device)
        for start in range(0, n, chunk_rows):
            sl = slice(start, min(start + chunk_rows, n))
            if dense:
                stats[sl] = _chunk_stats(logits[sl], None, local_target[sl], on_rank[sl], valid_cols, temperature)
            else:
                stats[sl] = _chunk_stats(logits, rows[sl], local_target[sl], on_rank[sl], valid_cols, temperature)
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
        ctx.args = (valid_cols, temperature, chunk_rows, dense)
        if dense:
            log_prob, entropy = log_prob[rows], entropy[rows]
        # an output the loss does not use gets None, not zeros: the backward skips its term
        # without looking at the values (which would wait for the device)
        ctx.set_materialize_grads(False)
        return log_prob, entropy

    @staticmethod
    def backward(ctx, grad_log_prob, grad_entropy):
        logits, rows, local_target, on_rank, lse, sum_px = ctx.saved_tensors
        valid_cols, temperature, chunk_rows, dense = ctx.args
        use_entropy = grad_entropy is not None
        if grad_log_prob is None:
            grad_log_prob = torch.zeros_like(rows, dtype=lse.dtype)
        if grad_entropy is None:
            grad_entropy = grad_log_prob  # not read
        if dense:
            n = logits.shape[0]
            grad_log_prob = _spread(grad_log_prob, rows, n)
            grad_entropy = _spread(grad_entropy, rows, n) if use_entropy else grad_log_prob
            grad = _dense_grad(logits, local_target, on_rank, lse, sum_px, grad_log_prob, grad_entropy,
                               valid_cols, temperature, use_entropy)
            return grad, None, None, None, None, None, None, None, None
        grad = torch.zeros_like(logits)
        n = rows.numel()
        for start in range(0, n, chunk_rows):
            sl = slice(start, min(start + chunk_rows, n))
            grad[rows[sl], :valid_cols] = _chunk_grad(
                logits, rows[sl], local_target[sl], on_rank[sl], lse[sl], sum_px[sl], grad_log_prob[sl],
                grad_entropy[sl], valid_cols, temperature, use_entropy,
            )
        return grad, None, None, None, None, None, None, None, None


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    rows: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    dense: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and the entropy, for the given rows of this rank's logits.

    Args:
        logits: [T, V_local] this TP rank's vocabulary slice (any float dtype; maths in fp32).
        rows: [N] row indices into ``logits``.
        targets: [N] token ids (global vocabulary) predicted by those rows.
        vocab_size: the real (HF) vocabulary size; padded columns beyond it are ignored.
        temperature: logits are divided by it first (the rollout sampling temperature).
        chunk_rows: rows per fp32 chunk (default: about 512 MiB of scratch).
        dense: reduce every row and write the whole gradient in one kernel (the default on CUDA; see
            the module docstring) rather than only the selected rows, chunk by chunk.

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
    if dense is None:
        dense = logits.is_cuda
    return _VocabParallelLogProbEntropy.apply(
        logits, rows, targets, vocab_start, valid_cols, float(temperature), group, int(chunk_rows), bool(dense)
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
