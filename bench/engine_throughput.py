"""Rollout engine throughput next to HF ``generate`` on the same prompts, in the same run. Prints JSON.

CPU (default, ``--engine builtin``): the built-in engine serving the embedded tiny Qwen3, tokens/s
at concurrency 1, 8 and 64 (every request ``--new-tokens`` long, ``ignore_eos``, with log-probs, as
rollouts ask), and HF ``generate`` with batch = concurrency on the same chat prompts and threads.

GPU (``--engine sglang``): real SGLang 0.5.15.post1 serving a Qwen3-0.6B-shaped model with random
bf16 weights (built locally, no download), tokens/s at one concurrency (default 256, decode CUDA
graphs up to it) with and without ``return_logprob``, then (SGLang stopped) HF ``generate`` batched
at that concurrency on the same prompts.

    python bench/engine_throughput.py                      # CPU
    python bench/engine_throughput.py --engine sglang      # one CUDA GPU, SGLang installed
    # a GRPO rollout's shape (grpo_step.py --gpu: 512 requests, 13-token prompts, 512 new tokens)
    python bench/engine_throughput.py --engine sglang --concurrency 512 --prompt-tokens 13 --new-tokens 512
    # ... and where a decode step's time goes: is the GPU busy, and with which kernels?
    python bench/engine_throughput.py --engine sglang --concurrency 512 --prompt-tokens 13 --new-tokens 512 \
        --repeats 1 --profile-steps 40
    # ... where the host's time goes in SGLang's scheduler (Python stacks sampled every 2 ms)
    python bench/engine_throughput.py --engine sglang --concurrency 512 --prompt-tokens 13 --new-tokens 512 \
        --repeats 1 --host-profile --skip-hf
    # ... and two servers sharing the GPU, 256 requests each (two scheduler processes)
    python bench/engine_throughput.py --engine sglang --concurrency 512 --prompt-tokens 13 --new-tokens 512 \
        --engines 2 --skip-hf
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

from slime_ref.rollout.servers import RolloutServers
from slime_ref.rollout.sglang_client import SGLangClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from sglang_recipes import sglang_cuda_graph_flags, sglang_offline_gpu_flags  # noqa: E402

from shaped_model import QWEN3_0_6B_SHAPE  # noqa: E402


def without_flag(flags: list[str], name: str) -> list[str]:
    """``flags`` without ``name`` and its value."""
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
        elif f == name:
            skip = True
        else:
            out.append(f)
    return out


async def engine_rate(url: str | list[str], prompts: list[list[int]], new_tokens: int, return_logprob: bool,
                      prompts_per_request: int = 1) -> float:
    """Send all prompts at once (dealt round-robin over the engines of a list), each in its own
    /generate or ``prompts_per_request`` of them in one (SGLang's batched form, as the GRPO rollout
    sends a prompt's samples); output tokens per second of wall time."""
    params = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}
    urls = [url] if isinstance(url, str) else url
    requests = [prompts[i:i + prompts_per_request] for i in range(0, len(prompts), prompts_per_request)]
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(SGLangClient(u, max_connections=len(requests) + 8)) for u in urls]

        async def send(i: int, batch: list[list[int]]) -> list:
            client = clients[i % len(clients)]
            if prompts_per_request == 1:
                return [await client.generate(batch[0], params, return_logprob=return_logprob)]
            return await client.generate_batch(batch, params, return_logprob=return_logprob)

        start = time.perf_counter()
        answers = await asyncio.gather(*[send(i, batch) for i, batch in enumerate(requests)])
        elapsed = time.perf_counter() - start
    tokens = sum(len(o.output_ids) for answer in answers for o in answer)
    assert tokens == new_tokens * len(prompts), "every request must run to --new-tokens"
    return tokens / elapsed


@torch.inference_mode()
def hf_rate(model, prompts: list[list[int]], new_tokens: int, pad_id: int, device: str) -> float:
    """HF generate, one left-padded batch of all prompts, sampling, exactly new_tokens each."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return (out.shape[1] - width) * len(prompts) / elapsed


class GpuUtilSampler:
    """NVML's GPU busy and memory-controller busy percentages, read every ``interval_s`` in a thread
    while a round runs: ``samples`` is [(wall seconds, gpu %, memory %)]. NVML averages each figure
    over its own period (about 0.2 s on an H200), so what it says of a round's edges is good to
    about that."""

    def __init__(self, interval_s: float = 0.05):
        import threading

        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.samples: list[tuple[float, int, int]] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            self.samples.append((time.time(), rates.gpu, rates.memory))
            self._stop.wait(self._interval_s)

    def __enter__(self) -> GpuUtilSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._nvml.nvmlShutdown()


def round_gpu_util(samples: list[tuple[float, int, int]], start: float, end: float, busy_pct: int = 50) -> dict:
    """How busy the GPU was over one round [start, end] (wall seconds): the mean GPU and memory
    busy percentages of the samples inside it, and the seconds at the round's head and tail with
    the GPU under ``busy_pct`` (requests still arriving; responses being assembled and sent back),
    which no faster kernel shortens."""
    inside = [(t, gpu, mem) for t, gpu, mem in samples if start <= t <= end]
    if not inside:
        return {"error": "no NVML sample inside the round"}
    busy = [t for t, gpu, _ in inside if gpu >= busy_pct]
    return {
        "samples": len(inside),
        "gpu_busy_pct_mean": round(statistics.fmean(gpu for _, gpu, _ in inside), 1),
        "memory_busy_pct_mean": round(statistics.fmean(mem for _, _, mem in inside), 1),
        "idle_head_s": round((busy[0] if busy else end) - start, 3),
        "idle_tail_s": round(end - busy[-1], 3) if busy else 0.0,
    }


def timed_rounds(url: str | list[str], prompts: list[list[int]], new_tokens: int,
                 kinds: tuple[tuple[str, bool], ...], repeats: int, prompts_per_request: int,
                 gpu_util: bool = False) -> dict:
    """``repeats`` rounds of every kind (name, return_logprob): each kind's rate is the median of its
    rounds in this process, every round listed (one round moves with the host, and a round's first
    requests still meet cold paths); with ``gpu_util``, NVML's reading of each round too."""
    out: dict = {"tokens_per_s": {}, "rounds_tokens_per_s": {}}
    for name, logprob in kinds:
        rounds, util = [], []
        for _ in range(repeats):
            with GpuUtilSampler() if gpu_util else contextlib.nullcontext() as sampler:
                start = time.time()
                rate = asyncio.run(engine_rate(url, prompts, new_tokens, logprob, prompts_per_request))
                rounds.append(round(rate, 1))
                end = time.time()
            if sampler is not None:
                util.append(round_gpu_util(sampler.samples, start, end))
        out["rounds_tokens_per_s"][name] = rounds
        out["tokens_per_s"][name] = statistics.median(rounds)
        if util:
            out.setdefault("rounds_gpu_util", {})[name] = util
    return out


async def freeze_gc(urls: list[str]) -> None:
    """SGLang's /freeze_gc on every server: its processes' objects out of the garbage collector's walks."""
    for url in urls:
        async with SGLangClient(url) as client:
            await client.freeze_gc()


async def profiled_round(url: str, prompts: list[list[int]], new_tokens: int, out_dir: Path, steps: int,
                         after_s: float = 0.0, prompts_per_request: int = 1) -> Path:
    """One more round under SGLang's torch profiler (CPU and GPU) for ``steps`` forward passes: the
    round's first ones (the prefill and the first decode steps, while requests still arrive), or,
    with ``after_s``, those that start ``after_s`` seconds into the round, when every request is in
    one decode batch. Returns the trace file it wrote."""
    from slime_ref.rollout.sglang_client import EngineError

    out_dir.mkdir(parents=True, exist_ok=True)
    earlier = set(out_dir.rglob("*.trace.json*"))  # a reused --work-dir may hold an earlier run's trace

    async def start() -> None:
        try:
            async with SGLangClient(url) as client:
                await client.start_profile(str(out_dir), steps)
        except EngineError as e:
            raise SystemExit(f"engine_throughput: --profile-steps: {e}") from None

    if after_s <= 0:
        await start()
        await engine_rate(url, prompts, new_tokens, True, prompts_per_request)
    else:
        round_ = asyncio.ensure_future(engine_rate(url, prompts, new_tokens, True, prompts_per_request))
        await asyncio.sleep(after_s)
        await start()
        await round_
    deadline = time.monotonic() + 120  # the scheduler writes the trace after its last profiled step
    sizes: dict[Path, int] = {}
    while time.monotonic() < deadline:
        for trace in set(out_dir.rglob("*.trace.json*")) - earlier:
            size = trace.stat().st_size
            if size and sizes.get(trace) == size:  # the same size one poll apart: written out
                return trace
            sizes[trace] = size
        await asyncio.sleep(1)
    raise SystemExit(f"engine_throughput: --profile-steps: no trace in {out_dir} 120 s after the profiled round")


async def host_profiled_round(url: str, prompts: list[list[int]], new_tokens: int, sample_dir: Path,
                              prompts_per_request: int = 1) -> float:
    """One more round with log-probs while every server process samples its Python stacks
    (``pysample/sitecustomize.py``); returns the round's rate. The samples are written when it ends."""
    on = sample_dir / "on"
    on.touch()
    try:
        return await engine_rate(url, prompts, new_tokens, True, prompts_per_request)
    finally:
        on.unlink()


def host_profile_summary(sample_dir: Path, wait_s: float = 30.0, top: int = 25) -> dict:
    """The busiest sampled process (SGLang's scheduler, in a server): its samples per thread, and the
    functions holding the most of its main thread's samples, by themselves (leaf) and with what they
    call (inclusive)."""
    deadline = time.monotonic() + wait_s  # every sampling process writes its file when "on" goes away
    while time.monotonic() < deadline and list(sample_dir.glob("*.active")):
        time.sleep(0.1)
    profiles = {}
    for path in sample_dir.glob("*.folded"):
        stacks = []
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            stacks.append((stack.split(";"), int(n)))
        profiles[path.stem] = stacks
    if not profiles:
        return {"error": f"no samples in {sample_dir}: did the server start with pysample on PYTHONPATH?"}

    def busy(stacks):  # samples off the idle waits of a thread
        return sum(n for frames, n in stacks if not frames[-1].endswith((":wait", ":select", ":poll", ":recv",
                                                                         ":recv_pyobj", ":_recv", ":sleep")))

    pid, stacks = max(profiles.items(), key=lambda kv: busy(kv[1]))
    threads, leaf, inclusive = {}, {}, {}
    for frames, n in stacks:
        threads[frames[0]] = threads.get(frames[0], 0) + n
        if frames[0] != "MainThread":  # the scheduler's work is its main thread; the others mostly wait
            continue
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + n
        for name in set(frames[1:]):
            inclusive[name] = inclusive.get(name, 0) + n
    main = threads.get("MainThread", 0)

    def share(d, total):
        return {k: round(v / total, 3) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]} if total else {}

    return {"pid": pid, "main_thread_samples": main, "sampled_processes": len(profiles),
            "samples_by_thread": dict(sorted(threads.items(), key=lambda kv: -kv[1])),
            "main_thread_leaf_share": share(leaf, main), "main_thread_inclusive_share": share(inclusive, main),
            "folded": str(sample_dir / f"{pid}.folded")}


def gpu_busy_summary(trace_path: Path, top: int = 12) -> dict:
    """From a torch-profiler chrome trace: how much of the profiled span the GPU spent running
    kernels (the union of kernel intervals; memcpy and memset count as busy), and the kernels that
    took the most time. A busy fraction well under 1 means the host, not the GPU, sets the pace."""
    import gzip

    opener = gzip.open if trace_path.suffix == ".gz" else open
    with opener(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return {"trace": str(trace_path), "error": "no GPU events in the trace"}
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu)
    busy, end = 0.0, spans[0][0]
    for start, stop in spans:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    span = end - spans[0][0]
    by_name: dict[str, float] = {}
    for e in gpu:
        by_name[e["name"]] = by_name.get(e["name"], 0.0) + float(e.get("dur", 0))
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {"trace": str(trace_path), "span_ms": round(span / 1e3, 2), "gpu_busy_ms": round(busy / 1e3, 2),
            "gpu_busy_fraction": round(busy / span, 3) if span else None,
            "top_kernels_ms": {name[:120]: round(us / 1e3, 2) for name, us in ranked}}


def bench_builtin(args) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_ref.assets import make_tiny

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="engine-bench-"))
    assets = make_tiny(work / "tiny", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    rows = [json.loads(line) for line in assets.train_path.read_text().splitlines()]
    chats = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    prompts = [tokenizer.encode(c) for c in chats]
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32).eval()
    # The launcher gives a lone engine all cores but one; HF generate gets the same number.
    threads = max(1, (os.cpu_count() or 1) - 1)
    torch.set_num_threads(threads)
    result = {"engine": "builtin", "model": "embedded tiny Qwen3 (fp32)", "new_tokens": args.new_tokens,
              "cpu_count": os.cpu_count(), "torch_threads": threads, "return_logprob": True,
              "tokens_per_s": {}, "hf_generate_tokens_per_s": {}}
    with RolloutServers(assets.model_dir, log_dir=work / "logs", num_engines=1, with_router=False) as servers:
        asyncio.run(engine_rate(servers.url, prompts[:2], 4, True))  # warm up
        for c in args.concurrency:
            batch = [prompts[i % len(prompts)] for i in range(c)]
            result["tokens_per_s"][str(c)] = round(
                asyncio.run(engine_rate(servers.url, batch, args.new_tokens, True)), 1
            )
    for c in args.concurrency:
        batch = [prompts[i % len(prompts)] for i in range(c)]
        hf_rate(model, batch[:1], 2, tokenizer.pad_token_id, "cpu")  # warm up
        result["hf_generate_tokens_per_s"][str(c)] = round(
            hf_rate(model, batch, args.new_tokens, tokenizer.pad_token_id, "cpu"), 1)
    return result


def build_qwen3_0_6b_shape(out: Path) -> Path:
    """Random bf16 weights in Qwen3-0.6B's shape, saved as an HF checkpoint (built on the GPU)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from slime_ref.assets import build_tokenizer

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    config = Qwen3Config(**QWEN3_0_6B_SHAPE, torch_dtype="bfloat16", bos_token_id=0, eos_token_id=1)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    build_tokenizer().save_pretrained(out)  # a complete HF directory, though the bench skips tokenizing
    del model
    torch.cuda.empty_cache()
    return out


def split_sglang_flags(text: str) -> list[str]:
    """``--sglang-flags``' one quoted string as argv tokens; every flag must use slime's ``--sglang-*``
    spelling (the rollout hands them to SGLang without the prefix). Raises ValueError naming the token."""
    tokens = shlex.split(text)
    names = [t for i, t in enumerate(tokens) if i == 0 or t.startswith("--")]  # a value never comes first
    for name in names:
        if not name.startswith("--sglang-"):
            raise ValueError(f"expected flags spelled --sglang-NAME (slime's spelling), got {name!r}")
    return tokens


# SGLang's attention backend for the GPU benches (engine_throughput, grpo_step, gpu_sharing). flashinfer's
# decode kernel reads the K/V cache faster than triton's: at 512 x 512 on one H200, 43.7k generated tok/s
# against 36-38k (bench/LOG.md, "flashinfer attention"). Its kernels are compiled on the server's
# first start (about 80 s more); triton needs no compiler.
GPU_ATTENTION_BACKEND = "flashinfer"

# What each backend needs beyond the slim wheel set: the package, the paths that must exist inside it,
# and how to get them. flashinfer compiles its kernels against the CUDA headers it vendors (CCCL,
# CUTLASS, spdlog); without them nvcc 13 takes the CUDA toolkit's newer CCCL and the decode kernel
# does not compile.
_BACKEND_NEEDS = {
    "flashinfer": ("flashinfer", ["data/cccl/libcudacxx/include", "data/cccl/cub", "data/cccl/thrust",
                                  "data/cutlass/include", "data/spdlog/include"],
                   "install flashinfer-python whole (.[sglang], or bench/gpu/build_sglang_wheelset.sh's set), "
                   "which keeps them"),
    "fa3": ("sgl_kernel", ["flash_ops.abi3.so"],
            "install sglang-kernel whole, with its FA3 library (the slim wheel set leaves it out)"),
}


def attention_backend_missing(backend: str) -> str | None:
    """Why SGLang's ``backend`` cannot start with the installed packages, or None when nothing it is
    known to need is missing (``triton`` needs nothing beyond SGLang)."""
    if backend not in _BACKEND_NEEDS:
        return None
    package, paths, fix = _BACKEND_NEEDS[backend]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        what = f"the {package} package, which is not installed"
    else:
        root = Path(next(iter(spec.submodule_search_locations)))
        missing = [str(root / path) for path in paths if not (root / path).exists()]
        if not missing:
            return None
        what = f"{', '.join(missing)}, missing from this install"
    return f"{backend} needs {what}; {fix}, or pass --attention-backend triton"


def sglang_server_flags(args) -> list[str]:
    """slime-style ``--sglang-*`` flags of the server(s) ``bench_sglang`` starts."""
    return [
        *sglang_offline_gpu_flags(args.attention_backend),
        *sglang_cuda_graph_flags(not args.no_cuda_graph, max_bs_decode=-(-args.concurrency[0] // args.engines)),
        "--sglang-skip-tokenizer-init",  # no tokenizer work: the random model's ids are not the tokenizer's
        *(["--sglang-disable-radix-cache"] if args.disable_radix_cache else []),
        *(["--sglang-load-snapshot-publish-interval", str(args.load_snapshot_interval)]
          if args.load_snapshot_interval is not None else []),
        *(["--sglang-scheduler-recv-interval", str(args.scheduler_recv_interval)]
          if args.scheduler_recv_interval is not None else []),
        *split_sglang_flags(args.sglang_flags),
    ]


def bench_sglang(args) -> dict:
    from transformers import AutoModelForCausalLM

    if not torch.cuda.is_available():
        sys.exit("--engine sglang needs a CUDA GPU")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="engine-bench-"))
    model_dir = build_qwen3_0_6b_shape(work / "qwen3-0.6b-shape")
    rng = random.Random(0)
    concurrency = args.concurrency[0]
    prompts = [[rng.randrange(2, 30000) for _ in range(args.prompt_tokens)] for _ in range(concurrency)]
    flags = sglang_server_flags(args)
    result = {"engine": "sglang", "model": "Qwen3-0.6B shape, random bf16 weights", "gpu": torch.cuda.get_device_name(),
              "concurrency": concurrency, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "cuda_graph_decode": not args.no_cuda_graph, "attention_backend": args.attention_backend,
              "radix_cache": not args.disable_radix_cache,
              "load_snapshot_publish_interval": args.load_snapshot_interval,
              "scheduler_recv_interval": args.scheduler_recv_interval, "sglang_flags": args.sglang_flags,
              "prompts_per_request": args.prompts_per_request[0]}
    env = {}
    if args.host_profile:
        sample_dir = work / "host-profile"
        sample_dir.mkdir(parents=True, exist_ok=True)
        for old in [*sample_dir.glob("*.folded"), *sample_dir.glob("*.active")]:  # a reused --work-dir's
            old.unlink()
        sampler = Path(__file__).resolve().parent / "pysample"
        env = {"SLIME_BENCH_PYSAMPLE_DIR": str(sample_dir),
               "PYTHONPATH": os.pathsep.join([str(sampler), os.environ.get("PYTHONPATH", "")])}
    if args.engines > 1:
        result["engines_on_the_gpu"] = args.engines
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        urls = []
        for i in range(args.engines):
            # engines on one GPU: SGLang's --mem-fraction-static bounds the GPU's whole use when a
            # server starts (the ones before it included), so engine i gets (i + 1) / N of the budget
            share = ["--sglang-mem-fraction-static", f"{args.mem_fraction * (i + 1) / args.engines:.4f}"]
            flags = [*without_flag(flags, "--sglang-mem-fraction-static"), *share]
            servers = stack.enter_context(RolloutServers(
                model_dir, log_dir=work / "logs", engine="sglang", with_router=False, sglang_flags=flags,
                startup_timeout_s=args.startup_timeout, env=env, log_name=f"engine{i}"))
            urls.append(servers.url)
        url = urls if len(urls) > 1 else urls[0]
        result["startup_s"] = round(time.perf_counter() - start, 1)
        # warm up at the rounds' own batch (8 tokens each): on a machine's first start flashinfer
        # compiles its kernels for the batch's shapes here, not in the first timed round
        first = args.prompts_per_request[0]
        asyncio.run(engine_rate(url, prompts, 8, True, first))
        if args.freeze_gc:
            asyncio.run(freeze_gc(urls))
            result["gc_frozen_after_warmup"] = True
        kinds = (("return_logprob", True),) if args.logprob_only else (("return_logprob", True), ("no_logprob", False))
        for n in args.prompts_per_request:
            rates = timed_rounds(url, prompts, args.new_tokens, kinds, args.repeats, n, args.gpu_util)
            if n == first:  # the figures speed_targets.py reads: the first value's
                result.update(rates)
            if len(args.prompts_per_request) > 1:
                result.setdefault("by_prompts_per_request", {})[str(n)] = rates
        if args.profile_steps:
            trace = asyncio.run(profiled_round(url, prompts, args.new_tokens, work / "profile",
                                               args.profile_steps, args.profile_after_s, first))
            result["profile"] = {"steps": args.profile_steps, "after_s": args.profile_after_s,
                                 **gpu_busy_summary(trace)}
        if args.host_profile:
            rate = asyncio.run(host_profiled_round(url, prompts, args.new_tokens, sample_dir, first))
            result["host_profile"] = {"round_tokens_per_s": round(rate, 1), **host_profile_summary(sample_dir)}
    if args.skip_hf:
        return result
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    hf_rate(model, prompts[:2], 2, 0, "cuda")  # warm up
    result["hf_generate_tokens_per_s"] = round(hf_rate(model, prompts, args.new_tokens, 0, "cuda"), 1)
    return result


def build_parser() -> argparse.ArgumentParser:
    """The command line (also how gpu_sharing.py gets this bench's default server flags)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["builtin", "sglang"], default="builtin")
    p.add_argument("--concurrency", type=int, nargs="+", default=None,
                   help="builtin: concurrency levels (default 1 8 64); sglang: one level (default 256)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens per request (builtin 64, sglang 128)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="sglang: random prompt length")
    p.add_argument("--no-cuda-graph", action="store_true", help="sglang: run decode without CUDA graphs")
    p.add_argument("--attention-backend", default=GPU_ATTENTION_BACKEND,
                   help="sglang: SGLang's attention backend: flashinfer (compiled on the first start), triton "
                        "(no compiler needed) or fa3 (needs sglang-kernel's FA3 library)")
    p.add_argument("--repeats", type=int, default=3, help="sglang: rounds per rate; the median is reported")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="sglang: after the rounds, profile one more round's first N forward passes (SGLang's "
                        "torch profiler) and report how busy the GPU was and its top kernels")
    p.add_argument("--profile-after-s", type=float, default=0.0, metavar="S",
                   help="sglang: with --profile-steps, start profiling S seconds into the round (mid-round "
                        "decode steps with every request in the batch) instead of at its first pass")
    p.add_argument("--host-profile", action="store_true",
                   help="sglang: after the rounds, one more round (with log-probs) while the server's processes "
                        "sample their Python stacks (pysample/); reports where the busiest one, the scheduler, "
                        "spends its time")
    p.add_argument("--engines", type=int, default=1,
                   help="sglang: SGLang servers sharing the GPU, the prompts dealt round-robin over them (each "
                        "has its own scheduler process, the host work of a decode step is split between them)")
    p.add_argument("--mem-fraction", type=float, default=0.3,
                   help="sglang: --mem-fraction-static of the one server, or of all of them together")
    p.add_argument("--disable-radix-cache", action="store_true",
                   help="sglang: SGLang's --disable-radix-cache (no prefix tree: a decode step frees and evicts "
                        "nothing; a rollout whose prompts are a few tokens reuses little of it anyway)")
    p.add_argument("--load-snapshot-interval", type=int, default=None, metavar="N",
                   help="sglang: SGLang's --load-snapshot-publish-interval (default 15): the scheduler writes its "
                        "load for the router every N decode steps, 5%% of its main thread at 512 requests")
    p.add_argument("--scheduler-recv-interval", type=int, default=None, metavar="N",
                   help="sglang: SGLang's --scheduler-recv-interval (default 1): the scheduler polls for new "
                        "requests every N decode steps instead of every step")
    p.add_argument("--sglang-flags", default="", metavar="FLAGS",
                   help="sglang: more server flags in slime's --sglang-* spelling, one quoted string, e.g. "
                        "\"--sglang-page-size 16\" (each reaches SGLang without its sglang- prefix)")
    p.add_argument("--prompts-per-request", type=int, nargs="+", default=[1], metavar="N",
                   help="sglang: send the prompts N to a /generate (SGLang's batched form; the GRPO rollout sends "
                        "a prompt's samples so, 8 at a time in grpo_step.py --gpu) instead of one each; several "
                        "values are measured one after another on the one server (by_prompts_per_request), the "
                        "first giving the top-level figures, the warm-up and the profiles")
    p.add_argument("--freeze-gc", action="store_true",
                   help="sglang: after the warm-up, SGLang's /freeze_gc (its tokenizer manager, scheduler and "
                        "detokenizer take what they hold out of Python's garbage collector's walks)")
    p.add_argument("--gpu-util", action="store_true",
                   help="sglang: read NVML's GPU and memory busy percentages through every round; reports each "
                        "round's mean and the seconds at its head and tail with the GPU idle")
    p.add_argument("--logprob-only", action="store_true",
                   help="sglang: measure the rate with return_logprob only (the RL rollout's), not the one without")
    p.add_argument("--skip-hf", action="store_true", help="sglang: leave out HF generate (saves GPU minutes)")
    p.add_argument("--startup-timeout", type=float, default=480.0, help="sglang: seconds to wait for the server")
    p.add_argument("--work-dir", default=None, help="where models and logs go (default: a temp dir)")
    return p


def main() -> None:
    p = build_parser()
    args = p.parse_args()
    if args.concurrency is None:
        args.concurrency = [256] if args.engine == "sglang" else [1, 8, 64]
    if min(args.concurrency) < 1:
        p.error("--concurrency: every level must be at least 1")
    if args.repeats < 1:
        p.error(f"--repeats: must be at least 1, got {args.repeats}")
    if args.profile_steps < 0:
        p.error(f"--profile-steps: must be 0 (off) or more, got {args.profile_steps}")
    if args.engines < 1:
        p.error(f"--engines: must be at least 1, got {args.engines}")
    if args.load_snapshot_interval is not None and args.load_snapshot_interval < 1:
        p.error(f"--load-snapshot-interval: must be at least 1 decode step, got {args.load_snapshot_interval}")
    if args.scheduler_recv_interval is not None and args.scheduler_recv_interval < 1:
        p.error(f"--scheduler-recv-interval: must be at least 1 decode step, got {args.scheduler_recv_interval}")
    if args.profile_after_s < 0:
        p.error(f"--profile-after-s: must be 0 or more seconds, got {args.profile_after_s}")
    if args.profile_after_s and not args.profile_steps:
        p.error("--profile-after-s: says when --profile-steps starts; give --profile-steps N too")
    try:
        split_sglang_flags(args.sglang_flags)
    except ValueError as e:
        p.error(f"--sglang-flags: {e}")
    args.prompts_per_request = list(dict.fromkeys(args.prompts_per_request))  # each value once, in order
    if min(args.prompts_per_request) < 1:
        p.error(f"--prompts-per-request: each must be at least 1, got {min(args.prompts_per_request)}")
    if args.engines > 1 and args.profile_steps:
        p.error("--profile-steps profiles one server; leave out --engines")
    if args.engine == "sglang" and len(args.concurrency) != 1:
        p.error(f"--concurrency: --engine sglang takes one level, got {len(args.concurrency)}")
    if args.engine == "sglang" and (problem := attention_backend_missing(args.attention_backend)):
        p.error(f"--attention-backend {args.attention_backend}: {problem}")
    if args.new_tokens is None:
        args.new_tokens = 128 if args.engine == "sglang" else 64
    result = bench_sglang(args) if args.engine == "sglang" else bench_builtin(args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
