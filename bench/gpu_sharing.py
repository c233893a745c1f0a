"""Rollout and training sharing one GPU from two processes: does generation hide under training? Prints JSON.

A GRPO step on one GPU runs its rollout, then its training: 6.3 s + 3.1 s on an H200
(``grpo_step.py --gpu``). Training on rollout N while rollout N+1 generates (slime's
``train_async.py``) hides the training only as far as the rollout leaves the GPU idle and two
processes' kernels can share it. Without MPS they take turns; under MPS they can run side by side.
This measures what sharing gives (bench/LOG.md, 2026-12-04: 1.03x taking turns, 1.18x under MPS).

Real SGLang serves the GRPO rollout's shape (512 requests, 13-token prompts, 512 new tokens,
``return_logprob``, Qwen3-0.6B shape, random bf16 weights) while a second process trains the same
model shape (HF + SDPA, AdamW, 16 x 1024 tokens a step, the size of a GRPO micro-batch here):

1. the rollout alone (``--repeats`` rounds, median);
2. the training alone: its steps over ``--train-alone-s`` seconds;
3. both at once: rounds of the rollout while the trainer keeps stepping.

``overlap_gain`` = (the shared round's seconds of rollout alone + the training it got done, at its
own pace alone) / the shared round's seconds. Above 1, sharing the GPU beats running the two one
after the other; 1 means no gain.

    python bench/gpu_sharing.py --work-dir /tmp/eb      # one CUDA GPU, SGLang installed; about 2 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HERE = Path(__file__).resolve().parent


def trainer(model_dir: Path, control: Path, batch: int, seq: int) -> None:
    """The training process: steps until ``control/stop`` exists, then writes each step's
    (start, end) wall-clock seconds to ``control/steps.json``. ``control/ready`` once warm."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(2, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0)).cuda()

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()  # one sync a step: each step's end is when the GPU finished it

    for _ in range(3):
        step()
    (control / "ready").touch()
    spans = []
    while not (control / "stop").exists():
        start = time.time()
        step()
        spans.append((start, time.time()))
    tmp = control / "steps.json.tmp"
    tmp.write_text(json.dumps(spans))
    tmp.replace(control / "steps.json")


def steps_within(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Training steps done inside [lo, hi], a step cut by an edge counted by the share inside."""
    done = 0.0
    for start, end in spans:
        inside = min(end, hi) - max(start, lo)
        if inside > 0:
            done += inside / (end - start)
    return done


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise SystemExit(f"gpu_sharing: the trainer exited ({proc.returncode}) before {path.name}")
        if time.monotonic() > deadline:
            raise SystemExit(f"gpu_sharing: no {path.name} from the trainer after {timeout_s:.0f} s")
        time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", default=None, help="where the model and logs go (default: a temp dir)")
    p.add_argument("--repeats", type=int, default=2, help="rollout rounds alone, and rounds shared")
    p.add_argument("--train-alone-s", type=float, default=8.0, help="seconds the training runs alone")
    p.add_argument("--train-shape", default="16x1024", help="BATCHxSEQ tokens a training step")
    p.add_argument("--attention-backend", default=None,
                   help="SGLang's attention backend (default: engine_throughput.py's, flashinfer)")
    p.add_argument("--trainer", type=Path, default=None, help=argparse.SUPPRESS)  # the training process
    p.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    try:
        batch, seq = (int(x) for x in args.train_shape.lower().split("x"))
    except ValueError:
        p.error(f"--train-shape: expected BATCHxSEQ like 16x1024, got {args.train_shape!r}")
    if args.repeats < 1:
        p.error(f"--repeats: must be at least 1, got {args.repeats}")
    if args.trainer is not None:
        trainer(args.model, args.trainer, batch, seq)
        return

    import torch

    sys.path.insert(0, str(HERE))
    from engine_throughput import (
        attention_backend_missing,
        build_parser,
        build_qwen3_0_6b_shape,
        engine_rate,
        sglang_server_flags,
    )
    from slime_ref.rollout.servers import RolloutServers

    requests, new_tokens = 512, 512
    server_args = build_parser().parse_args(["--engine", "sglang", "--concurrency", str(requests)])
    server_args.attention_backend = args.attention_backend or server_args.attention_backend
    if problem := attention_backend_missing(server_args.attention_backend):
        p.error(f"--attention-backend {server_args.attention_backend}: {problem}")
    if not torch.cuda.is_available():
        sys.exit("gpu_sharing: needs a CUDA GPU")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="gpu-sharing-"))
    model_dir = build_qwen3_0_6b_shape(work / "qwen3-0.6b-shape")
    rng = random.Random(0)
    prompts = [[rng.randrange(2, 30000) for _ in range(13)] for _ in range(requests)]
    flags = sglang_server_flags(server_args)
    control = work / "trainer-control"
    control.mkdir(parents=True, exist_ok=True)
    for old in control.iterdir():
        old.unlink()
    result = {"gpu": torch.cuda.get_device_name(), "rollout": f"{requests} x {new_tokens}, return_logprob",
              "training": f"HF + SDPA, AdamW, {batch} x {seq} tokens a step", "sglang_flags": flags}

    def timed_round() -> tuple[float, float, float]:
        start = time.time()
        rate = asyncio.run(engine_rate(url, prompts, new_tokens, True))
        return start, time.time(), rate

    with RolloutServers(model_dir, log_dir=work / "logs", engine="sglang", with_router=False,
                        sglang_flags=flags, startup_timeout_s=480, log_name="engine") as servers:
        url = servers.url
        asyncio.run(engine_rate(url, prompts[:8], 8, True))  # warm up
        alone = [timed_round() for _ in range(args.repeats)]
        proc = subprocess.Popen([sys.executable, __file__, "--trainer", str(control), "--model", str(model_dir),
                                 "--train-shape", args.train_shape])
        try:
            wait_for(control / "ready", proc, 300)
            train_from = time.time()
            time.sleep(args.train_alone_s)  # the training alone, for its own pace
            train_to = time.time()
            shared = [timed_round() for _ in range(args.repeats)]
            (control / "stop").touch()
            wait_for(control / "steps.json", proc, 120)
        finally:
            (control / "stop").touch()
            proc.wait(timeout=120)
    spans = json.loads((control / "steps.json").read_text())
    step_alone_s = (train_to - train_from) / steps_within(spans, train_from, train_to)
    alone_rate = statistics.median(r for _, _, r in alone)
    rollout_alone_s = requests * new_tokens / alone_rate
    rounds = []
    for start, end, rate in shared:
        steps = steps_within(spans, start, end)
        rounds.append({"seconds": round(end - start, 3), "tokens_per_s": round(rate, 1),
                       "training_steps_done": round(steps, 2),
                       "overlap_gain": round((rollout_alone_s + steps * step_alone_s) / (end - start), 3)})
    result.update({
        "rollout_alone": {"rounds_tokens_per_s": [round(r, 1) for _, _, r in alone],
                          "tokens_per_s": round(alone_rate, 1)},
        "training_alone": {"step_ms": round(step_alone_s * 1e3, 1),
                           "tokens_per_s": round(batch * seq / step_alone_s, 1)},
        "shared_rounds": rounds,
        "overlap_gain": statistics.median(r["overlap_gain"] for r in rounds),
    })
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
