"""Behaviours that differ between slime v0.3.1 and slime main at 624b824: one table.

Each row names the slime pull request that changed the behaviour, the flags it reads, a test on
the parsed launch config (does this job rely on the behaviour?), what each slime does, and the
status the row has when the job targets that slime. ``config`` reports a row only where the job
relies on it; ``smoke`` on slime-ref (which keeps v0.3.1's behaviour) warns about every relied-on
row when the job targets main.

The facts were read from slime's source at both commits (``git log v0.3.1..624b824``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slime_check.findings import Finding, Status

V031 = "v0.3.1"
MAIN = "main@624b824"
PR_URL = "https://github.com/THUDM/slime/pull/"
SLICE = re.compile(r"@\[(-?\d*):(-?\d*)\]$")


def _value(cfg, name: str):
    """The value slime would see, or None where this registry lacks the flag."""
    if cfg.reg.lookup(name) is None:
        return None
    return cfg.get(name)


def _known(value) -> bool:
    from slime_check.config_lint import UNKNOWN

    return value is not None and value is not UNKNOWN


def _num(cfg, name: str):
    value = _value(cfg, name)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _given(cfg, name: str) -> str | None:
    """``--flag VALUE (where)`` when the script gives the flag, else None."""
    if cfg.reg.lookup(name) is None or not cfg.has(name):
        return None
    last = cfg.given(name)[-1]
    words = " ".join(w.text for w in last.values)
    return f"{last.name}{' ' + words if words else ''} ({last.where})"


def _words(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, str)]
    return []


def _eval_config(cfg):
    """The ``--eval-config`` YAML as slime reads it, or None when absent or unreadable here."""
    from slime_check.eval_config import read_eval_config
    from slime_common.errors import UserError

    path = _value(cfg, "--eval-config")
    if not isinstance(path, str) or not Path(path).expanduser().is_file():
        return None
    try:
        return read_eval_config(Path(path).expanduser())
    except (UserError, OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# what each row tests: a short text of how the job relies on the behaviour, or None


def _temperature(cfg) -> str | None:
    t = _num(cfg, "--rollout-temperature")
    return _given(cfg, "--rollout-temperature") if t is not None and t <= 0 else None


def _eps_clip_c(cfg) -> str | None:
    if _value(cfg, "--advantage-estimator") == "cispo":  # neither slime applies dual clip to CISPO
        return None
    return _given(cfg, "--eps-clip-c") if _value(cfg, "--eps-clip-c") is not None else None


def _start_rollout_id(cfg) -> str | None:
    if not _known(_value(cfg, "--start-rollout-id")):
        return None
    load = _value(cfg, "--load")
    if load is None:
        return f"{_given(cfg, '--start-rollout-id')} without --load"
    if not isinstance(load, str) or not Path(load).expanduser().exists():
        return None  # symbolic, or a path of another machine: cannot tell
    if (Path(load).expanduser() / "latest_checkpointed_iteration.txt").exists():
        return None
    return f"{_given(cfg, '--start-rollout-id')} with --load {load}, which is not a Megatron checkpoint"


def _eval_defaults_unknown(cfg) -> str | None:
    ev = _eval_config(cfg)
    if ev is None:
        return None
    from slime_check.eval_config import DATASET_KEYS

    bad = [k for k in ev.defaults if k not in DATASET_KEYS]
    return f"{ev.path.name} defaults.{', defaults.'.join(bad)}" if bad else None


def _eval_defaults_fields(cfg) -> str | None:
    ev = _eval_config(cfg)
    if ev is None:
        return None
    from slime_check.eval_config import DATASET_KEYS, MERGED_FROM_DEFAULTS

    keys = [k for k in ev.defaults if k in DATASET_KEYS and k not in MERGED_FROM_DEFAULTS and k != "name"]
    return f"{ev.path.name} defaults.{', defaults.'.join(keys)}" if keys else None


EVAL_STOP_KEYS = ("stop", "stop_token_ids", "min_new_tokens")


def _eval_stop(cfg) -> str | None:
    ev = _eval_config(cfg)
    if ev is None:
        return None
    used = []
    for ds in ev.datasets:
        own = [k for k in EVAL_STOP_KEYS if k in ds.settings and k not in ds.from_defaults
               and ds.settings[k] is not None]
        if own:
            used.append(f"{ds.name}: {', '.join(own)}")
    return f"{ev.path.name} ({'; '.join(used)})" if used else None


def _debug_train_layout(cfg) -> str | None:
    return _given(cfg, "--save-debug-train-data") or _given(cfg, "--dump-details")


def _debug_same_path(cfg) -> str | None:
    if _value(cfg, "--dump-details") is not None:
        return None  # --dump-details sets both paths, to different files
    train, rollout = _value(cfg, "--save-debug-train-data"), _value(cfg, "--save-debug-rollout-data")
    if isinstance(train, str) and train == rollout:
        return f"--save-debug-train-data and --save-debug-rollout-data both {train}"
    return None


def _partial_continuation(cfg) -> str | None:
    if _value(cfg, "--partial-rollout") is not True or _value(cfg, "--custom-generate-function-path") is not None:
        return None
    return f"{_given(cfg, '--partial-rollout')} with slime's default generate"


def _eval_only(cfg) -> str | None:
    return _given(cfg, "--num-rollout") if _num(cfg, "--num-rollout") == 0 else None


def _negative_slice(cfg) -> str | None:
    found = []
    for name in ("--prompt-data", "--eval-prompt-data"):
        for word in _words(_value(cfg, name)):
            m = SLICE.search(word)
            if m and (m.group(1).startswith("-") or m.group(2).startswith("-")):
                found.append(f"{name} {word}")
    return "; ".join(found) or None


def _opd_temperature(cfg) -> str | None:
    hooks = [_value(cfg, n) for n in ("--custom-rm-path", "--eval-custom-rm-path") if cfg.reg.lookup(n)]
    if not any(isinstance(h, str) and "on_policy_distillation" in h for h in hooks):
        return None
    t = _num(cfg, "--rollout-temperature")
    if t is None or t == 1:
        return None
    return f"slime's on-policy-distillation reward with --rollout-temperature {t}"


def _whiten_cp(cfg) -> str | None:
    cp = _num(cfg, "--context-parallel-size")
    if _value(cfg, "--normalize-advantages") is not True or cp is None or cp <= 1:
        return None
    return f"--normalize-advantages with --context-parallel-size {cp}"


def _log_correct_samples(cfg) -> str | None:
    return _given(cfg, "--log-correct-samples") if _value(cfg, "--log-correct-samples") is True else None


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    id: str
    pr: int
    behaviour: str  # a short name of what changed
    flags: tuple[str, ...]  # the flags the row reads
    relies: Callable  # cfg -> a text saying how the job relies on it, or None
    v031: str  # what slime v0.3.1 does
    main: str  # what slime main@624b824 does
    status: dict  # target -> Status when the job relies on the row
    fix: dict  # target -> the fix (empty for a PASS)

    @property
    def link(self) -> str:
        return f"{PR_URL}{self.pr}"

    def does(self, target: str) -> str:
        return self.v031 if target == V031 else self.main

    def finding(self, target: str, how: str) -> Finding:
        other = MAIN if target == V031 else V031
        return Finding(f"drift.{self.id}", self.status[target],
                       f"{how}: on slime {target} {self.does(target)}; on slime {other} {self.does(other)} "
                       f"({self.behaviour}, slime #{self.pr}).",
                       self.fix.get(target, ""), self.link)


W, F, P = Status.WARN, Status.FAIL, Status.PASS

DRIFTS: tuple[Drift, ...] = (
    Drift("rollout_temperature", 2297, "a rollout temperature of 0 or below", ("--rollout-temperature",),
          _temperature,
          "it is accepted: greedy decoding, so every sample of a group is the same and group advantages are 0",
          "it stops at start-up (ValueError: --rollout-temperature must be > 0)",
          {V031: W, MAIN: F},
          {V031: "Use a temperature above 0 (slime's default is 1.0).",
           MAIN: "Use a temperature above 0 (slime's default is 1.0)."}),
    Drift("eps_clip_c", 2247, "dual-clip PPO", ("--eps-clip-c", "--advantage-estimator"), _eps_clip_c,
          "the policy loss never receives it: dual clip is off, the flag has no effect",
          "the policy loss applies dual clip with it",
          {V031: W, MAIN: P},
          {V031: "Drop --eps-clip-c on v0.3.1, or run slime main (past #2247) for dual-clip PPO."}),
    Drift("start_rollout_id", 2236, "--start-rollout-id when --load is not a Megatron checkpoint",
          ("--start-rollout-id", "--load"), _start_rollout_id,
          "it resets the start rollout id to 0, whatever you set",
          "it keeps the start rollout id you set",
          {V031: W, MAIN: P},
          {V031: "On v0.3.1 start from a Megatron checkpoint (--load DIR with latest_checkpointed_iteration.txt) "
                 "to resume at a rollout id, or drop --start-rollout-id."}),
    Drift("eval_defaults_unknown", 2242, "eval.defaults keys no eval dataset has", ("--eval-config",),
          _eval_defaults_unknown,
          "it ignores them",
          "it stops at start-up (ValueError: Unknown key(s) in eval.defaults)",
          {MAIN: F},
          {MAIN: "Remove the key from the YAML's defaults, or fix its spelling."}),
    Drift("eval_defaults_fields", 2242, "eval.defaults keys beyond the ones v0.3.1 merges", ("--eval-config",),
          _eval_defaults_fields,
          "it ignores them (only the sampling, key and reward defaults are merged)",
          "it fills them into every dataset that does not set them",
          {MAIN: P}, {}),
    Drift("eval_stop", 2242, "per-dataset stop, stop_token_ids and min_new_tokens", ("--eval-config",),
          _eval_stop,
          "they are accepted and unused: eval stops at --rollout-stop / --rollout-stop-token-ids, with no "
          "min_new_tokens",
          "each dataset's stop, stop_token_ids and min_new_tokens are used",
          {V031: W, MAIN: P},
          {V031: "On v0.3.1 set --rollout-stop / --rollout-stop-token-ids for all of eval, or run slime main "
                 "(past #2242)."}),
    Drift("debug_train_layout", 2266, "the train-data debug dump's file layout",
          ("--save-debug-train-data", "--dump-details"), _debug_train_layout,
          "each rank writes its own shard ({rollout_id}_{rank}.pt under --dump-details/train_data)",
          "one writer saves one file per rollout holding every DP shard, context-parallel fields restored to "
          "whole responses ({rollout_id}.pt under --dump-details/train_data)",
          {V031: P, MAIN: P}, {}),
    Drift("debug_same_path", 2276, "--save-debug-train-data equal to --save-debug-rollout-data",
          ("--save-debug-train-data", "--save-debug-rollout-data", "--dump-details"), _debug_same_path,
          "it writes both dumps to the same file: the train dump replaces the rollout dump",
          "it stops at start-up (ValueError: --save-debug-train-data must not be equal to "
          "--save-debug-rollout-data)",
          {V031: W, MAIN: F},
          {V031: "Give the two dumps different paths.", MAIN: "Give the two dumps different paths."}),
    Drift("partial_continuation", 2261, "the token budget of a continued partial sample",
          ("--partial-rollout", "--custom-generate-function-path"), _partial_continuation,
          "a continued sample gets a whole --rollout-max-response-len again, so its response can run past the cap",
          "a continued sample gets --rollout-max-response-len minus the tokens it already has",
          {V031: W, MAIN: P},
          {V031: "On v0.3.1 expect responses longer than --rollout-max-response-len with --partial-rollout "
                 "(size --sglang-context-length for them), or run slime main (past #2261)."}),
    Drift("eval_only", 2296, "an eval-only run (--num-rollout 0)", ("--num-rollout",), _eval_only,
          "it still builds the optimizer and LR scheduler (and the critic with --use-critic), GPU memory an eval "
          "does not need",
          "it skips the optimizer, the scheduler and the critic",
          {V031: W, MAIN: P},
          {V031: "Expect the optimizer's memory on v0.3.1, or run slime main (past #2296) for eval-only runs."}),
    Drift("negative_slice", 2241, "a negative row slice of a data file (path@[-100:])",
          ("--prompt-data", "--eval-prompt-data"), _negative_slice,
          "it fails when it reads the file (itertools.islice takes no negative bounds)",
          "it takes the rows counted from the end",
          {V031: F, MAIN: P},
          {V031: "On v0.3.1 use non-negative bounds (count the rows: path@[N-100:]), or run slime main "
                 "(past #2241)."}),
    Drift("opd_teacher_temperature", 2085, "the temperature of the on-policy-distillation teacher's log-probs",
          ("--custom-rm-path", "--rollout-temperature"), _opd_temperature,
          "the teacher is scored at temperature 0 (unscaled log-probs), not at the student's temperature",
          "the teacher is scored at --rollout-temperature, as the student samples",
          {V031: W, MAIN: P},
          {V031: "On v0.3.1 the teacher and the student differ in temperature: use --rollout-temperature 1, or "
                 "run slime main (past #2085)."}),
    Drift("whiten_cp", 2235, "advantage whitening with context parallelism",
          ("--normalize-advantages", "--context-parallel-size"), _whiten_cp,
          "each context-parallel rank whitens its own slice of a sequence with its own mean and variance",
          "the mean and variance are taken over the data- and context-parallel ranks together",
          {V031: W, MAIN: P},
          {V031: "On v0.3.1 drop --normalize-advantages with context parallelism, or run slime main (past #2235)."}),
    Drift("log_correct_samples", 2234, "the per-sample metrics of --log-correct-samples",
          ("--log-correct-samples",), _log_correct_samples,
          "rewards are paired with another rank's samples when the data-parallel size is above 1, so the logged "
          "per-sample figures are wrong (training is not affected)",
          "each rank pairs rewards with its own samples",
          {V031: W, MAIN: P},
          {V031: "Read those metrics with care on v0.3.1 (data-parallel size above 1), or run slime main "
                 "(past #2234)."}),
)


def relied_on(cfg) -> list[tuple[Drift, str]]:
    """The rows this job relies on, each with the text saying how."""
    out = []
    for row in DRIFTS:
        how = row.relies(cfg)
        if how:
            out.append((row, how))
    return out


def drift_findings(cfg, target: str) -> list[Finding]:
    """``config``'s rows for a job judged against ``target`` (a row with no status there stays quiet)."""
    return [row.finding(target, how) for row, how in relied_on(cfg) if target in row.status]


def rehearsal_findings(cfg, target: str) -> list[Finding]:
    """slime-ref keeps v0.3.1's behaviour: for a job that targets another slime, one WARN per row it
    relies on, naming the behaviour the rehearsal cannot show."""
    if target == V031:
        return []
    return [Finding("smoke.drift", Status.WARN,
                    f"{how}: slime-ref rehearses slime v0.3.1, where {row.v031}; your slime {target} differs: "
                    f"{row.main} ({row.behaviour}, slime #{row.pr}). The rest of the job is rehearsed as usual.",
                    "Judge this behaviour from `slime-check config`, or rehearse on the real slime "
                    "(`smoke --with slime --slime-dir DIR`).", row.link)
            for row, how in relied_on(cfg)]

