"""Which slime a job will run on, and which known slime it is judged against.

Sources, in the order they decide:

* the ``--slime-dir`` checkout: ``git describe --tags``, its commit and whether it has local
  changes (a tree that is not a git checkout: its package layout and version);
* the importable ``slime`` package (located with ``find_spec``, never imported);
* the container image, where the environment names it (``SLIME_IMAGE=slimerl/slime:TAG``).

Each is mapped to one of the slimes the checker knows (``KNOWN_SLIMES``): v0.3.1's exact commit or
tag is ``v0.3.1``; main at 624b824, a descendant of it, or anything past v0.3.1 is judged as
``main@624b824`` (the nearest known). With nothing to go on the newest known slime is used, and
the report says so. Two sources that name different slimes are a WARN: the job may run another
slime than the one checked.

Only ``git`` runs (no network, a short timeout); no slime, torch or GPU code is loaded.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slime_check.findings import Finding, Status
from slime_common.registry import KNOWN_SLIMES, NEWEST_KNOWN

V031 = "v0.3.1"
V031_COMMIT = "a6272da0d4f3d0a08520c99a2f3b4f6c887960dc"
MAIN = NEWEST_KNOWN  # "main@624b824"
MAIN_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
GIT_TIMEOUT_S = 3.0
IMAGE_VARS = ("SLIME_IMAGE", "SLIME_IMAGE_TAG")
# slimerl/slime tags that docker/version.txt gives a known slime (docker/justfile tags the image with it)
IMAGE_TAGS = {"nightly-dev-20260804a": V031}

# What ``--slime-version`` accepts, and the known slime each names.
VERSION_CHOICES = {"v0.3.1": V031, "0.3.1": V031, "main": MAIN, MAIN: MAIN, "main@624b824a8": MAIN}

DESCRIBE = re.compile(r"^v?(\d+(?:\.\d+)*)(?:-(\d+)-g([0-9a-f]+))?(-dirty)?$")


def _vtuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


@dataclass
class Source:
    """One place that says which slime runs."""

    kind: str  # "slime-dir", "importable", "image" or "option"
    where: str  # a path, an image reference or the option
    target: str | None = None  # the known slime it is judged as; None when it says nothing
    relation: str = ""  # how it relates to that known slime, in words
    commit: str | None = None
    describe: str | None = None
    dirty: bool | None = None
    version: str | None = None

    @property
    def short(self) -> str:
        bits = []
        if self.describe and self.commit and self.commit[:7] not in self.describe:
            bits.append(f"git {self.describe} ({self.commit[:7]})")
        elif self.describe:
            bits.append(f"git {self.describe}")
        elif self.commit:
            bits.append(f"git {self.commit[:7]}")
        elif self.version:
            bits.append(f"version {self.version}")
        if self.dirty is not None:
            bits.append("local changes" if self.dirty else "clean")
        return ", ".join(bits)

    def text(self) -> str:
        names = {"slime-dir": "--slime-dir", "importable": "importable slime", "image": "image",
                 "option": "--slime-version"}
        detail = f"; {self.short}" if self.short else ""
        return f"{names.get(self.kind, self.kind)} {self.where}{detail}"


@dataclass
class SlimeIdentity:
    target: str  # one of KNOWN_SLIMES: the slime the job is judged against
    label: str  # e.g. "slime main@624b824 (/root/slime, git 624b824, clean)"
    sources: list[Source] = field(default_factory=list)
    decided_by: Source | None = None
    notes: list[str] = field(default_factory=list)
    disagreements: list[tuple[Source, Source]] = field(default_factory=list)

    @property
    def identified(self) -> bool:
        return self.decided_by is not None

    def findings(self) -> list[Finding]:
        out = []
        if self.decided_by is None:
            out.append(Finding("slime.version", Status.WARN,
                               f"Nothing identifies your slime (no --slime-dir, no importable slime package, no "
                               f"SLIME_IMAGE): judged against the newest slime this checker knows, {self.target}.",
                               "Pass --slime-dir DIR (your slime checkout) or --slime-version v0.3.1|main."))
        else:
            text = f"Judged against slime {self.target}: {self.decided_by.text()}"
            if self.decided_by.relation:
                text += f" ({self.decided_by.relation})"
            out.append(Finding("slime.version", Status.PASS, text + "."))
        for a, b in self.disagreements:
            out.append(Finding("slime.version_mismatch", Status.WARN,
                               f"Two slimes: {a.text()} is {a.target or 'unknown'}, but {b.text()} is "
                               f"{b.target or 'unknown'}{_commits(a, b)}. The job may run another slime than the "
                               f"one checked ({self.target}).",
                               "Run the job with the slime you check: point --slime-dir at the checkout the job "
                               "runs (in the image, /root/slime), or install that checkout (pip install -e)."))
        return out

    def to_json(self) -> dict:
        return {"target": self.target, "label": self.label, "identified": self.identified,
                "decided_by": self.decided_by.kind if self.decided_by else None,
                "sources": [asdict(s) for s in self.sources], "notes": list(self.notes)}


def _commits(a: Source, b: Source) -> str:
    if a.commit and b.commit and a.target == b.target:
        return f" at {b.commit[:7]} against {a.commit[:7]}"
    return ""


# ---------------------------------------------------------------------------------------------
# reading one source


def _git(path: Path, *args: str) -> tuple[int, str]:
    try:
        done = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(path), *args], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0",
                                                                     "GIT_TERMINAL_PROMPT": "0"})
    except (OSError, subprocess.TimeoutExpired):
        return 128, ""
    return done.returncode, done.stdout.strip()


def _is_ancestor(path: Path, older: str, newer: str = "HEAD") -> bool | None:
    rc, _ = _git(path, "merge-base", "--is-ancestor", older, newer)
    return True if rc == 0 else False if rc == 1 else None  # 128: a commit this clone lacks


def _package_version(root: Path) -> str | None:
    for name in ("setup.py", "pyproject.toml"):
        try:
            text = (root / name).read_text(errors="replace")
        except OSError:
            continue
        m = re.search(r"""(?<![\w.])version\s*=\s*["']([^"']+)["']""", text)
        if m:
            return m.group(1)
    return None


def _judge_layout(root: Path, version: str | None) -> tuple[str | None, str]:
    """A tree without git history: main's layout (slime/observability, #2298) or the package version."""
    if (root / "slime" / "observability").is_dir():
        return MAIN, "has slime/observability, main's layout since #2298"
    if version is None:
        return None, "no git history and no package version"
    if version == "0.3.1":
        return V031, "package version 0.3.1 without slime/observability (main before #2298 says 0.3.1 too)"
    try:
        newer = _vtuple(version) > (0, 3, 1)
    except ValueError:
        return None, f"package version {version} is not one this checker knows"
    if newer:
        return MAIN, f"package version {version} is newer than any slime this checker knows: judged as {MAIN}"
    return V031, f"package version {version} is older than v0.3.1: judged as v0.3.1, the oldest known"


def _judge_describe(describe: str) -> tuple[str | None, str]:
    m = DESCRIBE.match(describe)
    if not m:
        return None, f"git describe gives {describe}"
    version, ahead = m.group(1), m.group(2)
    try:
        vt = _vtuple(version)
    except ValueError:
        return None, f"git describe gives {describe}"
    if vt == (0, 3, 1) and ahead in (None, "0"):
        return V031, "the v0.3.1 tag"
    if vt >= (0, 3, 1):
        return MAIN, f"{ahead + ' commits past ' if ahead else ''}v{version}, newer than v0.3.1: judged as {MAIN}"
    return V031, f"v{version} is older than v0.3.1: judged as v0.3.1, the oldest known"


def read_checkout(root: Path, kind: str) -> Source:
    """What a slime tree on this machine is: git facts where it is a checkout, else its layout."""
    root = root.resolve()
    src = Source(kind, str(root))
    rc, top = _git(root, "rev-parse", "--show-toplevel")
    if rc != 0 or Path(top).resolve() != root:  # not a checkout of its own (maybe inside another repo)
        src.version = _package_version(root)
        src.target, src.relation = _judge_layout(root, src.version)
        return src
    rc, commit = _git(root, "rev-parse", "HEAD")
    src.commit = commit if rc == 0 and commit else None
    rc, describe = _git(root, "describe", "--tags")
    src.describe = describe if rc == 0 and describe else None
    rc, status = _git(root, "status", "--porcelain", "--untracked-files=no")
    src.dirty = bool(status) if rc == 0 else None
    if src.commit == V031_COMMIT:
        src.target, src.relation = V031, "the v0.3.1 tag's commit"
    elif src.commit == MAIN_COMMIT:
        src.target, src.relation = MAIN, "exactly main@624b824"
    elif src.commit and _is_ancestor(root, MAIN_COMMIT):
        src.target, src.relation = MAIN, f"newer than {MAIN}: judged as {MAIN}"
    elif src.commit and _is_ancestor(root, V031_COMMIT):
        src.target, src.relation = MAIN, f"past v0.3.1, not past 624b824: judged as {MAIN}, the nearest known"
    elif src.commit and _is_ancestor(root, "HEAD", V031_COMMIT):
        src.target, src.relation = V031, "older than v0.3.1: judged as v0.3.1, the oldest known"
    elif src.describe:
        src.target, src.relation = _judge_describe(src.describe)
    if src.target is None:
        src.version = _package_version(root)
        target, why = _judge_layout(root, src.version)
        if target is not None:
            src.target, src.relation = target, f"commit {src.commit[:7] if src.commit else '?'} is not one this " \
                                               f"checker knows; {why}"
    if src.dirty and src.target:
        src.relation += ("; " if src.relation else "") + "with local changes"
    return src


def importable_slime() -> Source | None:
    """The ``slime`` package this Python would import, found without importing it."""
    try:
        spec = importlib.util.find_spec("slime")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in"):
        package = Path(spec.origin).parent
    elif spec.submodule_search_locations:
        package = Path(list(spec.submodule_search_locations)[0])
    else:
        return None
    src = read_checkout(package.parent, "importable")
    if src.commit is None and src.version is None:
        try:
            from importlib.metadata import PackageNotFoundError, version

            src.version = version("slime")
        except (PackageNotFoundError, ValueError):
            pass
        else:
            src.target, src.relation = _judge_layout(package.parent, src.version)
    return src


def image_source(env: Mapping[str, str]) -> Source | None:
    """The image the environment names: ``SLIME_IMAGE=slimerl/slime:TAG`` (or ``SLIME_IMAGE_TAG=TAG``)."""
    for var in IMAGE_VARS:
        ref = (env.get(var) or "").strip()
        if not ref:
            continue
        tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
        src = Source("image", f"{ref} (${var})")
        m = re.search(r"v?(\d+\.\d+\.\d+)", tag)
        if tag in IMAGE_TAGS:
            src.target = IMAGE_TAGS[tag]
            src.relation = f"image tag {tag} is {src.target}'s (its docker/version.txt)"
        elif m:
            src.version = m.group(1)
            src.target, src.relation = _judge_describe("v" + m.group(1))
        elif re.search(r"latest|nightly|dev|main", tag):
            src.target, src.relation = MAIN, f"image tag {tag} follows slime's main: judged as {MAIN}"
        else:
            src.relation = f"image tag {tag} names no slime version"
        return src
    return None


# ---------------------------------------------------------------------------------------------


def normalize_version(text: str) -> str:
    """``--slime-version`` to a known slime; ValueError naming the choices."""
    key = text.strip()
    if key in VERSION_CHOICES:
        return VERSION_CHOICES[key]
    raise ValueError(f"--slime-version {text}: not a slime this checker knows; choose v0.3.1 or main "
                     f"(main@624b824)")


def identify(slime_dir: Path | str | None, env: Mapping[str, str] | None = None, *,
             version: str | None = None, importable: bool = True) -> SlimeIdentity:
    """Which slime the job runs, from ``--slime-dir``, the importable package and the image.

    ``version`` (``--slime-version``) names the slime to judge against and wins over what the sources
    say; a source naming another slime is then a finding. ``importable=False`` leaves this
    interpreter's ``slime`` out (for a job that does not run here)."""
    env = os.environ if env is None else env
    sources: list[Source] = []
    if slime_dir is not None:
        sources.append(read_checkout(Path(slime_dir), "slime-dir"))
    if importable:
        found = importable_slime()
        if found is not None and all(found.where != s.where for s in sources):
            sources.append(found)
    image = image_source(env)
    if image is not None:
        sources.append(image)

    decided = None
    if version is not None:
        target = normalize_version(version)
        decided = Source("option", version, target, "as asked")
        sources.insert(0, decided)
    else:
        decided = next((s for s in sources if s.target is not None), None)
        target = decided.target if decided else NEWEST_KNOWN
    assert target in KNOWN_SLIMES, target

    identity = SlimeIdentity(target, "", sources, decided)
    named = [s for s in sources if s.target is not None]
    for s in named:
        if s is decided or decided is None:
            continue
        differs = s.target != decided.target or (s.commit and decided.commit and s.commit != decided.commit)
        if differs and not any(s in pair for pair in identity.disagreements):
            identity.disagreements.append((decided, s))
    for s in sources:
        if s.target is None:
            identity.notes.append(f"{s.text()}: {s.relation or 'says nothing about the version'}")
    if decided is None:
        identity.label = f"slime {target} (nothing identifies your slime: the newest known)"
    else:
        detail = ", ".join(x for x in (decided.where if decided.kind != "option" else "--slime-version",
                                       decided.short) if x)
        identity.label = f"slime {target} ({detail})"
    return identity


def registry_for(identity: SlimeIdentity, slime_dir: Path | str | None):
    """The flags to judge a job by, and notes on where they came from: read from the ``--slime-dir``
    checkout where one is given, else the registry shipped for the identified slime."""
    from slime_common.registry import load_registry

    if slime_dir is not None and (Path(slime_dir) / "slime" / "utils" / "arguments.py").is_file():
        from slime_check.flag_source import registry_for_checkout

        return registry_for_checkout(Path(slime_dir), identity.target)
    reg = load_registry(identity.target)
    notes = [f"flags: {reg.flags_from}"]
    if slime_dir is not None:  # a folder of launch scripts and scripts/models, not a slime source tree
        notes.append(f"--slime-dir {slime_dir} has no slime/utils/arguments.py to read flags from")
    return reg, notes


def flags_finding(notes: list[str]) -> Finding:
    return Finding("slime.flags", Status.PASS, "; ".join(notes) if notes else "flags: the shipped registry")
