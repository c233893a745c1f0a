"""What bench/vs_trl.py and bench/grpo_step.py share: one GRPO recipe run by slime-ref's loop and by
TRL's GRPOTrainer, each step timed, and the memory of every process of a run sampled.

- :func:`run_ours`: ``slime_ref.train.train`` in this process (it is the driver: Ray, the rollout
  manager, engines, router and the Megatron actor are its descendants), with a progress callback that
  stamps every phase event, so each step's wall time splits into rollout, train and weight sync.
- :func:`run_trl`: TRL's ``GRPOTrainer`` in this process, with a callback stamping step begin/end and
  a wrapper timing generation + scoring, so its step splits into generation and training.
- :class:`ProcessTreeMemory`: a background thread summing the resident memory of this process and all
  its descendants (and the GPU memory in use, where there is a GPU), keeping the peak.
- :func:`boxed_math_reward`: slime-ref's ``math`` rule (``slime_ref.rollout.rewards.math_reward``) in
  TRL's reward-function signature, so both trainers score with the same code.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GIB = 1024**3


# ------------------------------------------------------------------------------------------------
# memory


class ProcessTreeMemory:
    """Peak of the summed RSS of ``root_pid`` and every descendant, sampled every ``interval_s``.

    Ray's GCS, raylet and workers are children of the driver that started the local cluster, engines
    and the router are children of Ray workers, so the tree of the driver is every process of a run.
    ``extra_pids`` (a callable) adds processes outside the tree. RSS counts shared pages once per
    process (libtorch in each of them, Ray's object store where mapped), so the sum is an upper bound
    of the memory the run needs. With ``gpu=True`` it also polls ``nvidia-smi`` for the memory in use
    on the GPUs (every process of the machine).
    """

    def __init__(self, root_pid: int | None = None, interval_s: float = 0.1, extra_pids=None, gpu: bool = False):
        self.root_pid = root_pid or os.getpid()
        self.interval_s = interval_s
        self.extra_pids = extra_pids
        self.gpu = gpu
        self.peak_bytes = 0
        self.peak_processes: list[dict] = []
        self.peak_gpu_mib = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def __enter__(self) -> ProcessTreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        next_gpu = 0.0
        while not self._stop.is_set():
            self.sample()
            if self.gpu and time.monotonic() >= next_gpu:
                self.peak_gpu_mib = max(self.peak_gpu_mib, gpu_memory_used_mib())
                next_gpu = time.monotonic() + 0.5
            self._stop.wait(self.interval_s)

    def sample(self) -> int:
        import psutil

        try:
            root = psutil.Process(self.root_pid)
            procs = {p.pid: p for p in [root, *root.children(recursive=True)]}
        except psutil.NoSuchProcess:
            return 0
        for pid in (self.extra_pids() if self.extra_pids else ()):
            if pid not in procs:
                try:
                    procs[pid] = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    pass
        rows = []
        for p in procs.values():
            try:
                rows.append({"pid": p.pid, "name": _process_label(p), "rss": p.memory_info().rss})
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        total = sum(r["rss"] for r in rows)
        self.samples += 1
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_processes = total, rows
        return total

    def report(self) -> dict[str, Any]:
        by_kind: dict[str, float] = {}
        for r in self.peak_processes:
            by_kind[r["name"]] = by_kind.get(r["name"], 0.0) + r["rss"] / GIB
        out = {
            "peak_rss_gib": round(self.peak_bytes / GIB, 3),
            "peak_processes": len(self.peak_processes),
            "peak_rss_gib_by_process": {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "samples": self.samples,
        }
        if self.gpu:
            out["peak_gpu_used_gib"] = round(self.peak_gpu_mib / 1024, 2)
        return out


def _process_label(p) -> str:
    """A short role name: Ray sets worker titles to ``ray::ClassName``; servers show their module."""
    name = p.name()
    try:
        cmd = p.cmdline()
    except Exception:
        cmd = []
    if name.startswith("ray::"):
        return name.split(".")[0]
    for module in ("slime_ref.engine", "sglang.launch_server", "sglang_router.launch_router"):
        if module in cmd:
            return module
    if cmd and "default_worker.py" in " ".join(cmd):
        return "ray::IDLE"
    return name


def cpu_seconds_by_role(root_pid: int | None = None) -> dict[str, float]:
    """User + system CPU seconds used so far by this process and its descendants, summed by role."""
    import psutil

    root = psutil.Process(root_pid or os.getpid())
    out: dict[str, float] = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            role = "driver" if p.pid == root.pid else _process_label(p)
            out[role] = out.get(role, 0.0) + t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def gpu_memory_used_mib() -> float:
    """Memory in use on every GPU of the machine together (nvidia-smi), 0 without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return sum(float(x) for x in out.split())
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0.0


# ------------------------------------------------------------------------------------------------
# data and reward


def write_prompts(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def boxed_math_reward(completions, label, **kwargs) -> list[float]:
    """TRL reward function: slime-ref's ``math`` rule on each completion's text."""
    from slime_ref.rollout.rewards import math_reward

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(math_reward(t, lab)) for t, lab in zip(texts, label)]


# ------------------------------------------------------------------------------------------------
# slime-ref


class PhaseClock:
    """The progress callback of ``slime_ref.train.train``: stamps each phase event, and at each logged
    rollout snapshots the CPU seconds used so far by every process of the run, by role."""

    def __init__(self, skip: int = 1):
        self.events: list[tuple[float, str, int | None, str | None]] = []
        self.cpu: dict[int, dict[str, float]] = {}
        self.skip = skip
        self.total: int | None = None

    def __call__(self, phase: str, **info) -> None:
        self.events.append((time.perf_counter(), phase, info.get("rollout_id"), info.get("kind")))
        if phase == "logged" and info.get("kind") == "rollout":
            rid = info["rollout_id"]
            # a snapshot walks every process of the run (several ms, inside the next step's time):
            # take only the two that cpu_per_step reads once the rollout count is known
            if self.total is None or rid in (self.skip, self.total - 1):
                self.cpu[rid] = cpu_seconds_by_role()

    def cpu_per_step(self) -> dict[str, float]:
        """CPU seconds per step of each role between the ``skip``-th and the last logged rollout."""
        ids = [i for i in sorted(self.cpu) if i >= self.skip]
        if len(ids) < 2:
            return {}
        first, last = self.cpu[ids[0]], self.cpu[ids[-1]]
        steps = ids[-1] - ids[0]
        out = {role: (last[role] - first.get(role, 0.0)) / steps for role in last}
        return {k: round(v, 4) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0.0005}

    def set_total(self, total: int) -> None:
        self.total = total

    def steps(self) -> list[dict[str, float]]:
        """Per rollout after the first: wall seconds from the previous log to this one, split at the
        train and update_weights events into (rollout + offload engines + onload trainer), (train +
        offload trainer + onload engines) and (weight sync)."""
        logged = {rid: t for t, phase, rid, kind in self.events if phase == "logged" and kind == "rollout"}
        first = {}
        for t, phase, rid, _ in self.events:
            if phase in ("train", "update_weights") and rid is not None:
                first.setdefault((phase, rid), t)
        out = []
        for rid in sorted(logged):
            if rid - 1 not in logged or ("train", rid) not in first or ("update_weights", rid) not in first:
                continue
            start, train, sync, end = (
                logged[rid - 1],
                first[("train", rid)],
                first[("update_weights", rid)],
                logged[rid],
            )
            out.append({"rollout_id": rid, "step_s": end - start, "to_train_s": train - start,
                        "to_sync_s": sync - train, "sync_s": end - sync})
        return out


def run_ours(argv: list[str], *, memory: bool = False, gpu: bool = False) -> dict[str, Any]:
    """One ``slime-ref train`` run in this process; returns per-step times, the metrics and memory."""
    from slime_ref.arguments import parse_args
    from slime_ref.train import train

    args = parse_args(argv)
    clock = PhaseClock()
    sampler = ProcessTreeMemory(gpu=gpu) if memory else None
    start = time.perf_counter()
    with sampler or contextlib.nullcontext():
        summary = train(args, progress=clock)  # it starts and stops its own private Ray cluster
    wall = time.perf_counter() - start
    records = read_jsonl(Path(args.output_dir) / "metrics.jsonl")
    metrics = [m for m in records if "rollout/raw_reward" in m]
    result = {
        "wall_s": wall,
        "setup_s": summary["phase_s"].get("setup"),
        "steps": clock.steps(),
        "metrics": metrics,
        "eval_metrics": [m for m in records if "perf/eval_time" in m],
        "reward_curve": [m["rollout/raw_reward"] for m in metrics],
        "cpu_s_per_step": clock.cpu_per_step(),
    }
    if sampler:
        result["memory"] = sampler.report()
    return result


# ------------------------------------------------------------------------------------------------
# TRL


def run_trl(model_dir: Path, prompts: list[dict], *, out_dir: Path, seed: int, steps: int, prompts_per_step: int,
            samples_per_prompt: int, max_new_tokens: int, lr: float, temperature: float = 1.0, gpu: bool = False,
            micro_batch: int | None = None, min_new_tokens: int = 0, memory: bool = False) -> dict[str, Any]:
    """TRL's GRPOTrainer on ``prompts`` (``{"prompt": [chat messages], "label": str}`` rows), no KL,
    loss ``dapo``, constant learning rate; each step times its generation (with scoring) and its total."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    batch = prompts_per_step * samples_per_prompt
    micro = micro_batch or batch
    config = GRPOConfig(
        output_dir=str(out_dir), seed=seed, max_steps=steps, learning_rate=lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, beta=0.0, loss_type="dapo",
        num_generations=samples_per_prompt, per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro, max_completion_length=max_new_tokens, temperature=temperature,
        top_p=1.0, top_k=0, logging_steps=1, report_to="none", save_strategy="no", disable_dropout=True,
        gradient_checkpointing=False,  # TRL 1.16 turns it on by default; it only trades time for memory
        use_cpu=not gpu, bf16=gpu, dataloader_num_workers=0, optim="adamw_torch_fused" if gpu else "adamw_torch",
        generation_kwargs={"min_new_tokens": min_new_tokens} if min_new_tokens else None,
        model_init_kwargs={"dtype": torch.bfloat16 if gpu else torch.float32, "attn_implementation": "sdpa"},
    )
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=boxed_math_reward, args=config,
                          train_dataset=Dataset.from_list(prompts))
    times: dict[str, list[float]] = {"step": [], "generate": []}

    generate = trainer._generate_and_score_completions

    def timed_generate(*a, **kw):
        t = time.perf_counter()
        out = generate(*a, **kw)
        if gpu:
            torch.cuda.synchronize()
        times["generate"].append(time.perf_counter() - t)
        return out

    trainer._generate_and_score_completions = timed_generate

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **kw):
            if gpu:
                torch.cuda.synchronize()
            times["step"].append(time.perf_counter() - self.t)

    trainer.add_callback(StepTimer())
    sampler = ProcessTreeMemory(gpu=gpu) if memory else None
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with sampler or contextlib.nullcontext():
        trainer.train()
    wall = time.perf_counter() - start
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    result = {"wall_s": wall, "step_s": times["step"], "generate_s": times["generate"], "reward_curve": rewards,
              "response_length": lengths}
    if gpu:
        result["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
    if sampler:
        result["memory"] = sampler.report()
    del trainer
    return result


# ------------------------------------------------------------------------------------------------
# summaries


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def curve_summary(curve: list[float], head: int = 5, tail: int = 10) -> dict[str, float | None]:
    """Start (mean of the first ``head`` steps), end (mean of the last ``tail``) and the gain."""
    if not curve:
        return {"start": None, "end": None, "gain": None}
    start = sum(curve[:head]) / len(curve[:head])
    end = sum(curve[-tail:]) / len(curve[-tail:])
    return {"start": round(start, 4), "end": round(end, 4), "gain": round(end - start, 4)}


# ------------------------------------------------------------------------------------------------
# overhead probe


def probe_overheads(model_dir: Path, prompts_path: Path, out: Path, engine_threads: int, repeats: int = 15,
                    prompts_per_step: int = 8, samples_per_prompt: int = 8, max_new_tokens: int = 8) -> dict:
    """What the phases of a step hide, measured on their own (median seconds of ``repeats``): one
    built-in engine behind the real router, as the run has, and a Ray actor.

    - ``http_request``: a 1-token /generate sent to the engine directly, and ``router_hop``: the
      extra time of the same request through the router;
    - ``rollout_generation``: one step's generation as the rollout sends it (a batched /generate
      per group, all groups at once) through the router, direct to the engine, and as one request
      per sample (how it was sent before batching);
    - ``engine_release_resume``: a colocated step's /release_memory_occupation + /resume;
    - ``ray_call``: a round trip to an actor method, and ``ray_call_with_batch``: passing a step's
      train data (by object reference, as the loop does).
    """
    import asyncio

    import ray
    from transformers import AutoTokenizer

    from slime_ref.rollout.servers import RolloutServers
    from slime_ref.rollout.sglang_client import SGLangClient
    from slime_ref.utils.async_loop import run

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = read_jsonl(prompts_path)[:prompts_per_step]
    prompts = [list(tokenizer.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True,
                                                  return_dict=False)) for r in rows]
    params = {"temperature": 1.0, "max_new_tokens": max_new_tokens}
    result: dict[str, Any] = {}

    def timed(coro_fn) -> float:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            run(coro_fn())
            times.append(time.perf_counter() - t)
        return round(median(times), 5)

    with RolloutServers(model_dir, log_dir=out / "logs", num_engines=1, num_threads=engine_threads) as servers:
        router, engine = SGLangClient(servers.router_url), SGLangClient(servers.engine_urls[0])

        async def tiny(client):
            await client.generate(prompts[0], {"max_new_tokens": 1})

        async def batched(client):
            await asyncio.gather(*(client.generate_batch([p] * samples_per_prompt, params) for p in prompts))

        async def single(client):
            await asyncio.gather(*(client.generate(p, params) for p in prompts for _ in range(samples_per_prompt)))

        async def release_resume():
            await engine.release_memory_occupation()
            await engine.resume_memory_occupation()

        direct = timed(lambda: tiny(engine))
        result["http_request"] = direct
        result["router_hop"] = round(timed(lambda: tiny(router)) - direct, 5)
        result["rollout_generation"] = {"batched_via_router": timed(lambda: batched(router)),
                                        "batched_direct": timed(lambda: batched(engine)),
                                        "one_request_per_sample_via_router": timed(lambda: single(router))}
        result["engine_release_resume"] = timed(release_resume)

        async def close():
            await asyncio.gather(router.close(), engine.close())

        run(close())

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        @ray.remote(num_cpus=0)
        class Echo:
            def call(self, data=None):
                return len(data["tokens"]) if data else 0

        actor = Echo.remote()
        ray.get(actor.call.remote(), timeout=60)
        batch = {"tokens": [prompts[0] + [5] * max_new_tokens] * (prompts_per_step * samples_per_prompt),
                 "rollout_log_probs": [[-1.0] * max_new_tokens] * (prompts_per_step * samples_per_prompt)}
        ray_times, batch_times = [], []
        for _ in range(repeats * 4):
            t = time.perf_counter()
            ray.get(actor.call.remote(), timeout=60)
            ray_times.append(time.perf_counter() - t)
            ref = ray.put(batch)
            t = time.perf_counter()
            ray.get(actor.call.remote(ref), timeout=60)
            batch_times.append(time.perf_counter() - t)
        result["ray_call"] = round(median(ray_times), 5)
        result["ray_call_with_batch"] = round(median(batch_times), 5)
    finally:
        ray.shutdown()
    return result
