"""Watching the engines and the router while a rollout or an eval runs (the rollout manager's
:class:`ServerWatch`): dead processes and engines that stop answering ``/health_generate`` end the
rollout with an error that names them, or, with ``--use-fault-tolerance``, are taken out and restarted.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import ray

from slime_common.process_tree import ended

if TYPE_CHECKING:
    from slime_ref.ray.rollout_manager import RolloutManager

logger = logging.getLogger(__name__)

WATCH_POLL_S = 1.0  # how often the watch checks that the engine and router processes still run


def _ended(returncode: int | None) -> str:
    return "stopped answering" if returncode is None else ended(returncode)


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
                # an engine that died while the check waited is named by how it ended, not by its silence
                self._check_processes(always=True)
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
