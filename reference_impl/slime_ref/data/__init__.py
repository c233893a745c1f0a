"""Prompt data: files -> Samples (:mod:`.dataset`) and the data source with its buffer (:mod:`.source`)."""

from slime_ref.data.dataset import PromptDataset, read_rows
from slime_ref.data.source import (
    RolloutDataSource,
    RolloutDataSourceWithBuffer,
    make_data_source,
    pop_first,
    resolve_num_rollout,
)

__all__ = [
    "PromptDataset",
    "RolloutDataSource",
    "RolloutDataSourceWithBuffer",
    "make_data_source",
    "pop_first",
    "read_rows",
    "resolve_num_rollout",
]
