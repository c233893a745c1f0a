"""The skill covers every slime topic a user meets, and what it says there holds for slime v0.3.1.

Each topic of the coverage table (issue 43) has a page under skill/references/ with when to use it,
a launch snippet, its pitfalls and slime's own page. Here:

* every snippet runs through slime v0.3.1's own ``parse_args`` (``slime_v031_parser``: slime's
  flag provider and validation from the committed v0.3.1 sources), added to the template it names,
  and fails on a flag slime does not know; ``--sglang-config`` and ``--eval-config`` files shown on
  the page are read as slime reads them;
* the refusals the pages promise ("slime stops at start-up when ...") happen;
* the memory arithmetic is recomputed from slime's model scripts and the templates;
* the behaviour the pages describe is pinned to slime v0.3.1's lines (excerpts under
  tests/fixtures/slime_coverage, refreshed by its refresh.py);
* every slime flag is named somewhere in the skill or listed, with a reason, in
  flags-not-covered.md. ``python tests/skill/test_skill_coverage.py`` prints that report.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skill_docs import REPO, _strip_comments, all_uses  # noqa: E402

REFERENCES = REPO / "skill" / "references"
TEMPLATES = REPO / "skill" / "templates"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXCERPTS = FIXTURES / "slime_coverage" / "v0.3.1"
SLIME_SCRIPTS = FIXTURES / "slime_sources" / "scripts"
SLIME_FILES = set((FIXTURES / "slime_coverage" / "v0.3.1-files.txt").read_text().split())
SLIME_BLOB = "https://github.com/THUDM/slime/blob/v0.3.1/"

# the coverage table of issue 43: topic -> its page
TOPICS = {
    "GPU memory sizing": "memory-sizing.md",
    "colocate vs disaggregated": "deployment-topology.md",
    "debugging a hang": "debugging-hangs.md",
    "eval": "eval.md",
    "fully async": "fully-async.md",
    "on-policy distillation": "on-policy-distillation.md",
    "VLM": "vlm.md",
    "low precision": "low-precision.md",
    "SGLang deployment": "sglang-deployment.md",
    "agentic RL": "agentic-rl.md",
    "partial fine-tuning": "partial-finetuning.md",
}
PAGES = sorted(set(TOPICS.values()))
NOT_COVERED = REFERENCES / "flags-not-covered.md"

MARKED_BLOCK = re.compile(r"<!-- slime-args: (?P<spec>[^>]*?) -->\n```bash\n(?P<body>.*?)^```", re.S | re.M)
FILE_BLOCK = re.compile(r"<!-- slime-file: (?P<path>\S+) -->\n```ya?ml\n(?P<body>.*?)^```", re.S | re.M)
BASH_BLOCK = re.compile(r"^```bash\n(?P<body>.*?)^```", re.S | re.M)
ARRAY = re.compile(r"\b\w+\+?=\((.*?)\)", re.S)


def text(page: str) -> str:
    return (REFERENCES / page).read_text(encoding="utf-8")


def flat(s: str) -> str:
    return " ".join(s.split())


# ----------------------------------------------------------------------------- the pages


@pytest.mark.parametrize("topic", TOPICS)
def test_every_topic_has_a_page_with_use_snippet_pitfalls_and_slimes_page(topic):
    page = TOPICS[topic]
    body = text(page)
    assert re.search(r"when to use|how to choose", body, re.I), f"{page}: no 'when to use' section"
    assert "Pitfalls" in body, f"{page}: no pitfalls"
    assert MARKED_BLOCK.search(body), f"{page}: no launch snippet checked against slime's parser"
    assert SLIME_BLOB in body, f"{page}: no link to slime's own page at v0.3.1"
    skill = (REPO / "SKILL.md").read_text(encoding="utf-8")
    assert f"(skill/references/{page})" in skill, f"SKILL.md does not link {page}"


def test_skill_md_body_stays_within_the_agentskills_guideline():
    body = (REPO / "SKILL.md").read_text(encoding="utf-8").split("\n---", 1)[1]
    assert len(body) < 20_000, f"SKILL.md body is {len(body)} characters (5,000 tokens at 4 a token)"


@pytest.mark.parametrize("page", PAGES)
def test_slime_links_and_paths_exist_at_v031(page):
    body = text(page)
    missing = []
    for link in re.findall(re.escape(SLIME_BLOB) + r"([^)#\s]+)", body):
        if link not in SLIME_FILES:
            missing.append(link)
    # source files named in the prose: slime's own paths only (SGLang's start with sglang/)
    for path in re.findall(r"`((?:slime|slime_plugins|tools|scripts|examples)/[\w./-]+|train(?:_async)?\.py)`", body):
        if path.endswith("/") or "." not in path.rsplit("/", 1)[-1]:  # a folder
            ok = any(f.startswith(path.rstrip("/") + "/") for f in SLIME_FILES)
        else:
            ok = path in SLIME_FILES
        if not ok:
            missing.append(path)
    assert missing == []


# ----------------------------------------------------------------------------- snippets through slime's parser


def template_argv(name: str, env: dict[str, str]) -> tuple[list[str], str]:
    from slime_check.launch_script import read_script

    reading = read_script(TEMPLATES / name, None, {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "0", **env})
    (invocation,) = reading.invocations
    words = [w.text for w in invocation.argv]
    assert all(w.known for w in invocation.argv), f"{name}: words the reader cannot know"
    return words, invocation.entry


def model_argv(model: str) -> list[str]:
    """MODEL_ARGS of slime's scripts/models/<model>.sh (committed), as bash expands them."""
    from slime_check.launch_script import read_script

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "run.sh"
        script.write_text(f'source "{SLIME_SCRIPTS / "models" / (model + ".sh")}"\n'
                          'python3 train.py "${MODEL_ARGS[@]}"\n')
        (invocation,) = read_script(script, None, {}).invocations
        return [w.text for w in invocation.argv]


def array_flags(script: str) -> set[str]:
    return {f for body in ARRAY.findall(script) for f in re.findall(r"(?<![\w-])--[a-z][\w-]*", body)}


def drop(argv: list[str], flags: set[str]) -> list[str]:
    """argv without each flag in ``flags`` and the values that follow it."""
    out: list[str] = []
    skipping = False
    for word in argv:
        if word.startswith("--"):
            skipping = word.split("=", 1)[0] in flags
        if not skipping:
            out.append(word)
    return out


def block_words(body: str) -> list[str]:
    script = _strip_comments(textwrap.dedent(body)).replace("\\\n", " ")
    arrays = ARRAY.findall(script)
    if arrays:
        return [w for a in arrays for w in shlex.split(a)]
    words = shlex.split(script)
    if not words:
        return []
    entry = next(i for i, w in enumerate(words) if w.endswith(("train.py", "train_async.py")))
    return words[entry + 1:]


def snippets() -> list[tuple[str, int, dict, str]]:
    found = []
    for page in PAGES:
        for i, match in enumerate(MARKED_BLOCK.finditer(text(page))):
            spec = dict(item.split("=", 1) for item in match["spec"].split())
            found.append((page, i, spec, match["body"]))
    return found


def files_of(page: str) -> dict[str, str]:
    return {m["path"]: m["body"] for m in FILE_BLOCK.finditer(text(page))}


def snippet_argv(page: str, spec: dict, body: str) -> tuple[list[str], str]:
    env = dict(item.split("=", 1) for item in spec.get("env", "").split(";") if item)
    base = spec["base"]
    argv, entry = template_argv(base, env) if base != "none" else ([], "train.py")
    dropped = set(filter(None, spec.get("drop", "").split(",")))
    if "model" in spec:
        template = (TEMPLATES / base).read_text(encoding="utf-8")
        dropped |= array_flags(re.search(r"^MODEL_ARGS=\(.*?^\)", template, re.S | re.M)[0])
    argv = drop(argv, dropped)
    if "model" in spec:
        argv += model_argv(spec["model"])
    return argv + block_words(body), spec.get("entry", entry)


def parse_snippet(page: str, spec: dict, body: str, extra: list[str] | None = None):
    from slime_v031_parser import parse

    argv, entry = snippet_argv(page, spec, body)
    files = {path: files_of(page)[path] for path in filter(None, spec.get("files", "").split(","))}
    args = parse(argv + (extra or []), files)
    if entry == "train_async.py":
        assert not args.colocate, "train_async.py asserts not args.colocate"
    return args


SNIPPETS = snippets()


@pytest.mark.parametrize(("page", "index", "spec", "body"), SNIPPETS,
                         ids=[f"{p}#{i}" for p, i, _, _ in SNIPPETS])
def test_snippet_passes_slimes_own_parse_args(page, index, spec, body):
    parse_snippet(page, spec, body)


LAUNCH_SCRIPTS = sorted([*(f"skill/templates/{p.name}" for p in TEMPLATES.glob("run-*.sh")),
                         *(f"examples/{p.name}" for p in (REPO / "examples").glob("run-*.sh"))])


@pytest.mark.parametrize("script", LAUNCH_SCRIPTS)
def test_templates_and_examples_pass_slimes_own_parse_args(script, tmp_path):
    """The skill's own launch scripts, read as bash expands them, through slime v0.3.1's parse_args."""
    from slime_check.launch_script import read_script
    from slime_v031_parser import parse

    env = {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "0", "TINY": str(tmp_path), "OUT": str(tmp_path),
           "WARM": str(tmp_path / "sft")}
    reading = read_script(REPO / script, None, env)
    assert reading.invocations, script
    for invocation in reading.invocations:
        args = parse([w.text for w in invocation.argv])
        if invocation.entry == "train_async.py":
            assert not args.colocate


@pytest.mark.parametrize("page", PAGES)
def test_every_slime_flag_block_of_the_pages_is_parsed(page):
    body = text(page)
    marked = {m.start("body") for m in MARKED_BLOCK.finditer(body)}
    unmarked = []
    for match in BASH_BLOCK.finditer(body):
        if match.start("body") in marked:
            continue
        script = _strip_comments(match["body"])
        if ARRAY.search(script) or re.search(r"train(_async)?\.py", script):
            unmarked.append(match["body"].splitlines()[0])
    assert unmarked == [], f"{page}: launch flags not checked against slime's parser"


def test_the_parser_refuses_an_unknown_and_a_deprecated_flag():
    from slime_v031_parser import SlimeRejects

    page, _, spec, body = SNIPPETS[0]
    with pytest.raises(SlimeRejects, match="--rollout-batchsize"):
        parse_snippet(page, spec, body, ["--rollout-batchsize", "4"])
    with pytest.raises(SlimeRejects, match="deprecated"):
        parse_snippet(page, spec, body, ["--sglang-cuda-graph-max-bs", "8"])


# The refusals the pages promise: (page, what the page says, flags added to the template the page's
# first snippet starts from, slime's words when it stops).
REFUSALS = [
    ("on-policy-distillation.md", "`--use-opd` needs `--opd-type`", ["--use-opd"], "--opd-type must be specified"),
    ("on-policy-distillation.md", "`megatron` needs `--opd-teacher-load`", ["--use-opd", "--opd-type", "megatron"],
     "--opd-teacher-load is required"),
    ("on-policy-distillation.md", "`sglang` refuses `--opd-teacher-load`",
     ["--use-opd", "--opd-type", "sglang", "--opd-teacher-load", "/root/t"], "should not be set"),
    ("on-policy-distillation.md", "`--opd-teacher-load` without `--use-opd` is refused",
     ["--opd-teacher-load", "/root/t"], "--use-opd is not enabled"),
    ("partial-finetuning.md", "The two flags exclude each other",
     ["--freeze-params-name-list", "embedding", "--only-train-params-name-list", "experts"],
     "You can only specify ONE of"),
    ("eval.md", "`--eval-interval` without any dataset stops slime at start-up", [],
     "Evaluation datasets must be configured"),
    ("deployment-topology.md", "slime refuses `disk` without it",
     ["--update-weight-transport", "disk"], "requires --update-weight-disk-dir"),
    ("deployment-topology.md", "`--update-weight-mode delta` is refused with `--colocate`",
     ["--update-weight-mode", "delta", "--update-weight-transport", "disk", "--update-weight-disk-dir", "/d",
      "--update-weight-local-checkpoint-dir", "/l"], "not supported with --colocate"),
    ("sglang-deployment.md", "`--sglang-config` excludes `--prefill-num-servers`",
     ["--rollout-num-gpus", "8", "--sglang-config", "/root/sglang/pd.yaml", "--prefill-num-servers", "1"],
     "mutually exclusive"),
    ("sglang-deployment.md", "`--enable-mtp-training` needs `--mtp-num-layers` (slime checks)",
     ["--enable-mtp-training"], "mtp_num_layers must be set"),
    ("agentic-rl.md", "stops slime at start-up on any other value",
     ["--router-policy", "consistent_hashing"], "invalid choice: 'consistent_hashing'"),
    ("vlm.md", "`--multimodal-keys` must be valid JSON", ["--multimodal-keys", "{image: images}"],
     "--multimodal-keys"),
    ("fully-async.md", "**`--colocate` is refused** by `train_async.py`", ["--colocate"], "not args.colocate"),
]


@pytest.mark.parametrize(("page", "claim", "extra", "error"), REFUSALS, ids=[r[1][:40] for r in REFUSALS])
def test_slime_refuses_what_the_pages_say_it_refuses(page, claim, extra, error):
    from slime_v031_parser import SlimeRejects

    assert flat(claim) in flat(text(page)), f"{page} no longer says: {claim}"
    _, _, spec, _ = next(s for s in SNIPPETS if s[0] == page)
    with pytest.raises((SlimeRejects, AssertionError), match=re.escape(error)):
        parse_snippet(page, spec, "", extra)


def test_an_unknown_key_in_an_eval_config_stops_slime():
    from slime_v031_parser import SlimeRejects

    assert "stops the start with a `TypeError`" in flat(text("eval.md"))
    _, _, spec, body = next(s for s in SNIPPETS if s[0] == "eval.md")
    page_yaml = files_of("eval.md")["/root/eval/eval.yaml"]
    from slime_v031_parser import parse

    argv, _ = snippet_argv("eval.md", spec, body)
    args = parse(argv, {"/root/eval/eval.yaml": page_yaml})
    assert [d.name for d in args.eval_datasets] == ["aime", "gpqa"]
    gpqa = args.eval_datasets[1]
    # dataset key, then defaults:, then the --eval-* flag, then --rollout-*
    assert (gpqa.temperature, gpqa.top_p, gpqa.max_response_len, gpqa.n_samples_per_eval_prompt) == (0.6, 0.7, 16384, 2)
    with pytest.raises(SlimeRejects, match="TypeError"):
        parse(argv, {"/root/eval/eval.yaml": page_yaml.replace("rm_type: gpqa", "rm_type: gpqa\n      judge: x")})


def test_sglang_config_of_the_page_is_valid_for_slimes_loader():
    """slime's SglangConfig (v0.3.1 sglang_config.py, run for real) reads the page's YAML, resolves each
    model, and the GPUs add up to --rollout-num-gpus (the check in _resolve_sglang_config)."""
    from slime_check.tools.upstream_sources import exec_source

    page = "sglang-deployment.md"
    spec, body = next((s, b) for p, _, s, b in SNIPPETS if p == page and "sglang-config" in b)
    args = parse_snippet(page, spec, body)
    source = (FIXTURES / "slime_sources/v0.3.1/slime/backends/sglang_utils/sglang_config.py").read_text()
    import yaml

    module = exec_source("slime_v031_sglang_config", source, "sglang_config.py", {"yaml": yaml})
    sys.modules.pop("slime_v031_sglang_config", None)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(files_of(page)["/root/sglang/pd.yaml"])
        f.flush()
        config = module.SglangConfig.from_yaml(f.name)
    for model in config.models:
        model.resolve(args)
    assert config.total_num_gpus == args.rollout_num_gpus
    actor, judge = config.models
    assert actor.has_pd_disaggregation and actor.update_weights is True and judge.update_weights is False
    assert "sglang_config total GPUs" in excerpt("slime/ray/rollout.py")


# ----------------------------------------------------------------------------- memory arithmetic

GIB = 2**30
H100_MIB = 81_559


def shape(model: str) -> dict:
    script = (SLIME_SCRIPTS / "models" / f"{model}.sh").read_text()

    def num(flag):
        return int(re.search(rf"{flag}\s+\"?(?:\$\{{\w+:-)?(\d+)", script)[1])

    return {
        "layers": num("--num-layers"), "hidden": num("--hidden-size"), "ffn": num("--ffn-hidden-size"),
        "heads": num("--num-attention-heads"), "groups": num("--num-query-groups"), "head_dim": num("--kv-channels"),
        "vocab": num("--vocab-size"), "tied": "--untie-embeddings-and-output-weights" not in script,
    }


def parameters(s: dict) -> int:
    h, kv = s["hidden"], s["head_dim"]
    per_layer = (2 * h * s["heads"] * kv + 2 * h * s["groups"] * kv + 3 * h * s["ffn"]  # Q,O; K,V; SwiGLU
                 + 2 * h + 2 * kv)  # two RMSNorms, Q/K norms
    return s["layers"] * per_layer + s["vocab"] * h * (1 if s["tied"] else 2) + h


def template_values(name: str) -> dict:
    script = (TEMPLATES / name).read_text()

    def value(flag):
        return float(re.search(rf"{flag} ([\d.]+)", script)[1])

    nodes = int(re.search(r"NUM_NODES=\$\{NUM_NODES:-(\d+)\}", script)[1]) if "NUM_NODES" in script else 1
    return {
        "gpus": 8 * nodes, "tp": int(value("--tensor-model-parallel-size")),
        "pp": int(value("--pipeline-model-parallel-size")), "cp": int(value("--context-parallel-size")),
        "engine_tp": int(value("--rollout-num-gpus-per-engine")), "mem": value("--sglang-mem-fraction-static"),
        "max_tokens": int(value("--max-tokens-per-gpu")), "max_response": int(value("--rollout-max-response-len")),
        "sequences": int(value("--rollout-batch-size")) * int(value("--n-samples-per-prompt")),
    }


def memory_rows(model: str, template: str) -> dict[str, str]:
    s, t = shape(model), template_values(template)
    p = parameters(s)
    shard = p / (t["tp"] * t["pp"])
    dp = t["gpus"] // (t["tp"] * t["pp"] * t["cp"])
    weights, grads, adam = 2 * shard, 4 * shard, 12 * shard / dp
    kv_token = 2 * s["layers"] * s["groups"] * s["head_dim"] * 2
    kv_token_gpu = 2 * s["layers"] * max(1, s["groups"] // t["engine_tp"]) * s["head_dim"] * 2
    pool = t["mem"] * H100_MIB * 2**20
    engine_weights = 2 * p / t["engine_tp"]
    engines = t["gpus"] // t["engine_tp"]
    return {
        "parameters, billions": f"{p / 1e9:.2f}",
        "training: weights per GPU, GiB": f"{weights / GIB:.1f}",
        "training: gradients per GPU, GiB": f"{grads / GIB:.1f}",
        "training: Adam state per GPU, GiB": f"{adam / GIB:.1f}",
        "training: model states per GPU with Adam on the GPU, GiB": f"{(weights + grads + adam) / GIB:.1f}",
        "training: model states per GPU with `--optimizer-cpu-offload`, GiB": f"{(weights + grads) / GIB:.1f}",
        "training: logits of one micro-batch if fp32, GiB": f"{t['max_tokens'] * s['vocab'] / t['tp'] * 4 / GIB:.1f}",
        "SGLang: static pool at `--sglang-mem-fraction-static 0.7`, GiB": f"{pool / GIB:.1f}",
        "SGLang: engine weights per GPU, GiB": f"{engine_weights / GIB:.1f}",
        "SGLang: KV bytes per token (whole model), KiB": f"{kv_token / 1024:.0f}",
        "SGLang: KV bytes per token per GPU, KiB": f"{kv_token_gpu / 1024:.0f}",
        "SGLang: KV pool per engine, thousand tokens": f"{(pool - engine_weights) / kv_token_gpu / 1000:.0f}",
        "rollout: response tokens per engine if all run to the length limit, thousand":
            f"{t['sequences'] / engines * t['max_response'] / 1000:.0f}",
        "host: CPU weight copies per node (actor + reference), GiB": f"{2 * weights * 8 / GIB:.1f}",
        "host: CPU Adam state per node with `--optimizer-cpu-offload`, GiB": f"{adam * 8 / GIB:.1f}",
    }


def test_memory_arithmetic_is_recomputed_from_slimes_model_scripts_and_the_templates():
    body = text("memory-sizing.md")
    table = body.split("## Worked numbers", 1)[1].split("\n## ", 1)[0]
    rows = {cells[0]: cells[1:] for line in table.splitlines() if line.startswith("| ")
            if (cells := [c.strip() for c in line.strip("|").split("|")]) and cells[0] != "quantity"
            and not set(cells[0]) <= set("-")}
    small = memory_rows("qwen3-4B", "run-qwen3-4B-grpo-8gpu.sh")
    large = memory_rows("qwen3-32B", "run-qwen3-32B-grpo-multinode.sh")
    assert set(rows) == set(small), set(rows) ^ set(small)
    wrong = {k: (rows[k], (small[k], large[k])) for k in small if rows[k] != [small[k], large[k]]}
    assert wrong == {}
    # the prose reads the table
    host = [float(large[k]) for k in large if k.startswith("host: ")]
    assert f"about {sum(host):.0f} GiB of host RAM" in flat(body)
    assert f"~{small['SGLang: KV pool per engine, thousand tokens']}k" in body
    assert "arithmetic, not a measurement" in body
    # 4B tied, 32B untied, as slime's scripts say; 4.02 and 32.76 billion match the published sizes (4.0B, 32.8B)
    assert shape("qwen3-4B")["tied"] and not shape("qwen3-32B")["tied"]


# ----------------------------------------------------------------------------- claims pinned to slime's lines

# (page, what the page says, slime file, the line that makes it true)
PINS = [
    ("memory-sizing.md", "`use_distributed_optimizer = True` and `bf16 = not fp16`",
     "slime/backends/megatron_utils/arguments.py", "args.use_distributed_optimizer = True"),
    ("memory-sizing.md", "Every training rank keeps pinned CPU copies", "slime/utils/tensor_backper.py",
     "pin_memory=True"),
    ("memory-sizing.md", "the reference model's when `--kl-coef` is not 0 or `--use-kl-loss` is set",
     "slime/ray/placement_group.py", "with_ref=actor_args.kl_coef != 0 or actor_args.use_kl_loss"),
    ("memory-sizing.md", "plus the teacher's with `--opd-type megatron`", "slime/ray/placement_group.py",
     'with_opd_teacher=actor_args.use_opd and actor_args.opd_type == "megatron"'),
    ("memory-sizing.md", "always the actor's", "slime/backends/megatron_utils/actor.py",
     'self.weights_backuper.backup("actor")'),
    ("memory-sizing.md", "old-actor copies with `--keep-old-actor`", "slime/backends/megatron_utils/actor.py",
     'self.load_other_checkpoint("old_actor", args.load)'),
    ("deployment-topology.md", "max(actor GPUs, `--rollout-num-gpus`)", "slime/ray/placement_group.py",
     "return max(actor_num_gpus, args.rollout_num_gpus), 0"),
    ("deployment-topology.md", "actor GPUs + N; engines take the GPUs after the actor's",
     "slime/ray/placement_group.py", "return actor_num_gpus + args.rollout_num_gpus, actor_num_gpus"),
    ("deployment-topology.md", "`result[\"critic\"] = result[\"actor\"]`", "slime/ray/placement_group.py",
     'result["critic"] = result["actor"] if args.use_critic else None'),
    ("deployment-topology.md", "`train_async.py` refuses `--colocate` (`assert not args.colocate`)",
     "train_async.py", "assert not args.colocate"),
    ("deployment-topology.md", "CUDA IPC handles (`UpdateWeightFromTensor`)", "slime/backends/megatron_utils/actor.py",
     "update_weight_cls = UpdateWeightFromTensor"),
    ("deployment-topology.md", "`perf/wait_time_ratio`", "slime/utils/train_metric_utils.py",
     'log_dict["perf/wait_time_ratio"]'),
    ("sglang-deployment.md", "Ray then places only the actor's GPUs", "slime/ray/placement_group.py",
     "return actor_num_gpus, actor_num_gpus"),
    ("fully-async.md", "`ValueError(\"fully-async rollout doesn't support evaluation mode\")`",
     "slime/rollout/fully_async_rollout.py", "fully-async rollout doesn't support evaluation mode"),
    ("fully-async.md", "It asserts `args.rollout_global_dataset`", "slime/rollout/fully_async_rollout.py",
     "assert args.rollout_global_dataset"),
    ("fully-async.md", "`--sglang-server-concurrency` (default 512) × number of engines",
     "slime/rollout/fully_async_rollout.py", "args.sglang_server_concurrency * get_rollout_num_engines(args)"),
    ("fully-async.md", "goes back to the data buffer", "slime/rollout/fully_async_rollout.py",
     "self.data_buffer.add_samples([result])"),
    ("fully-async.md", "live in the standard rollout (`generate_rollout_async`)", "slime/rollout/sglang_rollout.py",
     "load_function(args.dynamic_sampling_filter_path)"),
    ("debugging-hangs.md", "`httpx.Timeout(None)`", "slime/utils/http_utils.py", "timeout=httpx.Timeout(None)"),
    ("debugging-hangs.md", "kills an engine that does not answer", "slime/utils/health_monitor.py",
     "self._kill_engine(rollout_engine_id=rollout_engine_id)"),
    ("debugging-hangs.md", "`Router launched at IP:PORT`", "slime/ray/rollout.py", 'f"Router launched at {router_ip}'),
    ("debugging-hangs.md", "sleeps forever after start-up", "slime/rollout/sleep_rollout.py", "time.sleep(3600)"),
    ("eval.md", "the `args.num_rollout == 0` branch of `train.py`", "train.py",
     "if args.num_rollout == 0 and args.eval_interval is not None:"),
    ("eval.md", "pass@k is computed with the global `--n-samples-per-eval-prompt`", "slime/ray/rollout.py",
     "group_size=args.n_samples_per_eval_prompt"),
    ("eval.md", "returns True to replace slime's logging", "slime/ray/rollout.py",
     "if custom_log_func(rollout_id, args, data, extra_metrics):"),
    ("on-policy-distillation.md", "returns 0.0 for every sample", "slime/rollout/on_policy_distillation.py",
     "scalar_rewards = [0.0] * len(samples)"),
    ("on-policy-distillation.md", "it receives the student's token ids", "slime/rollout/on_policy_distillation.py",
     '"input_ids": sample.tokens'),
    ("on-policy-distillation.md", "A_t − opd_kl_coef × (log p_student(t) − log p_teacher(t))",
     "slime/backends/megatron_utils/loss.py", "advantages[i] = adv - args.opd_kl_coef * reverse_kl"),
    ("on-policy-distillation.md", "requires `not args.use_opd`", "slime/backends/megatron_utils/actor.py",
     "and not self.args.use_opd"),
    ("vlm.md", "`<image>`, `<video>`, `<audio>`", "slime/utils/types.py", 'placeholder="<image>"'),
    ("vlm.md", "\"Multimodal data count mismatch\"", "slime/utils/data.py", "Multimodal data count mismatch"),
    ("vlm.md", "(\"Not enough image data\"", "slime/utils/data.py", "Not enough {mt.name} data"),
    ("vlm.md", "The processor is loaded from `--hf-checkpoint`", "slime/rollout/data_source.py",
     "load_processor(args.hf_checkpoint"),
    ("low-precision.md", "passes `hf_config.quantization_config` to the weight updater",
     "slime/backends/megatron_utils/actor.py", 'quantization_config=getattr(self.hf_config, "quantization_config"'),
    ("low-precision.md", "slime sets `NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1` for its Ray actors unless you set it",
     "slime/ray/actor_group.py",
     '"NVTE_FP8_BLOCK_SCALING_FP32_SCALES": os.environ.get("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "1")'),
    ("sglang-deployment.md", "or the rollout manager stops (`_resolve_sglang_config`", "slime/ray/rollout.py",
     "assert actual == expected"),
    ("agentic-rl.md", "but only when `--router-policy` is `consistent_hashing`", "slime/rollout/sglang_rollout.py",
     'if getattr(args, "router_policy", None) == "consistent_hashing":'),
    ("agentic-rl.md", "a UUID, in `generate_and_rm_group`", "slime/rollout/sglang_rollout.py",
     "sample.session_id = str(uuid.uuid4())"),
    ("agentic-rl.md", "sets `.reward` on a list and fails with `AttributeError`", "slime/rollout/sglang_rollout.py",
     "if args.group_rm:\n        return sample"),
    ("agentic-rl.md", "it passes sid as X-SMG-Routing-Key", "slime/agent/adapters/common.py",
     '{"X-SMG-Routing-Key": session_id}'),
    ("agentic-rl.md", "`finish_session` takes `base_sample`", "slime/agent/adapters/common.py", "base_sample,"),
    ("partial-finetuning.md", "matches one of the patterns (`re.search`)",
     "slime/backends/megatron_utils/model_provider.py", "if re.search(pattern, name):"),
    ("partial-finetuning.md", "The SFT rollout takes one sample per prompt", "slime/rollout/sft_rollout.py",
     "(sample,) = sample"),
    ("partial-finetuning.md", "cannot evaluate", "slime/rollout/sft_rollout.py", "assert not evaluation"),
    ("partial-finetuning.md", "the data loader would render the messages into one string", "slime/utils/data.py",
     "tokenize=False"),
    ("partial-finetuning.md", "and `distill_qwen`", "slime/utils/mask_utils.py",
     'self.tokenizer_type == "distill_qwen"'),
]


def excerpt(path: str) -> str:
    return (EXCERPTS / (path + ".txt")).read_text(encoding="utf-8")


@pytest.mark.parametrize(("page", "claim", "path", "line"), PINS, ids=[f"{p[0]}:{p[1][:30]}" for p in PINS])
def test_page_claims_are_pinned_to_slime_v031_lines(page, claim, path, line):
    assert flat(claim) in flat(text(page)), f"{page} no longer says: {claim}"
    assert line in excerpt(path), f"slime v0.3.1 {path} no longer has: {line}"


def test_coverage_excerpts_are_verbatim_slime_v031():
    git_dir = os.environ.get("SLIME_GIT") or "/work/.mirror/THUDM+slime/repo"
    if not Path(git_dir).exists():
        pytest.skip("no slime mirror here (set SLIME_GIT to compare the excerpts with it)")
    for file in EXCERPTS.rglob("*.txt"):
        blocks = re.split(r"^# >>> slime v0\.3\.1 (\w+) (\S+) (\d+)-(\d+)\n", file.read_text(), flags=re.M)[1:]
        for commit, path, start, end, body in zip(*[iter(blocks)] * 5, strict=True):
            source = subprocess.run(["git", "-C", git_dir, "show", f"{commit}:{path}"], capture_output=True,
                                    text=True, check=True).stdout.splitlines(keepends=True)
            assert "".join(source[int(start) - 1:int(end)]) == body, f"{path} {start}-{end}"


# ----------------------------------------------------------------------------- the flag-mention report


def slime_own_flags() -> dict[str, tuple[str, ...]]:
    from slime_common.registry import load_registry

    return {f.flags[0]: f.flags for f in load_registry("v0.3.1").flags if f.source == "slime"}


def excused() -> dict[str, str]:
    rows = re.findall(r"^\| `(--[a-z0-9-]+)` \| (.*?) \|$", NOT_COVERED.read_text(encoding="utf-8"), re.M)
    return dict(rows)


def mentioned() -> set[str]:
    flag_uses, _ = all_uses()
    return {u.flag for u in flag_uses if u.where != NOT_COVERED.relative_to(REPO).as_posix()}


def report() -> tuple[list[str], list[str], list[str]]:
    """(slime flags the skill names, flags excused in the table, flags neither names nor excuses)."""
    named = mentioned()
    own = slime_own_flags()
    covered = sorted(f for f, spellings in own.items() if set(spellings) & named)
    left_out = excused()
    unaccounted = sorted(f for f in own if f not in covered and f not in left_out)
    return covered, sorted(left_out), unaccounted


def test_every_slime_flag_is_named_in_the_skill_or_excused_with_a_reason():
    own = slime_own_flags()
    assert f"defines {len(own)} flags of its own" in flat(NOT_COVERED.read_text(encoding="utf-8"))
    covered, left_out, unaccounted = report()
    assert unaccounted == [], "slime flags neither named in the skill nor listed in flags-not-covered.md"
    assert set(left_out) <= set(own), "flags-not-covered.md lists flags that are not slime's own"
    assert set(left_out) & set(covered) == set(), "named in the skill: drop their rows from flags-not-covered.md"
    assert all(reason.strip() for reason in excused().values())


def main() -> None:
    covered, left_out, unaccounted = report()
    total = len(slime_own_flags())
    print(f"slime v0.3.1's own flags: {total}; named in the skill: {len(covered)}; "
          f"left out with a reason: {len(left_out)}; unaccounted: {len(unaccounted)}")
    for flag, reason in excused().items():
        print(f"  left out  {flag}: {reason}")
    for flag in unaccounted:
        print(f"  MISSING   {flag}")
    sys.exit(1 if unaccounted else 0)


if __name__ == "__main__":
    main()
