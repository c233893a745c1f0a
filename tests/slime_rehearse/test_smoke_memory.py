"""The memory-faithful smoke (``slime-check smoke --memory``): the job kept at its memory-setting sizes,
answers forced to full length, each GPU's peak per phase, plan's prediction beside it, and an OOM
named by its phase and by how much (slime_rehearse.gpu_memory, slime_rehearse.smoke_memory)."""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slime_check.plan import CUDA_CONTEXT, NCCL_BUFFERS
from slime_rehearse.gpu_memory import (
    BETWEEN,
    ROLLOUT,
    STARTUP,
    TRAIN,
    WEIGHTS,
    Timeline,
    Trace,
    coarse_trace,
    find_oom,
    generate_windows,
    phase_peaks,
    read_timeline,
    slime_timer_spans,
)
from slime_rehearse.smoke_job import Job, SmokeOptions, shrink
from slime_rehearse.smoke_memory import card_for, compare, memory_findings, predicted

TESTS = Path(__file__).resolve().parents[1]
GIB, MIB = 2**30, 2**20
CLI = [sys.executable, "-c", "from slime_rehearse.cli import main; main()"]


def _frame(path: str, func: str) -> str:
    return f'  File "{path}", line 1, in {func}\n    code()\n'


def _traceback(*frames: tuple[str, str], last: str) -> str:
    return "Traceback (most recent call last):\n" + "".join(_frame(p, f) for p, f in frames) + last + "\n"


TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.27 GiB. GPU 0 has a total capacity of "
             "79.18 GiB of which 2.50 GiB is free. Including non-PyTorch memory, this process has 76.1 GiB in use.")


# ---------------------------------------------------------------------------------------------
# an out-of-memory error: the phase and the numbers


def test_the_numbers_of_a_real_gpu_oom_are_read_exactly():
    log = gzip.decompress((TESTS / "fixtures" / "gpu_memory" / "h100-slime-ref-colocated-oom.log.gz").read_bytes())
    oom = find_oom(log.decode())
    assert oom.requested == 458 * MIB and oom.free == int(340.75 * MIB) and oom.gpu == 0
    assert oom.short_by == 458 * MIB - int(340.75 * MIB)
    assert oom.capacity == int(79.18 * GIB)
    # the SGLang engine that kept its pool, and the trainer itself
    assert oom.others == [(2259, int(57.50 * GIB))] and oom.this_process == int(21.32 * GIB)
    text = memory_findings([], None, oom, [], 1024)[0].finding
    assert "other processes on the GPU held pid 2259 57.50 GiB, the process that ran out 21.32 GiB" in text


def test_a_log_prob_pass_is_named_though_it_runs_inside_train_and_megatrons_forward_backward():
    log = _traceback(("slime/ray/actor.py", "train"), ("slime/backends/megatron_utils/actor.py", "compute_log_prob"),
                     ("megatron/core/pipeline_parallel/schedules.py", "forward_backward_no_pipelining"),
                     ("torch/nn/functional.py", "linear"), last=TORCH_OOM)
    assert find_oom(log).phase == "the log-prob pass"


@pytest.mark.parametrize("frames, phase", [
    ([("slime/backends/megatron_utils/actor.py", "train_actor"), ("slime/backends/megatron_utils/model.py",
                                                                    "train_one_step"), ("torch/autograd/__init__.py",
                                                                                        "backward")],
     "the training step"),
    ([("slime/backends/megatron_utils/actor.py", "update_weights"), ("torch/distributed/c10d.py", "broadcast")],
     "the weight update"),
    ([("sglang/srt/model_executor/cuda_graph_runner.py", "capture"),
      ("sglang/srt/model_executor/cuda_graph_runner.py", "capture_one_batch_size")],
     "SGLang's CUDA-graph capture (engine start)"),
    ([("sglang/srt/managers/scheduler.py", "event_loop_normal"), ("sglang/srt/managers/scheduler.py", "run_batch")],
     "the rollout (SGLang)"),
])
def test_each_phase_is_named_from_the_frames(frames, phase):
    assert find_oom(_traceback(*frames, last=TORCH_OOM)).phase == phase


def test_sglangs_kv_pool_refusal_and_the_memory_savers_error_are_oom_phases():
    kv = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.95"
    assert find_oom(kv).phase == "SGLang's KV pool (engine start)" and find_oom(kv).requested is None
    saver = "[torch_memory_saver.cpp] CUresult error: 2 (out of memory) file=csrc/core.cpp"
    assert find_oom(saver).phase == "the switch between rollout and training"


def test_without_telling_frames_the_phase_is_where_the_peak_was():
    log = _traceback(("torch/nn/functional.py", "linear"), last=TORCH_OOM)
    timeline = Timeline(rollout=[(10.0, 20.0)], train=[(22.0, 30.0)])
    assert find_oom(log, timeline, at=15.0).phase == ROLLOUT
    assert find_oom(log, timeline, at=25.0).phase == TRAIN
    assert find_oom(log, timeline, at=21.0).phase == BETWEEN
    assert find_oom(log).phase == "an unknown phase"
    assert find_oom("all fine\n") is None


# ---------------------------------------------------------------------------------------------
# phases and peaks


def test_generate_calls_from_several_processes_merge_into_rollout_windows(tmp_path):
    marks = tmp_path / "memory"
    marks.mkdir()
    (marks / "generate.11").write_text("10.0 12.0\n30.0 31.0\nnot a line\n")
    (marks / "generate.12").write_text("11.5 14.0\n")
    assert generate_windows(tmp_path) == [(10.0, 14.0), (30.0, 31.0)]


def test_each_phase_keeps_its_own_peak_per_gpu():
    trace = Trace(times=[1.0, 5.0, 6.0, 9.0, 12.0, 14.0], used=[[3, 1], [40, 2], [55, 2], [20, 9], [35, 4], [7, 7]],
                  total=[80, 80], baseline=[1, 1])
    timeline = Timeline(rollout=[(4.0, 7.0)], train=[(8.0, 10.0)], weights=[(13.5, 14.5)])
    gpus = phase_peaks(trace, timeline)
    assert gpus[0] == {"gpu": 0, "total_bytes": 80, "baseline_bytes": 1, "peak_bytes": 55,
                       "phases": {STARTUP: 3, ROLLOUT: 55, TRAIN: 20, WEIGHTS: 7, BETWEEN: 35}}
    assert gpus[1]["phases"] == {STARTUP: 1, ROLLOUT: 2, TRAIN: 9, WEIGHTS: 7, BETWEEN: 4}


# slime v0.3.1 on an H100 (bench/gpu/memory_fit.py q06-1k-8k): the training actor's timer lines, as Ray
# forwards them
RAY_PREFIX = "\x1b[36m(MegatronTrainRayActor pid=3105)\x1b[0m"
SLIME_TIMER_LOG = "".join(f"{RAY_PREFIX} [2026-12-06 {at}] timer.py:24 - Timer {what}\n"
                          for at, what in (("14:29:39", "train_wait end (elapsed: 4.7s)"),
                                           ("14:29:40", "train start"), ("14:29:40", "ref_log_probs start"),
                                           ("14:29:50", "ref_log_probs end (elapsed: 9.9s)"),
                                           ("14:30:11", "train end (elapsed: 30.7s)"),
                                           ("14:30:18", "update_weights start")))


def _near(expected):
    return pytest.approx(expected, abs=1e-6)  # epoch seconds: a relative tolerance would hide whole seconds


def test_slimes_train_timer_gives_the_seconds_the_phase_may_have_run_in():
    at = time.mktime(time.strptime("2026-12-06 14:29:40", "%Y-%m-%d %H:%M:%S"))
    # stamped 14:29:40 and 14:30:11, 30.7 s: it started at 40.3 at the earliest and ended by 71.7
    assert slime_timer_spans(SLIME_TIMER_LOG, "train") == [_near((at + 0.3, at + 31.7))]
    assert slime_timer_spans(SLIME_TIMER_LOG, "update_weights") == []  # never ended: no window
    same_second = "[2026-12-06 14:29:40] timer.py:24 - Timer train start\n" \
                  "[2026-12-06 14:29:40] timer.py:32 - Timer train end (elapsed: 0.4s)\n"
    assert slime_timer_spans(same_second, "train") == [(at, at + 1)]  # a sub-second step keeps its second


def test_an_engine_switching_its_pool_in_the_same_second_narrows_the_window_to_where_the_step_surely_ran():
    at = time.mktime(time.strptime("2026-12-06 14:29:40", "%Y-%m-%d %H:%M:%S"))
    engine = ("(SGLangEngine pid=2690) [2026-12-06 14:29:{:02d}] INFO:     10.0.0.2:44854 - "
              "\"POST /{}_memory_occupation HTTP/1.1\" 200 OK\n")
    step = "[2026-12-06 14:29:40] timer.py:24 - Timer train start\n" \
           "[2026-12-06 14:29:42] timer.py:32 - Timer train end (elapsed: 1.4s)\n"
    # started 40.6-41, ended 42-42.4
    assert slime_timer_spans(step, "train") == [_near((at + 0.6, at + 2.4))]
    # the pool released in the start's second: from 41, the latest start; taken back in the end's second
    # or the next: up to 42, the earliest end
    assert slime_timer_spans(engine.format(40, "release") + step, "train") == [_near((at + 1, at + 2.4))]
    assert slime_timer_spans(engine.format(39, "release") + step + engine.format(43, "resume"), "train") == [
        _near((at + 0.6, at + 2))]
    short = "[2026-12-06 14:29:40] timer.py:24 - Timer train start\n" \
            "[2026-12-06 14:29:40] timer.py:32 - Timer train end (elapsed: 0.7s)\n"
    assert slime_timer_spans(engine.format(40, "release") + short, "train") == [_near((at + 0.3, at + 1))]


def test_a_real_slime_smoke_log_gives_one_training_window_of_its_timers_length():
    log = gzip.decompress((TESTS / "fixtures" / "gpu_memory" / "h100-slime-q06-1k-8k.log.gz").read_bytes()).decode()
    (start, end), = slime_timer_spans(log, "train")  # "Timer train end (elapsed: 23.8s)", stamped 15:00:17-41
    assert end - start == _near(24.6) and time.strftime("%H:%M:%S", time.localtime(start)) == "15:00:17"
    assert find_oom(log) is None


def test_slimes_sub_second_second_step_is_training_in_a_real_two_step_run():
    """The second step (0.7 s, stamped start and end in one second) trains beside Adam's moments: its
    34.33 GiB, not the first step's 30.20, is the job's training peak."""
    fixtures = TESTS / "fixtures" / "gpu_memory"
    log = gzip.decompress((fixtures / "h100-slime-q06-1k-8k-two-steps.log.gz").read_bytes()).decode()
    saved = json.loads(gzip.decompress((fixtures / "h100-slime-q06-1k-8k-two-steps.trace.json.gz").read_bytes()))
    samples = saved["trace"]["samples"]
    trace = Trace(times=[s[0] for s in samples], used=[s[1:] for s in samples], total=saved["trace"]["total"],
                  baseline=saved["trace"]["baseline"])
    first, second = slime_timer_spans(log, "train")
    assert second[1] - second[0] == _near(1.0)  # the whole second: no engine switched its pool in it
    base = trace.baseline[0]

    def peak(spans):
        return round((phase_peaks(trace, Timeline(rollout=[tuple(w) for w in saved["rollout"]], train=spans))[0]
                      ["phases"][TRAIN] - base) / GIB, 2)

    assert peak([first]) == 30.2 and peak([first, second]) == 34.33


def test_colocated_slimes_pool_held_after_the_rollout_is_not_the_training_peak(tmp_path):
    """Real slime, colocated: the engine keeps its 57 GiB pool until the switch after the rollout and
    takes it back before the weight update. Only the timer's window gives training its own 17 GiB."""
    at = time.mktime(time.strptime("2026-12-06 14:29:40", "%Y-%m-%d %H:%M:%S"))
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "generate.7").write_text(f"{at - 10} {at - 6}\n")
    times = [at - 20, at - 8, at - 3, at + 5, at + 20, at + 40]
    used = [[57 * GIB], [58 * GIB], [57 * GIB], [16 * GIB], [17 * GIB], [57 * GIB]]
    trace = Trace(times=times, used=used, total=[80 * GIB], baseline=[0])
    timeline = read_timeline(tmp_path, SLIME_TIMER_LOG)
    assert timeline.rollout == [(at - 10, at - 6)] and timeline.train == [_near((at + 0.3, at + 31.7))]
    phases = phase_peaks(trace, timeline)[0]["phases"]
    assert phases == {STARTUP: 57 * GIB, ROLLOUT: 58 * GIB, TRAIN: 17 * GIB, BETWEEN: 57 * GIB}


def test_slime_refs_timeline_file_gives_training_and_weight_update_windows(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "timeline.jsonl").write_text(
        '{"phase": "train", "rollout_id": 0, "start": 20.5, "end": 30.25}\n'
        '{"phase": "update_weights", "rollout_id": 0, "start": 31.0, "end": 31.5}\n'
        '{"phase": "train", "rollout_id": 1, "start": 50.0, "end": 60.0}\nnot json\n')
    # slime-ref's own file wins over timer lines in the log
    timeline = read_timeline(tmp_path, SLIME_TIMER_LOG)
    assert timeline.train == [(20.5, 30.25), (50.0, 60.0)] and timeline.weights == [(31.0, 31.5)]


def test_the_coarse_trace_keeps_each_bins_largest_sample():
    trace = Trace(times=[10.01, 10.05, 10.12, 10.31], used=[[1, 5], [4, 2], [3, 3], [9, 0]], total=[80, 80],
                  baseline=[0, 1])
    assert coarse_trace(trace) == {"bin_s": 0.1, "total": [80, 80], "baseline": [0, 1],
                                   "samples": [[10.0, 4, 5], [10.1, 3, 3], [10.3, 9, 0]]}


# ---------------------------------------------------------------------------------------------
# plan beside the measurement


def test_the_card_is_known_by_nvidias_size_else_taken_as_measured():
    assert card_for(81559 * MIB).name == "H100-80GB"
    assert card_for(143771 * MIB).name == "H200-141GB"
    other = card_for(50000 * MIB)
    assert other.usable == (50000 - 600) * MIB and other.smi_mib == 50000


def _job(response: int = 1024, max_tokens: int = 8192) -> list[str]:
    return ["--hf-checkpoint", "/models/q", "--prompt-data", "/data/p.jsonl", "--num-layers", "28", "--hidden-size",
            "1024", "--ffn-hidden-size", "3072", "--num-attention-heads", "16", "--group-query-attention",
            "--num-query-groups", "8", "--kv-channels", "128", "--vocab-size", "151936", "--swiglu", "--qk-layernorm",
            "--colocate", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--rollout-batch-size", "32",
            "--n-samples-per-prompt", "8", "--global-batch-size", "256", "--rollout-max-response-len", str(response),
            "--rollout-max-prompt-len", "256", "--use-dynamic-batch-size", "--max-tokens-per-gpu", str(max_tokens),
            "--sglang-mem-fraction-static", "0.7", "--recompute-granularity", "full", "--recompute-method",
            "uniform", "--recompute-num-layers", "1", "--eval-prompt-data", "aime", "/data/aime.jsonl",
            "--eval-interval", "5", "--use-kl-loss", "--ref-load", "/models/q"]


def test_slime_ref_is_predicted_with_its_training_state_on_the_gpu_during_the_rollout():
    from slime_common.registry import load_registry

    card = card_for(81559 * MIB)
    slime = predicted(_job(), load_registry("v0.3.1"), "v0.3.1", card)
    ref = predicted(_job(), load_registry("v0.3.1"), "v0.3.1", card, engine="slime-ref")
    # Qwen3-0.6B: 596,049,920 parameters; bf16 weights (2), bf16 gradients (2: no fp32 flag), Adam 12, DP 1;
    # Megatron pads each buffer a little, so the state is within 0.1% of 16 bytes a parameter
    state = ref["rollout"] - slime["rollout"] + CUDA_CONTEXT * GIB  # plan's sleeping trainer is replaced
    assert state == pytest.approx(16 * 596_049_920, rel=1e-3)
    assert ref["train"] == slime["train"]
    assert slime["weights"] < slime["train"] and ref["weights"] is None  # slime-ref's update: beside its state


def test_each_side_of_a_split_job_is_predicted_alone():
    """A job that does not colocate, measured one side at a time on one GPU: the engines with
    --debug-rollout-only against plan's rollout GPU, the trainer on their saved samples
    (--load-debug-rollout-data) against plan's actor GPU."""
    from slime_common.registry import load_registry

    card, reg = card_for(81559 * MIB), load_registry("v0.3.1")
    split = [a for a in _job() if a != "--colocate"] + ["--rollout-num-gpus", "1"]
    engines = predicted(split + ["--debug-rollout-only"], reg, "v0.3.1", card)
    trainer = predicted(split + ["--load-debug-rollout-data", "/d/{rollout_id}.pt"], reg, "v0.3.1", card)
    both = predicted(split, reg, "v0.3.1", card)
    assert engines["train"] is None and engines["weights"] is None and engines["peak"] == engines["rollout"]
    # alone, neither side has the NCCL group the trainer broadcasts its weights over
    group = int(NCCL_BUFFERS * GIB)
    assert engines["rollout"] == both["rollout"] - group and not engines["colocate"]
    assert trainer["rollout"] is None and trainer["peak"] == trainer["train"] == both["train"] - group
    # colocated, the same engine shares its GPU with the sleeping trainer's context
    assert predicted(_job(), reg, "v0.3.1", card)["rollout"] > engines["rollout"]


def test_the_busiest_gpu_is_compared_net_of_what_was_in_use_before():
    gpus = [{"gpu": 0, "total_bytes": 80 * GIB, "baseline_bytes": 1 * GIB, "peak_bytes": 51 * GIB,
             "phases": {STARTUP: 30 * GIB, ROLLOUT: 51 * GIB, TRAIN: 41 * GIB}}]
    plan = {"peak": 45 * GIB, "rollout": 45 * GIB, "train": 44 * GIB}
    rows = {r["what"]: r for r in compare(gpus, plan)}
    assert rows["peak"]["measured_bytes"] == 50 * GIB and rows["peak"]["error"] == pytest.approx(-0.1)
    assert rows[TRAIN]["error"] == pytest.approx(0.1) and rows[STARTUP]["predicted_bytes"] is None
    findings = memory_findings(gpus, plan, None, [1024.0], 1024)
    assert [(f.id, f.status.name) for f in findings] == [("smoke.memory", "PASS")]
    off = memory_findings(gpus, {**plan, "train": 30 * GIB}, None, [600.0], 1024)
    assert [(f.id, f.status.name) for f in off] == [("smoke.memory", "PASS"), ("smoke.memory.plan", "WARN"),
                                                    ("smoke.memory.length", "WARN")]
    assert "-25%" in off[1].finding


def test_a_run_stopped_at_start_up_is_not_held_against_plans_peak():
    # a real case: 4B on one H100, stopped by --timeout after its first weight sync, before the rollout
    gpus = [{"gpu": 0, "total_bytes": 80 * GIB, "baseline_bytes": 1 * GIB, "peak_bytes": 57 * GIB,
             "phases": {STARTUP: 57 * GIB}}]
    plan = {"peak": 384 * GIB, "rollout": 57 * GIB, "train": 384 * GIB}
    rows = {r["what"]: r for r in compare(gpus, plan)}
    assert rows["peak"]["predicted_bytes"] is None and rows["peak"]["error"] is None
    findings = memory_findings(gpus, plan, None, [], 1024)
    assert [(f.id, f.status.name) for f in findings] == [("smoke.memory", "WARN")]
    assert "stopped before the rollout and the training and log-prob passes" in findings[0].finding
    assert "384.00 GiB" in findings[0].finding and "--timeout" in findings[0].fix
    # trained, and a rollout logged its metrics, though no generate window was marked (a rollout
    # function of the job's own): the run reached plan's peak, which is compared
    trained = [{**gpus[0], "phases": {STARTUP: 30 * GIB, TRAIN: 57 * GIB}}]
    done = memory_findings(trained, {**plan, "peak": 60 * GIB, "train": 60 * GIB}, None, [1024.0], 1024)
    assert [(f.id, f.status.name) for f in done] == [("smoke.memory", "PASS")]
    assert "peak 56.00 GiB (plan 60.00, +7%)" in done[0].finding
    # one side of a job that does not colocate has no switches: its untimed rest is named as such
    split = {r["what"] for r in compare([{**trained[0], "phases": {TRAIN: 57 * GIB, BETWEEN: 50 * GIB}}],
                                        {"peak": 60 * GIB, "train": 60 * GIB, "colocate": False}, True)}
    assert split == {"peak", TRAIN, "outside the timed phases"}
    # without the metrics, the missing rollout window means the run stopped before it
    assert "stopped before the rollout:" in memory_findings(trained, plan, None, [], 1024)[0].finding


def test_an_oom_fails_naming_the_phase_how_much_was_missing_and_plans_knob():
    oom = find_oom(_traceback(("slime/backends/megatron_utils/model.py", "train_one_step"), last=TORCH_OOM))
    findings = memory_findings([], None, oom, [], 1024, fix="--max-tokens-per-gpu 4096 -> 4.6 GiB less")
    assert [(f.id, f.status.name) for f in findings] == [("smoke.memory.oom", "FAIL")]
    text = findings[0].finding
    assert "the training step" in text and "asked for 9.27 GiB with 2.50 GiB free on GPU 0, 6.77 GiB short" in text
    assert findings[0].fix == "--max-tokens-per-gpu 4096 -> 4.6 GiB less"


# ---------------------------------------------------------------------------------------------
# the shrunk job


def test_a_memory_faithful_job_keeps_what_sets_the_peak_and_fills_one_micro_batch(tmp_path):
    job = Job("train.py", _job(response=1024, max_tokens=16384), "argv", {})
    s = shrink(job, SmokeOptions(out=tmp_path, engine="slime-ref", memory=True, rollouts=1), Path("/models/q"),
               {"prompt": tmp_path / "p.jsonl"})
    argv = s.argv

    def value(flag):
        return argv[len(argv) - 1 - argv[::-1].index(flag) + 1]

    # 16384 tokens hold 12 samples of 256 + 1024: two prompts of 8 (one whole group and the rest)
    assert value("--rollout-batch-size") == "2" and value("--n-samples-per-prompt") == "8"
    assert value("--global-batch-size") == "16" and value("--rollout-max-response-len") == "1024"
    for kept in ("--max-tokens-per-gpu", "--recompute-granularity", "--sglang-mem-fraction-static", "--num-layers",
                 "--hidden-size", "--actor-num-gpus-per-node", "--ref-load"):
        assert kept in argv, kept
    assert value("--hf-checkpoint") == "/models/q"
    assert "--check-weight-update-equal" not in argv and "--eval-prompt-data" not in argv
    assert value("--custom-generate-function-path") == "slime_smoke_hooks.h_full_length_generate"
    assert s.hooks["h_full_length_generate"] == ("--custom-generate-function-path",
                                                 "slime.rollout.sglang_rollout.generate")


def test_a_jobs_own_generate_function_is_the_one_forced_to_full_length(tmp_path):
    job = Job("train.py", _job() + ["--custom-generate-function-path", "my.gen.generate"], "argv", {})
    s = shrink(job, SmokeOptions(out=tmp_path, engine="slime", memory=True), Path("/models/q"),
               {"prompt": tmp_path / "p.jsonl"})
    assert list(s.hooks.values()) == [("--custom-generate-function-path", "my.gen.generate")]
    assert s.argv.count("--custom-generate-function-path") == 1


def test_the_generate_wrapper_sets_ignore_eos_and_records_its_window(tmp_path, monkeypatch):
    from slime_rehearse.smoke_runtime import wrap

    (tmp_path / "gen_mod.py").write_text(textwrap.dedent("""
        seen = []
        async def generate(args, sample, sampling_params):
            seen.append(dict(sampling_params))
            return sample
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    calls, marks = tmp_path / "calls", tmp_path / "memory"
    calls.mkdir()
    marks.mkdir()
    config = {"calls": str(calls), "real_slime": True, "full_length": True, "marks": str(marks)}
    fn = wrap("h0", ("--custom-generate-function-path", "gen_mod.generate"), config)
    asyncio.run(fn(None, "s", {"max_new_tokens": 8}))
    asyncio.run(fn(None, "s", sampling_params={"max_new_tokens": 8, "ignore_eos": False}))
    import gen_mod

    assert gen_mod.seen == [{"max_new_tokens": 8, "ignore_eos": True}] * 2
    assert len(generate_windows(tmp_path)) >= 1 and len(list(marks.glob("generate.*"))) == 1


def test_offloaded_sglang_engines_start_with_the_memory_saver(monkeypatch, caplog):
    import importlib.util
    from types import SimpleNamespace

    from slime_ref.ray import rollout_manager
    from slime_ref.ray.rollout_manager import sglang_passthrough

    args = SimpleNamespace(offload_rollout=True, sglang_extra={"sglang_mem_fraction_static": 0.7})
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(rollout_manager.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_memory_saver" else real_find_spec(name, *a))
    assert sglang_passthrough(args, "sglang")["sglang_enable_memory_saver"] is True
    monkeypatch.setattr(rollout_manager.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch_memory_saver" else real_find_spec(name, *a))
    assert "sglang_enable_memory_saver" not in sglang_passthrough(args, "sglang")  # SGLang would refuse to start
    assert "torch_memory_saver is not installed" in caplog.text
    monkeypatch.undo()
    assert "sglang_enable_memory_saver" not in sglang_passthrough(args, "builtin")
    assert "sglang_enable_memory_saver" not in sglang_passthrough(SimpleNamespace(offload_rollout=False,
                                                                                  sglang_extra={}), "sglang")


def test_memory_without_a_gpu_is_a_usage_error_naming_the_flag(tmp_path):
    done = subprocess.run([*CLI, "smoke", "--memory", "--out", str(tmp_path / "o"), "--", "--hf-checkpoint", "x"],
                          capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--memory" in done.stderr and "GPU" in done.stderr


def test_memory_with_one_rollout_is_a_usage_error_naming_adams_moments(tmp_path):
    from click.testing import CliRunner

    from slime_common.errors import UserError
    from slime_rehearse.cli import cli

    done = CliRunner().invoke(cli, ["smoke", "--memory", "--rollouts", "1", "--out", str(tmp_path / "o"), "--",
                                    "--hf-checkpoint", "x"], standalone_mode=False)
    assert isinstance(done.exception, UserError)  # run_cli prints it as one line and exits 2
    assert "--rollouts 2" in str(done.exception) and "Adam's moments" in str(done.exception)
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------
# end to end on slime-ref (CPU: the built-in engine; NVML absent, so nothing is measured)


def test_a_split_job_rehearses_each_side_alone_the_trainer_on_the_engines_saved_samples():
    """slime-ref runs --debug-rollout-only (the engines alone; slime's actor returns from train() at once)
    and --load-debug-rollout-data (the trainer alone on those samples); each smoke's timeline has only
    its own side's windows."""
    from slime_common.registry import load_registry
    from slime_ref.assets import make_tiny
    from slime_rehearse.rehearsal import run_smoke

    root = Path(__import__("tempfile").mkdtemp(prefix="sms-", dir="/tmp"))  # short: Ray's socket paths
    tiny = make_tiny(root / "tiny")
    argv = ["--hf-checkpoint", str(tiny.model_dir), "--prompt-data", str(tiny.train_path), "--input-key", "prompt",
            "--label-key", "label", "--apply-chat-template", "--rm-type", "math", "--num-rollout", "100",
            "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--global-batch-size", "32",
            "--rollout-max-response-len", "24", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "256",
            "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1"]
    reports = {}
    saved = root / "engines" / "writes" / "save-debug-rollout-data" / "{rollout_id}.pt"  # where the smoke puts it
    for side, extra in (("engines", ["--debug-rollout-only", "--save-debug-rollout-data", "/x/{rollout_id}.pt"]),
                        ("trainer", ["--load-debug-rollout-data", str(saved)])):
        _, report = run_smoke(argv + extra, SmokeOptions(out=root / side, engine="slime-ref", memory=True, rollouts=1,
                                                         registry=load_registry("v0.3.1"), target="v0.3.1",
                                                         force=True), None)
        assert report["returncode"] == 0, (root / side / "smoke.log").read_text()[-3000:]
        reports[side] = report
    engines, trainer = (reports[k]["memory"]["timeline"] for k in ("engines", "trainer"))
    assert engines["rollout"] and not engines["train"] and not engines["weights"]
    assert trainer["train"] and not trainer["rollout"]
    assert reports["trainer"]["response_length"] == [24.0]  # the engines' full-length answers, trained on
    __import__("shutil").rmtree(root, ignore_errors=True)


def test_a_memory_faithful_rehearsal_forces_every_answer_to_full_length(tmp_path):
    from slime_common.registry import load_registry
    from slime_ref.assets import make_tiny
    from slime_rehearse.rehearsal import run_smoke

    tiny = make_tiny(tmp_path / "tiny")
    argv = ["--hf-checkpoint", str(tiny.model_dir), "--prompt-data", str(tiny.train_path), "--input-key", "prompt",
            "--label-key", "label", "--apply-chat-template", "--rm-type", "math", "--num-rollout", "100",
            "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--global-batch-size", "32",
            "--rollout-max-response-len", "24", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "256",
            "--colocate", "--actor-num-gpus-per-node", "1"]
    out = Path(__import__("tempfile").mkdtemp(prefix="smm-", dir="/tmp"))  # short: Ray's socket paths
    findings, report = run_smoke(argv, SmokeOptions(out=out, engine="slime-ref", memory=True, rollouts=1,
                                                    registry=load_registry("v0.3.1"), target="v0.3.1", force=True),
                                 None)
    status = {f.id: f.status.name for f in findings}
    assert report["returncode"] == 0, (out / "smoke.log").read_text()[-3000:]
    assert report["response_length"] == [24.0]  # every answer ran to --rollout-max-response-len
    assert report["hooks"]["slime.rollout.sglang_rollout.generate"]["calls"] == 12  # 3 prompts x 4
    # the rollout from the generate marks, training and the weight update from slime-ref's timeline.jsonl
    timeline = report["memory"]["timeline"]
    assert timeline["rollout"] and timeline["train"] and timeline["weights"] and report["memory"]["gpus"] == []
    assert timeline["rollout"][0][1] <= timeline["train"][0][0] <= timeline["train"][0][1] <= timeline["weights"][-1][0]
    assert status["smoke.memory"] == "WARN" and "smoke.truncation" not in status
    assert json.loads((out / "hooks" / "smoke_hooks.json").read_text())["full_length"] is True
    __import__("shutil").rmtree(out, ignore_errors=True)


OOM_STUB = '''import json, sys
print("argv " + json.dumps(sys.argv[1:]), flush=True)
print("ray.exceptions.RayTaskError(OutOfMemoryError): ray::MegatronTrainRayActor.train() (pid=8, ip=127.0.0.1)")
print("Traceback (most recent call last):")
for path, func in (("/root/slime/slime/backends/megatron_utils/actor.py", "train"),
                   ("/root/slime/slime/backends/megatron_utils/actor.py", "train_actor"),
                   ("/root/slime/slime/backends/megatron_utils/model.py", "train_one_step"),
                   ("/usr/lib/python3/dist-packages/torch/nn/functional.py", "cross_entropy")):
    print(f'  File "{path}", line 10, in {func}')
    print("    out = call()")
''' + f"print({TORCH_OOM!r}, flush=True)\nsys.exit(1)\n"


def test_with_slime_a_training_oom_fails_naming_the_step_and_the_missing_gib(tmp_path):
    """--with slime on a stub train.py that prints slime's argv and a training OOM as Ray relays it."""
    from slime_common.registry import load_registry
    from slime_rehearse.rehearsal import run_smoke

    slime_dir = tmp_path / "slime"
    slime_dir.mkdir()
    (slime_dir / "train.py").write_text(OOM_STUB)
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "1+1?", "label": "2"}\n')
    argv = [a if a != "/data/p.jsonl" else str(data) for a in _job(response=2048)]
    out = Path(__import__("tempfile").mkdtemp(prefix="smm-", dir="/tmp"))
    findings, report = run_smoke(argv, SmokeOptions(out=out, engine="slime", memory=True, rollouts=1, force=True,
                                                    slime_dir=slime_dir, env={"RAY_ADDRESS": "127.0.0.1:1"},
                                                    registry=load_registry("v0.3.1"), target="v0.3.1"), None)
    log = (out / "smoke.log").read_text()
    ran = json.loads(next(ln for ln in log.splitlines() if ln.startswith("argv "))[5:])
    assert ran[ran.index("--rollout-max-response-len") + 1] == "2048" and "--num-layers" in ran
    assert ran[ran.index("--custom-generate-function-path") + 1] == "slime_smoke_hooks.h_full_length_generate"
    assert "--check-weight-update-equal" not in ran and "--output-dir" not in ran  # slime has no --output-dir
    oom = next(f for f in findings if f.id == "smoke.memory.oom")
    assert oom.status.name == "FAIL" and "the training step" in oom.finding and "6.77 GiB short" in oom.finding
    assert report["memory"]["oom"]["short_by"] == int(9.27 * GIB) - int(2.50 * GIB)
    __import__("shutil").rmtree(out, ignore_errors=True)


def test_samples_fill_every_data_parallel_rank_evenly():
    from slime_rehearse.smoke_job import memory_sizes, split_flags

    full = {"rollout_batch_size": 32, "n_samples_per_prompt": 6, "max_response_len": 1024}
    items = split_flags(["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--tensor-model-parallel-size",
                         "2", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096",
                         "--rollout-max-prompt-len", "1024"])
    # DP 4; 4096 tokens hold 2 samples of 2048: 8 samples at least, 12 so that 6-sample groups split over 4 ranks
    assert memory_sizes(items, full)[:2] == (2, 6)
    no_dynamic = split_flags(["--actor-num-gpus-per-node", "3", "--micro-batch-size", "2"])
    assert memory_sizes(no_dynamic, {**full, "n_samples_per_prompt": 4})[:2] == (3, 4)  # 12 over DP 3


def test_a_memory_faithful_estimate_scales_by_samples_only(tmp_path):
    from slime_rehearse.rehearsal import estimate

    job = Job("train.py", _job(response=1024, max_tokens=16384), "argv", {})
    opts = SmokeOptions(out=tmp_path, engine="slime", memory=True, rollouts=1)
    shrunk = shrink(job, opts, Path("/models/q"), {"prompt": tmp_path / "p.jsonl"})
    est = estimate({"phase_s": {"rollout": 30.0, "train": 10.0, "update_weights": 2.0}}, shrunk, opts)
    assert est["scale"] == 32 * 8 / (2 * 8)  # the job's 256 samples over the rehearsal's 16, at full length
    assert est["estimated_per_rollout_s"] == 42.0 * 16 and "your model" in est["label"]
