"""slime v0.3.1's own command-line parsing, run on a machine without GPUs, Megatron-LM or SGLang.

slime's ``parse_args`` (``slime/utils/arguments.py``) runs three argparse parsers over ``sys.argv``
(``_pre_parse_mode``'s, SGLang's with slime's ``add_sglang_arguments`` and Megatron-LM's with slime's
extra-args provider, each with ``parse_known_args``), merges them, then validates with
``slime_validate_args``, Megatron's ``validate_args`` and ``sglang_utils.arguments.validate_args``.

What runs for real here, from slime v0.3.1's own files committed under
``tests/fixtures/slime_sources/v0.3.1`` (their README names the commit):

* ``get_slime_extra_args_provider`` (every slime flag, its type, choices, default, ``required``),
  the ``_pre_parse_mode`` parser, ``add_sglang_arguments`` (the ``--sglang-`` prefixing and the skip
  list), ``slime_validate_args`` with ``slime/utils/eval_config.py`` (``--eval-config`` files are
  read), and SGLang's ``validate_args``.

What stands in:

* Megatron-LM's, SGLang's and sglang-router's own flags are added from the shipped registry
  (generated from those pinned sources) with their recorded action, type, nargs, choices and
  default.
* Megatron's ``validate_args`` (parallel sizes against heads and GPUs) and the HF ``config.json``
  comparison are not run: they need Megatron-LM and the model.
* The file system: every path a command names exists and holds no checkpoint (a first start):
  ``latest_checkpointed_iteration.txt`` and HF ``config.json`` are absent unless given in
  ``files``, which also holds the text of files slime reads (an ``--eval-config`` YAML).
* ``--rollout-external-engine-addrs``: slime asks the engines for their ``/server_info`` while
  parsing; here that call does nothing.

``parse(argv)`` returns the validated namespace or raises :class:`SlimeRejects` with slime's
own message (argparse's error, an ``AssertionError`` or a ``ValueError`` from the validation).
A flag no parser knows is refused too (slime itself drops it silently: that is the bug class the
skill warns about), and so is a flag SGLang 0.5.15.post1 marks deprecated.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import posixpath
import sys
import types
import warnings
from pathlib import Path

import yaml

from slime_check.tools import upstream_sources
from slime_common.registry import load_registry

SOURCES = Path(__file__).resolve().parent / "fixtures" / "slime_sources" / "v0.3.1"
UPSTREAM = ("megatron", "megatron-patch", "sglang", "sglang-patch", "router")
TYPES = {"str": str, "int": int, "float": float, "json": json.loads, "bool": bool}
ABSENT = ("latest_checkpointed_iteration.txt", "config.json")


class SlimeRejects(Exception):
    """slime v0.3.1 stops at start-up on this command line."""


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so a refused command is a test failure, not an exit."""

    def error(self, message):
        raise _Refused(message)


def _kwargs(record: dict) -> dict:
    """add_argument keywords that rebuild a registry record's action."""
    action = record["action"]
    default = record["default"]
    if isinstance(default, dict) and "py" in default:
        default = None
    kwargs: dict = {"default": default}
    if action in ("store_true", "store_false"):
        return {**kwargs, "action": action}
    if action == "boolean_optional":
        return {**kwargs, "action": argparse.BooleanOptionalAction}
    if action.startswith("Deprecated") and record["nargs"] == 0:
        return {**kwargs, "action": "store_const", "const": record.get("const", True)}
    kwargs["action"] = "append" if action == "append" else "store"
    kind = TYPES.get(record["type"] or "str", str)
    kwargs["type"] = kind
    if record["nargs"] is not None:
        kwargs["nargs"] = record["nargs"]
    if record["choices"] is not None and (kind is str or record["type"] == "enum"):
        kwargs["choices"] = record["choices"]
    return kwargs


@functools.cache
def _records() -> tuple[dict, ...]:
    data = json.loads((Path(upstream_sources.__file__).resolve().parents[2] / "slime_common" / "data" /
                       "slime_v0.3.1_flags.json").read_text())
    return tuple(data["flags"])


def deprecated_flags() -> frozenset[str]:
    return frozenset(f for flag in load_registry("v0.3.1").flags if flag.action.startswith("Deprecated")
                     for f in flag.flags)


class _Files:
    """The file system slime's validation sees: see the module docstring."""

    def __init__(self, files: dict[str, str]):
        self.files = {posixpath.normpath(k): v for k, v in files.items()}

    def exists(self, path) -> bool:
        path = posixpath.normpath(str(path))
        return path in self.files or not path.endswith(ABSENT)

    def isdir(self, path) -> bool:
        path = posixpath.normpath(str(path))
        return path not in self.files and not path.endswith(ABSENT)

    def module(self) -> types.ModuleType:
        fake_path = types.ModuleType("os.path")
        fake_path.__dict__.update({k: getattr(posixpath, k) for k in dir(posixpath) if not k.startswith("__")})
        fake_path.exists, fake_path.isdir = self.exists, self.isdir
        fake_os = types.ModuleType("os")
        fake_os.__dict__.update({k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
        fake_os.path = fake_path
        return fake_os

    def omegaconf(self) -> types.ModuleType:
        """OmegaConf.load / to_container over these files (slime reads --eval-config with them)."""
        files = self.files

        class OmegaConf:
            @staticmethod
            def load(path):
                key = posixpath.normpath(str(path))
                if key not in files:
                    raise FileNotFoundError(path)
                return yaml.safe_load(files[key])

            @staticmethod
            def to_container(cfg, resolve=True):
                return copy.deepcopy(cfg)

        module = types.ModuleType("omegaconf")
        module.OmegaConf = OmegaConf
        return module


def _slime_module(rel: str, provided: dict) -> types.ModuleType:
    with warnings.catch_warnings():  # slime's own source has a non-raw "\." in a help string
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return upstream_sources.exec_source(rel[:-3].replace("/", "."), (SOURCES / rel).read_text(), rel, provided)


def _flags(record: dict, flags: list[str] | None = None) -> list[str]:
    """The spellings to add: BooleanOptionalAction makes the ``--no-`` one itself."""
    flags = flags or record["flags"]
    if record["action"] == "boolean_optional":
        return [f for f in flags if not (f.startswith("--no-") and "--" + f[5:] in flags)]
    return flags


def _main_parser(provider) -> argparse.ArgumentParser:
    parser = _Parser(add_help=False, allow_abbrev=False)
    for record in _records():
        if record["parser"] == "main" and record["source"] in UPSTREAM:
            parser.add_argument(*_flags(record), dest=record["dest"], **_kwargs(record))
    provider(parser)
    return parser


def _sglang_parser(module) -> argparse.ArgumentParser:
    """slime's add_sglang_arguments over SGLang's and the router's flags from the registry."""
    upstream = [r for r in _records() if r["parser"] == "sglang" and r["source"] in UPSTREAM]

    def add_server_args(parser, *args, **kwargs):
        for record in upstream:
            if record["source"].startswith("sglang"):
                flags = record["upstream_flags"]
                derived = flags[0][2:].replace("-", "_")
                dest = record["dest"][len("sglang_"):] if record["dest"] != "sglang_" + derived else None
                parser.add_argument(*_flags(record, flags), **({"dest": dest} if dest else {}), **_kwargs(record))

    def add_router_args(parser, *args, **kwargs):
        for record in upstream:
            if record["source"] == "router":
                parser.add_argument(*_flags(record), dest=record["dest"], **_kwargs(record))

    module.ServerArgs = type("ServerArgs", (), {"add_cli_args": staticmethod(add_server_args)})
    module.RouterArgs = type("RouterArgs", (), {"add_cli_args": staticmethod(add_router_args)})
    parser = _Parser(add_help=False)
    module.add_sglang_arguments(parser)
    return parser


def _known(parser: argparse.ArgumentParser, word: str) -> bool:
    name = word.split("=", 1)[0]
    if name in parser._option_string_actions:
        return True
    return bool(parser.allow_abbrev and [o for o in parser._option_string_actions if o.startswith(name)])


def parse(argv: list[str], files: dict[str, str] | None = None) -> argparse.Namespace:
    """``argv`` (the words after ``train.py``) through slime v0.3.1's parse_args; see the module doc."""
    kept = dict(sys.modules)  # slime's modules are executed under their own names: leave no trace
    try:
        return _parse(argv, files or {})
    finally:
        for name in set(sys.modules) - set(kept):
            del sys.modules[name]
        sys.modules.update(kept)


def _parse(argv: list[str], files: dict[str, str]) -> argparse.Namespace:
    vfs = _Files(files)
    sglang_module = _slime_module("slime/backends/sglang_utils/arguments.py", {})
    eval_config = _slime_module("slime/utils/eval_config.py", {})
    provided = {
        "os": vfs.module(),
        "omegaconf": vfs.omegaconf(),
        "slime.utils.eval_config": eval_config,
        "slime.backends.sglang_utils.arguments": sglang_module,
    }
    slime_args = _slime_module("slime/utils/arguments.py", provided)
    preparse = upstream_sources.captured_parser(slime_args._pre_parse_mode)
    sglang = _sglang_parser(sglang_module)
    main = _main_parser(slime_args.get_slime_extra_args_provider())

    options = [w for w in argv if w.startswith("--")]
    unknown = [w for w in options if not any(_known(p, w) for p in (preparse, sglang, main))]
    if unknown:
        raise SlimeRejects(f"no slime v0.3.1 parser knows {unknown} (slime would drop them silently)")
    stale = sorted({w.split("=", 1)[0] for w in options} & deprecated_flags())
    if stale:
        raise SlimeRejects(f"SGLang 0.5.15.post1 calls {stale} deprecated (they work, with a warning): "
                           "show the current names")
    try:
        pre, _ = preparse.parse_known_args(argv)
        skip_sglang = pre.debug_train_only or pre.load_debug_rollout_data is not None
        sglang_ns = None if skip_sglang else sglang.parse_known_args(argv)[0]
        args, _ = main.parse_known_args(argv)
        args.rank = 0
        args.world_size = args.actor_num_nodes * args.actor_num_gpus_per_node
        for key, value in vars(pre).items():
            setattr(args, key, value)
        for key, value in vars(sglang_ns or argparse.Namespace()).items():
            setattr(args, key, value)
        slime_args.slime_validate_args(args)
        if not args.debug_train_only:
            sglang_module.validate_args(args)
    except (_Refused, AssertionError, ValueError, FileNotFoundError, TypeError) as e:
        raise SlimeRejects(f"{type(e).__name__}: {e}") from e
    return args
