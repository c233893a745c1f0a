"""The hooks of a ``slime-check smoke`` run, counted: the hook flags of the rehearsed job name
``slime_smoke_hooks.<hook id>``; SLIME_SMOKE_HOOKS_CONFIG names the run's hook config
(OUT/hooks/smoke_hooks.json). See slime_rehearse/smoke_runtime.py."""

import os

from slime_rehearse.smoke_runtime import install

HOOKS, __getattr__ = install(globals(), os.environ["SLIME_SMOKE_HOOKS_CONFIG"])
