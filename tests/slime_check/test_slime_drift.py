"""Behaviours that differ between slime v0.3.1 and main@624b824 (slime_check.drift): each row fires on a
job that relies on it, with the status of the slime judged, and stays quiet otherwise; config and
smoke name the slime they judged; main-only flags are flags of main, not of v0.3.1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slime_check.config_lint import lint_argv
from slime_check.drift import DRIFTS, MAIN, V031
from slime_check.findings import Status
from slime_check.launch_script import Origin, Word
from slime_rehearse.smoke_job import Job
from slime_rehearse.smoke_verdict import drift_rehearsal

MAIN_SOURCES = Path(__file__).parents[1] / "fixtures" / "slime_sources" / "main-624b824"  # slime 624b824's files
BASE = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "8", "--num-rollout", "1",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2", "--colocate"]
MAIN_ONLY = ["--freeze-indexer", "--ci-train-rollout-logprob-abs-diff-threshold", "0.1"]  # slime #2262 and later


def words(*args: str) -> list[Word]:
    return [Word([a], Origin("argv", i + 1)) for i, a in enumerate(args)]


def eval_yaml(tmp: Path, defaults: dict | None = None, **dataset) -> list[str]:
    path = tmp / f"eval{len(list(tmp.glob('eval*.yaml')))}.yaml"  # a case writes two: one file each
    body = {"eval": {"datasets": [{"name": "aime", "path": str(tmp / "aime.jsonl"), **dataset}],
                     **({"defaults": defaults} if defaults else {})}}
    path.write_text(json.dumps(body))  # JSON is YAML
    return ["--eval-config", str(path)]


def load_dirs(tmp: Path) -> tuple[str, str]:
    hf, megatron = tmp / "hf", tmp / "megatron"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    megatron.mkdir()
    (megatron / "latest_checkpointed_iteration.txt").write_text("10")
    return str(hf), str(megatron)


# row id -> (tmp_path -> (argv that relies on the row, argv that does not))
CASES = {
    "rollout_temperature": lambda t: (["--rollout-temperature", "0"], ["--rollout-temperature", "0.7"]),
    "eps_clip_c": lambda t: (["--eps-clip-c", "3"], ["--eps-clip-c", "3", "--advantage-estimator", "cispo"]),
    "start_rollout_id": lambda t: (lambda hf, meg: (["--start-rollout-id", "5", "--load", hf],
                                                    ["--start-rollout-id", "5", "--load", meg]))(*load_dirs(t)),
    "eval_defaults_unknown": lambda t: (eval_yaml(t, {"temprature": 0.5}), eval_yaml(t, {"temperature": 0.5})),
    "eval_defaults_fields": lambda t: (eval_yaml(t, {"rm_type": "math"}), eval_yaml(t, {"temperature": 0.5})),
    "eval_stop": lambda t: (eval_yaml(t, stop=["</answer>"]), eval_yaml(t, top_p=0.9)),
    "debug_train_layout": lambda t: (["--dump-details", str(t / "dump")], ["--save-debug-rollout-data", "/r.pt"]),
    "debug_same_path": lambda t: (["--save-debug-train-data", "/d/{rollout_id}.pt", "--save-debug-rollout-data",
                                   "/d/{rollout_id}.pt"],
                                  ["--save-debug-train-data", "/d/t{rollout_id}.pt", "--save-debug-rollout-data",
                                   "/d/{rollout_id}.pt"]),
    "partial_continuation": lambda t: (["--partial-rollout"],
                                       ["--partial-rollout", "--custom-generate-function-path", "my.generate"]),
    "eval_only": lambda t: (["--num-rollout", "0"], ["--num-rollout", "3"]),
    "negative_slice": lambda t: (["--prompt-data", "/d/train.jsonl@[-100:]"],
                                 ["--prompt-data", "/d/train.jsonl@[0:100]"]),
    "opd_teacher_temperature": lambda t: (
        ["--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func", "--rollout-temperature", "0.6"],
        ["--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func", "--rollout-temperature", "1"]),
    "whiten_cp": lambda t: (["--normalize-advantages", "--context-parallel-size", "2"],
                            ["--normalize-advantages", "--context-parallel-size", "1"]),
    "log_correct_samples": lambda t: (["--log-correct-samples"], []),
}


def test_every_row_has_a_case_and_names_its_pr():
    ids = [row.id for row in DRIFTS]
    assert len(ids) == len(set(ids)) and set(CASES) == set(ids)
    for row in DRIFTS:
        assert row.pr > 2000 and row.link.endswith(str(row.pr)) and row.status
        assert set(row.status) <= {V031, MAIN}
        for target, status in row.status.items():
            assert status is Status.PASS or row.fix.get(target), (row.id, target)  # a WARN or FAIL says what to do


@pytest.mark.parametrize("row", DRIFTS, ids=lambda r: r.id)
@pytest.mark.parametrize("target", [V031, MAIN])
def test_row_fires_when_relied_on_and_stays_quiet_otherwise(row, target, tmp_path):
    relies, quiet = CASES[row.id](tmp_path)
    fired = [f for f in lint_argv(words(*BASE, *relies), target=target) if f.id == f"drift.{row.id}"]
    if target in row.status:
        assert len(fired) == 1, fired
        assert fired[0].status is row.status[target]
        text = fired[0].finding
        assert f"on slime {target} {row.does(target)}" in text and V031 in text and MAIN in text
        assert f"#{row.pr}" in text
    else:
        assert fired == []
    assert [f for f in lint_argv(words(*BASE, *quiet), target=target) if f.id == f"drift.{row.id}"] == []


def test_the_issues_examples():
    def row(argv, target, id_):
        (f,) = [f for f in lint_argv(words(*BASE, *argv), target=target) if f.id == id_]
        return f

    hot = row(["--rollout-temperature", "0"], MAIN, "drift.rollout_temperature")
    assert hot.status is Status.FAIL and "must be > 0" in hot.finding
    clip = row(["--eps-clip-c", "3"], V031, "drift.eps_clip_c")
    assert clip.status is Status.WARN and "no effect" in clip.finding
    start = row(["--start-rollout-id", "7"], V031, "drift.start_rollout_id")
    assert start.status is Status.WARN and "resets the start rollout id to 0" in start.finding
    assert "keeps the start rollout id you set" in start.finding  # what main does, in the same row


def test_eval_defaults_main_reads_otherwise(tmp_path):
    argv = words(*BASE, *eval_yaml(tmp_path, {"rm_type": "math"}))
    ignored = [f for f in lint_argv(argv, target=V031) if f.id == "config.eval_config" and "ignored" in f.finding]
    assert ignored and ignored[0].status is Status.WARN
    on_main = lint_argv(argv, target=MAIN)
    assert not [f for f in on_main if f.id == "config.eval_config" and "ignored" in f.finding]
    assert [f.status for f in on_main if f.id == "drift.eval_defaults_fields"] == [Status.PASS]


def test_smoke_on_slime_ref_warns_for_main_behaviours_it_cannot_show():
    job = Job("train.py", [*BASE, "--eps-clip-c", "3", "--num-rollout", "0"], "/jobs/run.sh", {})
    warns = drift_rehearsal(job, MAIN)
    assert {f.status for f in warns} == {Status.WARN} and len(warns) == 2
    clip = next(f for f in warns if "dual-clip PPO" in f.finding)
    assert "slime-ref rehearses slime v0.3.1" in clip.finding and MAIN in clip.finding and "run.sh" in clip.finding
    assert drift_rehearsal(job, V031) == []
    assert drift_rehearsal(Job("train.py", BASE, "/jobs/run.sh", {}), MAIN) == []


# ---------------------------------------------------------------------------------------------
# the CLI: the slime judged heads the report, main-only flags


def run(*args):
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("SLIME_IMAGE", None)
    return subprocess.run(["slime-check", *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


def main_script(tmp_path: Path) -> Path:
    script = tmp_path / "run-main.sh"
    script.write_text("#!/bin/bash\npython3 train.py \\\n   " + " \\\n   ".join(BASE + MAIN_ONLY) + "\n")
    return script


def unknown(report: dict) -> list[dict]:
    return [f for r in report["reports"] for f in r["findings"] if f["id"] == "config.unknown_flag"]


def test_config_main_script_judged_as_main(tmp_path):
    script = main_script(tmp_path)
    r = run("config", "--slime-version", "main", script, "--json")
    report = json.loads(r.stdout)
    assert report["slime"]["target"] == MAIN
    assert [f["status"] for f in unknown(report)] == ["PASS"] and MAIN in unknown(report)[0]["finding"]
    shown = run("config", "--slime-version", "main", script)
    assert shown.stdout.splitlines()[0].startswith(f"slime: slime {MAIN}")


def test_config_main_script_judged_as_v031_fails_naming_v031(tmp_path):
    r = run("config", "--slime-version", "v0.3.1", main_script(tmp_path), "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    fails = [f for f in unknown(report) if f["status"] == "FAIL"]
    assert len(fails) == 2 and report["slime"]["target"] == V031
    assert "--freeze-indexer" in fails[0]["finding"] and "is not a flag of slime v0.3.1" in fails[0]["finding"]
    assert f"It is a flag of slime {MAIN}" in fails[0]["finding"]


def test_config_with_a_main_tree_as_slime_dir(tmp_path):
    tree = tmp_path / "slime-main"
    shutil.copytree(MAIN_SOURCES / "slime", tree / "slime")
    (tree / "slime" / "observability").mkdir()  # slime #2298's folder: main's layout
    r = run("config", "--slime-dir", tree, main_script(tmp_path), "--json")
    report = json.loads(r.stdout)
    assert report["slime"]["target"] == MAIN and report["slime"]["decided_by"] == "slime-dir"
    assert [f["status"] for f in unknown(report)] == ["PASS"]
    flags = next(f for f in report["reports"][0]["findings"] if f["id"] == "slime.flags")
    assert str(tree) in flags["finding"]  # slime's own flags read from the tree
    assert run("config", "--slime-dir", tree, main_script(tmp_path)).stdout.startswith(f"slime: slime {MAIN}")


def test_config_without_a_slime_judges_the_newest_and_says_so(tmp_path):
    r = run("config", main_script(tmp_path), "--json")
    report = json.loads(r.stdout)
    if report["slime"]["sources"]:  # this interpreter can import a slime: it decides
        pytest.skip("a slime package is importable here")
    assert report["slime"]["target"] == MAIN and not report["slime"]["identified"]
    head = report["reports"][0]["findings"][0]
    assert head["id"] == "slime.version" and head["status"] == "WARN" and "Nothing identifies" in head["finding"]


SMOKE_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "smoke"


@pytest.mark.slow
def test_smoke_for_main_on_slime_ref_names_the_drift_and_rehearses_the_rest():
    """A job for slime main with dual clip (#2247) and a main-only flag: slime-ref (v0.3.1's behaviour)
    warns about the dual clip, leaves the main-only flag out, and runs the rest to its rewards."""
    import sys
    import tempfile

    from slime_ref.assets import make_tiny

    root = Path(tempfile.mkdtemp(prefix="smd-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    try:
        tiny = make_tiny(root / "tiny")
        script = root / "run.sh"
        script.write_text((SMOKE_FIXTURES / "run-hooks.sh").read_text()
                          .replace('SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"',
                                   f'SCRIPT_DIR="{SMOKE_FIXTURES}"')
                          .replace("   --rollout-temperature 1.0\n",
                                   "   --rollout-temperature 1.0\n   --eps-clip-c 3\n   --freeze-indexer\n"))
        env = {**os.environ, "COLUMNS": "200"}
        env.pop("SLIME_IMAGE", None)
        done = subprocess.run([sys.executable, "-c", "from slime_rehearse.cli import main; main()", "smoke",
                               str(script),
                               "--slime-version", "main", "--out", str(root / "out"), "--json",
                               "--env", f"TINY={tiny.root}", "--env", f"SAVE_DIR={root / 'ckpt'}"],
                              capture_output=True, text=True, timeout=900, env=env)
        assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
        report = json.loads(done.stdout)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert report["slime"]["target"] == MAIN
    by_id = {}
    for f in report["findings"]:
        by_id.setdefault(f["id"], []).append(f)
    (drift,) = by_id["smoke.drift"]
    assert drift["status"] == "WARN" and "dual-clip PPO" in drift["finding"] and "#2247" in drift["finding"]
    assert any("--freeze-indexer" in f["finding"] for f in by_id["smoke.not_rehearsed"])
    assert "config.unknown_flag" in by_id and all(f["status"] == "PASS" for f in by_id["config.unknown_flag"])
    if any("Ray did not start" in f["finding"] for f in by_id.get("smoke.log.ray_start", [])):
        pytest.skip("Ray did not start on this overloaded machine")
    assert "stopped" not in report["run"] and report["run"]["rewards"], by_id.get("smoke.run")
