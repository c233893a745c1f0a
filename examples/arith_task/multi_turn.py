"""A multi-turn rollout for the arithmetic task, written as a slime ``--custom-generate-function-path`` hook.

The episode: the model answers the prompt. If it stopped on its own without a non-empty
``\\boxed{...}`` answer, the environment adds a user turn ("Write the answer as \\boxed{}.") and the
model answers again, at most ``MAX_FEEDBACK_TURNS`` times. The same loop shape serves tool calls:
parse the model's turn, run the tool, append its output as environment tokens, generate again.

What slime needs back in the Sample, and what this fills in:

- ``tokens``: prompt tokens followed by every response-side token, the model's and the environment's;
- ``loss_mask``: one entry per response token, 1 for tokens the model generated, 0 for the environment's;
- ``rollout_log_probs``: the engine's log-prob of each model token, 0.0 for environment tokens;
- ``response`` and ``response_length``; ``status`` from the last finish reason;
- ``metadata``: what the reward needs (here, ``feedback_turns``).

Launch flags (dotted import paths; ``arith_task``'s parent folder must be on PYTHONPATH)::

    --custom-generate-function-path arith_task.multi_turn.generate_with_feedback
    --custom-rm-path arith_task.reward.boxed_answer_reward

It talks to the engines the way slime's default rollout does: POST token ids to the router's
``/generate`` with ``return_logprob`` and read ``meta_info.output_token_logprobs``. It needs a
ChatML chat template (Qwen models and the embedded tiny model use one).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from arith_task.reward import last_boxed_answer

MAX_FEEDBACK_TURNS = 1
FEEDBACK = "Write the answer as \\boxed{}."
# A user turn in ChatML, opening the next assistant turn.
FEEDBACK_TURN = "\n<|im_start|>user\n" + FEEDBACK + "<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Turn:
    """One model generation: its tokens, their log-probs, its text and SGLang's finish reason type."""

    tokens: list[int]
    log_probs: list[float]
    text: str
    finish: str  # "stop", "length" or "abort"


@dataclass
class Episode:
    """Response-side tokens of a whole episode, aligned one to one with loss_mask and log_probs."""

    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    text: str = ""
    finish: str = "stop"
    feedback_turns: int = 0

    def add_model_turn(self, turn: Turn) -> None:
        self.tokens += turn.tokens
        self.loss_mask += [1] * len(turn.tokens)
        self.log_probs += turn.log_probs
        self.text += turn.text
        self.finish = turn.finish

    def add_environment_turn(self, tokens: list[int], text: str) -> None:
        self.tokens += tokens
        self.loss_mask += [0] * len(tokens)
        self.log_probs += [0.0] * len(tokens)
        self.text += text


Policy = Callable[[list[int], int], Awaitable[Turn]]


async def run_episode(
    prompt_ids: list[int],
    policy: Policy,
    feedback_for: Callable[[Turn], tuple[list[int], str]],
    max_new_tokens: int,
    max_feedback_turns: int = MAX_FEEDBACK_TURNS,
) -> Episode:
    """Alternate model turns and feedback turns until an answer, a cut, an abort or the budget ends.

    ``policy(input_ids, max_new_tokens)`` generates one model turn. ``feedback_for(turn)`` returns the
    environment's token ids and text to append after that turn. ``max_new_tokens`` bounds the whole
    response, environment tokens included, as ``--rollout-max-response-len`` does in slime.
    """
    episode = Episode()
    while True:
        turn = await policy(prompt_ids + episode.tokens, max_new_tokens - len(episode.tokens))
        episode.add_model_turn(turn)
        if turn.finish != "stop" or last_boxed_answer(turn.text) is not None:
            return episode
        if episode.feedback_turns >= max_feedback_turns:
            return episode
        feedback_ids, feedback_text = feedback_for(turn)
        if len(episode.tokens) + len(feedback_ids) >= max_new_tokens:
            return episode
        episode.add_environment_turn(feedback_ids, feedback_text)
        episode.feedback_turns += 1


@functools.cache
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=True)


async def generate_with_feedback(args, sample, sampling_params: dict):
    """slime's custom generate signature: ``async def f(args, sample: Sample, sampling_params: dict) -> Sample``."""
    import aiohttp

    if getattr(args, "partial_rollout", False):
        raise ValueError("arith_task.multi_turn regenerates from the prompt; run it without --partial-rollout")
    tokenizer = _tokenizer(args.hf_checkpoint)
    prompt = sample.prompt
    if not isinstance(prompt, str):  # chat messages: slime applies the template when --apply-chat-template
        prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"

    def feedback_for(turn: Turn) -> tuple[list[int], str]:
        # Close the model's turn first if it stopped on a stop string rather than on <|im_end|>.
        closed = bool(turn.tokens) and turn.tokens[-1] == tokenizer.eos_token_id
        text = FEEDBACK_TURN if closed else tokenizer.eos_token + FEEDBACK_TURN
        return tokenizer.encode(text, add_special_tokens=False), text

    async with aiohttp.ClientSession() as session:

        async def policy(input_ids: list[int], max_new_tokens: int) -> Turn:
            payload = {
                "input_ids": input_ids,
                "sampling_params": {**sampling_params, "max_new_tokens": max_new_tokens},
                "return_logprob": True,
            }
            async with session.post(url, json=payload) as response:
                response.raise_for_status()
                output = await response.json()
            meta = output["meta_info"]
            pairs = meta.get("output_token_logprobs") or []  # [[log_prob, token_id, ...], ...]
            return Turn(
                tokens=[p[1] for p in pairs],
                log_probs=[p[0] for p in pairs],
                text=output["text"],
                finish=meta["finish_reason"]["type"],
            )

        episode = await run_episode(prompt_ids, policy, feedback_for, sampling_params["max_new_tokens"])

    return fill_sample(sample, prompt_ids, episode)


def fill_sample(sample, prompt_ids: list[int], episode: Episode):
    """Write an episode into the Sample the way slime's trainer reads it."""
    status = type(sample).Status  # slime's Sample.Status (slime-ref's Sample has the same members)
    sample.tokens = prompt_ids + episode.tokens
    sample.response = episode.text
    sample.response_length = len(episode.tokens)
    sample.loss_mask = episode.loss_mask
    sample.rollout_log_probs = episode.log_probs
    # round_number: assistant turns, which --log-multi-turn summarises (slime reads the same key)
    sample.metadata = {**(sample.metadata or {}), "feedback_turns": episode.feedback_turns,
                       "round_number": episode.feedback_turns + 1}
    sample.status = {"stop": status.COMPLETED, "length": status.TRUNCATED}.get(episode.finish, status.ABORTED)
    return sample
