"""What every check reports, and how a list of findings is printed.

A finding has an id (``gpu.compute_capability``), a status, a one-line finding, the fix and a
link to the slime doc that explains it. ``prereqs`` and ``config`` print the same objects, as a
rich table or as JSON, and exit 1 when one of them FAILs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import Enum

SLIME_TAG = "v0.3.1"
SLIME_BLOB = f"https://github.com/THUDM/slime/blob/{SLIME_TAG}"


def slime_doc(path: str, anchor: str = "") -> str:
    """A link into slime's repository at the pinned tag (``path`` relative to its root)."""
    return f"{SLIME_BLOB}/{path}" + (f"#{anchor}" if anchor else "")


# Pages findings link to most.
QUICK_START = "docs/en/get_started/quick_start.md"
FAQ = "docs/en/get_started/qa.md"
USAGE = "docs/en/get_started/usage.md"
CUSTOMIZATION = "docs/en/get_started/customization.md"
DOCKERFILE = "docker/Dockerfile"


class Status(str, Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


STYLE = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.SKIP: "dim"}


@dataclass
class Finding:
    id: str
    status: Status
    finding: str
    fix: str = ""
    doc: str = ""

    @property
    def group(self) -> str:
        return self.id.split(".", 1)[0]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        return d


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.status is Status.FAIL for f in findings) else 0


def counts(findings: list[Finding]) -> dict[str, int]:
    return {s.value: sum(1 for f in findings if f.status is s) for s in Status}


def to_json(findings: list[Finding], **extra) -> str:
    return json.dumps({**extra, "summary": counts(findings), "findings": [f.to_dict() for f in findings]}, indent=2)


def render(findings: list[Finding], title: str, console=None) -> None:
    """Print a rich table: one row per finding, the fix and doc link under it."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    table = Table(title=title, show_lines=False, expand=False, title_justify="left")
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("finding / fix")
    for f in findings:
        body = Text(f.finding)
        if f.fix and f.status is not Status.PASS:
            body.append("\nfix: ", style="bold").append(f.fix)
        if f.doc and f.status in (Status.WARN, Status.FAIL):
            body.append("\ndoc: ", style="bold").append(f.doc, style="blue")
        table.add_row(Text(f.status.value, style=STYLE[f.status]), f.id, body)
    console.print(table)
    summary = counts(findings)
    console.print(" ".join(f"{k} {v}" for k, v in summary.items()))
