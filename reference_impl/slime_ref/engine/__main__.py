"""``python -m slime_ref.engine``: serve an HF checkpoint with SGLang's HTTP protocol on CPU.

The flags are SGLang's names for the same settings (``--model-path``, ``--context-length``,
``--max-running-requests``, ``--random-seed``, ``--weight-version``, ...), plus ``--num-threads``
for torch's CPU threads.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from slime_ref.errors import USAGE_EXIT_CODE, UserError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m slime_ref.engine", description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True, help="HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--tokenizer-path", default=None, help="tokenizer directory (default: --model-path)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16", "float16"],
                   help="compute dtype; float32 (also what 'auto' means here) gives log-probs equal to the trainer's")
    p.add_argument("--context-length", type=int, default=None,
                   help="longest prompt + response in tokens (default: the model's max_position_embeddings)")
    p.add_argument("--max-running-requests", type=int, default=256,
                   help="requests decoded together; each holds one KV slot of --context-length tokens")
    p.add_argument("--random-seed", type=int, default=0, help="seeds requests that carry no sampling_seed")
    p.add_argument("--weight-version", default="default", help="reported in meta_info and /model_info")
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--skip-server-warmup", action="store_true", help="accepted for SGLang parity; there is no warmup")
    p.add_argument("--script", default=None, metavar="PATH",
                   help="JSON file of scripted answers for chosen prompts (see slime_ref.engine.script); "
                        "default: $SLIME_REF_ENGINE_SCRIPT")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if not Path(args.model_path, "config.json").is_file():
        print(f"slime_ref.engine: error: --model-path {args.model_path} has no config.json; "
              "pass an HF checkpoint directory (e.g. one made by `slime-ref make-tiny`)", file=sys.stderr)
        sys.exit(USAGE_EXIT_CODE)
    import torch

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    from slime_ref.engine.http_server import EngineConfig, serve

    config = EngineConfig(
        model_path=args.model_path, tokenizer_path=args.tokenizer_path, host=args.host, port=args.port,
        dtype="float32" if args.dtype == "auto" else args.dtype, context_length=args.context_length,
        max_running_requests=args.max_running_requests,
        random_seed=args.random_seed, weight_version=args.weight_version, script_path=args.script,
    )
    try:
        serve(config)
    except (ValueError, UserError) as e:  # unsupported architecture, bad dtype, bad script: one line
        print(f"slime_ref.engine: error: {e}", file=sys.stderr)
        sys.exit(USAGE_EXIT_CODE)


if __name__ == "__main__":
    main()
