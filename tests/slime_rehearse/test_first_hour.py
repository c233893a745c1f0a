"""What a newcomer meets in the first hour (issue 44): the quick start's outputs and follow-up
commands, and bad input to ``slime-ref train`` caught before Ray starts, each in one line."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    previous = os.umask(0o022)
    os.umask(previous)
    yield set_mask
    os.umask(previous)


# ---------------------------------------------------------------------------------------------
# item 10: files and directories written atomically get the umask's usual mode, not mkstemp's 0600


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775),
                                                       (0o077, 0o600, 0o700)])
def test_atomic_writes_take_the_umask_mode(tmp_path, umask, mask, file_mode, dir_mode):
    from slime_common.fileio import atomic_directory, atomic_write_json

    umask(mask)
    atomic_write_json(tmp_path / "summary.json", {"a": 1})
    with atomic_directory(tmp_path / "hf") as scratch:
        (scratch / "config.json").write_text("{}")
    assert stat.S_IMODE((tmp_path / "summary.json").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "hf").stat().st_mode) == dir_mode


def test_a_plot_is_readable_by_the_group_and_others(tmp_path, umask):
    import json

    from slime_ref.plot import plot_run

    umask(0o022)
    rows = [{"rollout_id": i, "rollout/raw_reward": i / 10, "train/kl_loss": 0.0} for i in range(3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_run(tmp_path, tmp_path / "reward.png")
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


# ---------------------------------------------------------------------------------------------
# item 11: `slime-ref train` with no flags is a usage error, not 629 lines of help


@pytest.mark.parametrize("command", ["train", "train-async"])
def test_train_without_flags_gives_the_usage_and_the_required_flags(command):
    result = subprocess.run([sys.executable, "-m", "slime_ref.cli", command], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"usage: slime-ref {command} --hf-checkpoint DIR --prompt-data FILE")
    assert len(lines) < 12
    for flag in ("--hf-checkpoint", "--prompt-data", "--rollout-batch-size", "--num-rollout", "--global-batch-size"):
        assert any(line.lstrip().startswith(flag) for line in lines[2:]), flag
    assert f"slime-ref {command} --help" in result.stderr


# ---------------------------------------------------------------------------------------------
# items 14 and 15: bad input to slime-ref train is one line naming the flag and the file, before Ray


def _train_flags(tiny, out, *extra):
    return ["--hf-checkpoint", str(tiny.model_dir), "--prompt-data", str(tiny.train_path),
            "--input-key", "prompt", "--label-key", "label", "--apply-chat-template", "--rm-type", "math",
            "--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
            "--global-batch-size", "4", "--rollout-max-response-len", "4", "--actor-num-gpus-per-node", "1",
            "--colocate", "--output-dir", str(out), *extra]


def _bad_prompt_files(tiny, tmp_path):
    """(name, flags, what the one line must hold): each a prompt file a run must refuse."""
    good = tiny.train_path.read_text().splitlines()
    cases = []

    def write(name, text):
        path = tmp_path / name
        path.write_text(text)
        return path

    bad_json = write("bad_json.jsonl", "\n".join([good[0], good[1], '{"prompt": [1, 2', *good[2:]]) + "\n")
    cases.append(("malformed line", ["--prompt-data", str(bad_json)],
                  [f"--prompt-data {bad_json}:3:", "not valid JSON"]))
    no_key = write("no_key.jsonl", "\n".join([good[0], '{"question": "1+1=", "label": "2"}', *good[2:]]) + "\n")
    cases.append(("row without --input-key", ["--prompt-data", str(no_key)],
                  [f"--prompt-data {no_key}:2:", "'prompt'", "--input-key", "question"]))
    no_label = write("no_label.jsonl", "\n".join([*good[:40], '{"prompt": "1+1="}', *good[40:]]) + "\n")
    cases.append(("row without --label-key", ["--prompt-data", str(no_label)],
                  [f"--prompt-data {no_label}:41:", "'label'", "--label-key"]))
    empty = write("empty.jsonl", "")
    cases.append(("empty file", ["--prompt-data", str(empty)], [f"--prompt-data {empty}:", "no prompts", "empty"]))
    blank = write("blank.jsonl", "\n\n  \n")
    cases.append(("blank lines only", ["--prompt-data", str(blank)], [f"--prompt-data {blank}:", "blank lines"]))
    array = write("array.jsonl", "[1, 2]\n")
    cases.append(("a line that is not an object", ["--prompt-data", str(array)],
                  [f"--prompt-data {array}:1:", "JSON list", "object"]))
    cases.append(("an empty row slice", ["--prompt-data", f"{tiny.train_path}@[500:600]"],
                  [f"--prompt-data {tiny.train_path}@[500:600]:", "row slice"]))
    eval_bad = write("eval_bad.jsonl", "\n".join([*good[:5], "not json at all", *good[5:]]) + "\n")
    cases.append(("malformed eval line", ["--eval-prompt-data", "arith", str(tiny.eval_path), "held", str(eval_bad),
                                          "--eval-interval", "1"],
                  [f"--eval-prompt-data held {eval_bad}:6:", "not valid JSON"]))
    return cases


@pytest.fixture
def no_ray(monkeypatch):
    """Starting Ray fails the test: what must be found before Ray is found before it."""
    import slime_ref.ray.placement as placement

    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started before the bad input was found")

    monkeypatch.setattr(placement, "init_ray", refuse)


def _run_until_setup(args):
    from slime_ref.run import Run

    with Run(args):
        pass


def test_every_bad_prompt_file_is_found_before_ray_starts(tiny, tmp_path, no_ray):
    from slime_ref.arguments import parse_args
    from slime_ref.errors import UserError

    for name, flags, expected in _bad_prompt_files(tiny, tmp_path):
        args = parse_args(_train_flags(tiny, tmp_path / "run", *flags))
        with pytest.raises(UserError) as caught:
            _run_until_setup(args)
        message = str(caught.value)
        assert "\n" not in message, name
        for part in expected:
            assert part in message, (name, part, message)
        assert "None" not in message, (name, message)


def test_the_prompt_check_passes_good_files_and_counts_their_rows(tiny, tmp_path):
    from slime_ref.data.check import check_prompt_file

    keys = {"prompt": "--input-key", "label": "--label-key"}
    assert check_prompt_file(str(tiny.train_path), "--prompt-data", keys) == 80
    assert check_prompt_file(f"{tiny.train_path}@[10:15]", "--prompt-data", keys) == 5
    # rows outside a slice are not the run's: a row lacking the label after the slice is not a fault
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(tiny.train_path.read_text() + '{"prompt": "x"}\n' + '\n{"prompt": "y", "label": NaN}\n')
    assert check_prompt_file(f"{mixed}@[0:80]", "--prompt-data", keys) == 80
    assert check_prompt_file(str(mixed), "--prompt-data", {"prompt": "--input-key"}) == 82  # json takes NaN
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["1+1="], "label": ["2"]}), tmp_path / "p.parquet")
    assert check_prompt_file(str(tmp_path / "p.parquet"), "--prompt-data", keys) == 1
    from slime_ref.errors import UserError

    with pytest.raises(UserError, match=r"--label-key 'label': row 1 of .*q.parquet has no such key \(the --prompt"):
        pq.write_table(pa.table({"prompt": ["1+1="]}), tmp_path / "q.parquet")
        check_prompt_file(str(tmp_path / "q.parquet"), "--prompt-data", keys)
    (tmp_path / "notparquet.parquet").write_bytes(b"\x00\x01binary")
    with pytest.raises(UserError, match="not a readable parquet file"):
        check_prompt_file(str(tmp_path / "notparquet.parquet"), "--prompt-data", keys)


def test_the_prompt_check_streams_a_large_file_in_bounded_memory(tmp_path, monkeypatch):
    import time
    import tracemalloc

    from slime_ref.data import check

    monkeypatch.setattr(check, "BLOCK", 1 << 20)
    row = '{"prompt": [{"role": "user", "content": "' + "x " * 200 + '"}], "label": "1"}\n'
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        for _ in range(60_000):  # ~26 MB
            f.write(row)
    tracemalloc.start()
    start = time.perf_counter()
    rows = check.check_prompt_file(str(path), "--prompt-data", {"prompt": "--input-key", "label": "--label-key"})
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert rows == 60_000
    assert peak < 8 * (1 << 20), f"peak {peak / 2**20:.1f} MiB for a {path.stat().st_size / 2**20:.0f} MiB file"
    print(f"checked {path.stat().st_size / 1e6:.0f} MB in {seconds:.2f} s")


def test_a_large_file_is_checked_in_parts_with_the_right_line_numbers(tmp_path, monkeypatch):
    from slime_ref.data import check
    from slime_ref.errors import UserError

    monkeypatch.setattr(check, "PARALLEL_FROM", 1 << 20)
    monkeypatch.setattr(check.os, "cpu_count", lambda: 4)

    def serially(*args, **kwargs):
        raise AssertionError("the file was read in this process, not in parts")

    monkeypatch.setattr(check, "_scan", serially)  # the parts' own processes do not see this
    row = '{"prompt": "' + "y" * 100 + '", "label": "1"}\n'
    lines = [row] * 30_000  # ~3.5 MB: four parts
    lines[10] = "\n"
    lines[25_000] = '{"prompt": "broken\n'
    path = tmp_path / "big.jsonl"
    path.write_text("".join(lines))
    assert len(check._line_aligned_bounds(str(path), path.stat().st_size, 4)) == 5
    with pytest.raises(UserError, match=rf"--prompt-data {path}:25001: not valid JSON"):
        check.check_prompt_file(str(path), "--prompt-data", {"prompt": "--input-key"})
    lines[25_000] = row
    path.write_text("".join(lines))
    assert check.check_prompt_file(str(path), "--prompt-data", {"prompt": "--input-key"}) == 29_999


def test_unwritable_outputs_are_found_before_ray_starts(tiny, tmp_path, no_ray):
    from slime_ref.arguments import parse_args
    from slime_ref.errors import UserError

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = [
        (["--save", str(a_file / "ckpt")], [f"--save {a_file / 'ckpt'}: {a_file} is a file"]),
        (["--save", str(a_file)], [f"--save {a_file}: {a_file} is a file"]),
        (["--save", str(tmp_path / "ok"), "--save-hf", str(a_file / "hf")], [f"--save-hf {a_file / 'hf'}: ",
                                                                               "is a file"]),
        (["--save", str(tmp_path / "ok"), "--save-hf", str(tmp_path / "hf-{step}")], ["--save-hf", "{rollout_id}"]),
        (["--save-debug-rollout-data", str(a_file / "r{rollout_id}.pt")], ["--save-debug-rollout-data", "a_file"]),
    ]
    for flags, expected in cases:
        args = parse_args(_train_flags(tiny, tmp_path / "run", *flags))
        with pytest.raises(UserError) as caught:
            _run_until_setup(args)
        for part in expected:
            assert part in str(caught.value), (flags, part, str(caught.value))
    args = parse_args(_train_flags(tiny, a_file / "run"))
    with pytest.raises(UserError, match="--output-dir"):
        _run_until_setup(args)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_save_directory_is_found_before_ray_starts(tiny, tmp_path, no_ray):
    from slime_ref.arguments import parse_args
    from slime_ref.errors import UserError

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        args = parse_args(_train_flags(tiny, tmp_path / "run", "--save", str(locked / "ckpt")))
        with pytest.raises(UserError, match=r"--save .*cannot write there \(Permission denied"):
            _run_until_setup(args)
    finally:
        locked.chmod(0o700)


def test_the_write_probe_leaves_nothing_behind(tmp_path):
    from slime_ref.preflight import check_writable

    check_writable(tmp_path / "a" / "b" / "c", "--save")
    assert list(tmp_path.iterdir()) == []
    check_writable(tmp_path / "out", "--output-dir", keep=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("case", ["malformed line", "row without --input-key", "empty file"])
def test_slime_ref_train_reports_a_bad_prompt_file_in_one_line_with_exit_2(tiny, tmp_path, case):
    import time

    name, flags, expected = next(c for c in _bad_prompt_files(tiny, tmp_path) if c[0] == case)
    start = time.perf_counter()
    result = subprocess.run(["slime-ref", "train", *_train_flags(tiny, tmp_path / "run", *flags)],
                            capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("slime-ref: error: "), result.stderr[-3000:]
    for part in expected:
        assert part in lines[0]
    assert "Traceback" not in result.stderr and "Token authentication" not in result.stderr
    print(f"{case}: exit 2 after {seconds:.1f} s")


# ---------------------------------------------------------------------------------------------
# item 8: a run that starts its own Ray does not print Ray's token-authentication notice


def test_rays_token_auth_notice_is_left_out_while_a_run_starts_its_own_ray():
    import io
    import logging

    from ray._private.authentication import authentication_token_setup as ray_auth

    from slime_ref.ray.placement import _TOKEN_AUTH_LOGGER, _quiet_token_auth_notice

    assert ray_auth.logger.name == _TOKEN_AUTH_LOGGER
    shown = io.StringIO()
    handler = logging.StreamHandler(shown)  # where Ray's own handler would print it
    ray_auth.logger.addHandler(handler)
    try:
        with _quiet_token_auth_notice():
            ray_auth._warn_token_auth_enabled()  # what ray.init() logs when it starts a local cluster
            ray_auth._warn_token_auth_disabled()  # any other message of Ray's still shows
        assert "Token authentication is enabled" not in shown.getvalue()
        assert "Token authentication is disabled" in shown.getvalue()
        ray_auth._warn_token_auth_enabled()  # outside a run's own start-up, Ray's logger is left alone
        assert "Token authentication is enabled for this Ray cluster" in shown.getvalue()
    finally:
        ray_auth.logger.removeHandler(handler)


def test_the_data_sources_own_empty_messages_name_no_none(tiny, tmp_path):
    from slime_ref.arguments import parse_args
    from slime_ref.data.source import RolloutDataSource
    from slime_ref.errors import UserError

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = parse_args(_train_flags(tiny, tmp_path / "run", "--prompt-data", str(empty)))
    with pytest.raises(UserError) as caught:
        RolloutDataSource(args)
    assert "no prompts in it" in str(caught.value) and "None" not in str(caught.value)
    args = parse_args(_train_flags(tiny, tmp_path / "run", "--rollout-max-prompt-len", "2"))
    with pytest.raises(UserError, match="all 80 are longer than --rollout-max-prompt-len 2 tokens"):
        RolloutDataSource(args)


# ---------------------------------------------------------------------------------------------
# items 5 and 6: what the run's live display says


def _display_lines(events):
    import io

    from rich.console import Console

    from slime_ref.console import RunDisplay

    buf = io.StringIO()
    display = RunDisplay(Console(file=buf, width=200, force_terminal=False), 3, "run")
    for phase, info in events:
        display(phase, **info)
    return buf.getvalue(), display


def test_the_first_eval_is_labelled_before_training_and_later_ones_after_their_rollout():
    evaluated = {"eval/arith": 0.212, "eval/arith-pass@8": 0.75}
    out, _ = _display_lines([
        ("update_weights", {"rollout_id": -1}),
        ("eval", {"rollout_id": 0}), ("logged", {"rollout_id": 0, "kind": "eval", "metrics": evaluated}),
        ("rollout", {"rollout_id": 0}), ("train", {"rollout_id": 0}),
        ("logged", {"rollout_id": 0, "kind": "rollout", "metrics": {"rollout/raw_reward": 0.3}}),
        ("eval", {"rollout_id": 0}), ("logged", {"rollout_id": 0, "kind": "eval", "metrics": evaluated}),
    ])
    lines = out.splitlines()
    assert lines[0].startswith("  eval before training: arith 0.212")
    assert lines[1].startswith("  eval after rollout 0: arith 0.212")


def test_a_supervised_run_shows_its_loss_not_a_reward():
    _, display = _display_lines([("rollout", {"rollout_id": 0}), ("train", {"rollout_id": 0}), (
        "logged", {"rollout_id": 0, "kind": "rollout",
                   "metrics": {"rollout/raw_reward": 0.0, "rollout/response_length": 4.3, "train/loss": 0.518}})])
    status = display.progress.tasks[0].fields["status"]
    assert "loss 0.518" in status and "reward" not in status and "generating" not in status
    _, display = _display_lines([("logged", {"rollout_id": 0, "kind": "rollout", "metrics": {
        "rollout/raw_reward": 0.5, "train/pg_loss": 0.01, "train/loss": 0.01}})])
    assert "reward 0.500" in display.progress.tasks[0].fields["status"]


# ---------------------------------------------------------------------------------------------
# item 4: reward.png plots what moves, marks the warm-up and the before and after points, and keeps
# legends off the lines


def _grpo_records():
    records = [{"rollout_id": 0, "eval/arith": 0.2, "eval/arith-pass@8": 0.7, "eval/arith-truncated_ratio": 0.0}]
    for i in range(6):
        records.append({"rollout_id": i, "rollout/raw_reward": 0.2 + 0.1 * i, "train/ppo_kl": 0.0,
                        "train/kl_loss": 0.01 * i, "rollout/response_length": 4.0, "perf/rollout_time": 0.1})
        if i in (2, 5):
            records.append({"rollout_id": i, "eval/arith": 0.2 + 0.1 * i})
    return records


def test_the_plot_marks_the_warm_up_before_and_after_and_says_why_ppo_kl_is_zero():
    from slime_ref.plot import build_figure

    warmup = [{"rollout_id": i, "train/loss": 5.0 / (i + 1)} for i in range(10)]
    fig = build_figure(_grpo_records(), warmup, "quick start")
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert "Supervised warm-up (before GRPO)" in axes
    reward = next(ax for title, ax in axes.items() if title.startswith("Reward"))
    notes = [t.get_text() for t in reward.texts]
    assert "before training: 0.200" in notes and "after rollout 5: 0.700" in notes
    labels = [line.get_label() for line in reward.lines]
    assert "eval/arith (held-out)" in labels and not any("pass@" in label or "truncated" in label for label in labels)
    kl = axes["KL"]
    assert [line.get_label() for line in kl.lines if line.get_xydata().size] == ["train/kl_loss"]
    assert any("train/ppo_kl is 0 at every rollout" in t.get_text() and "one optimizer step" in t.get_text()
               for t in kl.get_legend().get_texts())
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None:  # anchored below the axes, outside the plotting area
            assert legend._bbox_to_anchor.bounds[1] < ax.bbox.bounds[1], ax.get_title()
    import matplotlib.pyplot as plt

    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# item 9: the rollout's sampling seeds (slime's --sglang-enable-deterministic-inference)


def test_deterministic_inference_sends_slimes_sampling_seeds(tiny, tmp_path, monkeypatch):
    import asyncio

    from slime_ref.arguments import parse_args
    from slime_ref.rollout import sglang_rollout
    from slime_ref.types import Sample

    args = parse_args(_train_flags(tiny, tmp_path, "--n-samples-per-prompt", "4", "--global-batch-size", "8",
                                   "--rollout-seed", "7", "--sglang-enable-deterministic-inference"))
    assert sglang_rollout.group_sampling_seeds(args) == [7, 8, 9, 10]
    sent = []

    async def fake(args, sample, params, evaluation=False):
        sent.append(params.get("sampling_seed"))
        sample.status = Sample.Status.COMPLETED
        sample.reward = 1.0
        return sample

    monkeypatch.setattr(sglang_rollout, "generate_and_rm", fake)

    class State:
        aborted = False
        capacity = 64

    monkeypatch.setattr(sglang_rollout, "generation_state", lambda args: State())
    group = [Sample(prompt="1+1=", index=i, group_index=0) for i in range(4)]
    asyncio.run(sglang_rollout.generate_and_rm_group(args, group, sglang_rollout.sampling_params(args)))
    assert sent == [7, 8, 9, 10]
    plain = parse_args(_train_flags(tiny, tmp_path))
    assert sglang_rollout.group_sampling_seeds(plain) is None


# ---------------------------------------------------------------------------------------------
# items 2, 3 and 7: the quick start's recipe, next steps and console


def test_the_quick_start_saves_the_trained_model_as_hf_and_asks_for_repeatable_rollouts(tiny, tmp_path):
    from slime_ref.arguments import parse_args
    from slime_rehearse.quickstart import QuickstartConfig, grpo_argv

    (tmp_path / "warmup" / "hf").mkdir(parents=True)
    for src in tiny.model_dir.iterdir():
        (tmp_path / "warmup" / "hf" / src.name).write_bytes(src.read_bytes())
    args = parse_args(grpo_argv(QuickstartConfig(), tiny, tmp_path))
    assert args.save == str(tmp_path / "grpo" / "checkpoint") and args.save_hf == str(tmp_path / "grpo" / "hf")
    from slime_ref.run import should_run_periodic_action

    saved = [r for r in range(args.num_rollout)
             if should_run_periodic_action(r, args.save_interval, None, args.num_rollout)]
    assert saved == [args.num_rollout - 1]  # once, after the last rollout
    assert args.use_kl_loss and args.kl_loss_coef == 0.0  # train/kl_loss logged, not trained on
    from slime_ref.rollout.sglang_rollout import deterministic_inference

    assert deterministic_inference(args)


def test_next_steps_use_this_runs_outputs_as_paths_from_the_working_directory(tiny, tmp_path, monkeypatch):
    from slime_rehearse.quickstart import next_steps

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "slime-quickstart"
    commands = [command for command, _ in next_steps(out, tiny)]
    assert commands[0].startswith("slime-ref generate slime-quickstart/grpo/hf ")
    assert any(c.startswith("slime-check config --env TINY=") and c.endswith("examples/run-tiny-grpo.sh")
               for c in commands)
    smoke = next(c for c in commands if c.startswith("slime-check smoke"))
    assert "--out slime-quickstart/smoke" in smoke and smoke.endswith("examples/run-tiny-grpo.sh")
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # --out outside the working directory: absolute paths
    assert next_steps(out, tiny)[0][0].startswith(f"slime-ref generate {out}/grpo/hf ")


def test_the_quick_start_prints_piped_output_at_200_columns_as_prereqs_and_config(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from slime_rehearse import quickstart as qs
    from slime_rehearse.cli import cli

    seen = {}
    monkeypatch.setattr(qs, "run_quickstart", lambda out, cfg, force, console: seen.setdefault("console", console))
    result = CliRunner().invoke(cli, ["quickstart", "--out", str(tmp_path / "qs")])
    assert result.exit_code == 0, result.output
    assert seen["console"].width == 200


# ---------------------------------------------------------------------------------------------
# item 9: the same seed gives the same run


_SHORT_QUICKSTART = """
import sys
from pathlib import Path
from rich.console import Console
from slime_rehearse.quickstart import QuickstartConfig, run_quickstart
cfg = QuickstartConfig(seed=0, warmup_steps=20, num_rollout=4, eval_interval=2)
run_quickstart(Path(sys.argv[1]), cfg, True, Console(width=200))
"""

# what may differ between two runs of one seed: timings, and the engine-vs-trainer log-prob gap in its last
# digits (the engine batches concurrent requests as they arrive; float sums then group differently)
_MAY_DIFFER = ("perf/", "time", "train/train_rollout_logprob_abs_diff")


@pytest.mark.slow
def test_a_seed_repeats_exactly():
    import json
    import shutil
    import tempfile
    from pathlib import Path

    base = Path(tempfile.mkdtemp(prefix="det-", dir="/tmp"))
    try:
        runs = []
        for name in ("a", "b"):
            result = subprocess.run([sys.executable, "-c", _SHORT_QUICKSTART, str(base / name)], capture_output=True,
                                    text=True, timeout=900)
            assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-2000:]
            runs.append(base / name)

        def metrics(run, phase):
            rows = [json.loads(line) for line in (run / phase / "metrics.jsonl").read_text().splitlines()]
            return [{k: v for k, v in r.items() if not k.startswith(_MAY_DIFFER)} for r in rows]

        for phase in ("warmup", "grpo"):
            first, second = metrics(runs[0], phase), metrics(runs[1], phase)
            assert len(first) > 3 and first == second, phase
        grpo = metrics(runs[0], "grpo")
        assert any("eval/arith" in r for r in grpo) and any("train/pg_loss" in r for r in grpo)
        for phase in ("warmup", "grpo"):  # the trained weights, byte for byte
            assert (runs[0] / phase / "hf" / "model.safetensors").read_bytes() == \
                   (runs[1] / phase / "hf" / "model.safetensors").read_bytes(), phase
        summaries = [json.loads((run / "summary.json").read_text()) for run in runs]
        assert summaries[0]["reward_before"] == summaries[1]["reward_before"]
        assert summaries[0]["reward_after"] == summaries[1]["reward_after"]
    finally:
        shutil.rmtree(base, ignore_errors=True)
