"""The flag registry: what it holds, the lookup API, and the generator's building blocks."""

from __future__ import annotations

import argparse
import enum
import json
import zipfile

import pytest

from slime_check.tools import flag_records, upstream_sources
from slime_common.registry import load_registry


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def test_pins_and_sources(reg):
    assert reg.meta["slime"] == {"version": "v0.3.1", "commit": "a6272da0d4f3d0a08520c99a2f3b4f6c887960dc",
                                 "label": "v0.3.1"}
    assert reg.label == "v0.3.1" and load_registry("v0.3.1") is reg
    assert reg.meta["pins"]["megatron_lm"].startswith("1dcf0da")
    assert reg.meta["pins"]["sglang"] == "0.5.15.post1"
    counts = {}
    for flag in reg.flags:
        counts[flag.source] = counts.get(flag.source, 0) + 1
    # Orders of magnitude, so a generator that silently drops a source fails here.
    assert counts["megatron"] > 500 and counts["sglang"] > 300 and counts["slime"] > 150 and counts["router"] > 50
    assert counts["megatron-patch"] >= 1 and counts["sglang-patch"] >= 1


@pytest.mark.parametrize("name,source,parser,type_,default", [
    ("--rollout-batch-size", "slime", "main", "int", None),
    ("--n-samples-per-prompt", "slime", "main", "int", 1),
    ("--lr", "megatron", "main", "float", 1e-6),  # slime resets Megatron's default
    ("--tensor-model-parallel-size", "megatron", "main", "int", 1),
    ("--sglang-mem-fraction-static", "sglang", "sglang", "float", None),
    ("--sglang-server-concurrency", "slime", "sglang", "int", 512),
    ("--router-policy", "router", "sglang", "str", "cache_aware"),
    ("--router-balance-abs-threshold", "router", "sglang", "int", 10),  # slime's set_defaults
    ("--use-gated-attention", "megatron-patch", "main", None, False),
    ("--post-self-attn-layernorm", "megatron-patch", "main", None, False),
    ("--sglang-release-hicache", "sglang-patch", "sglang", None, False),
    ("--train-backend", "preparse", "preparse", "str", "megatron"),
])
def test_known_flags(reg, name, source, parser, type_, default):
    flag = reg.lookup(name)
    assert flag is not None, name
    assert flag.source == (source if source != "preparse" else "slime") and flag.parser == parser
    assert flag.type == type_ and flag.default == default


def test_flag_details(reg):
    assert reg.lookup("--rollout-batch-size").required
    assert reg.lookup("--lr").megatron_default is None
    assert reg.lookup("--eval-prompt-data").nargs == "+"
    assert reg.lookup("--rollout-sample-hook-path").repeatable
    offload = reg.lookup("--no-offload-train")
    assert offload is reg.lookup("--offload-train") and offload.action == "boolean_optional"
    assert reg.lookup("--router-policy").choices == ("random", "round_robin", "cache_aware", "power_of_two", "manual")
    assert reg.lookup("--sglang-mem-fraction-static").upstream_flags == ("--mem-fraction-static",)
    assert reg.lookup("--lr=1e-6") is reg.lookup("--lr")
    assert reg.lookup("--sglang-cuda-graph-max-bs").deprecated


def test_flags_slime_sets_itself_are_not_offered(reg):
    for skipped in ("--sglang-model-path", "--sglang-tp-size", "--sglang-tensor-parallel-size", "--sglang-port",
                    "--sglang-nnodes", "--sglang-enable-memory-saver", "--sglang-random-seed"):
        assert skipped not in reg, skipped


def test_flags_that_do_not_exist(reg):
    # Flags a popular but stale slime guide uses; slime v0.3.1 has none of them.
    for stale in ("--async-buffer-size", "--max-turns", "--tis-threshold", "--sglang-router-strategy",
                  "--true-on-policy-mode"):
        assert stale not in reg, stale


def test_hook_flags(reg):
    hooks = reg.hook_flags()
    assert len(hooks) == 24 and all(reg.lookup(name).source == "slime" for name in hooks)
    assert {"--custom-rm-path", "--rollout-function-path", "--data-source-path", "--rollout-sample-hook-path",
            "--custom-update-weight-post-write-path"} <= set(hooks)
    assert not {"--custom-config-path", "--megatron-config-path", "--data-path"} & set(hooks)


@pytest.mark.parametrize("typo,expected", [
    ("--rollout-batchsize", "--rollout-batch-size"),
    ("--rollout_batch_size", "--rollout-batch-size"),
    ("--mem-fraction-static", "--sglang-mem-fraction-static"),
    ("--kl-loss_coef", "--kl-loss-coef"),
    ("--max-tokens-per-gpus", "--max-tokens-per-gpu"),
    ("--eps-clip-hihg", "--eps-clip-high"),
    ("--colocated", "--colocate"),
])
def test_suggest(reg, typo, expected):
    assert reg.suggest(typo)[0] == expected


def test_abbreviations_only_in_the_sglang_parser(reg):
    assert [f.name for f in reg.abbreviation_of("--sglang-mem-fraction")] == ["--sglang-mem-fraction-static"]
    assert len(reg.abbreviation_of("--sglang-enable")) > 1  # ambiguous
    assert reg.abbreviation_of("--rollout-batch") == []  # the main parser does not abbreviate


def test_registry_file_is_one_record_per_line():
    from importlib import resources

    text = resources.files("slime_common").joinpath("data", "slime_v0.3.1_flags.json").read_text()
    data = json.loads(text)
    record_lines = [line for line in text.splitlines() if line.startswith('  {"flags"')]
    assert len(record_lines) == len(data["flags"])


# ---------------------------------------------------------------------------------------------
# Generator building blocks (the full run needs the pinned upstream sources)
# ---------------------------------------------------------------------------------------------


def test_exec_source_runs_definitions_and_stubs_imports():
    source = """
import argparse
from some_gpu_runtime.kernels import fused_thing, CHOICES
import heavy_dependency as hd

DEFAULT_BACKEND = hd.backends.default()

def add_args(parser):
    parser.add_argument("--backend", type=str, default=DEFAULT_BACKEND)
    parser.add_argument("--kernel", choices=["a"] + list(CHOICES))
    parser.add_argument("--size", type=int, default=3)
    return parser
"""
    module = upstream_sources.exec_source("fake_args", source, "fake_args.py", {})
    parser = module.add_args(argparse.ArgumentParser())
    actions = flag_records.option_actions(parser)
    records = {r["flags"][0]: r for r in (flag_records.action_record(a, "main", "x") for a in actions)}
    assert records["--size"]["type"] == "int" and records["--size"]["default"] == 3
    assert records["--backend"]["default"] == {"py": "heavy_dependency.backends.default()"}
    assert records["--kernel"]["choices"] is None  # built from a stub: unknown, not ["a"]


def test_captured_parser_stops_at_parse():
    def build_and_parse():
        parser = argparse.ArgumentParser(allow_abbrev=False)
        parser.add_argument("--x", type=float, default=0.5)
        return parser.parse_known_args(["--x", "1"])

    parser = upstream_sources.captured_parser(build_and_parse)
    assert [a.option_strings for a in flag_records.option_actions(parser)] == [["--x"]]
    assert argparse.ArgumentParser().parse_known_args([])[1] == []  # parse_known_args restored


def test_to_json_keeps_plain_values_and_names_the_rest():
    class Backend(enum.Enum):
        auto = 1

    assert flag_records.to_json([1, "a", None, 2.5]) == [1, "a", None, 2.5]
    assert flag_records.to_json(Backend.auto) == {"py": "Backend.auto"}
    assert flag_records.to_json(float("inf")) == {"py": "inf"}
    assert flag_records.type_name(json.loads) == "json" and flag_records.type_name(int) == "int"


def test_patch_added_flags_reads_flags_and_dataclass_fields():
    patch = """diff --git a/megatron/core/transformer/transformer_config.py b/megatron/core/transformer/transformer_config.py
+++ b/megatron/core/transformer/transformer_config.py
+    post_mlp_layernorm: bool = False
     unchanged_field: int = 1
diff --git a/megatron/training/arguments.py b/megatron/training/arguments.py
+    group.add_argument('--use-gated-attention', action='store_true',
-    group.add_argument('--removed-flag')
"""  # noqa: E501
    assert upstream_sources.patch_added_flags(patch) == {"--post-mlp-layernorm", "--use-gated-attention"}


def test_source_tree_reads_wheels(tmp_path):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/version.py", '__version__ = "1.0"\n')
    assert upstream_sources.SourceTree(str(wheel)).read("pkg/version.py").startswith("__version__")


def test_patch_text_applies_only_the_target_file():
    original = "a = 1\nb = 2\n"
    patch = (
        "diff --git a/other.py b/other.py\n--- a/other.py\n+++ b/other.py\n@@ -1 +1 @@\n-x\n+y\n"
        "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
        "@@ -1,2 +1,3 @@\n a = 1\n+extra = True\n b = 2\n"
    )
    assert upstream_sources.patch_text(original, patch, "pkg/mod.py") == "a = 1\nextra = True\nb = 2\n"
    assert upstream_sources.patch_text(original, patch, "pkg/absent.py") == original
