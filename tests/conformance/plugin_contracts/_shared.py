"""Shared by the plugin contract tests (slime v0.3.1 ``tests/plugin_contracts/_shared.py``, THUDM/slime @ a6272da).

As in slime, a contract can be run against your own plugin: set ``SLIME_CONTRACT_<KEY>`` to its
dotted path, e.g. ``SLIME_CONTRACT_CUSTOM_RM_PATH=my_pkg.rewards.fn pytest tests/conformance/plugin_contracts``.
slime's command-line wrapper around this and its stubs for ray/transformers (slime-ref imports
neither to load a hook) are not ported.
"""

from __future__ import annotations

import os

from slime_ref.utils.hooks import load_function

ENV_PREFIX = "SLIME_CONTRACT_"


def contract_env_name(key: str) -> str:
    return f"{ENV_PREFIX}{key}"


def get_contract_path(key: str, default: str | None = None) -> str | None:
    return os.environ.get(contract_env_name(key), default)


def load(path: str):
    """slime's one-argument ``load_function``; slime-ref's also names the flag in its errors."""
    return load_function(path, "--plugin-contract")
