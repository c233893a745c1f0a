"""Reading the skill bundle the way a user would run it: its files, links, commands and flags.

Shell (fenced bash blocks and .sh files) is read command by command, so each ``--flag`` is judged
by the program it belongs to: slime's trainer and converter (slime's flag registry), our own
``slime-check``/``slime-ref`` (their ``--help``), or a third-party tool (a short list below).
Prose and Python files can only be judged as "some known flag".
"""

from __future__ import annotations

import posixpath
import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Everything `slime-check skill install` ships, as repository paths.
BUNDLE_GLOBS = ("SKILL.md", "skill/**/*", "checklists/**/*", "examples/**/*")

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9](?![\w-])")
MD_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^[ \t]*```([\w-]*)\n(.*?)^[ \t]*```", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
OUR_PROGRAMS = ("slime-check", "slime-ref")
SHELL_LANGS = {"bash", "sh", "shell", "console"}

# Flags of third-party programs the skill shows, from each tool's own documentation.
TOOL_FLAGS = {
    "docker": {"--rm", "--gpus", "--ipc", "--shm-size", "--ulimit"},
    "ray": {  # ray start / status / stop / job submit
        "--head",
        "--node-ip-address",
        "--num-gpus",
        "--disable-usage-stats",
        "--dashboard-host",
        "--dashboard-port",
        "--address",
        "--runtime-env-json",
        "--force",
    },
    "hf": {"--repo-type", "--local-dir"},
    "pip": {"--no-deps", "--no-build-isolation", "--extra-index-url", "--retries"},
    "git": {"--tags"},
    # slime v0.3.1 tools/convert_torch_dist_to_hf.py
    "convert_torch_dist_to_hf.py": {
        "--input-dir",
        "--output-dir",
        "--origin-hf-dir",
        "--vocab-size",
        "--model-name",
        "--force",
    },
    "slime_log_summary.py": {"--json"},
    "py-spy": {"--pid", "--native"},
    # slime v0.3.1 tools/ (each file's argparse)
    "profile_rollout.py": {"--router-url", "--action", "--num-steps", "--output-dir"},
    "trace_timeline_viewer.py": set(),
    "convert_hf_to_fp8.py": {"--model-dir", "--save-dir", "--strategy", "--block-size", "--max-workers"},
    "convert_hf_to_int4_direct.py": {"--model-dir", "--save-dir"},
}
# Scripts whose flags are slime's own: the trainer, the HF -> Megatron converter (Megatron's parser
# plus --hf-checkpoint), and slime's hook contract tests.
SLIME_SCRIPTS = ("train.py", "train_async.py", "convert_hf_to_torch_dist.py", "_contracts.py")
SHELL_KEYWORDS = {"{", "}", "if", "then", "else", "elif", "fi", "do", "done", "!", "time", "case", "esac", "in"}


@dataclass
class FlagUse:
    flag: str
    context: str  # "slime", "any", a TOOL_FLAGS key, or an our-program command like "slime-check config"
    where: str


@dataclass
class CommandUse:
    command: str  # e.g. "slime-check prereqs"
    flags: list[str] = field(default_factory=list)
    where: str = ""


def bundle_files() -> list[str]:
    found = set()
    for pattern in BUNDLE_GLOBS:
        for path in REPO.glob(pattern):
            if path.is_file() and "__pycache__" not in path.parts and not path.name.startswith("."):
                found.add(path.relative_to(REPO).as_posix())
    return sorted(found)


def markdown_links(text: str) -> list[str]:
    """Link targets outside fenced code blocks."""
    return MD_LINK.findall(FENCE.sub("", text))


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*_]", lambda m: "_" if m.group(0) == "_" else "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", FENCE.sub("", text), re.M)}


def dead_links(root: Path, rel: str) -> list[str]:
    """Relative links of the Markdown file ``root/rel`` whose target (or #anchor) does not exist."""
    text = (root / rel).read_text(encoding="utf-8")
    dead = []
    for target in markdown_links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = root / posixpath.normpath(posixpath.join(posixpath.dirname(rel), path)) if path else root / rel
        if not resolved.exists():
            dead.append(f"{rel}: {target} (no "
                        f"{resolved.relative_to(root) if resolved.is_relative_to(root) else resolved})")
        elif anchor and resolved.is_file() and anchor not in anchors(resolved.read_text(encoding="utf-8")):
            dead.append(f"{rel}: {target} (no heading #{anchor})")
    return dead


# ----------------------------------------------------------------------------- shell


def _strip_comments(script: str) -> str:
    """Drop `# ...` comments (outside quotes), keeping line structure."""
    out, quote = [], None
    for line in script.splitlines():
        kept = []
        i = 0
        while i < len(line):
            ch = line[i]
            if quote:
                if ch == quote:
                    quote = None
                elif ch == "\\" and quote == '"':
                    kept.append(ch)
                    i += 1
                    ch = line[i] if i < len(line) else ""
            elif ch in "\"'":
                quote = ch
            elif ch == "#" and (i == 0 or line[i - 1] in " \t;(") and not line[i - 1 : i + 1] == "$#":
                break
            kept.append(ch)
            i += 1
        out.append("".join(kept))
    return "\n".join(out)


ARRAY = re.compile(r"\b\w+\+?=\((.*?)\)", re.S)


def shell_uses(script: str, where: str) -> tuple[list[FlagUse], list[CommandUse]]:
    """Flags and our-program commands of a shell script or a bash code block."""
    text = _strip_comments(script).replace("\\\n", " ")
    flags: list[FlagUse] = []
    commands: list[CommandUse] = []
    for body in ARRAY.findall(text):  # NAME=( ... ) arrays hold slime launch flags
        flags += [FlagUse(f, "slime", where) for f in FLAG.findall(body)]
    text = ARRAY.sub(" ", text)
    for line in text.splitlines():
        for part in re.split(r"&&|\|\||;|\||\$\(|\)", line):
            try:
                tokens = shlex.split(part)
            except ValueError:
                tokens = part.split()
            _command(tokens, where, flags, commands)
    return flags, commands


def _command(tokens: list[str], where: str, flags: list[FlagUse], commands: list[CommandUse]) -> None:
    while tokens and (tokens[0] in SHELL_KEYWORDS or re.match(r"^\w+=", tokens[0])):
        tokens = tokens[1:]
    if not tokens:
        return
    words = [t.split("=", 1)[0] for t in tokens]
    found = [w for w in words if FLAG.fullmatch(w)]
    program = Path(tokens[0]).name
    if program.startswith("--"):  # a bare flag line inside a code block
        flags += [FlagUse(f, "slime", where) for f in found]
    elif program in OUR_PROGRAMS:
        sub = [t for t in tokens[1:3] if re.fullmatch(r"[a-z][a-z-]*", t)]
        if sub and sub[0] == "skill":
            sub = sub[:2]
        else:
            sub = sub[:1]
        command = " ".join([program, *sub])
        commands.append(CommandUse(command, found, where))
        flags += [FlagUse(f, command, where) for f in found]
    elif program == "ray" and "--" in tokens:
        split = tokens.index("--")
        flags += [FlagUse(f, "ray", where) for f in found if words.index(f) < split]
        _command(tokens[split + 1 :], where, flags, commands)
    elif program in ("python", "python3", "torchrun"):
        script = next((Path(t).name for t in tokens[1:] if t.endswith(".py")), "")
        if script.endswith(SLIME_SCRIPTS):
            flags += [FlagUse(f, "slime", where) for f in found]
        elif script in TOOL_FLAGS:
            flags += [FlagUse(f, script, where) for f in found]
        elif found:
            flags += [FlagUse(f, f"unknown program {' '.join(tokens[:2])}", where) for f in found]
    elif program in TOOL_FLAGS:
        flags += [FlagUse(f, program, where) for f in found]
    elif found:
        flags += [FlagUse(f, f"unknown program {program}", where) for f in found]


def document_uses(rel: str) -> tuple[list[FlagUse], list[CommandUse]]:
    """Flag and command uses of one bundle file."""
    text = (REPO / rel).read_text(encoding="utf-8")
    if rel.endswith(".sh"):
        return shell_uses(text, rel)
    if not rel.endswith(".md"):
        return [FlagUse(f, "any", rel) for f in FLAG.findall(text)], []
    flags: list[FlagUse] = []
    commands: list[CommandUse] = []
    for lang, body in FENCE.findall(text):
        if lang in SHELL_LANGS:
            f, c = shell_uses(textwrap.dedent(body), rel)
            flags += f
            commands += c
        else:
            flags += [FlagUse(x, "any", rel) for x in FLAG.findall(body)]
    prose = FENCE.sub("", text)
    for code in INLINE_CODE.findall(prose):
        words = code.split()
        if words and words[0] in OUR_PROGRAMS:
            f, c = shell_uses(code, rel)
            flags += f
            commands += c
        else:
            flags += [FlagUse(x, "any", rel) for x in FLAG.findall(code)]
    flags += [FlagUse(x, "any", rel) for x in FLAG.findall(INLINE_CODE.sub("", prose))]
    return flags, commands


def all_uses() -> tuple[list[FlagUse], list[CommandUse]]:
    flags: list[FlagUse] = []
    commands: list[CommandUse] = []
    for rel in bundle_files():
        f, c = document_uses(rel)
        flags += f
        commands += c
    return flags, commands
