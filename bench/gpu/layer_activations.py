"""What one transformer layer keeps for backward, per token of a micro-batch, tensor by tensor: the layers
the GPU machine's set trains with (bench/gpu/te_named_local_spec.py, slime's ``--transformer-impl local``
path), on CUDA or on CPU, beside ``slime-check plan``'s count for the same layer. Prints JSON.

    PYTHONPATH=$MEGATRON_DIR:reference_impl:bench/gpu python bench/gpu/layer_activations.py \\
        --shape qwen3-0.6B --tokens 8192 --sequences 4 --out $OUT

Two measures of the same thing: the storages autograd saves inside the layer's forward (each once,
parameters left out), named by the backward node that holds them, and, on CUDA, the growth of allocated
memory across the layer's forward less its output (what a kernel keeps outside autograd's saved tensors
shows up only there). On CPU the attention is one SDPA call per sequence, which keeps more than CUDA's
varlen flash attention: a CPU figure is not the GPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from memory_fit import SHAPES  # noqa: E402  (layers, hidden, ffn, heads)

QWEN3_KV_HEADS, QWEN3_HEAD_DIM = 8, 128


def _node_names(root) -> dict[int, str]:
    """storage pointer -> the name of a backward node that saved it, over the graph below ``root``."""
    names, seen, todo = {}, set(), [root]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        saved = []
        try:
            saved = list(node.saved_tensors)  # custom autograd Functions
        except (AttributeError, RuntimeError):
            pass
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    v = getattr(node, attr)
                except RuntimeError:
                    continue
                values = v if isinstance(v, (tuple, list)) else [v]
                saved += [t for t in values if isinstance(t, torch.Tensor)]
        for t in saved:
            names.setdefault(t.untyped_storage().data_ptr(), type(node).__name__)
        todo += [n for n, _ in node.next_functions]
    return names


def measure(shape: str, tokens: int, sequences: int, device: str, pre_norm: str = "hf") -> dict:
    import te_named_local_spec as spec_module
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.transformer_config import TransformerConfig

    from slime_ref.backends.megatron import initialize
    from slime_ref.backends.megatron.layers import rms_norm as hf_rms_norm

    # the set's pre-norms (HF's arithmetic: fp32, cast, then the weight), or torch's as Megatron's local spec
    spec_module.rms_norm = hf_rms_norm if pre_norm == "hf" else (
        lambda x, weight, eps: F.rms_norm(x, (x.shape[-1],), weight, eps))
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    initialize.init_distributed(0, 1)
    ps.initialize_model_parallel()
    initialize.set_seed(0)
    _, hidden, ffn, heads = SHAPES[shape]
    config = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=heads,
                               num_query_groups=QWEN3_KV_HEADS, ffn_hidden_size=ffn, kv_channels=QWEN3_HEAD_DIM,
                               normalization="RMSNorm", layernorm_epsilon=1e-6, gated_linear_unit=True,
                               activation_func=F.silu, add_bias_linear=False, qk_layernorm=True,
                               use_cpu_initialization=device == "cpu", masked_softmax_fusion=False,
                               bias_activation_fusion=False, apply_rope_fusion=False,
                               gradient_accumulation_fusion=False, persist_layer_norm=False, attention_dropout=0.0,
                               hidden_dropout=0.0, params_dtype=torch.bfloat16, bf16=True)
    spec = spec_module.te_named_local_spec(argparse.Namespace(qk_layernorm=True, normalization="RMSNorm"), config)
    model = GPTModel(config, spec, vocab_size=128, max_sequence_length=tokens, position_embedding_type="rope",
                     rotary_base=1000000).to(device=device, dtype=torch.bfloat16)  # as Megatron's Float16Module
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    length = tokens // sequences
    cu = torch.arange(0, tokens + 1, length, dtype=torch.int32, device=device)
    packed = PackedSeqParams(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=length, max_seqlen_kv=length,
                             qkv_format="thd")
    inside, saved, grown = [False], {}, {}
    cuda = device != "cpu"

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if inside[0] and ptr not in params and ptr not in saved:
            saved[ptr] = (t.untyped_storage().nbytes(), list(t.shape), str(t.dtype).removeprefix("torch."))
        return t

    def enter(*_):
        inside[0] = True
        if cuda:
            torch.cuda.synchronize()
            grown["before"] = torch.cuda.memory_allocated()

    def leave(_module, _inputs, output):
        inside[0] = False
        if cuda:
            torch.cuda.synchronize()
            out = output[0] if isinstance(output, tuple) else output
            grown["kept"] = torch.cuda.memory_allocated() - grown["before"] - out.untyped_storage().nbytes()

    layer = model.decoder.layers[0]
    layer.register_forward_pre_hook(enter)
    layer.register_forward_hook(leave)
    ids = torch.randint(0, 128, (1, tokens), device=device)
    positions = torch.arange(length, device=device).repeat(sequences).unsqueeze(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(ids, positions, attention_mask=None, packed_seq_params=packed)
    names = _node_names(logits.grad_fn)
    by_node = defaultdict(int)
    rows = []
    for ptr, (nbytes, shp, dtype) in sorted(saved.items(), key=lambda kv: -kv[1][0]):
        node = names.get(ptr, "?")
        by_node[node] += nbytes
        rows.append({"bytes_per_token": nbytes / tokens, "shape": shp, "dtype": dtype, "saved_by": node})
    initialize.destroy()
    return {"shape": shape, "tokens": tokens, "sequences": sequences, "device": device, "pre_norm": pre_norm,
            "gpu": torch.cuda.get_device_name() if cuda else None, "torch": torch.__version__,
            "saved_bytes_per_token": sum(r["bytes_per_token"] for r in rows),
            "allocated_growth_bytes_per_token": grown["kept"] / tokens if "kept" in grown else None,
            "by_node": {k: v / tokens for k, v in sorted(by_node.items(), key=lambda kv: -kv[1])},
            "tensors": rows}


def plan_count(shape: str, tokens: int) -> dict:
    from slime_check import plan as P
    from slime_check import plan_job as J

    _, hidden, ffn, heads = SHAPES[shape]
    s = J.Shape(layers=1, hidden=hidden, ffn=ffn, heads=heads, kv_heads=QWEN3_KV_HEADS, head_dim=QWEN3_HEAD_DIM,
                vocab=128, tied=False, qk_norm=True)
    out = {}
    for impl in ("transformer_engine", "local"):
        train = J.Train(longest=tokens, layer_impl=impl)
        out[impl] = P.layer_activation_per_token(s, J.Parallel(world=1), train, False)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["qwen3-0.6B"])
    p.add_argument("--tokens", type=int, default=8192, help="tokens in the packed micro-batch")
    p.add_argument("--sequences", type=int, default=4, help="equal sequences the micro-batch packs")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--pre-norm", choices=["hf", "torch"], nargs="+", default=["hf"],
                   help="the pre-norms: hf (the set's spec: HF's arithmetic, fp32 then cast; torch.compile'd on CUDA) "
                   "or torch (torch's rms_norm, as Megatron's local spec; fused on CUDA). On CUDA both keep the same")
    p.add_argument("--out", type=Path, default=None, help="folder for layer-activations-<device>.json")
    a = p.parse_args()
    if a.tokens % a.sequences:
        p.error(f"--tokens {a.tokens} must be a multiple of --sequences {a.sequences}")
    runs = []
    for shape, pre_norm in ((s, n) for s in a.shape for n in a.pre_norm):
        r = measure(shape, a.tokens, a.sequences, a.device, pre_norm)
        r["plan_bytes_per_token"] = plan_count(shape, a.tokens)
        runs.append(r)
        print(f"{shape} ({pre_norm} pre-norms): saved {r['saved_bytes_per_token']:.0f} B/token, allocated growth "
              f"{r['allocated_growth_bytes_per_token']}, plan {r['plan_bytes_per_token']}", file=sys.stderr)
    text = json.dumps(runs, indent=1)
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"layer-activations-{a.device}.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
