"""Each claim an audit of the skill found wrong or incomplete, pinned to the slime line that decides it.

Every test reads two things: the upstream source line that makes the claim true (verbatim excerpts
of slime v0.3.1 and SGLang 0.5.15.post1 in tests/fixtures/slime_claims/, with commit and line range
per block; slime's run scripts in tests/fixtures/slime_sources/scripts/), and the skill page that
states the claim. It fails when either drifts: the source stops saying it, or the page says
something else (or again says what was wrong).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

from skill_docs import REPO, bundle_files

CLAIMS = REPO / "tests" / "fixtures" / "slime_claims"
SCRIPTS = REPO / "tests" / "fixtures" / "slime_sources" / "scripts"
DOCKERFILE = REPO / "tests" / "fixtures" / "slime_sources" / "v0.3.1" / "docker" / "Dockerfile"
TEMPLATES = REPO / "skill" / "templates"
V031 = "a6272da0d4f3d0a08520c99a2f3b4f6c887960dc"
HEADER = re.compile(r"^# >>> (slime v0\.3\.1 ([0-9a-f]{40})|sglang 0\.5\.15\.post1 wheel) (\S+) (\d+)-(\d+)$")


# ----------------------------------------------------------------------------- reading both sides


@dataclass
class Block:
    upstream: str  # "slime" or "sglang"
    commit: str | None
    path: str
    start: int
    end: int
    text: str


@cache
def blocks(folder: str, path: str) -> tuple[Block, ...]:
    """The verbatim blocks of one upstream file (``folder`` is ``v0.3.1`` or ``sglang-0.5.15.post1``)."""
    lines = (CLAIMS / folder / (path + ".txt")).read_text(encoding="utf-8").splitlines(keepends=True)
    found, current = [], None
    for line in lines:
        match = HEADER.match(line.rstrip("\n"))
        if match:
            current = [match, []]
            found.append(current)
        else:
            current[1].append(line)
    out = []
    for match, body in found:
        upstream = "slime" if match.group(1).startswith("slime") else "sglang"
        start, end = int(match.group(4)), int(match.group(5))
        assert match.group(3) == path and len(body) == end - start + 1, (path, start, end, len(body))
        out.append(Block(upstream, match.group(2), path, start, end, "".join(body)))
    return tuple(out)


def slime(path: str) -> str:
    """slime v0.3.1's lines of ``path`` kept in the fixture, joined, whitespace collapsed."""
    return flat("".join(b.text for b in blocks("v0.3.1", path)))


def sglang(path: str) -> str:
    return flat("".join(b.text for b in blocks("sglang-0.5.15.post1", path)))


def where(folder: str, path: str, needle: str) -> str:
    """``path:line`` of the first line holding ``needle``, for messages and the report."""
    for block in blocks(folder, path):
        for offset, line in enumerate(block.text.splitlines()):
            if needle in line:
                return f"{path}:{block.start + offset}"
    raise AssertionError(f"{needle!r} not in the {folder} excerpt of {path}")


def flat(text: str) -> str:
    return " ".join(text.split())


def page(rel: str) -> str:
    """A skill page with line breaks and repeated spaces collapsed, so prose can wrap anywhere."""
    return flat((REPO / rel).read_text(encoding="utf-8"))


def bundle_text() -> dict[str, str]:
    return {rel: (REPO / rel).read_text(encoding="utf-8") for rel in bundle_files()
            if rel.endswith((".md", ".sh", ".py"))}


def launch_argv(template: str) -> list[str]:
    """The train.py arguments a template submits, as words (read, never run)."""
    from slime_check.launch_script import read_script

    (invocation,) = read_script(TEMPLATES / template).invocations
    return [word.text for word in invocation.argv]


def flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


# ----------------------------------------------------------------------------- the excerpts are slime's


def _slime_git() -> Path | None:
    for candidate in (os.environ.get("SLIME_GIT"), "/work/.mirror/THUDM+slime/repo"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def test_excerpts_are_verbatim():
    git = _slime_git()
    if git is None:
        pytest.skip("no slime mirror (set SLIME_GIT=/path/to/slime.git); the excerpts name their commit")
    checked = 0
    for excerpt in sorted((CLAIMS / "v0.3.1").rglob("*.txt")):
        path = excerpt.relative_to(CLAIMS / "v0.3.1").as_posix()[: -len(".txt")]
        for block in blocks("v0.3.1", path):
            assert block.commit == V031
            shown = subprocess.run(["git", "-C", str(git), "show", f"{block.commit}:{path}"], check=True,
                                   capture_output=True, text=True).stdout.splitlines(keepends=True)
            assert "".join(shown[block.start - 1:block.end]) == block.text, f"{path}:{block.start}-{block.end}"
            checked += 1
    assert checked >= 15


# ----------------------------------------------------------------------------- W1: the health check


def test_w1_old_log_prob_pass_is_skipped_in_every_template():
    actor = slime("slime/backends/megatron_utils/actor.py")
    for condition in (
        "len(num_microbatches) == 1", 'self.args.loss_type == "policy_loss"', "self.args.kl_coef == 0",
        "not self.args.use_rollout_logprobs", "not self.args.get_mismatch_metrics", "not self.args.use_critic",
        "not self.args.keep_old_actor", "not self.args.use_opd", 'self.args.advantage_estimator != "gspo"',
    ):
        assert condition in actor.split("can_reuse_log_probs_in_loss = (")[1].split(")\n")[0], condition
    # the "old" log-prob pass (store_prefix="") runs only when the loss cannot reuse its own
    assert re.search(r"and not can_reuse_log_probs_in_loss: .*?store_prefix=\"\"", actor)
    # ... and the loss then takes its own log-probs, detached, as the old ones: ppo_kl is exactly 0
    loss = slime("slime/backends/megatron_utils/loss.py")
    assert ("if not args.use_rollout_logprobs and not old_log_probs: "
            "old_log_probs = [log_prob.detach() for log_prob in log_probs]") in loss

    from slime_common.registry import load_registry

    registry = load_registry()
    assert registry.lookup("--kl-coef").default == 0.0 and registry.lookup("--loss-type").default == "policy_loss"
    for template in sorted(p.name for p in TEMPLATES.glob("*.sh")):
        argv = launch_argv(template)
        steps = (int(flag_value(argv, "--rollout-batch-size")) * int(flag_value(argv, "--n-samples-per-prompt"))
                 // int(flag_value(argv, "--global-batch-size")))
        assert steps == 1 and "--num-steps-per-rollout" not in argv, template
        assert float(flag_value(argv, "--kl-coef") or 0) == 0, template
        assert flag_value(argv, "--loss-type") in (None, "policy_loss"), template
        assert flag_value(argv, "--advantage-estimator") == "grpo", template
        for off in ("--use-rollout-logprobs", "--get-mismatch-metrics", "--use-critic", "--keep-old-actor",
                    "--use-opd", "--use-routing-replay"):
            assert off not in argv, (template, off)


def test_w1_healthy_first_step_is_what_slimes_ci_asserts():
    model = slime("slime/backends/megatron_utils/model.py")
    assert 'step_id == 0 and "train/ppo_kl" in log_dict' in model and 'log_dict["train/ppo_kl"] < 1e-8' in model
    assert "accumulated_step_id == 0" in model and 'log_dict["train/kl_loss"] < 1e-8' in model
    assert 'log_dict["train/train_rollout_logprob_abs_diff"] <= 0.1' in model
    # slime's own rollout-0 check of log_probs against ref_log_probs runs only when both were logged
    assert '"rollout/log_probs" in reduced_log_dict and "rollout/ref_log_probs" in reduced_log_dict' in slime(
        "slime/backends/megatron_utils/data.py")

    skill = page("SKILL.md")
    assert re.search(r"Healthy first step \(what slime's CI asserts\): `train/ppo_kl` 0, `train/kl_loss` about 0",
                     skill)
    assert "`train/train_rollout_logprob_abs_diff` small (bound 0.1)" in skill
    assert "slime skips the old-log-prob pass: no `rollout/log_probs`" in skill
    assert "first step has `train/ppo_kl` 0 and `train/kl_loss` about 0" in page("skill/references/long-runs.md")
    trouble = page("skill/references/troubleshooting.md")
    assert "in the first training step `train/kl_loss` must be about 0 and `train/ppo_kl` 0" in trouble
    architecture = page("skill/references/architecture.md")
    assert "**unless** it can reuse the loss pass's own (`can_reuse_log_probs_in_loss` in `actor.py`)" in architecture
    assert "`rollout/log_probs` is never logged" in architecture
    # nowhere is a healthy first step judged by a metric the templates never log
    wrong = re.compile(r"`rollout/log_probs`,? (must )?(equals?|equal to|=) `rollout/ref_log_probs`")
    assert [rel for rel, text in bundle_text().items() if wrong.search(flat(text))] == []


def test_w1_log_summary_checks_kl_loss_at_step_0(tmp_path):
    import sys

    log = tmp_path / "job.log"
    script = REPO / "skill" / "scripts" / "slime_log_summary.py"
    log.write_text("rollout 0: {'rollout/raw_reward': 0.2}\nstep 0: {'train/ppo_kl': 0.0, 'train/kl_loss': 0.02}\n")
    bad = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "step 0: train/kl_loss = 0.02" in bad.stdout, bad.stdout
    log.write_text("rollout 0: {'rollout/raw_reward': 0.2}\nstep 0: {'train/ppo_kl': 0.0, 'train/kl_loss': 0.0}\n")
    good = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=60)
    assert good.returncode == 0, good.stdout


# ----------------------------------------------------------------------------- frontmatter


SPEC_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}


def _frontmatter() -> dict:
    text = (REPO / "SKILL.md").read_text(encoding="utf-8")
    return yaml.safe_load(re.match(r"^---\n(.*?)\n---\n", text, re.S).group(1))


def test_frontmatter_metadata_maps_strings_to_strings():
    """agentskills.io: ``metadata`` is a map from string keys to string values. agentskills-tools 0.7.0's
    native manifest (``agentskills inspect --native``, ``agentskills serve``) refuses anything else, and
    skills-ref 0.1.1's loader turns a nested value into its Python repr. Hermes 0.19 needs only ``name``
    and ``description``; it reads ``tags`` and ``related_skills`` from a nested ``metadata.hermes`` map
    (or from top-level keys, which skills-ref refuses), so the skill carries neither and Hermes shows
    none. test_skill_portable.py and test_skill_hermes.py run all four programs on the installed skill."""
    meta = _frontmatter()
    assert set(meta) <= SPEC_KEYS
    assert meta["metadata"] and all(isinstance(k, str) and isinstance(v, str) for k, v in meta["metadata"].items())
    assert "hermes" not in meta["metadata"] and "tags" not in meta and "related_skills" not in meta
    assert {"slime", "GRPO", "PPO"} <= {tag.strip() for tag in meta["metadata"]["tags"].split(",")}


def test_hermes_reads_tags_only_from_a_nested_map():
    """Pins the reading above to Hermes 0.19.0's own code where its environment exists."""
    found = sorted((REPO / ".venv-hermes").glob("lib/python3*/site-packages/tools/skills_tool.py"))
    if not found:
        pytest.skip("no .venv-hermes here (test_skill_hermes.py builds it)")
    code = flat(found[0].read_text(encoding="utf-8"))
    assert ('metadata = frontmatter.get("metadata") if isinstance(metadata, dict): '
            'hermes_meta = metadata.get("hermes", {}) or {}') in code
    assert 'tags = _parse_tags(hermes_meta.get("tags") or frontmatter.get("tags", ""))' in code
    validator = flat((found[0].parent / "skill_manager_tool.py").read_text(encoding="utf-8"))
    assert 'if "name" not in parsed:' in validator and 'if "description" not in parsed:' in validator
    assert "metadata" not in validator.split("def _validate_frontmatter(")[1].split("def ")[0]


# ----------------------------------------------------------------------------- W2, W3, top-p: hook contracts


def test_w2_a_generate_hook_returning_a_list_cannot_run_with_group_rm():
    rollout = slime("slime/rollout/sglang_rollout.py")
    # with --group-rm generate_and_rm returns what generate gave, un-rewarded, before its list handling
    assert rollout.index("if args.group_rm: return sample") < rollout.index("if isinstance(sample, list):")
    # the group is then gathered as it came (a list of lists) and .reward is set on each member
    group = rollout.split("async def generate_and_rm_group(")[1]
    assert "group = await asyncio.gather(*tasks)" in group
    assert ("rewards = await batched_async_rm(args, group) for sample, reward in zip(group, rewards, "
            "strict=False): sample.reward = reward") in group
    assert "return await rm_function(args, samples, **kwargs)" in slime("slime/rollout/rm_hub/__init__.py")

    hooks = page("skill/references/custom-hooks.md")
    assert "**Not with `--group-rm`**: slime then hands the reward the group as a list of lists" in hooks
    assert "`AttributeError: 'list' object has no attribute 'reward'`" in hooks
    assert ("without `--group-rm`, whenever the generate hook returns `list[Sample]`. Both at once fails" in hooks)
    assert "with or without `--group-rm`" not in hooks
    assert "or whenever generate returns a list (not both)" in page("SKILL.md")


def test_w3_custom_train_data_must_carry_rollout_ids():
    convert = slime("slime/ray/rollout.py")
    # the hook's dict replaces slime's whole conversion, reward normalisation included
    assert ("if self.custom_convert_samples_to_train_data_func is not None: "
            "return self.custom_convert_samples_to_train_data_func(self.args, samples) "
            "raw_rewards, rewards = self._post_process_rewards(samples)") in convert
    # and the split into train steps reads rollout_ids unconditionally (a KeyError without it)
    assert 'rollout_indices=data["rollout_ids"],' in convert
    assert where("v0.3.1", "slime/ray/rollout.py", 'rollout_indices=data["rollout_ids"]') == "slime/ray/rollout.py:852"
    assert '"rollout_ids": rollout_ids,' in convert  # slime's own conversion fills it

    row = next(line for line in (REPO / "skill/references/custom-hooks.md").read_text().splitlines()
               if line.startswith("| `--custom-convert-samples-to-train-data-path`"))
    for key in ("tokens", "response_lengths", "rewards", "raw_reward", "truncated", "sample_indices",
                "rollout_ids", "loss_masks"):
        assert f"`{key}`" in row, key
    assert "group normalisation included" in row


def test_top_p_below_one_needs_top_p_token_data_from_a_custom_generate():
    convert = slime("slime/ray/rollout.py")
    assert ('if getattr(self.args, "rollout_top_p", 1.0) != 1.0: for sample in samples: '
            "assert sample.rollout_top_p_token_ids is not None assert sample.rollout_top_p_token_offsets is not None "
            "assert len(sample.rollout_top_p_token_offsets) == sample.response_length + 1") in convert
    assert "assert offset_end == len(sample.rollout_top_p_token_ids)" in convert
    rollout = slime("slime/rollout/sglang_rollout.py")
    assert ('if args.rollout_top_p != 1.0: self.sampling_params["custom_params"] = '
            '{"return_top_p_token_ids": True}') in rollout
    types = slime("slime/utils/types.py")
    assert "self._apply_meta_info( args, meta_info or {}, new_token_count=len(tokens), pad_missing_top_p=" in types
    assert "self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = top_p_data" in types
    assert "_pad_rollout_top_p_offsets(" in types

    hooks = page("skill/references/custom-hooks.md")
    assert ("With `--rollout-top-p` below 1, slime's train data needs `sample.rollout_top_p_token_ids` and "
            "`sample.rollout_top_p_token_offsets` on every sample (offsets: `response_length + 1` entries") in hooks
    assert "pass each reply's `meta_info` to `sample.append_response_tokens(...)`" in hooks
    assert "with `--rollout-top-p` < 1 also `rollout_top_p_token_ids`/`_offsets`" in page("SKILL.md")


# ----------------------------------------------------------------------------- W4, W5, W6: algorithm and model checks


def test_w4_kl_coef_does_not_enter_the_grpo_gspo_cispo_advantage():
    returns = slime("slime/utils/ppo_utils.py")
    assert "returns.append(torch.ones_like(kl[i]) * rewards[i])" in returns  # kl only gives the shape
    loss = slime("slime/backends/megatron_utils/loss.py")
    assert ('elif args.advantage_estimator in ["grpo", "gspo", "cispo"]: rewards = torch.tensor(rewards, '
            "dtype=torch.float32, device=kl[0].device) returns = get_grpo_returns(rewards, kl)") in loss
    assert 'elif args.advantage_estimator == "ppo": old_rewards = rewards rewards = [] kl_coef = -args.kl_coef' in loss
    assert "kl_coef=args.kl_coef," in loss.split('elif args.advantage_estimator == "reinforce_plus_plus":')[1]

    row = next(line for line in (REPO / "skill/references/grpo-flags.md").read_text().splitlines()
               if line.startswith("| `--kl-coef` |"))
    assert ("for `ppo`, `reinforce_plus_plus` and `reinforce_plus_plus_baseline` only: the `grpo`, `gspo` and "
            "`cispo` advantage ignores it") in row
    assert "KL as a reward penalty instead" not in row
    # algorithms.md says the same
    assert "`grpo`, `gspo`, `cispo` | r̂<sub>i</sub> for every token (β does not enter" in page(
        "skill/references/algorithms.md")


def _hf_compared() -> tuple[str, set[str]]:
    validate = slime("slime/backends/megatron_utils/arguments.py")
    pairs = set(re.findall(r'\("(\w+)", "(\w+)", (?:equal|lambda)', validate))
    return validate, {megatron for _, megatron in pairs}


def test_w5_slime_refuses_to_start_on_a_tied_embeddings_mismatch():
    validate, compared = _hf_compared()
    assert ('("tie_word_embeddings", "untie_embeddings_and_output_weights", lambda x, y: not x == y)') in validate
    assert 'raise AssertionError("hf_validate_args failed: " + "; ".join(errors))' in validate
    # and it runs whenever --hf-checkpoint is given (every slime run has one)
    assert ("if args.hf_checkpoint and not skip_hf_validate: hf_config = AutoConfig.from_pretrained("
            "args.hf_checkpoint, trust_remote_code=True) _hf_validate_args(args, hf_config)") in validate
    assert "untie_embeddings_and_output_weights" in compared

    section = page("skill/references/troubleshooting.md").split("## `--check-weight-update-equal` fails")[1]
    section = section.split("\n## ")[0].split("## ")[0]
    assert ("**Not tied embeddings**: slime refuses to start when `--untie-embeddings-and-output-weights` "
            "disagrees with `tie_word_embeddings`") in section
    assert "`lm_head` is missing or wrong" not in section
    row = next(line for line in (REPO / "SKILL.md").read_text().splitlines()
               if line.startswith("| `--check-weight-update-equal` fails"))
    assert "tied" not in row


def test_w6_rotary_base_is_compared_at_start_up_qk_norm_kv_channels_and_groups_are_not():
    validate, compared = _hf_compared()
    assert ("if not equal(_hf_rope_theta, getattr(args, \"rotary_base\", None)): errors.append( "
            "f\"rope_theta in hf config") in validate
    for flag in ("qk_layernorm", "kv_channels", "num_query_groups", "padded_vocab_size", "vocab_size"):
        assert flag not in validate, flag
    assert {"hidden_size", "num_attention_heads", "num_layers", "ffn_hidden_size", "norm_epsilon"} <= compared

    trouble = page("skill/references/troubleshooting.md")
    garbled = trouble.split("## Garbled text, or a reward of 0 from the first step")[1].split(" ## ")[0]
    assert ("`MODEL_ARGS` differ from the HF `config.json` where slime does not compare them at start-up "
            "(`--qk-layernorm`, `--kv-channels`, `--num-query-groups`; a wrong rotary base") in garbled
    assert "(for example `--rotary-base`)" not in garbled and "MODEL_ARGS+=(--rotary-base" not in garbled
    skill = page("SKILL.md")
    assert "but not `--num-query-groups`, `--kv-channels` or `--qk-layernorm`: check those" in skill
    assert "`--rotary-base` differs between versions of a model" not in skill
    assert ("It does **not** compare KV groups (`--num-query-groups`), head size (`--kv-channels`), QK-norm "
            "(`--qk-layernorm`) or the vocabulary size") in page("skill/references/grpo-flags.md")


# ----------------------------------------------------------------------------- the image, W7, W8: install


IMAGE = "slimerl/slime:nightly-dev-20260804a"


def test_image_is_the_tag_slime_v031_builds_not_latest():
    version = "".join(b.text for b in blocks("v0.3.1", "docker/version.txt")).strip()
    assert f"slimerl/slime:{version}" == IMAGE
    justfile = slime("docker/justfile")
    assert ("VERSION=\"$(cat docker/version.txt | tr -d '\\n')\" IMAGE_TAG=${VERSION}${ARG_TAG_POSTFIX}" in justfile
            and "-t slimerl/slime:$IMAGE_TAG" in justfile and "docker tag slimerl/slime:$IMAGE_TAG slimerl/slime:latest"
            in justfile)
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    assert "ARG SLIME_COMMIT=main" in dockerfile and "ARG SGLANG_IMAGE_TAG=v0.5.15.post1-cu129" in dockerfile

    for rel in ("SKILL.md", "skill/references/install.md"):
        text = (REPO / rel).read_text(encoding="utf-8")
        assert f"docker pull {IMAGE}" in text and f"-it {IMAGE} /bin/bash" in text, rel
        assert "git checkout v0.3.1" in text, rel  # the image's slime is main until pinned
        assert [line for line in text.splitlines() if re.search(r"(pull|-it) slimerl/slime:latest", line)] == [], rel
    install = page("skill/references/install.md")
    assert "Pull that tag, not `latest`" in install
    assert "The build clones slime's `main` (`SLIME_COMMIT=main`" in install


def test_slime_check_judges_v031s_image_tag_as_v031():
    from slime_check.slime_identity import V031, image_source

    source = image_source({"SLIME_IMAGE": IMAGE})
    assert source.target == V031 and "docker/version.txt" in source.relation


def _template_sets(template: str) -> set[str]:
    text = (TEMPLATES / template).read_text(encoding="utf-8")
    exported = set()
    for line in text.splitlines():
        line = line.split("#")[0]
        for match in re.finditer(r"\bexport ((?:[A-Z_]+=\S+ ?)+)", line):
            exported |= set(re.findall(r"([A-Z_]+)=", match.group(1)))
    runtime = set(re.findall(r'\\"([A-Z_]+)\\": \\"\$\{(?:SOCKET_IFNAME|NODE_IP)\}', text))
    return exported | runtime


def test_w7_install_names_what_the_multinode_template_really_sets():
    sets = _template_sets("run-qwen3-32B-grpo-multinode.sh")
    network = {name for name in sets if name.endswith("IFNAME") or name == "SLIME_HOST_IP"}
    assert network == {"SLIME_HOST_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"}, sets
    install = page("skill/references/install.md")
    multinode = install.split("## Multi-node")[1]
    named = set(re.findall(r"`([A-Z][A-Z_]+)`", multinode)) - {"NODE_IP", "SOCKET_IFNAME"}
    assert named == network, named
    assert "sets exactly these four from `NODE_IP` and `SOCKET_IFNAME`" in multinode
    assert [rel for rel, text in bundle_text().items() if "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME" in text] == []


def test_w8_fp8_starts_at_ada_and_only_deepgemm_needs_hopper():
    marlin = sglang("sglang/srt/layers/quantization/fp8_utils.py")
    assert "def can_auto_enable_marlin_fp8() -> bool:" in marlin and "return 80 <= sm < 89" in marlin
    deepgemm = sglang("sglang/srt/layers/deep_gemm_wrapper/configurer.py")
    assert "if (_is_cuda and sm_version < 90) or (_is_musa and sm_version < 31): return False" in deepgemm
    assert "if sm_version == 120: return False" in deepgemm

    install = page("skill/references/install.md")
    assert ("FP8 tensor cores start at Ada (8.9: L40S, RTX 6000 Ada) and Hopper; below 8.9 (A100) SGLang "
            "0.5.15.post1 serves FP8 weights only by Marlin weight-only emulation. What needs Hopper (9.0, and "
            "Blackwell except 12.0) is DeepGEMM") in install
    row = next(line for line in (REPO / "checklists/prerequisites.md").read_text().splitlines()
               if line.startswith("| `gpu.compute_capability` |"))
    assert "FP8 tensor cores from 8.9 (Ada) on; DeepGEMM's block FP8 9.0+ (not 12.0)" in row
    assert "`can_auto_enable_marlin_fp8`: SM 80-88" in row
    wrong = re.compile(r"FP8 (rollout or training )?needs Hopper|9\.0\+ \(Hopper\) for FP8|FP8 tensor cores start at "
                       r"Hopper")
    assert [rel for rel, text in bundle_text().items() if wrong.search(flat(text))] == []

    # slime-check prereqs says the same for each generation
    from types import SimpleNamespace

    from slime_check import prereqs_gpu
    from slime_check.facts import Gpu, GpuInventory

    def finding(cc: str) -> str:
        machine = SimpleNamespace(inventory=GpuInventory("580.0", "13.0", [Gpu(0, "GPU", cc=cc)], "nvidia-smi"))
        return prereqs_gpu.gpu_compute_capability(machine).finding

    assert "no FP8 tensor cores below 8.9" in finding("8.0") and "Marlin" in finding("8.6")
    assert "bf16 and FP8 (Ada); DeepGEMM's block FP8 needs 9.0 or newer" in finding("8.9")
    assert finding("9.0").endswith("bf16 and FP8.")


# ----------------------------------------------------------------------------- the incomplete items


def test_bitwise_reproducibility_is_slimes_whole_recipe():
    recipe = slime("docs/en/advanced/reproducibility.md")
    parts = ["pip uninstall flash_attn_3 -y", "--sglang-enable-deterministic-inference",
             "--sglang-attention-backend flashinfer", "--deterministic-mode", '"NCCL_ALGO": "Ring"',
             '"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"', '"CUBLAS_WORKSPACE_CONFIG": ":4096:8"']
    for part in parts:
        assert part in recipe, part
    script = (SCRIPTS / "run-qwen2.5-0.5B-reproducibility.sh").read_text(encoding="utf-8")
    assert all(part in script for part in parts[1:]), "slime's reproducibility script"
    assert "torch.use_deterministic_algorithms(True, warn_only=False)" in slime(
        "slime/backends/megatron_utils/initialize.py")
    seeds = slime("slime/rollout/sglang_rollout.py")
    assert ("sampling_seed_base = args.rollout_seed self.group_sampling_seeds = [sampling_seed_base + i for i in "
            "range(args.n_samples_per_prompt)]") in seeds
    assert "seed=args.rollout_seed," in slime("slime/rollout/data_source.py")
    from slime_common.registry import load_registry

    registry = load_registry()
    assert registry.lookup("--seed").default == 1234 and registry.lookup("--rollout-seed").default == 42

    flags = page("skill/references/grpo-flags.md")
    section = flags.split("## Bitwise reproducibility")[1].split(" ## ")[0]
    for part in parts:
        assert part in section, part
    assert "`--seed` (Megatron, 1234) and `--rollout-seed` (42;" in section and "`rollout_seed + i`" in section
    assert "with `--deterministic-mode` for bitwise-reproducible runs" not in flags


def test_no_deprecated_sglang_alias_anywhere_in_the_skill():
    from slime_common.registry import load_registry

    registry = load_registry()
    deprecated = {name: flag for flag in registry.flags if flag.deprecated for name in flag.flags}
    # the three the skill used to show, and what SGLang 0.5.15.post1 calls them now
    renamed = {"--sglang-cuda-graph-max-bs": "--sglang-cuda-graph-max-bs-decode",
               "--sglang-cuda-graph-bs": "--sglang-cuda-graph-bs-decode",
               "--sglang-disable-cuda-graph": "--sglang-disable-decode-cuda-graph"}
    for old, new in renamed.items():
        assert old in deprecated and not registry.lookup(new).deprecated, old
    assert deprecated["--sglang-cuda-graph-max-bs"].dest == "sglang_cuda_graph_max_bs_decode"
    assert deprecated["--sglang-cuda-graph-bs"].dest == "sglang_cuda_graph_bs_decode"
    flag = re.compile(r"(?<![\w-])--sglang-[a-z0-9-]*[a-z0-9](?![\w-])")
    shown = sorted({(rel, m.group(0)) for rel, text in bundle_text().items() for m in flag.finditer(text)
                    if m.group(0) in deprecated})
    assert shown == []
    trouble = page("skill/references/troubleshooting.md")
    assert "lower `--sglang-cuda-graph-max-bs-decode` (for example 128 or 64)" in trouble
    assert "`--sglang-cuda-graph-bs-decode 1 2 4 8 16 32 64`" in trouble


def _nodes(script: str) -> int:
    """Nodes of 8 GPUs a slime run script asks for: the actor's, plus the rollout's when not colocated."""
    text = (SCRIPTS / script).read_text(encoding="utf-8")
    value = re.search(r"--actor-num-nodes \"?([^\s\"\\]+)", text).group(1)
    default = re.fullmatch(r"\$\{(\w+)\}", value)
    if default:
        value = re.search(rf"^{default.group(1)}=\$\{{{default.group(1)}:-(\d+)\}}", text, re.M).group(1)
    nodes = int(value)
    rollout = re.search(r"--rollout-num-gpus (\d+)", text)
    if "--colocate" not in text and rollout:
        nodes += int(rollout.group(1)) // 8
    return nodes


BIG_MOE = {"run-glm4.7-355B-A32B.sh": 8, "run-qwen3-235B-A22B.sh": 16, "run-deepseek-r1.sh": 16,
           "run-minimax-m2.sh": 16, "run-glm5-744B-A40B.sh": 32, "run-glm5.2-744B-A40B.sh": 32,
           "run-kimi-k2-Instruct.sh": 32, "run-kimi-k2-Thinking.sh": 32}


def test_big_moe_scripts_use_8_to_32_nodes():
    assert {script: _nodes(script) for script in BIG_MOE} == BIG_MOE
    skill = page("SKILL.md")
    low, high = min(BIG_MOE.values()), max(BIG_MOE.values())
    assert (f"The big MoE run scripts use {low} to {high} nodes of 8 GPUs: GLM-4.7-355B 8, Qwen3-235B, "
            "DeepSeek-R1 and MiniMax-M2 16, GLM-5 and Kimi-K2 32") in skill
    assert "16 to 32 nodes" not in skill
    assert "GLM-4.7-355B 8, Qwen3-235B-A22B 16 (8 training + 8 rollout), DeepSeek-R1 and MiniMax-M2 16" in page(
        "skill/references/install.md")


def test_22_of_23_run_scripts_begin_by_killing_by_name():
    four = ["pkill -9 sglang", "ray stop --force", "pkill -9 ray", "pkill -9 python"]
    scripts = sorted(SCRIPTS.glob("run-*.sh"))
    assert len(scripts) == 23
    with_four, other = [], []
    for script in scripts:
        lines = [line.strip() for line in script.read_text(encoding="utf-8").splitlines()]
        head = [line for line in lines[:20] if line.startswith(("pkill", "ray stop"))]
        (with_four if head[:4] == four else other).append(script.name)
    assert len(with_four) == 22 and other == ["run-qwen2.5-0.5B-gb10-smoke.sh"]
    gb10 = (SCRIPTS / "run-qwen2.5-0.5B-gb10-smoke.sh").read_text(encoding="utf-8")
    assert "pkill -9 ray python 2>/dev/null || true" in gb10
    assert ("22 of slime's 23 `scripts/run-*.sh` begin with `pkill -9 sglang`, `ray stop --force`, `pkill -9 ray`, "
            "`pkill -9 python` (the DGX Spark smoke: `pkill -9 ray python`)") in page("SKILL.md")
    # and none of the skill's own templates kills anything by name
    for template in TEMPLATES.glob("*.sh"):
        code = [line.split("#")[0] for line in template.read_text(encoding="utf-8").splitlines()]
        assert not [line for line in code if re.search(r"\b(pkill|killall)\b|ray stop", line)], template.name
