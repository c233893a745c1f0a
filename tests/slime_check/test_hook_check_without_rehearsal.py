"""config's hook import check where slime-rehearse is not installed: slime_check imports nothing of it
(it starts the preflight by module name in another interpreter), so without it the import is a SKIP
saying so, and the layout check, which only reads the files, still runs."""

from __future__ import annotations

from slime_check import hook_check
from slime_check.config_lint import lint_script

BASE = ("python3 train.py --prompt-data /d.jsonl --input-key prompt --rollout-batch-size 4 "
        "--n-samples-per-prompt 2 --global-batch-size 8 ")


def test_without_slime_rehearse_the_import_is_a_skip_saying_so(tmp_path, monkeypatch):
    real = hook_check._package_dir
    monkeypatch.setattr(hook_check, "_package_dir", lambda name: None if name == "slime_rehearse" else real(name))
    (tmp_path / "my_rm.py").write_text("from slime.utils.timer import Timer\n\n"
                                       "def reward(args, sample):\n    return 1\n")
    script = tmp_path / "run.sh"
    script.write_text(BASE + "--custom-rm-path my_rm.reward\n")
    got = [(f.id, f.status.value, f.finding) for r in lint_script(script, target="main@624b824") for f in r.findings
           if f.id in ("config.hook_import", "config.hook_layout")]
    (skip,) = [g for g in got if g[0] == "config.hook_import"]
    assert skip[1] == "SKIP" and "slime_rehearse is not installed" in skip[2], got
    assert [g[1] for g in got if g[0] == "config.hook_layout"] == ["FAIL"], got  # main moved slime.utils.timer


def test_the_preflight_is_found_by_name_without_importing_it():
    assert hook_check.PREFLIGHT_MODULE == "slime_rehearse.smoke_runtime"
    assert hook_check._package_dir("slime_rehearse") is not None
    assert hook_check._package_dir("no_such_package_here") is None
