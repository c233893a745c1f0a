"""``--eval-config FILE.yaml``: slime v0.3.1's eval datasets, read as slime reads them, and checked.

slime loads the file with OmegaConf at start-up (``_resolve_eval_datasets`` in
``slime/utils/arguments.py``) and builds one ``EvalDatasetConfig`` per dataset
(``slime/utils/eval_config.py``). What that means for a file:

- The root is a mapping; its ``eval`` mapping holds the settings, or, without an ``eval`` key, the
  root itself does. ``datasets`` is a list of mappings, each with ``name``, or a mapping from name
  to settings; it must not be empty. ``defaults`` is an optional mapping.
- Every dataset needs ``path``. Its other keys must be ``EvalDatasetConfig`` fields: any other key
  stops slime at start-up (an unexpected keyword argument). slime does not check value types; a
  value of the wrong type reaches the eval rollout as written.
- Only 14 keys are merged from ``defaults`` (:data:`MERGED_FROM_DEFAULTS`); slime ignores any other
  key there. A key the dataset sets, even to null, wins over ``defaults``. A key neither sets falls
  back to the launch flags (:data:`FLAG_FALLBACKS`).
- Only when the file defines datasets does slime replace ``--eval-prompt-data`` with them.

slime-check reads the YAML with PyYAML, made to read as OmegaConf's loader does (``1e-6`` is a
float, a key given twice is an error). OmegaConf interpolations (``${...}``) are not resolved here;
the values that use them are left unchecked.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime_check.findings import Finding, Status, slime_doc
from slime_common.errors import UserError

EVAL_DOC = slime_doc("examples/eval_multi_task/README.md")
DATA_DOC = slime_doc("docs/en/get_started/usage.md")

# Every key an eval dataset may carry (EvalDatasetConfig's fields at v0.3.1) and the kind of value
# the eval rollout uses it as.
DATASET_KEYS: dict[str, str] = {
    "name": "name",
    "path": "str",
    "rm_type": "str",
    "custom_rm_path": "str",
    "input_key": "str",
    "label_key": "str",
    "tool_key": "str",
    "metadata_key": "str",
    "multimodal_keys": "mapping",
    "apply_chat_template": "bool",
    "apply_chat_template_kwargs": "mapping",
    "n_samples_per_eval_prompt": "int",
    "temperature": "number",
    "top_p": "number",
    "top_k": "int",
    "max_response_len": "int",
    "stop": "stop",
    "stop_token_ids": "int_list",
    "min_new_tokens": "int",
    "repetition_penalty": "number",
    "skip_special_tokens": "bool",
    "no_stop_trim": "bool",
    "custom_generate_function_path": "str",
    "app_service": "str",
    "eval_task_timeout": "int",
    "min_eval_samples": "int",
    "eval_early_stop_remaining": "int",
    "eval_early_stop_idle_timeout": "number",
    "message_processor": "mapping",
    "reward_model": "mapping",
    "remote_environment": "mapping",
    "metadata_overrides": "mapping",
}

REQUIRED_KEYS = ("name", "path")

# The keys slime copies from ``defaults`` into each dataset that does not set them, and the launch
# flags (first one set wins) that fill them when neither does.
FLAG_FALLBACKS: dict[str, tuple[str, ...]] = {
    "n_samples_per_eval_prompt": ("--n-samples-per-eval-prompt", "--n-samples-per-prompt"),
    "temperature": ("--eval-temperature", "--rollout-temperature"),
    "top_p": ("--eval-top-p", "--rollout-top-p"),
    "top_k": ("--eval-top-k", "--rollout-top-k"),
    "max_response_len": ("--eval-max-response-len", "--rollout-max-response-len"),
    "min_eval_samples": (),
    "input_key": ("--eval-input-key", "--input-key"),
    "label_key": ("--eval-label-key", "--label-key"),
    "tool_key": ("--eval-tool-key", "--tool-key"),
    "metadata_key": ("--metadata-key",),
    "multimodal_keys": ("--multimodal-keys",),
    "apply_chat_template": ("--apply-chat-template",),
    "apply_chat_template_kwargs": ("--apply-chat-template-kwargs",),
    "custom_rm_path": ("--custom-rm-path",),
}
MERGED_FROM_DEFAULTS = tuple(FLAG_FALLBACKS)

KIND_TEXT = {
    "name": "a string", "str": "a string", "mapping": "a mapping", "bool": "true or false", "int": "an integer",
    "number": "a number", "stop": "a string or a list of strings", "int_list": "a list of integers",
}


@dataclass
class EvalDataset:
    """One dataset as slime builds it: the file's keys for it, with ``defaults`` merged in.

    ``settings`` holds every key the file gives this dataset (``name`` and ``path`` included), in the
    file's order; a key absent from it falls back to the launch flags in slime."""

    name: Any
    path: Any
    settings: dict[str, Any]
    from_defaults: tuple[str, ...] = ()  # the keys of ``settings`` that came from ``defaults``
    where: str = ""  # "datasets[0]" or "datasets.aime"

    def get(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)


@dataclass
class EvalConfig:
    path: Path
    datasets: list[EvalDataset]
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def ignored_defaults(self) -> list[str]:
        """Keys of ``defaults`` slime never merges into a dataset."""
        return [k for k in self.defaults if k not in MERGED_FROM_DEFAULTS]


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def _loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader reading as OmegaConf's loader does: exponent floats without a dot (``1e-6``)
        are floats, and a mapping may not give a key twice."""

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: the base class reports it
                    break
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    float_re = re.compile(r"""^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+
                              |[-+]?[0-9][0-9_]*\.[0-9_]*
                              |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                              |[-+]?\.(?:inf|Inf|INF)
                              |\.(?:nan|NaN|NAN))$""", re.X)
    Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    for first in list("-+0123456789."):
        Loader.yaml_implicit_resolvers[first] = [
            r for r in Loader.yaml_implicit_resolvers.get(first, []) if r[0] != "tag:yaml.org,2002:float"]
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", float_re, list("-+0123456789."))
    return Loader


def _yaml_error(e) -> str:
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None)
    return problem + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else "")


def load_yaml(path: str | Path) -> Any:
    """The file's content as OmegaConf would load it (before interpolation)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserError(f"--eval-config {path}: no such file.")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--eval-config {path} cannot be read: {e}.") from None
    try:
        return yaml.load(text, Loader=_loader())
    except yaml.YAMLError as e:
        raise UserError(f"--eval-config {path} is not valid YAML: {_yaml_error(e)}.") from None


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string"}.get(type(value), f"the value {value!r}")


def read_eval_config(path: str | Path) -> EvalConfig:
    """The datasets of an ``--eval-config`` file as slime v0.3.1 builds them.

    Raises :class:`UserError` (one line, naming the file) for a file slime cannot read: not YAML, a
    root or ``eval`` that is not a mapping, no datasets, a dataset that is not a mapping or lacks
    ``name`` or ``path``. Keys slime does not accept and values of the wrong type are kept as written:
    :func:`eval_config_findings` reports them."""
    path = Path(path)
    data = load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"--eval-config {path}: the root must be a mapping (with `eval:`), not {_kind(data)}.")
    ev = data.get("eval", data)
    if not isinstance(ev, dict):
        raise UserError(f"--eval-config {path}: `eval` must be a mapping (with `datasets:`), not {_kind(ev)}.")
    defaults = ev.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise UserError(f"--eval-config {path}: `defaults` must be a mapping, not {_kind(defaults)}.")
    raw = ev.get("datasets")
    entries: list[tuple[str, dict]] = []
    if isinstance(raw, dict):
        for name, settings in raw.items():
            if settings is not None and not isinstance(settings, dict):
                raise UserError(f"--eval-config {path}: datasets.{name} must be a mapping with `path:`, "
                                f"not {_kind(settings)}.")
            entry = dict(settings or {})
            entry.setdefault("name", name)
            entries.append((f"datasets.{name}", entry))
    elif isinstance(raw, list):
        for i, settings in enumerate(raw):
            if settings is not None and not isinstance(settings, dict):
                raise UserError(f"--eval-config {path}: datasets[{i}] must be a mapping with `name:` and `path:`, "
                                f"not {_kind(settings)}.")
            entry = dict(settings or {})
            if "name" not in entry:
                raise UserError(f"--eval-config {path}: datasets[{i}] has no `name` (each entry of a datasets "
                                "list needs one).")
            entries.append((f"datasets[{i}]", entry))
    elif raw is not None:
        raise UserError(f"--eval-config {path}: `datasets` must be a list or a mapping, not {_kind(raw)}.")
    if not entries:
        where = "eval.datasets" if "eval" in data else "datasets"
        raise UserError(f"--eval-config {path} defines no datasets under `{where}`.")
    datasets = []
    for where, entry in entries:
        if entry.get("path") in (None, ""):
            raise UserError(f"--eval-config {path}: {where} ({entry['name']}) has no `path`.")
        settings = dict(entry)
        taken = []
        for key in MERGED_FROM_DEFAULTS:
            if key not in settings and key in defaults:
                settings[key] = defaults[key]
                taken.append(key)
        datasets.append(EvalDataset(entry["name"], entry["path"], settings, tuple(taken), where))
    return EvalConfig(path, datasets, dict(defaults))


def eval_config_as_prompt_data(config: EvalConfig) -> list[tuple[str, str]]:
    """``(name, path)`` per dataset, in the file's order: what slime puts in ``args.eval_prompt_data``
    once it has read the file. Paths are as written (slime opens them from its working directory)."""
    return [(str(d.name), str(d.path)) for d in config.datasets]


# ---------------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------------


def _interpolated(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, dict):
        return any(_interpolated(v) for v in value.values())
    if isinstance(value, list):
        return any(_interpolated(v) for v in value)
    return False


def _type_ok(kind: str, value: Any) -> bool:
    if value is None:  # null: the key is unset
        return kind != "name"
    is_int = isinstance(value, int) and not isinstance(value, bool)
    return {
        "name": isinstance(value, (str, int)) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "mapping": isinstance(value, dict),
        "bool": isinstance(value, bool),
        "int": is_int,
        "number": is_int or isinstance(value, float),
        "stop": isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value),
        "int_list": isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
    }[kind]


def suggest_key(key: Any) -> str | None:
    """The accepted key closest to ``key`` (dashes read as underscores), or None."""
    text = str(key).strip().lstrip("-").replace("-", "_").lower()
    if text in DATASET_KEYS and text != key:
        return text
    for prefix in ("eval_", "rollout_"):  # the flag's name for a dataset key
        if text.startswith(prefix) and text[len(prefix):] in DATASET_KEYS:
            return text[len(prefix):]
    found = difflib.get_close_matches(text, DATASET_KEYS, n=1, cutoff=0.6)
    return found[0] if found else None


def _did_you_mean(key: Any) -> str:
    hint = suggest_key(key)
    return f" (did you mean `{hint}`?)" if hint else ""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# What slime's parser gives the flags the data-file check falls back to, when a script leaves them out.
FLAG_DEFAULTS = {"--input-key": "input", "--apply-chat-template": False}


def _flag_value(flags: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """(known, value) of a key a dataset leaves to the launch flags, as slime falls back: the first
    flag whose value is not None. A flag absent from ``flags`` has slime's default."""
    for flag in FLAG_FALLBACKS.get(key, ()):
        value = flags.get(flag, FLAG_DEFAULTS.get(flag))
        if value is not None and not isinstance(value, (str, int, float, bool, dict, list)):
            return False, None  # symbolic in the script
        if value is not None:
            return True, value
    return True, None


def _rows_findings(ds: EvalDataset, file: Path, written: str, flags: Mapping[str, Any]) -> list[Finding]:
    from slime_check.config_lint import first_rows

    what = f"--eval-config {ds.name} {written}"
    keys = {}
    for key in ("input_key", "label_key", "apply_chat_template"):
        if key in ds.settings:
            keys[key] = ds.settings[key]
            continue
        ok, value = _flag_value(flags, key)
        if not ok:
            return []  # the flags that decide it are not known
        keys[key] = value
    in_key, lab_key = keys["input_key"], keys["label_key"]
    if any(_interpolated(v) for v in (in_key, lab_key)):
        return []
    try:
        rows = first_rows(file)
    except (OSError, ValueError) as e:
        return [Finding("config.data", Status.FAIL, f"{what} cannot be read as "
                        f"{'parquet' if file.suffix == '.parquet' else 'JSON lines'}: {e}.",
                        "Use .jsonl (one JSON object per line) or .parquet.", DATA_DOC)]
    if not rows:
        return [Finding("config.data", Status.WARN, f"{what} has no rows.", "Check the file.", DATA_DOC)]
    wanted = [k for k in (in_key, lab_key) if isinstance(k, str) and k]
    missing = [k for k in wanted if any(not isinstance(r, dict) or k not in r for r in rows)]
    if missing:
        found = sorted({k for r in rows if isinstance(r, dict) for k in r})
        return [Finding("config.data", Status.FAIL, f"{what}: the first {len(rows)} rows lack "
                        f"{', '.join(repr(k) for k in missing)} (their keys: {', '.join(found)}).",
                        f"Set input_key / label_key for {ds.name} in the YAML (or its defaults) to the file's keys.",
                        DATA_DOC)]
    if keys["apply_chat_template"] is True and in_key and any(not isinstance(r[in_key], list) for r in rows):
        return [Finding("config.data", Status.WARN, f"{what}: '{in_key}' holds plain text, but apply_chat_template "
                        "expects a list of chat messages.",
                        'Store prompts as [{"role": "user", "content": ...}], or set apply_chat_template: false '
                        "for this dataset.", DATA_DOC)]
    return [Finding("config.data", Status.PASS, f"{what}: the first {len(rows)} rows have "
                    f"{', '.join(repr(k) for k in wanted)}.")]


def eval_config_findings(path: str | Path, base_dir: str | Path | None = None, *,
                         flags: Mapping[str, Any] | None = None) -> list[Finding]:
    """What ``slime-check config`` reports for an ``--eval-config`` file.

    ``base_dir`` is where relative dataset paths are looked up (default: the working directory, as
    slime opens them). A dataset file that is not there is a SKIP, as for ``--eval-prompt-data``: the
    script may be meant for another machine. ``flags`` maps launch flags (``--input-key``...) to the
    values slime will see (None: unset; a flag left out has slime's default; any other object is a
    value unknown here and skips the check it feeds): each data file's first rows must have the input
    and label keys slime will read for that dataset."""
    id_ = "config.eval_config"
    path = Path(path).expanduser()
    if not path.is_file():
        return [Finding(id_, Status.SKIP, f"--eval-config {path} is not reachable here; its datasets are not "
                                          "checked.")]
    try:
        config = read_eval_config(path)
    except UserError as e:
        return [Finding(id_, Status.FAIL, f"{e} slime stops at start-up.",
                        "Give eval: with datasets: [{name: ..., path: ...}, ...] and optional defaults: (see "
                        "slime's examples/eval_multi_task/multi_task.yaml).", EVAL_DOC)]
    out: list[Finding] = []
    unchecked: list[str] = []
    seen_defaults: set[str] = set()  # a bad value in defaults is reported once, not per dataset
    for ds in config.datasets:
        label = f"{path.name} {ds.where} ({ds.name})"
        for key, value in ds.settings.items():
            if key not in DATASET_KEYS:
                hint = suggest_key(key)
                out.append(Finding(id_, Status.FAIL,
                                   f"{label}: `{key}` is not a key slime v0.3.1 accepts for an eval dataset"
                                   f"{_did_you_mean(key)}: slime stops at start-up (EvalDatasetConfig got an "
                                   "unexpected keyword argument).",
                                   f"Use `{hint}`." if hint else
                                   f"Remove it; the accepted keys are {', '.join(DATASET_KEYS)}.", EVAL_DOC))
                continue
            shared = key in ds.from_defaults
            if shared and key in seen_defaults:
                continue
            seen_defaults.update([key] if shared else [])
            if _interpolated(value):
                unchecked.append(f"defaults.{key}" if shared else f"{ds.name}.{key}")
                continue
            kind = DATASET_KEYS[key]
            where = f"{path.name} defaults" if shared else label
            if not _type_ok(kind, value):
                quoted = " Remove the quotes." if isinstance(value, str) and kind in ("int", "number", "bool") else ""
                out.append(Finding(id_, Status.FAIL,
                                   f"{where}: {key} is {_show(value)} ({type(value).__name__}), but slime "
                                   f"uses it as {KIND_TEXT[kind]}: slime does not check it when it reads the file, "
                                   "and the eval fails when it uses it.",
                                   f"Give {key} {KIND_TEXT[kind]}.{quoted}", EVAL_DOC))
            elif key == "min_eval_samples" and value is not None and value <= 0:
                out.append(Finding(id_, Status.FAIL, f"{where}: min_eval_samples is {value}: slime stops at "
                                   "start-up (it must be positive when set).",
                                   "Give a positive min_eval_samples, or drop it.", EVAL_DOC))
    names = [str(d.name) for d in config.datasets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        out.append(Finding(id_, Status.WARN, f"{path.name}: dataset name {', '.join(twice)} is used more than once: "
                           "slime logs eval results by name, so the last dataset's results replace the others'.",
                           "Give every dataset its own name.", EVAL_DOC))
    for key in config.ignored_defaults:
        hint = suggest_key(key)
        why = (f"`{key}` is not a key slime accepts{_did_you_mean(key)}" if key not in DATASET_KEYS
               else f"slime merges only {', '.join(MERGED_FROM_DEFAULTS)} from defaults")
        fix = (f"Use `{hint}`." if key not in DATASET_KEYS and hint in MERGED_FROM_DEFAULTS
               else f"Set {key} on each dataset." if key in DATASET_KEYS else "Remove it.")
        out.append(Finding(id_, Status.WARN, f"{path.name} defaults.{key} is ignored by slime: {why}.", fix, EVAL_DOC))
    if unchecked:
        out.append(Finding(id_, Status.SKIP, f"{path.name}: {', '.join(unchecked)} use OmegaConf interpolation "
                                             "(${...}), not resolved here; their values are not checked."))
    if not any(f.status is Status.FAIL for f in out):
        described = []
        for ds in config.datasets:
            extras = [f"{k} {_show(v)}" for k, v in ds.settings.items() if k not in REQUIRED_KEYS]
            described.append(f"{ds.name} ({ds.path}{'; ' + ', '.join(extras) if extras else ''})")
        out.append(Finding(id_, Status.PASS, f"--eval-config {path}: {len(described)} dataset"
                           f"{'s' if len(described) > 1 else ''} as slime reads them: {'; '.join(described)}."))
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    for ds in config.datasets:
        if not isinstance(ds.path, str) or _interpolated(ds.path):
            continue
        file = base / os.path.expanduser(ds.path)
        if not file.is_file():
            out.append(Finding("config.data", Status.SKIP, f"--eval-config {ds.name} {ds.path} is not reachable "
                                                           "here; its keys are not checked."))
            continue
        out += _rows_findings(ds, file, ds.path, flags or {})
    return out
