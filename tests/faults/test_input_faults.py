"""Bad input a new user gives: each is one line naming the flag or file (and the line or row), exit
status 2, no traceback, and nothing left running. Errors that need no engine come before Ray starts.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _harness import LaunchedRun, assert_clean_stop, grpo_flags


def _run(tiny, tmp_path, *extra, timeout=300):
    out = tmp_path / "run"
    run = LaunchedRun(grpo_flags(tiny, out, "--num-rollout", "1", *extra), tmp_path / "console")
    try:
        code, took = run.finish(timeout=timeout)
    finally:
        run.kill()
    return run, code, took, out


def test_a_missing_hf_checkpoint_fails_at_once_before_ray(tiny, tmp_path):
    run, code, took, out = _run(tiny, tmp_path, "--hf-checkpoint", str(tmp_path / "Qwen3-4B"))
    line = assert_clean_stop(run, code, f"--hf-checkpoint {tmp_path / 'Qwen3-4B'}: no such directory",
                             "never downloads")
    assert code == 2 and not (out / "args.json").exists(), line  # nothing started
    assert took < 30


def test_a_hook_whose_function_is_missing_fails_before_ray(tiny, tmp_path):
    run, code, took, out = _run(tiny, tmp_path, "--custom-rm-path", "os.path.nosuchfn")
    assert_clean_stop(run, code, "--custom-rm-path 'os.path.nosuchfn'", "has no attribute 'nosuchfn'")
    assert code == 2 and not (out / "args.json").exists()
    assert took < 30


@pytest.mark.slow
def test_a_malformed_jsonl_line_names_the_file_and_line(tiny, tmp_path):
    rows = tiny.train_path.read_text().splitlines()[:8]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([rows[0], rows[1][:-5], *rows[2:]]) + "\n")  # line 2 cut short
    run, code, _, _ = _run(tiny, tmp_path, "--prompt-data", str(bad))
    line = assert_clean_stop(run, code, f"--prompt-data {bad}:2: not valid JSON")
    assert code == 2, line


@pytest.mark.slow
def test_a_parquet_row_without_the_label_key_names_the_file_and_row(tiny, tmp_path):
    rows = [json.loads(line) for line in tiny.train_path.read_text().splitlines()[:8]]
    table = pa.table({"prompt": [json.dumps(r["prompt"]) for r in rows],
                      "label": [r["label"] if i != 5 else None for i, r in enumerate(rows)]})
    path = tmp_path / "prompts.parquet"
    pq.write_table(table.drop(["label"]), path)
    run, code, _, _ = _run(tiny, tmp_path, "--prompt-data", str(path))
    line = assert_clean_stop(run, code, "--label-key 'label'", f"of {path} has no such key")
    assert code == 2, line
