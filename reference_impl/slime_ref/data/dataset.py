"""Reading prompt files into :class:`~slime_ref.types.Sample` objects (slime's ``slime/utils/data.py``).

A prompt file is ``.jsonl`` (one JSON object per line) or ``.parquet`` (one row per prompt), e.g.::

    {"prompt": [{"role": "user", "content": "3+5="}], "label": "8", "metadata": {"rm_type": "boxed_math"}}

``--input-key`` names the prompt column, ``--label-key`` the reference answer, ``--metadata-key`` a
dict stored on the sample, ``--tool-key`` tool schemas for the chat template. ``path@[start:end]``
reads a slice of the rows. With ``--apply-chat-template`` the prompt (a string or a list of chat
messages) is rendered with the tokenizer's template and a generation prompt.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import re
from collections.abc import Iterator
from typing import Any

from slime_ref.errors import UserError
from slime_ref.types import Sample

logger = logging.getLogger(__name__)

_ROW_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>\d*):(?P<end>\d*)\]$")


def split_row_slice(spec: str) -> tuple[str, slice | None]:
    """``"data.jsonl@[10:20]"`` -> ("data.jsonl", slice(10, 20)); a plain path -> (path, None)."""
    match = _ROW_SLICE.match(spec)
    if match is None:
        return spec, None
    start, end = (int(x) if x else None for x in (match["start"], match["end"]))
    return match["path"], slice(start, end)


def read_rows(spec: str, flag: str = "--prompt-data") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (row number, row dict) from a .jsonl or .parquet file (row numbers start at 1)."""
    path, row_slice = split_row_slice(spec)
    if not os.path.isfile(path):
        raise UserError(f"{flag} {path}: no such file; give a .jsonl or .parquet prompt file")
    if path.endswith(".jsonl"):
        rows = _jsonl_rows(path, flag)
    elif path.endswith(".parquet"):
        rows = _parquet_rows(path)
    else:
        raise UserError(f"{flag} {path}: unsupported file type; use .jsonl or .parquet")
    numbered = enumerate(rows, start=1)
    if row_slice is not None:
        numbered = itertools.islice(numbered, row_slice.start, row_slice.stop)
    yield from numbered


def _jsonl_rows(path: str, flag: str) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{flag} {path}:{line_number}: not valid JSON ({e.msg}); one object per line") from None
            if not isinstance(row, dict):
                raise UserError(f"{flag} {path}:{line_number}: a JSON object per line is expected")
            yield row


def _parquet_rows(path: str) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches():
        yield from batch.to_pylist()


def _as_dict(value: Any, flag: str, where: str) -> dict:
    if value is None:
        return {}
    if isinstance(value, str):  # parquet files often store metadata as a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise UserError(f"{flag}: {where} holds a string that is not JSON") from None
    if not isinstance(value, dict):
        raise UserError(f"{flag}: {where} must be a dict (or JSON object string), got {type(value).__name__}")
    return value


class PromptDataset:
    """The prompts of one file as Samples, in file order or a per-epoch seeded shuffle.

    ``samples`` is the current epoch's order; :meth:`shuffle` re-draws it from the file order with
    seed ``seed + epoch_id`` (Python's ``random``, as slime), so any epoch's order can be rebuilt.
    """

    def __init__(
        self,
        path: str,
        *,
        tokenizer=None,
        input_key: str = "input",
        label_key: str | None = None,
        metadata_key: str = "metadata",
        tool_key: str | None = "tools",
        apply_chat_template: bool = False,
        apply_chat_template_kwargs: dict | None = None,
        max_prompt_len: int | None = None,
        seed: int = 42,
    ):
        if (apply_chat_template or max_prompt_len is not None) and tokenizer is None:
            raise ValueError("apply_chat_template and max_prompt_len need a tokenizer")
        samples = []
        for row_number, row in read_rows(path):
            where = f"row {row_number} of {path}"
            if input_key not in row:
                raise UserError(f"--input-key {input_key!r}: {where} has no such key (keys: {sorted(row)})")
            prompt = row[input_key]
            if label_key is not None and label_key not in row:
                raise UserError(f"--label-key {label_key!r}: {where} has no such key (keys: {sorted(row)})")
            metadata = dict(_as_dict(row.get(metadata_key), "--metadata-key", where))
            tools = row.get(tool_key) if tool_key else None
            if isinstance(tools, str):
                tools = json.loads(tools)
            if tools is not None:
                metadata["tools"] = tools
            if apply_chat_template:
                prompt = _render_chat(tokenizer, prompt, tools, apply_chat_template_kwargs or {}, where)
            samples.append(
                Sample(prompt=prompt, label=row[label_key] if label_key is not None else None, metadata=metadata)
            )
        self.num_rows = len(samples)  # rows read, before prompts longer than max_prompt_len are dropped
        if max_prompt_len is not None:
            samples = _drop_long_prompts(samples, tokenizer, max_prompt_len)

        self.origin_samples = samples
        self.samples = samples
        self.seed = seed
        self.epoch_id = -1  # file order

    def shuffle(self, epoch_id: int) -> None:
        if epoch_id == self.epoch_id:
            return
        order = list(range(len(self.origin_samples)))
        random.Random(self.seed + epoch_id).shuffle(order)
        self.samples = [self.origin_samples[i] for i in order]
        self.epoch_id = epoch_id

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        return self.samples[index]


def _render_chat(tokenizer, prompt: Any, tools: Any, kwargs: dict, where: str) -> str:
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not (isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)):
        raise UserError(
            f"--apply-chat-template: the prompt in {where} must be a string or a list of "
            '{"role": ..., "content": ...} messages'
        )
    extra = {"tools": tools} if tools is not None else {}
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **extra, **kwargs)


def _drop_long_prompts(samples: list[Sample], tokenizer, max_prompt_len: int) -> list[Sample]:
    if not samples:
        return samples
    if not all(isinstance(s.prompt, str) for s in samples):
        logger.warning("--rollout-max-prompt-len is ignored for message-list prompts; add --apply-chat-template")
        return samples
    lengths = [len(ids) for ids in tokenizer([s.prompt for s in samples], add_special_tokens=False)["input_ids"]]
    kept = [s for s, n in zip(samples, lengths) if n <= max_prompt_len]
    dropped = len(samples) - len(kept)
    logger.info("dropped %d of %d prompts longer than %d tokens", dropped, len(samples), max_prompt_len)
    return kept
