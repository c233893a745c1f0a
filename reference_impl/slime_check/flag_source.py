"""Flags read from the user's own slime checkout (placeholder; filled in next)."""

from __future__ import annotations

from pathlib import Path

from slime_common.registry import Registry, load_registry


def registry_for_checkout(slime_dir: Path, base: str) -> tuple[Registry, list[str]]:
    reg = load_registry(base)
    return reg, [f"all flags: {reg.flags_from} (reading {slime_dir} is not implemented yet)"]
