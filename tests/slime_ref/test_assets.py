"""The embedded default: loads with transformers, generates, round-trips, and is deterministic."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slime_ref import assets as A


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_files_and_manifest(tiny):
    names = {p.name for p in tiny.model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert A.verify_tiny(tiny.root) == []
    cfg = json.loads((tiny.model_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["vocab_size"] % 64 == 0 and cfg["vocab_size"] >= tiny.manifest["tokenizer_size"]


def test_model_loads_and_generates(tiny):
    tok = AutoTokenizer.from_pretrained(tiny.model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == tiny.manifest["num_parameters"]
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "3+5="}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    torch.manual_seed(0)
    out = model.generate(ids, max_new_tokens=6, do_sample=True, attention_mask=torch.ones_like(ids))
    assert out.shape[0] == 1 and ids.shape[1] < out.shape[1] <= ids.shape[1] + 6
    assert out[0, : ids.shape[1]].tolist() == ids[0].tolist()


def test_tokenizer_special_tokens(tiny):
    tok = AutoTokenizer.from_pretrained(tiny.model_dir)
    assert tok.eos_token == A.IM_END and tok.pad_token == A.PAD_TOKEN
    assert tok.eos_token_id != tok.pad_token_id
    for special in A.SPECIAL_TOKENS:
        ids = tok(special, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, f"{special} must be one token, got {ids}"
    # No learned BPE piece may contain part of a special-token string.
    vocab = tok.get_vocab()
    learned = [piece for piece in vocab if piece not in A.SPECIAL_TOKENS]
    assert not [p for p in learned if "<|" in p or "|>" in p]
    # The model and config agree on the ids.
    cfg = json.loads((tiny.model_dir / "config.json").read_text())
    assert cfg["eos_token_id"] == tok.eos_token_id and cfg["pad_token_id"] == tok.pad_token_id


@pytest.mark.parametrize(
    "text",
    ["3+5=", "What is 12 * 7?", "\\boxed{18}", "The answer is 42.", "user\n9-4=\nassistant\n5\n"],
)
def test_tokenizer_round_trips_text(tiny, text):
    tok = AutoTokenizer.from_pretrained(tiny.model_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text


def test_digits_are_single_tokens(tiny):
    tok = AutoTokenizer.from_pretrained(tiny.model_dir)
    pieces = tok.tokenize("1234567890")
    assert pieces == list("1234567890")


def test_chat_template_is_chatml_and_round_trips(tiny):
    tok = AutoTokenizer.from_pretrained(tiny.model_dir)
    messages = [{"role": "user", "content": "3+5="}, {"role": "assistant", "content": "\\boxed{8}"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == "<|im_start|>user\n3+5=<|im_end|>\n<|im_start|>assistant\n\\boxed{8}<|im_end|>\n"
    prompt = tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert ids.count(tok.eos_token_id) == 2


def test_task_rows_follow_slime_format(tiny):
    train, evals, sft = _rows(tiny.train_path), _rows(tiny.eval_path), _rows(tiny.sft_path)
    assert (len(train), len(evals), len(sft)) == (80, 20, 300)
    for row in train + evals:
        assert set(row) == {"prompt", "label"}
        (msg,) = row["prompt"]
        assert msg["role"] == "user"
        a, b = msg["content"].rstrip("=").split("+")
        assert int(row["label"]) == int(a) + int(b)
    train_q = {r["prompt"][0]["content"] for r in train}
    eval_q = {r["prompt"][0]["content"] for r in evals}
    assert not train_q & eval_q, "train and eval splits must be disjoint"
    assert len(train_q | eval_q) == 100
    styles = [r["messages"][1]["content"].startswith("\\boxed{") for r in sft]
    assert sum(styles) == 100, "one warm-up row in three is boxed"
    assert {r["messages"][0]["content"] for r in sft} == train_q | eval_q


def test_same_seed_gives_byte_identical_files(tiny, tmp_path):
    again = A.make_tiny(tmp_path / "again", seed=0)
    assert again.manifest["files"] == tiny.manifest["files"]
    for rel in tiny.manifest["files"]:
        assert (tiny.root / rel).read_bytes() == (again.root / rel).read_bytes(), rel


def test_other_seed_gives_other_weights_and_split(tiny, tmp_path):
    other = A.make_tiny(tmp_path / "other", seed=1)
    assert other.manifest["files"]["model/model.safetensors"] != tiny.manifest["files"]["model/model.safetensors"]
    assert other.train_path.read_bytes() != tiny.train_path.read_bytes()


def test_existing_assets_are_reused_and_damage_is_rebuilt(tmp_path):
    out = tmp_path / "tiny"
    A.make_tiny(out, seed=0)
    mtime = (out / "model" / "model.safetensors").stat().st_mtime_ns
    A.make_tiny(out, seed=0)
    assert (out / "model" / "model.safetensors").stat().st_mtime_ns == mtime
    (out / "data" / "train.jsonl").write_text("damaged\n")
    assert A.verify_tiny(out) == ["data/train.jsonl"]
    A.make_tiny(out, seed=0)
    assert A.verify_tiny(out) == []


def test_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(A, "split_problems", boom)
    with pytest.raises(RuntimeError):
        A.make_tiny(tmp_path / "tiny", seed=0)
    assert list(tmp_path.iterdir()) == []
