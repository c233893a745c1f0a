"""slime-check config: launch scripts in slime's shape, seeded mistakes, and the CLI contract."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from _lint_inputs import TINY_HF_CONFIG, words
from slime_check.config_lint import lint_argv, lint_script
from slime_check.findings import Status

SCRIPTS = Path(__file__).parents[1] / "fixtures" / "slime_scripts"
COLOCATE = SCRIPTS / "scripts" / "run-tiny-colocate.sh"
ASYNC = SCRIPTS / "run-tiny-async.sh"
SEEDED = SCRIPTS / "run-tiny-seeded.sh"
H200 = Path(__file__).parents[1] / "fixtures" / "env" / "h200x1" / "capture.txt"



def statuses(findings, id_) -> list[Status]:
    return [f.status for f in findings if f.id == id_]


def failures(findings) -> list:
    return [f for f in findings if f.status is Status.FAIL]


def run(*args, **kw):
    return subprocess.run(["slime-check", *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"}, **kw)


def only(reports):
    assert len(reports) == 1
    return reports[0].findings


def test_clean_colocate_script_has_no_errors():
    findings = only(lint_script(COLOCATE))
    assert failures(findings) == [] and statuses(findings, "config.unknown_flag") == [Status.PASS]
    assert statuses(findings, "config.batch_identity") == [Status.PASS]
    gpus = next(f for f in findings if f.id == "config.gpus")
    assert gpus.status is Status.PASS and "2 engine(s) of 2 GPU(s)" in gpus.finding
    assert statuses(findings, "config.parallelism") == [Status.PASS]
    assert not [f for f in findings if f.status is Status.WARN]


def test_clean_async_script_with_slime_dir_has_no_errors():
    findings = only(lint_script(ASYNC, slime_dir=SCRIPTS))
    assert failures(findings) == []
    assert "16 = global_batch_size 8 x 2 steps" in next(f for f in findings if f.id == "config.batch_identity").finding


def test_seeded_errors_are_each_reported():
    findings = only(lint_script(SEEDED))
    text = {f.id: f for f in findings if f.status is not Status.PASS}
    unknown = text["config.unknown_flag"]
    assert unknown.status is Status.FAIL and "--eps-clip-hihg (run-tiny-seeded.sh:30)" in unknown.finding
    assert "Did you mean --eps-clip-high" in unknown.finding
    batch = text["config.batch_identity"]
    assert batch.status is Status.FAIL and "--global-batch-size 64" in batch.finding and "= 32" in batch.finding
    kl = text["config.kl"]
    assert kl.status is Status.FAIL and "--use-kl-loss without --ref-load" in kl.finding
    hook = text["config.hooks"]
    assert hook.status is Status.FAIL and "my_rm.py" in hook.finding and "my_rm.<function>" in hook.fix
    twice = text["config.duplicate_flag"]
    assert twice.status is Status.WARN and "--lr is given 2 times" in twice.finding and "--lr 2e-6" in twice.finding
    assert len(failures(findings)) == 4


def test_missing_backslash_is_reported(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("A=(--rollout-batch-size 8 --num-rollout 1)\npython3 train.py \\\n  --lr 1e-6\n  ${A[@]}\n")
    findings = only(lint_script(script))
    assert any(f.id == "config.script" and f.status is Status.FAIL and "backslash" in f.finding for f in findings)
    assert statuses(findings, "config.required") == [Status.FAIL]  # --rollout-batch-size never arrived


def test_hf_config_matches_and_mismatches(tmp_path):
    hf = tmp_path / "qwen3-tiny"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(TINY_HF_CONFIG))
    findings = only(lint_script(COLOCATE, env={"HF_DIR": str(hf)}))
    match = next(f for f in findings if f.id == "config.hf_config")
    assert match.status is Status.PASS and "10 fields" in match.finding
    (hf / "config.json").write_text(json.dumps({**TINY_HF_CONFIG, "rope_theta": 10000, "num_key_value_heads": 4}))
    findings = only(lint_script(COLOCATE, env={"HF_DIR": str(hf)}))
    bad = next(f for f in findings if f.id == "config.hf_config")
    assert bad.status is Status.FAIL
    assert "rope_theta 10000 vs --rotary-base 1000000" in bad.finding and "num_key_value_heads 4" in bad.finding


def test_data_file_keys(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": [{"role": "user", "content": "1+1"}], "answer": "2"}\n' * 3)
    findings = only(lint_script(COLOCATE, env={"PROMPT_DATA": str(data)}))
    bad = next(f for f in findings if f.id == "config.data" and "train.jsonl" in f.finding)
    assert bad.status is Status.FAIL and "'label'" in bad.finding and "answer" in bad.finding
    # a plain-text prompt with --apply-chat-template is fine: slime v0.3.1 makes it one user message
    # (slime/utils/data.py, _build_messages)
    data.write_text('{"prompt": "1+1", "label": "2"}\n')
    plain = next(f for f in only(lint_script(COLOCATE, env={"PROMPT_DATA": str(data)}))
                 if f.id == "config.data" and "train.jsonl" in f.finding)
    assert plain.status is Status.PASS


def test_parquet_data_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [[{"role": "user", "content": "1+1"}]], "label": ["2"]}), path)
    findings = only(lint_script(COLOCATE, env={"PROMPT_DATA": str(path)}))
    assert next(f for f in findings if f.id == "config.data" and "parquet" in f.finding).status is Status.PASS


BASE = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "8", "--num-rollout", "1",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2", "--colocate"]


@pytest.mark.parametrize("extra,id_,expect", [
    (["--save-interval", "5"], "config.save", "without --save"),
    (["--eval-interval", "5"], "config.eval", "without --eval-prompt-data"),
    (["--use-dynamic-batch-size"], "config.dynamic_batch", "--max-tokens-per-gpu"),
    (["--kl-coef", "0.1", "--kl-loss-coef", "0.1", "--ref-load", "/x"], "config.kl", "both non-zero"),
    (["--advantage-estimator", "reinforce_plus_plus"], "config.advantage", "--normalize-advantages"),
    (["--use-rollout-logprobs", "--use-tis"], "config.rollout_logprobs", "cannot be combined"),
    (["--rollout-num-gpus-per-engine", "3"], "config.gpus", "not a multiple"),
    (["--tensor-model-parallel-size", "4"], "config.parallelism", "does not divide"),
    (["--sglang-dp-size", "2"], "config.sglang_parallel", "--sglang-enable-dp-attention"),
    (["--rollout-batch-size", "abc"], "config.value", "expects int"),
    (["--advantage-estimator", "grpoo"], "config.value", "not one of"),
    (["--sglang-enable", "--x"], "config.abbreviation", "ambiguous"),
    (["--advantage-estimator", "ppo", "--release-train"], "config.critic", "does not support critic"),
])
def test_validate_args_rules(extra, id_, expect):
    findings = lint_argv(words(*BASE, *extra))
    hits = [f for f in findings if f.id == id_ and f.status is Status.FAIL]
    assert hits and expect in hits[0].finding, [f for f in findings if f.status is not Status.PASS]


def test_base_argv_is_clean():
    findings = lint_argv(words(*BASE))
    assert failures(findings) == [] and not [f for f in findings if f.status is Status.WARN]


def test_async_cannot_colocate_and_disaggregated_needs_rollout_gpus():
    assert "cannot colocate" in failures(lint_argv(words(*BASE), entry="train_async.py"))[0].finding
    no_colocate = [w for w in BASE if w != "--colocate"]
    assert any("--rollout-num-gpus" in f.finding for f in failures(lint_argv(words(*no_colocate))))


@pytest.mark.parametrize("rollout, said", [("4", "the engines take the first 4 of the 8 actor GPUs"),
                                            ("16", "the actor trains on the first 8 of 16 GPUs")])
def test_colocate_with_unequal_rollout_and_actor_gpus_warns(rollout, said):
    at = BASE.index("--actor-num-gpus-per-node")
    argv = BASE[:at] + BASE[at + 2:]
    gpus = [f for f in lint_argv(words(*argv, "--actor-num-gpus-per-node", "8", "--rollout-num-gpus", rollout))
            if f.id == "config.gpus"]
    assert [f.status for f in gpus] == [Status.WARN, Status.PASS] and said in gpus[0].finding
    assert "Drop --rollout-num-gpus under --colocate" in gpus[0].fix
    same = lint_argv(words(*argv, "--actor-num-gpus-per-node", "8", "--rollout-num-gpus", "8"))
    assert [f.status for f in same if f.id == "config.gpus"] == [Status.PASS]


def test_abbreviation_and_stray_words_warn():
    findings = lint_argv(words(*BASE, "--sglang-mem-fraction", "0.7", "--apply-chat-template", "true"))
    warns = {f.id: f.finding for f in findings if f.status is Status.WARN}
    assert "--sglang-mem-fraction-static" in warns["config.abbreviation"]
    assert "'true'" in warns["config.value"]


def test_repeated_eval_prompt_data_drops_the_first():
    findings = lint_argv(words(*BASE, "--eval-prompt-data", "a", "/a.jsonl", "--eval-prompt-data", "b", "/b.jsonl"))
    dup = next(f for f in findings if f.id == "config.duplicate_flag")
    assert "--eval-prompt-data b /b.jsonl" in dup.finding and "dropped" in dup.finding


def test_batch_not_a_multiple_is_an_error():
    findings = lint_argv(words(*[w if w != "8" else "6" for w in BASE]))
    assert "not a multiple" in next(f for f in findings if f.id == "config.batch_identity").finding


# ---------------------------------------------------------------------------------------------
# CLI contract
# ---------------------------------------------------------------------------------------------


def test_cli_config_exit_codes(tmp_path):
    assert run("config", COLOCATE).returncode == 0
    seeded = run("config", "--slime-dir", SCRIPTS, ASYNC, SEEDED, "--json")
    assert seeded.returncode == 1
    report = json.loads(seeded.stdout)
    assert [r["summary"]["FAIL"] for r in report["reports"]] == [0, 4] and report["summary"]["FAIL"] == 4
    for args in (["config"], ["config", tmp_path / "absent.sh"], ["config", COLOCATE, "--env", "NOEQUALS"],
                 ["config", "--slime-dir", tmp_path / "absent", COLOCATE]):
        r = run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
    broken = tmp_path / "broken.sh"
    broken.write_text('python train.py --x "unterminated\n')
    r = run("config", broken)
    assert r.returncode == 2 and "unterminated" in r.stderr and "Traceback" not in r.stderr
    r = run("config", tmp_path)  # a folder: said so, with a script in it to give
    assert r.returncode == 2 and f"{tmp_path} is a directory; give the launch script in it (e.g. {broken})" in r.stderr


def test_cli_config_argv_mode():
    r = run("config", "--json", "--", *BASE)
    assert r.returncode == 0, r.stdout
    report = json.loads(r.stdout)
    assert report["summary"]["FAIL"] == 0 and report["reports"][0]["title"] == "command-line arguments"
    r = run("config", "--", *BASE, "--rollout-batchsize", "4")
    assert r.returncode == 1 and "--rollout-batch-size" in r.stdout


def test_cli_prereqs_exit_codes(tmp_path):
    r = run("prereqs", "--fixture", H200, "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    report = json.loads(r.stdout)
    assert report["origin"].startswith("capture") and report["summary"]["FAIL"] >= 1
    assert {f["id"] for f in report["findings"]} >= {"gpu.driver", "container.shm", "packages.sglang", "system.ram"}
    assert run("prereqs", "--fixture", H200, "--only", "gpu", "--only", "container").returncode == 0
    table = run("prereqs", "--fixture", H200, "--only", "container")
    assert "container.stack" in table.stdout and "67108864" in table.stdout
    for args in (["--only", "gpus"], ["--fixture", tmp_path / "none.txt"], ["--gpus", "0"], ["--model-params", "x"]):
        r = run("prereqs", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)


def test_every_problem_names_a_fix_and_a_doc():
    findings = only(lint_script(SEEDED)) + lint_argv(words(*BASE, "--save-interval", "1", "--tis", "--colocate"))
    problems = [f for f in findings if f.status in (Status.FAIL, Status.WARN)]
    assert len(problems) >= 7
    for f in problems:
        assert f.fix and f.doc.startswith("https://github.com/THUDM/slime/blob/v0.3.1/"), f


def test_critic_rules():
    def critic(*extra):
        return [f for f in lint_argv(words(*BASE, *extra)) if f.id == "config.critic"]

    assert critic() == []
    ok = critic("--advantage-estimator", "ppo", "--num-critic-only-steps", "1")
    assert [f.status for f in ok] == [Status.PASS] and "critic-only" in ok[0].finding  # 1 >= --num-rollout 1
    for extra, text in ((["--num-critic-only-steps", "2"], "no effect without a critic"),
                        (["--megatron-config-path", "m.yaml"], "ignores it"),
                        (["--advantage-estimator", "ppo", "--no-offload-train"], "turns --offload-train on")):
        found = critic(*extra)
        assert [f.status for f in found] == [Status.WARN] and text in found[0].finding, found
        assert found[0].fix and found[0].doc.startswith("https://github.com/THUDM/slime/blob/v0.3.1/")


def test_local_transformer_impl_with_a_qwen_or_llama_checkpoint_fails(tmp_path):
    """slime v0.3.1's Qwen/Llama converters know only TransformerEngine's layer names: the HF load of a
    local-spec model stops with KeyError (seen on an H200, tests/fixtures/slime_logs)."""
    def impl(*extra):
        return [f for f in lint_argv(words(*BASE, *extra)) if f.id == "config.transformer_impl"]

    assert impl() == []  # TransformerEngine's layers: slime's default
    hf = tmp_path / "model"
    hf.mkdir()
    for model_type, expect in (("qwen2", Status.FAIL), ("llama", Status.FAIL), ("deepseek_v3", Status.PASS)):
        (hf / "config.json").write_text(json.dumps({"model_type": model_type}))
        found = impl("--transformer-impl", "local", "--hf-checkpoint", str(hf))
        assert [f.status for f in found] == [expect], (model_type, found)
    (hf / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    failed = impl("--transformer-impl", "local", "--hf-checkpoint", str(hf))[0]
    assert "qwen3 checkpoint" in failed.finding and "input_layernorm" in failed.finding
    assert "TransformerEngine" in failed.fix
    unknown = impl("--transformer-impl", "local", "--hf-checkpoint", str(tmp_path / "absent"))
    assert [f.status for f in unknown] == [Status.WARN]
    assert impl("--transformer-impl", "local", "--hf-checkpoint", str(hf), "--spec", "my_spec", "spec") == []


def test_full_iteration_cuda_graph_flags_need_the_nan_check_off_and_do_nothing_in_slime():
    def graphs(*extra):
        return [f for f in lint_argv(words(*BASE, *extra)) if f.id == "config.cuda_graphs"]

    assert graphs() == [] and graphs("--cuda-graph-impl", "local") == []
    failed = graphs("--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration")
    assert [f.status for f in failed] == [Status.FAIL]
    assert "AssertionError" in failed[0].finding and "--no-check-for-nan-in-loss-and-grad" in failed[0].fix
    warned = graphs("--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration",
                    "--no-check-for-nan-in-loss-and-grad")
    assert [f.status for f in warned] == [Status.WARN] and "eagerly" in warned[0].finding


def test_a_rollout_top_p_below_one_warns_of_slimes_top_p_replay():
    def replay(*extra):
        return [f for f in lint_argv(words(*BASE, *extra)) if f.id == "config.top_p_replay"]

    assert replay() == [] and replay("--rollout-top-p", "1.0") == [] and replay("--eval-top-p", "0.9") == []
    warned = replay("--rollout-top-p", "0.95")
    assert [f.status for f in warned] == [Status.WARN]
    assert warned[0].finding.startswith(f"--rollout-top-p 0.95 (argv:{len(BASE) + 1}) is below 1")
    assert "patch" in warned[0].finding and "assertion" in warned[0].finding and "1.0" in warned[0].fix
    assert "append_response_tokens" not in warned[0].finding
    hooked = replay("--rollout-top-p", "0.95", "--custom-generate-function-path", "my.generate")
    assert "append_response_tokens" in hooked[0].finding
