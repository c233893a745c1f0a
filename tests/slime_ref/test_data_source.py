"""Prompt files, chat templates, groups, epochs/shuffle, the partial-rollout buffer, and exact resume."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slime_ref.arguments import parse_args
from slime_ref.data.source import (
    RolloutDataSource,
    RolloutDataSourceWithBuffer,
    make_data_source,
    resolve_num_rollout,
)
from slime_ref.errors import UserError
from slime_ref.types import Sample

ROWS = [{"question": f"q{i}", "answer": str(i), "metadata": {"id": i}} for i in range(7)]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _args(prompt_data, *argv, n=2, rbs=3):
    return parse_args([
        "--prompt-data", str(prompt_data), "--input-key", "question", "--label-key", "answer",
        "--rollout-batch-size", str(rbs), "--n-samples-per-prompt", str(n), "--num-steps-per-rollout", "1",
        "--num-rollout", "10", *argv,
    ])


@pytest.fixture
def prompts(tmp_path):
    return _write_jsonl(tmp_path / "prompts.jsonl", ROWS)


def _labels(groups):
    return [group[0].label for group in groups]


def test_groups_are_copies_with_shared_group_index_and_running_index(prompts):
    source = RolloutDataSource(_args(prompts, n=3))
    groups = source.get_samples(2) + source.get_samples(1)
    assert [[s.label for s in g] for g in groups] == [["0"] * 3, ["1"] * 3, ["2"] * 3]
    assert [[s.group_index for s in g] for g in groups] == [[0] * 3, [1] * 3, [2] * 3]
    assert [s.index for g in groups for s in g] == list(range(9))
    assert groups[0][0].prompt == "q0" and groups[0][0].metadata == {"id": 0}
    groups[0][0].response = "changed"  # copies, not aliases of one object
    assert groups[0][1].response == "" and source.dataset.samples[0].response == ""


def test_epochs_wrap_around_in_file_order(prompts):
    source = RolloutDataSource(_args(prompts))
    labels = [_labels(source.get_samples(3)) for _ in range(4)]
    assert labels == [["0", "1", "2"], ["3", "4", "5"], ["6", "0", "1"], ["2", "3", "4"]]
    assert source.epoch_id == 1


def test_shuffle_is_a_seeded_permutation_per_epoch(prompts):
    def first_two_epochs(seed):
        source = RolloutDataSource(_args(prompts, "--rollout-shuffle", "--rollout-seed", str(seed)))
        labels = sum((_labels(source.get_samples(7)) for _ in range(2)), [])
        return labels[:7], labels[7:]

    epoch0, epoch1 = first_two_epochs(1)
    assert sorted(epoch0) == sorted(epoch1) == sorted(r["answer"] for r in ROWS)
    assert epoch0 != epoch1  # a fresh order each epoch
    assert first_two_epochs(1) == (epoch0, epoch1)  # reproducible from the seed
    assert first_two_epochs(2) != (epoch0, epoch1)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resumed_source_serves_exactly_the_prompts_of_one_that_never_stopped(tmp_path, prompts, shuffle):
    flags = ["--save", str(tmp_path / "ckpt"), "--load", str(tmp_path / "ckpt"), "--partial-rollout"]
    if shuffle:
        flags.append("--rollout-shuffle")
    running = RolloutDataSourceWithBuffer(_args(prompts, *flags))
    for _ in range(2):
        running.get_samples(3)  # mid-epoch: 6 of 7 prompts used
    aborted = running.get_samples(1)
    aborted[0][0].response, aborted[0][0].status = "half an ans", Sample.Status.ABORTED
    running.add_samples(aborted)  # a partial group waits in the buffer
    state = json.loads(json.dumps(running.state_dict()))  # what the checkpoint carries, as JSON

    resumed = RolloutDataSourceWithBuffer(_args(prompts, *flags))
    resumed.load_state_dict(state)

    def dump(groups):
        return [[(s.prompt, s.label, s.index, s.group_index, s.response, s.status) for s in g] for g in groups]

    for _ in range(4):  # across the epoch boundary and past the buffer
        assert dump(resumed.get_samples(3)) == dump(running.get_samples(3))
    assert resumed.epoch_id == running.epoch_id


def test_state_is_the_position(prompts):
    source = RolloutDataSourceWithBuffer(_args(prompts))
    source.get_samples(3)
    state = source.state_dict()
    assert state["sample_offset"] == 3 and state["sample_index"] == 6 and state["num_prompts"] == 7


def test_resuming_with_a_different_prompt_file_is_refused(tmp_path, prompts):
    state = RolloutDataSource(_args(prompts)).state_dict()
    fewer = _write_jsonl(tmp_path / "fewer.jsonl", ROWS[:5])
    resumed = RolloutDataSource(_args(fewer))
    with pytest.raises(UserError, match="--prompt-data .*5 prompts now.*7"):
        resumed.load_state_dict(state)


def test_buffer_is_drained_first_and_checks_group_size(prompts):
    source = RolloutDataSourceWithBuffer(_args(prompts, n=2))
    partial = [[Sample(prompt="p", label="x", index=100 + i) for i in range(2)]]
    source.add_samples(partial)
    assert source.get_buffer_length() == 1
    groups = source.get_samples(2)
    assert _labels(groups) == ["x", "0"] and source.get_buffer_length() == 0
    with pytest.raises(ValueError, match="n_samples_per_prompt=2"):
        source.add_samples([[Sample()]])
    with pytest.raises(RuntimeError, match="read-only"):
        RolloutDataSource(_args(prompts)).add_samples(partial)


def test_custom_buffer_filter_hook(tmp_path, prompts, monkeypatch):
    (tmp_path / "my_buffer.py").write_text(
        "def pop_last(args, rollout_id, buffer, num_samples):\n    return [buffer.pop()] if buffer else []\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    source = RolloutDataSourceWithBuffer(_args(prompts, "--buffer-filter-path", "my_buffer.pop_last", n=1))
    source.add_samples([[Sample(label="a")], [Sample(label="b")]])
    assert _labels(source.get_samples(2)) == ["b", "0"]


def test_data_source_path_hook_selects_the_class(prompts):
    args = _args(prompts, "--data-source-path", "slime_ref.data.source.RolloutDataSource")
    assert type(make_data_source(args)) is RolloutDataSource
    with pytest.raises(UserError, match="--data-source-path .*has no attribute 'Nope'"):
        make_data_source(_args(prompts, "--data-source-path", "slime_ref.data.source.Nope"))


def test_parquet_reads_like_jsonl(tmp_path, prompts):
    path = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    from_parquet = RolloutDataSource(_args(path)).get_samples(7)
    from_jsonl = RolloutDataSource(_args(prompts)).get_samples(7)
    assert [(g[0].prompt, g[0].label, g[0].metadata) for g in from_parquet] == \
        [(g[0].prompt, g[0].label, g[0].metadata) for g in from_jsonl]


def test_row_slice(prompts):
    source = RolloutDataSource(_args(f"{prompts}@[2:5]"))
    assert len(source) == 3 and _labels(source.get_samples(3)) == ["2", "3", "4"]


def test_num_epoch_sets_num_rollout(prompts):
    args = parse_args(["--prompt-data", str(prompts), "--input-key", "question", "--rollout-batch-size", "3",
                       "--global-batch-size", "3", "--num-epoch", "2"])
    assert resolve_num_rollout(args, len(RolloutDataSource(args))) == 7 // 3
    assert args.num_rollout == 2 * (7 // 3)
    with pytest.raises(UserError, match="--num-epoch: 2 prompts are fewer than --rollout-batch-size 3"):
        resolve_num_rollout(parse_args(["--prompt-data", str(prompts), "--rollout-batch-size", "3",
                                        "--global-batch-size", "3", "--num-epoch", "1"]), 2)
    given = parse_args(["--prompt-data", str(prompts), "--rollout-batch-size", "3", "--global-batch-size", "3",
                        "--num-rollout", "5"])
    assert resolve_num_rollout(given, 2) is None and given.num_rollout == 5


@pytest.mark.parametrize(
    "flag, rows, message",
    [
        ("--input-key", [{"prompt": "x", "answer": "1"}], "--input-key 'question': row 1 of .* has no such key"),
        ("--label-key", [{"question": "x"}], "--label-key 'answer': row 1 of .* has no such key"),
        ("--metadata-key", [{"question": "x", "answer": "1", "metadata": 5}],
         "--metadata-key: row 1 .* must be a dict"),
    ],
)
def test_bad_rows_name_the_flag(tmp_path, flag, rows, message):
    with pytest.raises(UserError, match=message):
        RolloutDataSource(_args(_write_jsonl(tmp_path / "bad.jsonl", rows)))


def test_bad_files_name_the_flag(tmp_path, prompts):
    args = _args(prompts)
    args.prompt_data = str(tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match="--prompt-data .*missing.jsonl: no such file"):
        RolloutDataSource(args)
    (tmp_path / "broken.jsonl").write_text('{"question": "x", "answer": "1"}\n{not json\n')
    args.prompt_data = str(tmp_path / "broken.jsonl")
    with pytest.raises(UserError, match="broken.jsonl:2: not valid JSON"):
        RolloutDataSource(args)
    (tmp_path / "data.csv").write_text("question\nx\n")
    args.prompt_data = str(tmp_path / "data.csv")
    with pytest.raises(UserError, match="unsupported file type"):
        RolloutDataSource(args)


# ---------------------------------------------------------------------------------------------
# With the embedded tiny tokenizer
# ---------------------------------------------------------------------------------------------


def test_chat_template_renders_the_tiny_task(tiny):
    args = parse_args([
        "--prompt-data", str(tiny.train_path), "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--hf-checkpoint", str(tiny.model_dir), "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--num-rollout", "1",
    ])
    groups = RolloutDataSourceWithBuffer(args).get_samples(2)
    first_row = json.loads(tiny.train_path.read_text().splitlines()[0])
    question = first_row["prompt"][0]["content"]
    assert groups[0][0].prompt == f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    assert groups[0][0].label == first_row["label"] and len(groups[0]) == 4


def test_chat_template_needs_a_tokenizer(tiny):
    args = parse_args(["--prompt-data", str(tiny.train_path), "--input-key", "prompt", "--apply-chat-template",
                       "--rollout-batch-size", "2", "--global-batch-size", "2", "--num-rollout", "1"])
    with pytest.raises(UserError, match="--hf-checkpoint"):
        RolloutDataSource(args)


def test_long_prompts_are_dropped_by_token_count(tiny, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny.model_dir)
    rows = [{"question": q, "answer": "0"} for q in ("1+1=", "12+34=", "1234+5678=")]
    path = _write_jsonl(tmp_path / "lengths.jsonl", rows)
    rendered = [tokenizer.apply_chat_template([{"role": "user", "content": r["question"]}], tokenize=False,
                                              add_generation_prompt=True) for r in rows]
    lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in rendered]
    assert lengths[0] < lengths[1] < lengths[2]
    # --rollout-max-context-len L implies --rollout-max-prompt-len L - 1
    args = _args(path, "--apply-chat-template", "--rollout-max-context-len", str(lengths[1] + 1))
    kept = RolloutDataSource(args, tokenizer=tokenizer).dataset.samples
    assert [s.prompt for s in kept] == rendered[:2]
    args = _args(path, "--apply-chat-template", "--rollout-max-prompt-len", str(lengths[0] - 1))
    with pytest.raises(UserError, match="no prompts left"):
        RolloutDataSource(args, tokenizer=tokenizer)


def test_chat_template_kwargs_and_tools_reach_the_template(tiny, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny.model_dir)
    tokenizer.chat_template = (
        "{% if tools %}[{{ tools | length }} tools]{% endif %}{{ style }}:{{ messages[0].content }}"
    )
    tool = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}
    path = _write_jsonl(tmp_path / "tools.jsonl", [{"question": "3+5=", "answer": "8", "tools": [tool]}])
    args = _args(path, "--apply-chat-template", "--apply-chat-template-kwargs", '{"style": "terse"}')
    sample = RolloutDataSource(args, tokenizer=tokenizer).get_samples(1)[0][0]
    assert sample.prompt == "[1 tools]terse:3+5="
    assert sample.metadata["tools"] == [tool]
