"""The SFT rollout trains exactly on what assistant turns add to the conversation."""

from __future__ import annotations

import argparse

import pytest
from transformers import AutoTokenizer

from slime_ref.errors import UserError
from slime_ref.rollout.sft_rollout import assistant_loss_mask, generate_rollout
from slime_ref.types import Sample


@pytest.fixture(scope="module")
def tok(tiny):
    return AutoTokenizer.from_pretrained(tiny.model_dir)


def _masked_text(tok, ids, mask):
    return tok.decode([t for t, m in zip(ids, mask) if m])


def test_single_turn_mask_covers_answer_and_end_of_turn(tok):
    messages = [{"role": "user", "content": "3+5="}, {"role": "assistant", "content": "\\boxed{8}"}]
    ids, mask = assistant_loss_mask(tok, messages)
    assert tok.decode(ids) == "<|im_start|>user\n3+5=<|im_end|>\n<|im_start|>assistant\n\\boxed{8}<|im_end|>\n"
    assert _masked_text(tok, ids, mask) == "\\boxed{8}<|im_end|>\n"
    first = mask.index(1)
    assert all(mask[first:]) and not any(mask[:first])


def test_multi_turn_masks_every_assistant_turn_only(tok):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"},
    ]
    ids, mask = assistant_loss_mask(tok, messages)
    assert _masked_text(tok, ids, mask) == "2<|im_end|>\n4<|im_end|>\n"
    skip_first = [dict(m) for m in messages]
    skip_first[2]["step_loss_mask"] = 0
    ids2, mask2 = assistant_loss_mask(tok, skip_first)
    assert ids2 == ids and _masked_text(tok, ids2, mask2) == "4<|im_end|>\n"


def test_generate_rollout_fills_samples(tiny):
    from slime_ref.arguments import parse_args
    from slime_ref.data.source import make_data_source

    args = parse_args(["--hf-checkpoint", str(tiny.model_dir), "--prompt-data", str(tiny.sft_path),
                       "--input-key", "messages", "--rollout-batch-size", "4", "--global-batch-size", "4",
                       "--num-epoch", "1"])
    source = make_data_source(args)
    groups = generate_rollout(args, 0, source)
    assert len(groups) == 4 and all(len(g) == 1 for g in groups)
    s = groups[0][0]
    assert s.response_length == len(s.loss_mask) == sum(s.loss_mask) and s.status == Sample.Status.COMPLETED
    assert len(s.tokens) > s.response_length


def test_prompt_that_is_not_messages_is_a_user_error(tiny):
    args = argparse.Namespace(hf_checkpoint=str(tiny.model_dir), rollout_batch_size=1)

    class OneText:
        def get_samples(self, n):
            return [[Sample(prompt="3+5=")]]

    with pytest.raises(UserError, match="--input-key"):
        generate_rollout(args, 0, OneText())
