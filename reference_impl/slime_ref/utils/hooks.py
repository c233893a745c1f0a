"""Loading user hooks given as dotted import paths (``--custom-rm-path my_pkg.rewards.fn``).

slime loads every hook with ``importlib.import_module`` + ``getattr`` (``slime.utils.misc.load_function``);
so does slime-ref, but a bad path becomes a :class:`~slime_ref.errors.UserError` that names the flag,
what failed, and the fix, instead of a bare ``ModuleNotFoundError`` deep inside a Ray actor.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from typing import Any

from slime_ref.errors import UserError
from slime_ref.slime_names import hook_targets

# slime's own built-in hooks, so a slime launch script runs unchanged: slime path -> slime-ref's counterpart.
# Only names whose counterpart takes the same arguments and returns the same kind of value (the map's
# hook entries, slime_ref/slime_names.py). The hook paths slime's v0.3.1 examples pass are listed, with
# what becomes of each, in slime_rehearse/compat/examples_v0.3.1.json.
SLIME_BUILTINS = hook_targets()

# slime built-ins slime-ref has no counterpart for: slime path (a module covers everything in it) -> why,
# and what to do instead. The hook check stops on them with this line rather than a bare import error.
SLIME_REFUSED = {
    "slime.rollout.fully_async_rollout": (
        "slime's fully-async rollout (a background worker whose in-flight groups outlive a rollout and "
        "its weight update); slime-ref has only the per-rollout rollout "
        "(slime.rollout.sglang_rollout.generate_rollout, also under train_async.py): rehearse this flag with "
        "slime-check smoke --with slime, or leave it out to rehearse the rest on slime-ref's rollout"),
}

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
FIX = "use a dotted path like my_pkg.rewards.fn, importable on PYTHONPATH"


def _split(path: str, flag: str) -> tuple[str, str]:
    if not isinstance(path, str) or not path.strip():
        raise UserError(f"{flag}: empty hook path; {FIX}")
    if path.endswith(".py") or "/" in path or "\\" in path or ":" in path:
        raise UserError(f"{flag} {path!r}: a file path, not an import path; {FIX}")
    if not _DOTTED.match(path):
        raise UserError(f"{flag} {path!r}: not a dotted import path module.function; {FIX}")
    parts = path.split(".")
    for end in range(len(parts), 1, -1):
        if (refused := SLIME_REFUSED.get(".".join(parts[:end]))) is not None:
            raise UserError(f"{flag} {path!r}: {path} is {refused}")
    module_name, _, attr = SLIME_BUILTINS.get(path, path).rpartition(".")
    return module_name, attr


def check_hook_path(path: str, flag: str) -> None:
    """Cheap parse-time check: the path is dotted and its top-level package can be found.

    Does not import the module (hooks may import heavy libraries); :func:`load_function` does that.
    """
    module_name, _ = _split(path, flag)
    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        raise UserError(f"{flag} {path!r}: no module named {top!r} on the Python path; {_fix_for_missing(top)}")


def _describe(e: BaseException) -> str:
    """``Type: message`` on one line, followed by the exceptions that caused it (``raise ... from e``,
    or one raised while handling another), so a hook's own "X is not installed" keeps the import
    error underneath it."""
    parts: list[str] = []
    seen: set[int] = set()
    while e is not None and id(e) not in seen and len(parts) < 4:
        seen.add(id(e))
        text = f"{type(e).__name__}: {' '.join(str(e).split())}"  # one line, even for a multi-line error
        if not parts or text not in parts[-1]:
            parts.append(text)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return "; caused by ".join(parts)


def _fix_for_missing(top: str) -> str:
    if top == "slime":
        return ("slime is not importable here, and slime-ref stands in only for the slime built-ins it maps; "
                "rehearse this hook with slime-check smoke --with slime")
    return f"put the folder that holds {top!r} on PYTHONPATH"


def load_function(path: str, flag: str) -> Callable[..., Any]:
    """Import ``module.attr`` and return the attribute; any failure is a UserError naming ``flag``.

    The message carries the error and its causes. It names a fix only where one follows from the
    error: the folder of a package that is not on the path at all.
    """
    module_name, attr = _split(path, flag)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or any error raised while the module runs
        failure = f"importing {module_name!r} failed ({_describe(e)})"
        top = module_name.split(".")[0]
        if isinstance(e, ModuleNotFoundError) and e.name == top and e.__cause__ is None:
            failure += f"; {_fix_for_missing(top)}"
        raise UserError(f"{flag} {path!r}: {failure}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UserError(f"{flag} {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    except ImportError as e:  # a module that says why it lacks the name (slime-check's slime compat layer)
        raise UserError(f"{flag} {path!r}: {_describe(e)}") from None


# ---------------------------------------------------------------------------------------------
# slime's on-policy-distillation hooks (slime.rollout.on_policy_distillation, see SLIME_BUILTINS)
#
# The reward is the teacher's reply to the sample's tokens: an SGLang /generate at --rm-url asked for
# no new tokens and the log-prob of every input token (slime-ref's own engine answers it too). The
# post-process keeps the response part of those log-probs in sample.teacher_log_probs and gives every
# sample the reward 0.0: in slime the learning signal is --use-opd's KL penalty, which slime-ref does
# not implement (it carries teacher_log_probs and never trains on them).
# ---------------------------------------------------------------------------------------------


async def opd_teacher_reward(args, sample, **kwargs) -> dict:
    """The teacher server's ``/generate`` reply for ``sample.tokens`` (``meta_info.input_token_logprobs``)."""
    import aiohttp

    url = getattr(args, "rm_url", None)
    if not url:
        raise UserError("--custom-rm-path slime.rollout.on_policy_distillation.reward_func asks the teacher at "
                        "--rm-url (an SGLang /generate URL, e.g. http://127.0.0.1:13141/generate); it is not set")
    if sample.multimodal_inputs and sample.multimodal_inputs.get("images"):
        raise UserError("on-policy distillation of a sample with images: slime-ref builds text-only models; "
                        "rehearse it with slime-check smoke --with slime")
    request = {
        "input_ids": list(sample.tokens),
        "sampling_params": {"max_new_tokens": 0, "temperature": 0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": 0,  # from the first token on: the prompt's log-probs come back too
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=request) as reply:
            reply.raise_for_status()
            return await reply.json()


def opd_post_process_rewards(args, samples: list, **kwargs) -> tuple[list[float], list[float]]:
    """Put the teacher's log-probs of each response token in ``sample.teacher_log_probs``; rewards 0.0."""
    for sample in samples:
        reply = sample.get_reward_value(args)
        try:
            entries = reply["meta_info"]["input_token_logprobs"]
        except (TypeError, KeyError):
            raise UserError(
                f"--custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards: "
                f"sample {sample.index}'s reward is not a teacher /generate reply with meta_info."
                "input_token_logprobs; pair it with --custom-rm-path slime.rollout.on_policy_distillation.reward_func"
            ) from None
        # entry i is (log-prob, token id, ...) of input token i; the first token has none
        log_probs = [float(entry[0]) for entry in entries[1:]]
        sample.teacher_log_probs = log_probs[max(0, len(log_probs) - sample.response_length):]
    zeros = [0.0] * len(samples)
    return zeros, list(zeros)
