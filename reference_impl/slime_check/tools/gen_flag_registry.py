"""Generate the flag registry: every command-line flag slime v0.3.1 accepts, with type and default.

slime parses its command line with three argparse parsers (``slime/utils/arguments.py``):

* ``preparse``: ``--train-backend``, ``--debug-rollout-only``, ``--debug-train-only``,
  ``--load-debug-rollout-data`` (exact names only);
* ``main``: Megatron-LM's arguments plus slime's own (``megatron_parse_args`` with
  ``ignore_unknown_args=True``: a flag no parser knows is dropped without a word);
* ``sglang``: every SGLang ``ServerArgs`` flag renamed ``--sglang-*`` (minus the ones slime sets
  itself), the router's flags as ``--router-*`` and a few slime flags. It keeps argparse's
  default ``allow_abbrev=True``, so unambiguous prefixes of its flags are accepted.

This script builds those parsers the way slime does, by running the real argparse definitions
at the pinned versions, and writes one JSON record per argparse action. Upstream modules that
only the runtime needs are replaced by inert stubs, and slime's Docker patches (which add flags
to Megatron-LM and SGLang) are applied first, because slime's image ships them.

Sources (slime v0.3.1 pins them in docker/Dockerfile and build_conda.sh)::

    git -C SLIME_GIT archive v0.3.1 | tar -x -C /tmp/slime            # or pass SLIME_GIT@v0.3.1
    git -C MEGATRON_GIT archive 1dcf0dafa884ad52ffb243625717a3471643e087 megatron | tar -x -C /tmp/mlm
    pip download --no-deps sglang==0.5.15.post1 -d /tmp/w
    pip download --no-deps sglang-router==0.3.2 -d /tmp/w

    python -m slime_check.tools.gen_flag_registry --slime /tmp/slime --megatron /tmp/mlm \\
        --sglang-wheel /tmp/w/sglang-0.5.15.post1-*.whl --router-wheel /tmp/w/sglang_router-0.3.2-*.whl

Megatron-LM is imported for real (its flags come from config dataclasses in megatron.core), so
the run needs torch; it takes about 15 s. That full run made ``slime_v0.3.1_flags.json``.

Derived registries (``--base``): another slime with the same pins
-----------------------------------------------------------------

slime's main at 624b824 pins the same Megatron-LM commit (1dcf0da) and the same SGLang image
(``v0.5.15.post1-cu129``) as v0.3.1, and applies the same five patches plus two new ones
(``megatron-sglang-aligned.patch``, which adds no flag, and ``sglang-deterministic.patch``,
which adds one ``ServerArgs`` field). Its registry is derived from v0.3.1's, without Megatron-LM,
the SGLang wheel or torch::

    python -m slime_check.tools.gen_flag_registry --base slime_common/data/slime_v0.3.1_flags.json \
        --slime SLIME_GIT@624b824 --version main --arg-utils SGLANG_0.5.15.post1_SOURCE \
        --out slime_common/data/slime_main-624b824_flags.json

What a derivation regenerates from the target slime's own files:

* every record whose source is ``slime``: the ``main`` parser's slime flags (running slime's
  ``get_slime_extra_args_provider`` from ``slime/utils/arguments.py`` on a parser that holds the
  base's Megatron flags), the ``preparse`` parser, and the ``sglang`` parser's slime flags
  (running ``add_sglang_arguments`` from ``slime/backends/sglang_utils/arguments.py``);
* the defaults slime resets on Megatron, SGLang and router flags (``megatron_default``), and
  which SGLang flags slime hides (its skip list);
* the ``--sglang-*`` flags added by SGLang patches the base does not apply: the ``ServerArgs``
  fields such a patch adds are run through SGLang's own ``arg_utils.py`` (v0.5.15.post1).

What it carries from the base registry unchanged: every Megatron-LM, Megatron-patch, SGLang,
SGLang-patch and router record of the pinned upstreams. A new Megatron patch that adds a flag,
or a new SGLang patch field that needs more of ``server_args.py`` than ``arg_utils``, stops the
derivation with a message: that slime needs the full run above.

``slime_check.flag_source`` uses the same derivation to read a user's own slime checkout.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import enum
import importlib.abc
import importlib.machinery
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "slime_common" / "data" / "slime_v0.3.1_flags.json"

# slime's Dockerfile applies these to SGLang's source, in this order (docker/patch/<version>/).
SGLANG_PATCHES = ["sglang.patch", "sglang-top_p.patch", "sglang-release_hicache.patch", "sglang-pull_weights.patch"]
PATCH_VERSION = "v0.5.15.post1"


# ---------------------------------------------------------------------------------------------
# Reading the pinned sources
# ---------------------------------------------------------------------------------------------


class SourceTree:
    """Read files from a directory, a wheel, or a git repository at a revision (``GITDIR@REV``)."""

    def __init__(self, spec: str):
        self.spec = spec
        self.git_dir, self.rev = None, None
        self.zip = None
        path = Path(spec)
        if path.is_file() and zipfile.is_zipfile(path):
            self.zip = zipfile.ZipFile(path)
        elif "@" in spec and not path.exists():
            git_dir, self.rev = spec.rsplit("@", 1)
            self.git_dir = git_dir
        elif not path.is_dir():
            raise SystemExit(f"gen_flag_registry: {spec} is not a directory, a wheel or GITDIR@REV")

    def read(self, rel: str) -> str:
        if self.zip is not None:
            return self.zip.read(rel).decode()
        if self.git_dir is not None:
            return subprocess.run(
                ["git", "-C", self.git_dir, "show", f"{self.rev}:{rel}"], check=True, capture_output=True, text=True
            ).stdout
        return (Path(self.spec) / rel).read_text()

    def commit(self) -> str | None:
        if self.git_dir is not None:
            return subprocess.run(
                ["git", "-C", self.git_dir, "rev-parse", f"{self.rev}^{{commit}}"],
                check=True, capture_output=True, text=True,
            ).stdout.strip()
        return None

    def export(self, rel_dir: str, dest: Path) -> Path:
        """Materialise ``rel_dir`` under ``dest`` (needed for a real import) and return ``dest``."""
        if self.git_dir is not None:
            archive = subprocess.run(
                ["git", "-C", self.git_dir, "archive", self.rev, rel_dir], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
            return dest
        if self.zip is not None:
            self.zip.extractall(dest, [n for n in self.zip.namelist() if n.startswith(rel_dir)])
            return dest
        shutil.copytree(Path(self.spec) / rel_dir, dest / rel_dir)
        return dest


def patch_text(original: str, patch: str, target: str) -> str:
    """Apply the hunks of ``patch`` that touch ``target`` (a path as written in the patch)."""
    sections = re.split(r"(?m)^(?=diff --git )", patch)
    wanted = [s for s in sections if s.startswith(f"diff --git a/{target} ")]
    if not wanted:
        return original
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / target
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(original)
        subprocess.run(
            ["patch", "-p1", "-s", "--forward", "-d", tmp], input="".join(wanted), text=True, check=True
        )
        return file.read_text()


# ---------------------------------------------------------------------------------------------
# Stubs: what upstream code imports but the flag definitions never need
# ---------------------------------------------------------------------------------------------


class Stub:
    """An inert stand-in for anything from a stubbed module; it remembers its dotted name."""

    def __init__(self, name: str):
        object.__setattr__(self, "_stub_name", name)

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self._stub_name}.{attr}")

    def __call__(self, *args, **kwargs):
        return Stub(f"{self._stub_name}()")

    def __repr__(self):
        return self._stub_name

    def __iter__(self):
        # One stub element, so a list built from a stub (dynamic choices) shows it is unresolved.
        return iter((Stub(f"{self._stub_name}[]"),))

    def __bool__(self):
        return False

    def __mro_entries__(self, bases):
        return (object,)

    def __getitem__(self, key):
        return self

    def _same(self, *other):
        return self

    __or__ = __ror__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _same
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __neg__ = _same

    def __len__(self):
        return 0


class StubModule(types.ModuleType):
    __version__ = "0.0.0"  # reads as "too old" to version probes, so optional fast paths stay off

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self.__name__}.{attr}")


class MissingModuleStubber(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: stubs the named top-level modules when nothing else provides them."""

    def __init__(self):
        self.names: set[str] = set()

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def import_with_stubs(module: str, own_package: str, stubber: MissingModuleStubber, attempts: int = 50):
    """Import ``module`` for real, stubbing each third-party module it lacks (found by retrying)."""
    for _ in range(attempts):
        before = set(sys.modules)
        try:
            return __import__(module, fromlist=["_"])
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if not top or top == own_package or top in stubber.names:
                raise
            stubber.names.add(top)
            # Forget the half-imported package; third-party modules that did load stay (torch's
            # C extension cannot be loaded twice).
            for name in set(sys.modules) - before:
                if name.split(".")[0] == own_package:
                    del sys.modules[name]
    raise RuntimeError(f"could not import {module}")


def exec_source(name: str, source: str, filename: str, provided: dict[str, types.ModuleType]) -> types.ModuleType:
    """Execute one upstream file as module ``name``.

    Its imports resolve to the standard library, to ``provided`` (modules built the same way),
    or else to stubs: the file's own definitions run for real, nothing it imports does.
    """

    def importer(mod_name, globals_=None, locals_=None, fromlist=(), level=0):
        if level == 0 and mod_name in provided:
            return provided[mod_name] if fromlist else provided[mod_name.split(".")[0]]
        top = mod_name.split(".")[0]
        if level == 0 and top in sys.stdlib_module_names:
            return builtins.__import__(mod_name, globals_, locals_, fromlist, level)
        stub = StubModule(mod_name if fromlist else top)
        stub.__path__ = []
        return stub

    module = types.ModuleType(name)
    module.__file__ = filename
    module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": importer}
    # dataclasses and typing.get_type_hints look the module up by name; a later load replaces it.
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


class ParserCaptured(Exception):
    def __init__(self, parser):
        self.parser = parser


@contextlib.contextmanager
def capture_parse() -> Iterator[None]:
    """Stop the first parse_known_args call and hand back the parser it was called on."""
    original = argparse.ArgumentParser.parse_known_args

    def stop(self, *args, **kwargs):
        raise ParserCaptured(self)

    argparse.ArgumentParser.parse_known_args = stop
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original


def captured_parser(call: Callable[[], object]) -> argparse.ArgumentParser:
    with capture_parse():
        try:
            call()
        except ParserCaptured as e:
            return e.parser
    raise RuntimeError("the parser was never used")


# ---------------------------------------------------------------------------------------------
# Turning argparse actions into records
# ---------------------------------------------------------------------------------------------

ACTION_NAMES = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "_AppendConstAction": "append_const",
    "_CountAction": "count",
    "_ExtendAction": "extend",
    "BooleanOptionalAction": "boolean_optional",
}


def to_json(value):
    """JSON for plain values; ``{"py": repr}`` for anything else (enums, stubs, callables)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"py": repr(value)}
    if isinstance(value, enum.Enum):
        return {"py": f"{type(value).__name__}.{value.name}"}
    if isinstance(value, (list, tuple)):
        items = [to_json(v) for v in value]
        return items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: to_json(v) for k, v in value.items()}}
    return {"py": repr(value)}


def type_name(t) -> str | None:
    if t is None:
        return None
    if isinstance(t, Stub):
        return f"unresolved:{t!r}"
    if t in (int, float, str, bool):
        return t.__name__
    if t is json.loads:
        return "json"
    qual = getattr(t, "__qualname__", None) or type(t).__qualname__
    if "enum_type_handler" in qual:
        return "enum"
    return qual


def choices_json(choices):
    if choices is None:
        return None
    try:
        # A set's order changes from run to run; sort it so the registry regenerates identically.
        items = sorted(choices, key=str) if isinstance(choices, (set, frozenset)) else list(choices)
    except TypeError:
        return None
    if not items or any(isinstance(c, Stub) for c in items):
        return None  # empty, or computed from a stubbed module: unknown
    return [c.name if isinstance(c, enum.Enum) else to_json(c) for c in items]


def action_record(action: argparse.Action, parser: str, source: str) -> dict:
    kind = ACTION_NAMES.get(type(action).__name__, type(action).__name__)
    record = {
        "flags": list(action.option_strings),
        "dest": action.dest,
        "parser": parser,
        "source": source,
        "action": kind,
        "type": type_name(action.type),
        "default": to_json(action.default),
        "nargs": action.nargs,  # None: one value; 0: a switch; "?", "*", "+" or a count
        "choices": choices_json(action.choices),
    }
    if action.required:
        record["required"] = True
    if action.const is not None and kind not in ("store_true", "store_false"):
        record["const"] = to_json(action.const)
    return record


def option_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def patch_added_flags(patch: str) -> set[str]:
    """Flags a Megatron patch adds: quoted ``--names`` on added lines, and fields added to config
    dataclasses (Megatron derives a ``--field-name`` flag from each)."""
    added = set()
    for line in patch.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            added.update(re.findall(r"""['"](--[a-z0-9][a-z0-9-]*)['"]""", line))
            field = re.match(r"\+\s{4}([a-z_][a-z0-9_]*)\s*:\s*[^=]+=", line)
            if field:
                added.add("--" + field.group(1).replace("_", "-"))
    return added


# ---------------------------------------------------------------------------------------------
# The three parsers, built the way slime builds them
# ---------------------------------------------------------------------------------------------


def load_slime_module(slime: SourceTree, rel: str, provided: dict) -> types.ModuleType:
    name = rel[: -len(".py")].replace("/", ".")
    return exec_source(name, slime.read(rel), rel, provided)


def build_main_parser(slime: SourceTree, megatron_root: Path, stubber: MissingModuleStubber):
    """Megatron-LM's parser with slime's extra-args provider, as ``megatron_parse_args`` builds it."""
    sys.path.insert(0, str(megatron_root))
    mlm_args = import_with_stubs("megatron.training.arguments", "megatron", stubber)
    if not str(Path(mlm_args.__file__).resolve()).startswith(str(megatron_root.resolve())):
        raise SystemExit(f"gen_flag_registry: imported {mlm_args.__file__}, not the checkout at {megatron_root}")
    slime_args = load_slime_module(slime, "slime/utils/arguments.py", {})
    provider = slime_args.get_slime_extra_args_provider()

    before: dict[int, object] = {}

    def recording_provider(parser):
        for action in option_actions(parser):
            before[id(action)] = action.default
        return provider(parser)

    parser = captured_parser(
        lambda: mlm_args.parse_args(extra_args_provider=recording_provider, ignore_unknown_args=True)
    )
    return parser, before


def build_preparse_parser(slime: SourceTree):
    slime_args = load_slime_module(slime, "slime/utils/arguments.py", {})
    return captured_parser(slime_args._pre_parse_mode)


def load_sglang_server_args(wheel: SourceTree, slime: SourceTree, patched: bool) -> types.ModuleType:
    arg_utils = exec_source(
        "sglang.srt.arg_groups.arg_utils", wheel.read("sglang/srt/arg_groups/arg_utils.py"), "arg_utils.py", {}
    )
    actions = exec_source(
        "sglang.srt.arg_groups.argparse_actions",
        wheel.read("sglang/srt/arg_groups/argparse_actions.py"),
        "argparse_actions.py",
        {},
    )
    source = wheel.read("sglang/srt/server_args.py")
    if patched:
        for name in SGLANG_PATCHES:
            patch = slime.read(f"docker/patch/{PATCH_VERSION}/{name}")
            source = patch_text(
                source, patch.replace("a/python/", "a/").replace("b/python/", "b/"), "sglang/srt/server_args.py"
            )
    provided = {
        "sglang": types.ModuleType("sglang"),
        "sglang.srt.arg_groups.arg_utils": arg_utils,
        "sglang.srt.arg_groups.argparse_actions": actions,
    }
    return exec_source("sglang.srt.server_args", source, "server_args.py", provided)


def build_sglang_parser(slime: SourceTree, server_args: types.ModuleType, router_wheel: SourceTree):
    """slime's ``add_sglang_arguments`` on a fresh parser, as ``sglang_parse_args`` does."""
    router_args = exec_source(
        "sglang_router.router_args", router_wheel.read("sglang_router/router_args.py"), "router_args.py", {}
    )
    provided = {
        "sglang": types.ModuleType("sglang"),
        "sglang_router": types.ModuleType("sglang_router"),
        "sglang.srt.server_args": server_args,
        "sglang_router.launch_router": router_args,
    }
    module = load_slime_module(slime, "slime/backends/sglang_utils/arguments.py", provided)

    origin: dict[int, str] = {}

    def tagging(cls, source):
        original = cls.add_cli_args

        def wrapper(parser, *args, **kwargs):
            seen = {id(a) for a in parser._actions}
            result = original(parser, *args, **kwargs)
            origin.update({id(a): source for a in parser._actions if id(a) not in seen})
            return result

        cls.add_cli_args = staticmethod(wrapper)

    tagging(server_args.ServerArgs, "sglang")
    tagging(router_args.RouterArgs, "router")
    parser = argparse.ArgumentParser(add_help=False)
    module.add_sglang_arguments(parser)
    return parser, origin


def generate(args) -> dict:
    slime = SourceTree(args.slime)
    megatron = SourceTree(args.megatron)
    sglang_wheel = SourceTree(args.sglang_wheel)
    router_wheel = SourceTree(args.router_wheel)
    stubber = MissingModuleStubber()
    sys.meta_path.append(stubber)

    records: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = megatron.export("megatron", Path(tmp))
        # slime's image applies its Megatron patch, which adds flags; the tree here is a copy.
        mlm_patch = slime.read(f"docker/patch/{PATCH_VERSION}/megatron.patch")
        subprocess.run(["patch", "-p1", "-s", "--forward", "-d", str(root)], input=mlm_patch, text=True, check=True)
        patch_flags = patch_added_flags(mlm_patch)

        main, megatron_defaults = build_main_parser(slime, root, stubber)
        for action in option_actions(main):
            if id(action) in megatron_defaults:
                source = "megatron-patch" if set(action.option_strings) & patch_flags else "megatron"
                record = action_record(action, "main", source)
                if to_json(megatron_defaults[id(action)]) != record["default"]:
                    record["megatron_default"] = to_json(megatron_defaults[id(action)])
            else:
                record = action_record(action, "main", "slime")
            records.append(record)
        megatron_commit = megatron.commit() or args.megatron_commit

    for action in option_actions(build_preparse_parser(slime)):
        records.append(action_record(action, "preparse", "slime"))

    unpatched = {
        tuple(a.option_strings)
        for a in option_actions(
            build_sglang_parser(slime, load_sglang_server_args(sglang_wheel, slime, False), router_wheel)[0]
        )
    }
    sglang_parser, origin = build_sglang_parser(
        slime, load_sglang_server_args(sglang_wheel, slime, True), router_wheel
    )
    for action in option_actions(sglang_parser):
        source = origin.get(id(action), "slime")
        if source == "sglang" and tuple(action.option_strings) not in unpatched:
            source = "sglang-patch"
        record = action_record(action, "sglang", source)
        if source.startswith("sglang"):
            record["upstream_flags"] = ["--" + f[len("--sglang-"):] for f in action.option_strings]
        records.append(record)

    records.sort(key=lambda r: (r["flags"][0], r["parser"]))
    return {
        "schema": 1,
        "slime": {"version": "v0.3.1", "commit": slime.commit() or args.slime_commit},
        "pins": {
            "megatron_lm": megatron_commit,
            "sglang": "0.5.15.post1",
            "sglang_patches": [f"docker/patch/{PATCH_VERSION}/{p}" for p in SGLANG_PATCHES],
            "megatron_patch": f"docker/patch/{PATCH_VERSION}/megatron.patch",
            "sglang_router": router_args_version(router_wheel),
            # slime's image installs its own 0.3.2 build of the router (zhuzilin/sgl-router
            # v0.3.2-9daabcd); the flags here come from the PyPI 0.3.2 wheel's router_args.py.
            "sglang_router_source": "PyPI wheel",
        },
        "parsers": {
            "preparse": {"allow_abbrev": False, "unknown": "ignored"},
            "main": {"allow_abbrev": False, "unknown": "ignored (Megatron parse_known_args)"},
            "sglang": {"allow_abbrev": True, "unknown": "ignored (parse_known_args)"},
        },
        "stubbed_modules": sorted(stubber.names),
        "flags": records,
    }


# ---------------------------------------------------------------------------------------------
# Derived registries: a slime with the same pins as a base registry
# ---------------------------------------------------------------------------------------------

UPSTREAM_SOURCES = ("megatron", "megatron-patch", "sglang", "sglang-patch", "router")


class DerivationError(Exception):
    """The base registry cannot stand in for this slime's upstreams; a full run is needed."""


class Replayed:
    """The default of an upstream flag re-added from a base record; slime may replace it."""

    def __init__(self, record: dict):
        self.record = record


def _replay(parser: argparse.ArgumentParser, flags: list[str], record: dict, dest: str | None = None) -> None:
    kwargs = {"nargs": "?", "default": Replayed(record)}
    if dest is not None:
        kwargs["dest"] = dest
    parser.add_argument(*flags, **kwargs)


def _updated(record: dict, pre_default, default, reset_key: str | None) -> dict:
    """``record`` with the default slime leaves on it (and, for Megatron, the one it replaced)."""
    out = {k: v for k, v in record.items() if k != "megatron_default"}
    if isinstance(default, Replayed):
        out["default"] = pre_default
        return out
    out["default"] = to_json(default)
    if reset_key and out["default"] != pre_default:
        out[reset_key] = pre_default
    return out


def derive_main_records(base_records: list[dict], slime: SourceTree) -> list[dict]:
    """The ``main`` parser: the base's Megatron flags, then slime's provider run on them."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre: dict[int, tuple[dict, object]] = {}
    for record in base_records:
        if record["parser"] == "main" and record["source"] in UPSTREAM_SOURCES:
            pre_default = record["megatron_default"] if "megatron_default" in record else record["default"]
            _replay(parser, record["flags"], record, record["dest"])
            pre[id(parser._actions[-1])] = (record, pre_default)
    provider = load_slime_module(slime, "slime/utils/arguments.py", {}).get_slime_extra_args_provider()
    provider(parser)
    records = []
    for action in option_actions(parser):
        if id(action) in pre:
            record, pre_default = pre[id(action)]
            records.append(_updated(record, pre_default, action.default, "megatron_default"))
        else:
            records.append(action_record(action, "main", "slime"))
    return records


def patch_server_args_fields(patch: str) -> list[str]:
    """The ``ServerArgs`` fields a SGLang patch adds, as source blocks (four-space indent)."""
    sections = re.split(r"(?m)^(?=diff --git )", patch)
    blocks: list[str] = []
    for section in sections:
        if not section.startswith("diff --git a/python/sglang/srt/server_args.py "):
            continue
        run: list[str] = []
        for line in section.splitlines() + [""]:
            if line.startswith("+") and not line.startswith("+++"):
                run.append(line[1:])
                continue
            if run and re.match(r"^    [a-z_][a-z0-9_]*\s*:", run[0]):
                blocks.append("\n".join(run))
            elif any(re.match(r"^    [a-z_][a-z0-9_]*\s*:\s*A\[", r) for r in run):
                raise DerivationError(f"a patch adds ServerArgs fields mixed with other code: {run[0].strip()}")
            run = []
    return blocks


def patch_field_parser_hook(blocks: list[str], arg_utils: SourceTree):
    """A function adding the patch-added fields' flags, as SGLang's ``add_cli_args`` would."""
    if not blocks:
        return lambda parser: None
    utils = exec_source("sglang.srt.arg_groups.arg_utils", arg_utils.read("sglang/srt/arg_groups/arg_utils.py"),
                        "arg_utils.py", {})
    source = (
        "from __future__ import annotations\nimport dataclasses\n"
        "from typing import Any, Callable, Dict, List, Literal, Optional, Union\n"
        "from sglang.srt.arg_groups.arg_utils import A, Arg\n\n"
        "@dataclasses.dataclass\nclass ServerArgs:\n" + "\n".join(blocks) + "\n"
    )
    try:
        module = exec_source("sglang.srt.server_args_patch_fields", source, "server_args_patch_fields.py",
                             {"sglang": types.ModuleType("sglang"), "sglang.srt.arg_groups.arg_utils": utils})
        fields = module.ServerArgs
    except Exception as e:  # a field that needs more of server_args.py than its own lines
        raise DerivationError(f"a patch's ServerArgs fields need SGLang's full server_args.py: {e}") from e
    return lambda parser: utils.add_cli_args_from_dataclass(parser, fields)


def derive_sglang_records(base_records: list[dict], slime: SourceTree, add_patch_fields,
                          add_server_flags=None) -> list[dict]:
    """The ``sglang`` parser: slime's ``add_sglang_arguments`` over the base's SGLang and router flags.

    ``add_server_flags(parser)``, when given, adds SGLang's flags instead of the base's (an installed
    SGLang's ``ServerArgs.add_cli_args``); they are recorded with source ``sglang``.
    """
    upstream = [r for r in base_records if r["parser"] == "sglang" and r["source"] in UPSTREAM_SOURCES]
    origin: dict[int, str] = {}
    replayed: set[int] = set()

    def adding(source: str, add):
        def add_cli_args(parser, *args, **kwargs):
            seen = {id(a) for a in parser._actions}
            add(parser)
            for action in parser._actions:
                if id(action) not in seen:
                    origin[id(action)] = source
                    if isinstance(action.default, Replayed):
                        replayed.add(id(action))
        return staticmethod(add_cli_args)

    def add_server_args(parser):
        if add_server_flags is not None:
            add_server_flags(parser)
            return
        for record in upstream:
            if record["source"].startswith("sglang"):
                flags = record["upstream_flags"]
                derived = flags[0][2:].replace("-", "_")
                dest = record["dest"][len("sglang_"):] if record["dest"] != "sglang_" + derived else None
                # slime's wrapper prefixes flags and dest; its skip list sees the unprefixed dest.
                parser.add_argument(*flags, nargs="?", default=Replayed(record),
                                    **({"dest": dest} if dest else {}))
        add_patch_fields(parser)

    def add_router_args(parser):
        for record in upstream:
            if record["source"] == "router":
                _replay(parser, record["flags"], record, record["dest"])

    server_args = types.ModuleType("sglang.srt.server_args")
    server_source = "sglang" if add_server_flags is not None else "sglang-patch"
    server_args.ServerArgs = type("ServerArgs", (), {"add_cli_args": adding(server_source, add_server_args)})
    router = types.ModuleType("sglang_router.launch_router")
    router.RouterArgs = type("RouterArgs", (), {"add_cli_args": adding("router", add_router_args)})
    provided = {
        "sglang": types.ModuleType("sglang"),
        "sglang_router": types.ModuleType("sglang_router"),
        "sglang.srt.server_args": server_args,
        "sglang_router.launch_router": router,
    }
    module = load_slime_module(slime, "slime/backends/sglang_utils/arguments.py", provided)
    parser = argparse.ArgumentParser(add_help=False)
    module.add_sglang_arguments(parser)
    records = []
    for action in option_actions(parser):
        default = action.default
        if id(action) in replayed or isinstance(default, Replayed):
            record = default.record if isinstance(default, Replayed) else None
            if record is None:  # slime replaced the default of a replayed flag: find its record by flags
                record = next(r for r in upstream if r["flags"] == list(action.option_strings))
            records.append(_updated(record, record["default"], default, None))
            continue
        source = origin.get(id(action), "slime")
        record = action_record(action, "sglang", source)
        if source.startswith("sglang"):
            record["upstream_flags"] = ["--" + f[len("--sglang-"):] for f in action.option_strings]
        records.append(record)
    return records


def dockerfile_patches(dockerfile: str) -> tuple[list[str], list[str]]:
    """The Megatron and SGLang patch files slime's Dockerfile applies, in order (basenames)."""
    version = re.search(r"(?m)^ARG PATCH_VERSION=(\S+)", dockerfile)
    sglang = re.search(r"for patch in ([^;]+); do", dockerfile)
    megatron = re.findall(r"git apply (megatron[\w.-]*\.patch)", dockerfile)
    if not (version and sglang and megatron):
        raise DerivationError("docker/Dockerfile does not show which patches the image applies")
    folder = f"docker/patch/{version.group(1)}"
    return ([f"{folder}/{m}" for m in dict.fromkeys(megatron)], [f"{folder}/{p}" for p in sglang.group(1).split()])


def derive(base: dict, slime: SourceTree, version: str, commit: str, arg_utils: SourceTree | None) -> dict:
    """The registry of ``slime`` (same Megatron-LM and SGLang pins as ``base``); see the module doc."""
    base_records = base["flags"]
    pins = json.loads(json.dumps(base["pins"]))
    base_patches = {Path(p).name for p in pins["sglang_patches"]} | {Path(pins["megatron_patch"]).name}
    megatron_patches, sglang_patches = dockerfile_patches(slime.read("docker/Dockerfile"))
    new_megatron = [p for p in megatron_patches if Path(p).name not in base_patches]
    new_sglang = [p for p in sglang_patches if Path(p).name not in base_patches]
    for name in new_megatron:
        if patch_added_flags(slime.read(name)):
            raise DerivationError(f"{name} adds Megatron flags; run the full generator with --megatron")
    blocks = [b for name in new_sglang for b in patch_server_args_fields(slime.read(name))]
    if blocks and arg_utils is None:
        raise DerivationError(f"{', '.join(new_sglang)} add ServerArgs fields; pass --arg-utils (SGLang's source)")
    records = derive_main_records(base_records, slime)
    records += [action_record(a, "preparse", "slime") for a in option_actions(build_preparse_parser(slime))]
    records += derive_sglang_records(base_records, slime, patch_field_parser_hook(blocks, arg_utils))
    records.sort(key=lambda r: (r["flags"][0], r["parser"]))
    out = {k: v for k, v in base.items() if k != "flags"}
    out["slime"] = {"version": version, "commit": commit}
    if new_megatron or new_sglang:
        pins["sglang_patches"] = sglang_patches
        pins["megatron_patches"] = megatron_patches
        pins["megatron_patch"] = megatron_patches[0]
    out["pins"] = pins
    if version != base["slime"]["version"]:
        out["derived_from"] = {
            "slime": base["slime"],
            "regenerated": "slime's own flags (main, preparse and sglang parsers), slime's default resets and "
                           "skip list, flags of SGLang patches new since the base",
            "carried": "Megatron-LM, Megatron patch, SGLang, SGLang patch and router flags of the base",
        }
    out["flags"] = records
    return out


def router_args_version(wheel: SourceTree) -> str:
    text = wheel.read("sglang_router/version.py")
    match = re.search(r"""__version__\s*=\s*['"]([^'"]+)""", text)
    return match.group(1) if match else "unknown"


def dump(registry: dict) -> str:
    """Pretty JSON with one flag record per line, so a regenerated registry diffs line by line."""
    head = {k: v for k, v in registry.items() if k != "flags"}
    lines = json.dumps(head, indent=1)[:-2] + ',\n "flags": [\n'
    lines += ",\n".join("  " + json.dumps(r) for r in registry["flags"])
    return lines + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slime", required=True, help="slime: a checkout, or GITDIR@REV (v0.3.1, 624b824, ...)")
    parser.add_argument("--slime-commit", default=None, help="commit to record when --slime is a plain directory")
    parser.add_argument("--base", type=Path, default=None,
                        help="derive from this registry (same pins) instead of reading Megatron-LM and SGLang")
    parser.add_argument("--version", default="v0.3.1", help="the slime version to record (v0.3.1, main)")
    parser.add_argument("--arg-utils", default=None,
                        help="with --base: SGLang 0.5.15.post1 source (wheel or directory) holding "
                             "sglang/srt/arg_groups/arg_utils.py, for flags new SGLang patches add")
    parser.add_argument("--megatron", help="Megatron-LM at 1dcf0da: a checkout, or GITDIR@1dcf0da...")
    parser.add_argument("--megatron-commit", default="1dcf0dafa884ad52ffb243625717a3471643e087")
    parser.add_argument("--sglang-wheel", help="sglang-0.5.15.post1 wheel")
    parser.add_argument("--router-wheel", help="sglang_router-0.3.2 wheel")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.base is not None:
        slime = SourceTree(args.slime)
        commit = slime.commit() or args.slime_commit
        if commit is None:
            parser.error("--slime-commit is required when --slime is a plain directory")
        try:
            registry = derive(json.loads(args.base.read_text()), slime, args.version, commit,
                              SourceTree(args.arg_utils) if args.arg_utils else None)
        except DerivationError as e:
            raise SystemExit(f"gen_flag_registry: {e}") from None
    else:
        missing = [f"--{n.replace('_', '-')}" for n in ("megatron", "sglang_wheel", "router_wheel")
                   if getattr(args, n) is None]
        if missing:
            parser.error(f"{', '.join(missing)} required without --base")
        registry = generate(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(dump(registry))
    tmp.replace(args.out)
    counts: dict[str, int] = {}
    for record in registry["flags"]:
        counts[record["source"]] = counts.get(record["source"], 0) + 1
    print(json.dumps({"out": str(args.out), "records": len(registry["flags"]), "by_source": counts}))


if __name__ == "__main__":
    main()
