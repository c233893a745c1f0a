"""config looks at the hook modules a script names: found here, they are layout-checked and imported;
not found, a SKIP that says where it looked (never a PASS)."""

from __future__ import annotations

from pathlib import Path

from slime_check.config_lint import lint_script

BASE = ("python3 train.py --prompt-data /d.jsonl --input-key prompt --rollout-batch-size 4 "
        "--n-samples-per-prompt 2 --global-batch-size 8 ")


def findings(script: Path, target: str, **kw) -> dict[str, list]:
    out: dict[str, list] = {}
    for report in lint_script(script, target=target, **kw):
        for f in report.findings:
            if f.id in ("config.hook_import", "config.hook_layout"):
                out.setdefault(f.id, []).append((f.status.value, f.finding))
    return out


def test_a_module_not_on_this_machine_is_a_skip_naming_where_it_looked(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(BASE + "--custom-rm-path no_such_module.reward.fn\n")
    got = findings(script, "v0.3.1")
    assert [s for s, _ in got["config.hook_import"]] == ["SKIP"]
    assert "no_such_module.reward is not on this machine" in got["config.hook_import"][0][1]
    assert str(tmp_path) in got["config.hook_import"][0][1]


def test_a_hook_beside_the_script_is_imported_and_a_broken_one_fails(tmp_path):
    (tmp_path / "my_rm.py").write_text("from slime.utils.types import Sample\n\n"
                                       "async def reward(args, sample: Sample, **kw):\n    return 1.0\n")
    (tmp_path / "broken_rm.py").write_text("import no_such_dependency\n\ndef reward(args, sample):\n    return 0\n")
    script = tmp_path / "run.sh"
    script.write_text(BASE + "--custom-rm-path my_rm.reward --custom-reward-post-process-path broken_rm.reward\n")
    got = findings(script, "v0.3.1")
    statuses = dict((text.split()[0], status) for status, text in got["config.hook_import"])
    assert statuses == {"--custom-rm-path": "PASS", "--custom-reward-post-process-path": "FAIL"}, got
    assert "no_such_dependency" in next(t for s, t in got["config.hook_import"] if s == "FAIL")


def test_the_hooks_folder_on_the_runtime_env_pythonpath_is_found(tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "rm_a.py").write_text("def reward(args, sample):\n    return 1.0\n")
    script = tmp_path / "run.sh"
    script.write_text(f"export PYTHONPATH={hooks}\n" + BASE + "--custom-rm-path rm_a.reward\n")
    assert [s for s, _ in findings(script, "v0.3.1")["config.hook_import"]] == ["PASS"]


def test_an_import_of_the_other_slimes_layout_is_a_layout_fail(tmp_path):
    (tmp_path / "traced_rm.py").write_text("from slime.utils.trace_utils import trace_span\n\n"
                                           "def reward(args, sample):\n    return 1.0\n")
    script = tmp_path / "run.sh"
    script.write_text(BASE + "--custom-rm-path traced_rm.reward\n")
    main = findings(script, "main@624b824")
    assert [s for s, _ in main["config.hook_layout"]] == ["FAIL"]
    assert "traced_rm.py:1" in main["config.hook_layout"][0][1] and "#2298" in main["config.hook_layout"][0][1]
    assert "config.hook_layout" not in findings(script, "v0.3.1")


def test_a_slime_hook_path_is_checked_by_name_against_the_judged_slime(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(BASE + "--custom-rm-path slime.utils.trace_utils.trace_span\n")
    assert [s for s, _ in findings(script, "main@624b824")["config.hook_layout"]] == ["FAIL"]
    assert findings(script, "v0.3.1") == {}  # slime's own module: nothing to import here, nothing to say


def test_smoke_leaves_the_import_to_its_preflight(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(BASE + "--custom-rm-path no_such_module.reward.fn\n")
    assert findings(script, "v0.3.1", hooks=False) == {}
