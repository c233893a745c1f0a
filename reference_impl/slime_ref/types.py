"""``Sample``: one prompt and one response as it travels from the data source to the trainer.

The fields and statuses are slime v0.3.1's (``slime/utils/types.py``), so a custom generate or reward
function written for slime reads and writes the same attributes here. Fields slime keeps only for
multimodal inputs, MoE routing replay, top-p replay and speculative decoding are left out.

Lifecycle: the data source creates a Sample with ``prompt``, ``label`` and ``metadata`` and gives the
``n_samples_per_prompt`` copies of one prompt the same ``group_index`` and distinct ``index`` values.
The rollout fills ``tokens`` (prompt + response ids), ``response``, ``response_length``,
``rollout_log_probs``, ``loss_mask`` and ``status``; the reward function sets ``reward``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    # Samples cut from one rollout share a rollout_id; None means "this sample is its own rollout".
    rollout_id: int | None = None
    # str once a chat template is applied, else the raw prompt (str or list of chat messages)
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)  # prompt + response token ids
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None  # one entry per response token; None means all ones
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None  # one per response token, from the engine
    remove_sample: bool = False  # kept for group statistics, but its loss mask is zeroed

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"  # the engine stopped on EOS or a stop string ("stop")
        TRUNCATED = "truncated"  # hit max_new_tokens ("length")
        ABORTED = "aborted"  # cut off by an abort; partial rollout may resume it
        FAILED = "failed"  # a recoverable error in a custom generate (tool call, parsing, ...)

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None  # per-sample override of --custom-generate-function-path
    custom_rm_path: str | None = None  # per-sample override of --custom-rm-path
    train_metadata: dict | None = None
    session_id: str | None = None  # routing key for the router's consistent hashing

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (status as its string value), including attributes a custom function added."""
        data = dict(vars(self))
        data["status"] = self.status.value
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Sample:
        data = dict(data)
        if "status" in data:
            data["status"] = Sample.Status(data["status"])
        known = {f.name for f in fields(Sample)}
        sample = Sample(**{k: v for k, v in data.items() if k in known})
        for key, value in data.items():  # keep extra attributes a custom function attached
            if key not in known:
                setattr(sample, key, value)
        return sample

    def get_reward_value(self, args) -> float:
        """The scalar reward: ``reward`` itself, or ``reward[args.reward_key]`` for dict rewards."""
        reward_key = getattr(args, "reward_key", None)
        return self.reward[reward_key] if reward_key else self.reward

    @property
    def effective_response_length(self) -> int:
        """Response tokens that count in the loss."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def append_response_tokens(
        self,
        args=None,
        *,
        tokens: list[int] | None = None,
        log_probs: list[float] | None = None,
        trainable: bool = True,
        meta_info: dict | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Append generated (``trainable=True``) or tool/environment (``trainable=False``) tokens.

        Keeps ``tokens``, ``response_length``, ``loss_mask`` and ``rollout_log_probs`` the same length.
        Model tokens need their log-probs; tool tokens get loss-mask 0 and log-prob 0. With
        ``meta_info`` (SGLang's ``/generate`` ``meta_info``) the finish reason sets ``status``.
        """
        tokens = [int(t) for t in (tokens or [])]
        log_probs = None if log_probs is None else [float(x) for x in log_probs]
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens need their rollout log-probs")
        if tokens and not trainable:
            if log_probs is not None:
                raise ValueError("tool/environment tokens (trainable=False) take no rollout log-probs")
            log_probs = [0.0] * len(tokens)

        if text is not None:
            self.response += text
        previous_length = self.response_length
        if tokens:
            self.tokens += tokens
            self.response_length += len(tokens)
            if self.loss_mask is None:
                self.loss_mask = [1] * previous_length
            self.loss_mask += [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and previous_length:
                    raise ValueError("cannot add rollout log-probs to a response that has tokens without them")
                self.rollout_log_probs = [0.0] * previous_length
            self.rollout_log_probs += log_probs

        if meta_info and update_terminal_info and "finish_reason" in meta_info:
            if "weight_version" in meta_info:
                self.weight_versions.append(meta_info["weight_version"])
            self.status = status_from_finish_reason(meta_info["finish_reason"])


def status_from_finish_reason(finish_reason: dict | str | None) -> Sample.Status:
    """Map SGLang's ``meta_info.finish_reason`` (``{"type": "stop" | "length" | "abort", ...}``) to a status."""
    kind = finish_reason.get("type") if isinstance(finish_reason, dict) else finish_reason
    return {
        "stop": Sample.Status.COMPLETED,
        "length": Sample.Status.TRUNCATED,
        "abort": Sample.Status.ABORTED,
    }.get(kind, Sample.Status.FAILED)
