"""bench/gpu/memory_fit.py: its jobs are slime v0.3.1 jobs that plan sizes as intended, and its summary
gives each configuration's median, spread and error exactly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))

import memory_fit  # noqa: E402

GIB = 2**30


JOBS = [(name, None) for name in sorted(memory_fit.CONFIGS) if not name.endswith("-split")] + [
    (name, side) for name in sorted(memory_fit.CONFIGS) if name.endswith("-split") for side in memory_fit.SIDES]


@pytest.mark.parametrize(("name", "side"), JOBS)
def test_each_job_is_slimes_and_plan_fails_exactly_the_one_built_to_oom(name, side):
    from slime_common.registry import load_registry
    from slime_rehearse.smoke_memory import card_for, predicted

    reg = load_registry("v0.3.1")
    saved = memory_fit.saved_samples(Path("/w/smoke-x")) if side == "trainer" else None
    argv = memory_fit.job_argv(name, Path("/models/m"), Path("/data/p.jsonl"), side, saved)
    unknown = [a for a in argv if a.startswith("--") and reg.lookup(a) is None]
    assert unknown == []  # slime silently ignores an unknown flag: every one must be slime's
    h100 = card_for(81559 * 2**20)
    plan = predicted(argv, reg, "v0.3.1", h100, kernel="fused")  # slime's image: FusedAdam
    assert (plan["peak"] > h100.usable) == name.endswith("-oom"), f"{name}: {plan['peak'] / GIB:.1f} GiB"
    # the offline set's torch AdamW needs 4 more bytes a parameter: 4B's update no longer fits 80 GB
    torch_adam = predicted(argv, reg, "v0.3.1", h100, kernel="torch")
    assert (torch_adam["peak"] > h100.usable) == (name.endswith("-oom") or name == "q4-1k-4k-rc")
    # a split job's side is the engines alone or the trainer alone
    assert (plan["train"] is None, plan["rollout"] is None) == (side == "engines", side == "trainer")
    assert plan["colocate"] == (side is None)


def test_a_split_configuration_runs_one_side_at_a_time_and_the_trainer_needs_the_engines_samples(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["memory_fit.py", "--configs", "q06-1k-8k-split", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as stopped:
        memory_fit.main()
    assert stopped.value.code == 2 and "--side engines" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--side engines --first-index 1 on this machine first"):
        memory_fit.run_one("q06-1k-8k-split", "slime", tmp_path, tmp_path, 1, 60, side="trainer")


def test_a_trainers_repeats_train_on_the_engines_samples_of_their_own_index_else_the_first(tmp_path):
    def engines(i):
        return memory_fit.saved_samples(memory_fit.smoke_dir(tmp_path, "q06-1k-8k-split", "engines", "slime", i))

    for i in (10, 2):
        engines(i).parent.mkdir(parents=True)
    assert memory_fit.engines_samples(tmp_path, "q06-1k-8k-split", "slime", 10) == engines(10)
    assert memory_fit.engines_samples(tmp_path, "q06-1k-8k-split", "slime", 3) == engines(2)  # 2 < 10 as numbers
    assert memory_fit.engines_samples(tmp_path, "q06-1k-8k", "slime", 1) is None


def _run(tmp: Path, name: str, index: int, measured_gib: float | None, predicted_gib: float, oom=None) -> Path:
    compared = [] if measured_gib is None else [
        {"what": "peak", "measured_bytes": int(measured_gib * GIB), "predicted_bytes": int(predicted_gib * GIB)},
        {"what": "training and log-prob passes", "measured_bytes": int((measured_gib - 40) * GIB),
         "predicted_bytes": int(20 * GIB)}]
    data = {"config": name, "engine": "slime", "process": index, "shape": "qwen3-0.6B", "response_len": 1024,
            "max_tokens_per_gpu": 8192, "recompute": False, "mem_fraction": 0.7, "colocate": True,
            "card": "H100-80GB", "memory": {"compared": compared, "oom": oom}}
    path = tmp / f"memory-fit-{name}-slime-{index}.json"
    path.write_text(json.dumps(data))
    return path


def test_the_summary_is_the_median_of_the_processes_with_their_spread(tmp_path):
    paths = [_run(tmp_path, "q06-1k-8k", i, gib, 56.0) for i, gib in enumerate((56.5, 57.5, 57.0))]
    oom = {"phase": "the training step", "short_by": 7 * GIB}
    paths.append(_run(tmp_path, "q4-1k-64k-oom", 1, None, 384.0, oom=oom))
    rows = {r["config"]: r for r in memory_fit.summarize(paths)["rows"]}
    fit = rows["q06-1k-8k"]
    assert fit["processes"] == 3 and fit["card"] == "H100-80GB"
    assert fit["peak"] == {"processes": 3, "measured_gib": 57.0, "spread_gib": 1.0, "predicted_gib": 56.0,
                           "error": round(-1 / 57, 3)}
    # each phase on its own: training's median 17 GiB against plan's 20
    assert fit["training and log-prob passes"] == {"processes": 3, "measured_gib": 17.0, "spread_gib": 1.0,
                                                   "predicted_gib": 20.0, "error": round(3 / 17, 3)}
    assert rows["q4-1k-64k-oom"]["oom_phase"] == "the training step"
    assert rows["q4-1k-64k-oom"]["oom_short_by_gib"] == 7.0


RESULTS = sorted((Path(__file__).resolve().parents[2] / "bench" / "results").glob("memory-fit-*.json"))


def _measured_runs() -> list[dict]:
    """Real-slime runs that reached plan. A run of one step where its job also has runs of two is left out, as
    ``memory_fit.summarize`` leaves it: its backward ran before Adam's moments existed, so it measured less
    than the job's steady peak."""
    runs = [r for path in RESULTS for r in json.loads(path.read_text())["runs"]
            if r["engine"] == "slime" and any(c["what"] == "peak" and c["predicted_bytes"]
                                              for c in r["memory"]["compared"])]

    def job(r):
        return r["card"], r["config"], r.get("side")

    steady = {job(r) for r in runs if memory_fit.made_two_steps(r)}
    return [r for r in runs if memory_fit.made_two_steps(r) or job(r) not in steady]


@pytest.mark.parametrize("run", _measured_runs(), ids=lambda r: f"{r['card']}-{r['config']}-{r.get('side') or ''}"
                         f"{r['process']}")
def test_this_plan_predicts_every_gpu_measured_peak_within_ten_percent(run):
    """Each real-slime run in bench/results/, planned again by this checkout: the whole run's peak per
    GPU within 10% of the one measured; a job built to run out of memory FAILs and ran out in training."""
    from slime_rehearse.smoke_memory import card_for

    plan = memory_fit.replan(run)
    measured = next(c["measured_bytes"] for c in run["memory"]["compared"] if c["what"] == "peak")
    if run["config"].endswith("-oom"):
        assert run["memory"]["oom"]["phase"] == "the training step"
        assert plan["train"] == plan["peak"] > card_for(run["memory"]["gpus"][0]["total_bytes"]).usable
        return
    assert abs(plan["peak"] - measured) <= 0.10 * measured, (
        f"{run['config']}: plan {plan['peak'] / GIB:.2f} GiB, measured {measured / GIB:.2f} GiB")


def test_the_summary_replans_each_configuration_at_its_runs_sample_length(tmp_path):
    """``replanned`` is this checkout's plan of the group's run that knows its samples' length (1,034 tokens:
    seven pack into the 8,192-token micro-batch), its error read against the same measured medians."""
    h100 = next(p for p in RESULTS if "h100" in p.name)
    runs = [r for r in json.loads(h100.read_text())["runs"] if r["config"] == "q06-1k-8k"]
    paths = []
    for i, run in enumerate(runs):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(run))
    row = memory_fit.summarize(paths)["rows"][0]
    plan = memory_fit.replan(next(r for r in runs if r.get("sample_tokens") == 1034))
    again = row["replanned"]
    assert again["micro_batch_tokens"] == 7 * 1034
    train = round(plan["train"] / GIB, 2)
    measured = row["training and log-prob passes"]["measured_gib"]
    assert again["training and log-prob passes"] == {"predicted_gib": train,
                                                     "error": round((train - measured) / measured, 3)}
    assert memory_fit.summarize(paths, with_replan=False)["rows"][0].get("replanned") is None


def test_training_is_the_median_of_the_runs_that_made_a_second_step_where_there_are_any(tmp_path):
    paths = [_run(tmp_path, "q06-1k-8k", i, gib, 56.0) for i, gib in enumerate((70.0, 70.0))]
    two = json.loads(paths[1].read_text())
    two["rollouts"] = 2
    two["memory"]["compared"][1]["measured_bytes"] = 34 * GIB
    two["memory"]["compared"][1]["predicted_bytes"] = 25 * GIB  # plan at that run, not at the first
    paths[1].write_text(json.dumps(two))
    row = memory_fit.summarize(paths)["rows"][0]
    assert row["training and log-prob passes"]["processes"] == 1
    assert row["training and log-prob passes"]["measured_gib"] == 34.0
    assert row["training and log-prob passes"]["predicted_gib"] == 25.0
    assert row["peak"]["processes"] == 1  # the whole run's peak too: the first run's lacks the second step


def test_each_roles_share_per_phase_is_the_median_over_the_runs_of_its_processes_sum(tmp_path):
    paths = [_run(tmp_path, "q06-1k-8k", i, gib, 56.0) for i, gib in enumerate((56.5, 57.5, 57.0))]
    for path, (engine_asleep, trainer_asleep) in zip(paths, ((1.0, 0.75), (1.5, 0.5), (1.25, 1.0)), strict=True):
        run = json.loads(path.read_text())
        run["memory"]["processes"] = [
            {"gpu": 0, "pid": 11, "name": "sglang::scheduler", "peak_bytes": 56 * GIB,
             "phases": {"rollout": 56 * GIB, "training and log-prob passes": int(engine_asleep * GIB)}},
            {"gpu": 0, "pid": 12, "name": "ray::MegatronTrainRayActor.train", "peak_bytes": 30 * GIB,
             "phases": {"rollout": int(trainer_asleep * GIB), "training and log-prob passes": 30 * GIB}},
            {"gpu": 0, "pid": 13, "name": "sglang::detokenizer", "peak_bytes": GIB // 4,
             "phases": {"rollout": GIB // 4}},  # a second process of the engine: summed with the first
        ]
        path.write_text(json.dumps(run))
    row = memory_fit.summarize(paths, with_replan=False)["rows"][0]
    assert row["process_shares_gib"] == {
        "engine": {"rollout": 56.25, "training and log-prob passes": 1.25},
        "trainer": {"rollout": 0.75, "training and log-prob passes": 30.0}}
    assert memory_fit.process_role("/usr/bin/python3 -m some.tool") == "other"


def test_runs_without_process_readings_give_no_shares(tmp_path):
    paths = [_run(tmp_path, "q06-1k-8k", i, gib, 56.0) for i, gib in enumerate((56.5, 57.5))]
    assert "process_shares_gib" not in memory_fit.summarize(paths, with_replan=False)["rows"][0]


def test_merging_a_results_last_run_back_gives_the_file_byte_for_byte_and_a_second_merge_adds_nothing(tmp_path):
    stored = next(p for p in RESULTS if "h100" in p.name)
    data = json.loads(stored.read_text())
    last = data["runs"].pop()
    data["summary"] = [{"stale": True}]  # merge makes the summary again from all the runs
    results = tmp_path / stored.name
    results.write_text(json.dumps(data, indent=1) + "\n")
    run = tmp_path / "memory-fit-run.json"
    run.write_text(json.dumps({**last, "memory": {**last["memory"], "trace": {"bin_s": 0.1, "samples": []}}}))
    assert memory_fit.merge(results, [run]) == [f"memory-fit-run.json: added (exit {last['returncode']}, "
                                                f"{last['wall_s']} s)"]
    assert results.read_text() == stored.read_text()  # the trace left out, the stored note in its place
    assert memory_fit.merge(results, [run]) == [f"memory-fit-run.json: already in {stored.name}"]
    assert results.read_text() == stored.read_text()


def test_merge_with_a_missing_file_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    results = next(p for p in RESULTS if "h100" in p.name)
    monkeypatch.setattr(sys, "argv", ["memory_fit.py", "--merge", str(results), str(tmp_path / "none.json")])
    with pytest.raises(SystemExit) as stop:
        memory_fit.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "error: --merge" in err and f"no file {tmp_path / 'none.json'}" in err


def test_merge_of_the_results_file_alone_makes_its_summary_again(tmp_path, monkeypatch, capsys):
    stored = next(p for p in RESULTS if "h100" in p.name)
    results = tmp_path / stored.name
    data = json.loads(stored.read_text())
    data["summary"] = []  # as a results file whose summary a change to plan left behind
    results.write_text(json.dumps(data))
    monkeypatch.setattr(sys, "argv", ["memory_fit.py", "--merge", str(results)])
    memory_fit.main()
    assert capsys.readouterr().out.strip() == f"{stored.name}: summary made again by this checkout's plan"
    assert results.read_text() == stored.read_text()
