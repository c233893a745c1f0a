"""Where a GRPO step's time goes in ``slime-ref train``, and the memory of the whole run; prints JSON.

CPU (default): the quick start's recipe (``slime-check quickstart``: the embedded tiny Qwen3 and its
arithmetic task, the supervised warm-up, then GRPO colocated on the real stack: Ray, the built-in
engine behind sglang-router, the Megatron actor, weight sync by tensor handles). Its flags come from
``slime_rehearse.quickstart`` (``warmup_argv``/``grpo_argv``), so the bench runs what users run.
Reports the median seconds of each phase of a GRPO step (rollout, log-probs, train, weight sync,
eval), tokens/s, and the peak resident memory of every process of the run together (the driver and
its descendants: Ray's GCS, raylet and workers, the engines and the router), sampled with psutil.

GPU (``--gpu``, one CUDA device): the same loop colocated with real SGLang (``--rollout-engine
sglang``), on a Qwen3-0.6B-shaped model with random bf16 weights built here, 64 prompts x 8
samples x 512 new tokens forced (``ignore_eos``), then, in the same run and on the same model and
prompts, TRL's GRPOTrainer on identical work (HF generate with ``min_new_tokens=512``, bf16, sdpa,
``loss_type="dapo"``, ``beta=0``, ``adamw_torch_fused``, micro-batches of 32). Each trainer runs in
its own subprocess; the first steps are left out of the medians (start-up, compilation): ours, the
first two rollouts (``step_summary``); TRL, its first step.

    python bench/grpo_step.py                         # CPU, about 4 minutes on 2 cores
    python bench/grpo_step.py --num-rollout 10
    python bench/grpo_step.py --gpu                   # one H200: about 5-7 minutes
    python bench/grpo_step.py --gpu --dry-run         # anywhere: build a small model, parse every flag

``--gpu`` needs SGLang (``.[sglang]``) and TRL (``.[bench]``); offline GPU machines: see
bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "gpu"))

import grpo_harness as h  # noqa: E402
from engine_throughput import GPU_ATTENTION_BACKEND, attention_backend_missing, split_sglang_flags  # noqa: E402

GPU_RECIPE = dict(prompts=64, samples_per_prompt=8, new_tokens=512, lr=1e-6, trl_micro_batch=32,
                  max_tokens_per_gpu=16384)
TRL_GPU_REFERENCE = ("TRL 1.16.0 on one H200: 21.2 s a step (16.2 s generating at 16.3k tok/s, 4.9 s training), "
                     "37 GiB allocated at peak (issue 6)")


def phase_medians(metrics: list[dict], skip: int = 1) -> dict:
    """Median of each perf/* timer over the GRPO steps (the first ``skip`` left out)."""
    rows = [m for m in metrics if "perf/train_time" in m][skip:]
    names = sorted({k for m in rows for k in m if k.startswith("perf/")})
    return {k.removeprefix("perf/"): round(h.median([m[k] for m in rows if k in m]), 4) for k in names}


def step_summary(run: dict, samples_per_step: int) -> dict:
    """Step time, tokens/s and the phases of ``run`` (see grpo_harness.run_ours).

    The timed steps are the rollouts after the first two (the first has no start mark, the second
    meets cold paths); the phase medians are taken over those same rollouts, so the step and its
    phases describe the same work. ``outside_phases_s`` is what the step spends outside the timed
    phases (the engines' release and resume, the driver's hand-offs): each timed step's own split
    is listed under ``steps``.
    """
    timed = run["steps"][1:] or run["steps"]
    steps = [s["step_s"] for s in timed]
    metrics = [m for m in run["metrics"] if "perf/train_time" in m]
    skip = max(len(metrics) - len(timed), 0)  # metrics rows are rollouts 0, 1, ...; timed are the last ones
    step = h.median(steps)
    generated = h.median([m["rollout/response_length"] * samples_per_step for m in metrics[skip:] or metrics])
    phases = phase_medians(run["metrics"], skip=skip)
    phase_keys = ("perf/rollout_time", "perf/train_time", "perf/update_weights_time")
    per_step = []
    for s, m in zip(timed, metrics[skip:]):
        inside = sum(m.get(k, 0.0) for k in phase_keys)
        per_step.append({k: v if k == "rollout_id" else round(v, 3) for k, v in s.items()}
                        | {"outside_phases_s": round(s["step_s"] - inside, 3)})
    return {
        "median_step_s": round(step, 4),
        "steps_timed": len(steps),
        "phase_median_s": {
            "rollout": phases.get("rollout_time"),
            "log_probs": phases.get("log_probs_time", 0.0),  # 0: the one training step's forward gives them
            "train": phases.get("train_time"),
            "update_weights": phases.get("update_weights_time"),
            "train_parts": {k: phases[k] for k in ("data_preprocess_time", "ref_log_probs_time", "log_probs_time",
                                                   "actor_train_time") if k in phases},
            "outside_phases": round(h.median([r["outside_phases_s"] for r in per_step]), 4) if per_step else None,
        },
        "steps": per_step,
        "generated_tokens_per_step": round(generated, 1),
        "tokens_per_s": {"generated_per_rollout_s": round(generated / phases["rollout_time"], 1),
                         "generated_per_step_s": round(generated / step, 1),
                         "actor_train": phases.get("actor_train_tok_per_s")},
        "cpu_s_per_step": run.get("cpu_s_per_step"),
    }


# ------------------------------------------------------------------------------------------------
# CPU: the quick start


def run_cpu(out: Path, num_rollout: int, seed: int) -> dict:
    from slime_ref.arguments import parse_args
    from slime_ref.assets import make_tiny
    from slime_ref.train import train
    from slime_rehearse.quickstart import QuickstartConfig, grpo_argv, warmup_argv

    cfg = QuickstartConfig(seed=seed, num_rollout=num_rollout)
    cfg.eval_interval = max(1, min(cfg.eval_interval, num_rollout))
    result: dict = {"config": {k: v for k, v in vars(cfg).items() if k != "extra"}}
    # one sampler over the whole run: warm-up and GRPO, each with its own Ray cluster
    with h.ProcessTreeMemory() as memory:
        assets = make_tiny(out / "assets", seed=seed)
        start = time.perf_counter()
        train(parse_args(warmup_argv(cfg, assets, out)))
        result["warmup_s"] = round(time.perf_counter() - start, 1)
        grpo = h.run_ours(grpo_argv(cfg, assets, out))
    result["grpo"] = step_summary(grpo, cfg.rollout_batch_size * cfg.n_samples_per_prompt)
    evals = grpo["eval_metrics"]
    result["grpo"]["phase_median_s"]["eval"] = round(h.median([m["perf/eval_time"] for m in evals]), 4) if evals \
        else None
    result["grpo"]["setup_s"] = round(grpo["setup_s"], 1)
    result["grpo"]["wall_s"] = round(grpo["wall_s"], 1)
    result["memory"] = memory.report()
    result["memory"]["target_gib"] = 6.0
    return result


# ------------------------------------------------------------------------------------------------
# GPU: Qwen3-0.6B shapes, real SGLang, TRL beside it


def build_model(out: Path, tiny_model: Path, small: bool = False) -> Path:
    """A Qwen3-0.6B-shaped HF checkpoint with random bf16 weights (``small``: a 2-layer, hidden-64
    variant with the same vocabulary, for dry runs) and the tiny model's tokenizer and chat template."""
    import shaped_model

    return shaped_model.build(out, "qwen3-0.6B", tiny_model, small=small)


def gpu_prompts(out: Path, n: int) -> Path:
    """``n`` arithmetic prompts (chat messages, about 13 tokens with the template) with their labels."""
    from slime_ref.assets import TinyTaskConfig, arithmetic_problems

    rows = [{"prompt": [{"role": "user", "content": q}], "label": a}
            for q, a in arithmetic_problems(TinyTaskConfig())][:n]
    return h.write_prompts(rows, out / "prompts.jsonl")


def generate_rollout_ignore_eos(args, rollout_id, data_source, evaluation=False):
    """--rollout-function-path for the GPU recipe: slime-ref's default rollout, every response forced
    to its full length (SGLang's ``ignore_eos``), as TRL's ``min_new_tokens`` forces it. It is set in
    the rollout's sampling parameters, where slime's GenerateState keeps them, so each group still goes
    to SGLang as one request of 8 prompts, as a user's default rollout sends it (a custom generate
    function would send each sample alone)."""
    from slime_ref.rollout import sglang_rollout

    if not evaluation:
        sglang_rollout.generation_state(args).sampling_params["ignore_eos"] = True
    return sglang_rollout.generate_rollout(args, rollout_id, data_source, evaluation=evaluation)


def gpu_flags(model: Path, prompts: Path, out: Path, num_rollout: int, cuda_graph: bool = True,
              attention_backend: str = GPU_ATTENTION_BACKEND, sglang_flags: str = "") -> list[str]:
    from sglang_recipes import sglang_cuda_graph_flags, sglang_offline_gpu_flags

    r = GPU_RECIPE
    return [
        "--hf-checkpoint", str(model), "--prompt-data", str(prompts), "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rm-type", "math", "--num-rollout", str(num_rollout),
        "--rollout-batch-size", str(r["prompts"]), "--n-samples-per-prompt", str(r["samples_per_prompt"]),
        "--global-batch-size", str(r["prompts"] * r["samples_per_prompt"]),
        "--rollout-max-response-len", str(r["new_tokens"]), "--rollout-temperature", "1.0",
        "--rollout-function-path", "grpo_step.generate_rollout_ignore_eos",
        "--sglang-server-concurrency", str(r["prompts"] * r["samples_per_prompt"]),
        "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--calculate-per-token-loss",
        "--optimizer", "adam", "--lr", str(r["lr"]), "--lr-decay-style", "constant", "--weight-decay", "0.0",
        "--clip-grad", "1.0", "--bf16", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", str(r["max_tokens_per_gpu"]),
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--colocate",
        "--rollout-engine", "sglang", *sglang_offline_gpu_flags(attention_backend),
        # decode graphs for every batch size up to all 512 requests at once (the default stops at 256)
        *sglang_cuda_graph_flags(cuda_graph, max_bs_decode=r["prompts"] * r["samples_per_prompt"]),
        *split_sglang_flags(sglang_flags),  # --sglang-flags: after the recipe's, so they win
        "--output-dir", str(out),
    ]


def gpu_worker(kind: str, workdir: Path, steps: int, cuda_graph: bool = True,
               attention_backend: str = GPU_ATTENTION_BACKEND, sglang_flags: str = "") -> dict:
    r = GPU_RECIPE
    model, prompts = workdir / "model", workdir / "prompts.jsonl"
    if kind == "ours":
        flags = gpu_flags(model, prompts, workdir / "ours", steps, cuda_graph, attention_backend, sglang_flags)
        run = h.run_ours(flags, memory=True, gpu=True)
        result = step_summary(run, r["prompts"] * r["samples_per_prompt"])
        result.update(setup_s=round(run["setup_s"], 1), wall_s=round(run["wall_s"], 1), memory=run["memory"],
                      response_length=[m["rollout/response_length"] for m in run["metrics"]])
        return result
    run = h.run_trl(model, h.read_jsonl(prompts), out_dir=workdir / "trl", seed=0, steps=steps,
                    prompts_per_step=r["prompts"], samples_per_prompt=r["samples_per_prompt"],
                    max_new_tokens=r["new_tokens"], lr=r["lr"], gpu=True, micro_batch=r["trl_micro_batch"],
                    min_new_tokens=r["new_tokens"], memory=True)
    step, generate = run["step_s"][1:], run["generate_s"][1:]
    tokens = r["prompts"] * r["samples_per_prompt"] * r["new_tokens"]
    return {"median_step_s": round(h.median(step), 3), "steps_timed": len(step),
            "phase_median_s": {"generate_and_score": round(h.median(generate), 3),
                               "train": round(h.median([s - g for s, g in zip(step, generate)]), 3)},
            "generated_tokens_per_s": round(tokens / h.median(generate), 1),
            "first_step_s": round(run["step_s"][0], 1), "peak_allocated_gib": run.get("peak_allocated_gib"),
            "response_length": run["response_length"], "memory": run["memory"]}


def spawn(kind: str, workdir: Path, steps: int, timeout_s: float, extra: list[str]) -> dict:
    """One trainer in its own process (a clean GPU for each); its JSON result."""
    result_path = workdir / f"{kind}.result.json"
    log = workdir / f"{kind}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])}
    with open(log, "wb") as f:
        proc = subprocess.run([sys.executable, __file__, "--worker", kind, "--workdir", str(workdir),
                               "--num-rollout", str(steps), *extra], stdout=f, stderr=subprocess.STDOUT, env=env,
                              timeout=timeout_s)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        return {"error": f"exit {proc.returncode}; log {log}", "log_tail": tail}
    return json.loads(result_path.read_text())


def run_gpu(workdir: Path, steps: int, trl_steps: int, trainers: list[str], dry_run: bool, cuda_graph: bool,
            attention_backend: str = GPU_ATTENTION_BACKEND, sglang_flags: str = "") -> dict:
    import torch

    from slime_ref.arguments import parse_args
    from slime_ref.assets import make_tiny

    tiny = make_tiny(workdir / "tiny", seed=0)
    model = build_model(workdir / "model", tiny.model_dir, small=dry_run)
    gpu_prompts(workdir, GPU_RECIPE["prompts"])
    args = parse_args(gpu_flags(model, workdir / "prompts.jsonl", workdir / "ours", steps, cuda_graph,
                                attention_backend, sglang_flags))
    result = {"recipe": {**GPU_RECIPE, "model": "Qwen3-0.6B shapes, random bf16 weights" if not dry_run
                         else "dry run: 2 layers, hidden 64, Qwen3-0.6B's vocabulary",
                         "steps": steps, "trl_steps": trl_steps, "sglang_decode_cuda_graphs": cuda_graph,
                         "sglang_attention_backend": attention_backend, "sglang_flags": sglang_flags,
                         # generate_rollout_ignore_eos sends each group as one /generate
                         # (tests/slime_ref/test_rollout_fn.py holds it to that)
                         "rollout_prompts_per_request": GPU_RECIPE["samples_per_prompt"]},
              "reference": TRL_GPU_REFERENCE}
    if dry_run:
        from slime_ref.utils.hooks import load_function

        load_function(args.rollout_function_path, "--rollout-function-path")
        result["dry_run"] = {
            "flags_parse": True,
            "rollout_engine": args.rollout_engine,
            "colocate": args.colocate,
            "sglang_flags": dict(args.sglang_extra),
            "model_files": sorted(p.name for p in model.iterdir()),
        }
        return result
    if not torch.cuda.is_available():
        raise SystemExit("--gpu needs a CUDA device (or --dry-run)")
    result["gpu"] = torch.cuda.get_device_name()
    extra = ["--attention-backend", attention_backend, "--sglang-flags", sglang_flags,
             *([] if cuda_graph else ["--no-cuda-graph"])]
    for kind in trainers:
        result[kind] = spawn(kind, workdir, steps if kind == "ours" else trl_steps, timeout_s=3600, extra=extra)
    ours, trl = result.get("ours", {}), result.get("trl", {})
    if "median_step_s" in ours and "median_step_s" in trl:
        ratio = ours["median_step_s"] / trl["median_step_s"]
        result["step_time_ratio_ours_over_trl"] = round(ratio, 3)
        result["target_at_most_a_third_of_trl"] = ratio <= 1 / 3
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", action="store_true", help="one CUDA GPU: Qwen3-0.6B shapes, real SGLang, and TRL")
    p.add_argument("--dry-run", action="store_true", help="with --gpu: build a small model and parse the flags only")
    p.add_argument("--num-rollout", type=int, default=None, help="GRPO steps (CPU default 20, GPU default 5: 3 timed)")
    p.add_argument("--trl-steps", type=int, default=3, help="--gpu: TRL's steps (the first is left out)")
    p.add_argument("--trainers", default="ours,trl", help="--gpu: comma-separated, of ours and trl")
    p.add_argument("--no-cuda-graph", action="store_true", help="--gpu: SGLang without CUDA graphs (faster start)")
    p.add_argument("--attention-backend", default=GPU_ATTENTION_BACKEND,
                   help="--gpu: SGLang's attention backend: flashinfer (compiled on the first start), triton (no "
                        "compiler needed) or fa3 (needs sglang-kernel's FA3 library)")
    p.add_argument("--sglang-flags", default="", metavar="FLAGS",
                   help="--gpu: more SGLang server flags for ours, in slime's --sglang-* spelling, one quoted string "
                        "(e.g. \"--sglang-page-size 16\"); they come after the recipe's, so they win")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=None, help="where the run writes (default: a temp dir)")
    p.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    a = p.parse_args()
    try:
        split_sglang_flags(a.sglang_flags)
    except ValueError as e:
        p.error(f"--sglang-flags: {e}")
    if a.sglang_flags and not a.gpu and not a.worker:
        p.error("--sglang-flags: the CPU recipe runs the built-in engine; use it with --gpu")
    trainers = [t.strip() for t in a.trainers.split(",") if t.strip()]
    if a.gpu and not a.dry_run and not a.worker and "ours" in trainers \
            and (problem := attention_backend_missing(a.attention_backend)):
        p.error(f"--attention-backend {a.attention_backend}: {problem}")
    if a.worker:
        result = gpu_worker(a.worker, a.workdir, a.num_rollout, cuda_graph=not a.no_cuda_graph,
                            attention_backend=a.attention_backend, sglang_flags=a.sglang_flags)
        (a.workdir / f"{a.worker}.result.json").write_text(json.dumps(result))
        return

    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="grpo_step-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    if a.gpu:
        out = {"bench": "grpo_step", "mode": "gpu",
               **run_gpu(workdir, a.num_rollout or 5, a.trl_steps, trainers, a.dry_run, not a.no_cuda_graph,
                         a.attention_backend, a.sglang_flags)}
    else:
        out = {"bench": "grpo_step", "mode": "cpu", **run_cpu(workdir, a.num_rollout or 20, a.seed)}
    import torch

    out["conditions"] = {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                         "load_avg_before": [round(x, 2) for x in load_before],
                         "load_avg_after": [round(x, 2) for x in os.getloadavg()], "torch": torch.__version__,
                         "wall_s": round(time.perf_counter() - started, 1), "workdir": str(workdir)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
