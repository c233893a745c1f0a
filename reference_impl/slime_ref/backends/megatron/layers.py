"""The layer pieces our Megatron spec swaps in: RMSNorm, rotary embedding and core attention.

Without TransformerEngine, megatron-core's local spec computes attention as an explicit
[b, heads, s, s] score matrix and does not accept packed sequences at all. Our core attention
instead applies the rotary embedding itself and calls a fused kernel:

- packed variable-length sequences (THD, the layout every training and log-prob batch uses):
  on CUDA, flash attention over ``cu_seqlens`` (``torch.nn.attention.varlen``), one kernel for the
  whole micro-batch, causal and GQA-aware, cost sum(L_i^2); on CPU (or without that API), the
  sequences padded at their end into one [b, heads, max L, d] causal ``scaled_dot_product_attention``
  call when that costs at most twice sum(L_i^2) (many short sequences of similar length, as
  rollouts are: one call instead of one per sequence, whose per-call overhead dominates small
  models), else one causal call per sequence. All are exact per sequence: no token sees another
  sequence, and a causal mask never lets a real token see the padding behind it. A block-diagonal
  mask over the whole pack would be simpler but costs T^2 and falls off the flash kernel on GPU.
- an ordinary [s, b] batch: one causal ``scaled_dot_product_attention`` call.

RoPE is applied here rather than in megatron's ``SelfAttention`` (the model is built with
``position_embedding_type="none"``) so that the positions come from the packed batch in one
gather, cos/sin are computed once per forward and shared by all layers, and the inverse
frequencies follow the HF config exactly, including llama3 and linear scaling.

On CUDA the elementwise pieces are compiled with ``torch.compile``: each RMSNorm is one kernel, and
Qwen3's q/k RMSNorm and the rotary embedding of q and k are one kernel together (``QKNorm``). Every
compiled call costs the host tens of microseconds to dispatch, and a small model's step is bound
by the host, so fewer, larger kernels are faster. On CPU they run eagerly and match HF's arithmetic.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.module import MegatronModule

logger = logging.getLogger(__name__)


def cuda_compiled(fn):
    """``fn`` compiled by torch.compile when its first tensor argument is on CUDA, eager otherwise."""
    compiled = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal compiled
        if not args[0].is_cuda:
            return fn(*args, **kwargs)
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True)
        return compiled(*args, **kwargs)

    return wrapper


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor`` (on the host) copied to ``device`` without making the host wait for the device.

    A plain ``.to("cuda")`` from pageable memory synchronises the stream, so the host stalls
    until every queued kernel has run. Staging through pinned memory lets the copy queue behind
    them instead (torch keeps the pinned block alive until the copy is done).
    """
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu" or not torch.cuda.is_available():
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


# ---------------------------------------------------------------------------------------------
# RMSNorm


@cuda_compiled
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm arithmetic: normalise in fp32, cast back, then scale. x: [..., H], weight: [H]."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


class RMSNorm(torch.nn.Module):
    """RMSNorm with its weight in the model's parameter dtype (megatron's torch norm keeps fp32)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_unused):
        super().__init__()
        device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class QKNorm(RMSNorm):
    """Qwen3's per-head RMSNorm of the queries or the keys, applied by ``RopeSDPAttention``.

    Megatron's ``SelfAttention`` calls this right after the QKV projection. Once the layer's core
    attention has taken it over (``RopeSDPAttention.apply_qk_norm``), it passes the heads through and
    the core attention normalises q and k and rotates them in one kernel, instead of four. The
    weight stays where megatron's optimizer and the checkpoints have it
    (``self_attention.q_layernorm.weight``).
    """

    taken_over = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.taken_over else super().forward(x)


# ---------------------------------------------------------------------------------------------
# Rotary embedding


@dataclass(frozen=True)
class RopeConfig:
    """RoPE as an HF config describes it. ``scaling``: None, or HF's dict with rope_type linear/llama3."""

    head_dim: int
    theta: float
    scaling: dict | None = None

    def inv_freq(self) -> torch.Tensor:
        """[head_dim / 2] fp32 inverse frequencies, computed as HF computes them."""
        dim = self.head_dim
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        if self.scaling is None:
            return inv_freq
        kind = self.scaling["rope_type"]
        factor = float(self.scaling["factor"])
        if kind == "linear":
            return inv_freq / factor
        if kind == "llama3":
            # Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth ramp between
            low = float(self.scaling["low_freq_factor"])
            high = float(self.scaling["high_freq_factor"])
            old_context = float(self.scaling["original_max_position_embeddings"])
            low_freq_wavelen = old_context / low
            high_freq_wavelen = old_context / high
            wavelen = 2 * math.pi / inv_freq
            scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
            smooth = (old_context / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
            return torch.where(is_medium, smoothed, scaled)
        raise ValueError(f"unsupported rope_type {kind!r}")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos, sin: [T, 1, D] in x's dtype. HF's rotate-half convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@cuda_compiled
def norm_rope_qk(q, k, cos, sin, q_weight, k_weight, eps: float):
    """(q, k) each normalised per head (when ``q_weight`` is given) and then rotated; on CUDA one
    kernel for both. q: [T, heads, D], k: [T, groups, D], cos/sin: [T, 1, D]; weights: [D]."""
    if q_weight is not None:
        q = rms_norm.__wrapped__(q, q_weight, eps)
        k = rms_norm.__wrapped__(k, k_weight, eps)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


@dataclass
class PackedSequence(PackedSeqParams):
    """Megatron's THD packing parameters plus each token's position inside its own sequence.

    ``position_ids``: [T] int64 on the model's device. ``rope_cache`` holds what every attention layer
    needs for this batch (cos/sin, the padding index), filled by the first and reused by the others.
    """

    position_ids: torch.Tensor | None = None
    cu_seqlens_cpu: list[int] | None = None
    rope_cache: dict = field(default_factory=dict, repr=False)

    def padded_index(self) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
        """(sequence of each token [T], position of each token [T], sequences, max length) to scatter the pack
        into a right-padded [b, max L] batch, or None when padding would cost more than twice the
        exact sum(L_i^2) attention. Computed once per batch and shared by all layers."""
        if "padded_index" not in self.rope_cache:
            cu = self.cu_seqlens_cpu
            lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]
            longest = max(lengths)
            index = None
            if len(lengths) * longest * longest <= 2 * sum(n * n for n in lengths):
                rows = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
                index = (to_device(rows, self.position_ids.device), self.position_ids, len(lengths), longest)
            self.rope_cache["padded_index"] = index
        return self.rope_cache["padded_index"]

    @classmethod
    def from_lengths(cls, lengths: list[int], device) -> PackedSequence:
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        cu_t = to_device(torch.tensor(cu, dtype=torch.int32), device)
        positions = to_device(torch.cat([torch.arange(n, dtype=torch.long) for n in lengths]), device)
        max_len = max(lengths)
        return cls(
            qkv_format="thd",
            cu_seqlens_q=cu_t,
            cu_seqlens_kv=cu_t,
            max_seqlen_q=max_len,
            max_seqlen_kv=max_len,
            position_ids=positions,
            cu_seqlens_cpu=cu,
        )


def _rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    freqs = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


# ---------------------------------------------------------------------------------------------
# Core attention


# set when varlen attention raised once in this process; later calls go per sequence
_varlen_unusable: list[str] = []


@functools.cache
def varlen_attention():
    """torch's varlen flash attention and how to call it causal/GQA in this torch version, or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    # the keyword API changed across torch releases: is_causal became window_size=(-1, 0),
    # enable_gqa appeared later (older releases pass GQA straight to the flash kernel)
    params = inspect.signature(varlen_attn).parameters
    kwargs = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    return varlen_attn, kwargs, "scale" in params


class RopeSDPAttention(MegatronModule):
    """Core attention: rotary embedding, then fused causal attention (see the module docstring).

    Takes megatron's core-attention arguments. Inputs: query [T, np, hn], key/value [T, ng, hn] for
    packed sequences, or [s, b, np, hn] / [s, b, ng, hn]. Output: [T, np*hn] or [s, b, np*hn].
    """

    def __init__(self, config, layer_number, attn_mask_type, attention_type, *, rope: RopeConfig,
                 attention_dropout=None, softmax_scale=None, cp_comm_type=None, pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("context parallelism is not supported by this attention")
        self.softmax_scale = softmax_scale
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.register_buffer("inv_freq", rope.inv_freq(), persistent=False)
        self._qk_norm: tuple[QKNorm, QKNorm] | None = None  # a plain tuple: not registered as submodules

    def apply_qk_norm(self, q_norm: QKNorm, k_norm: QKNorm) -> None:
        """Take over the layer's q/k RMSNorm, to fuse it with the rotary embedding."""
        q_norm.taken_over = k_norm.taken_over = True
        self._qk_norm = (q_norm, k_norm)

    def _norm_rope(self, query, key, cos, sin):
        if self._qk_norm is None:
            return norm_rope_qk(query, key, cos, sin, None, None, 0.0)
        q_norm, k_norm = self._qk_norm
        return norm_rope_qk(query, key, cos, sin, q_norm.weight, k_norm.weight, q_norm.eps)

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, cache: dict | None):
        key = (dtype, positions.device)
        if cache is not None and key in cache:
            return cache[key]
        cos_sin = _rope_cos_sin(self.inv_freq, positions, dtype)
        if cache is not None:
            cache[key] = cos_sin
        return cos_sin

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        dropout = self.dropout if self.training else 0.0
        if packed_seq_params is None:
            s, b = query.shape[:2]
            positions = torch.arange(s, device=query.device)
            cos, sin = self._cos_sin(positions, query.dtype, None)
            q, k = self._norm_rope(query.flatten(1, 2), key.flatten(1, 2), cos, sin)
            q, k = q.view_as(query), k.view_as(key)
            # [s, b, h, d] -> [b, h, s, d]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, value))
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=self.softmax_scale, enable_gqa=True
            )
            return out.permute(2, 0, 1, 3).reshape(s, b, -1)

        if not isinstance(packed_seq_params, PackedSequence):
            raise TypeError("packed batches must come as PackedSequence (with position ids)")
        cos, sin = self._cos_sin(packed_seq_params.position_ids, query.dtype, packed_seq_params.rope_cache)
        q, k = self._norm_rope(query, key, cos, sin)
        out = None
        varlen = varlen_attention()
        # flash kernels: 16-bit inputs, no dropout; an explicit scale needs a torch that takes one
        if (
            q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and dropout == 0.0
            and varlen is not None and not _varlen_unusable and (self.softmax_scale is None or varlen[2])
        ):
            fn, kwargs, _ = varlen
            if self.softmax_scale is not None:
                kwargs = {**kwargs, "scale": self.softmax_scale}
            cu = packed_seq_params.cu_seqlens_q
            n = packed_seq_params.max_seqlen_q
            try:
                out = fn(q, k, value.contiguous(), cu, cu, n, n, **kwargs)
            except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
                logger.warning("varlen flash attention failed (%s); using one SDPA call per sequence", e)
                _varlen_unusable.append(str(e))
        if out is None and packed_seq_params.padded_index() is not None:
            out = attention_padded(q, k, value, *packed_seq_params.padded_index(), dropout, self.softmax_scale)
        if out is None:
            out = attention_per_sequence(q, k, value, packed_seq_params.cu_seqlens_cpu, dropout, self.softmax_scale)
        return out.reshape(out.shape[0], -1)


def attention_padded(q, k, v, rows: torch.Tensor, positions: torch.Tensor, num_seqs: int, longest: int,
                     dropout: float, scale: float | None) -> torch.Tensor:
    """Causal attention of packed sequences, q [T, h, d], k/v [T, g, d] -> [T, h, d]: scattered to
    [b, max L] padded at the end (``rows``/``positions``: each token's place), one SDPA call."""
    padded = []
    for t in (q, k, v):
        box = t.new_zeros((num_seqs, longest, *t.shape[1:]))
        box[rows, positions] = t
        padded.append(box.transpose(1, 2))
    out = F.scaled_dot_product_attention(*padded, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)[rows, positions]


def attention_per_sequence(q, k, v, cu: list[int], dropout: float, scale: float | None) -> torch.Tensor:
    """Causal attention of packed sequences (``cu``: host offsets), one SDPA call per sequence."""
    outs = []
    for start, end in zip(cu[:-1], cu[1:]):
        # [L, h, d] -> [1, h, L, d]
        qi, ki, vi = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        oi = F.scaled_dot_product_attention(qi, ki, vi, dropout_p=dropout, is_causal=True, scale=scale,
                                            enable_gqa=True)
        outs.append(oi.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)
