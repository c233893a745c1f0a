"""Atomic file and directory writes (defined in :mod:`slime_common.fileio`, shared with slime-check)."""

from slime_common.fileio import atomic_directory, atomic_write_bytes, atomic_write_json, atomic_write_text

__all__ = ["atomic_directory", "atomic_write_bytes", "atomic_write_json", "atomic_write_text"]
