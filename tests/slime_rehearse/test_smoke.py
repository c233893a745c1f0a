"""slime-check smoke: the shrunk job, the log signatures, the slime compatibility layer, the checks that
stop a broken job before it starts, the --with slime launcher (a stub train.py), and end-to-end
rehearsals on slime-ref of launch scripts whose hooks import slime.* (slow)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from slime_check.findings import Status
from slime_check.log_signatures import scan
from slime_rehearse.smoke_job import Job, SmokeOptions, last, shrink, split_flags

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures" / "smoke"
REPO = TESTS.parent
CLI = [sys.executable, "-c", "from slime_rehearse.cli import main; main()"]


def _env(**extra) -> dict:
    return {**os.environ, "COLUMNS": "200", "PYTHONPATH": os.pathsep.join(
        [str(REPO / "reference_impl"), os.environ.get("PYTHONPATH", "")]), **extra}


def smoke(*args, cwd=None, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "smoke", *args], capture_output=True, text=True, timeout=timeout, env=_env(), cwd=cwd)


def ids(report: dict, status: str | None = None) -> list[str]:
    return [f["id"] for f in report["findings"] if status is None or f["status"] == status]


@pytest.fixture
def short_tmp():
    # short: Ray's socket paths under OUT/ray must fit 107 bytes
    path = Path(tempfile.mkdtemp(prefix="sm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny():
    from slime_ref.assets import make_tiny

    root = Path(tempfile.mkdtemp(prefix="smt-", dir="/tmp"))
    yield make_tiny(root / "tiny")
    shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# shrinking


FULL = ["--hf-checkpoint", "/models/Qwen3-4B", "--load", "/ckpt/run", "--save", "/ckpt/run", "--save-interval", "20",
        "--prompt-data", "/data/train.jsonl", "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--num-rollout", "3000", "--rollout-batch-size", "32", "--n-samples-per-prompt", "8",
        "--global-batch-size", "128", "--num-steps-per-rollout", "2", "--rollout-max-response-len", "8192",
        "--custom-rm-path", "my.rm.fn", "--use-kl-loss", "--kl-loss-coef", "0.01", "--ref-load", "/ckpt/ref",
        "--num-layers", "36", "--hidden-size", "2560", "--tensor-model-parallel-size", "2", "--colocate",
        "--use-wandb", "--wandb-project", "p", "--eval-prompt-data", "aime", "/data/aime.jsonl",
        "--eval-interval", "10"]


def test_shrink_keeps_the_job_and_changes_only_its_size(tmp_path):
    opts = SmokeOptions(out=tmp_path)
    data = {"prompt": tmp_path / "data" / "prompt.jsonl", "eval": [("aime", tmp_path / "data" / "eval-aime.jsonl")]}
    shrunk = shrink(Job("train.py", FULL, "x", {}), opts, tmp_path / "model", data)
    items = split_flags(shrunk.argv)
    get = lambda name: last(items, name)  # noqa: E731
    rbs, n, gbs, steps = (int(get(f)[0]) for f in ("--rollout-batch-size", "--n-samples-per-prompt",
                                                     "--global-batch-size", "--num-steps-per-rollout"))
    assert rbs * n == gbs * steps and rbs == 2 and steps == 2
    assert get("--num-rollout") == ["2"] and get("--rollout-max-response-len") == ["32"]
    assert get("--check-weight-update-equal") == [] and get("--wandb-mode") == ["offline"]
    # saves under --out; the user's checkpoint folders appear nowhere
    assert get("--save") == [str(tmp_path / "save")]
    assert "/ckpt/run" not in shrunk.argv and "/ckpt/ref" not in shrunk.argv
    # what the job is stays: chat template, keys, KL loss, colocate, the hook (wrapped to count calls)
    for flag in ("--apply-chat-template", "--use-kl-loss", "--colocate"):
        assert get(flag) == []
    assert get("--input-key") == ["prompt"] and get("--kl-loss-coef") == ["0.01"]
    assert get("--custom-rm-path")[0].startswith("slime_smoke_hooks.")
    assert list(shrunk.hooks.values()) == [("--custom-rm-path", "my.rm.fn")]
    assert get("--num-layers") is None and get("--tensor-model-parallel-size") == ["1"]
    assert get("--eval-prompt-data") == ["aime", str(tmp_path / "data" / "eval-aime.jsonl")]


def test_shrink_for_real_slime_keeps_model_args_and_layout(tmp_path):
    opts = SmokeOptions(out=tmp_path, engine="slime")
    shrunk = shrink(Job("train.py", FULL, "x", {}), opts, Path("/models/Qwen3-4B"), {"prompt": tmp_path / "p.jsonl"})
    items = split_flags(shrunk.argv)
    assert last(items, "--num-layers") == ["36"] and last(items, "--tensor-model-parallel-size") == ["2"]
    assert last(items, "--ref-load") == ["/ckpt/ref"] and last(items, "--save") == [str(tmp_path / "save")]


def test_for_real_slime_the_jobs_own_pythonpath_and_layer_spec_decide_its_package_verdicts(tmp_path):
    """The smoke judges the job's environment: Megatron-LM from the PYTHONPATH the job gives its
    processes, and TransformerEngine as optional where the job runs local layers with its own --spec."""
    from slime_rehearse.rehearsal import check_findings

    checkout = tmp_path / "Megatron-LM" / "megatron"
    (checkout / "training").mkdir(parents=True)
    (checkout / "training" / "arguments.py").write_text("")
    opts = SmokeOptions(out=tmp_path, engine="slime", env={"PYTHONPATH": str(checkout.parent)})
    plain = {f.id: f for f in check_findings(Job("train.py", ["--lr", "1e-6"], "x", {}), [], opts)}
    assert plain["packages.megatron"].status is Status.PASS and str(checkout) in plain["packages.megatron"].finding
    assert plain["packages.transformer_engine"].status is Status.FAIL  # none here; the default impl needs it
    spec = ["--transformer-impl", "local", "--spec", "my_spec", "layer_spec"]
    own = {f.id: f for f in check_findings(Job("train.py", spec, "x", {}), [], opts)}
    assert own["packages.transformer_engine"].status is Status.WARN
    assert "its own --spec" in own["packages.transformer_engine"].finding


# ---------------------------------------------------------------------------------------------
# log signatures (excerpts in slime's and SGLang's formats)


LOGS = {
    "smoke.log.placement_group": "Waiting for placement group of 16 GPUs (elapsed 60s): 8 GPUs registered with Ray, "
                                 "8 available.",
    "smoke.log.cuda_graph": "(SGLangEngine pid=4121) Exception: Capture cuda graph failed: CUDA out of memory. "
                            "Tried to allocate 2.00 GiB",
    "smoke.log.train_oom": "(MegatronTrainRayActor pid=812) torch.OutOfMemoryError: CUDA out of memory. Tried to "
                           "allocate 9.27 GiB. GPU 0 has a total capacity of 79.11 GiB",
    "smoke.log.nccl_timeout": "[rank0]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: "
                              "WorkNCCL(SeqNum=12, OpType=BROADCAST, NumelIn=1, Timeout(ms)=600000) ran for 600094 ms",
    "smoke.log.engine_exit": "ray::SGLangEngine.init() Exception: Server process terminated unexpectedly.",
    "smoke.log.hook_import": "\x1b[36m(RolloutManager pid=77)\x1b[0m ModuleNotFoundError: No module named 'my_rewards'",
    "smoke.log.numpy2": "AssertionError: Megatron does not support numpy 2.x",
    "smoke.log.te_missing": "ValueError: apply_rope_fusion is not available. Please install TE >= 1.4.",
    "smoke.log.te_layer_names": "KeyError: \"Unsupported Qwen/Llama Megatron parameter "
                                "'decoder.layers.0.input_layernorm.weight'\"",
    "smoke.log.data_key": "(RolloutManager pid=77) KeyError: 'question'",
    "smoke.log.weight_check": "(SGLangEngine pid=4121) check tensor equality failed: name=model.layers.0.mlp "
                              "max_abs_err=0.5",
    "smoke.log.nan": "(MegatronTrainRayActor pid=812) RuntimeError: Rank 0: found NaN in local grad norm for bucket #0 "
                     "in backward pass before data-parallel communication collective",
    "smoke.log.ray_start": "Exception: The current node timed out during startup. This could happen because some "
                           "of the raylet failed to startup or the GCS has become overloaded.",
    "smoke.log.router_unreachable": "(RolloutManager pid=77) Max retries (60) reached, failing... "
                                    "(url=http://10.0.0.1:3000/generate)",
    "smoke.log.ray_auth": "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token "
                          "is missing or incorrect.",
}


@pytest.mark.parametrize("expected", sorted(LOGS))
def test_each_log_signature_gives_its_finding(expected):
    found = scan("INFO something normal\n" + LOGS[expected] + "\nINFO more\n")
    assert expected in [f.id for f in found]
    mine = next(f for f in found if f.id == expected)
    assert mine.status is Status.FAIL and mine.fix and mine.doc.startswith("https://github.com/THUDM/slime/blob/v0.3.1/")


def test_one_oom_is_reported_once_by_its_most_specific_signature():
    found = [f.id for f in scan(LOGS["smoke.log.cuda_graph"])]
    assert found == ["smoke.log.cuda_graph"]


REAL_LOGS = Path(__file__).parents[1] / "fixtures" / "slime_logs"


@pytest.mark.parametrize(("log", "expected"), [("h200-numpy2", "smoke.log.numpy2"),
                                               ("h200-rope-fusion", "smoke.log.te_missing"),
                                               ("h200-local-layer-names", "smoke.log.te_layer_names"),
                                               ("h200-ray-auth-token", "smoke.log.ray_auth")])
def test_a_real_slime_log_gives_exactly_the_failure_that_stopped_it(log, expected):
    text = gzip.decompress((REAL_LOGS / f"{log}.log.gz").read_bytes()).decode()
    assert [f.id for f in scan(text)] == [expected]


@pytest.mark.parametrize("log", ["h200-template-3-rollouts", "h200-smoke"])
def test_a_real_slime_run_that_went_through_gives_no_log_finding(log):
    text = gzip.decompress((REAL_LOGS / f"{log}.log.gz").read_bytes()).decode()
    assert scan(text) == []


def test_a_real_slime_hook_that_does_not_import_is_named_from_its_log():
    text = gzip.decompress((REAL_LOGS / "h200-smoke-bad-hook.log.gz").read_bytes()).decode()
    (found,) = scan(text)
    assert found.id == "smoke.log.hook_import" and "no_such_module" in found.finding


def test_real_slime_log_metrics_give_rewards_and_groups_with_equal_rewards():
    from slime_rehearse.rehearsal import slime_log_metrics
    from slime_rehearse.smoke_job import Shrunk
    from slime_rehearse.smoke_verdict import verdict

    text = gzip.decompress((REAL_LOGS / "h200-smoke.log.gz").read_bytes()).decode()
    metrics = slime_log_metrics(text, groups=2)  # the smoke's --rollout-batch-size 2
    assert [m["rollout_id"] for m in metrics] == [0, 1]
    assert [m["rollout/raw_reward"] for m in metrics] == [0.0, 0.0]
    assert [m["rollout/zero_std_ratio"] for m in metrics] == [1.0, 1.0]  # 'rollout/zero_std/count_0': 2
    assert [m["rollout/response_length"] for m in metrics] == [32.0, 32.0]
    shrunk = Shrunk(argv=[], changes=[], hooks={}, notes=[], user_max_len=4096, full={})
    found = verdict({"returncode": 0, "log": text, "metrics": metrics, "wall_s": 296}, shrunk,
                    SmokeOptions(out=Path("/nonexistent")))
    reward = next(f for f in found if f.id == "smoke.reward")
    assert reward.status is Status.WARN and "equal within every group" in reward.finding
    assert next(f for f in found if f.id == "smoke.weight_update").status is Status.PASS
    # without the group count, slime's log cannot say whether rewards varied: no claim either way
    unknown = verdict({"returncode": 0, "log": text, "metrics": slime_log_metrics(text), "wall_s": 296}, shrunk,
                      SmokeOptions(out=Path("/nonexistent")))
    assert next(f for f in unknown if f.id == "smoke.reward").finding.startswith("rewards logged:")


def test_each_side_of_a_real_split_job_is_judged_on_what_that_side_logs():
    """slime v0.3.1 on one H100 (bench/gpu/memory_fit.py q06-1k-8k-split): the engines alone log their
    lengths but no rewards (slime's trainer logs those), the trainer alone logs its samples' mean length."""
    from slime_rehearse.rehearsal import slime_log_metrics
    from slime_rehearse.smoke_job import FULL_LENGTH_HOOK, Shrunk
    from slime_rehearse.smoke_verdict import verdict

    def side(name):
        return gzip.decompress((TESTS / "fixtures" / "gpu_memory" / f"h100-slime-q06-1k-8k-split-{name}.log.gz")
                               .read_bytes()).decode()

    engines, trainer = slime_log_metrics(side("engines"), groups=1), slime_log_metrics(side("trainer"), groups=1)
    assert [m["rollout/response_length"] for m in engines] == [1024.0] and "rollout/raw_reward" not in engines[0]
    assert [m["rollout/response_length"] for m in trainer] == [1024.0] and trainer[0]["rollout/raw_reward"] == 0.0
    wrapper = {FULL_LENGTH_HOOK: {"flag": "--custom-generate-function-path",
                                  "path": "slime.rollout.sglang_rollout.generate", "errors": 0, "first_error": None}}
    opts = SmokeOptions(out=Path("/nonexistent"), memory=True)

    def findings(text, metrics, flag, calls):
        shrunk = Shrunk(argv=[flag, "x"], changes=[], hooks={}, notes=[], user_max_len=1024, full={})
        hooks = {k: {**v, "calls": calls} for k, v in wrapper.items()}
        return {f.id: f for f in verdict({"returncode": 0, "log": text, "metrics": metrics, "hooks": hooks,
                                          "wall_s": 200}, shrunk, opts)}

    alone = findings(side("engines"), engines, "--debug-rollout-only", 8)
    assert alone["smoke.reward"].status is Status.SKIP and "--debug-rollout-only" in alone["smoke.reward"].finding
    wrapped = alone["smoke.hook_calls"]
    assert wrapped.status is Status.PASS and "wrapped by the smoke" in wrapped.finding
    # the trainer generates nothing: the smoke's own wrapper going uncalled is no finding
    trained = findings(side("trainer"), trainer, "--load-debug-rollout-data", 0)
    assert "smoke.hook_calls" not in trained and "smoke.reward" not in trained


def test_normal_lines_are_not_findings():
    benign = ("[torch_memory_saver.cpp] cuMemCreate CUDA_ERROR_OUT_OF_MEMORY (may not be an issue e.g. torch "
              "allocator will free cache and retry)\nAbort request for SGLang server http://10.0.0.1:3001\n"
              '"GET /health HTTP/1.1" 200 OK\n'
              # a real SGLang 0.5.15.post1 engine's notes on optional kernels and routes at start-up
              "\x1b[36m(SGLangEngine pid=3036)\x1b[0m [2026-12-01 23:21:02] Ignore import error when loading "
              "sglang.srt.models.deepseek_v2: No module named 'cutlass'\n"
              "\x1b[36m(SGLangEngine pid=3036)\x1b[0m flashinfer.comm allreduce_fusion API is not available (No "
              "module named 'cuda.tile'), falling back to standard implementation\n"
              "\x1b[36m(SGLangEngine pid=3036)\x1b[0m [2026-12-01 23:22:18] OpenAI Responses API (/v1/responses) "
              "disabled: OpenAIServingResponses init failed (ModuleNotFoundError: No module named 'openai_harmony')\n")
    assert scan(benign) == []


# ---------------------------------------------------------------------------------------------
# the slime compatibility layer


def test_compat_layer_provides_slimes_hook_imports_and_names_a_missing_one():
    from slime_rehearse.compat import ROOT

    code = ("from slime.utils.types import Sample\nfrom slime.utils.http_utils import post\n"
            "from slime.rollout.sglang_rollout import GenerateState\n"
            "from slime.rollout.rm_hub import batched_async_rm\n"
            "from slime.utils.misc import load_function\n"
            "from slime.rollout.filter_hub.dynamic_sampling_filters import check_reward_nonzero_std\n"
            "from slime.rollout.data_source import RolloutDataSourceWithBuffer\n"
            "try:\n    from slime.utils.types import Nope\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_env(PYTHONPATH=os.pathsep.join([str(ROOT), str(REPO / "reference_impl")])))
    assert done.returncode == 0, done.stderr
    assert "slime.utils.types.Nope is not provided by slime-check's slime compatibility layer" in done.stdout


# ---------------------------------------------------------------------------------------------
# checks that stop a broken job before anything starts (no run: seconds)


def _script(tmp: Path, tiny, *extra: str, rm="smoke_hooks.reward.boxed_match") -> Path:
    text = (FIXTURES / "run-hooks.sh").read_text()
    script = tmp / "run.sh"
    script.write_text(text.replace('SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"',
                                   f'SCRIPT_DIR="{FIXTURES}"')
                      .replace("   --rollout-temperature 1.0\n", "   --rollout-temperature 1.0\n" +
                               "".join(f"   {e}\n" for e in extra)))
    return script


def _run_json(script: Path, tiny, out: Path, *env: str, timeout=900):
    done = smoke(str(script), "--out", str(out), "--json", "--env", f"TINY={tiny.root}", "--env",
                 f"SAVE_DIR={out.parent / 'user-ckpt'}", *[x for e in env for x in ("--env", e)], timeout=timeout)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-4000:]
    return done, json.loads(done.stdout) if done.stdout.strip().startswith("{") else None


def test_missing_data_key_stops_before_the_run(short_tmp, tiny):
    done, report = _run_json(_script(short_tmp, tiny, "--label-key answer"), tiny, short_tmp / "out")
    assert done.returncode == 1
    assert "config.data" in ids(report, "FAIL") and "stopped" in report["run"]
    assert not (short_tmp / "out" / "smoke.log").exists()


def test_kl_loss_without_ref_load_stops_before_the_run(short_tmp, tiny):
    done, report = _run_json(_script(short_tmp, tiny, "--use-kl-loss", "--kl-loss-coef 0.01"), tiny, short_tmp / "o")
    assert done.returncode == 1 and "config.kl" in ids(report, "FAIL")


def test_a_hook_that_fails_to_import_stops_before_the_run(short_tmp, tiny):
    done, report = _run_json(_script(short_tmp, tiny), tiny, short_tmp / "out", "RM=smoke_hooks.broken.reward")
    assert done.returncode == 1
    failed = [f for f in report["findings"] if f["id"] == "smoke.hook_import" and f["status"] == "FAIL"]
    assert len(failed) == 1 and "SampleThatDoesNotExist" in failed[0]["finding"]
    assert "compatibility layer" in failed[0]["finding"]
    assert not (short_tmp / "user-ckpt").exists()


def test_usage_errors_exit_2_without_a_traceback(tmp_path):
    done = smoke(str(tmp_path / "missing.sh"), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and "no such script" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------------
# --with slime: the launcher, on a stub train.py (no GPU, no slime)


STUB = '''import json, os, subprocess, sys, time
print("argv " + json.dumps(sys.argv[1:]), flush=True)
print("env " + json.dumps({k: os.environ.get(k) for k in ("RAY_ADDRESS", "PYTHONPATH", "WANDB_MODE", "MY_VAR")}),
      flush=True)
mode = os.environ.get("STUB_MODE", "fail")
if mode == "fail":
    print("Waiting for placement group of 8 GPUs (elapsed 30s): 1 GPUs registered with Ray, 1 available.", flush=True)
    sys.exit(1)
if mode == "metrics":  # slime's metric lines (slime/ray/rollout.py, backends/megatron_utils/data.py)
    for i, (reward, truncated, length) in enumerate(((0.25, 1.0, 32.0), (0.5, 0.5, 30.0))):
        print(f"\x1b[36m(RolloutManager pid=7)\x1b[0m [2026-12-01 23:40:0{i}] rollout.py:1306 - perf {i}: "
              f"{{'rollout/response_len/mean': {length}, 'rollout/truncated_ratio': {truncated}, "
              f"'perf/rollout_time': 3.2}}")
        print(f"\x1b[36m(MegatronTrainRayActor pid=8)\x1b[0m [2026-12-01 23:40:0{i}] data.py:363 - rollout {i}: "
              f"{{'rollout/raw_reward': {reward}, 'rollout/log_probs': -11.9}}")
        print(f"\x1b[36m(MegatronTrainRayActor pid=8)\x1b[0m [2026-12-01 23:40:0{i}] model.py:700 - step {i}: "
              "{'train/pg_loss': 0.0, 'train/grad_norm': 1.5}", flush=True)
    sys.exit(0)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["STUB_PIDS"], "w") as fh:
    fh.write(f"{os.getpid()} {child.pid}")
time.sleep(600)
'''


def _stub_slime(tmp: Path) -> Path:
    slime_dir = tmp / "slime"
    slime_dir.mkdir()
    (slime_dir / "train.py").write_text(STUB)
    return slime_dir


def _argv_job(tiny) -> list[str]:
    return ["--hf-checkpoint", str(tiny.model_dir), "--prompt-data", str(tiny.train_path), "--input-key", "prompt",
            "--label-key", "label", "--rm-type", "math", "--num-rollout", "100", "--rollout-batch-size", "8",
            "--n-samples-per-prompt", "4", "--global-batch-size", "32", "--num-layers", "2", "--hidden-size", "128",
            "--ffn-hidden-size", "384", "--num-attention-heads", "4", "--group-query-attention",
            "--num-query-groups", "2", "--kv-channels", "32", "--swiglu", "--rotary-base", "10000",
            "--vocab-size", "256", "--normalization", "RMSNorm", "--qk-layernorm", "--colocate",
            "--actor-num-gpus-per-node", "1"]


def test_with_slime_runs_train_py_with_the_rewritten_argv_and_reads_its_log(short_tmp, tiny):
    slime_dir = _stub_slime(short_tmp)
    out = short_tmp / "out"
    done = subprocess.run([*CLI, "smoke", "--with", "slime", "--slime-dir", str(slime_dir), "--force", "--json",
                           "--out", str(out), "--env", "MY_VAR=1", "--", *_argv_job(tiny)],
                          capture_output=True, text=True, timeout=300, env=_env(RAY_ADDRESS="127.0.0.1:1"))
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert done.returncode == 1
    assert "smoke.log.placement_group" in ids(report, "FAIL") and "smoke.run" in ids(report, "FAIL")
    log = (out / "smoke.log").read_text()
    argv = json.loads(next(ln for ln in log.splitlines() if ln.startswith("argv "))[5:])
    env = json.loads(next(ln for ln in log.splitlines() if ln.startswith("env "))[4:])
    assert env["RAY_ADDRESS"] == "127.0.0.1:1"  # a given cluster is used, no head of our own
    assert env["WANDB_MODE"] == "offline" and env["MY_VAR"] == "1"
    assert argv[argv.index("--num-rollout") + 1] == "2" and "--check-weight-update-equal" in argv
    assert argv[argv.index("--num-layers") + 1] == "2"  # MODEL_ARGS reach the real train.py
    from slime_common.registry import load_registry

    assert [f for f in argv if f.startswith("--") and load_registry().lookup(f) is None] == []  # slime's flags only
    assert (out / "smoke-command.sh").read_text().count("train.py") == 1


def test_with_slime_hooks_on_the_jobs_runtime_env_pythonpath_import(short_tmp, tiny):
    # slime's scripts put hook folders on PYTHONPATH in `ray job submit --runtime-env-json`, not in the shell
    slime_dir = _stub_slime(short_tmp)
    hooks = short_tmp / "my_hooks"
    (hooks / "arith_rm").mkdir(parents=True)
    (hooks / "arith_rm" / "__init__.py").write_text("async def reward(args, sample, **kwargs):\n    return 1.0\n")
    argv = " ".join(_argv_job(tiny))
    script = short_tmp / "run.sh"
    script.write_text(f'RUNTIME_ENV_JSON=\'{{"env_vars": {{"PYTHONPATH": "{hooks}"}}}}\'\n'
                      f'ray job submit --address=http://127.0.0.1:8265 --runtime-env-json="$RUNTIME_ENV_JSON" '
                      f"-- python3 {slime_dir}/train.py {argv} --custom-rm-path arith_rm.reward\n")
    out = short_tmp / "out"
    done = subprocess.run([*CLI, "smoke", str(script), "--with", "slime", "--slime-dir", str(slime_dir), "--force",
                           "--json", "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env=_env(RAY_ADDRESS="127.0.0.1:1"))
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert "smoke.hook_import" in ids(report, "PASS") and "smoke.hook_import" not in ids(report, "FAIL")
    log = (out / "smoke.log").read_text()
    env = json.loads(next(ln for ln in log.splitlines() if ln.startswith("env "))[4:])
    assert str(hooks) in env["PYTHONPATH"].split(os.pathsep)


def test_with_slime_reads_rewards_and_truncation_from_slimes_log_lines(short_tmp, tiny):
    slime_dir = _stub_slime(short_tmp)
    done = subprocess.run([*CLI, "smoke", "--with", "slime", "--slime-dir", str(slime_dir), "--force", "--json",
                           "--out", str(short_tmp / "out"), "--", *_argv_job(tiny)], capture_output=True, text=True,
                          timeout=300, env=_env(RAY_ADDRESS="127.0.0.1:1", STUB_MODE="metrics"))
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout)
    run = report["run"]
    assert run["rewards"] == [0.25, 0.5] and run["truncated_ratio"] == [1.0, 0.5]
    assert run["response_length"] == [32.0, 30.0]
    assert "smoke.run" in ids(report, "PASS") and "smoke.reward" not in ids(report, "WARN")


def test_ray_auth_mode_is_decided_once_for_the_head_and_its_clients(tmp_path):
    from slime_rehearse.smoke_launch import ray_auth_env

    token = tmp_path / "auth_token"
    assert ray_auth_env({"HOME": str(tmp_path)}) == {}
    assert ray_auth_env({"HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled"}) == {"RAY_AUTH_MODE": "disabled"}
    token.write_text("0" * 64)
    assert ray_auth_env({"HOME": str(tmp_path), "RAY_AUTH_TOKEN_PATH": str(token)}) == {"RAY_AUTH_MODE": "token"}
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("0" * 64)  # what any local ray.init() leaves behind
    assert ray_auth_env({"HOME": str(tmp_path)}) == {"RAY_AUTH_MODE": "token"}


@pytest.mark.slow
def test_a_token_protected_smoke_head_is_joined_by_its_client(short_tmp):
    """Ray turns on token auth for `ray start --head` when a token file exists; slime's train.py joins
    by RAY_ADDRESS and must be given the mode too, or it is refused (seen on the H200)."""
    from slime_rehearse.smoke_launch import start_ray_head

    token = short_tmp / "auth_token"
    token.write_text("a1" * 32)
    env = {k: v for k, v in _env(RAY_AUTH_TOKEN_PATH=str(token), RAY_USAGE_STATS_ENABLED="0").items()
           if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    head = start_ray_head(short_tmp, env)
    try:
        assert head.client_env["RAY_AUTH_MODE"] == "token"
        join = [sys.executable, "-c", "import ray; ray.init(); print('CPUS', ray.cluster_resources()['CPU'])"]
        joined = subprocess.run(join, capture_output=True, text=True, timeout=120, env={**env, **head.client_env})
        assert joined.returncode == 0 and "CPUS" in joined.stdout, joined.stderr[-2000:]
        refused = subprocess.run(join, capture_output=True, text=True, timeout=120,
                                 env={**env, "RAY_ADDRESS": head.address})
        assert refused.returncode != 0 and "AuthenticationError" in refused.stderr
    finally:
        head.stop()


def test_with_slime_timeout_stops_exactly_what_it_started(short_tmp, tiny):
    slime_dir = _stub_slime(short_tmp)
    out = short_tmp / "out"
    pids_file = short_tmp / "pids"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        done = subprocess.run([*CLI, "smoke", "--with", "slime", "--slime-dir", str(slime_dir), "--force", "--json",
                               "--timeout", "8", "--out", str(out), "--", *_argv_job(tiny)],
                              capture_output=True, text=True, timeout=300,
                              env=_env(RAY_ADDRESS="127.0.0.1:1", STUB_MODE="hang", STUB_PIDS=str(pids_file)))
        report = json.loads(done.stdout)
        assert done.returncode == 1 and "did not finish" in next(
            f["finding"] for f in report["findings"] if f["id"] == "smoke.run")
        for pid in map(int, pids_file.read_text().split()):
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert bystander.poll() is None  # a process it did not start is left alone
    finally:
        bystander.kill()


# ---------------------------------------------------------------------------------------------
# end to end on slime-ref (slow: each run takes 1-3 minutes on 2 CPU cores)


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(f"{proc.pid} {' '.join(proc.info['cmdline'])[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _listing(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.mark.slow
def test_hooks_written_for_slime_run_on_slime_ref_and_report_their_calls(short_tmp, tiny):
    before_fixtures, before_tiny = _listing(FIXTURES), _listing(tiny.root)
    done, report = _run_json(_script(short_tmp, tiny), tiny, short_tmp / "out")
    assert done.returncode == 0, json.dumps(report, indent=1)[-4000:] if report else done.stderr[-4000:]
    hooks = report["run"]["hooks"]
    for path in ("smoke_hooks.tool_loop.generate", "smoke_hooks.reward.boxed_match",
                 "smoke_hooks.filters.drop_empty_groups", "smoke_hooks.data.FirstPromptsFirst"):
        assert hooks[path]["calls"] > 0 and hooks[path]["errors"] == 0, hooks
    assert report["run"]["compat_slime"] is True
    assert report["run"]["weight_check_max_abs_diff"]
    assert "smoke.weight_update" in ids(report, "PASS")
    # writes only under --out; the user's checkpoint folder is never created
    assert not (short_tmp / "user-ckpt").exists()
    assert _listing(FIXTURES) == before_fixtures and _listing(tiny.root) == before_tiny
    assert _processes_mentioning(str(short_tmp)) == []


@pytest.mark.slow
def test_a_rollout_function_path_rollout_runs(short_tmp, tiny):
    done = smoke(str(FIXTURES / "run-rollout-fn.sh"), "--out", str(short_tmp / "out"), "--json",
                 "--env", f"TINY={tiny.root}")
    report = json.loads(done.stdout)
    assert done.returncode == 0, json.dumps(report["findings"], indent=1)[-3000:]
    assert report["run"]["hooks"]["smoke_hooks.rollout.generate_rollout"]["calls"] >= 2


@pytest.mark.slow
def test_a_hook_raising_on_one_sample_is_a_finding_not_a_traceback(short_tmp, tiny):
    done, report = _run_json(_script(short_tmp, tiny), tiny, short_tmp / "out", "RM=smoke_hooks.reward.raises_once")
    assert done.returncode == 1
    error = next(f for f in report["findings"] if f["id"] == "smoke.hook_error")
    assert "raised on 1 of" in error["finding"] and "cannot parse the answer" in error["finding"]
    assert _processes_mentioning(str(short_tmp)) == []


@pytest.mark.slow
def test_a_reward_always_zero_and_every_response_truncated_are_findings(short_tmp, tiny):
    done, report = _run_json(_script(short_tmp, tiny), tiny, short_tmp / "out",
                             "RM=smoke_hooks.reward.always_zero", "MAX_LEN=2")
    assert done.returncode == 1
    assert "smoke.truncation" in ids(report, "FAIL")
    # a reward that gives 0 to the label in every shape is a warning that asks for --responses, not a
    # FAIL: the reward may want a shape the probe does not know
    (shape,) = [f for f in report["findings"] if f["id"] == "smoke.reward_format"]
    assert shape["status"] == "WARN" and "every shape tried" in shape["finding"] and "--responses" in shape["fix"]
    assert "smoke.reward" not in ids(report, "FAIL")


@pytest.mark.slow
def test_ctrl_c_stops_the_run_and_leaves_nothing(short_tmp, tiny):
    out = short_tmp / "out"
    shown = open(short_tmp / "stdout.txt", "wb")  # a file: a full pipe would stall the streamed log
    proc = subprocess.Popen([*CLI, "smoke", str(_script(short_tmp, tiny)), "--out", str(out),
                             "--env", f"TINY={tiny.root}", "--env", f"SAVE_DIR={short_tmp / 'user-ckpt'}"],
                            stdout=shown, stderr=subprocess.PIPE, env=_env(), start_new_session=True,
                            # Ctrl-C reaches the run as at a terminal, even where this test's own
                            # shell started it with SIGINT ignored (a background job)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (out / "run" / "args.json").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        time.sleep(0.5)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    shown.close()
    assert proc.returncode == 130, err.decode()[-3000:]
    assert "Traceback" not in err.decode()
    deadline = time.monotonic() + 60
    while _processes_mentioning(str(short_tmp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_mentioning(str(short_tmp)) == []


# ---------------------------------------------------------------------------------------------
# the tiny stand-in model, and the verdict on a finished run


def test_tiny_model_keeps_the_users_family_shape(tmp_path):
    from slime_rehearse.smoke_assets import build_model

    user = tmp_path / "Llama-3.1-8B"
    user.mkdir()
    (user / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "num_hidden_layers": 32, "vocab_size": 128256, "rope_theta": 500000.0,
        "tie_word_embeddings": True, "rms_norm_eps": 1e-5}))
    model_dir, findings = build_model([("--hf-checkpoint", [str(user)])], tmp_path / "out")
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 2
    assert cfg["num_attention_heads"] // cfg["num_key_value_heads"] == 4 and cfg["tie_word_embeddings"] is True
    assert {f.id: f.status for f in findings}["smoke.tokenizer"] is Status.WARN  # no tokenizer files here


def test_a_family_slime_ref_does_not_build_becomes_the_nearest_dense_shape_with_a_warning(tmp_path):
    from slime_rehearse.smoke_assets import build_model

    user = tmp_path / "moe"
    user.mkdir()
    (user / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "num_attention_heads": 128,
                                                  "num_key_value_heads": 128}))
    model_dir, findings = build_model([("--hf-checkpoint", [str(user)])], tmp_path / "out")
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == "qwen3"
    warn = [f for f in findings if f.id == "smoke.model" and f.status is Status.WARN]
    assert warn and "'deepseek_v3'" in warn[0].finding


def _result(rewards, truncated, rc=0, errors=0):
    metrics = [{"rollout/raw_reward": r, "rollout/truncated_ratio": t, "rollout/zero_std_ratio": 1.0,
                "rollout/response_length": 30.0, "perf/weight_check_max_abs_diff": 0.0}
               for r, t in zip(rewards, truncated, strict=True)]
    hooks = {"h0": {"flag": "--custom-rm-path", "path": "my.rm", "calls": 8, "errors": errors,
                    "first_error": "ValueError: bad" if errors else None}}
    return {"returncode": rc, "timed_out": False, "log": "", "metrics": metrics, "hooks": hooks, "wall_s": 10.0}


def _verdict(result, user_len):
    from slime_rehearse.smoke_job import Shrunk
    from slime_rehearse.smoke_verdict import verdict

    shrunk = Shrunk([], [], {}, [], user_len, {})
    return {f.id: f for f in verdict(result, shrunk, SmokeOptions(out=Path("/tmp/x")))}


def test_verdict_truncation_fails_only_at_the_users_own_length():
    assert _verdict(_result([0], [1.0]), 8)["smoke.truncation"].status is Status.FAIL
    assert _verdict(_result([0], [1.0]), 4096)["smoke.truncation"].status is Status.PASS  # the smoke cap


def test_verdict_names_a_hook_that_raised():
    found = _verdict(_result([0], [0.0], rc=1, errors=1), 512)
    assert found["smoke.hook_error"].status is Status.FAIL and "ValueError: bad" in found["smoke.hook_error"].finding


def test_with_slime_starts_a_ray_head_of_its_own_and_stops_it(short_tmp, tiny):
    slime_dir = _stub_slime(short_tmp)
    out = short_tmp / "out"
    env = _env()
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([*CLI, "smoke", "--with", "slime", "--slime-dir", str(slime_dir), "--force", "--json",
                           "--out", str(out), "--", *_argv_job(tiny)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    log = (out / "smoke.log").read_text()
    address = json.loads(next(ln for ln in log.splitlines() if ln.startswith("env "))[4:])["RAY_ADDRESS"]
    assert address.startswith("127.0.0.1:") and address != "127.0.0.1:6379"  # a free port, not the default
    assert "Traceback" not in (out / "ray-head.log").read_text()
    deadline = time.monotonic() + 30
    while _processes_mentioning(str(short_tmp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_mentioning(str(short_tmp)) == []


def test_flags_slime_ref_does_not_implement_are_left_out_and_named():
    from slime_rehearse.smoke_job import drop_unimplemented

    kept, dropped = drop_unimplemented(["--lr", "1e-6", "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                                        "--attention-softmax-in-fp32", "--sglang-mem-fraction-static", "0.7",
                                        "--colocate"])
    assert dropped == ["--optimizer-cpu-offload", "--use-precision-aware-optimizer"]
    # slime-ref's attention keeps its softmax in fp32 already: the switch is accepted, not dropped
    assert kept == ["--lr", "1e-6", "--attention-softmax-in-fp32", "--sglang-mem-fraction-static", "0.7",
                    "--colocate"]
    # a top-p below 1 is slime's top-p replay, which slime-ref refuses: the rehearsal samples at 1
    kept, dropped = drop_unimplemented(["--rollout-top-p", "0.95", "--eval-top-p", "0.9", "--lr", "1e-6"])
    assert dropped == ["--rollout-top-p 0.95 (top-p replay)"]
    assert kept == ["--eval-top-p", "0.9", "--lr", "1e-6"]
    assert drop_unimplemented(["--rollout-top-p", "1.0"]) == (["--rollout-top-p", "1.0"], [])
