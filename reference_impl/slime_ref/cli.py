"""``slime-ref``: the reference trainer's command line."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from slime_ref import __version__
from slime_ref.backends.megatron.convert import convert
from slime_ref.errors import run_cli

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="slime-ref")
def cli() -> None:
    """slime-ref: slime's RL architecture at a size you can read, run and test.

    Megatron-core trains; engines speaking SGLang's HTTP protocol generate rollouts behind the real
    sglang-router; Ray places everything. Flag names follow slime v0.3.1.

    \b
    Start here:
      slime-ref make-tiny --out ./slime-tiny    build the embedded tiny model and task
      slime-check quickstart                   checks, warm-up and a small GRPO run, guided
      slime-ref train --help                   every flag, by slime's names
    """


@cli.command("make-tiny")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("slime-tiny"),
    show_default=True,
    help="Directory to write the model, tokenizer and data into.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, byte-identical files.")
@click.option("--force", is_flag=True, help="Rebuild even if OUT already holds intact assets for this seed.")
def make_tiny_cmd(out: Path, seed: int, force: bool) -> None:
    """Build the embedded default offline: a tiny Qwen3 HF checkpoint, its tokenizer, and a task.

    \b
    The task is single-digit addition in slime's data format:
      {"prompt": [{"role": "user", "content": "3+5="}], "label": "8"}
    with train and eval splits, and a supervised warm-up set (data/sft.jsonl).
    Rewarded with --rm-type math: only answers written as \\boxed{8} count.
    """
    from rich.console import Console
    from rich.table import Table

    from slime_ref.assets import make_tiny

    console = Console()
    with console.status(f"Building tiny Qwen3 and task into {out} ..."):
        assets = make_tiny(out, seed=seed, force=force)
    m = assets.manifest
    table = Table(title=f"Embedded default (seed {seed})", show_header=False)
    table.add_row("HF checkpoint", str(assets.model_dir.resolve()))
    table.add_row("train prompts", f"{assets.train_path.resolve()}  ({m['num_train']} rows)")
    table.add_row("eval prompts", f"{assets.eval_path.resolve()}  ({m['num_eval']} rows)")
    table.add_row("warm-up data", f"{assets.sft_path.resolve()}  ({m['num_sft']} rows)")
    table.add_row("model", f"Qwen3, {m['num_parameters']:,} parameters, vocab {m['vocab_size']}")
    table.add_row("reward", f"--rm-type {m['rm_type']}")
    console.print(table)
    console.print(
        "Use it with slime's flags: "
        f"--hf-checkpoint {assets.model_dir} --prompt-data {assets.train_path} "
        "--input-key prompt --label-key label --apply-chat-template "
        f"--rm-type {m['rm_type']}"
    )


@cli.command("plot")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PNG to write (default: RUN_DIR/curves.png).")
def plot_cmd(run_dir: Path, out: Path | None) -> None:
    """Draw a run's reward, KL, response-length and phase-time curves to a PNG.

    RUN_DIR is the --output-dir of a slime-ref run (it holds metrics.jsonl).
    """
    from slime_ref.plot import plot_run

    click.echo(f"wrote {plot_run(run_dir, out)}")


@cli.command("generate")
@click.argument("model_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("prompts", nargs=-1, required=True)
@click.option("--max-new-tokens", type=click.IntRange(1), default=16, show_default=True)
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True,
              help="0 answers greedily (the same answer every time).")
@click.option("--no-chat-template", is_flag=True, help="Send each prompt as raw text, not as a user turn.")
def generate_cmd(model_dir: Path, prompts: tuple[str, ...], max_new_tokens: int, temperature: float,
                 no_chat_template: bool) -> None:
    """Answer PROMPTS with the HF checkpoint MODEL_DIR, to try a trained model.

    \b
    Each prompt is a user turn of the model's chat template, as in training with
    --apply-chat-template. Loaded with transformers, so it also shows that the directory
    (e.g. --save-hf's, or the quick start's grpo/hf) is a plain HF checkpoint:
      slime-ref generate slime-quickstart/grpo/hf "3+5=" "7+2="
    """
    from slime_ref.errors import UserError

    if not (model_dir / "config.json").is_file():
        what = "no config.json in it" if model_dir.is_dir() else "no such directory"
        raise UserError(f"{model_dir}: {what}; pass an HF checkpoint directory (e.g. a run's --save-hf)")
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    width = max(len(p) for p in prompts)
    for prompt in prompts:
        text = prompt if no_chat_template else tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id, **sampling)
        answer = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        click.echo(f"{prompt:<{width}}  ->  {answer.strip()}")


cli.add_command(convert)


_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def _train_command(name: str, loop: str, summary: str):
    @cli.command(name, context_settings=_PASS_THROUGH, add_help_option=False, help=summary)
    @click.argument("flags", nargs=-1, type=click.UNPROCESSED)
    def command(flags: tuple[str, ...]) -> None:
        from slime_ref.arguments import build_parser, parse_args

        if not flags:
            sys.exit(_no_flags(name))
        if "-h" in flags or "--help" in flags:
            parser = build_parser()
            parser.prog = f"slime-ref {name}"
            parser.description = f"{summary} Flags are slime v0.3.1's; see each group below."
            click.echo(parser.format_help())
            return
        args = parse_args(list(flags))
        if loop == "async":
            from slime_ref.train_async import train
        else:
            from slime_ref.train import train
        from slime_ref.console import run_with_console

        run_with_console(train, args, title=f"slime-ref {name}")

    return command


# What a run cannot start without (each pair: one of the two), in the order a launch script gives them.
REQUIRED_FLAGS = (
    ("--hf-checkpoint DIR", "the model: a local HF directory (config.json, weights, tokenizer)"),
    ("--prompt-data FILE", "the prompts: .jsonl or .parquet"),
    ("--rollout-batch-size N", "prompts per rollout"),
    ("--num-rollout N | --num-epoch N", "how long to train"),
    ("--global-batch-size N | --num-steps-per-rollout N", "samples per optimizer step, or steps per rollout"),
)


def _no_flags(name: str) -> int:
    """``slime-ref train`` alone: the usage line, the required flags and where the rest are; exit 2."""
    lines = [f"usage: slime-ref {name} --hf-checkpoint DIR --prompt-data FILE --rollout-batch-size N "
             "--num-rollout N --global-batch-size N [FLAG ...]",
             f"slime-ref {name}: error: no flags given; a run needs:"]
    width = max(len(flag) for flag, _ in REQUIRED_FLAGS)
    lines += [f"  {flag:<{width}}  {what}" for flag, what in REQUIRED_FLAGS]
    lines.append(f"Every flag, by slime's names: slime-ref {name} --help")
    lines.append("A tiny model and task to try it on: slime-ref make-tiny (it prints the flags that use them)")
    click.echo("\n".join(lines), err=True)
    from slime_ref.errors import USAGE_EXIT_CODE

    return USAGE_EXIT_CODE


_train_command("train", "sync", "Train with slime's synchronous loop (train.py): generate, train, sync weights.")
_train_command("train-async", "async",
               "Train with slime's one-step-overlap loop (train_async.py): rollout N+1 is generated while "
               "training on N; weights sync every --update-weights-interval rollouts. Not with --colocate.")


def main() -> None:
    run_cli(cli, "slime-ref")


if __name__ == "__main__":
    main()
