"""The tiny GRPO job the end-to-end and fault tests run (shared flags)."""

from __future__ import annotations

from pathlib import Path


def grpo_flags(tiny, out: Path, *extra: str) -> list[str]:
    """slime flags of a 4-prompt x 4-sample GRPO rollout on the embedded tiny model, weights checked
    after every sync."""
    return [
        "--hf-checkpoint", str(tiny.model_dir), "--prompt-data", str(tiny.train_path),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template", "--rm-type", "math",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "16",
        "--rollout-max-response-len", "6", "--lr", "1e-4", "--attention-dropout", "0", "--hidden-dropout", "0",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096", "--check-weight-update-equal",
        "--output-dir", str(out), *extra,
    ]
