"""Ask Hermes Agent's own code what it makes of an installed skill; print the answers as JSON.

Runs inside the virtual environment that holds hermes-agent (its modules are top-level there:
``tools``, ``agent``). HERMES_HOME must point at the Hermes home the skill was installed into.

usage: HERMES_HOME=... python probe_skill.py SKILL_NAME SKILL_DIR
"""

import hashlib
import json
import sys
from pathlib import Path

from agent.prompt_builder import build_skills_system_prompt
from tools.skill_manager_tool import _validate_frontmatter
from tools.skills_guard import MAX_FILE_COUNT, MAX_SINGLE_FILE_KB, MAX_TOTAL_SIZE_KB, scan_skill, should_allow_install
from tools.skills_tool import skill_view, skills_list

name, skill_dir = sys.argv[1], Path(sys.argv[2])

view = json.loads(skill_view(name))
linked = [path for group in (view.get("linked_files") or {}).values() for path in group]
reads = {}
for path in linked:
    result = json.loads(skill_view(name, file_path=path))
    content = result.get("content") or ""
    reads[path] = {
        "success": result.get("success"),
        "sha256": hashlib.sha256(content.encode("utf-8")).hexdigest(),
        "error": result.get("error"),
    }

scan = scan_skill(skill_dir, source="community")
allowed, reason = should_allow_install(scan)
files = [p for p in skill_dir.rglob("*") if p.is_file()]

print(
    json.dumps(
        {
            "listed": json.loads(skills_list())["skills"],
            "view": {
                key: view.get(key)
                for key in (
                    "success",
                    "name",
                    "description",
                    "tags",
                    "related_skills",
                    "linked_files",
                    "readiness_status",
                    "error",
                )
            },
            "view_content": view.get("content", ""),
            "reads": reads,
            "prompt_index": build_skills_system_prompt(),
            "strict_frontmatter_error": _validate_frontmatter((skill_dir / "SKILL.md").read_text(encoding="utf-8")),
            "scan": {
                "verdict": scan.verdict,
                "findings": [f"{f.severity} {f.pattern_id} {f.file}:{f.line}" for f in scan.findings],
                "allowed": allowed,
                "reason": reason,
            },
            "limits": {
                "max_files": MAX_FILE_COUNT,
                "max_total_kb": MAX_TOTAL_SIZE_KB,
                "max_file_kb": MAX_SINGLE_FILE_KB,
            },
            "size": {
                "files": len(files),
                "total_bytes": sum(p.stat().st_size for p in files),
                "largest_bytes": max(p.stat().st_size for p in files),
            },
        }
    )
)
