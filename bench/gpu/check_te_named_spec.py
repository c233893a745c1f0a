"""Rehearse real slime's weight path on te_named_local_spec, on CPU, before any GPU time.

slime v0.3.1 loads HF weights into Megatron with its own converters (``hf_to_megatron``) and sends them
back to SGLang through ``megatron_to_hf``; both know only TransformerEngine's parameter names. This runs
those two converters, from slime's own source, on a model built from ``te_named_local_spec`` under
slime's own Megatron-LM (1dcf0da with slime's patch), for a Qwen2.5- and a Qwen3-shaped checkpoint
(2 layers, random weights, the real vocabulary), and checks:

- every Megatron parameter loads (slime raises ``KeyError`` on a name it does not know);
- the packed (THD) forward, as slime feeds it, gives HF transformers' logits (fp32);
- ``megatron_to_hf`` gives back every HF tensor bit for bit.

    python bench/gpu/check_te_named_spec.py --slime-dir ~/src/slime --megatron-dir ~/src/Megatron-LM

Both folders are source trees (the set's ``src-*.tar.gz`` unpacked will do); prints JSON, exits 1 on a
mismatch. Measured 2026-12-02 on 2 CPU cores: both shapes load, logits within 3e-7 of HF, all tensors
back exactly (Qwen2.5: 26, Qwen3: 24); the H200 run that followed went through.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def slime_args(arch) -> argparse.Namespace:
    """The fields of slime's parsed arguments that its converters read."""
    return argparse.Namespace(
        qk_layernorm=arch.qk_norm, normalization="RMSNorm", vocab_size=arch.vocab_size,
        padded_vocab_size=arch.vocab_size, hidden_size=arch.hidden_size, num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_key_value_heads, kv_channels=arch.head_dim, num_layers=arch.num_layers,
        num_experts=None, q_lora_rank=None)


def check(path: Path) -> dict:
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.packed_seq_params import PackedSeqParams
    from slime.backends.megatron_utils.hf_to_megatron import load_hf_weights
    from slime.backends.megatron_utils.megatron_to_hf import convert_to_hf
    from te_named_local_spec import te_named_local_spec
    from transformers import AutoModelForCausalLM

    from slime_ref.backends.megatron.model import read_hf_architecture, transformer_config

    arch = read_hf_architecture(path)
    config = transformer_config(arch, argparse.Namespace(  # one rank, fp32, no dropout: an exact comparison
        bf16=False, tensor_model_parallel_size=1, pipeline_model_parallel_size=1, hidden_dropout=0.0,
        attention_dropout=0.0), use_gpu_fusions=False)
    args = slime_args(arch)
    model = GPTModel(config, te_named_local_spec(args, config), vocab_size=arch.vocab_size, max_sequence_length=128,
                     position_embedding_type="rope", rotary_base=int(arch.rope.theta),
                     share_embeddings_and_output_weights=arch.tie_word_embeddings)
    for p in model.parameters():  # as Megatron's get_model does
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(p)

    class Wrapped(torch.nn.Module):  # slime's names: module.module.* (Float16Module inside DDP)
        def __init__(self, inner):
            super().__init__()
            self.module, self.config = inner, config

    wrapped = Wrapped(Wrapped(model))
    load_hf_weights(args, [wrapped], path)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    g = torch.Generator().manual_seed(0)
    lengths = [5, 9]
    seqs = [torch.randint(0, 300, (n,), generator=g) for n in lengths]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lengths),
                             max_seqlen_kv=max(lengths))
    with torch.no_grad():
        ours = model(torch.cat(seqs)[None], torch.cat([torch.arange(n) for n in lengths])[None],
                     attention_mask=None, packed_seq_params=packed)[0]
        theirs = torch.cat([reference(s[None]).logits[0] for s in seqs])

    hf_state = reference.state_dict()
    exact, wrong = 0, []
    for name, param in wrapped.named_parameters():
        for hf_name, tensor in convert_to_hf(args, arch.model_type, name, param.detach()):
            if hf_name in hf_state and torch.equal(tensor, hf_state[hf_name]):
                exact += 1
            else:
                wrong.append(hf_name)
    return {"model_type": arch.model_type, "megatron_params": sum(1 for _ in model.parameters()),
            "packed_logits_max_abs_diff_vs_hf": (ours - theirs).abs().max().item(),
            "hf_tensors_back_exactly": exact, "hf_tensors_wrong": wrong}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slime-dir", type=Path, required=True, help="slime v0.3.1's source tree")
    p.add_argument("--megatron-dir", type=Path, required=True, help="Megatron-LM 1dcf0da with slime's patch")
    p.add_argument("--workdir", type=Path, default=None, help="where the small checkpoints go (default: a temp dir)")
    a = p.parse_args()
    for flag, folder, inside in (("--slime-dir", a.slime_dir, "slime"), ("--megatron-dir", a.megatron_dir, "megatron")):
        if not (folder / inside).is_dir():
            print(f"check_te_named_spec.py: {flag} {folder} has no {inside}/ package", file=sys.stderr)
            raise SystemExit(2)
    # slime's Megatron-LM before any installed megatron-core; slime_ref only for the gloo start
    sys.path[:0] = [str(a.megatron_dir), str(a.slime_dir), str(HERE), str(REPO / "bench"), str(REPO / "reference_impl")]
    from megatron.core import parallel_state

    import shaped_model
    from slime_ref.assets import make_tiny
    from slime_ref.backends.megatron import initialize
    from slime_ref.utils.net import allocate_port

    initialize.init_distributed(0, 1, master_port=allocate_port())
    parallel_state.initialize_model_parallel()
    import megatron.core

    result = {"megatron": str(Path(megatron.core.__file__).parent), "shapes": {}}
    scratch = contextlib.nullcontext(a.workdir) if a.workdir else tempfile.TemporaryDirectory(prefix="te-spec-")
    with scratch as workdir:
        workdir = Path(workdir)
        tiny = make_tiny(workdir / "tiny", seed=0)
        for shape in ("qwen2.5-0.5B", "qwen3-0.6B"):
            path = shaped_model.build(workdir / shape, shape, tiny.model_dir, small=True)
            result["shapes"][shape] = check(path)
    ok = all(r["packed_logits_max_abs_diff_vs_hf"] < 1e-4 and not r["hf_tensors_wrong"]
             for r in result["shapes"].values())
    result["ok"] = ok
    print(json.dumps(result, indent=2))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
