"""A `slime` package backed by slime-ref, for rehearsing slime hooks without slime (see smoke.py)."""

from pathlib import Path

from slime_rehearse.compat.layouts import TARGET_ENV, layout_findings

__all__ = ["ROOT", "TARGET_ENV", "layout_findings"]

ROOT = Path(__file__).resolve().parent  # the folder put on PYTHONPATH: it holds the `slime` package
