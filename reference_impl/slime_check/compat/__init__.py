"""A `slime` package backed by slime-ref, for rehearsing slime hooks without slime (see smoke.py)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent  # the folder put on PYTHONPATH: it holds the `slime` package
