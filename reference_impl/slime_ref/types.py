"""``Sample``: one prompt and one response as it travels from the data source to the trainer.

The fields and statuses are slime v0.3.1's (``slime/utils/types.py``), so a custom generate or reward
function written for slime builds, reads and writes a Sample the same way here. slime-ref carries the
fields for multimodal inputs, top-p replay, MoE routing replay and on-policy distillation
(``multimodal_*``, ``rollout_top_p_*``, ``rollout_routed_experts``, ``teacher_log_probs``) through the
pipeline but does not fill or train on them.

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
    multimodal_inputs: dict[str, Any] | None = None  # raw images, videos, ... (carried, not used)
    multimodal_train_inputs: dict[str, Any] | None = None  # processed ones, e.g. pixel_values (carried)
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None  # one entry per response token; None means all ones
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None  # one per response token, from the engine
    # top-p replay: kept ids of response token i are rollout_top_p_token_ids[offsets[i]:offsets[i + 1]] (carried)
    rollout_top_p_token_ids: list[int] | Any | None = None
    rollout_top_p_token_offsets: list[int] | Any | None = None
    rollout_routed_experts: list[list[int]] | Any | None = None  # MoE routing replay (carried)
    remove_sample: bool = False  # kept for group statistics, but its loss mask is zeroed
    teacher_log_probs: list[float] | None = None  # on-policy distillation (carried)

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
    non_generation_time: float = 0.0  # seconds a custom generate spent outside the engine

    @dataclass
    class SpecInfo:
        """Speculative-decoding counts summed over a sample's engine calls."""

        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        @property
        def spec_accept_rate(self) -> float:
            return self.spec_accept_token_num / self.spec_draft_token_num if self.spec_draft_token_num else 0.0

        @property
        def spec_accept_length(self) -> float:
            return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct else 0.0

        def add(self, meta_info: dict) -> None:
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)  # SGLang's name differs

        def to_dict(self) -> dict[str, int]:
            return dict(vars(self))

        @staticmethod
        def from_dict(data: dict) -> Sample.SpecInfo:
            return Sample.SpecInfo(**{f.name: data.get(f.name, 0) for f in fields(Sample.SpecInfo)})

    @dataclass
    class PrefixCacheInfo:
        """Prompt tokens the engine found in its prefix cache, summed over a sample's engine calls."""

        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        @property
        def prefix_cache_hit_rate(self) -> float:
            return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens else 0.0

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return dict(vars(self))

        @staticmethod
        def from_dict(data: dict) -> Sample.PrefixCacheInfo:
            return Sample.PrefixCacheInfo(**{f.name: data.get(f.name, 0) for f in fields(Sample.PrefixCacheInfo)})

    spec_info: SpecInfo = field(default_factory=SpecInfo)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (status as its string value, the two info records as dicts), extras included."""
        data = dict(vars(self))
        data["status"] = self.status.value
        data["spec_info"] = self.spec_info.to_dict()
        data["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Sample:
        data = dict(data)
        if "status" in data:
            data["status"] = Sample.Status(data["status"])
        data["spec_info"] = Sample.SpecInfo.from_dict(data.get("spec_info") or {})
        data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(data.get("prefix_cache_info") or {})
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
        ``meta_info`` (SGLang's ``/generate`` ``meta_info``) that carries a finish reason: the
        prefix-cache counts (and, with ``--sglang-speculative-algorithm``, the speculative ones) are
        added, ``weight_version`` is appended, and stop/length/abort set ``status``; any other finish
        reason leaves it as it was, as in slime.
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
            if getattr(args, "sglang_speculative_algorithm", None):
                self.spec_info.add(meta_info)
            self.prefix_cache_info.add(meta_info)
            if "weight_version" in meta_info:
                self.weight_versions.append(meta_info["weight_version"])
            self.status = status_from_finish_reason(meta_info["finish_reason"]) or self.status


def status_from_finish_reason(finish_reason: dict | str | None) -> Sample.Status | None:
    """Map SGLang's ``meta_info.finish_reason`` (``{"type": "stop" | "length" | "abort", ...}``) to a status.

    None for any other reason: the caller keeps the status it had (slime leaves it unchanged).
    """
    kind = finish_reason.get("type") if isinstance(finish_reason, dict) else finish_reason
    return {
        "stop": Sample.Status.COMPLETED,
        "length": Sample.Status.TRUNCATED,
        "abort": Sample.Status.ABORTED,
    }.get(kind)
