"""slime-check smoke on jobs in slime's own shape: values computed by commands, runtime envs, every
place a job writes, hooks the rehearsal leaves out, over-sampling and the dynamic filter's budget,
Ray's socket-path limit. Each test reads or shrinks a job; none runs one (seconds)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slime_common.registry import load_registry
from slime_rehearse.smoke_job import (
    NOT_WRITTEN,
    WRITES,
    Job,
    SmokeOptions,
    last,
    leave_out_unimplemented,
    read_job,
    shrink,
    split_flags,
)
from slime_rehearse.smoke_launch import run_env

TESTS = Path(__file__).resolve().parents[1]
JOBS = TESTS / "fixtures" / "smoke_jobs"
REPO = TESTS.parent


def _shrunk(tmp_path, argv: list[str], engine: str = "slime-ref"):
    job = Job("train.py", argv, "test", {})
    opts = SmokeOptions(out=tmp_path / "out", engine=engine)
    return shrink(job, opts, tmp_path / "model", {"prompt": tmp_path / "p.jsonl", "eval": []})


# ---------------------------------------------------------------------------------------------
# values computed by commands (defects A, B, D)


def test_computed_values_the_rehearsal_replaces_need_not_be_known():
    job, _ = read_job([str(JOBS / "run-computed.sh")], None, {"TINY": "/tmp/tiny"})
    items = split_flags(job.argv)
    # printf -v MOE_LAYER_FREQ and --save $(date ...): kept as their text, never read
    assert last(items, "--moe-layer-freq") == ["${MOE_LAYER_FREQ}"]
    assert last(items, "--save")[0].startswith("/ckpt/run-$(date")
    # $(seq ...) for the CUDA-graph batch sizes: a GPU engine setting, left out and said so
    assert last(items, "--sglang-cuda-graph-bs") is None
    note = next(f for f in job.notes if f.id == "smoke.unknown_values")
    assert "--sglang-cuda-graph-bs $(seq 16 8 256)" in note.finding


def test_a_computed_value_the_rehearsal_needs_is_refused_with_the_variable(tmp_path):
    from slime_common.errors import UserError

    script = tmp_path / "run.sh"
    script.write_text("BS=$(python3 -c 'print(32)')\npython3 train.py --prompt-data /d.jsonl "
                      "--rollout-batch-size ${BS} --n-samples-per-prompt 8\n")
    with pytest.raises(UserError, match=r"--rollout-batch-size \$\(python3 -c 'print\(32\)'\) cannot be known") as e:
        read_job([str(script)], None, {})
    # the script assigns BS itself, so --env BS=... would not reach it: the fix is train.py's arguments
    assert "--env BS" not in str(e.value) and "-- --flag value" in str(e.value)


def test_an_unset_variable_the_rehearsal_needs_is_asked_for_with_env(tmp_path):
    from slime_common.errors import UserError

    script = tmp_path / "run.sh"
    script.write_text("python3 train.py --prompt-data /d.jsonl --rollout-batch-size ${BS} --n-samples-per-prompt 8\n")
    with pytest.raises(UserError, match=r"needs it; give --env BS=VALUE$"):
        read_job([str(script)], None, {})
    job, _ = read_job([str(script)], None, {"BS": "4"})
    assert job.argv[job.argv.index("--rollout-batch-size") + 1] == "4"


def test_real_slime_needs_the_moe_values_the_cpu_rehearsal_drops():
    from slime_common.errors import UserError

    with pytest.raises(UserError, match="MOE_LAYER_FREQ"):
        read_job([str(JOBS / "run-computed.sh")], None, {"TINY": "/tmp/tiny"}, engine="slime")


def test_a_runtime_env_keeps_its_known_values_and_names_the_unknown_one():
    job, _ = read_job([str(JOBS / "run-computed.sh")], None, {"TINY": "/tmp/tiny"})
    assert job.env["PYTHONPATH"] == f"/root/Megatron-LM/:{JOBS}"
    assert job.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "NCCL_NVLS_ENABLE" not in job.env
    note = next(f for f in job.notes if f.id == "smoke.runtime_env")
    assert note.status.name == "WARN" and "NCCL_NVLS_ENABLE" in note.finding and "--env" in note.fix


def test_a_directory_is_named_as_a_directory(tmp_path):
    from slime_common.errors import UserError

    with pytest.raises(UserError, match="is a directory"):
        read_job([str(tmp_path)], None, {})


# ---------------------------------------------------------------------------------------------
# every place a job writes goes under --out (defect L)


WRITE_WORDS = re.compile(r"save|dump|-dir$|folder|snapshot|tracker|export|storage|download")


def test_every_flag_that_names_a_place_to_write_is_redirected_or_said_not_to_write():
    reg = load_registry()
    candidates = {name for name in reg.names() if WRITE_WORDS.search(name)
                  and (reg.lookup(name).type or "") in ("str", "int") and not name.startswith("--no-")}
    unclassified = sorted(candidates - set(WRITES) - set(NOT_WRITTEN))
    assert unclassified == [], f"classify these in slime_rehearse/smoke_job.py WRITES or NOT_WRITTEN: {unclassified}"
    assert all(reg.lookup(name) is not None for name in [*WRITES, *NOT_WRITTEN])


def test_the_rehearsal_writes_only_under_out(tmp_path):
    argv = ["--prompt-data", "/d.jsonl", "--save-debug-rollout-data", "/user/dumps/rollout_{rollout_id}.pt",
            "--save-debug-train-data", "/user/dumps/train_{rollout_id}_{rank}.pt", "--tensorboard-dir", "/user/tb",
            "--save", "/user/ckpt", "--save-hf", "/user/hf", "--dump-details", "/user/details",
            "--sglang-crash-dump-folder", "/user/crash"]
    shrunk = _shrunk(tmp_path, argv)
    out = str(tmp_path / "out")
    items = split_flags(shrunk.argv)
    for flag in ("--save-debug-rollout-data", "--save-debug-train-data", "--tensorboard-dir", "--save",
                 "--save-hf", "--dump-details", "--sglang-crash-dump-folder"):
        (value,) = last(items, flag)
        assert value.startswith(out + "/"), (flag, value)
    dump = f"{out}/writes/save-debug-rollout-data/rollout_{{rollout_id}}.pt"
    assert last(items, "--save-debug-rollout-data") == [dump]
    assert not any(w.startswith("/user") for w in shrunk.argv)


# ---------------------------------------------------------------------------------------------
# a hook the rehearsal leaves out is reported once, as left out (defect K)


def test_a_left_out_hook_is_named_once_and_not_counted_as_never_called(tmp_path):
    shrunk = _shrunk(tmp_path, ["--prompt-data", "/d.jsonl", "--custom-tis-function-path", "my_tis.fn",
                                "--custom-rm-path", "my_rm.fn"])
    assert {flag for flag, _ in shrunk.hooks.values()} == {"--custom-tis-function-path", "--custom-rm-path"}
    finding = leave_out_unimplemented(shrunk)
    assert [flag for flag, _ in shrunk.hooks.values()] == ["--custom-rm-path"]
    assert "--custom-tis-function-path my_tis.fn" in finding.finding and "--with slime" in finding.fix
    assert "--custom-tis-function-path" not in shrunk.argv


# ---------------------------------------------------------------------------------------------
# over-sampling and the dynamic filter (defect M)


def test_over_sampling_keeps_the_jobs_ratio_and_the_filter_gets_a_budget(tmp_path):
    argv = ["--prompt-data", "/d.jsonl", "--rollout-batch-size", "32", "--n-samples-per-prompt", "8",
            "--over-sampling-batch-size", "48",
            "--dynamic-sampling-filter-path",
            "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"]
    items = split_flags(_shrunk(tmp_path, argv).argv)
    assert last(items, "--rollout-batch-size") == ["2"]
    assert last(items, "--over-sampling-batch-size") == ["3"]  # 48/32 of the rehearsal's 2, rounded up
    assert last(items, "--dynamic-sampling-max-groups") == ["12"]
    # real slime has no such flag
    assert last(split_flags(_shrunk(tmp_path, argv, engine="slime").argv), "--dynamic-sampling-max-groups") is None


def test_no_filter_no_budget(tmp_path):
    items = split_flags(_shrunk(tmp_path, ["--prompt-data", "/d.jsonl", "--over-sampling-batch-size", "64"]).argv)
    assert last(items, "--dynamic-sampling-max-groups") is None


# ---------------------------------------------------------------------------------------------
# Ray's sockets fit the Unix path limit whatever --out is (defect C)


@pytest.mark.parametrize("ray_dir_len", [42, 47])
def test_ray_starts_under_any_out_path(ray_dir_len):
    from slime_rehearse.smoke_launch import remove_ray_temp_dir

    base = Path("/tmp") / f"sr{os.getpid()}"
    # an --out whose OUT/ray has 40-47 characters: Ray's socket paths under it would pass 107 bytes
    out = base / ("o" * (ray_dir_len - len(str(base)) - len("/") - len("/ray")))
    assert len(str(out / "ray")) == ray_dir_len
    try:
        env = run_env(SmokeOptions(out=out), Job("train.py", [], "t", {}), None, False)
        code = ("import ray; ray.init(address='local', include_dashboard=False, num_cpus=1, "
                "_node_ip_address='127.0.0.1'); print('UP', ray.is_initialized()); ray.shutdown()")
        done = subprocess.run([sys.executable, "-c", code], env={**env, "RAY_USAGE_STATS_ENABLED": "0"},
                              capture_output=True, text=True, timeout=180)
        assert "UP True" in done.stdout, (env["RAY_TMPDIR"], done.stderr[-2000:])
        remove_ray_temp_dir(env, out)
        assert env["RAY_TMPDIR"].startswith(str(out)) or not os.path.exists(env["RAY_TMPDIR"])
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# an --eval-config job rehearses its eval


def test_an_eval_config_is_rehearsed_as_its_datasets_first_rows(tmp_path):
    from slime_rehearse.smoke_assets import write_data

    rows = [{"prompt": f"{i}+1=", "label": str(i + 1)} for i in range(5)]
    for name in ("train", "aime", "gpqa"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval.yaml").write_text(
        "eval:\n  defaults:\n    n_samples_per_eval_prompt: 4\n  datasets:\n"
        f"    - name: aime\n      path: {tmp_path / 'aime.jsonl'}\n"
        f"    - name: gpqa\n      path: {tmp_path / 'gpqa.jsonl'}\n      rm_type: gpqa\n")
    argv = ["--prompt-data", str(tmp_path / "train.jsonl"), "--eval-config", str(tmp_path / "eval.yaml"),
            "--eval-interval", "5"]
    out = tmp_path / "out"
    data, findings = write_data(split_flags(argv), out)
    assert [name for name, _ in data["eval"]] == ["aime", "gpqa"]
    assert len((out / "data" / "eval-aime.jsonl").read_text().splitlines()) == 2
    assert any(f.id == "smoke.eval_config" and f.status.name == "PASS" for f in findings)
    shrunk = shrink(Job("train.py", argv, "t", {}), SmokeOptions(out=out), tmp_path / "model", data)
    items = split_flags(shrunk.argv)
    assert last(items, "--eval-config") is None
    assert last(items, "--eval-prompt-data") == ["aime", str(out / "data" / "eval-aime.jsonl"),
                                                 "gpqa", str(out / "data" / "eval-gpqa.jsonl")]
