"""The built-in engine's model: an HF checkpoint run step by step over a slot-based KV cache.

Every running request owns one slot of a preallocated KV pool (``[slots, context_length, kv_heads,
head_dim]`` per layer, keys and values). A forward step takes, for each request in the batch, the
tokens not yet in its cache (the whole prompt on the first step, one token afterwards), writes their
keys and values into the slot, and attends over the slot's cache with a causal mask. Linear layers,
norms and the MLP run once for the whole batch; that is what makes throughput grow with concurrency.

The layers are the HF model's own modules (embedding, norms, projections, rotary embedding, MLP,
lm_head), called one by one, so the numbers are the ones transformers computes and weight updates
load HF-named tensors straight into ``model.state_dict()``. Dense Llama-style decoders (Qwen3 with
its q/k norms, Qwen2, Llama) follow this layout.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class WeightLoadError(ValueError):
    """A weight update names a tensor the model does not have, or has the wrong shape."""


@dataclass
class StepOutput:
    """What one forward step returns for each request of the batch.

    last_logits: [B, V] float32 logits at each request's last new token (the next-token distribution).
    chunk_logits: per request, [n_new, V] float32 logits at every new token, or None if not asked for.
    """

    last_logits: torch.Tensor
    chunk_logits: list[torch.Tensor | None]


def resolve_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"--dtype {name!r} is not supported; choose one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


class ModelRunner:
    """Loads the checkpoint, owns the KV pool, runs batched forward steps and loads new weights."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        max_running_requests: int = 256,
        context_length: int | None = None,
    ):
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_path)
        architectures = getattr(config, "architectures", None) or []
        if not any(a in SUPPORTED_ARCHITECTURES for a in architectures):
            raise ValueError(
                f"{model_path}: architecture {architectures} is not one the built-in engine runs "
                f"({', '.join(SUPPORTED_ARCHITECTURES)}); use real SGLang on a GPU machine for it"
            )
        if getattr(config, "use_sliding_window", False):
            raise ValueError(f"{model_path}: sliding-window attention is not supported by the built-in engine")
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        self.model.eval().requires_grad_(False)
        self.config = self.model.config
        self.dtype = dtype
        self.vocab_size = self.config.vocab_size
        self.num_layers = self.config.num_hidden_layers
        self.num_kv_heads = self.config.num_key_value_heads
        self.head_dim = (
            getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        )
        max_positions = getattr(self.config, "max_position_embeddings", 2048)
        self.context_length = min(context_length or max_positions, max_positions)
        self.max_running_requests = max_running_requests
        self._params = dict(self.model.named_parameters())
        self._tied_names = self._tied_parameter_names()
        self.k_pool: list[torch.Tensor] = []
        self.v_pool: list[torch.Tensor] = []
        self.allocate_kv_pool()

    # ------------------------------------------------------------------------------------------
    # KV pool

    def kv_pool_bytes(self) -> int:
        per_layer = self.max_running_requests * self.context_length * self.num_kv_heads * self.head_dim
        return 2 * self.num_layers * per_layer * torch.tensor([], dtype=self.dtype).element_size()

    def allocate_kv_pool(self) -> None:
        # Uninitialised: zero-filling the whole pool costs a full pass over it (and commits every page)
        # each time a colocated engine gets its memory back. A step reads a slot only up to the
        # longest sequence of its batch, so forward() zeroes what it is about to read and nothing has
        # written yet; _finite[slot] is how many leading positions of the slot hold finite values.
        shape = (self.max_running_requests, self.context_length, self.num_kv_heads, self.head_dim)
        self.k_pool = [torch.empty(shape, dtype=self.dtype) for _ in range(self.num_layers)]
        self.v_pool = [torch.empty(shape, dtype=self.dtype) for _ in range(self.num_layers)]
        self._finite = [0] * self.max_running_requests

    def free_kv_pool(self) -> None:
        self.k_pool, self.v_pool = [], []

    @property
    def kv_pool_allocated(self) -> bool:
        return bool(self.k_pool)

    # ------------------------------------------------------------------------------------------
    # forward

    @torch.inference_mode()
    def forward(
        self,
        slots: list[int],
        new_tokens: list[list[int]],
        start_positions: list[int],
        want_chunk_logits: list[bool] | None = None,
    ) -> StepOutput:
        """One batched step. Request ``b`` has ``start_positions[b]`` tokens cached in slot ``slots[b]``
        and feeds ``new_tokens[b]`` (at least one). Returns float32 logits (see :class:`StepOutput`)."""
        batch = len(slots)
        lengths = torch.tensor([len(t) for t in new_tokens])
        width = int(lengths.max())
        tokens = torch.tensor([toks + [0] * (width - len(toks)) for toks in new_tokens], dtype=torch.long)
        starts = torch.tensor(start_positions, dtype=torch.long)
        positions = starts[:, None] + torch.arange(width)[None, :]  # [B, T]
        valid = torch.arange(width)[None, :] < lengths[:, None]  # [B, T]
        kv_len = int((starts + lengths).max())
        slot_index = torch.tensor(slots, dtype=torch.long)
        # Scatter targets for the new keys/values: only real tokens, never the padding.
        write_b, write_t = valid.nonzero(as_tuple=True)
        write_slot, write_pos = slot_index[write_b], positions[write_b, write_t]
        # attend[b, 0, t, k]: key position k is visible to the query at positions[b, t] (causal).
        attend = (torch.arange(kv_len)[None, None, :] <= positions[:, :, None])[:, None]
        self._zero_unwritten(slots, start_positions, [len(t) for t in new_tokens], kv_len)

        inner = self.model.model
        hidden = inner.embed_tokens(tokens)
        cos, sin = inner.rotary_emb(hidden, positions)
        for layer_idx, layer in enumerate(inner.layers):
            residual = hidden
            hidden = layer.input_layernorm(hidden)
            hidden = self._attention(layer.self_attn, layer_idx, hidden, cos, sin, slot_index, write_b, write_t,
                                     write_slot, write_pos, attend, kv_len)
            hidden = residual + hidden
            residual = hidden
            hidden = residual + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = inner.norm(hidden)

        last_hidden = hidden[torch.arange(batch), lengths - 1]
        last_logits = self.model.lm_head(last_hidden).float()
        chunk_logits: list[torch.Tensor | None] = [None] * batch
        for b, wanted in enumerate(want_chunk_logits or []):
            if wanted:
                chunk_logits[b] = self.model.lm_head(hidden[b, : lengths[b]]).float()
        return StepOutput(last_logits=last_logits, chunk_logits=chunk_logits)

    @torch.inference_mode()
    def copy_cache(self, copies: list[tuple[int, int, int]]) -> None:
        """For each ``(src, dst, length)``: slot ``dst`` gets the first ``length`` cached positions of
        slot ``src`` (a request with the same tokens so far)."""
        src, dst, pos = [], [], []
        for s, d, length in copies:
            src.extend([s] * length)
            dst.extend([d] * length)
            pos.extend(range(length))
            self._finite[d] = max(self._finite[d], length)
        source, target = (torch.tensor(src), torch.tensor(pos)), (torch.tensor(dst), torch.tensor(pos))
        for pool in (*self.k_pool, *self.v_pool):
            pool[target] = pool[source]

    def _zero_unwritten(self, slots: list[int], starts: list[int], lengths: list[int], kv_len: int) -> None:
        """Zero the positions this step reads (< kv_len) that neither hold values yet nor get written
        now: masked keys must still be finite, or 0 * NaN spoils the attention output."""
        zero_slot, zero_pos = [], []
        for slot, start, length in zip(slots, starts, lengths):
            first = max(start + length, self._finite[slot])
            zero_slot.extend([slot] * (kv_len - first))
            zero_pos.extend(range(first, kv_len))
            self._finite[slot] = max(self._finite[slot], kv_len)
        if zero_slot:
            index = (torch.tensor(zero_slot), torch.tensor(zero_pos))
            for pool in (*self.k_pool, *self.v_pool):
                pool[index] = 0

    def _attention(self, attn, layer_idx, hidden, cos, sin, slot_index, write_b, write_t, write_slot, write_pos,
                   attend, kv_len):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        batch, width, _ = hidden.shape
        q = attn.q_proj(hidden).view(batch, width, -1, self.head_dim)
        k = attn.k_proj(hidden).view(batch, width, -1, self.head_dim)
        v = attn.v_proj(hidden).view(batch, width, -1, self.head_dim)
        if getattr(attn, "q_norm", None) is not None:  # Qwen3 normalises q and k per head
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [B, heads, T, D]
        k_pool, v_pool = self.k_pool[layer_idx], self.v_pool[layer_idx]
        k_pool[write_slot, write_pos] = k.transpose(1, 2)[write_b, write_t]
        v_pool[write_slot, write_pos] = v[write_b, write_t]
        keys = k_pool[slot_index, :kv_len].transpose(1, 2)  # [B, kv_heads, L, D]
        values = v_pool[slot_index, :kv_len].transpose(1, 2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=attend, scale=attn.scaling, enable_gqa=True)
        return attn.o_proj(out.transpose(1, 2).reshape(batch, width, -1))

    # ------------------------------------------------------------------------------------------
    # weights

    def _tied_parameter_names(self) -> set[str]:
        """HF names that share storage with another parameter (lm_head.weight when embeddings are tied)."""
        named = dict(self.model.named_parameters(remove_duplicate=False))
        seen: dict[int, str] = {}
        tied = set()
        for name, param in named.items():
            if param.data_ptr() in seen:
                tied.add(name)
            else:
                seen[param.data_ptr()] = name
        return tied

    def parameter_names(self) -> list[str]:
        return list(self._params)

    @torch.inference_mode()
    def load_named_tensors(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy HF-named tensors into the model (cast to its dtype). Returns how many were loaded.

        Names must be the model's own HF parameter names; a tied ``lm_head.weight`` is accepted and
        lands in the shared embedding. Every name and shape is checked before anything is copied, so
        a bad update leaves the weights as they were.
        """
        named_tensors = list(named_tensors)
        all_params = dict(self.model.named_parameters(remove_duplicate=False))
        for name, tensor in named_tensors:
            param = all_params.get(name)
            if param is None:
                raise WeightLoadError(f"unknown weight name {name!r} (not a parameter of "
                                      f"{self.config.architectures[0]})")
            if tuple(param.shape) != tuple(tensor.shape):
                raise WeightLoadError(
                    f"weight {name!r} has shape {tuple(tensor.shape)}, the model expects {tuple(param.shape)}"
                )
        for name, tensor in named_tensors:
            param = all_params[name]
            param.copy_(tensor.to(dtype=param.dtype, device=param.device))
        return len(named_tensors)

    def load_from_disk(self, model_path: str | Path) -> int:
        """Load every tensor of the safetensors files in ``model_path`` (an HF checkpoint directory)."""
        from safetensors import safe_open

        files = sorted(Path(model_path).glob("*.safetensors"))
        if not files:
            raise WeightLoadError(f"{model_path}: no *.safetensors files (an HF checkpoint directory is expected)")
        named: dict[str, torch.Tensor] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                named.update((name, f.get_tensor(name)) for name in f.keys())
        missing = set(self._params) - set(named) - self._tied_names
        if missing:
            raise WeightLoadError(f"{model_path}: checkpoint lacks {len(missing)} weights, e.g. {sorted(missing)[:3]}")
        loaded = self.load_named_tensors(named.items())
        return loaded
