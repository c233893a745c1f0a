"""slime-ref's GRPO loop next to TRL's GRPOTrainer on one small recipe, on CPU; prints JSON.

The recipe (both trainers, same warmed-up weights, same reward code):

- model: the embedded tiny Qwen3 (``slime_ref.assets.make_tiny``: hidden 128, 2 layers), float32;
- task: single-digit addition, all 100 ``a+b=`` prompts (the tiny task's train and eval splits
  together), chat template applied; reward: slime-ref's ``math`` rule (1 for the right answer
  written as ``\\boxed{n}``, else 0) -- TRL gets it through :func:`grpo_harness.boxed_math_reward`;
- warm-up, once: supervised steps on the task's warm-up rows (``data/sft.jsonl``: every problem,
  one row in three boxed) with HF transformers, stopped at the first check whose sampled reward
  (100 prompts x 8 samples, temperature 1) reaches ``--warmup-target`` (0.25); saved as an HF
  checkpoint that both trainers start from;
- GRPO: 8 prompts x 8 samples a step, 8 new tokens, temperature 1.0, lr 5e-4 constant, no KL, no
  weight decay, gradient clip 1.0, PPO clip 0.2, token-level loss (TRL ``loss_type="dapo"``;
  slime ``--calculate-per-token-loss``), group-normalised rewards, one optimizer step per rollout,
  shuffled prompts; ``--steps`` (60) steps for each seed of ``--seeds`` (0 1 2); ``--threads`` (2)
  torch threads for each trainer (ours: the trainer and the engine, which take turns: --colocate).

Ours is ``slime-ref train`` with the full stack (Ray, the built-in engine behind the real
sglang-router, the Megatron actor, weight sync by tensor handles); TRL runs in one process. Each
(trainer, seed) runs in its own subprocess. A step's time is the wall time from one logged step to
the next (ours: rollout, training, weight sync and every hop between them; TRL: its
``on_step_begin``/``on_step_end``); the median skips the first step (warm-up of caches).

    python bench/vs_trl.py                          # about 10 minutes on 2 cores
    python bench/vs_trl.py --seeds 0 --steps 20 --trainers ours
    python bench/vs_trl.py --workdir /tmp/vs_trl    # keep (and reuse) the warm-up and the run folders

Needs TRL: ``pip install -c constraints-cpu.txt '.[bench]'``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpo_harness as h  # noqa: E402
import shaped_model  # noqa: E402

RECIPE = dict(prompts_per_step=8, samples_per_prompt=8, max_new_tokens=8, temperature=1.0, lr=5e-4)
TRL_REFERENCE = "TRL 1.16.0 took 0.04-0.05 s a step on this recipe, reward 0.25 -> 0.34 on seed 0 (issue 6)"


# ------------------------------------------------------------------------------------------------
# data and warm-up


def prepare(workdir: Path, target: float, threads: int) -> dict:
    """Tiny assets, the 100-prompt file and the warmed-up checkpoint (reused if already there)."""
    from slime_ref.assets import TinyTaskConfig, arithmetic_problems, make_tiny

    tiny = workdir / "tiny"
    if not (tiny / "model" / "config.json").exists():
        make_tiny(tiny, seed=0)
    rows = [{"prompt": [{"role": "user", "content": q}], "label": a} for q, a in arithmetic_problems(TinyTaskConfig())]
    prompts = h.write_prompts(rows, workdir / "data" / "all.jsonl")
    warm = workdir / "warm"
    record = warm / "warmup.json"
    if record.exists() and json.loads(record.read_text()).get("target") == target:
        info = json.loads(record.read_text())
    else:
        info = warm_up(tiny, rows, warm, target=target, threads=threads)
    return {"tiny": tiny, "prompts": prompts, "rows": rows, "warm": warm, "warmup": info}


def sampled_reward(
    model, tokenizer, rows: list[dict], samples: int = 8, max_new_tokens: int = 8, seed: int = 0
) -> float:
    """Mean math reward of ``samples`` responses per prompt at temperature 1 (HF generate, full vocab)."""
    import torch

    from slime_ref.rollout.rewards import math_reward

    prompts = [tokenizer.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False)
               for r in rows]
    ids = torch.tensor([list(p) for p in prompts]).repeat_interleave(samples, 0)  # a+b= prompts: one length
    torch.manual_seed(seed)
    model.eval()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    model.train()
    texts = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
    labels = [r["label"] for r in rows for _ in range(samples)]
    return sum(math_reward(t, lab) for t, lab in zip(texts, labels)) / len(texts)


def warm_up(tiny: Path, rows: list[dict], out: Path, *, target: float, threads: int, lr: float = 2e-3,
            batch: int = 32, check_every: int = 10, max_steps: int = 1000, seed: int = 0) -> dict:
    """Supervised steps on data/sft.jsonl until the sampled reward reaches ``target``; save HF weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_ref.rollout.sft_rollout import assistant_loss_mask
    from slime_ref.utils.fileio import atomic_directory, atomic_write_json

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(tiny / "model")
    model = AutoModelForCausalLM.from_pretrained(tiny / "model", dtype=torch.float32)
    data = [assistant_loss_mask(tokenizer, r["messages"]) for r in h.read_jsonl(tiny / "data" / "sft.jsonl")]
    width = max(len(t) for t, _ in data)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([t + [pad] * (width - len(t)) for t, _ in data])
    labels = torch.tensor([[x if m else -100 for x, m in zip(t, mask)] + [-100] * (width - len(t)) for t, mask in data])
    attention = torch.tensor([[1] * len(t) + [0] * (width - len(t)) for t, _ in data])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    order = torch.Generator().manual_seed(seed)
    checks, reward, step = [], 0.0, 0
    start = time.perf_counter()
    while step < max_steps:
        pick = torch.randperm(len(data), generator=order)[:batch]
        loss = model(input_ids=ids[pick], attention_mask=attention[pick], labels=labels[pick]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if step % check_every == 0:
            reward = sampled_reward(model, tokenizer, rows, seed=step)
            checks.append([step, round(float(loss), 4), round(reward, 4)])
            if reward >= target:
                break
    info = {"target": target, "steps": step, "reward": round(reward, 4), "lr": lr, "batch": batch,
            "checks": checks, "seconds": round(time.perf_counter() - start, 1)}
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        shaped_model.copy_tokenizer(tiny / "model", Path(tmp))
        atomic_write_json(Path(tmp) / "warmup.json", info)
    return info


# ------------------------------------------------------------------------------------------------
# the two trainers (each in its own subprocess)


def ours_flags(warm: Path, prompts: Path, out: Path, seed: int, steps: int, threads: int,
               rollout_threads: int) -> list[str]:
    r = RECIPE
    return [
        "--hf-checkpoint", str(warm), "--prompt-data", str(prompts), "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rollout-seed", str(seed), "--seed", str(seed),
        "--rm-type", "math", "--num-rollout", str(steps),
        "--rollout-batch-size", str(r["prompts_per_step"]), "--n-samples-per-prompt", str(r["samples_per_prompt"]),
        "--global-batch-size", str(r["prompts_per_step"] * r["samples_per_prompt"]),
        "--rollout-max-response-len", str(r["max_new_tokens"]), "--rollout-temperature", str(r["temperature"]),
        "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--calculate-per-token-loss",
        "--optimizer", "adam", "--lr", str(r["lr"]), "--lr-decay-style", "constant", "--weight-decay", "0.0",
        "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.999",
        "--actor-num-gpus-per-node", "1", "--colocate", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096",
        "--train-num-threads", str(threads), "--rollout-num-threads", str(rollout_threads), "--output-dir", str(out),
    ]


def ours_phases(run: dict) -> dict:
    """Median seconds of each part of our step (the first step skipped): the phases the loop
    times (perf/*), slime's timers inside the train phase, and what is left between them."""
    steps = {s["rollout_id"]: s for s in run["steps"]}
    metrics = [m for m in run["metrics"] if m["rollout_id"] in steps]

    def med(values):
        return h.median([v for v in values if v is not None])

    def part(m, name):
        return m.get(name, 0.0)

    rows = []
    for m in metrics:
        step = steps[m["rollout_id"]]
        train_inner = part(m, "perf/data_preprocess_time") + part(m, "perf/log_probs_time") + \
            part(m, "perf/actor_train_time")
        rows.append({
            "step": step["step_s"],
            "rollout (driver: Ray call + generation over HTTP + rewards)": m["perf/rollout_time"],
            "offload engines + onload trainer (Ray + HTTP)": step["to_train_s"] - m["perf/rollout_time"],
            "train phase": m["perf/train_time"],
            "  data_preprocess": part(m, "perf/data_preprocess_time"),
            "  log_probs (old policy pass)": part(m, "perf/log_probs_time"),
            "  actor_train (forward, backward, optimizer)": part(m, "perf/actor_train_time"),
            "  Ray call + batch transfer": m["perf/train_time"] - train_inner,
            "offload trainer + onload engines (Ray + HTTP)": step["to_sync_s"] - m["perf/train_time"],
            "update_weights": m["perf/update_weights_time"],
            "logging and loop": step["sync_s"] - m["perf/update_weights_time"],
        })
    return {k: round(med([r[k] for r in rows]), 4) for k in rows[0]} if rows else {}


def worker(kind: str, workdir: Path, seed: int, steps: int, threads: int, rollout_threads: int,
           result_path: Path) -> None:
    import torch

    torch.set_num_threads(threads)
    out = workdir / f"{kind}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)  # metrics.jsonl appends: a fresh directory per run
    if kind == "probe":
        result = h.probe_overheads(workdir / "warm", workdir / "data" / "all.jsonl", out, rollout_threads)
    elif kind == "ours":
        run = h.run_ours(ours_flags(workdir / "warm", workdir / "data" / "all.jsonl", out, seed, steps, threads,
                                    rollout_threads))
        result = {
            "step_s": [s["step_s"] for s in run["steps"]],
            "reward_curve": run["reward_curve"],
            "setup_s": run["setup_s"],
            "cpu_s_per_step": run["cpu_s_per_step"],
            "phase_median_s": ours_phases(run),
        }
    else:
        r = RECIPE
        run = h.run_trl(workdir / "warm", h.read_jsonl(workdir / "data" / "all.jsonl"), out_dir=out, seed=seed,
                        steps=steps, prompts_per_step=r["prompts_per_step"], samples_per_prompt=r["samples_per_prompt"],
                        max_new_tokens=r["max_new_tokens"], lr=r["lr"], temperature=r["temperature"])
        result = {
            "step_s": run["step_s"][1:], "reward_curve": run["reward_curve"],
            "phase_median_s": {"step": h.median(run["step_s"][1:]), "generate": h.median(run["generate_s"][1:]),
                               "train": h.median([s - g for s, g in zip(run["step_s"][1:], run["generate_s"][1:])])},
        }
    result_path.write_text(json.dumps(result))


def spawn_worker(kind: str, workdir: Path, seed: int, steps: int, threads: int, rollout_threads: int) -> dict:
    result_path = workdir / f"{kind}-seed{seed}.result.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    command = [sys.executable, __file__, "--worker", kind, "--seed", str(seed), "--steps", str(steps),
               "--threads", str(threads), "--rollout-threads", str(rollout_threads), "--workdir", str(workdir)]
    log = workdir / f"{kind}-seed{seed}.log"
    with open(log, "wb") as f:
        proc = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"{kind} seed {seed} failed (exit {proc.returncode}); log {log}:\n{tail}")
    return json.loads(result_path.read_text())


def summarize(per_seed: dict[int, dict]) -> dict:
    seeds = {}
    for seed, r in per_seed.items():
        seeds[str(seed)] = {"median_step_s": round(h.median(r["step_s"]), 4),
                            "reward": h.curve_summary(r["reward_curve"]),
                            "reward_curve": [round(x, 4) for x in r["reward_curve"]],
                            "phase_median_s": {k: (round(v, 4) if v is not None else None)
                                               for k, v in r["phase_median_s"].items()},
                            **({"setup_s": round(r["setup_s"], 1)} if r.get("setup_s") else {}),
                            **({"cpu_s_per_step": r["cpu_s_per_step"]} if r.get("cpu_s_per_step") else {})}
    gains = [s["reward"]["gain"] for s in seeds.values()]
    return {"median_step_s": round(h.median([s["median_step_s"] for s in seeds.values()]), 4),
            "mean_reward_gain": round(sum(gains) / len(gains), 4), "seeds": seeds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=2, help="torch threads of TRL and of our trainer")
    p.add_argument("--rollout-threads", type=int, default=1,
                   help="threads of our engine (default 1: it leaves a core to the rollout client and router)")
    p.add_argument("--trainers", default="ours,trl", help="comma-separated: ours, trl")
    p.add_argument("--warmup-target", type=float, default=0.25)
    p.add_argument("--no-probe", action="store_true", help="skip the measurements of HTTP, router and Ray costs")
    p.add_argument("--workdir", type=Path, default=None, help="keep runs and the warm-up here (default: a temp dir)")
    p.add_argument("--worker", choices=["ours", "trl", "probe"], help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.worker:
        worker(a.worker, a.workdir, a.seed, a.steps, a.threads, a.rollout_threads,
               a.workdir / f"{a.worker}-seed{a.seed}.result.json")
        return
    trainers = [t.strip() for t in a.trainers.split(",") if t.strip()]
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="vs_trl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    prep = prepare(workdir, a.warmup_target, a.threads)
    probe = (
        spawn_worker("probe", workdir, 0, a.steps, a.threads, a.rollout_threads)
        if "ours" in trainers and not a.no_probe
        else None
    )
    results: dict[str, dict[int, dict]] = {t: {} for t in trainers}
    for seed in a.seeds:  # interleaved, so a busy spell on a shared machine hits both
        for t in trainers:
            results[t][seed] = spawn_worker(t, workdir, seed, a.steps, a.threads, a.rollout_threads)
            print(f"{t} seed {seed}: median step {h.median(results[t][seed]['step_s']):.4f} s", file=sys.stderr)

    import torch

    out = {
        "bench": "vs_trl",
        "recipe": {**RECIPE, "steps": a.steps, "seeds": a.seeds, "threads": a.threads,
                   "our_engine_threads": a.rollout_threads, "prompts": len(prep["rows"]),
                   "reward": "slime_ref math rule: boxed answer equal to the label",
                   "loss": "token-level (TRL dapo / slime --calculate-per-token-loss), no KL, clip 0.2"},
        "warmup": prep["warmup"],
        "conditions": {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                       "load_avg_before": [round(x, 2) for x in load_before],
                       "load_avg_after": [round(x, 2) for x in os.getloadavg()], "torch": torch.__version__,
                       "wall_s": round(time.perf_counter() - started, 1), "workdir": str(workdir)},
        "reference": TRL_REFERENCE,
    }
    for t in trainers:
        out[t] = summarize(results[t])
    if probe:
        out["ours_overheads_probe_s"] = probe
    if "ours" in out and "trl" in out:
        ratio = out["ours"]["median_step_s"] / out["trl"]["median_step_s"]
        out["step_time_ratio_ours_over_trl"] = round(ratio, 3)
        out["targets"] = {"step_time_at_most_2x_trl": ratio <= 2.0,
                          "reward_gain_at_least_trl": out["ours"]["mean_reward_gain"] >= out["trl"]["mean_reward_gain"]}
    try:
        import trl

        out["conditions"]["trl"] = trl.__version__
    except ImportError:
        pass
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
