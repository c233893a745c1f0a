"""Shared test setup: offline, loopback-only, and one embedded tiny model per session."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

# Before anything imports transformers or ray: never reach a hub, keep Ray on 127.0.0.1, no telemetry.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every process the tests start inherits this mark (Ray's workers and the engines included), so one
# left behind is found at the end of the session even after its parent has died.
SESSION_MARK = "SLIME_SKILL_TEST_SESSION"
os.environ[SESSION_MARK] = f"{os.getpid()}-{time.time_ns()}"

import psutil  # noqa: E402
import pytest  # noqa: E402


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


TESTS_DIR = Path(__file__).resolve().parent


def _module(item) -> str:
    """A test's file as a path below tests/ ("slime_ref/test_types.py")."""
    return item.path.relative_to(TESTS_DIR).as_posix()


# -- the fast tier ---------------------------------------------------------------------------------
# `pytest -m fast`: math, flags, lint, rewards, findings; no process, no server, no Ray, no engine, no
# Megatron rank. These modules are in it, less the tests named in NOT_FAST. A fast test that starts
# any of those fails (see _Guard), so the tier stays fast as tests are added.
FAST_MODULES = {  # paths below tests/
    "bench/test_bench_decode_roofline.py", "bench/test_bench_gpu_probes.py", "bench/test_bench_memory_fit.py",
    "bench/test_bench_results_table.py",
    "skill/test_skill_claims.py",
    "skill/test_skill_coverage.py", "skill/test_skill_hook_signatures.py", "slime_check/test_eval_config.py",
    "slime_check/test_flag_registries.py", "slime_check/test_hook_check.py", "slime_check/test_outside_services.py",
    "slime_check/test_plan.py", "slime_check/test_plan_adam.py", "slime_check/test_slime_check_config.py",
    "slime_check/test_slime_check_launch_script.py", "slime_check/test_slime_check_prereqs.py",
    "slime_check/test_slime_check_registry.py", "slime_check/test_slime_drift.py", "slime_common/test_arg_rules.py",
    "slime_common/test_fileio.py", "slime_ref/test_algo_advantages.py", "slime_ref/test_algo_kl.py",
    "slime_ref/test_algo_losses.py", "slime_ref/test_arguments.py", "slime_ref/test_assets.py",
    "slime_ref/test_data_source.py", "slime_ref/test_gc_settings.py", "slime_ref/test_ports.py",
    "slime_ref/test_rewards.py", "slime_ref/test_rollout_filters_guard.py",
    "slime_ref/test_rollout_list_generate.py", "slime_ref/test_rollout_metrics.py", "slime_ref/test_tracking.py",
    "slime_ref/test_types.py", "slime_rehearse/test_compat_layouts.py", "slime_rehearse/test_gpu_memory_processes.py",
    "slime_rehearse/test_smoke.py",
    "slime_rehearse/test_smoke_jobs.py", "slime_rehearse/test_smoke_memory.py", "slime_rehearse/test_smoke_verdict.py",
    "test_ci_skips.py",
    "test_module_sizes.py", "test_package_imports.py", "test_readme_install.py",
}
NOT_FAST = {  # tests in FAST_MODULES that start a process or a server (the guard says so)
    "tests/slime_rehearse/test_smoke_memory.py::test_a_split_job_rehearses_each_side_alone_the_trainer_on_the_engines_saved_samples",
    "tests/slime_rehearse/test_smoke.py::test_for_real_slime_the_jobs_own_pythonpath_and_layer_spec_decide_its_package_verdicts",
    "tests/slime_ref/test_arguments.py::test_parsing_flags_does_not_import_torch",
    "tests/bench/test_bench_decode_roofline.py::test_the_cli_sets_measured_rates_against_the_limit_and_refuses_a_bad_value",
    "tests/slime_rehearse/test_compat_layouts.py::test_a_main_hook_importing_slime_observability_rehearses_under_a_main_target",
    "tests/slime_rehearse/test_compat_layouts.py::test_a_v031_import_under_a_main_target_is_reported_as_moved",
    "tests/slime_rehearse/test_compat_layouts.py::test_each_moved_or_removed_module_is_refused_by_name_and_the_target_name_is_served",
    "tests/slime_rehearse/test_compat_layouts.py::test_the_committed_listing_regenerates_byte_identical_from_slimes_source",
    "tests/slime_rehearse/test_compat_layouts.py::test_under_a_v031_target_slime_observability_is_not_in_v031_and_the_v031_name_rehearses",
    "tests/slime_rehearse/test_compat_layouts.py::test_without_a_target_both_names_are_served",
    "tests/slime_check/test_eval_config.py::test_cli_config_reports_the_eval_config_findings",
    "tests/slime_check/test_flag_registries.py::test_checkout_is_read_without_importing_torch_or_slime",
    "tests/slime_check/test_flag_registries.py::test_derivation_needs_sglang_arg_utils_for_a_new_patch_field",
    "tests/slime_check/test_flag_registries.py::test_main_registry_regenerates_byte_identical",
    "tests/slime_check/test_flag_registries.py::test_v031_registry_regenerates_byte_identical",
    "tests/slime_ref/test_gc_settings.py::test_setup_objects_leave_the_collectors_walks_and_garbage_is_still_freed",
    "tests/slime_check/test_hook_check.py::test_a_hook_beside_the_script_is_imported_and_a_broken_one_fails",
    "tests/slime_check/test_hook_check.py::test_an_import_of_the_other_slimes_layout_is_a_layout_fail",
    "tests/slime_check/test_hook_check.py::test_the_hooks_folder_on_the_runtime_env_pythonpath_is_found",
    "tests/slime_check/test_outside_services.py::test_the_preflight_finding_names_the_service",
    "tests/test_package_imports.py::test_prereqs_imports_no_ray_torch_or_trainer",
    "tests/slime_check/test_plan.py::test_a_job_built_to_oom_fails_with_the_knobs_that_fix_it",
    "tests/slime_check/test_plan.py::test_bad_input_is_one_line_naming_the_flag_exit_2[args0-words0]",
    "tests/slime_check/test_plan.py::test_bad_input_is_one_line_naming_the_flag_exit_2[args1-words1]",
    "tests/slime_check/test_plan.py::test_bad_input_is_one_line_naming_the_flag_exit_2[args2-words2]",
    "tests/slime_check/test_plan.py::test_bad_input_is_one_line_naming_the_flag_exit_2[args3-words3]",
    "tests/slime_check/test_plan.py::test_bad_input_is_one_line_naming_the_flag_exit_2[args4-words4]",
    "tests/slime_check/test_plan.py::test_bad_input_is_one_line_naming_the_flag_exit_2[args5-words5]",
    "tests/slime_check/test_plan.py::test_bad_input_is_one_line_naming_the_flag_exit_2[args6-words6]",
    "tests/slime_check/test_plan.py::test_bad_input_is_one_line_naming_the_flag_exit_2[args7-words7]",
    "tests/slime_check/test_plan.py::test_host_ram_from_a_capture_is_judged",
    "tests/slime_check/test_plan.py::test_plan_runs_under_two_seconds_without_importing_torch",
    "tests/slime_check/test_plan.py::test_slimes_qwen3_4b_script_fits_8_h100_with_the_numbers_shown",
    "tests/slime_ref/test_ports.py::test_engines_router_and_rendezvous_ports_are_valid_for_sglang_with_a_high_os_port_range",
    "tests/slime_ref/test_ports.py::test_two_processes_never_get_the_same_port",
    "tests/test_readme_install.py::test_where_it_does_not_answer_the_install_goes_on_from_the_package_index",
    "tests/test_readme_install.py::test_where_the_cpu_index_answers_torch_is_the_cpu_build",
    "tests/slime_ref/test_rewards.py::test_remote_rm_gives_up_with_the_url_in_the_message",
    "tests/slime_ref/test_rewards.py::test_remote_rm_posts_prompt_response_label",
    "tests/slime_ref/test_rewards.py::test_remote_rm_retries_after_a_500_and_after_a_timeout",
    "tests/skill/test_skill_claims.py::test_excerpts_are_verbatim",
    "tests/skill/test_skill_claims.py::test_w1_log_summary_checks_kl_loss_at_step_0",
    "tests/skill/test_skill_coverage.py::test_coverage_excerpts_are_verbatim_slime_v031",
    "tests/slime_check/test_slime_check_config.py::test_cli_config_argv_mode",
    "tests/slime_check/test_slime_check_config.py::test_cli_config_exit_codes",
    "tests/slime_check/test_slime_check_config.py::test_cli_prereqs_exit_codes",
    "tests/slime_check/test_slime_check_prereqs.py::test_probe_failures_become_outputs",
    "tests/slime_check/test_slime_check_prereqs.py::test_this_machine_gives_a_verdict_for_every_check",
    "tests/slime_check/test_slime_check_registry.py::test_patch_text_applies_only_the_target_file",
    "tests/slime_check/test_slime_drift.py::test_config_main_script_judged_as_main",
    "tests/slime_check/test_slime_drift.py::test_config_main_script_judged_as_v031_fails_naming_v031",
    "tests/slime_check/test_slime_drift.py::test_config_with_a_main_tree_as_slime_dir",
    "tests/slime_check/test_slime_drift.py::test_config_without_a_slime_judges_the_newest_and_says_so",
    "tests/slime_check/test_slime_drift.py::test_smoke_for_main_on_slime_ref_names_the_drift_and_rehearses_the_rest",
    "tests/slime_rehearse/test_smoke.py::test_a_hook_that_fails_to_import_stops_before_the_run",
    "tests/slime_rehearse/test_smoke.py::test_compat_layer_provides_slimes_hook_imports_and_names_a_missing_one",
    "tests/slime_rehearse/test_smoke.py::test_kl_loss_without_ref_load_stops_before_the_run",
    "tests/slime_rehearse/test_smoke.py::test_missing_data_key_stops_before_the_run",
    "tests/slime_rehearse/test_smoke.py::test_usage_errors_exit_2_without_a_traceback",
    "tests/slime_rehearse/test_smoke.py::test_with_slime_hooks_on_the_jobs_runtime_env_pythonpath_import",
    "tests/slime_rehearse/test_smoke.py::test_with_slime_reads_rewards_and_truncation_from_slimes_log_lines",
    "tests/slime_rehearse/test_smoke.py::test_with_slime_runs_train_py_with_the_rewritten_argv_and_reads_its_log",
    "tests/slime_rehearse/test_smoke.py::test_with_slime_starts_a_ray_head_of_its_own_and_stops_it",
    "tests/slime_rehearse/test_smoke.py::test_with_slime_timeout_stops_exactly_what_it_started",
    "tests/slime_rehearse/test_smoke_jobs.py::test_ray_starts_under_any_out_path[42]",
    "tests/slime_rehearse/test_smoke_memory.py::test_a_memory_faithful_rehearsal_forces_every_answer_to_full_length",
    "tests/slime_rehearse/test_smoke_memory.py::test_memory_without_a_gpu_is_a_usage_error_naming_the_flag",
    "tests/slime_rehearse/test_smoke_memory.py::test_with_slime_a_training_oom_fails_naming_the_step_and_the_missing_gib",
    "tests/slime_rehearse/test_smoke_jobs.py::test_ray_starts_under_any_out_path[47]",
    "tests/slime_rehearse/test_smoke_verdict.py::test_coverage_measures_a_hook_on_a_thread_started_before_the_hooks_import",
    "tests/slime_ref/test_tracking.py::test_plot_without_metrics_exits_2",
    "tests/slime_ref/test_tracking.py::test_plot_writes_png",
    "tests/slime_ref/test_tracking.py::test_wandb_offline",
}


class _Guard:
    """While a fast test (its fixtures included) runs: starting a process, listening on a socket,
    starting Ray or a torch.distributed group raises, naming the test's tier."""

    def __init__(self):
        import socket
        import subprocess

        self.targets = [(subprocess.Popen, "_execute_child"), (socket.socket, "listen"), (os, "fork"),
                        (os, "posix_spawn")]
        self.saved = []

    def __enter__(self):
        def refuse(*args, **kwargs):
            raise AssertionError("a fast-tier test (pytest -m fast) may not start a process or a server; "
                                 "add it to NOT_FAST in tests/conftest.py, or make it not start one")

        for owner, name in self.targets:
            self.saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, refuse)
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved.clear()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _module(item) in FAST_MODULES and item.nodeid not in NOT_FAST and "slow" not in item.keywords:
            item.add_marker(pytest.mark.fast)
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (gpu marker); this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _guarded(item):
    """The guard for a fast test (its fixtures' set-up included), else nothing."""
    return _Guard() if item.get_closest_marker("fast") is not None else contextlib.nullcontext()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _guarded(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _guarded(item):
        yield


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """The embedded default (seed 0), built once per test session."""
    from slime_ref.assets import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny") / "assets", seed=0)


# -- processes left behind --------------------------------------------------------------------------
# A test stops what it starts. Whatever still runs at the end of the session is listed in the
# summary with the test at whose end it was first seen running, then stopped by pid.

LEFTOVER_GRACE_S = 15  # a process told to stop by the last test's teardown may still be exiting
# helpers that a library starts for the test process itself, which end with it, not with a test
# (torch.compile's worker pool is kept for the process's later compiles and stopped at its exit)
_OWN_HELPERS = ("torch_shm_manager", "multiprocessing.resource_tracker", "multiprocessing.forkserver",
                "torch/_inductor/compile_worker")
_pids_running = set(psutil.pids())  # as the last test ended
_first_seen_after: dict[int, str] = {}  # pid -> the test at whose end it was new
_leftovers: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _pids_running
    yield
    running = set(psutil.pids())  # a listing of /proc: about a millisecond
    for pid in running - _pids_running:
        _first_seen_after[pid] = item.nodeid
    _pids_running = running


def _marked_processes() -> list[psutil.Process]:
    mark, found = os.environ[SESSION_MARK], []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE or proc.environ().get(SESSION_MARK) != mark:
                continue
            if proc.ppid() == os.getpid() and any(h in " ".join(proc.cmdline()) for h in _OWN_HELPERS):
                continue
            found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def pytest_sessionfinish(session):
    _, alive = psutil.wait_procs(_marked_processes(), timeout=LEFTOVER_GRACE_S)
    for proc in alive:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:  # exited; its parent, if left too, is named
                continue
            started = _first_seen_after.get(proc.pid, "no test (after the last one ended)")
            line = f"pid {proc.pid} {' '.join(proc.cmdline())[:120]!r}, started during {started}"
            proc.kill()
        except psutil.NoSuchProcess:
            continue
        _leftovers.append(line)


def pytest_terminal_summary(terminalreporter):
    if _leftovers:
        terminalreporter.write_sep("=", f"{len(_leftovers)} process(es) left behind by the tests, now killed",
                                   yellow=True)
        for line in _leftovers:
            terminalreporter.write_line(line)
