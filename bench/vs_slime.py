"""slime v0.3.1 and slime-ref on identical work, one GPU, side by side; prints JSON.

The work is ``bench/grpo_step.py --gpu``'s: Qwen3-0.6B shapes with random bf16 weights built here, 64
prompts x 8 samples x 512 new tokens forced (``ignore_eos``), colocated on one GPU with real SGLang, the
same flags for both (slime gets them as ``--sglang-*``; its MODEL_ARGS from its own
``scripts/models/qwen3-0.6B.sh``). Each trainer runs in its own process on a clean GPU; the first
step of each is left out of the medians.

- **speed**: median step, its phases (rollout, log-probs, train, weight update), generated and trained
  tokens/s, peak GPU memory (nvidia-smi, the whole device: SGLang's static pool included).
- **parity**: the same HF weights and one fixed batch (written here in slime's
  ``--save-debug-rollout-data`` format, loaded with ``--load-debug-rollout-data``: no engine), one
  optimizer step each. Both dump what they trained on (``--save-debug-train-data``): the reference
  log-probs of every response token are compared (bf16), and the step's pg_loss and grad_norm.

slime needs the offline set of bench/gpu/make_slime_set.sh (bench/README.md); on a machine without
TransformerEngine it runs with bench/gpu/te_named_local_spec.py (``--te-free``, the default there).

    python bench/vs_slime.py                              # speed and parity, 4 steps each
    python bench/vs_slime.py --parts parity --trainers slime
    python bench/vs_slime.py --dry-run                    # anywhere: small model, both commands, slime's parser
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

import grpo_harness as h  # noqa: E402
import grpo_step  # noqa: E402

# what a machine without TransformerEngine passes to real slime (bench/README.md)
TE_FREE_FLAGS = ["--transformer-impl", "local", "--spec", "te_named_local_spec", "te_named_local_spec",
                 "--no-rope-fusion", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
                 "--no-persist-layer-norm"]
# slime-ref's own flags in grpo_step's recipe, which slime does not have
OURS_ONLY = {"--rollout-engine", "--output-dir", "--rollout-function-path"}
# SGLang's attention for both trainers: triton, because the real-slime set's flashinfer comes without the
# CUDA headers its kernels compile against (bench/gpu/make_slime_set.sh)
ATTENTION_BACKEND = "triton"
PARITY = dict(prompts=64, samples=8, response_tokens=64, seed=0)
R = grpo_step.GPU_RECIPE
GENERATED_PER_STEP = R["prompts"] * R["samples_per_prompt"] * R["new_tokens"]


async def slime_generate_ignore_eos(args, sample, sampling_params):
    """--custom-generate-function-path for slime: its default generate, every response forced to its
    full length (SGLang's ``ignore_eos``), as grpo_step.generate_rollout_ignore_eos does for slime-ref.
    slime's default rollout sends each sample alone either way."""
    from slime.rollout.sglang_rollout import generate

    return await generate(args, sample, {**sampling_params, "ignore_eos": True})


# ------------------------------------------------------------------------------------------------
# the two commands


def model_args(slime_dir: Path) -> list[str]:
    """slime's own MODEL_ARGS for Qwen3-0.6B, read the way its launch scripts read them."""
    script = slime_dir / "scripts" / "models" / "qwen3-0.6B.sh"
    out = subprocess.run(["bash", "-c", f'source {shlex.quote(str(script))} && printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
                         capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.split("\n")[:-1]


def without(argv: list[str], names: set[str]) -> list[str]:
    from slime_rehearse.smoke_job import split_flags

    return [w for flag, values in split_flags(argv) if flag not in names for w in (flag, *values)]


def slime_speed_argv(workdir: Path, slime_dir: Path, steps: int, te_free: bool) -> list[str]:
    ours = grpo_step.gpu_flags(workdir / "model", workdir / "prompts.jsonl", workdir / "ours", steps,
                               attention_backend=ATTENTION_BACKEND)
    return [*model_args(slime_dir), *without(ours, OURS_ONLY), "--load", str(workdir / "model"),
            "--num-gpus-per-node", "1", "--custom-generate-function-path", "vs_slime.slime_generate_ignore_eos",
            *(TE_FREE_FLAGS if te_free else [])]


def parity_flags(workdir: Path, trainer: str) -> list[str]:
    """One step on the fixed batch, reference log-probs computed (a zero-weight KL loss needs them)."""
    model, n = workdir / "model", PARITY["prompts"] * PARITY["samples"]
    return [
        "--hf-checkpoint", str(model), "--ref-load", str(model), "--prompt-data", str(workdir / "prompts.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template", "--rm-type", "math",
        "--load-debug-rollout-data", str(workdir / "parity" / "batch_{rollout_id}.pt"),
        "--save-debug-train-data", str(workdir / "parity" / (trainer + "_{rollout_id}_{rank}.pt")),
        "--num-rollout", "1", "--rollout-batch-size", str(PARITY["prompts"]),
        "--n-samples-per-prompt", str(PARITY["samples"]), "--global-batch-size", str(n),
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.0", "--kl-loss-type", "low_var_kl",
        "--eps-clip", "0.2", "--calculate-per-token-loss", "--optimizer", "adam", "--lr", "1e-6",
        "--lr-decay-style", "constant", "--weight-decay", "0.0", "--clip-grad", "1.0", "--bf16",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--use-dynamic-batch-size",
        "--max-tokens-per-gpu", "16384", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
    ]


def write_fixed_batch(workdir: Path) -> Path:
    """64 prompts x 8 samples with fixed random responses and rewards, in slime's rollout-dump format."""
    import torch
    from transformers import AutoTokenizer

    from slime_ref.types import Sample

    path = workdir / "parity" / "batch_0.pt"
    if path.is_file():
        return path
    tokenizer = AutoTokenizer.from_pretrained(str(workdir / "model"))
    rows = h.read_jsonl(workdir / "prompts.jsonl")[: PARITY["prompts"]]
    rng = random.Random(PARITY["seed"])
    samples = []
    for g, row in enumerate(rows):
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        for j in range(PARITY["samples"]):
            response = [rng.randrange(3, len(tokenizer)) for _ in range(PARITY["response_tokens"])]
            # rollout_id stays None: slime v0.3.1 counts --global-batch-size in rollouts (samples sharing a
            # rollout_id train in one step), and a sample with none is its own rollout
            samples.append(Sample(
                group_index=g, index=g * PARITY["samples"] + j, prompt=row["prompt"],
                tokens=prompt + response, response=tokenizer.decode(response), response_length=len(response),
                label=row["label"], reward=float((g + j) % 3 == 0), loss_mask=[1] * len(response),
                rollout_log_probs=[0.0] * len(response), status=Sample.Status.COMPLETED))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": 0, "samples": [s.to_dict() for s in samples]}, path)
    return path


# ------------------------------------------------------------------------------------------------
# running them


def slime_env(slime_dir: Path, megatron_dir: Path) -> dict:
    path = [str(megatron_dir), str(BENCH / "gpu"), str(BENCH), str(REPO / "reference_impl")]
    path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path),
            "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}


@contextlib.contextmanager
def ours_path():
    """slime-ref's megatron-core where the real-slime set keeps it apart from slime's Megatron-LM
    (``SLIME_REF_PYTHONPATH``, bench/gpu/install_slime_set.sh): on this process's path and its children's."""
    extra = [p for p in os.environ.get("SLIME_REF_PYTHONPATH", "").split(os.pathsep) if p]
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*extra, *([before] if before else [])])
    sys.path[:0] = extra
    try:
        yield
    finally:
        del sys.path[:len(extra)]
        if before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = before


def run_slime(name: str, argv: list[str], workdir: Path, slime_dir: Path, megatron_dir: Path, timeout_s: float) -> dict:
    """slime's train.py with its own Ray head; its log, its metric lines, wall time and peak GPU memory."""
    from slime_rehearse.rehearsal import slime_log_metrics
    from slime_rehearse.smoke_launch import start_ray_head

    out = workdir / name
    out.mkdir(parents=True, exist_ok=True)
    env = slime_env(slime_dir, megatron_dir)
    head = start_ray_head(out, env)
    log = out / "slime.log"
    start = time.perf_counter()
    try:
        with open(log, "wb") as f, h.ProcessTreeMemory(gpu=True) as memory:
            proc = subprocess.run([sys.executable, str(slime_dir / "train.py"), *argv], stdout=f,
                                  stderr=subprocess.STDOUT, env={**env, **head.client_env}, cwd=out,
                                  timeout=timeout_s)
    finally:
        head.stop()
    text = log.read_text(errors="replace")
    result = {"returncode": proc.returncode, "wall_s": round(time.perf_counter() - start, 1), "log": str(log),
              "metrics": slime_log_metrics(text), "memory": memory.report()}
    if proc.returncode != 0:
        result["log_tail"] = "\n".join(text.splitlines()[-30:])
    return result


def slime_speed_summary(run: dict) -> dict:
    """slime's per-rollout ``perf`` timers, medians over the steps after the first."""
    rows = [m for m in run["metrics"] if "perf/step_time" in m or "perf/train_time" in m]
    timed = rows[1:] or rows

    def med(key):
        values = [m[key] for m in timed if key in m]
        return round(h.median(values), 4) if values else None

    rollout = med("perf/rollout_time")
    return {
        "median_step_s": med("perf/step_time"),
        "steps_timed": len(timed),
        "phase_median_s": {"rollout": rollout, "log_probs": med("perf/log_probs_time") or 0.0,
                           "train": med("perf/train_time"), "update_weights": med("perf/update_weights_time"),
                           "train_parts": {k: med(f"perf/{k}") for k in ("data_preprocess_time", "ref_log_probs_time",
                                                                         "log_probs_time", "actor_train_time")}},
        "tokens_per_s": {"generated_per_rollout_s": round(GENERATED_PER_STEP / rollout, 1) if rollout else None,
                         "actor_train": med("perf/actor_train_tok_per_s")},
        "response_length": [m.get("rollout/response_length") for m in rows],
        "peak_gpu_used_gib": run["memory"].get("peak_gpu_used_gib"), "wall_s": run["wall_s"],
    }


def parity(workdir: Path, slime: dict, ours_dir: Path) -> dict:
    """Reference log-probs of every response token, and the one step's pg_loss and grad_norm."""
    import torch

    def dump(trainer):
        data = torch.load(workdir / "parity" / f"{trainer}_0_0.pt", map_location="cpu", weights_only=False)
        return torch.cat([t.float() for t in data["rollout_data"]["ref_log_probs"] if t is not None])

    theirs, mine = dump("slime"), dump("ours")
    diff = (theirs - mine).abs()
    step = next((m for m in slime["metrics"] if "train/pg_loss" in m), {})
    ours_step = next((m for m in h.read_jsonl(ours_dir / "metrics.jsonl") if "train/pg_loss" in m), {})
    return {
        "tokens_compared": int(diff.numel()),
        "ref_log_prob_abs_diff": {"max": round(diff.max().item(), 5), "mean": round(diff.mean().item(), 6)},
        "mean_ref_log_prob": {"slime": round(theirs.mean().item(), 5), "ours": round(mine.mean().item(), 5)},
        "first_step": {k: {"slime": step.get(f"train/{k}"), "ours": ours_step.get(f"train/{k}")}
                       for k in ("pg_loss", "grad_norm", "kl_loss", "ppo_kl")},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slime-dir", type=Path, default=Path(os.environ.get("SLIME_DIR", "/tmp/slime-set/slime")))
    p.add_argument("--megatron-dir", type=Path,
                   default=Path(os.environ.get("MEGATRON_DIR", "/tmp/slime-set/Megatron-LM").split(os.pathsep)[0]))
    p.add_argument("--workdir", type=Path, default=Path("/tmp/vs_slime"))
    p.add_argument("--steps", type=int, default=4, help="GRPO steps per trainer (the first is not timed)")
    p.add_argument("--parts", default="speed,parity", help="speed, parity or both")
    p.add_argument("--trainers", default="slime,ours")
    p.add_argument("--te-free", action=argparse.BooleanOptionalAction, default=None,
                   help="pass slime the TransformerEngine-free flags (default: when transformer_engine is absent)")
    p.add_argument("--timeout", type=float, default=1500, help="seconds per trainer run")
    p.add_argument("--dry-run", action="store_true", help="small model, both commands, slime's parser; no GPU")
    p.add_argument("--slime-python", default=sys.executable, help="the interpreter that imports slime (--dry-run)")
    a = p.parse_args()
    import importlib.util

    from slime_ref.assets import make_tiny

    parts, trainers = set(a.parts.split(",")), set(a.trainers.split(","))
    te_free = a.te_free if a.te_free is not None else importlib.util.find_spec("transformer_engine") is None
    a.workdir.mkdir(parents=True, exist_ok=True)
    tiny = make_tiny(a.workdir / "tiny", seed=0)
    grpo_step.build_model(a.workdir / "model", tiny.model_dir, small=a.dry_run)
    grpo_step.gpu_prompts(a.workdir, R["prompts"])
    slime_argv = slime_speed_argv(a.workdir, a.slime_dir, a.steps, te_free)
    result: dict = {"recipe": {**R, "steps": a.steps, "slime_te_free": te_free},
                    "commands": {"slime": ["python3", str(a.slime_dir / "train.py"), *slime_argv]}}
    if a.dry_run:
        if "--spec" in slime_argv:  # the small model's shape, for slime's checks against its config.json
            slime_argv = [*slime_argv, "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
                          "--num-attention-heads", "2", "--num-query-groups", "1", "--kv-channels", "32"]
        check = ("import sys; sys.argv = ['train.py', *sys.argv[1:]]\n"
                 "from slime.utils.arguments import parse_args\nargs = parse_args()\n"
                 "print('SLIME-PARSED', args.rollout_batch_size, args.n_samples_per_prompt, args.global_batch_size)")
        done = subprocess.run([a.slime_python, "-c", check, *slime_argv], capture_output=True, text=True,
                              env=slime_env(a.slime_dir, a.megatron_dir), timeout=600, cwd=a.slime_dir)
        parsed = [ln for ln in done.stdout.splitlines() if ln.startswith("SLIME-PARSED")]
        result["dry_run"] = {"slime_parses": bool(parsed), "slime": parsed[0] if parsed else done.stderr[-2000:],
                             "batch": str(write_fixed_batch(a.workdir))}
        print(json.dumps(result, indent=2))
        return

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("vs_slime.py needs a CUDA device (or --dry-run)")
    result["gpu"] = torch.cuda.get_device_name()
    if "speed" in parts:
        if "slime" in trainers:
            run = run_slime("slime", slime_argv, a.workdir, a.slime_dir, a.megatron_dir, a.timeout)
            result["slime"] = slime_speed_summary(run) if run["returncode"] == 0 else run
        if "ours" in trainers:
            with ours_path():
                result["ours"] = grpo_step.spawn("ours", a.workdir, a.steps, timeout_s=a.timeout,
                                                 extra=["--attention-backend", ATTENTION_BACKEND])
        slime_step = result.get("slime", {}).get("median_step_s")
        ours_step = result.get("ours", {}).get("median_step_s")
        if slime_step and ours_step:
            result["step_time_ratio_ours_over_slime"] = round(ours_step / slime_step, 3)
    if "parity" in parts:
        write_fixed_batch(a.workdir)
        runs = {}
        if "slime" in trainers:
            argv = [*model_args(a.slime_dir), *parity_flags(a.workdir, "slime"), "--load", str(a.workdir / "model"),
                    *(TE_FREE_FLAGS if te_free else [])]
            runs["slime"] = run_slime("parity-slime", argv, a.workdir, a.slime_dir, a.megatron_dir, a.timeout)
        if "ours" in trainers:
            out = a.workdir / "parity-ours"
            with ours_path():
                runs["ours"] = h.run_ours([*parity_flags(a.workdir, "ours"), "--output-dir", str(out)])
        if {"slime", "ours"} <= trainers and runs["slime"]["returncode"] == 0:
            result["parity"] = parity(a.workdir, runs["slime"], a.workdir / "parity-ours")
        else:
            result["parity"] = {k: {kk: vv for kk, vv in v.items() if kk != "metrics"} for k, v in runs.items()}
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
