"""The data source the rollout draws prompt groups from (slime's ``slime/rollout/data_source.py``).

``get_samples(n)`` returns ``n`` groups (``list[list[Sample]]``), each ``--n-samples-per-prompt``
copies of one prompt with a shared ``group_index`` and distinct ``index``. Prompts are served in
epochs: file order, or a fresh seeded shuffle per epoch with ``--rollout-shuffle``.

:class:`RolloutDataSourceWithBuffer` (the default ``--data-source-path``) also keeps a buffer of groups
the rollout hands back (``--partial-rollout``: groups aborted half-way, to be continued); the buffer
is drained first, through ``--buffer-filter-path`` (default :func:`pop_first`).

``state_dict()`` is the position (offset, epoch, counters and the buffer); the trainer's checkpoint
carries it and ``load_state_dict`` restores it on ``--load``, so a resumed run is served exactly the
prompts an uninterrupted run would have been.
"""

from __future__ import annotations

import functools
import inspect
import logging
import pickle

from slime_ref.data.dataset import PromptDataset
from slime_ref.errors import UserError
from slime_ref.types import Sample
from slime_ref.utils.hooks import load_function

logger = logging.getLogger(__name__)


def load_tokenizer(args):
    if not args.hf_checkpoint:
        raise UserError("--apply-chat-template and --rollout-max-prompt-len need a tokenizer: pass --hf-checkpoint")
    return _cached_tokenizer(args.hf_checkpoint)


@functools.lru_cache(maxsize=4)
def _cached_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=True)


class RolloutDataSource:
    """Prompt groups from ``--prompt-data``, epoch by epoch. Read-only: :meth:`add_samples` refuses."""

    def __init__(self, args, tokenizer=None):
        self.args = args
        self.epoch_id = 0
        self.sample_offset = 0  # position in the current epoch's order
        self.sample_group_index = 0
        self.sample_index = 0
        self.metadata: dict = {}

        self.dataset: PromptDataset | None = None
        if args.rollout_global_dataset and args.prompt_data is not None:
            needs_tokenizer = args.apply_chat_template or args.rollout_max_prompt_len is not None
            if needs_tokenizer and tokenizer is None:
                tokenizer = load_tokenizer(args)
            self.dataset = PromptDataset(
                args.prompt_data,
                tokenizer=tokenizer,
                input_key=args.input_key,
                label_key=args.label_key,
                metadata_key=args.metadata_key,
                tool_key=args.tool_key,
                apply_chat_template=args.apply_chat_template,
                apply_chat_template_kwargs=args.apply_chat_template_kwargs,
                max_prompt_len=args.rollout_max_prompt_len,
                seed=args.rollout_seed,
            )
            if len(self.dataset) == 0:
                if self.dataset.num_rows == 0:
                    raise UserError(f"--prompt-data {args.prompt_data}: no prompts in it (an empty file, or an "
                                    "empty row slice); give one JSON object per line")
                raise UserError(
                    f"--prompt-data {args.prompt_data}: no prompts left, all {self.dataset.num_rows} are longer than "
                    f"--rollout-max-prompt-len {args.rollout_max_prompt_len} tokens; raise it"
                )
            if args.rollout_shuffle:
                self.dataset.shuffle(self.epoch_id)

    def __len__(self) -> int:
        return 0 if self.dataset is None else len(self.dataset)

    def _next_prompts(self, num_prompts: int) -> list[Sample]:
        if self.dataset is None:  # prompts come from a custom rollout function
            return [Sample() for _ in range(num_prompts)]
        prompts: list[Sample] = []
        while len(prompts) < num_prompts:
            if self.sample_offset >= len(self.dataset):  # epoch finished: start the next one
                self.epoch_id += 1
                self.sample_offset = 0
                if self.args.rollout_shuffle:
                    self.dataset.shuffle(self.epoch_id)
            take = min(num_prompts - len(prompts), len(self.dataset) - self.sample_offset)
            prompts += self.dataset.samples[self.sample_offset : self.sample_offset + take]
            self.sample_offset += take
        return prompts

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """``num_samples`` groups of ``n_samples_per_prompt`` fresh copies of the next prompts."""
        groups = []
        for prompt in self._next_prompts(num_samples):
            group = []
            # deep copies of plain data; one pickle per prompt is much cheaper than n deepcopy calls
            blob = pickle.dumps(prompt, protocol=pickle.HIGHEST_PROTOCOL)
            for _ in range(self.args.n_samples_per_prompt):
                sample = pickle.loads(blob)
                sample.group_index = self.sample_group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            groups.append(group)
        return groups

    def add_samples(self, samples: list[list[Sample]]) -> None:
        raise RuntimeError(f"{type(self).__name__} is read-only; use RolloutDataSourceWithBuffer to add samples")

    def state_dict(self) -> dict:
        return {
            "sample_offset": self.sample_offset,
            "epoch_id": self.epoch_id,
            "sample_group_index": self.sample_group_index,
            "sample_index": self.sample_index,
            "metadata": self.metadata,
            "num_prompts": len(self),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_prompts", len(self)) != len(self):
            raise UserError(
                f"--prompt-data {self.args.prompt_data}: {len(self)} prompts now, but the checkpoint was taken "
                f"with {state['num_prompts']}; resume with the same prompt file and --rollout-max-prompt-len"
            )
        self.sample_offset = state["sample_offset"]
        self.epoch_id = state["epoch_id"]
        self.sample_group_index = state["sample_group_index"]
        self.sample_index = state["sample_index"]
        self.metadata = state.get("metadata", {})
        if self.dataset is not None and self.args.rollout_shuffle:
            self.dataset.shuffle(self.epoch_id)


def pop_first(args, rollout_id, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    """Default buffer filter: take up to ``num_samples`` groups from the front of the buffer."""
    taken = buffer[:num_samples]
    del buffer[:num_samples]
    return taken


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """A data source that serves groups handed back by the rollout before new prompts."""

    def __init__(self, args, tokenizer=None):
        super().__init__(args, tokenizer)
        self.buffer: list[list[Sample]] = []
        if args.buffer_filter_path is None:
            self.buffer_filter = pop_first
        else:
            self.buffer_filter = load_function(args.buffer_filter_path, "--buffer-filter-path")

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        groups = self.buffer_filter(self.args, None, self.buffer, num_samples) if self.buffer else []
        if len(groups) < num_samples:
            groups += super().get_samples(num_samples - len(groups))
        return groups

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Append whole groups (e.g. aborted ones with ``--partial-rollout``) to the buffer."""
        for group in samples:
            if not isinstance(group, list) or len(group) != self.args.n_samples_per_prompt:
                raise ValueError(f"add_samples takes groups of n_samples_per_prompt={self.args.n_samples_per_prompt}")
            self.buffer.append(group)

    def get_buffer_length(self) -> int:
        return len(self.buffer)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["buffer"] = [[sample.to_dict() for sample in group] for group in self.buffer]
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.buffer = [[Sample.from_dict(d) for d in group] for group in state.get("buffer", [])]


def make_data_source(args, tokenizer=None):
    """Instantiate ``--data-source-path`` (default :class:`RolloutDataSourceWithBuffer`)."""
    source_class = load_function(args.data_source_path, "--data-source-path")
    if tokenizer is not None and "tokenizer" in inspect.signature(source_class).parameters:
        # slime-ref's own sources take the tokenizer already loaded, instead of loading it again
        return source_class(args, tokenizer=tokenizer)
    return source_class(args)  # slime constructs a data source as cls(args)


def resolve_num_rollout(args, num_prompts: int) -> int | None:
    """Fill ``args.num_rollout`` from ``--num-epoch`` when unset: epochs x (prompts // rollout_batch_size).

    Returns the rollouts in one epoch when ``--num-epoch`` set the count (epoch ends then also trigger
    save and eval, as in slime), else None. Fewer prompts than one rollout batch is a UserError.
    """
    if args.num_rollout is not None:
        return None
    per_epoch = num_prompts // args.rollout_batch_size
    if per_epoch == 0:
        raise UserError(
            f"--num-epoch: {num_prompts} prompts are fewer than --rollout-batch-size "
            f"{args.rollout_batch_size}; set --num-rollout or use a smaller batch"
        )
    args.num_rollout = per_epoch * args.num_epoch
    return per_epoch
