"""Parsed slime-ref flags for the algorithm tests: real parser defaults, then per-test overrides."""

from __future__ import annotations

from pathlib import Path

from slime_ref.arguments import parse_args

# --ref-load only has to exist for the KL flags to validate; the algorithm tests never load a model.
BASE_ARGV = [
    "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--num-rollout", "1",
    "--ref-load", str(Path(__file__).parent),
]


def make_args(*argv: str, **overrides):
    args = parse_args([*BASE_ARGV, *argv])
    for name, value in overrides.items():
        if not hasattr(args, name):
            raise AttributeError(f"no flag attribute {name!r}")
        setattr(args, name, value)
    return args
