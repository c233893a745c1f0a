"""slime-ref: a small, complete GRPO trainer with slime's architecture.

Megatron-core trains, engines that speak SGLang's HTTP protocol generate rollouts behind the real
sglang-router, and Ray places everything. Flag names follow slime v0.3.1.
"""

import os as _os

__version__ = "0.1.0"

# A local Ray cluster (no RAY_ADDRESS) binds to 127.0.0.1 and sends no usage stats. Ray reads these
# when it is imported, so they are set here, before any slime-ref module imports it.
if not _os.environ.get("RAY_ADDRESS"):
    _os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    _os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
else:
    # a RAY_ADDRESS=host:port join sends Ray's token only when told to (slime_common.ray_auth)
    from slime_common.ray_auth import ray_auth_mode as _ray_auth_mode

    if _mode := _ray_auth_mode(_os.environ):
        _os.environ["RAY_AUTH_MODE"] = _mode
