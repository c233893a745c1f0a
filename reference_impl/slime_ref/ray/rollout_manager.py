"""The rollout side as Ray actors: engines, the router in front of them, and the rollout manager.

:class:`RolloutManager` (one Ray actor, as in slime) owns the data source, starts one
:class:`EngineActor` per engine in the rollout bundles of the placement group and the real
sglang-router in front of them, and serves ``generate(rollout_id)``: run the rollout function,
normalise rewards per group, and hand the trainer slime's train-data dict. It also runs evaluation,
saves and loads the data source's position, and offloads/onloads engines around training when
colocated.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from pathlib import Path

import ray

from slime_ref.ray.placement import Placement, scheduling

logger = logging.getLogger(__name__)

ENGINE_ACTOR_SHARE = 0.2  # of a bundle, as slime (a colocated train actor takes 0.4)


def resolve_engine(args) -> str:
    """``--rollout-engine auto``: real SGLang where it can run (CUDA and the sglang package), else built-in."""
    if args.rollout_engine != "auto":
        return args.rollout_engine
    import importlib.util

    import torch

    return "sglang" if torch.cuda.is_available() and importlib.util.find_spec("sglang") else "builtin"


def sglang_passthrough(args) -> dict:
    """Every ``--sglang-*`` value given on the command line (kept by the parser as ``args.sglang_extra``)."""
    return dict(getattr(args, "sglang_extra", {}) or {})


class EngineActor:
    """One engine: a Ray actor holding its slice of the rollout bundles, running the server process."""

    def __init__(self, args, index: int, log_dir: str):
        self.args, self.index, self.log_dir = args, index, log_dir
        self.servers = None

    def start(self) -> str:
        from slime_ref.rollout.servers import RolloutServers
        from slime_ref.utils.net import node_address

        args = self.args
        engine = resolve_engine(args)
        env = {}
        if engine == "sglang":
            env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.servers = RolloutServers(
            args.hf_checkpoint,
            log_dir=self.log_dir,
            num_engines=1,
            engine=engine,
            host=node_address(),
            sglang_flags=sglang_passthrough(args),
            with_router=False,
            random_seed=args.seed + self.index,
            gpus_per_engine=args.rollout_num_gpus_per_engine,
            env=env,
            num_threads=args.rollout_num_threads,
            log_name=f"engine-{self.index}",
        ).start()
        return self.servers.engine_urls[0]

    def status(self) -> dict:
        """Whether the engine process is running; if not, how it ended. Where its log is."""
        if self.servers is None or not self.servers.engines:
            return {"alive": False, "pid": None, "returncode": None, "log": None}
        proc = self.servers.engines[0]
        return {"alive": proc.alive(), "pid": proc.pid, "returncode": proc.popen.returncode,
                "log": str(proc.log_path)}

    def stop(self) -> None:
        if self.servers is not None:
            self.servers.stop()
            self.servers = None

    def kill(self) -> None:
        """SIGKILL the server now: it failed, and a hung process would sit out every grace period."""
        if self.servers is not None and self.servers.engines:
            self.servers.kill_engine(0)


class RolloutManager:
    def __init__(self, args, placement: Placement):
        # Nothing that can fail here: Ray drops the cause of an error raised in an actor's constructor,
        # so a bad data file would reach the user as a bare ActorDiedError. start() does the work.
        self.args, self.placement = args, placement
        self.log_dir = str(Path(args.output_dir) / "logs")
        self.data_source = None
        self.rollout_fn = None
        self.engines: list = []
        self.engine_urls: list[str] = []
        self.router = None
        self.watch = None
        self._clients: dict[str, object] = {}  # one per engine, kept: colocated runs call them every step

    def start(self) -> int:
        """Load the data source and the rollout function, start engines and router; returns the
        number of prompts."""
        from slime_ref.data.source import load_tokenizer, make_data_source
        from slime_ref.utils.gc_settings import freeze_after_setup
        from slime_ref.utils.hooks import load_function

        args = self.args
        self.data_source = make_data_source(args, load_tokenizer(args) if args.hf_checkpoint else None)
        self.rollout_fn = load_function(args.rollout_function_path, "--rollout-function-path")
        if args.rollout_num_gpus and not args.debug_train_only:
            self._start_engines(self.placement)
            self.watch = ServerWatch(self)
        # this process reads every answer of every rollout: keep the garbage collector's full
        # collections from walking the set-up's objects while it does
        frozen = freeze_after_setup()
        logger.debug("rollout manager set up; %d objects frozen out of the garbage collector's walks", frozen)
        return len(self.data_source)

    # -- engines and router ---------------------------------------------------------------------

    def _start_engines(self, placement: Placement) -> None:
        from slime_ref.rollout.servers import start_router

        args = self.args
        per_engine = args.rollout_num_gpus_per_engine
        num_engines = args.rollout_num_gpus // per_engine
        remote_cls = ray.remote(EngineActor)
        resources = placement.bundle_resources(ENGINE_ACTOR_SHARE)
        env_vars = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"} if per_engine > 1 else {}
        for i in range(num_engines):
            actor = remote_cls.options(
                **resources,
                scheduling_strategy=scheduling(placement, placement.rollout_bundles[i * per_engine]),
                runtime_env={"env_vars": env_vars},
            ).remote(args, i, self.log_dir)
            self.engines.append(actor)
        self.engine_urls = ray.get([e.start.remote() for e in self.engines], timeout=1200)
        if args.sglang_router_ip is None:
            self.router = start_router(self.engine_urls, log_dir=self.log_dir, tokenizer_path=args.hf_checkpoint,
                                       policy=args.router_policy, host=self._host())
            args.sglang_router_ip, args.sglang_router_port = self.router.host, self.router.port
        args.rollout_engine_urls = list(self.engine_urls)

    def _host(self) -> str:
        from slime_ref.utils.net import node_address

        return node_address()

    def get_engine_urls(self) -> list[str]:
        return list(self.engine_urls)

    def process_ids(self) -> dict:
        """pids of this manager, each engine's server and the router."""
        engines = [s["pid"] for s in ray.get([e.status.remote() for e in self.engines], timeout=60)]
        return {"rollout_manager": os.getpid(), "engines": engines, "engine_urls": list(self.engine_urls),
                "router": self.router.pid if self.router is not None else None}

    def check_engines(self) -> None:
        """Before the weights go out: every engine and the router still run. An engine that died after
        the rollout's last request ends the run here with its name and log (or, with
        --use-fault-tolerance, is marked for :meth:`recover`), not as a failed weight-update call."""
        if self.watch is not None:
            self.watch.failure = None
            self.watch.check_processes()
            if self.watch.failure is not None:
                raise self.watch.failure

    def recover(self) -> list[str]:
        """--use-fault-tolerance: restart the engines the watch stopped, behind the router again, and
        return every engine's URL (the trainer pushes its weights to all of them next, as slime's
        ``recover_updatable_engines`` before ``update_weights``)."""
        if self.watch is not None:
            for index in sorted(self.watch.dead):
                self._restart_engine(index)
            self.watch.dead.clear()
        self.args.rollout_engine_urls = list(self.engine_urls)
        return list(self.engine_urls)

    def _restart_engine(self, index: int) -> None:
        from slime_ref.rollout.servers import router_add_worker

        old = self.engine_urls[index]
        self._clients.pop(old, None)
        url = ray.get(self.engines[index].start.remote(), timeout=1200)
        self.engine_urls[index] = url
        if self.router is not None:
            router_add_worker(self.router.url, url)
        logger.warning("engine-%d restarted at %s (was %s)", index, url, old)

    # -- rollout ------------------------------------------------------------------------------

    @ray.method(num_returns=2)
    def generate(self, rollout_id: int):
        """One rollout: (train data for the trainer, rollout metrics for the log)."""
        from slime_ref.algo.advantages import post_process_rewards

        start = time.perf_counter()
        if self.args.load_debug_rollout_data:
            output = None
            samples = load_debug_rollout_data(self.args.load_debug_rollout_data, rollout_id)
        else:
            with self._watched():
                output = self.rollout_fn(self.args, rollout_id, self.data_source, evaluation=False)
            samples = flatten_rollout(output.samples if hasattr(output, "samples") else output)
        rollout_time = time.perf_counter() - start
        raw, rewards = post_process_rewards(self.args, samples)  # or --custom-reward-post-process-path
        if self.args.save_debug_rollout_data:
            save_debug_rollout_data(self.args.save_debug_rollout_data, rollout_id, samples)
        data = samples_to_train_data(samples, raw, rewards)
        metrics = rollout_metrics(self.args, samples, raw, rollout_time)
        metrics.update(getattr(output, "metrics", None) or {})
        return data, metrics

    def eval(self, rollout_id: int) -> dict:
        if not self.args.eval_datasets:
            return {}
        with self._watched():
            output = self.rollout_fn(self.args, rollout_id, self.data_source, evaluation=True)
        data = output.data if hasattr(output, "data") else output
        return eval_metrics(self.args, data)

    @contextlib.contextmanager
    def _watched(self):
        """Watch engines and router while a rollout runs; a failure the watch finds ends the rollout
        with the watch's error (the rollout's own error would only say a request was cancelled)."""
        from slime_ref.errors import RunError
        from slime_ref.rollout.sglang_client import EngineError

        if self.watch is None:
            yield
            return
        self.watch.resume()
        try:
            yield
        except BaseException as e:
            if isinstance(e, EngineError) and self.watch.failure is None:
                self.watch.check_processes()  # the engine died before the watch's next round saw it
            if self.watch.failure is not None:
                raise self.watch.failure from None
            if isinstance(e, EngineError):  # retried as slime retries, and still failing
                raise RunError(f"the rollout failed: {e}") from None
            raise
        finally:
            self.watch.pause()
        if self.watch.failure is not None:
            raise self.watch.failure

    def _client(self, url: str):
        from slime_ref.rollout.sglang_client import SGLangClient

        if url not in self._clients:
            self._clients[url] = SGLangClient(url)
        return self._clients[url]

    def score(self, tokens: list[int], response_length: int) -> list[list[float]]:
        """Every engine's log-probs of the last ``response_length`` tokens of ``tokens`` (temperature 1).
        The watch is paused between rollouts, so an engine that hangs here fails the call after
        --rollout-health-check-timeout (a one-token answer, as /health_generate), not after an hour."""
        async def one(url):
            out = await self._client(url).generate(tokens, {"max_new_tokens": 1, "temperature": 1.0},
                                                   logprob_start_len=len(tokens) - response_length,
                                                   timeout_s=self.args.rollout_health_check_timeout)
            return [float(x) for x in out.input_log_probs[-response_length:]]

        async def all_engines():
            import asyncio

            return await asyncio.gather(*(one(u) for u in self.engine_urls))

        return self._call_engines(all_engines)

    # -- colocated offload ------------------------------------------------------------------------

    def offload(self) -> None:
        self.check_engines()
        self._memory("release_memory_occupation")

    def onload(self) -> None:
        self.check_engines()
        self._memory("resume_memory_occupation")

    def _memory(self, method: str) -> None:
        import asyncio

        dead = self.watch.dead if self.watch is not None else set()
        live = [u for i, u in enumerate(self.engine_urls) if i not in dead]  # the dead restart at recover()

        async def call_all():
            await asyncio.gather(*(getattr(self._client(u), method)() for u in live))

        self._call_engines(call_all)

    def _call_engines(self, calls):
        """Run ``calls()`` (a coroutine function of engine requests). An engine request that fails
        because its engine died ends the run with the watch's error, which names the engine, how it
        ended and its log; the failed request itself only says that it could not connect."""
        from slime_ref.rollout.sglang_client import EngineError
        from slime_ref.utils.async_loop import run

        try:
            return run(calls())
        except EngineError:
            self.check_engines()
            raise

    # -- data source state ------------------------------------------------------------------------

    def data_state(self) -> dict:
        return self.data_source.state_dict()

    def load_data_state(self, state: dict | None) -> None:
        if state is not None:
            self.data_source.load_state_dict(state)

    def dispose(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self.watch = None
        if self._clients:
            import asyncio

            from slime_ref.utils.async_loop import run

            clients, self._clients = list(self._clients.values()), {}

            async def close_all():
                await asyncio.gather(*(c.close() for c in clients))

            run(close_all())
        if self.router is not None:
            self.router.stop()
            self.router = None
        if self.engines:
            ray.get([e.stop.remote() for e in self.engines], timeout=120)
            for e in self.engines:
                ray.kill(e)
            self.engines = []


# -----------------------------------------------------------------------------------------------
# watching engines and router while a rollout runs

WATCH_POLL_S = 1.0  # how often the watch checks that the engine and router processes still run


def _ended(returncode: int | None) -> str:
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        import signal

        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


class ServerWatch:
    """Watches the engines and the router while a rollout or an eval runs.

    Every second it checks that each engine process and the router process still run; every
    ``--rollout-health-check-interval`` seconds (after ``--rollout-health-check-first-wait``) it asks
    each engine for ``/health_generate`` within ``--rollout-health-check-timeout`` (slime's
    ``RolloutHealthMonitor``). A dead router ends the run. A dead or silent engine:

    - with ``--use-fault-tolerance``, is stopped and taken out of the router, the rollout goes on with
      the other engines (the router resends their requests), and :meth:`RolloutManager.recover`
      restarts it before the next weight update, as slime does;
    - without it, ends the run. slime leaves engines unwatched then, so a hung engine hangs the run;
      slime-ref stops with an error that names the engine and its log instead.

    Ending the run: :attr:`failure` holds the error and every request in flight is cancelled.
    Paused between rollouts: engines are paused, syncing weights or offloaded then.
    """

    def __init__(self, manager: RolloutManager):
        args = manager.args
        self.manager = manager
        self.fault_tolerant = bool(args.use_fault_tolerance)
        self.interval = args.rollout_health_check_interval
        self.timeout = args.rollout_health_check_timeout
        self.first_wait = args.rollout_health_check_first_wait
        self.failure: Exception | None = None
        self.dead: set[int] = set()  # engines stopped by the watch, restarted by recover()
        self._logs: dict[int, str] = {}
        self._next_health_check = 0.0
        self._first_resume = True
        self._lock = threading.RLock()  # the watch thread and a between-rollouts check never overlap
        self._active = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="slime-ref-server-watch", daemon=True)
        self._thread.start()

    def resume(self) -> None:
        wait = self.first_wait if self._first_resume else 0.0
        self._first_resume = False
        self._next_health_check = time.monotonic() + wait
        self.failure = None
        self._active.set()

    def pause(self) -> None:
        self._active.clear()

    def stop(self) -> None:
        self._stopped.set()
        self._active.set()
        self._thread.join(timeout=self.timeout + 30)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            if not self._active.wait(timeout=0.5) or self._stopped.is_set():
                continue
            try:
                self._check()
            except Exception as e:  # the watch itself must not die; the next round tries again
                logger.warning("server watch: %s", e)
            self._stopped.wait(WATCH_POLL_S)

    def check_processes(self) -> None:
        """One round of the process check, now (between rollouts, before the weights go out)."""
        self._check_processes(always=True)

    def _check(self) -> None:
        from slime_ref.rollout.servers import http_get

        self._check_processes()
        manager = self.manager
        if time.monotonic() < self._next_health_check:
            return
        for index, url in enumerate(list(manager.engine_urls)):
            if index in self.dead or self.failure is not None or not self._active.is_set():
                continue
            code, _ = http_get(f"{url}/health_generate", self.timeout)
            if code != 200 and self._active.is_set():
                self._engine_failed(index, f"did not answer /health_generate within {self.timeout:g} s "
                                           f"(--rollout-health-check-timeout)")
        self._next_health_check = time.monotonic() + self.interval

    def _check_processes(self, always: bool = False) -> None:
        with self._lock:
            self._check_processes_locked(always)

    def _check_processes_locked(self, always: bool) -> None:
        manager = self.manager
        router = manager.router
        if router is not None and not router.process.alive():
            code = router.process.popen.returncode
            self._fail(f"the router (pid {router.pid}) {_ended(code)}; its log: {router.process.log_path}")
            return
        for index, engine in enumerate(manager.engines):
            if index in self.dead or self.failure is not None or not (always or self._active.is_set()):
                continue
            try:
                status = ray.get(engine.status.remote(), timeout=30)
            except Exception as e:  # the engine's Ray actor itself is gone
                self._engine_failed(index, f"lost its Ray actor ({type(e).__name__})")
                continue
            self._logs[index] = status["log"]
            if not status["alive"]:
                self._engine_failed(index, _ended(status["returncode"]))

    def _engine_failed(self, index: int, what: str) -> None:
        with self._lock:
            if index not in self.dead and self.failure is None:
                self._engine_failed_locked(index, what)

    def _engine_failed_locked(self, index: int, what: str) -> None:
        from slime_ref.rollout.servers import router_remove_worker

        manager = self.manager
        url = manager.engine_urls[index]
        log = self._logs.get(index, manager.log_dir)
        alive = [i for i in range(len(manager.engines)) if i != index and i not in self.dead]
        if not self.fault_tolerant or not alive:
            hint = ("; no engine is left to finish the rollout" if self.fault_tolerant
                    else "; --use-fault-tolerance restarts engines that die mid-run")
            self._fail(f"rollout engine-{index} at {url} {what}; its log: {log}{hint}")
            try:
                ray.get(manager.engines[index].kill.remote(), timeout=30)
            except Exception as e:
                logger.warning("killing engine-%d: %s", index, e)
            return
        self.dead.add(index)
        logger.warning("engine-%d at %s %s (log %s); stopping it: the rollout goes on with the other engines "
                       "and it restarts before the next weight update (--use-fault-tolerance)", index, url, what, log)
        try:
            ray.get(manager.engines[index].kill.remote(), timeout=30)
            ray.get(manager.engines[index].stop.remote(), timeout=60)
        except Exception as e:
            logger.warning("stopping engine-%d: %s", index, e)
        if manager.router is not None:
            router_remove_worker(manager.router.url, url)

    def _fail(self, message: str) -> None:
        from slime_ref.errors import RunError
        from slime_ref.utils.async_loop import cancel_all

        if self.failure is None:
            self.failure = RunError(message)
            logger.error("%s", message)
            cancel_all()


# -----------------------------------------------------------------------------------------------
# samples -> train data, and the metrics


def save_debug_rollout_data(path_template: str, rollout_id: int, samples) -> None:
    """slime's --save-debug-rollout-data: one file per rollout, written atomically."""
    import io

    import torch

    from slime_ref.utils.fileio import atomic_write_bytes

    buffer = io.BytesIO()
    torch.save({"rollout_id": rollout_id, "samples": [s.to_dict() for s in samples]}, buffer)
    atomic_write_bytes(path_template.format(rollout_id=rollout_id), buffer.getvalue())


def load_debug_rollout_data(path_template: str, rollout_id: int) -> list:
    """slime's --load-debug-rollout-data: the samples a --save-debug-rollout-data file holds."""
    import torch

    from slime_ref.errors import UserError
    from slime_ref.types import Sample

    path = Path(path_template.format(rollout_id=rollout_id))
    if not path.is_file():
        raise UserError(f"--load-debug-rollout-data: no file {path} for rollout {rollout_id}")
    try:
        saved = torch.load(path, weights_only=False)
        return [Sample.from_dict(d) for d in saved["samples"]]
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"--load-debug-rollout-data: {path} is not a file --save-debug-rollout-data wrote ({e})") \
            from None


def flatten_rollout(groups) -> list:
    """A rollout's Samples, flat and in order, as slime flattens a rollout's output until its items
    are Samples: a group may hold lists of Samples (a --custom-generate-function-path hook that
    returns several for one input sample), nested to any depth.

    Rewards are normalised per ``Sample.group_index``; a Sample that a hook made without one joins
    its group's: the one index its group's other Samples carry, or a new index of its own when none
    carries one. (A rollout whose items are bare Samples, not groups, is left as it is.)
    """
    from slime_ref.rollout.filters import flatten_samples

    check_rollout_ids(groups)
    per_group = [flatten_samples(group) for group in groups]
    known = {s.group_index for leaves in per_group for s in leaves if s.group_index is not None}
    next_free = max(known, default=-1) + 1
    for group, leaves in zip(groups, per_group):
        if not isinstance(group, (list, tuple)) or all(s.group_index is not None for s in leaves):
            continue
        own = {s.group_index for s in leaves if s.group_index is not None}
        if len(own) > 1:
            continue  # a group already split across indices: nothing to join
        if own:
            index = own.pop()
        else:
            index, next_free = next_free, next_free + 1
        for s in leaves:
            if s.group_index is None:
                s.group_index = index
    return [s for leaves in per_group for s in leaves]


def check_rollout_ids(node, depth: int = 0) -> None:
    """slime's rule for a generate hook that returns several Samples for one input sample (a
    rollout's output nested three deep: prompt x sample x Samples of one generation): every Sample of
    such a list carries one shared, set ``Sample.rollout_id``, so that the loss counts the generation
    once. slime v0.3.1 stops the run otherwise (``_validate_rollout_id_annotated``); so does slime-ref,
    with the fix in the message."""
    if not isinstance(node, (list, tuple)):
        return
    if node and not isinstance(node[0], (list, tuple)):
        if depth >= 2 and len(node) > 1:
            ids = [getattr(s, "rollout_id", None) for s in node]
            if None in ids or len(set(ids)) > 1:
                from slime_ref.errors import UserError

                raise UserError(f"a --custom-generate-function-path hook returned {len(node)} Samples for one "
                                f"input sample with Sample.rollout_id {ids}: slime requires one shared, set "
                                "rollout_id on all of them (set sample.rollout_id to the same number on each "
                                "Sample the call returns)")
        return
    for item in node:
        check_rollout_ids(item, depth + 1)


def samples_to_train_data(samples, raw_rewards, rewards) -> dict:
    """slime's ``_convert_samples_to_train_data``: per-sample lists the trainer consumes."""
    data = {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": [float(r) for r in rewards],
        "raw_reward": [float(r) for r in raw_rewards],
        "truncated": [int(s.status.name == "TRUNCATED") for s in samples],
        "loss_masks": [
            [0] * s.response_length if s.remove_sample
            else (list(s.loss_mask) if s.loss_mask is not None else [1] * s.response_length)
            for s in samples
        ],
        "sample_indices": [s.index for s in samples],
    }
    if all(s.rollout_log_probs is not None for s in samples):
        data["rollout_log_probs"] = [list(s.rollout_log_probs) for s in samples]
    return data


def rollout_metrics(args, samples, raw_rewards, rollout_time: float) -> dict:
    n = len(samples)
    lengths = [s.effective_response_length for s in samples]
    group = args.n_samples_per_prompt
    groups = _reward_groups(samples, raw_rewards, group)
    metrics = {
        "rollout/raw_reward": sum(raw_rewards) / n,
        "rollout/response_length": sum(lengths) / n,
        "rollout/response_len/max": max(lengths),
        "rollout/truncated_ratio": sum(s.status.name == "TRUNCATED" for s in samples) / n,
        "rollout/zero_std_ratio": sum(max(g) == min(g) for g in groups) / len(groups),
        "perf/rollout_time": rollout_time,
    }
    if args.log_multi_turn:
        metrics.update(multi_turn_metrics(args, samples))
    if args.log_passrate:
        metrics.update({f"passrate/{k}": v for k, v in pass_rates(list(raw_rewards), group).items()})
    if args.rollout_num_gpus:
        metrics["perf/tokens_per_gpu_per_sec"] = sum(lengths) / rollout_time / args.rollout_num_gpus
    return metrics


def _reward_groups(samples, raw_rewards, group_size: int) -> list[list[float]]:
    """The rewards of each prompt's group, grouped as the rewards are normalised: by
    ``Sample.group_index``, or consecutive chunks of ``group_size`` when a sample has none."""
    if not all(s.group_index is not None for s in samples):
        return [list(raw_rewards[i:i + group_size]) for i in range(0, len(samples), group_size)]
    groups: dict = {}
    for s, r in zip(samples, raw_rewards):
        groups.setdefault(s.group_index, []).append(r)
    return list(groups.values())


def multi_turn_metrics(args, samples) -> dict:
    """--log-multi-turn: response lengths with and without tool/environment tokens, and rounds.

    ``raw_response_length``: every response token; ``wo_obs_response_length``: those the loss mask
    keeps (the model's own); ``round_number`` from ``sample.metadata["round_number"]`` when set.
    """
    raw = [s.response_length for s in samples]
    own = [sum(s.loss_mask) if s.loss_mask is not None else s.response_length for s in samples]
    out = {
        "multi_turn/raw_response_length/response_length_mean": sum(raw) / len(raw),
        "multi_turn/raw_response_length/response_length_max": max(raw),
        "multi_turn/raw_response_length/response_length_min": min(raw),
        "multi_turn/raw_response_length/response_length_clip_ratio":
            sum(n >= args.rollout_max_response_len for n in raw) / len(raw),
        "multi_turn/wo_obs_response_length/response_length_mean": sum(own) / len(own),
        "multi_turn/wo_obs_response_length/response_length_max": max(own),
        "multi_turn/wo_obs_response_length/response_length_min": min(own),
    }
    rounds = [s.metadata["round_number"] for s in samples if "round_number" in (s.metadata or {})]
    if rounds:
        out["multi_turn/multi_turn_metric/round_number_mean"] = sum(rounds) / len(rounds)
        out["multi_turn/multi_turn_metric/round_number_max"] = max(rounds)
        out["multi_turn/multi_turn_metric/round_number_min"] = min(rounds)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, arXiv 2107.03374, eq. 1)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def pass_rates(rewards: list[float], group_size: int) -> dict[str, float]:
    """{"pass@k": mean over groups of unbiased pass@k} for k = 1, 2, 4, ... <= group_size.

    ``rewards`` holds consecutive groups of ``group_size`` responses to one prompt; a response
    with reward > 0 counts as correct. Empty for group_size 1, as in slime's compute_pass_rate.
    """
    if group_size <= 1:
        return {}
    groups = [rewards[i:i + group_size] for i in range(0, len(rewards), group_size)]
    out = {}
    k = 1
    while k <= group_size:
        scores = [pass_at_k(group_size, sum(r > 0 for r in g), k) for g in groups]
        out[f"pass@{k}"] = sum(scores) / len(scores)
        k *= 2
    return out


def eval_metrics(args, data: dict) -> dict:
    """eval/<name> (mean reward: pass@1 for 0/1 rewards), eval/<name>-pass@k, eval/<name>-truncated_ratio."""
    out = {}
    for name, result in data.items():
        rewards = [float(r) for r in result["rewards"]]
        out[f"eval/{name}"] = sum(rewards) / len(rewards)
        out[f"eval/{name}-truncated_ratio"] = sum(result["truncated"]) / len(result["truncated"])
        for key, value in pass_rates(rewards, args.n_samples_per_eval_prompt).items():
            out[f"eval/{name}-{key}"] = value
    return out
