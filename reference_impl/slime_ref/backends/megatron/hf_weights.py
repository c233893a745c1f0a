"""HF <-> Megatron weights: load safetensors into any TP/PP split, export HF-named tensors back.

Naming (Megatron local spec <- HF, ``L`` = global layer index)::

    embedding.word_embeddings.weight                 <- model.embed_tokens.weight
    decoder.layers.L.input_layernorm.weight          <- model.layers.L.input_layernorm.weight
    decoder.layers.L.self_attention.linear_qkv.weight <- q_proj, k_proj, v_proj (interleaved by query group)
    decoder.layers.L.self_attention.linear_qkv.bias   <- q/k/v biases (Qwen2)
    decoder.layers.L.self_attention.q_layernorm.weight <- self_attn.q_norm.weight (Qwen3; k likewise)
    decoder.layers.L.self_attention.linear_proj.weight <- self_attn.o_proj.weight
    decoder.layers.L.pre_mlp_layernorm.weight        <- post_attention_layernorm.weight
    decoder.layers.L.mlp.linear_fc1.weight           <- [gate_proj; up_proj]
    decoder.layers.L.mlp.linear_fc2.weight           <- mlp.down_proj.weight
    decoder.final_layernorm.weight                   <- model.norm.weight
    output_layer.weight                              <- lm_head.weight (embed_tokens when tied)

Megatron's fused QKV stores, for each of the ``ng`` query groups, that group's ``np/ng`` query
heads followed by its key head and its value head. Under tensor parallelism each rank holds a
contiguous block of groups, so the interleaved tensor splits evenly by rows. The SwiGLU ``fc1``
holds ``[gate; up]`` per rank: rank r has ``[gate_r; up_r]``, not a row block of the full tensor.
Vocab rows are padded up to a multiple of TP with zeros and stripped again on export.

Loading needs no communication: every rank reads the tensors it needs from the safetensors files
and cuts its own shard. Exporting is collective: every rank of the job must iterate
:func:`iter_hf_weight_buckets` together; each gets full (gathered over TP and PP) HF tensors,
a bucket of at most ``bucket_bytes`` at a time.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from slime_ref.backends.megatron.model import HFArchitecture
from slime_ref.errors import UserError

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")
HF_ASSET_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".py", ".tiktoken")


# ---------------------------------------------------------------------------------------------
# full-tensor conversions (no parallelism)


def qkv_to_megatron(arch: HFArchitecture, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [np*hn, ...], k/v [ng*hn, ...] -> fused [(np + 2 ng) * hn, ...], interleaved per query group."""
    ng, hn = arch.num_key_value_heads, arch.head_dim
    per_group = arch.num_attention_heads // ng
    rest = q.shape[1:]
    fused = torch.cat(
        [q.reshape(ng, per_group * hn, *rest), k.reshape(ng, hn, *rest), v.reshape(ng, hn, *rest)], dim=1
    )
    return fused.reshape(-1, *rest)


def qkv_to_hf(arch: HFArchitecture, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ng, hn = arch.num_key_value_heads, arch.head_dim
    per_group = arch.num_attention_heads // ng
    rest = fused.shape[1:]
    grouped = fused.reshape(ng, (per_group + 2) * hn, *rest)
    q, k, v = torch.split(grouped, [per_group * hn, hn, hn], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def hf_names(arch: HFArchitecture, name: str) -> list[str]:
    """The HF tensors that make up the (global-named) Megatron parameter ``name``."""
    if name == "embedding.word_embeddings.weight":
        return ["model.embed_tokens.weight"]
    if name == "output_layer.weight":
        return ["model.embed_tokens.weight" if arch.tie_word_embeddings else "lm_head.weight"]
    if name == "decoder.final_layernorm.weight":
        return ["model.norm.weight"]
    m = _LAYER.fullmatch(name)
    if not m:
        raise KeyError(f"no HF mapping for Megatron parameter {name}")
    layer, rest = m.groups()
    p = f"model.layers.{layer}."
    table = {
        "input_layernorm.weight": ["input_layernorm.weight"],
        "self_attention.linear_qkv.weight": [f"self_attn.{x}_proj.weight" for x in "qkv"],
        "self_attention.linear_qkv.bias": [f"self_attn.{x}_proj.bias" for x in "qkv"],
        "self_attention.q_layernorm.weight": ["self_attn.q_norm.weight"],
        "self_attention.k_layernorm.weight": ["self_attn.k_norm.weight"],
        "self_attention.linear_proj.weight": ["self_attn.o_proj.weight"],
        "pre_mlp_layernorm.weight": ["post_attention_layernorm.weight"],
        "mlp.linear_fc1.weight": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
        "mlp.linear_fc2.weight": ["mlp.down_proj.weight"],
    }
    if rest not in table:
        raise KeyError(f"no HF mapping for Megatron parameter {name}")
    return [p + n for n in table[rest]]


def to_megatron(arch: HFArchitecture, name: str, hf: list[torch.Tensor], padded_vocab: int) -> torch.Tensor:
    """Full (unsharded) Megatron tensor from its HF tensors (see :func:`hf_names`)."""
    if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
        return qkv_to_megatron(arch, *hf)
    if name.endswith("linear_fc1.weight"):
        return torch.cat(hf, dim=0)
    (tensor,) = hf
    if name in ("embedding.word_embeddings.weight", "output_layer.weight") and padded_vocab > tensor.shape[0]:
        pad = tensor.new_zeros(padded_vocab - tensor.shape[0], tensor.shape[1])
        tensor = torch.cat([tensor, pad], dim=0)
    return tensor


def to_hf(arch: HFArchitecture, name: str, full: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs from a full Megatron tensor; inverse of :func:`to_megatron`."""
    names = hf_names(arch, name)
    if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
        return list(zip(names, qkv_to_hf(arch, full)))
    if name.endswith("linear_fc1.weight"):
        return list(zip(names, full.chunk(2, dim=0)))
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        full = full[: arch.vocab_size]
    return [(names[0], full)]


# ---------------------------------------------------------------------------------------------
# tensor-parallel shards


def _tp_split(param: torch.nn.Parameter) -> tuple[bool, int]:
    return bool(getattr(param, "tensor_model_parallel", False)), getattr(param, "partition_dim", 0)


def shard(name: str, full: torch.Tensor, param: torch.nn.Parameter, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This rank's shard of a full Megatron tensor."""
    split, dim = _tp_split(param)
    if not split or tp_size == 1:
        return full
    if name.endswith("linear_fc1.weight"):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp_size, dim=0)[tp_rank], up.chunk(tp_size, dim=0)[tp_rank]], dim=0)
    return full.chunk(tp_size, dim=dim)[tp_rank]


def unshard(name: str, shards: list[torch.Tensor], split: bool, dim: int) -> torch.Tensor:
    """Full Megatron tensor from all TP ranks' shards; inverse of :func:`shard`."""
    if not split or len(shards) == 1:
        return shards[0]
    if name.endswith("linear_fc1.weight"):
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(shards, dim=dim)


# ---------------------------------------------------------------------------------------------
# local parameters with global names


def unwrap(model) -> torch.nn.Module:
    while hasattr(model, "module"):
        model = model.module
    return model


def global_named_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    """(global name, parameter) for this rank's chunk: local layer indices shifted by the PP offset.

    The output layer of a tied model is skipped: it is the input embedding.
    """
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    module = unwrap(model)
    offset = get_transformer_layer_offset(module.config)
    named = []
    for name, param in module.named_parameters():
        if name == "output_layer.weight" and module.share_embeddings_and_output_weights:
            continue
        m = _LAYER.fullmatch(name)
        if m:
            name = f"decoder.layers.{int(m.group(1)) + offset}.{m.group(2)}"
        named.append((name, param))
    return named


# ---------------------------------------------------------------------------------------------
# loading


class HFCheckpoint:
    """Lazy reader of an HF safetensors checkpoint (single file or sharded with an index)."""

    def __init__(self, model_dir: str | Path):
        from safetensors import safe_open

        self.model_dir = Path(model_dir)
        index = self.model_dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        elif (self.model_dir / "model.safetensors").is_file():
            files = ["model.safetensors"]
            weight_map = None
        else:
            raise UserError(
                f"--hf-checkpoint {model_dir}: no model.safetensors or model.safetensors.index.json; "
                "save the model with safe_serialization=True"
            )
        self._handles = {f: safe_open(str(self.model_dir / f), framework="pt") for f in files}
        if weight_map is None:
            weight_map = {k: files[0] for k in self._handles[files[0]].keys()}
        self.weight_map = weight_map

    def get(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise UserError(f"{self.model_dir}: tensor {name} is missing from the checkpoint")
        return self._handles[self.weight_map[name]].get_tensor(name)


@torch.no_grad()
def load_hf_weights(model, arch: HFArchitecture, model_dir: str | Path) -> None:
    """Copy an HF checkpoint into this rank's model chunk (any TP/PP split, no communication)."""
    from megatron.core import parallel_state as ps

    ckpt = HFCheckpoint(model_dir)
    tp_rank, tp_size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    module = unwrap(model)
    params = dict(global_named_parameters(model))
    if type(getattr(module, "output_layer", None)).__name__ == "ValueHead":
        params.pop("output_layer.weight", None)  # the critic's value head has no HF counterpart
    if module.share_embeddings_and_output_weights and module.post_process and not module.pre_process:
        # a tied model's last pipeline stage keeps its own copy of the embedding as output layer
        params["output_layer.weight"] = module.output_layer.weight
    for name, param in params.items():
        full = to_megatron(arch, name, [ckpt.get(n) for n in hf_names(arch, name)], _padded_rows(param, tp_size))
        local = shard(name, full, param, tp_rank, tp_size)
        if local.shape != param.shape:
            raise UserError(
                f"{model_dir}: {name} has shape {tuple(local.shape)} after TP split, the model expects "
                f"{tuple(param.shape)}; does config.json match the weights?"
            )
        param.data.copy_(local)


def _padded_rows(param: torch.nn.Parameter, tp_size: int) -> int:
    split, dim = _tp_split(param)
    return param.shape[0] * (tp_size if split and dim == 0 else 1)


# ---------------------------------------------------------------------------------------------
# exporting


@dataclass(frozen=True)
class ParamInfo:
    name: str
    local_shape: tuple[int, ...]
    dtype: torch.dtype
    split: bool
    dim: int
    pp_stage: int

    def full_bytes(self, tp_size: int) -> int:
        numel = 1
        for n in self.local_shape:
            numel *= n
        return numel * self.dtype.itemsize * (tp_size if self.split else 1)


def _layer_order(name: str) -> tuple:
    if name.startswith("embedding."):
        return (0, 0, name)
    m = _LAYER.fullmatch(name)
    if m:
        return (1, int(m.group(1)), name)
    return (2, 0, name)


def export_plan(model, bucket_bytes: int) -> list[list[ParamInfo]]:
    """Every parameter of the whole model (all PP stages), in HF order, packed into buckets.

    Collective over the pipeline group. A bucket holds parameters whose full (TP-gathered) size
    adds up to at most ``bucket_bytes``; a larger parameter gets a bucket of its own.
    """
    from megatron.core import parallel_state as ps

    stage = ps.get_pipeline_model_parallel_rank()
    local = [
        ParamInfo(name, tuple(p.shape), p.dtype, *_tp_split(p), stage) for name, p in global_named_parameters(model)
    ]
    gathered: list[list[ParamInfo]] = [None] * ps.get_pipeline_model_parallel_world_size()
    if len(gathered) > 1:
        dist.all_gather_object(gathered, local, group=ps.get_pipeline_model_parallel_group())
    else:
        gathered = [local]
    infos = sorted((info for stage_infos in gathered for info in stage_infos), key=lambda i: _layer_order(i.name))

    tp_size = ps.get_tensor_model_parallel_world_size()
    buckets, current, size = [], [], 0
    for info in infos:
        nbytes = info.full_bytes(tp_size)
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(info)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


@torch.no_grad()
def iter_hf_weight_buckets(model, arch: HFArchitecture, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Yield the whole model as HF-named full tensors, one bucket (list of pairs) at a time.

    Collective: every rank must run it to the end together. Each PP stage's tensors are broadcast
    to the other stages and TP shards are all-gathered, so every rank receives every tensor.
    """
    from megatron.core import parallel_state as ps

    pp_group = ps.get_pipeline_model_parallel_group()
    pp_size = ps.get_pipeline_model_parallel_world_size()
    pp_ranks = dist.get_process_group_ranks(pp_group) if pp_size > 1 else None
    stage = ps.get_pipeline_model_parallel_rank()
    tp_group = ps.get_tensor_model_parallel_group()
    tp_size = ps.get_tensor_model_parallel_world_size()
    device = next(unwrap(model).parameters()).device
    params = dict(global_named_parameters(model))

    for bucket in export_plan(model, bucket_bytes):
        out = []
        for info in bucket:
            if info.pp_stage == stage:
                local = params[info.name].detach()
            else:
                local = torch.empty(info.local_shape, dtype=info.dtype, device=device)
            if pp_size > 1:
                local = local.contiguous()
                dist.broadcast(local, src=pp_ranks[info.pp_stage], group=pp_group)
            if info.split and tp_size > 1:
                shards = [torch.empty_like(local) for _ in range(tp_size)]
                dist.all_gather(shards, local.contiguous(), group=tp_group)
            else:
                shards = [local]
            out.extend(to_hf(arch, info.name, unshard(info.name, shards, info.split, info.dim)))
        yield out


def save_hf_checkpoint(model, arch: HFArchitecture, source_dir: str | Path, out_dir: str | Path,
                       bucket_bytes: int = 512 * 1024**2) -> None:
    """Write the model as an HF checkpoint (safetensors + the source's config/tokenizer files).

    Collective; rank 0 writes one safetensors shard per bucket, so memory stays bounded by the
    bucket size. The directory appears atomically: a crash leaves no partial model.
    """
    import contextlib

    from safetensors.torch import save_file

    from slime_common.fileio import _umask
    from slime_ref.utils.fileio import atomic_directory

    source_dir, out_dir = Path(source_dir), Path(out_dir)
    if out_dir.resolve() == source_dir.resolve():
        raise UserError(f"--save-hf {out_dir}: must not be the --hf-checkpoint directory it was loaded from")
    writer = dist.get_rank() == 0
    with atomic_directory(out_dir) if writer else contextlib.nullcontext() as tmp:
        weight_map, total = {}, 0
        for i, bucket in enumerate(iter_hf_weight_buckets(model, arch, bucket_bytes)):
            if not writer:
                continue
            shard_name = f"model-{i + 1:05d}.safetensors"
            tensors = {name: t.detach().to("cpu").contiguous() for name, t in bucket}
            save_file(tensors, str(tmp / shard_name), metadata={"format": "pt"})
            (tmp / shard_name).chmod(0o666 & ~_umask())  # safetensors writes 0600; the umask's mode, as open()
            weight_map.update(dict.fromkeys(tensors, shard_name))
            total += sum(t.numel() * t.element_size() for t in tensors.values())
        if writer:
            shards = sorted(set(weight_map.values()))
            if len(shards) == 1:
                (tmp / shards[0]).rename(tmp / "model.safetensors")
            else:
                index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
                (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
            for f in sorted(source_dir.iterdir()):
                if f.is_file() and f.suffix in HF_ASSET_SUFFIXES and not f.name.startswith("model.safetensors"):
                    shutil.copy2(f, tmp / f.name)
    dist.barrier()
