"""Sampling parameters as SGLang's ``/generate`` takes them, and the sampler.

Field names, defaults and validation follow SGLang 0.5.15.post1's ``SamplingParams``. Parameters
SGLang has but the built-in engine does not implement are refused by name when they are set to
anything but their default, so a request never silently means something else here.

Log-probs follow SGLang's default sampler: the log-prob returned for a sampled token is
``log_softmax(logits / temperature)[token]`` over the whole vocabulary, before top-k/top-p
filtering (the filtered, renormalised distribution is only used to draw the token). Greedy requests
(temperature below 1e-6) report ``log_softmax(logits)[token]``. This is the quantity slime's trainer
recomputes (it divides logits by ``--rollout-temperature``), computed here in float32.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

_SAMPLING_EPS = 1e-6  # SGLang: temperatures below this mean greedy

# SGLang fields the built-in engine does not implement, with the value that means "off".
_UNIMPLEMENTED_DEFAULTS: dict[str, Any] = {
    "stop_regex": None,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
}
# Accepted and without effect here: text spacing between special tokens, logit-processor params and
# the streaming interval only change things the built-in engine does not do.
_ACCEPTED_WITHOUT_EFFECT = ("spaces_between_special_tokens", "custom_params", "stream_interval")


@dataclass
class SamplingParams:
    max_new_tokens: int | None = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    stop: list[str] = field(default_factory=list)
    stop_token_ids: set[int] = field(default_factory=set)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.top_k == 1

    @classmethod
    def from_request(cls, raw: dict[str, Any] | None) -> SamplingParams:
        """Parse a request's ``sampling_params``; raise ValueError naming the offending field."""
        raw = dict(raw or {})
        known = set(_UNIMPLEMENTED_DEFAULTS) | set(_ACCEPTED_WITHOUT_EFFECT) | {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {unknown}; SGLang's are {sorted(known)}")
        for name, off in _UNIMPLEMENTED_DEFAULTS.items():
            if raw.get(name, off) not in (off, None):
                raise ValueError(f"sampling parameter {name}={raw[name]!r} is not implemented by the built-in engine")
        p = cls()
        # SGLang treats an explicit null as "use the default".
        if "max_new_tokens" in raw:
            p.max_new_tokens = raw["max_new_tokens"]
        for name in ("temperature", "top_p", "top_k", "ignore_eos", "skip_special_tokens", "no_stop_trim",
                     "sampling_seed"):
            if raw.get(name) is not None:
                setattr(p, name, raw[name])
        stop = raw.get("stop")
        p.stop = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        p.stop_token_ids = {int(t) for t in (raw.get("stop_token_ids") or []) if t is not None}
        p.temperature, p.top_p, p.top_k = float(p.temperature), float(p.top_p), int(p.top_k)
        if 0 <= p.temperature < _SAMPLING_EPS:
            p.temperature, p.top_k = 1.0, 1
        p._verify()
        return p

    def _verify(self) -> None:
        if not (self.temperature >= 0.0 and self.temperature < float("inf")):
            raise ValueError(f"temperature must be a non-negative finite number, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 1 and self.top_k != -1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if self.max_new_tokens is not None and (not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0):
            raise ValueError(f"max_new_tokens must be a non-negative integer, got {self.max_new_tokens!r}.")


def sample(
    logits: torch.Tensor, params: list[SamplingParams], rngs: list[random.Random],
    forced: list[int | None] | None = None,
) -> tuple[list[int], list[float]]:
    """Draw one token per row of ``logits`` [B, V] (float32); return the tokens and their log-probs.

    Each request draws from its own seeded ``random.Random`` (one uniform number per token), so a
    seeded request samples the same tokens whatever else is in the batch. A row whose ``forced``
    entry is a token id takes that token instead (a scripted answer), with its log-prob computed
    exactly as a drawn token's.
    """
    batch, vocab = logits.shape
    temperatures = torch.tensor([p.temperature for p in params], dtype=logits.dtype)[:, None]
    logprobs = torch.log_softmax(logits / temperatures, dim=-1)
    probs = logprobs.exp()
    top_ks = torch.tensor([vocab if p.top_k == -1 else min(p.top_k, vocab) for p in params])
    top_ps = torch.tensor([p.top_p for p in params], dtype=logits.dtype)
    # SGLang's torch sampler: sort, drop ranks >= top_k and the tail beyond top_p, draw from the rest.
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab)[None, :]
    cumulative = sorted_probs.cumsum(dim=-1)
    keep = (ranks < top_ks[:, None]) & ((cumulative - sorted_probs) <= top_ps[:, None])
    kept = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    cdf = kept.cumsum(dim=-1)
    uniforms = torch.tensor([rng.random() for rng in rngs], dtype=cdf.dtype)
    picks = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).clamp_(max=vocab - 1)
    tokens = sorted_ids.gather(1, picks)[:, 0]
    greedy_rows = torch.tensor([p.greedy for p in params])
    if bool(greedy_rows.any()):
        tokens = torch.where(greedy_rows, logits.argmax(dim=-1), tokens)
    if forced is not None and any(t is not None for t in forced):
        forced_rows = torch.tensor([t is not None for t in forced])
        tokens = torch.where(forced_rows, torch.tensor([t or 0 for t in forced]), tokens)
    token_logprobs = logprobs[torch.arange(batch), tokens]
    return tokens.tolist(), token_logprobs.tolist()
