"""Shared test setup: offline, loopback-only, and one embedded tiny model per session."""

from __future__ import annotations

import os

# Before anything imports transformers or ray: never reach a hub, keep Ray on 127.0.0.1, no telemetry.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (gpu marker); this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """The embedded default (seed 0), built once per test session."""
    from slime_ref.assets import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny") / "assets", seed=0)
