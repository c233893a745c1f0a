"""``slime-check skill install`` and ``skill uninstall``: put the slime skill where Hermes Agent finds it.

Hermes (0.19.0) finds skills under ``$HERMES_HOME/skills/<category>/<name>/SKILL.md`` and lists a
skill's ``references/*.md``, ``templates/``, ``scripts/`` and ``assets/`` to the agent. The
repository keeps the same files elsewhere, so installing maps paths:

    SKILL.md                  -> SKILL.md
    skill/references/...      -> references/...
    skill/templates/...       -> templates/...
    skill/scripts/...         -> scripts/...
    checklists/...            -> assets/checklists/...
    examples/...              -> assets/examples/...

and rewrites every relative Markdown link to the installed layout, so each link resolves in the
repository and in the installed copy alike. A manifest in the installed folder records every file
with its sha256; uninstall removes exactly those files (and the folders install created), and
never a file that was changed since, unless ``--force``.

The bundle ships inside the package (``slime_check/bundle/``: symlinks to the repository in an
editable install, copied files in a wheel), so both kinds of install find it the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

import click

from slime_common.errors import UserError
from slime_common.fileio import atomic_write_bytes, atomic_write_json

SKILL_NAME = "slime-rl"
DEFAULT_CATEGORY = "mlops"
MANIFEST_NAME = ".slime-check-install.json"

# repository path prefix -> installed path prefix; the first match wins
PATH_MAP = (
    ("SKILL.md", "SKILL.md"),
    ("skill/references", "references"),
    ("skill/templates", "templates"),
    ("skill/scripts", "scripts"),
    ("checklists", "assets/checklists"),
    ("examples", "assets/examples"),
)
_CATEGORY = re.compile(r"^[a-z0-9][a-z0-9._-]*$")  # Hermes' rule for skill and category names
_MD_LINK = re.compile(r"(?<!!)(\[[^\]\n]*\]\()([^)\s]+)(\))")
_SKIPPED_PARTS = {"__pycache__", ".pytest_cache"}


def bundle_root() -> Path:
    """The folder holding SKILL.md, skill/, checklists/ and examples/ as the package ships them."""
    root = Path(str(resources.files("slime_check") / "bundle"))
    if not (root / "SKILL.md").is_file():
        raise UserError(f"the skill bundle is missing from this install ({root}/SKILL.md); reinstall slime-skill")
    return root


def installed_path(repo_path: str) -> str | None:
    """Where a repository path (file or folder, POSIX form) lands in the installed skill; None if it is
    not installed."""
    for source, target in PATH_MAP:
        if repo_path == source or repo_path.startswith(source + "/"):
            return target + repo_path[len(source) :]
    return None


def bundle_files(root: Path) -> list[str]:
    """Repository paths of every file that gets installed, sorted."""
    found = []
    for directory, subdirs, files in os.walk(root, followlinks=True):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_PARTS and not d.startswith("."))
        for name in files:
            if name.startswith(".") or name.endswith((".pyc", ".pyo")):
                continue
            rel = Path(directory, name).relative_to(root).as_posix()
            if installed_path(rel) is not None:
                found.append(rel)
    return sorted(found)


def rewrite_links(text: str, repo_path: str) -> str:
    """Point every relative Markdown link of the file at ``repo_path`` to its installed location."""
    here = posixpath.dirname(repo_path)
    here_installed = posixpath.dirname(installed_path(repo_path))

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        path, sep, anchor = target.partition("#")
        repo_target = posixpath.normpath(posixpath.join(here, path))
        mapped = installed_path(repo_target)
        if mapped is None:
            raise UserError(f"{repo_path}: link {target!r} points outside the skill bundle; fix the link")
        new = posixpath.relpath(mapped, here_installed or ".")
        if path.endswith("/"):
            new += "/"
        return match.group(1) + new + sep + anchor + match.group(3)

    return _MD_LINK.sub(rewrite, text)


def render_bundle(root: Path) -> dict[str, bytes]:
    """Installed path -> file content, links rewritten in Markdown files."""
    rendered = {}
    for rel in bundle_files(root):
        data = (root / rel).read_bytes()
        if rel.endswith(".md"):
            data = rewrite_links(data.decode("utf-8"), rel).encode("utf-8")
        rendered[installed_path(rel)] = data
    return rendered


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def resolve_hermes_home(option: Path | None) -> Path:
    """--hermes-home, else $HERMES_HOME, else ~/.hermes (Hermes' own default)."""
    if option is not None:
        return option.expanduser()
    return Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes").expanduser()


def skill_dir(home: Path, category: str) -> Path:
    if not _CATEGORY.match(category):
        raise UserError(f"--category {category!r}: use lowercase letters, digits, '.', '_' or '-' (e.g. mlops)")
    return home / "skills" / category / SKILL_NAME


def read_manifest(target: Path) -> dict | None:
    path = target / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: unreadable install record ({e}); remove it by hand") from e
    if manifest.get("skill") != SKILL_NAME or not isinstance(manifest.get("files"), dict):
        raise UserError(f"{path}: not a slime-check install record; remove it by hand")
    return manifest


def locally_modified(target: Path, manifest: dict) -> list[str]:
    """Installed files that differ from what install wrote (missing files are not 'modified')."""
    changed = []
    for rel, digest in sorted(manifest["files"].items()):
        path = target / rel
        if path.is_file() and _sha256(path.read_bytes()) != digest:
            changed.append(rel)
    return changed


def _other_installs(home: Path, target: Path) -> list[Path]:
    # The same skill name under two categories makes Hermes' skill_view refuse as ambiguous.
    skills = home / "skills"
    candidates = list(skills.glob(f"*/{SKILL_NAME}/SKILL.md")) + list(skills.glob(f"{SKILL_NAME}/SKILL.md"))
    return [p.parent for p in candidates if p.parent != target]


def _prune_empty(target: Path, directories: list[str]) -> None:
    # deepest first; "" (the skill folder itself) last
    for rel in sorted(directories, key=lambda d: d.count("/") if d else -1, reverse=True):
        path = target / rel if rel else target
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def install(home: Path, category: str, force: bool = False) -> tuple[Path, int]:
    """Install (or upgrade) the skill; returns its folder and the number of files written."""
    target = skill_dir(home, category)
    others = _other_installs(home, target)
    if others:
        raise UserError(
            f"{SKILL_NAME} is already installed at {others[0]}; Hermes cannot tell two copies apart. "
            f"Run slime-check skill uninstall --category {others[0].parent.name} first"
        )
    previous = read_manifest(target) if target.exists() else None
    if previous is None and target.exists() and any(p.is_file() for p in target.rglob("*")):
        raise UserError(f"{target} exists and was not installed by slime-check; move it away or choose another "
                        f"--category")
    if previous is not None:
        changed = locally_modified(target, previous)
        if changed and not force:
            raise UserError(f"{target}: changed since install: {', '.join(changed)}; rerun with --force to overwrite "
                            f"them")

    rendered = render_bundle(bundle_root())
    if previous is not None:
        created = list(previous.get("directories", []))
    else:  # a fresh folder, or an empty tree a kept-file uninstall left behind: its folders become ours
        created = [""] + [p.relative_to(target).as_posix() for p in target.rglob("*")] if target.exists() else []
    for rel in ["", *sorted({posixpath.dirname(r) for r in rendered} - {""})]:
        for ancestor in _ancestors(rel):
            if not (target / ancestor).exists() and ancestor not in created:
                created.append(ancestor)
    for rel, data in rendered.items():
        atomic_write_bytes(target / rel, data)
    if previous is not None:
        for rel in sorted(set(previous["files"]) - set(rendered)):
            (target / rel).unlink(missing_ok=True)
        _prune_empty(target, [d for d in created if d])
    atomic_write_json(
        target / MANIFEST_NAME,
        {
            "skill": SKILL_NAME,
            "category": category,
            "installed_by": "slime-check skill install",
            "installed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "files": {rel: _sha256(data) for rel, data in sorted(rendered.items())},
            "directories": sorted(created),
        },
    )
    return target, len(rendered)


def _ancestors(rel: str) -> list[str]:
    """'' then every parent folder of ``rel`` down to ``rel`` itself (POSIX, relative)."""
    parts = [p for p in rel.split("/") if p]
    return [""] + ["/".join(parts[: i + 1]) for i in range(len(parts))]


def uninstall(home: Path, category: str, force: bool = False) -> tuple[Path, list[str], list[str]]:
    """Remove what install recorded; returns the folder, removed files, and files kept because they changed."""
    target = skill_dir(home, category)
    manifest = read_manifest(target) if target.exists() else None
    if manifest is None:
        elsewhere = [p for p in _other_installs(home, target) if (p / MANIFEST_NAME).is_file()]
        hint = f"; found one in category {elsewhere[0].parent.name} (use --category)" if elsewhere else ""
        raise UserError(f"no {SKILL_NAME} skill installed by slime-check at {target}{hint}")
    kept = [] if force else locally_modified(target, manifest)
    removed = []
    for rel in sorted(manifest["files"]):
        path = target / rel
        if rel in kept or not path.is_file():
            continue
        path.unlink()
        removed.append(rel)
    (target / MANIFEST_NAME).unlink()
    _prune_empty(target, manifest.get("directories", []))
    return target, removed, kept


_HOME_OPTION = click.option(
    "--hermes-home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Hermes' home folder. Default: $HERMES_HOME, else ~/.hermes.",
)
_CATEGORY_OPTION = click.option(
    "--category", default=DEFAULT_CATEGORY, show_default=True, help="Skill category (a folder under skills/)."
)


@click.group("skill")
def skill() -> None:
    """Install the slime skill for Hermes Agent, or remove it."""


@skill.command("install")
@_HOME_OPTION
@_CATEGORY_OPTION
@click.option("--force", is_flag=True, help="Overwrite installed files you changed since the last install.")
def install_cmd(hermes_home: Path | None, category: str, force: bool) -> None:
    """Copy SKILL.md, its references, templates, scripts, checklist and examples into
    HERMES_HOME/skills/CATEGORY/slime-rl/."""
    home = resolve_hermes_home(hermes_home)
    target, count = install(home, category, force=force)
    click.echo(f"Installed {SKILL_NAME} ({count} files) into {target}")
    click.echo(f"Check: HERMES_HOME={home} hermes skills list")


@skill.command("uninstall")
@_HOME_OPTION
@_CATEGORY_OPTION
@click.option("--force", is_flag=True, help="Also remove installed files you changed since installing.")
def uninstall_cmd(hermes_home: Path | None, category: str, force: bool) -> None:
    """Remove exactly the files `slime-check skill install` put there; files you added stay."""
    target, removed, kept = uninstall(resolve_hermes_home(hermes_home), category, force=force)
    click.echo(f"Removed {len(removed)} files of {SKILL_NAME} from {target}")
    for rel in kept:
        click.echo(f"Kept {target / rel}: changed since install (use --force to remove it)", err=True)

