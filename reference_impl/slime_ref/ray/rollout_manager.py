"""The rollout side as Ray actors: engines, the router in front of them, and the rollout manager.

:class:`RolloutManager` (one Ray actor, as in slime) owns the data source, starts one
:class:`EngineActor` per engine in the rollout bundles of the placement group and the real
sglang-router in front of them, and serves ``generate(rollout_id)``: run the rollout function,
normalise rewards per group, and hand the trainer slime's train-data dict. It also runs evaluation,
saves and loads the data source's position, and offloads/onloads engines around training when
colocated. The watch on engines and router is :mod:`slime_ref.ray.server_watch`; Samples into train
data (:mod:`slime_ref.rollout.train_data`) and the metrics (:mod:`slime_ref.rollout.metrics`) need no Ray.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import time
from pathlib import Path

import ray

from slime_ref.ray.placement import Placement, scheduling
from slime_ref.ray.server_watch import ServerWatch
from slime_ref.rollout.metrics import eval_metrics, rollout_metrics
from slime_ref.rollout.train_data import (
    flatten_rollout,
    load_debug_rollout_data,
    samples_to_train_data,
    save_debug_rollout_data,
)

logger = logging.getLogger(__name__)

ENGINE_ACTOR_SHARE = 0.2  # of a bundle, as slime (a colocated train actor takes 0.4)


def resolve_engine(args) -> str:
    """``--rollout-engine auto``: real SGLang where it can run (CUDA and the sglang package), else built-in."""
    if args.rollout_engine != "auto":
        return args.rollout_engine
    import importlib.util

    import torch

    return "sglang" if torch.cuda.is_available() and importlib.util.find_spec("sglang") else "builtin"


def sglang_passthrough(args, engine: str = "builtin") -> dict:
    """Every ``--sglang-*`` value given on the command line (kept by the parser as ``args.sglang_extra``).

    Real SGLang engines that are offloaded (``--offload-rollout``, on with ``--colocate``) start with
    SGLang's memory saver, as slime's do (``enable_memory_saver = args.offload_rollout``): without it
    ``/release_memory_occupation`` frees nothing, and training runs beside the engine's whole static
    pool. Breakable prefill CUDA graphs cannot run under the saver; they are turned off where this
    SGLang has them and the job did not choose a backend."""
    flags = dict(getattr(args, "sglang_extra", {}) or {})
    if engine == "sglang" and args.offload_rollout:
        if importlib.util.find_spec("torch_memory_saver") is None:
            # SGLang would refuse to start; without it the engine keeps its pool through training
            logger.warning("torch_memory_saver is not installed: offloaded SGLang engines keep their weights, "
                           "KV pool and CUDA graphs on the GPU while the trainer runs (pip install "
                           "torch_memory_saver, as slime's image has)")
            return flags
        flags.setdefault("sglang_enable_memory_saver", True)
        if "sglang_cuda_graph_backend_prefill" not in flags and _sglang_has_field("cuda_graph_backend_prefill"):
            flags["sglang_cuda_graph_backend_prefill"] = "disabled"
    return flags


def _sglang_has_field(name: str) -> bool:
    """True when this SGLang's ServerArgs has ``name`` (SGLang adds and renames settings between releases)."""
    import dataclasses

    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError:
        return False
    return name in {f.name for f in dataclasses.fields(ServerArgs)}


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
            sglang_flags=sglang_passthrough(args, engine),
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
