"""Reading slime's pinned upstream sources and running their argument code without their dependencies.

A :class:`SourceTree` reads files from a directory, a wheel or ``GITDIR@REV``; ``patch_text``
applies slime's Docker patches to one file. Upstream modules are executed from source with every
import the flag definitions never need replaced by inert stubs, and ``captured_parser`` stops the
first ``parse_known_args`` call to hand back the parser it was called on. ``load_slime_module`` and
``build_preparse_parser`` run slime's own ``slime/utils/arguments.py`` this way.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import importlib.abc
import importlib.machinery
import re
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

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
# slime's own argument code, run from source
# ---------------------------------------------------------------------------------------------


def load_slime_module(slime: SourceTree, rel: str, provided: dict) -> types.ModuleType:
    name = rel[: -len(".py")].replace("/", ".")
    return exec_source(name, slime.read(rel), rel, provided)


def build_preparse_parser(slime: SourceTree):
    slime_args = load_slime_module(slime, "slime/utils/arguments.py", {})
    return captured_parser(slime_args._pre_parse_mode)
