"""Which Ray token-authentication mode a cluster and the processes joining it share.

Ray (2.5x and later) turns token authentication on for ``ray start --head`` by itself whenever a token
is available (``ray.init()`` of any local cluster writes ``~/.ray/auth_token``), but a process that
joins by ``RAY_ADDRESS=host:port`` sends the token only when ``RAY_AUTH_MODE=token`` is set; without
it the join is refused with ``AuthenticationError: InvalidAuthToken``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def ray_auth_mode(env: Mapping[str, str]) -> str | None:
    """``env``'s RAY_AUTH_MODE if set, else "token" when Ray would find a token, else None."""
    if env.get("RAY_AUTH_MODE"):
        return env["RAY_AUTH_MODE"]
    token_path = env.get("RAY_AUTH_TOKEN_PATH") or Path(env.get("HOME") or Path.home()) / ".ray" / "auth_token"
    return "token" if env.get("RAY_AUTH_TOKEN") or Path(token_path).is_file() else None
