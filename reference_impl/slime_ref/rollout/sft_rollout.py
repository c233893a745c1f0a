"""Supervised rollout: chat rows become training samples with a loss mask on the assistant turns.

Use it as slime does for SFT (and as the quick start does for its warm-up)::

    --rollout-function-path slime_ref.rollout.sft_rollout.generate_rollout
    --input-key messages --loss-type sft_loss --calculate-per-token-loss
    --disable-compute-advantages-and-returns --debug-train-only

Each row's messages are rendered with the tokenizer's chat template. The tokens an assistant turn
adds (its content, end-of-turn token and whatever the template appends after it) are trained on;
everything else (system, user, tool turns and the ``<|im_start|>assistant\\n`` header) is context.
"""

from __future__ import annotations

from slime_ref.errors import UserError
from slime_ref.types import Sample

__all__ = ["generate_rollout", "assistant_loss_mask"]


def _render(tokenizer, messages, **kwargs) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def assistant_loss_mask(tokenizer, messages: list[dict], tools=None) -> tuple[list[int], list[int]]:
    """(token ids of the whole conversation, 1 for tokens produced by assistant turns, else 0).

    Works for any template whose rendering of a conversation prefix is a token prefix of the full
    rendering (ChatML and Qwen's templates are); otherwise it refuses rather than mask wrongly.
    """
    extra = {"tools": tools} if tools else {}
    full = _render(tokenizer, messages, **extra)
    mask = [0] * len(full)
    for k, message in enumerate(messages):
        if message.get("role") != "assistant" or message.get("step_loss_mask", 1) != 1:
            continue
        before = _render(tokenizer, messages[:k], add_generation_prompt=True, **extra) if k else []
        through = _render(tokenizer, messages[: k + 1], **extra)
        if full[: len(through)] != through or through[: len(before)] != before:
            raise UserError(
                "the tokenizer's chat template does not render conversation prefixes as token prefixes; "
                "SFT loss masks cannot be derived from it (check --hf-checkpoint's chat template)"
            )
        for i in range(len(before), len(through)):
            mask[i] = 1
    return full, mask


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """slime's rollout-function signature: ``rollout_batch_size`` groups of one SFT sample each."""
    if evaluation:
        raise UserError("the SFT rollout has no evaluation mode; drop --eval-interval for SFT runs")
    from slime_ref.data.source import load_tokenizer

    tokenizer = load_tokenizer(args)
    groups = data_source.get_samples(args.rollout_batch_size)
    for group in groups:
        for sample in group:
            _fill(tokenizer, sample)
    return groups


def _fill(tokenizer, sample: Sample) -> None:
    messages = sample.prompt
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
        raise UserError(
            "the SFT rollout needs chat messages as the prompt: point --input-key at a column of "
            '[{"role": ..., "content": ...}] lists and do not pass --apply-chat-template'
        )
    tokens, mask = assistant_loss_mask(tokenizer, messages, tools=sample.metadata.get("tools"))
    if 1 not in mask:
        raise UserError("an SFT row has no assistant turn to train on; every row needs one")
    first = mask.index(1)
    sample.tokens = tokens
    sample.response_length = len(tokens) - first
    sample.loss_mask = mask[first:]
    sample.reward = 0.0
    sample.status = Sample.Status.COMPLETED
