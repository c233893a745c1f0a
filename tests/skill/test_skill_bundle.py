"""The Hermes skill bundle is right for slime v0.3.1: frontmatter, sections, links, flags, commands.

Hermes itself is exercised in test_skill_hermes.py; this file needs only the repository.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess

import pytest
import yaml

from skill_docs import REPO, TOOL_FLAGS, all_uses, bundle_files, dead_links
from slime_check.skill_install import SKILL_NAME

# Commands the skill shows that other parts of the product bring (issues 6 and 7). Until they are on
# this branch their tests skip; once they exist they are checked like every other command.
# Flags that do not exist in slime v0.3.1 and that troubleshooting.md names as such.
STALE_FLAGS = {
    "--async-buffer-size", "--max-turns", "--num-data-workers", "--streaming-data", "--tis-threshold",
    "--sglang-router-strategy", "--initial-megatron-checkpoint",
    "--true-on-policy-mode",
}
CHECK_ID = re.compile(r"`((?:gpu|container|packages|system|config|plan)\.(?!json`)[a-z_]+)`")

FLAG_USES, COMMAND_USES = all_uses()


def frontmatter_and_body() -> tuple[dict, str]:
    text = (REPO / "SKILL.md").read_text(encoding="utf-8")
    match = re.match(r"^---\n(.*?)\n---\s*\n(.*)$", text, re.S)
    assert match, "SKILL.md must start with a --- fenced YAML frontmatter"
    return yaml.safe_load(match.group(1)), match.group(2)


# ----------------------------------------------------------------------------- SKILL.md shape


def test_frontmatter_follows_hermes_conventions():
    meta, _ = frontmatter_and_body()
    assert meta["name"] == SKILL_NAME and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", meta["name"])
    # version and author live under metadata: top-level keys beyond the agentskills.io six are
    # refused by skills-ref (test_skill_portable.py runs both validators)
    assert (
        re.fullmatch(r"\d+\.\d+\.\d+", meta["metadata"]["version"]) and meta["metadata"]["author"] and meta["license"]
    )
    # agentskills.io: metadata maps strings to strings. Hermes 0.19 reads tags and related_skills only
    # from a nested metadata.hermes map and needs neither (test_skill_claims.py, frontmatter)
    assert all(isinstance(v, str) for v in meta["metadata"].values()) and "hermes" not in meta["metadata"]
    assert {"slime", "GRPO"} <= {t.strip() for t in meta["metadata"]["tags"].split(",")}
    description = meta["description"]
    assert len(description) <= 1024
    # Hermes' system-prompt index shows only the first 57 characters: they must say when to use it.
    head = description[:57]
    assert head.startswith("Use when") and "slime" in head and "RL" in head, head


def test_frontmatter_and_body_sizes():
    text = (REPO / "SKILL.md").read_text(encoding="utf-8")
    _, body = frontmatter_and_body()
    assert text.index("\n---", 3) < 4000  # Hermes reads only the first 4000 characters for listing
    # agentskills.io's guideline: a SKILL.md body of about 5,000 tokens or less, read whole on every
    # activation; at 4 characters a token that is 20,000 characters. Depth goes to skill/references/.
    assert len(body) < 20_000, f"SKILL.md body is {len(body)} characters; move depth into skill/references/"


def test_body_has_every_section_a_slime_skill_needs():
    _, body = frontmatter_and_body()
    headings = [h.lower() for h in re.findall(r"^## (.+)$", body, re.M)]
    for needed in (
        "rules", "when to use slime", "key features", "architecture", "installation", "prerequisites",
        "quick start", "workflow 1", "workflow 2", "workflow 3", "configuration essentials",
        "troubleshooting", "supported models", "slime-ref",
    ):
        assert any(needed in h for h in headings), f"no section for {needed!r} in {headings}"
    assert "pkill -9 python" in body and "Never kill processes by name" in body
    assert "Never start a long run before the checks pass" in body
    for topic in (
        "OOM",
        "update_weights",
        "SLIME_HOST_IP",
        "503",
        "latest_checkpointed_iteration.txt",
        "import errors",
    ):
        assert topic in body, topic


def test_docker_and_source_install_pins_match_slime_v031():
    _, body = frontmatter_and_body()
    assert "--ipc=host --shm-size=16g" in body and "--ulimit memlock=-1 --ulimit stack=67108864" in body
    install = (REPO / "skill/references/install.md").read_text(encoding="utf-8")
    for pin in ("0b3bb0cbe31873994c9f989fddfe2f87ca839fdd", "1dcf0dafa884ad52ffb243625717a3471643e087",
                "2.16.1", "2.8.3", "1.26.4", "2.11.0+cu129", "sglang_router-0.3.2", "git checkout v0.3.1"):
        assert pin in install, pin


def test_workflows_use_the_real_v031_entry_points_and_signatures():
    _, body = frontmatter_and_body()
    for text in ("tools/convert_hf_to_torch_dist.py", "tools/convert_torch_dist_to_hf.py", "train_async.py",
                 "--update-weights-interval", "refuses `--colocate`",
                 "async def generate(args, sample: Sample, sampling_params: dict) -> Sample",
                 "async def reward_func(args, sample: Sample, **kwargs) -> float"):
        assert text in body, text


HOOK_VALUE = re.compile(
    r"(--(?:custom-(?!config-)[a-z-]+|[a-z-]+-function|data-source|[a-z-]+-filter|rollout-data-postprocess"
    r"|rollout-all-samples-process|rollout-sample-hook)-path)[ =]+([^\s`|]+)"
)


def test_hook_paths_shown_are_dotted_import_paths():
    shown = []
    for rel in bundle_files():
        shown += [(rel, flag, value) for flag, value in HOOK_VALUE.findall((REPO / rel).read_text(encoding="utf-8"))]
    assert len(shown) >= 8
    bad = [s for s in shown if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", s[2])]
    assert bad == []


# ----------------------------------------------------------------------------- links


@pytest.mark.parametrize("rel", [f for f in bundle_files() if f.endswith(".md")])
def test_no_dead_relative_link_in_the_repository(rel):
    assert dead_links(REPO, rel) == []


# ----------------------------------------------------------------------------- flags


@functools.cache
def slime_flags() -> frozenset[str]:
    from slime_common.registry import load_registry

    return frozenset(load_registry().names())


def test_every_slime_flag_shown_exists_in_slime_v031():
    known = slime_flags()
    unknown = sorted({(u.flag, u.where) for u in FLAG_USES if u.context == "slime" and u.flag not in known})
    assert unknown == []


def test_every_flag_in_prose_is_known():
    known = slime_flags() | set().union(*TOOL_FLAGS.values()) | our_program_flags()
    unknown = sorted(
        {
            (u.flag, u.where)
            for u in FLAG_USES
            if u.context == "any" and u.flag not in known and u.flag not in STALE_FLAGS
        }
    )
    assert unknown == []


def test_stale_flags_are_named_only_as_nonexistent():
    known = slime_flags()
    assert not STALE_FLAGS & known, "a flag the skill calls stale exists in slime v0.3.1"
    places = {u.where for u in FLAG_USES if u.flag in STALE_FLAGS}
    assert places == {"skill/references/troubleshooting.md"}


def test_third_party_and_unknown_program_flags():
    wrong = [u for u in FLAG_USES if u.context.startswith("unknown program")]
    wrong += [u for u in FLAG_USES if u.context in TOOL_FLAGS and u.flag not in TOOL_FLAGS[u.context]]
    assert wrong == []


# ----------------------------------------------------------------------------- our commands


@functools.cache
def help_text(command: str) -> str | None:
    """`COMMAND --help` output, or None if the command does not exist (usage error)."""
    result = subprocess.run([*command.split(), "--help"], capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        return result.stdout
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    return None


def our_program_flags() -> set[str]:
    flags: set[str] = set()
    for command in {c.command for c in COMMAND_USES}:
        text = help_text(command)
        if text is not None:
            flags |= set(re.findall(r"--[a-z][a-z0-9-]*", text))
    return flags


@pytest.mark.parametrize("command", sorted({c.command for c in COMMAND_USES}))
def test_every_command_shown_runs(command):
    text = help_text(command)
    if text is None:
        pytest.fail(f"the skill shows `{command}`, which does not exist")
    assert "usage:" in text.lower()
    shown = {flag for use in COMMAND_USES if use.command == command for flag in use.flags}
    missing = sorted(flag for flag in shown if flag not in text)
    assert missing == [], f"`{command} --help` has no {missing}"


def test_prereqs_json_runs_here_and_covers_the_checklist_ids():
    result = subprocess.run(["slime-check", "prereqs", "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1), result.stderr
    reported = {finding["id"] for finding in json.loads(result.stdout)["findings"]}
    listed = {i for i in checklist_ids() if not i.startswith(("config.", "plan."))}
    assert listed - reported == set(), "checklist ids slime-check prereqs does not report"


# ----------------------------------------------------------------------------- checklist


def checklist_ids() -> list[str]:
    text = (REPO / "checklists/prerequisites.md").read_text(encoding="utf-8")
    return [m for line in text.splitlines() if line.startswith("| `") for m in CHECK_ID.findall(line)[:1]]


def test_checklist_items_name_a_check_id_and_a_source():
    text = (REPO / "checklists/prerequisites.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    ids = checklist_ids()
    assert len(ids) == len(rows) == len(set(ids)), "one unique check id per checklist row"
    for row in rows:
        source = row.rstrip(" |").rsplit("|", 1)[-1].strip()
        assert source, f"no source in: {row}"
    for needed in ("gpu.compute_capability", "container.shm", "container.ipc", "container.memlock",
                   "container.stack", "packages.megatron", "packages.sglang_router", "system.host_ip",
                   "system.leftover_processes", "config.unknown_flag", "config.batch_identity", "config.hooks"):
        assert needed in ids, needed


def test_check_ids_named_in_the_skill_are_in_the_checklist():
    listed = set(checklist_ids())
    named = set()
    for rel in bundle_files():
        if rel.endswith(".md") and not rel.startswith("checklists/"):
            named |= set(CHECK_ID.findall((REPO / rel).read_text(encoding="utf-8")))
    assert named - listed == set()


# ----------------------------------------------------------------------------- templates and examples

LAUNCH_SCRIPTS = sorted(f for f in bundle_files() if f.endswith(".sh") and "/run-" in f)


@pytest.mark.parametrize("script", LAUNCH_SCRIPTS)
def test_launch_scripts_are_valid_bash_without_kill_by_name(script):
    result = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    text = (REPO / script).read_text(encoding="utf-8")
    assert not re.search(r"^\s*(pkill|killall)\b|ray stop", text, re.M)


@pytest.mark.parametrize("script", LAUNCH_SCRIPTS)
def test_launch_scripts_pass_slime_check_config(script, tiny, tmp_path):
    # the examples default to ./slime-tiny: the linter then compares MODEL_ARGS and data keys for real
    (tmp_path / "slime-tiny").symlink_to(tiny.model_dir.parent, target_is_directory=True)
    env = {key: value for key, value in os.environ.items() if key not in ("TINY", "OUT")}
    result = subprocess.run(
        ["slime-check", "config", str(REPO / script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_templates_hold_the_batch_identity():
    for name, gpus in (("run-qwen3-4B-grpo-8gpu.sh", 8), ("run-qwen2.5-0.5B-grpo-small.sh", 4)):
        text = (REPO / "skill/templates" / name).read_text(encoding="utf-8")
        value = {flag: int(v) for flag, v in re.findall(r"(--[a-z-]+) (\d+)\s*$", text, re.M)}
        assert value["--rollout-batch-size"] * value["--n-samples-per-prompt"] == value["--global-batch-size"]
        assert "--colocate" in text and f"NUM_GPUS=${{NUM_GPUS:-{gpus}}}" in text
        assert "slime-check prereqs" in text and "slime-check config" in text


# ----------------------------------------------------------------------------- facts checked against slime v0.3.1

# slime/backends/sglang_utils/arguments.py at v0.3.1, `skipped_args`: SGLang server arguments slime sets
# itself and does not register as --sglang-* flags.
SGLANG_SKIPPED = {
    "model_path", "config", "trust_remote_code", "random_seed", "enable_memory_saver", "tp_size", "port", "nnodes",
    "node_rank", "dist_init_addr", "gpu_id_step", "base_gpu_id", "nccl_port", "skip_server_warmup",
    "enable_return_routed_experts",
}


def test_sglang_arguments_slime_skips_are_listed_and_absent_from_the_registry():
    from slime_common.registry import load_registry

    assert len(SGLANG_SKIPPED) == 15
    sglang_dests = {flag.dest for flag in load_registry().flags if flag.source.startswith("sglang")}
    assert "sglang_mem_fraction_static" in sglang_dests
    assert {f"sglang_{name}" for name in SGLANG_SKIPPED} & sglang_dests == set()
    text = (REPO / "skill/references/grpo-flags.md").read_text(encoding="utf-8")
    section = text.split("**Not every SGLang flag exists with the prefix.**", 1)[1].split("\n\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = {name for row in rows for name in re.findall(r"`([a-z_]+)`", row)}
    assert listed == SGLANG_SKIPPED
    _, body = frontmatter_and_body()
    assert "every SGLang server flag" not in body and "except 15 slime sets itself" in body


def test_load_ref_load_and_hf_validation_say_what_slime_does():
    flags = " ".join((REPO / "skill/references/grpo-flags.md").read_text(encoding="utf-8").split())
    assert "An HF dir of a model type slime loads directly is kept as the actor's starting weights" in flags
    assert ("It does **not** compare KV groups (`--num-query-groups`), head size (`--kv-channels`), QK-norm "
            "(`--qk-layernorm`) or the vocabulary size") in flags
    checklist = (REPO / "checklists/prerequisites.md").read_text(encoding="utf-8")
    row = next(line for line in checklist.splitlines() if line.startswith("| `config.hf_config`"))
    assert "KV groups, head size and vocab, which slime does not compare" in row
    _, body = frontmatter_and_body()
    assert "from `--load` itself if it is an HF directory slime can read" in " ".join(body.split())


def test_node_counts_and_no_invented_reading_order():
    install = " ".join((REPO / "skill/references/install.md").read_text(encoding="utf-8").split())
    assert "need 4 to 8 GPUs" not in install
    assert "DeepSeek-R1 and MiniMax-M2 16, Kimi-K2 and GLM-5/5.2 32" in install
    architecture = (REPO / "skill/references/architecture.md").read_text(encoding="utf-8")
    assert "the slime README gives:" not in architecture and "slime's\nREADME gives none" in architecture


# ----------------------------------------------------------------------------- before a long run


def slime_save_iterations(num_rollout: int, save_interval: int) -> list[int]:
    """Rollout ids slime v0.3.1 saves at (train.py + misc.should_run_periodic_action)."""
    return [r for r in range(num_rollout) if (r + 1) % save_interval == 0 or r == num_rollout - 1]


def megatron_retained(iterations: list[int], retain_interval: int) -> list[int]:
    """Checkpoints left on disk under Megatron-LM 1dcf0da's --save-retain-interval: after each save
    the previous one is deleted unless it is a multiple of the retain interval (checkpointing.py)."""
    kept: list[int] = []
    for iteration in iterations:
        if kept and kept[-1] > 0 and kept[-1] != iteration and kept[-1] % retain_interval != 0:
            kept.pop()
        kept.append(iteration)
    return kept


def template_default(text: str, var: str) -> int:
    return int(re.search(rf"^{var}=\$\{{{var}:-(\d+)\}}$", text, re.MULTILINE).group(1))


def test_long_run_numbers_match_the_template_and_slimes_save_schedule():
    text = (REPO / "skill/templates/run-qwen3-4B-grpo-8gpu.sh").read_text(encoding="utf-8")
    num_rollout = template_default(text, "NUM_ROLLOUT")
    interval = int(re.search(r"--save-interval (\d+)", text).group(1))
    saves = slime_save_iterations(num_rollout, interval)
    assert (num_rollout, interval, len(saves)) == (3000, 20, 150)
    for retain in (interval, 2 * interval, 100):  # any multiple of --save-interval keeps only the newest
        assert megatron_retained(saves, retain) == [num_rollout - 1]
    guide = " ".join((REPO / "skill/references/long-runs.md").read_text(encoding="utf-8").split())
    _, body = frontmatter_and_body()
    body = " ".join(body.split())
    for needed in ("| checkpoints | every 20 rollouts and at the last one: 150 |", "**only the newest checkpoint "
                                                                                   "stays**",
                   "`--save-retain-interval N`", "`--no-save-optim`", "NUM_GPUS=1 NUM_ROLLOUT=3", "NUM_ROLLOUT=3 "
                                                                                                  "SAVE_DIR"):
        assert needed in guide, needed
    for needed in ("150 checkpoints of about 55 GB", "`--save-retain-interval 20` keeps only the newest",
                   "`NUM_GPUS=1 NUM_ROLLOUT=3 EXTRA_ARGS=--check-weight-update-equal`",
                   "[long-runs.md](skill/references/long-runs.md)"):
        assert needed in body, needed


def test_smoke_run_overrides_exist_in_the_templates():
    for name, rollouts in (("run-qwen3-4B-grpo-8gpu.sh", 3000), ("run-qwen2.5-0.5B-grpo-small.sh", 100),
                           ("run-qwen3-32B-grpo-multinode.sh", 3000)):
        text = (REPO / "skill/templates" / name).read_text(encoding="utf-8")
        assert template_default(text, "NUM_ROLLOUT") == rollouts and "--num-rollout ${NUM_ROLLOUT}" in text
    small = (REPO / "skill/templates/run-qwen2.5-0.5B-grpo-small.sh").read_text(encoding="utf-8")
    assert re.search(r"^\s*1\|2\|3\|4\) ;;$", small, re.MULTILINE)  # NUM_GPUS=1 is accepted


def test_multinode_template_shape():
    text = (REPO / "skill/templates/run-qwen3-32B-grpo-multinode.sh").read_text(encoding="utf-8")
    value = {flag: int(v) for flag, v in re.findall(r"(--[a-z-]+) (\d+)\s*$", text, re.MULTILINE)}
    assert value["--rollout-batch-size"] * value["--n-samples-per-prompt"] == value["--global-batch-size"]
    assert "--actor-num-nodes ${NUM_NODES}" in text and "--colocate" in text and "NUM_NODES=${NUM_NODES:-2}" in text
    assert value["--save-retain-interval"] % value["--save-interval"] == 0  # Megatron asserts this
    assert "slime-check prereqs" in text and "slime-check config" in text and "SLIME_HOST_IP" in text


def test_troubleshooting_covers_engine_death_cuda_graph_oom_and_the_weight_check():
    text = (REPO / "skill/references/troubleshooting.md").read_text(encoding="utf-8")
    sections = {h: body for h, body in re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)}
    graph = next(b for h, b in sections.items() if "CUDA graphs" in h)
    assert "Capture cuda graph failed" in graph and "--sglang-cuda-graph-max-bs" in graph
    dies = next(b for h, b in sections.items() if "engine dies" in h)
    assert "--use-fault-tolerance" in dies and "--rollout-health-check-interval" in dies
    check = next(b for h, b in sections.items() if "--check-weight-update-equal" in h)
    for topic in ("**Vocabulary padding**", "**Not tied embeddings**", "**Name conversion**", "After\n  a resume"):
        assert topic in check, topic
