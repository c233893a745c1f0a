"""``slime-ref convert``: HF checkpoints <-> our Megatron (torch_dist) checkpoints.

The counterparts of slime's ``tools/convert_hf_to_torch_dist.py`` and
``tools/convert_torch_dist_to_hf.py``::

    slime-ref convert hf-to-torch-dist --hf-checkpoint Qwen3-0.6B --save Qwen3-0.6B_torch_dist
    slime-ref convert torch-dist-to-hf --input-dir ckpt/iter_0000007 --output-dir out_hf \\
        --origin-hf-dir Qwen3-0.6B

The torch_dist side is megatron's dist_checkpointing format, resharded on load, so a conversion
done in one process loads under any TP/PP split. ``hf-to-torch-dist`` writes ``SAVE/release``
(weights only) with the tracker set to "release", as slime's tool does; ``--load`` of that
directory starts training from those weights at rollout 0. Tensors keep their dtype both ways,
so HF -> torch_dist -> HF gives back the same bytes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import click

from slime_ref.errors import UserError
from slime_ref.utils.net import allocate_port


def _single_process_model(hf_dir: Path, dtype):
    """Join a one-process group and build the model for ``hf_dir``'s config in ``dtype``."""
    import torch

    from slime_ref.backends.megatron import initialize
    from slime_ref.backends.megatron.model import build_model, read_hf_architecture, transformer_config

    if dtype == torch.float16:
        raise UserError("fp16 checkpoints are not supported; convert from bf16 or fp32")
    initialize.init_distributed(0, 1, master_port=allocate_port())
    args = argparse.Namespace(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, seed=1234,
                              bf16=dtype == torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0)
    initialize.init_model_parallel(args)
    arch = read_hf_architecture(hf_dir)
    model = build_model(arch, transformer_config(arch, args), pre_process=True, post_process=True)
    return arch, model


def hf_to_torch_dist(hf_dir: str | Path, save: str | Path) -> Path:
    from slime_ref.backends.megatron import checkpoint, initialize
    from slime_ref.backends.megatron.hf_weights import HFCheckpoint, load_hf_weights

    hf_dir = Path(hf_dir)
    reader = HFCheckpoint(hf_dir)
    dtype = reader.get(next(iter(reader.weight_map))).dtype
    try:
        arch, model = _single_process_model(hf_dir, dtype)
        load_hf_weights(model, arch, hf_dir)
        return checkpoint.save_release(save, model)
    finally:
        initialize.destroy()


def torch_dist_to_hf(input_dir: str | Path, output_dir: str | Path, origin_hf_dir: str | Path) -> Path:
    from slime_ref.backends.megatron import checkpoint

    path = checkpoint.find_checkpoint(input_dir)
    if path is None:
        raise UserError(f"--input-dir {input_dir}: no checkpoint there (no {checkpoint.TRACKER} or metadata.json)")

    from megatron.core import dist_checkpointing

    from slime_ref.backends.megatron import initialize
    from slime_ref.backends.megatron.hf_weights import save_hf_checkpoint
    metadata = dist_checkpointing.load_tensors_metadata(str(path))
    if "embedding.word_embeddings.weight" not in metadata:
        raise UserError(f"--input-dir {path}: the checkpoint holds no model weights")
    dtype = metadata["embedding.word_embeddings.weight"].dtype
    try:
        arch, model = _single_process_model(Path(origin_hf_dir), dtype)
        checkpoint.load_checkpoint(path, model, load_optimizer=False, load_rng=False)
        save_hf_checkpoint(model, arch, origin_hf_dir, output_dir)
        return Path(output_dir)
    finally:
        initialize.destroy()


@click.group("convert")
def convert() -> None:
    """Convert between HF checkpoints and Megatron torch_dist checkpoints (like slime's tools/)."""


@convert.command("hf-to-torch-dist")
@click.option("--hf-checkpoint", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="HF model directory (config.json + safetensors).")
@click.option("--save", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Checkpoint directory to write (SAVE/release + tracker).")
def hf_to_torch_dist_cmd(hf_checkpoint: Path, save: Path) -> None:
    """HF weights -> a torch_dist checkpoint that --load (or --ref-load) accepts."""
    out = hf_to_torch_dist(hf_checkpoint, save)
    click.echo(f"wrote {out}")


@convert.command("torch-dist-to-hf")
@click.option("--input-dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A --save directory (latest checkpoint) or one iter_*/release directory in it.")
@click.option("--output-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="HF model directory to write.")
@click.option("--origin-hf-dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The HF model the checkpoint came from (config and tokenizer are copied from it).")
def torch_dist_to_hf_cmd(input_dir: Path, output_dir: Path, origin_hf_dir: Path) -> None:
    """A torch_dist checkpoint -> HF safetensors with the original config and tokenizer."""
    out = torch_dist_to_hf(input_dir, output_dir, origin_hf_dir)
    click.echo(f"wrote {out}")
