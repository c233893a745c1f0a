"""HF checkpoints with a real model's shape, random bf16 weights and the embedded tiny model's
tokenizer and chat template, built here (no download). The GPU benches and the real-slime runs use them.

    python bench/shaped_model.py --shape qwen2.5-0.5B --out /tmp/q25      # also writes /tmp/q25-tiny/
    python bench/shaped_model.py --shape qwen3-0.6B --out /tmp/q3 --small # 2 layers, hidden 64, same vocab

The vocabulary keeps the real model's size (151,936 rows, as slime's MODEL_ARGS say), while the
tokenizer uses only its first few hundred ids: the model, not the tokenizer, sets the cost of a step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# The shapes of the models' own config.json files; weights random.
QWEN3_0_6B_SHAPE = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
QWEN2_5_0_5B_SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                          rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)
QWEN3_1_7B_SHAPE = {**QWEN3_0_6B_SHAPE, "hidden_size": 2048, "intermediate_size": 6144}
QWEN3_4B_SHAPE = {**QWEN3_0_6B_SHAPE, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                  "num_attention_heads": 32}
SHAPES = {"qwen3-0.6B": ("Qwen3Config", "Qwen3ForCausalLM", QWEN3_0_6B_SHAPE),
          "qwen3-1.7B": ("Qwen3Config", "Qwen3ForCausalLM", QWEN3_1_7B_SHAPE),
          "qwen3-4B": ("Qwen3Config", "Qwen3ForCausalLM", QWEN3_4B_SHAPE),
          "qwen2.5-0.5B": ("Qwen2Config", "Qwen2ForCausalLM", QWEN2_5_0_5B_SHAPE)}
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32)


def build(out: Path, shape: str, tiny_model: Path, small: bool = False, seed: int = 0) -> Path:
    """Write the checkpoint into ``out`` (kept if ``out/config.json`` exists) with ``tiny_model``'s
    tokenizer files and special-token ids; returns ``out``."""
    import torch
    import transformers

    if (out / "config.json").is_file():
        return out
    config_name, model_name, dims = SHAPES[shape]
    dims = {**dims, **(SMALL if small else {})}
    if small and shape.startswith("qwen2"):
        dims["head_dim"] = dims["hidden_size"] // dims["num_attention_heads"]
    ids = json.loads((tiny_model / "config.json").read_text())
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(**dims, torch_dtype="bfloat16", bos_token_id=ids["bos_token_id"],
                                                 eos_token_id=ids["eos_token_id"], pad_token_id=ids["pad_token_id"])
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = getattr(transformers, model_name)(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    copy_tokenizer(tiny_model, out)
    return out


def copy_tokenizer(src: Path, dst: Path) -> None:
    """The tokenizer files and chat template of checkpoint ``src`` into ``dst``."""
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (Path(src) / name).exists():
            shutil.copy2(Path(src) / name, Path(dst) / name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--out", type=Path, required=True, help="the checkpoint's folder")
    p.add_argument("--tiny", type=Path, help="slime-ref make-tiny's folder for the tokenizer and the arithmetic "
                                             "prompts (default: OUT-tiny, built if missing)")
    p.add_argument("--small", action="store_true", help="2 layers, hidden 64: for dry runs")
    a = p.parse_args()
    from slime_ref.assets import make_tiny

    tiny = make_tiny(a.tiny or a.out.with_name(a.out.name + "-tiny"), seed=0)
    build(a.out, a.shape, tiny.model_dir, small=a.small)
    print(json.dumps({"model": str(a.out), "shape": a.shape, "small": a.small, "train_data": str(tiny.train_path),
                      "eval_data": str(tiny.eval_path)}))


if __name__ == "__main__":
    main()
