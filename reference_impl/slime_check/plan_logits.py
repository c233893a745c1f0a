"""What slime's log-prob path holds per logit element: the tensors alive at its peak, and the block torch's
caching allocator keeps beside them. Counted from slime v0.3.1's ``slime/utils/ppo_utils.py``
(``_VocabParallelLogProbEntropy``) and Megatron's Float16Module; measured on an H100 by
bench/gpu/logprob_memory.py. :mod:`slime_check.plan` multiplies them by tokens x vocabulary / TP."""

from __future__ import annotations

from slime_check.plan_job import Train


def _scaled_copy(train: Train) -> int:
    """Bytes a logit of the copy ``logits / --rollout-temperature`` where the temperature is not 1."""
    return 4 if train.temperature != 1.0 else 0


def logits_bytes_per_element(train: Train, forward_only: bool, tokens: int) -> float:
    """Bytes per logit element slime's log-prob kernel holds at its peak (fp32 throughout): the tensors alive
    at once, which bench/gpu/logprob_memory.py reads as torch's peak allocated memory."""
    temp = _scaled_copy(train)
    if forward_only:
        rows = tokens if train.logprob_chunk <= 0 else logprob_chunk_rows(train.logprob_chunk, tokens)
        chunk = min(1.0, rows / tokens)
        return max(6.0, 4 + 4 * chunk + temp)  # 6: the bf16 output beside its fp32 cast
    return 8 + temp + (4 if train.entropy_coef != 0 else 0)


def logprob_chunk_rows(chunk: int, tokens: int) -> int:
    """Rows of slime's largest log-prob chunk: ``logits.chunk(ceil(tokens / chunk))`` splits evenly."""
    return -(-tokens // -(-tokens // chunk))


def cached_logits_bytes_per_element(train: Train, forward_only: bool, tokens: int) -> float:
    """Bytes per logit element torch's caching allocator keeps reserved beyond :func:`logits_bytes_per_element`.

    The output layer's bf16 logits (2 bytes) are freed once Float16Module has cast them to fp32, but their block
    stays reserved, and only a later request that fits in it reuses it. The fp32 buffers of a whole micro-batch
    (4 bytes a logit) never fit; ``--log-probs-chunk-size`` chunks of at most half the micro-batch do. Measured on
    an H100 (bench/results/logprob-memory-h100-2026-12-07.json): reserved 10 bytes a logit where allocated is 8,
    14 where it is 12; chunked, the forward-only pass reserves 6 (10 with a temperature) and training none extra.
    """
    chunk = train.logprob_chunk
    if chunk <= 0 or 2 * logprob_chunk_rows(chunk, tokens) > tokens:
        return 2.0
    if not forward_only:
        return 0.0  # the chunks' softmaxes, kept for backward, fill the freed block
    # reserved: the fp32 logits (and their scaled copy) and the block, which the chunks' buffers reuse
    return max(0.0, 6 + _scaled_copy(train) - logits_bytes_per_element(train, True, tokens))
