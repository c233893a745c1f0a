"""The embedded default: a tiny Qwen3, its tokenizer and a verifiable arithmetic task, built offline.

Everything here is generated from a seed on the local machine; nothing is downloaded. The same seed
gives byte-identical files, so tests, benchmarks and the quick start all run on the same model.

Layout written by :func:`make_tiny` (``slime-ref make-tiny --out DIR``)::

    DIR/
      model/            HF checkpoint: config.json, generation_config.json, model.safetensors,
                        tokenizer.json, tokenizer_config.json, chat_template.jinja
      data/train.jsonl  RL prompts in slime's format: {"prompt": [{"role": "user", ...}], "label": "8"}
      data/eval.jsonl   held-out prompts, same format
      data/sft.jsonl    supervised warm-up rows: {"messages": [user, assistant]} (all problems, mixed styles)
      manifest.json     seed, shapes, and the sha256 of every file above

The task is single-digit addition, ``"3+5="`` -> ``"8"``: 100 problems, split by a seeded shuffle
into train and eval. The reward is slime's ``math`` rule: only an answer written as ``\\boxed{8}`` counts.

The warm-up set plays the part of prior knowledge. It covers the whole table (train and eval
problems) in mixed answer styles: one row in three is boxed, the others are bare numbers. A short
supervised warm-up therefore leaves a model that knows part of the table but rarely boxes its
answer: its sampled reward is low but not zero. GRPO, which only ever sees train prompts, then
teaches the boxed format and sharpens the answers, and both carry over to the held-out eval prompts.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slime_ref.utils.fileio import atomic_directory

# Special tokens in ChatML order. They are added as special tokens and never appear in the text the
# BPE model is trained on, so no merge can produce a piece like "<|im_sta".
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, UNK_TOKEN]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the embedded Qwen3. Small enough for a CPU step in milliseconds, TP-splittable by 2 and 4."""

    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    vocab_multiple: int = 64  # padded vocab, like Megatron's make-vocab-size-divisible-by


@dataclass(frozen=True)
class TinyTaskConfig:
    """Single-digit arithmetic. ``ops`` may add "-" (a >= b, so answers stay non-negative) or "*"."""

    ops: tuple[str, ...] = ("+",)
    max_operand: int = 9
    eval_fraction: float = 0.2
    # answer styles of the warm-up rows written for each problem; the reward accepts only "boxed"
    sft_styles: tuple[str, ...] = ("boxed", "plain", "plain")
    rm_type: str = "math"


@dataclass
class TinyAssets:
    root: Path
    model_dir: Path
    train_path: Path
    eval_path: Path
    sft_path: Path
    manifest: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# task


def arithmetic_problems(task: TinyTaskConfig) -> list[tuple[str, str]]:
    """All (question, answer) pairs of the task, in a fixed order."""
    problems = []
    for op in task.ops:
        for a in range(task.max_operand + 1):
            for b in range(task.max_operand + 1):
                if op == "+":
                    ans = a + b
                elif op == "-":
                    if a < b:
                        continue
                    ans = a - b
                elif op == "*":
                    ans = a * b
                else:
                    raise ValueError(f"unknown op {op!r}; choose from + - *")
                problems.append((f"{a}{op}{b}=", str(ans)))
    return problems


def split_problems(problems: list[tuple[str, str]], eval_fraction: float, seed: int):
    order = list(range(len(problems)))
    random.Random(seed).shuffle(order)
    n_eval = max(1, round(len(problems) * eval_fraction))
    eval_idx = sorted(order[:n_eval])
    train_idx = sorted(order[n_eval:])
    return [problems[i] for i in train_idx], [problems[i] for i in eval_idx]


def prompt_row(question: str, answer: str) -> dict:
    return {"prompt": [{"role": "user", "content": question}], "label": answer}


def styled_answer(answer: str, style: str) -> str:
    if style == "boxed":
        return "\\boxed{" + answer + "}"
    if style == "plain":
        return answer
    raise ValueError(f"unknown answer style {style!r}; choose boxed or plain")


def sft_row(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# tokenizer


def _tokenizer_corpus(seed: int, n: int = 3000) -> list[str]:
    """Chat-shaped arithmetic text without the special-token strings (see SPECIAL_TOKENS)."""
    rng = random.Random(seed)
    roles = ["system\nYou are a helpful assistant.\n", ""]
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        op = rng.choice(["+", "-", "*"])
        ans = {"+": a + b, "-": a - b, "*": a * b}[op]
        q = rng.choice([f"{a}{op}{b}=", f"What is {a} {op} {b}?", f"Compute {a}{op}{b}."])
        a_text = rng.choice([f"{ans}", f"The answer is {ans}.", f"\\boxed{{{ans}}}"])
        lines.append(f"{rng.choice(roles)}user\n{q}\nassistant\n{a_text}\n")
    return lines


def build_tokenizer(seed: int = 0, vocab_size: int = 200):
    """A BPE tokenizer trained locally, wrapped as a transformers fast tokenizer with a ChatML template.

    Digits are always single tokens (``Digits(individual_digits=True)``), so numbers tokenize the same
    way in prompts, answers and labels.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator(_tokenizer_corpus(seed), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START],
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.model_max_length = 512
    return hf_tok


# ---------------------------------------------------------------------------------------------
# model


def padded_vocab_size(n_tokens: int, multiple: int) -> int:
    return -(-n_tokens // multiple) * multiple


def build_model(tokenizer, model_cfg: TinyModelConfig, seed: int):
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=padded_vocab_size(len(tokenizer), model_cfg.vocab_multiple),
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_hidden_layers,
        num_attention_heads=model_cfg.num_attention_heads,
        num_key_value_heads=model_cfg.num_key_value_heads,
        head_dim=model_cfg.head_dim,
        max_position_embeddings=model_cfg.max_position_embeddings,
        rms_norm_eps=model_cfg.rms_norm_eps,
        rope_theta=model_cfg.rope_theta,
        tie_word_embeddings=model_cfg.tie_word_embeddings,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.pad_token_id
    )
    return model


# ---------------------------------------------------------------------------------------------
# entry point


def _make_portable(model_dir: Path) -> None:
    """Name the tokenizer class that every transformers release (4.x and 5.x) and SGLang load."""
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assets_at(root: Path, manifest: dict) -> TinyAssets:
    return TinyAssets(
        root=root,
        model_dir=root / "model",
        train_path=root / "data" / "train.jsonl",
        eval_path=root / "data" / "eval.jsonl",
        sft_path=root / "data" / "sft.jsonl",
        manifest=manifest,
    )


def _request(seed: int, model_cfg: TinyModelConfig, task_cfg: TinyTaskConfig) -> dict:
    # JSON has no tuples: store lists so a reloaded manifest compares equal to a fresh request
    return json.loads(json.dumps({"seed": seed, "model": asdict(model_cfg), "task": asdict(task_cfg)}))


def load_tiny(root: str | os.PathLike) -> TinyAssets:
    """Open assets written earlier by :func:`make_tiny`; raises FileNotFoundError if absent."""
    root = Path(root)
    manifest = json.loads((root / MANIFEST).read_text())
    return _assets_at(root, manifest)


def verify_tiny(root: str | os.PathLike) -> list[str]:
    """Names of files whose content no longer matches the manifest (empty when intact)."""
    assets = load_tiny(root)
    bad = []
    for rel, digest in assets.manifest["files"].items():
        p = assets.root / rel
        if not p.is_file() or _sha256(p) != digest:
            bad.append(rel)
    return bad


def make_tiny(
    out: str | os.PathLike,
    seed: int = 0,
    model_cfg: TinyModelConfig | None = None,
    task_cfg: TinyTaskConfig | None = None,
    force: bool = False,
) -> TinyAssets:
    """Build the embedded default into ``out`` (atomically) and return its paths.

    If ``out`` already holds intact assets built with the same seed and shapes, they are reused.
    """
    model_cfg = model_cfg or TinyModelConfig()
    task_cfg = task_cfg or TinyTaskConfig()
    out = Path(out)
    request = _request(seed, model_cfg, task_cfg)
    if not force and (out / MANIFEST).is_file():
        try:
            existing = load_tiny(out)
            if existing.manifest.get("request") == request and not verify_tiny(out):
                return existing
        except (OSError, ValueError, KeyError):
            pass

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the caller shows its own progress
    with atomic_directory(out) as tmp:
        model_dir = tmp / "model"
        data_dir = tmp / "data"
        data_dir.mkdir(parents=True)
        tokenizer = build_tokenizer(seed)
        model = build_model(tokenizer, model_cfg, seed)
        model.save_pretrained(model_dir, safe_serialization=True)
        tokenizer.save_pretrained(model_dir)

        problems = arithmetic_problems(task_cfg)
        train, evals = split_problems(problems, task_cfg.eval_fraction, seed)
        _write_jsonl(data_dir / "train.jsonl", [prompt_row(q, a) for q, a in train])
        _write_jsonl(data_dir / "eval.jsonl", [prompt_row(q, a) for q, a in evals])
        _write_jsonl(
            data_dir / "sft.jsonl",
            [sft_row(q, styled_answer(a, style)) for q, a in problems for style in task_cfg.sft_styles],
        )
        _make_portable(model_dir)

        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        for p in [tmp, *tmp.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        manifest = {
            "request": request,
            "torch": torch.__version__.split("+")[0],
            "vocab_size": model.config.vocab_size,
            "tokenizer_size": len(tokenizer),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "num_train": len(train),
            "num_eval": len(evals),
            "num_sft": len(problems) * len(task_cfg.sft_styles),
            "rm_type": task_cfg.rm_type,
            "files": {p.relative_to(tmp).as_posix(): _sha256(p) for p in files},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return _assets_at(out, manifest)
