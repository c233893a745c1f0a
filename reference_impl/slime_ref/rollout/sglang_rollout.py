"""The default rollout (``--rollout-function-path slime_ref.rollout.sglang_rollout.generate_rollout``).

One rollout, as in slime::

    while fewer than --rollout-batch-size groups are kept:
        draw --over-sampling-batch-size prompt groups from the data source
        for every sample, concurrently (at most --sglang-server-concurrency per engine in flight):
            POST the prompt's token ids to the router's /generate with return_logprob
            (or call --custom-generate-function-path), then score it (rewards.async_rm)
            -- a group of fresh samples served by this default goes as one batched /generate
               (SGLang's list-of-input_ids form): the same samples, one request instead of n
        (every group is sent with generation_state(args).sampling_params, slime's GenerateState's:
         built from the --rollout-* flags, open to a hook's changes)
        as each group finishes: --group-rm scoring, then --dynamic-sampling-filter-path keep/drop
        (slime-ref only: once --dynamic-sampling-max-groups groups have finished, stop drawing and
         fill the batch with the best dropped groups, filters.best_dropped_groups)
    abort what is still running on every engine; with --partial-rollout the half-done groups go
    back to the data source's buffer, to be continued in a later rollout
    --rollout-sample-filter-path sees the kept groups, --rollout-all-samples-process-path every
    finished group (dropped ones too) and the data source's get_samples

Evaluation (``evaluation=True``) generates ``--n-samples-per-eval-prompt`` responses for every
prompt of each ``--eval-prompt-data`` set and scores them.

Hook signatures are slime's: ``async def generate(args, sample, sampling_params[, evaluation])``
returns the Sample (or a list of Samples); reward hooks are in :mod:`slime_ref.rollout.rewards`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

from slime_ref.rollout.filters import (
    best_dropped_groups,
    call_dynamic_filter,
    drop_metrics,
    flatten_samples,
    guard_metrics,
    should_drop,
)
from slime_ref.rollout.rewards import async_rm, batched_async_rm
from slime_ref.rollout.sglang_client import SGLangClient
from slime_ref.types import Sample
from slime_ref.utils.async_loop import run
from slime_ref.utils.hooks import load_function

logger = logging.getLogger(__name__)
ROLLOUT_RETRIES = 60  # slime's http_utils.post max_retries

__all__ = ["RolloutFnEvalOutput", "RolloutFnTrainOutput", "call_rollout_fn", "generate", "generate_rollout",
           "generation_state", "sampling_params"]


@dataclass
class RolloutFnTrainOutput:
    samples: list[list[Sample]]
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]  # eval set name -> {"rewards": [...], "truncated": [...], "samples": [...]}
    metrics: dict[str, Any] = field(default_factory=dict)


def call_rollout_fn(fn, *args, evaluation: bool, **kwargs) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """Call a rollout function; a legacy one's bare result (groups, or the eval dict) is wrapped as slime does."""
    output = fn(*args, **kwargs, evaluation=evaluation)
    if isinstance(output, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
        return output
    return RolloutFnEvalOutput(data=output) if evaluation else RolloutFnTrainOutput(samples=output)


def router_url(args) -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"


def sampling_params(args, *, evaluation: bool = False) -> dict[str, Any]:
    """SGLang sampling parameters from slime's rollout (or eval) flags."""
    def pick(eval_value, rollout_value):
        return eval_value if evaluation and eval_value is not None else rollout_value

    return {
        "temperature": pick(getattr(args, "eval_temperature", None), args.rollout_temperature),
        "top_p": pick(getattr(args, "eval_top_p", None), args.rollout_top_p),
        "top_k": pick(getattr(args, "eval_top_k", None), args.rollout_top_k),
        "max_new_tokens": pick(getattr(args, "eval_max_response_len", None), args.rollout_max_response_len),
        "stop": args.rollout_stop,
        "stop_token_ids": args.rollout_stop_token_ids,
        "skip_special_tokens": args.rollout_skip_special_tokens,
        "no_stop_trim": True,  # keep the stop token: the trainer must see what the engine sampled
        "spaces_between_special_tokens": False,
    }


def deterministic_inference(args) -> bool:
    """slime's ``--sglang-enable-deterministic-inference``: every request carries a sampling seed."""
    return bool(getattr(args, "sglang_enable_deterministic_inference", False)
                or (getattr(args, "sglang_extra", None) or {}).get("sglang_enable_deterministic_inference"))


def group_sampling_seeds(args) -> list[int] | None:
    """slime v0.3.1's seeds with ``--sglang-enable-deterministic-inference``: sample ``i`` of every
    group is sent with ``sampling_seed = --rollout-seed + i`` (eval: ``+ j``, the j-th response to a
    prompt), so which tokens are drawn no longer depends on which request reached the engine first.
    None without the flag: the engine seeds each request itself."""
    if not deterministic_inference(args):
        return None
    return [args.rollout_seed + i for i in range(args.n_samples_per_prompt)]


def _seeded(params: dict[str, Any], seed: int | None) -> dict[str, Any]:
    params = dict(params)
    if seed is not None:
        params["sampling_seed"] = seed
    return params


class _GenerateState:
    """Per-process rollout state: tokenizer, the router client, the concurrency cap, in-flight groups."""

    def __init__(self, args):
        from slime_ref.data.source import load_tokenizer

        self.key = _state_key(args)
        self.tokenizer = load_tokenizer(args)
        self.use_args(args)
        # slime's post(): an answer of HTTP 5xx or no connection is retried 60 times, 1 s apart
        self.client = SGLangClient(router_url(args), retries=ROLLOUT_RETRIES, backoff_s=1.0, max_backoff_s=1.0)
        num_engines = max(1, len(getattr(args, "rollout_engine_urls", None) or [None]))
        self.capacity = args.sglang_server_concurrency * num_engines
        self.semaphore = asyncio.Semaphore(self.capacity)
        self._batch_lock = asyncio.Lock()
        self.pending: set[asyncio.Task] = set()
        self.remaining_batch_size = 0
        self.aborted = False
        self._engine_clients: dict[str, SGLangClient] = {}
        self._prompt_ids: dict[str, list[int]] = {}

    def use_args(self, args) -> None:
        """The training rollout's sampling parameters, built once per run's args as slime's
        GenerateState builds them. A hook may change them (``GenerateState(args).sampling_params``),
        and every group of the default rollout after that is sent with the change."""
        self.args = args
        self.sampling_params = sampling_params(args)

    def prompt_ids(self, prompt) -> list[int]:
        """The prompt's token ids. All samples of a group share one prompt: encode it once."""
        if not isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        ids = self._prompt_ids.get(prompt)
        if ids is None:
            if len(self._prompt_ids) >= 4096:  # bounded: a long run sees many prompts once each
                self._prompt_ids.clear()
            ids = self._prompt_ids[prompt] = self.tokenizer.encode(prompt, add_special_tokens=False)
        return list(ids)  # a copy: the sample appends its response to it

    @contextlib.asynccontextmanager
    async def slots(self, n: int):
        """Hold ``n`` (<= capacity) of the in-flight places at once. One batch gathers its places
        at a time, so two batches can never each hold part of what the other waits for."""
        async with self._batch_lock:
            for _ in range(n):
                await self.semaphore.acquire()
        try:
            yield
        finally:
            for _ in range(n):
                self.semaphore.release()

    def engine_client(self, url: str) -> SGLangClient:
        if url not in self._engine_clients:
            self._engine_clients[url] = SGLangClient(url, retries=1)
        return self._engine_clients[url]

    def reset(self) -> None:
        self.pending = set()
        self.remaining_batch_size = 0
        self.aborted = False


_STATE: _GenerateState | None = None


def _state_key(args) -> tuple:
    engines = tuple(getattr(args, "rollout_engine_urls", None) or ())
    return router_url(args), args.hf_checkpoint, args.sglang_server_concurrency, engines


def generation_state(args) -> _GenerateState:
    """The rollout's per-process state for this router and model (slime's GenerateState). Its
    semaphore and lock bind to the loop that first waits on them, the shared loop of ``run``."""
    global _STATE
    if _STATE is None or _STATE.key != _state_key(args):
        previous, _STATE = _STATE, _GenerateState(args)
        if previous is not None and previous.args is args:  # the same run on new engines (a restart)
            _STATE.sampling_params = previous.sampling_params  # keeps a hook's changes, as slime's singleton
    elif _STATE.args is not args:  # another run's args on the same router: its own sampling parameters
        _STATE.use_args(args)
    return _STATE


async def generate(args, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """The default per-sample generation: token ids in, response tokens and their log-probs out."""
    state = generation_state(args)
    if sample.status not in (Sample.Status.PENDING, Sample.Status.ABORTED):
        raise ValueError(f"sample {sample.index} is {sample.status.value}; only pending or aborted samples generate")
    if not sample.tokens:
        sample.tokens = state.prompt_ids(sample.prompt)
    params = dict(sampling_params)
    if params.get("max_new_tokens") is not None:
        # a partial sample continues with what is left of its budget
        params["max_new_tokens"] -= sample.response_length
        if params["max_new_tokens"] <= 0:
            sample.status = Sample.Status.TRUNCATED
            return sample
    out = await state.client.generate(sample.tokens, params, return_logprob=True)
    sample.append_response_tokens(
        args, tokens=out.output_ids, log_probs=out.output_log_probs or [], meta_info=out.meta_info, text=out.text
    )
    return sample


async def _custom_or_default_generate(args, sample, params, evaluation):
    path = sample.generate_function_path or getattr(args, "custom_generate_function_path", None)
    if path is None:
        return await generate(args, sample, params)
    fn = load_function(path, "--custom-generate-function-path")
    if "evaluation" in inspect.signature(fn).parameters:
        return await fn(args, sample, params, evaluation=evaluation)
    return await fn(args, sample, params)


async def generate_and_rm(args, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False):
    """Generate one sample (unless it is already finished) and score it (unless --group-rm)."""
    if args.partial_rollout and args.mask_offpolicy_in_partial_rollout and sample.response_length > 0:
        sample.loss_mask = [0] * sample.response_length  # tokens from an older policy are not trained on
    if sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED):
        return sample  # finished in an earlier, aborted rollout

    state = generation_state(args)
    async with state.semaphore:
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return sample
        sample = await _custom_or_default_generate(args, sample, sampling_params, evaluation)

    if args.group_rm:
        return sample
    samples = sample if isinstance(sample, list) else [sample]
    if any(s.status == Sample.Status.ABORTED for s in samples):
        return sample
    unscored = [s for s in samples if s.reward is None]
    if len(unscored) == 1 and not isinstance(sample, list):
        unscored[0].reward = await async_rm(args, unscored[0])
    elif unscored:
        for s, r in zip(unscored, await batched_async_rm(args, unscored)):
            s.reward = r
    return sample


def _served_by_default_generate(args, sample: Sample) -> bool:
    return (sample.generate_function_path or getattr(args, "custom_generate_function_path", None)) is None


async def generate_batch(args, samples: list[Sample], sampling_params: dict[str, Any]) -> list[Sample]:
    """:func:`generate` for fresh samples (pending, no response yet) in one batched /generate."""
    state = generation_state(args)
    for sample in samples:
        if not sample.tokens:
            sample.tokens = state.prompt_ids(sample.prompt)
    outs = await state.client.generate_batch([s.tokens for s in samples], sampling_params, return_logprob=True)
    for sample, out in zip(samples, outs):
        sample.append_response_tokens(
            args, tokens=out.output_ids, log_probs=out.output_log_probs or [], meta_info=out.meta_info, text=out.text
        )
    return samples


async def _generate_and_rm_fresh(args, samples: list[Sample], params: dict[str, Any]) -> list[Sample]:
    """Fresh samples of one group through :func:`generate_batch` (in batches of at most the
    in-flight capacity), then scored one by one (unless --group-rm), as generate_and_rm would."""
    state = generation_state(args)
    for start in range(0, len(samples), state.capacity):
        batch = samples[start:start + state.capacity]
        async with state.slots(len(batch)):
            if state.aborted:
                for sample in batch:
                    sample.status = Sample.Status.ABORTED
                continue
            await generate_batch(args, batch, params)
    if not args.group_rm:
        scored = [s for s in samples if s.status != Sample.Status.ABORTED and s.reward is None]
        for sample, reward in zip(scored, await asyncio.gather(*(async_rm(args, s) for s in scored))):
            sample.reward = reward
    return samples


async def generate_and_rm_group(args, group: list[Sample], sampling_params: dict[str, Any], evaluation: bool = False):
    state = generation_state(args)
    if state.aborted:
        return group
    seeds = group_sampling_seeds(args)
    # one batched /generate serves a group's fresh samples, with one set of sampling parameters: the
    # router takes no per-entry list; seeded samples (each its own seed) go one request each, as in slime
    fresh = [] if seeds else [
        i for i, s in enumerate(group)
        if s.status == Sample.Status.PENDING and s.response_length == 0 and _served_by_default_generate(args, s)]
    rest = sorted(set(range(len(group))) - set(fresh))
    done = await asyncio.gather(
        _generate_and_rm_fresh(args, [group[i] for i in fresh], dict(sampling_params)),
        *(generate_and_rm(args, group[i], _seeded(sampling_params, seeds[i % len(seeds)] if seeds else None),
                          evaluation) for i in rest),
    )
    out = list(group)
    for i, sample in zip(fresh, done[0]):
        out[i] = sample
    for i, result in zip(rest, done[1:]):
        out[i] = result
    group = out
    if args.group_rm and not state.aborted:
        for s, r in zip(group, await batched_async_rm(args, group)):
            s.reward = r
    return group


async def abort(args, rollout_id: int) -> list[list[Sample]]:
    """Stop every engine's in-flight requests; return the unfinished groups if --partial-rollout."""
    state = generation_state(args)
    state.aborted = True
    if state.pending:  # nothing in flight, nothing to abort
        urls = getattr(args, "rollout_engine_urls", None) or []
        await asyncio.gather(*(state.engine_client(url).abort_request(abort_all=True) for url in urls),
                             return_exceptions=True)
    partial = []
    while state.pending:
        done, state.pending = await asyncio.wait(state.pending, return_when=asyncio.FIRST_COMPLETED)
        if args.partial_rollout:
            for task in done:
                group = task.result()
                for s in flatten_samples(group):
                    if s.response and "start_rollout_id" not in s.metadata:
                        s.metadata["start_rollout_id"] = rollout_id
                partial.append(group)
    return partial


async def generate_rollout_async(args, rollout_id: int, get_samples) -> tuple[RolloutFnTrainOutput, list]:
    state = generation_state(args)
    state.reset()
    dynamic_filter = (
        load_function(args.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path")
        if args.dynamic_sampling_filter_path else None
    )
    params = dict(state.sampling_params)
    target = args.rollout_batch_size
    max_groups = getattr(args, "dynamic_sampling_max_groups", None) if dynamic_filter is not None else None
    kept: list[list[Sample]] = []
    finished: list[list[Sample]] = []  # every finished group, kept or dropped by the dynamic filter
    dropped: list[list[Sample]] = []
    drop_reasons: list[str | None] = []
    starved = False
    while len(kept) < target:
        if max_groups is not None and len(finished) >= max_groups:
            starved = True  # --dynamic-sampling-max-groups: stop drawing, fill from the dropped below
            break
        while state.remaining_batch_size < target:
            groups = get_samples(args.over_sampling_batch_size)
            if not groups:
                raise RuntimeError("the data source ran dry in the middle of a rollout")
            for group in groups:
                state.pending.add(asyncio.ensure_future(generate_and_rm_group(args, group, params)))
            state.remaining_batch_size += len(groups)
        done, state.pending = await asyncio.wait(state.pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            group = task.result()
            finished.append(group)
            verdict = call_dynamic_filter(dynamic_filter, args, group)
            if should_drop(verdict, remaining_batch_size=state.remaining_batch_size, target_data_size=target):
                dropped.append(group)
                drop_reasons.append(verdict.reason)
                state.remaining_batch_size -= 1
                continue
            if len(kept) < target:
                kept.append(group)
    aborted = await abort(args, rollout_id)
    state.reset()
    filled = []
    if starved:
        filled = best_dropped_groups(args, sorted(dropped, key=_group_index), target - len(kept))
        kept.extend(filled)
        logger.warning(
            "rollout %d: %d groups finished and --dynamic-sampling-filter-path kept %d of the %d needed; "
            "--dynamic-sampling-max-groups %d filled the batch with the %d best dropped groups",
            rollout_id, len(finished), len(kept) - len(filled), target, max_groups, len(filled))
    metrics = drop_metrics(drop_reasons)
    if dynamic_filter is not None:
        metrics.update(guard_metrics(args, finished, dropped, starved=starved, filled=len(filled)))
    kept.sort(key=_group_index)
    finished.sort(key=_group_index)
    # slime's two after-rollout hooks, with slime's arguments: the kept groups, then every group
    # together with what the rollout drew prompts from (the data source's get_samples)
    if getattr(args, "rollout_sample_filter_path", None):
        sample_filter = load_function(args.rollout_sample_filter_path, "--rollout-sample-filter-path")
        sample_filter(args, kept)
    if getattr(args, "rollout_all_samples_process_path", None):
        process = load_function(args.rollout_all_samples_process_path, "--rollout-all-samples-process-path")
        process(args, finished, get_samples)
    return RolloutFnTrainOutput(samples=kept, metrics=metrics), aborted


def _group_index(group: list) -> int:
    """The index a group sorts by; a group of a list-returning generate hook holds lists of samples."""
    first = group[0]
    while isinstance(first, list):
        first = first[0]
    return first.index


async def eval_rollout(args, rollout_id: int) -> RolloutFnEvalOutput:
    generation_state(args).reset()
    results = await asyncio.gather(*(_eval_one(args, name, path) for name, path in args.eval_datasets))
    return RolloutFnEvalOutput(data=dict(results))


_EVAL_DATASETS: dict[tuple, Any] = {}


async def _eval_one(args, name: str, path: str) -> tuple[str, dict[str, Any]]:
    from slime_ref.data.dataset import PromptDataset
    from slime_ref.data.source import load_tokenizer

    key = (path, args.hf_checkpoint, args.input_key, args.label_key, args.apply_chat_template)
    if key not in _EVAL_DATASETS:
        _EVAL_DATASETS[key] = PromptDataset(
            path,
            tokenizer=load_tokenizer(args),
            input_key=args.input_key,
            label_key=args.label_key,
            metadata_key=args.metadata_key,
            tool_key=args.tool_key,
            apply_chat_template=args.apply_chat_template,
            apply_chat_template_kwargs=args.apply_chat_template_kwargs,
        )
    dataset = _EVAL_DATASETS[key]
    params = sampling_params(args, evaluation=True)
    seeded = deterministic_inference(args)  # slime: the j-th response to each prompt gets --rollout-seed + j
    samples, sample_params = [], []
    for prompt_index, prompt_sample in enumerate(dataset.samples):
        for j in range(args.n_samples_per_eval_prompt):
            s = copy.deepcopy(prompt_sample)
            s.group_index, s.index = prompt_index, prompt_index * args.n_samples_per_eval_prompt + j
            samples.append(s)
            sample_params.append(_seeded(params, args.rollout_seed + j) if seeded else params)
    done = await asyncio.gather(*(generate_and_rm(args, s, p, evaluation=True) for s, p in zip(samples, sample_params)))
    flat = flatten_samples(done)
    flat.sort(key=lambda s: s.index)
    reward_key = args.eval_reward_key
    return name, {
        "rewards": [s.reward[reward_key] if reward_key else s.reward for s in flat],
        "truncated": [s.status == Sample.Status.TRUNCATED for s in flat],
        "group_index": [s.group_index for s in flat],
        "samples": flat,
    }


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    """slime's rollout-function signature; returns RolloutFnTrainOutput or RolloutFnEvalOutput."""
    if evaluation:
        return run(eval_rollout(args, rollout_id))
    output, aborted = run(generate_rollout_async(args, rollout_id, data_source.get_samples))
    if aborted:
        data_source.add_samples(aborted)
    return output
