"""slime compatibility module (slime.rollout.sglang_rollout), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_ref.rollout import sglang_rollout as _ref
from slime_rehearse.compat._exports import exports


class GenerateState:
    """slime's per-process generation state: ``tokenizer``, ``semaphore``, ``sampling_params``, ``args``."""

    _instance = None

    def __new__(cls, args):
        if cls._instance is None or cls._instance.args is not args:
            self = super().__new__(cls)
            state = _ref.generation_state(args)
            self.args = args
            self.tokenizer = state.tokenizer
            self.processor = None
            self.semaphore = state.semaphore
            self.sampling_params = state.sampling_params  # the rollout's own: a change here is sent
            self.reset()
            cls._instance = self
        return cls._instance

    def __init__(self, args):
        pass

    def reset(self):
        self.remaining_batch_size = 0
        self.pendings = set()
        self.aborted = False


__all__, __getattr__ = exports(__name__, "GenerateState")
