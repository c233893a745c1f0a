"""slime compatibility module (slime.utils.misc), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

import subprocess

from slime_ref.utils.hooks import load_function as _load
from slime_rehearse.compat._exports import exports


def load_function(path: str):
    """Import ``module.attr`` and return it, as slime's ``load_function``."""
    return _load(path, "load_function")


class SingletonMeta(type):
    _instances: dict = {}

    def __call__(cls, *args, **kwargs):
        if cls not in cls._instances:
            cls._instances[cls] = super().__call__(*args, **kwargs)
        return cls._instances[cls]

    def clear_instances(cls):
        """Forget this class's instance: its next call builds a new one."""
        cls._instances = {}


def exec_command(cmd: str, capture_output: bool = False) -> str | None:
    """Run ``cmd`` with bash, echoing it first; a non-zero exit raises CalledProcessError.
    Returns the command's stdout when ``capture_output``."""
    print(f"EXEC: {cmd}", flush=True)
    done = subprocess.run(["bash", "-c", cmd], check=False, capture_output=capture_output,
                          text=True if capture_output else None)
    if capture_output:
        print(f"stdout={done.stdout} stderr={done.stderr}", flush=True)
    done.check_returncode()
    return done.stdout if capture_output else None


__all__, __getattr__ = exports(__name__, "exec_command", "load_function", "SingletonMeta")
