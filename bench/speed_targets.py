"""The GPU speed targets from the JSON of separate bench processes: each figure the median over the
processes, its spread ((max - min) / median), and whether its target holds. Prints JSON; no GPU needed.

One process's figure moves with the host, so the targets are judged on the median of separate
processes, with the spread next to it (a part given fewer than 3 processes is reported, its targets
not judged):

    training   train_throughput.py, ours / HF + SDPA at least 1.2x (the ratio of the medians), ours at
               30% MFU or more (the median), ours' spread under 5%; at each of 8x1024 and 4x2048 (the
               other shapes are reported, not judged)
    rollout    engine_throughput.py --engine sglang at 512 x 512 with return_logprob, at least 55k
               generated tok/s (the median), and its fraction of the memory-bound limit
               (decode_roofline.py), with how many prompts a request carried; judged on
               grpo_step.py --gpu's own rollout the same way
    GRPO step  grpo_step.py --gpu, ours at most a third of TRL's step (the ratio of the medians of the
               same processes), the set-up reported apart, with how many prompts its rollout sent a
               request

    python bench/speed_targets.py --train tt1.json tt2.json tt3.json --grpo g1.json g2.json g3.json \\
        --rollout e1.json e2.json e3.json
    python bench/speed_targets.py --results bench/results/gpu-final-h200-2026-12-05.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_roofline import roofline  # noqa: E402
from shaped_model import SHAPES  # noqa: E402

TRAIN_RATIO, TRAIN_MFU, MAX_SPREAD = 1.2, 0.30, 0.05
JUDGED_SHAPES = ("8x1024", "4x2048")
ROLLOUT_TOKENS_PER_S = 55_000
ROLLOUT_SHAPE = {"concurrency": 512, "prompt_tokens": 13, "new_tokens": 512}  # grpo_step.py --gpu's rollout
GRPO_RATIO = 1 / 3
MIN_PROCESSES = 3  # fewer: the figures are reported, the targets not judged


class BadInput(ValueError):
    """A results file that does not hold what a target needs; the message names the file."""


def spread(values: list[float]) -> float:
    """(max - min) / median: how far apart separate processes landed."""
    return (max(values) - min(values)) / statistics.median(values)


def figure(values: list[float], digits: int = 4) -> dict:
    return {"each": values, "median": round(statistics.median(values), digits), "spread": round(spread(values), 4)}


def roofline_limit() -> float:
    """Generated tok/s at the H200's 4.8 TB/s for the GRPO rollout's shape, with log-probs."""
    cfg = SHAPES["qwen3-0.6B"][2]
    shape = ROLLOUT_SHAPE
    return roofline(cfg, shape["concurrency"], shape["prompt_tokens"], shape["new_tokens"], 4.8)["limit_tokens_per_s"]


def _field(process: dict, source: str, *keys: str):
    value = process
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise BadInput(f"{source}: no {'.'.join(keys)} (is it the right bench's output, run to the end?)")
        value = value[key]
    return value


def each(processes: list[tuple[str, dict]], *keys: str) -> list:
    """The field at ``keys`` of every process."""
    return [_field(p, src, *keys) for src, p in processes]


def verdict(targets: dict[str, bool], processes: int) -> dict:
    """The targets' verdicts, or why there are none: fewer than MIN_PROCESSES processes."""
    if processes >= MIN_PROCESSES:
        return targets
    return {"not_judged": f"{processes} process{'es' if processes != 1 else ''}; the targets need at least "
                          f"{MIN_PROCESSES}"}


def training(processes: list[tuple[str, dict]]) -> dict:
    """``train_throughput.py`` outputs, one per process: per shape, ours and HF's tok/s and MFU."""
    shapes = [shape for shape in _field(processes[0][1], processes[0][0], "results")]
    out = {}
    for shape in shapes:
        ours = each(processes, "results", shape, "ours", "tokens_per_s")
        hf = each(processes, "results", shape, "hf_sdpa", "tokens_per_s")
        mfu = each(processes, "results", shape, "ours", "mfu")
        ratio = statistics.median(ours) / statistics.median(hf)
        row = {"ours_tokens_per_s": figure(ours, 1), "hf_sdpa_tokens_per_s": figure(hf, 1),
               "ours_over_hf": round(ratio, 3), "ours_mfu": figure(mfu)}
        if shape in JUDGED_SHAPES:
            row["targets"] = verdict({"ratio_at_least_1.2": ratio >= TRAIN_RATIO,
                                      "mfu_at_least_30pct": statistics.median(mfu) >= TRAIN_MFU,
                                      "spread_under_5pct": spread(ours) < MAX_SPREAD}, len(processes))
        out[shape] = row
    return out


def rollout(processes: list[tuple[str, dict]]) -> dict:
    """``engine_throughput.py --engine sglang`` outputs at the GRPO rollout's shape, one per process."""
    for src, p in processes:
        shape = {key: _field(p, src, key) for key in ROLLOUT_SHAPE}
        if shape != ROLLOUT_SHAPE:
            raise BadInput(f"{src}: the rollout target is for {ROLLOUT_SHAPE}, this process ran {shape}")
    rates = each(processes, "tokens_per_s", "return_logprob")
    backends = set(each(processes, "attention_backend"))
    # how the prompts went to the server: alone, or in SGLang's batched form (engine_throughput.py's
    # --prompts-per-request; files from before the flag sent them alone)
    batching = {p.get("prompts_per_request", 1) for _, p in processes}
    limit = roofline_limit()
    median = statistics.median(rates)
    return {"attention_backend": sorted(backends), "prompts_per_request": sorted(batching),
            "tokens_per_s": figure(rates, 1),
            "fraction_of_memory_bound_limit": round(median / limit, 3), "limit_tokens_per_s": round(limit, 1),
            "targets": verdict({"at_least_55k": median >= ROLLOUT_TOKENS_PER_S}, len(processes))}


def grpo(processes: list[tuple[str, dict]]) -> dict:
    """``grpo_step.py --gpu`` outputs, both trainers in each process."""
    ours = each(processes, "ours", "median_step_s")
    trl = each(processes, "trl", "median_step_s")
    rollout_rates = each(processes, "ours", "tokens_per_s", "generated_per_rollout_s")
    ratio = statistics.median(ours) / statistics.median(trl)
    rollout_median = statistics.median(rollout_rates)
    # files from before the recipe said so sent each sample alone (a custom generate function)
    batching = {p.get("recipe", {}).get("rollout_prompts_per_request", 1) for _, p in processes}
    return {"ours_step_s": figure(ours, 3), "trl_step_s": figure(trl, 3), "ours_over_trl": round(ratio, 3),
            "ours_rollout_prompts_per_request": sorted(batching),
            "ours_rollout_tokens_per_s": figure(rollout_rates, 1),
            "ours_rollout_s": figure(each(processes, "ours", "phase_median_s", "rollout"), 3),
            "ours_train_s": figure(each(processes, "ours", "phase_median_s", "train"), 3),
            "ours_setup_s": figure(each(processes, "ours", "setup_s"), 1),
            "ours_rollout_fraction_of_memory_bound_limit": round(rollout_median / roofline_limit(), 3),
            "targets": verdict({"at_most_a_third_of_trl": ratio <= GRPO_RATIO,
                                "rollout_at_least_55k": rollout_median >= ROLLOUT_TOKENS_PER_S}, len(processes))}


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: not JSON ({e}); give the file the bench printed") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected one bench's JSON object")
    return data


def from_results(path: Path) -> dict[str, list[tuple[str, dict]]]:
    """A committed results file: {"train_throughput": {"processes": [...]}, "grpo_step_gpu": {...},
    "engine_throughput": {...}}, any of them."""
    return from_results_data(load(path), str(path))


def from_results_data(data: dict, source: str) -> dict[str, list[tuple[str, dict]]]:
    """from_results on a results file already read; ``source`` names it in messages."""
    keys = {"train": "train_throughput", "grpo": "grpo_step_gpu", "rollout": "engine_throughput"}
    parts = {part: [(f"{source} {key}[{i}]", p) for i, p in enumerate(data[key]["processes"])]
             for part, key in keys.items() if isinstance(data.get(key), dict) and data[key].get("processes")}
    if not parts:
        raise BadInput(f"{source}: none of {', '.join(keys.values())} with processes")
    return parts


def summarize(parts: dict[str, list[tuple[str, dict]]]) -> dict:
    out = {"bench": "speed_targets", "processes": {part: [src for src, _ in ps] for part, ps in parts.items()}}
    if "train" in parts:
        out["training"] = training(parts["train"])
    if "rollout" in parts:
        out["rollout"] = rollout(parts["rollout"])
    if "grpo" in parts:
        out["grpo_step"] = grpo(parts["grpo"])
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", nargs="+", type=Path, default=[], metavar="JSON",
                   help="train_throughput.py --out files, one per process")
    p.add_argument("--rollout", nargs="+", type=Path, default=[], metavar="JSON",
                   help="engine_throughput.py --engine sglang outputs at 512 x 512, one per process")
    p.add_argument("--grpo", nargs="+", type=Path, default=[], metavar="JSON",
                   help="grpo_step.py --gpu outputs (ours and TRL), one per process")
    p.add_argument("--results", type=Path, default=None, metavar="JSON",
                   help="a results file of bench/results/ holding every process of a run")
    a = p.parse_args(argv)
    if a.results and (a.train or a.rollout or a.grpo):
        p.error("--results: give either one results file or the --train/--rollout/--grpo files, not both")
    try:
        if a.results:
            parts = from_results(a.results)
        else:
            parts = {part: [(str(f), load(f)) for f in files]
                     for part, files in (("train", a.train), ("rollout", a.rollout), ("grpo", a.grpo)) if files}
            if not parts:
                p.error("give --train, --rollout and/or --grpo files (or --results FILE)")
        result = summarize(parts)
    except BadInput as e:
        p.error(str(e))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
