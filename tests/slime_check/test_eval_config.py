"""--eval-config: the datasets as slime v0.3.1 reads them, and what `slime-check config` reports."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from slime_check.config_lint import lint_argv
from slime_check.eval_config import eval_config_as_prompt_data, eval_config_findings, read_eval_config
from slime_check.findings import Status
from slime_check.launch_script import Origin, Word
from slime_check.shell_expansion import Sym
from slime_common.errors import UserError

# Shaped like slime's examples/eval_multi_task/multi_task.yaml: shared defaults, per-dataset overrides.
MULTI_TASK = """\
eval:
  defaults:
    max_response_len: 4096
    top_p: 0.9
    temperature: 6e-1      # OmegaConf reads this as a float
    input_key: question
  datasets:
    - name: arith-easy
      path: {data}/arith_easy.jsonl
      rm_type: math
      n_samples_per_eval_prompt: 8
    - name: arith-hard
      path: {data}/arith_hard.jsonl
      rm_type: deepscaler
      n_samples_per_eval_prompt: 4
      top_p: 1.0
      max_response_len: null   # set, even to null: the dataset wins over defaults
    - name: riddles
      path: {data}/riddles.jsonl
      rm_type: f1
      input_key: prompt
      label_key: answer
"""

BASE = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "8", "--num-rollout", "1",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2", "--colocate"]


def write_data(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("arith_easy", "arith_hard"):
        (folder / f"{name}.jsonl").write_text('{"question": "3+5=", "label": "8"}\n' * 3)
    (folder / "riddles.jsonl").write_text('{"prompt": "What has keys?", "answer": "a piano"}\n')
    return folder


def write_yaml(tmp_path: Path, text: str, name: str = "eval.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def multi_task(tmp_path: Path) -> Path:
    data = write_data(tmp_path / "data")
    return write_yaml(tmp_path, MULTI_TASK.format(data=data))


def words(*args: str) -> list[Word]:
    return [Word([a], Origin("argv", i + 1)) for i, a in enumerate(args)]


def by_status(findings, status, id_="config.eval_config"):
    return [f for f in findings if f.id == id_ and f.status is status]


def test_datasets_are_read_with_defaults_merged_as_slime_does(tmp_path):
    config = read_eval_config(multi_task(tmp_path))
    easy, hard, riddles = config.datasets
    assert [d.name for d in config.datasets] == ["arith-easy", "arith-hard", "riddles"]
    assert easy.settings == {
        "name": "arith-easy", "path": str(tmp_path / "data" / "arith_easy.jsonl"), "rm_type": "math",
        "n_samples_per_eval_prompt": 8, "max_response_len": 4096, "top_p": 0.9, "temperature": 0.6,
        "input_key": "question",
    }
    assert isinstance(easy.get("temperature"), float)
    assert set(easy.from_defaults) == {"max_response_len", "top_p", "temperature", "input_key"}
    # A key the dataset sets wins, null included; a key nobody sets is left to the launch flags.
    assert hard.get("top_p") == 1.0 and "max_response_len" in hard.settings and hard.get("max_response_len") is None
    assert "max_response_len" not in hard.from_defaults and hard.get("temperature") == 0.6
    assert riddles.get("input_key") == "prompt" and "label_key" not in hard.settings
    assert eval_config_as_prompt_data(config) == [
        ("arith-easy", str(tmp_path / "data" / "arith_easy.jsonl")),
        ("arith-hard", str(tmp_path / "data" / "arith_hard.jsonl")),
        ("riddles", str(tmp_path / "data" / "riddles.jsonl")),
    ]
    findings = eval_config_findings(config.path, flags={})
    assert [f.status for f in findings if f.id == "config.eval_config"] == [Status.PASS]
    passed = by_status(findings, Status.PASS)[0].finding
    assert "3 datasets" in passed and all(n in passed for n in ("arith-easy", "arith-hard", "riddles"))
    assert [f.status for f in findings if f.id == "config.data"] == [Status.PASS] * 3


def test_mapping_form_root_without_eval_and_defaults_slime_ignores(tmp_path):
    path = write_yaml(tmp_path, """\
defaults:
  n_samples_per_eval_prompt: 2
  rm_type: math                # slime merges only some keys from defaults
  max_respose_len: 512         # a typo slime ignores without a word
datasets:
  arith: {path: /data/arith.jsonl}
  riddles:
    path: /data/riddles.jsonl
    name: riddles-v2
""")
    config = read_eval_config(path)
    assert eval_config_as_prompt_data(config) == [("arith", "/data/arith.jsonl"), ("riddles-v2", "/data/riddles.jsonl")]
    assert all(d.get("n_samples_per_eval_prompt") == 2 and "rm_type" not in d.settings for d in config.datasets)
    assert config.ignored_defaults == ["rm_type", "max_respose_len"]
    warns = {f.finding.split(" is ignored")[0]: f for f in by_status(eval_config_findings(path), Status.WARN)}
    assert set(warns) == {"eval.yaml defaults.rm_type", "eval.yaml defaults.max_respose_len"}
    assert "Set rm_type on each dataset" in warns["eval.yaml defaults.rm_type"].fix
    assert "did you mean `max_response_len`" in warns["eval.yaml defaults.max_respose_len"].finding


def test_key_slime_does_not_accept_fails_with_the_closest_key(tmp_path):
    path = write_yaml(tmp_path, """\
eval:
  datasets:
    - name: arith
      path: /data/arith.jsonl
      eval_max_response_len: 1024
      n_samples_per_prompt: 4
      reward_type: math
""")
    fails = {f.finding.split("`")[1]: f for f in by_status(eval_config_findings(path), Status.FAIL)}
    assert set(fails) == {"eval_max_response_len", "n_samples_per_prompt", "reward_type"}
    assert "did you mean `max_response_len`" in fails["eval_max_response_len"].finding
    assert fails["eval_max_response_len"].fix == "Use `max_response_len`."
    assert "did you mean `n_samples_per_eval_prompt`" in fails["n_samples_per_prompt"].finding
    assert "arith" in fails["reward_type"].finding and "slime stops at start-up" in fails["reward_type"].finding
    assert not by_status(eval_config_findings(path), Status.PASS)


def test_values_of_the_wrong_type_fail(tmp_path):
    path = write_yaml(tmp_path, """\
eval:
  defaults:
    top_p: "0.9"
  datasets:
    - {name: a, path: /data/a.jsonl, n_samples_per_eval_prompt: "16", apply_chat_template: "yes"}
    - {name: b, path: /data/b.jsonl, max_response_len: 1024.5, stop: ["</answer>"], min_eval_samples: 0}
    - {name: c, path: /data/c.jsonl, temperature: 1, stop_token_ids: [1, 2], metadata_overrides: {split: test}}
""")
    fails = by_status(eval_config_findings(path), Status.FAIL)
    text = "\n".join(f.finding for f in fails)
    assert len(fails) == 5, text
    string_n = next(f for f in fails if "n_samples_per_eval_prompt" in f.finding)
    assert "datasets[0] (a)" in string_n.finding and "'16' (str)" in string_n.finding
    assert "an integer" in string_n.finding
    assert "Remove the quotes" in string_n.fix
    # a bad default is reported once, not once per dataset that takes it
    assert sum("top_p" in f.finding for f in fails) == 1 and "eval.yaml defaults: top_p" in text
    assert "apply_chat_template is 'yes'" in text and "max_response_len is 1024.5" in text
    assert "min_eval_samples is 0" in text and " c " not in text and "(c)" not in text


def test_missing_file_is_an_error_to_read_and_skipped_by_config(tmp_path):
    absent = tmp_path / "nowhere" / "eval.yaml"
    with pytest.raises(UserError, match=f"--eval-config {absent}: no such file"):
        read_eval_config(absent)
    # config may check a script meant for another machine: absent files are skipped, as for --eval-prompt-data
    findings = eval_config_findings(absent)
    assert [f.status for f in findings] == [Status.SKIP] and "not reachable here" in findings[0].finding
    path = write_yaml(tmp_path, "eval:\n  datasets:\n    - {name: gone, path: /no/such/gone.jsonl}\n")
    findings = eval_config_findings(path)
    assert [(f.id, f.status) for f in findings] == [("config.eval_config", Status.PASS), ("config.data", Status.SKIP)]
    assert "gone /no/such/gone.jsonl is not reachable here" in findings[1].finding


@pytest.mark.parametrize("text, message", [
    ("eval:\n  datasets: [\n", "is not valid YAML: "),
    ("eval:\n\tdatasets: []\n", "is not valid YAML: "),
    ("eval:\n  datasets:\n    - {name: a, path: /a, name: b}\n", "the key 'name' is given twice"),
    ("- name: a\n  path: /a\n", "the root must be a mapping"),
    ("eval: [a, b]\n", "`eval` must be a mapping"),
    ("eval:\n  defaults: {top_p: 1}\n", "defines no datasets under `eval.datasets`"),
    ("", "defines no datasets"),
    ("eval:\n  datasets: /data/a.jsonl\n", "`datasets` must be a list or a mapping, not a string"),
    ("eval:\n  datasets:\n    - /data/a.jsonl\n", "datasets[0] must be a mapping"),
    ("eval:\n  datasets:\n    - {path: /data/a.jsonl}\n", "datasets[0] has no `name`"),
    ("eval:\n  datasets:\n    - {name: a}\n", "datasets[0] (a) has no `path`"),
    ("eval:\n  defaults: [1]\n  datasets:\n    - {name: a, path: /a}\n", "`defaults` must be a mapping"),
])
def test_not_yaml_or_not_the_shape_slime_reads_is_one_line(tmp_path, text, message):
    path = write_yaml(tmp_path, text)
    with pytest.raises(UserError) as info:
        read_eval_config(path)
    assert str(path) in str(info.value) and message in str(info.value) and "\n" not in str(info.value)
    findings = eval_config_findings(path)
    assert [f.status for f in findings] == [Status.FAIL] and message in findings[0].finding


def test_data_file_keys_follow_the_dataset_then_the_flags(tmp_path):
    data = write_data(tmp_path / "data")
    path = write_yaml(tmp_path, f"""\
eval:
  datasets:
    - {{name: arith, path: {data}/arith_easy.jsonl, label_key: label}}
    - {{name: riddles, path: {data}/riddles.jsonl, input_key: question}}
""")
    # --eval-input-key before --input-key, as slime falls back; the file's own key wins over both
    findings = lint_argv(words(*BASE, "--eval-config", str(path), "--input-key", "prompt",
                               "--eval-input-key", "question"))
    data_findings = {f.finding.split(":")[0]: f for f in findings if f.id == "config.data" and "--eval-config" in
                     f.finding}
    arith = data_findings[f"--eval-config arith {data}/arith_easy.jsonl"]
    assert arith.status is Status.PASS and "'question', 'label'" in arith.finding
    riddles = data_findings[f"--eval-config riddles {data}/riddles.jsonl"]
    assert riddles.status is Status.FAIL and "lack 'question'" in riddles.finding and "prompt" in riddles.finding


def test_config_lint_wires_eval_config(tmp_path):
    path = multi_task(tmp_path)
    both = lint_argv(words(*BASE, "--eval-interval", "5", "--eval-config", str(path), "--eval-prompt-data", "x", "/x"))
    assert "ignores --eval-prompt-data" in by_status(both, Status.WARN)[0].finding
    assert len(by_status(both, Status.PASS)) == 1
    symbolic = lint_argv([*words(*BASE, "--eval-config"), Word([Sym("${EVAL_YAML}")], Origin("argv", 99))])
    skipped = [f for f in symbolic if f.id == "config.eval_config"]
    assert [f.status for f in skipped] == [Status.SKIP] and "symbolic" in skipped[0].finding
    assert not [f for f in lint_argv(words(*BASE)) if f.id == "config.eval_config"]


def run_config(*args):
    return subprocess.run(["slime-check", "config", *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def test_cli_config_reports_the_eval_config_findings(tmp_path):
    path = multi_task(tmp_path)
    path.write_text(path.read_text().replace("n_samples_per_eval_prompt: 4", "n_samples_per_eval_promt: 4"))
    script = tmp_path / "run.sh"
    script.write_text(f"""#!/bin/bash
EVAL_ARGS=(
   --eval-interval 5
   --eval-config {path}
)
python3 train.py \\
   {' '.join(BASE)} \\
   "${{EVAL_ARGS[@]}}"
""")
    r = run_config(script, "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    findings = [f for rep in json.loads(r.stdout)["reports"] for f in rep["findings"]]
    bad = [f for f in findings if f["id"] == "config.eval_config"]
    assert [f["status"] for f in bad] == ["FAIL"]
    assert "`n_samples_per_eval_promt`" in bad[0]["finding"] and bad[0]["fix"] == "Use `n_samples_per_eval_prompt`."
    assert sum(f["id"] == "config.data" and f["status"] == "PASS" for f in findings) == 3
    path.write_text(path.read_text().replace("n_samples_per_eval_promt", "n_samples_per_eval_prompt"))
    r = run_config(script)
    assert r.returncode == 0, r.stdout
    assert "config.eval_config" in r.stdout and "arith-easy" in r.stdout
