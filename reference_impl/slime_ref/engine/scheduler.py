"""Continuous batching for the built-in engine: one scheduler thread owns the model.

The HTTP side submits requests and control operations into an inbox; the scheduler thread loops:

1. take new requests, aborts and control operations from the inbox;
2. run control operations when allowed (a weight update waits until no request is running, unless
   generation is paused, which is how SGLang's update lock behaves);
3. admit waiting requests into free KV slots (not while paused or while an update waits);
4. one prefill step for the newly admitted requests, one decode step for all the others;
5. sample, check stop conditions, and hand finished requests back with SGLang's response fields.

Requests join and leave the running batch between steps, so concurrent requests share every step.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slime_ref.engine.model_runner import ModelRunner
from slime_ref.engine.sampling import SamplingParams, sample

logger = logging.getLogger(__name__)

# Pause modes of SGLang's /pause_generation.
PAUSE_MODES = ("abort", "retract", "in_place")


@dataclass
class Request:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    logprob_start_len: int  # -1: no prompt log-probs (SGLang's default)
    rng: random.Random
    on_finish: Callable[[dict[str, Any]], None]
    max_new_tokens: int = 0
    created: float = field(default_factory=time.time)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    input_logprobs: list[list[Any]] = field(default_factory=list)
    slot: int | None = None
    num_cached: int = 0  # tokens of input_ids + output_ids whose keys/values are in the slot
    finished_reason: dict[str, Any] | None = None
    num_retractions: int = 0
    cached_tokens: int = 0  # prompt tokens whose keys/values were copied from an identical request
    forced_ids: list[int] | None = None  # a scripted answer (engine.script): these tokens, not sampled ones

    @property
    def all_ids(self) -> list[int]:
        return self.input_ids + self.output_ids


@dataclass
class _Control:
    """A control operation run on the scheduler thread. ``exclusive`` ones need an idle model."""

    fn: Callable[[], Any]
    done: Callable[[Any, BaseException | None], None]
    exclusive: bool


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner,
        tokenizer,
        *,
        random_seed: int = 0,
        weight_version: str = "default",
        eos_token_ids: set[int] | None = None,
    ):
        self.runner = runner
        self.tokenizer = tokenizer
        self.random_seed = random_seed
        self.weight_version = weight_version
        self.eos_token_ids = set(eos_token_ids or ())
        self.paused = False
        self.num_finished = 0
        self.num_generated_tokens = 0
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._controls: deque[_Control] = deque()
        self._free_slots = list(range(runner.max_running_requests - 1, -1, -1))
        self._request_counter = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)

    # ------------------------------------------------------------------------------------------
    # called from other threads

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout=10)

    def new_rng(self, sampling_seed: int | None) -> random.Random:
        """A request's own generator: its sampling_seed, else the server seed and an arrival counter."""
        if sampling_seed is not None:
            return random.Random(sampling_seed)
        self._request_counter += 1
        return random.Random(f"{self.random_seed}:{self._request_counter}")

    def submit(self, req: Request) -> None:
        self._inbox.put(("add", [req]))

    def submit_many(self, reqs: list[Request]) -> None:
        """Requests that arrived together (one batched /generate): admitted together."""
        self._inbox.put(("add", list(reqs)))

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        self._inbox.put(("abort", (rid, abort_all)))

    def control(self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None], *,
                exclusive: bool = False) -> None:
        self._inbox.put(("control", _Control(fn, done, exclusive)))

    def load(self) -> dict[str, int]:
        """Requests and KV tokens right now. Safe from any thread: each queue is copied in one step.

        ``num_used_tokens``: tokens whose keys/values the running requests hold (prompt and output so
        far); ``num_pending_tokens``: the tokens of the waiting requests; ``num_pending_controls``:
        control operations not yet run (a weight update or memory release waits here for the running
        requests to finish, and holds new ones back meanwhile)."""
        running, waiting, controls = list(self._running), list(self._waiting), list(self._controls)
        return {
            "num_running_reqs": len(running),
            "num_waiting_reqs": len(waiting),
            "num_used_tokens": sum(r.num_cached for r in running),
            "num_pending_tokens": sum(len(r.input_ids) + len(r.output_ids) for r in waiting),
            "num_pending_controls": len(controls),
        }

    # ------------------------------------------------------------------------------------------
    # scheduler thread

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain_inbox(block=not self._has_work())
                self._run_controls()
                if not self.paused:
                    self._admit()
                    self._step([r for r in self._running if r.num_cached == 0])
                    self._step([r for r in self._running if r.num_cached > 0])
            except Exception as e:  # a bug must fail the requests, not wedge the server
                logger.exception("scheduler step failed")
                for req in list(self._running) + list(self._waiting):
                    self._finish(req, {"type": "abort", "message": f"engine error: {e}", "status_code": 500,
                                       "err_type": type(e).__name__})

    def _has_work(self) -> bool:
        """Whether the loop can make progress now (else it blocks on the inbox instead of spinning)."""
        if self._controls:
            return True
        if self.paused:
            return False
        can_admit = self._waiting and self._free_slots and self.runner.kv_pool_allocated
        return bool(self._running or can_admit)

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = item
            if kind == "add":
                for req in payload:
                    self._add(req)
            elif kind == "abort":
                self._abort(*payload)
            elif kind == "control":
                self._controls.append(payload)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, req: Request) -> None:
        room = self.runner.context_length - len(req.input_ids)
        if room <= 0:
            req.on_finish({"error": f"the input ({len(req.input_ids)} tokens) is longer than the model's "
                                    f"context length ({self.runner.context_length} tokens)."})
            return
        limit = req.params.max_new_tokens
        req.max_new_tokens = room if limit is None else min(limit, room)
        self._waiting.append(req)

    def _abort(self, rid: str, abort_all: bool) -> None:
        # As SGLang: an rid no request has exactly is ignored; a known one also ends the requests
        # whose rid starts with it (the scheduler matches by prefix).
        if not abort_all and not any(r.rid == rid for r in [*self._waiting, *self._running]):
            return
        for req in [r for r in self._waiting if abort_all or r.rid.startswith(rid)]:
            self._waiting.remove(req)
            self._finish(req, {"type": "abort", "message": "Abort in waiting queue", "status_code": None,
                               "err_type": None})
        for req in [r for r in self._running if abort_all or r.rid.startswith(rid)]:
            self._finish(req, {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None})

    def _run_controls(self) -> None:
        while self._controls:
            op = self._controls[0]
            if op.exclusive and self._running and not self.paused:
                return  # wait for the running requests to finish; admission is held meanwhile
            self._controls.popleft()
            try:
                result, error = op.fn(), None
            except Exception as e:
                result, error = None, e
            op.done(result, error)

    def _admit(self) -> None:
        if any(op.exclusive for op in self._controls) or not self.runner.kv_pool_allocated:
            return
        while self._waiting and self._free_slots:
            req = self._waiting.popleft()
            req.slot = self._free_slots.pop()
            req.num_cached = 0
            self._running.append(req)

    def _step(self, batch: list[Request]) -> None:
        if not batch:
            return
        # Prompt log-probs are computed on a request's first prefill only.
        want_prompt = [r.return_logprob and r.logprob_start_len >= 0 and not r.output_ids and r.num_cached == 0
                       for r in batch]
        # Identical prefills (the n samples of a group) are computed once: a copy takes the first one's
        # keys/values and next-token logits, and then samples on its own.
        computed, copies, first = [], [], {}
        for b, req in enumerate(batch):
            if req.num_cached == 0 and not want_prompt[b]:
                key = tuple(req.all_ids)
                if key in first:
                    copies.append((first[key], b))
                    continue
                first[key] = b
            computed.append(b)
        new_tokens = [batch[b].all_ids[batch[b].num_cached:] for b in computed]
        out = self.runner.forward([batch[b].slot for b in computed], new_tokens,
                                  [batch[b].num_cached for b in computed], [want_prompt[b] for b in computed])
        row = {}
        for i, b in enumerate(computed):
            req = batch[b]
            if want_prompt[b]:
                req.input_logprobs = _prompt_logprobs(req.input_ids, out.chunk_logits[i], req.logprob_start_len)
            req.num_cached += len(new_tokens[i])
            row[b] = i
        if copies:
            self.runner.copy_cache([(batch[src].slot, batch[dst].slot, batch[src].num_cached) for src, dst in copies])
            for src, dst in copies:
                batch[dst].num_cached = batch[src].num_cached
                batch[dst].cached_tokens = min(batch[src].num_cached, len(batch[dst].input_ids))
                row[dst] = row[src]
        keep = [b for b, r in enumerate(batch) if r.max_new_tokens > 0]
        for req in batch:
            if req.max_new_tokens == 0:  # prompt scoring, nothing to sample
                self._finish(req, {"type": "length", "length": 0})
        batch, logits = [batch[b] for b in keep], out.last_logits[[row[b] for b in keep]]
        if not batch:
            return
        forced = [r.forced_ids[len(r.output_ids)] if r.forced_ids and len(r.output_ids) < len(r.forced_ids) else None
                  for r in batch]
        tokens, logprobs = sample(logits, [r.params for r in batch], [r.rng for r in batch], forced)
        for req, token, logprob in zip(batch, tokens, logprobs):
            req.output_ids.append(token)
            req.output_logprobs.append(logprob)
            self.num_generated_tokens += 1
            reason = self._finish_reason(req)
            if reason is not None:
                self._finish(req, reason)

    def _finish_reason(self, req: Request) -> dict[str, Any] | None:
        """SGLang's order: the length limit first, then stop strings, then stop tokens."""
        if len(req.output_ids) >= req.max_new_tokens:
            return {"type": "length", "length": req.max_new_tokens}
        if req.params.stop:
            # A stop string ends within the last len(stop) tokens (plus slack for tokens that decode to
            # nothing), so only that tail is decoded each step, as SGLang does.
            window = max(len(stop) for stop in req.params.stop) + 8
            tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=req.params.skip_special_tokens)
            for stop in req.params.stop:
                if stop in tail:
                    return {"type": "stop", "matched": stop}
        token = req.output_ids[-1]
        if not req.params.ignore_eos and (token in req.params.stop_token_ids or token in self.eos_token_ids):
            return {"type": "stop", "matched": token}
        if req.forced_ids is not None and len(req.output_ids) >= len(req.forced_ids):
            # a scripted answer ends with its eos token even under ignore_eos
            return {"type": "stop", "matched": token if token in self.eos_token_ids else None}
        return None

    def _finish(self, req: Request, reason: dict[str, Any]) -> None:
        req.finished_reason = reason
        if req in self._running:
            self._running.remove(req)
        if req.slot is not None:
            self._free_slots.append(req.slot)
            req.slot = None
        self.num_finished += 1
        req.on_finish(self._response(req))

    def _response(self, req: Request) -> dict[str, Any]:
        reason = req.finished_reason
        text_ids = req.output_ids
        matched = reason.get("matched")
        if isinstance(matched, int) and not req.params.no_stop_trim and text_ids:
            text_ids = text_ids[:-1]  # the stop token stays in output_ids but not in the text
        text = self.tokenizer.decode(text_ids, skip_special_tokens=req.params.skip_special_tokens)
        if isinstance(matched, str):
            pos = text.find(matched)
            if pos >= 0:
                text = text[: pos + len(matched)] if req.params.no_stop_trim else text[:pos]
        now = time.time()
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": reason,
            "prompt_tokens": len(req.input_ids),
            "weight_version": self.weight_version,
            "num_retractions": req.num_retractions,
            "reasoning_tokens": 0,
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,  # shared within a prefill batch; no cache across batches
            "cached_tokens_details": None,
            "dp_rank": 0,
            "e2e_latency": now - req.created,
            "response_sent_to_client_ts": now,
        }
        if req.return_logprob:
            meta["input_token_logprobs"] = req.input_logprobs
            meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(req.output_logprobs, req.output_ids)]
            meta["output_token_logprobs_length"] = len(req.output_ids)
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

    # ------------------------------------------------------------------------------------------
    # pause / continue (run as control operations)

    def pause(self, mode: str) -> None:
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
        self.paused = True
        if mode == "abort":
            self._abort("", abort_all=True)
        elif mode == "retract":
            self.retract_running()

    def resume(self) -> None:
        self.paused = False

    def retract_running(self) -> None:
        """Free every running request's KV slot and queue it first; it is prefilled again (prompt +
        output so far) when admitted, so nothing computed from freed keys is ever used."""
        for req in reversed(self._running):
            self._free_slots.append(req.slot)
            req.slot, req.num_cached = None, 0
            req.num_retractions += 1
            self._waiting.appendleft(req)
        self._running.clear()


def _prompt_logprobs(input_ids: list[int], chunk_logits, start: int) -> list[list[Any]]:
    """SGLang's input_token_logprobs from position ``start``: [logprob, token_id, None] per prompt
    token, the log-prob of token p given tokens < p (float32 log_softmax); None for position 0."""
    import torch

    logprobs = torch.log_softmax(chunk_logits, dim=-1)
    entries = []
    for p in range(max(start, 0), len(input_ids)):
        value = None if p == 0 else float(logprobs[p - 1, input_ids[p]])
        entries.append([value, input_ids[p], None])
    return entries


def new_rid() -> str:
    return uuid.uuid4().hex
