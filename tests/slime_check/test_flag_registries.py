"""The two shipped flag registries (slime v0.3.1 and main@624b824), and flags read from a user's slime.

Sources are the slime files committed under tests/fixtures/slime_sources (their README names the
commits); nothing here needs a slime mirror, Megatron-LM, the SGLang wheel or torch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slime_check.config_lint import lint_script
from slime_check.findings import Status
from slime_check.flag_source import registry_for_checkout
from slime_check.tools import registry_derivation, upstream_sources
from slime_common.errors import UserError
from slime_common.registry import KNOWN_SLIMES, NEWEST_KNOWN, load_registry, registry_data

ROOT = Path(__file__).resolve().parents[2]
SOURCES = Path(__file__).parents[1] / "fixtures" / "slime_sources"
DATA = ROOT / "reference_impl" / "slime_common" / "data"
V031_COMMIT = "a6272da0d4f3d0a08520c99a2f3b4f6c887960dc"
MAIN_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"

# Every flag slime's main added between v0.3.1 and 624b824 (git diff of slime's argument files
# and docker/patch/latest); none was removed.
MAIN_ONLY = {
    "--freeze-indexer",
    "--megatron-deepgemm-forward-layers",
    "--megatron-deepgemm-forward-modules",
    "--megatron-deepgemm-moe-forward-layers",
    "--megatron-deepgemm-moe-forward-modules",
    "--ci-train-rollout-logprob-abs-diff-threshold",
    "--sglang-enable-fp32-moe-router",
}


def regenerate(tmp_path: Path, *args: str) -> bytes:
    out = tmp_path / "flags.json"
    subprocess.run(
        [sys.executable, "-m", "slime_check.tools.gen_flag_registry", "--base", str(DATA / "slime_v0.3.1_flags.json"),
         *args, "--out", str(out)],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    )
    return out.read_bytes()


def test_v031_registry_regenerates_byte_identical(tmp_path):
    # slime's own records are rebuilt from v0.3.1's argument files; upstream ones are carried.
    got = regenerate(tmp_path, "--slime", str(SOURCES / "v0.3.1"), "--slime-commit", V031_COMMIT)
    assert got == (DATA / "slime_v0.3.1_flags.json").read_bytes()


def test_main_registry_regenerates_byte_identical(tmp_path):
    got = regenerate(tmp_path, "--slime", str(SOURCES / "main-624b824"), "--slime-commit", MAIN_COMMIT,
                     "--version", "main", "--arg-utils", str(SOURCES / "sglang-0.5.15.post1"))
    assert got == (DATA / "slime_main-624b824_flags.json").read_bytes()


def test_derivation_needs_sglang_arg_utils_for_a_new_patch_field(tmp_path):
    out = tmp_path / "flags.json"
    proc = subprocess.run(
        [sys.executable, "-m", "slime_check.tools.gen_flag_registry", "--base", str(DATA / "slime_v0.3.1_flags.json"),
         "--slime", str(SOURCES / "main-624b824"), "--slime-commit", MAIN_COMMIT, "--version", "main",
         "--out", str(out)],
        capture_output=True, text=True,
    )
    assert proc.returncode != 0 and "sglang-deterministic.patch" in proc.stderr and "--arg-utils" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_derivation_stops_on_a_new_megatron_patch_that_adds_a_flag(tmp_path):
    tree = tmp_path / "slime"
    shutil.copytree(SOURCES / "main-624b824", tree)
    patch = tree / "docker" / "patch" / "latest" / "megatron-sglang-aligned.patch"
    patch.write_text(patch.read_text() + '+    group.add_argument("--brand-new-megatron-flag", action="store_true")\n')
    with pytest.raises(registry_derivation.DerivationError, match="megatron-sglang-aligned.patch adds Megatron flags"):
        registry_derivation.derive(registry_data("v0.3.1"), upstream_sources.SourceTree(str(tree)), "main",
                                   MAIN_COMMIT, None)


def test_known_slimes_and_labels():
    assert KNOWN_SLIMES == ("v0.3.1", "main@624b824") and NEWEST_KNOWN == "main@624b824"
    main = load_registry("main@624b824")
    assert main.label == "main@624b824" and main.meta["slime"]["label"] == "main@624b824"
    assert main.meta["slime"]["commit"] == MAIN_COMMIT and "main@624b824" in main.flags_from
    assert load_registry("main@624b824") is main and load_registry() is load_registry("v0.3.1")
    with pytest.raises(ValueError, match="v0.3.1, main@624b824"):
        load_registry("v0.4.0")


def test_main_adds_exactly_the_new_flags_and_removes_none():
    v031, main = load_registry("v0.3.1"), load_registry("main@624b824")
    assert set(main.names()) - set(v031.names()) == MAIN_ONLY
    assert set(v031.names()) - set(main.names()) == set()
    assert not MAIN_ONLY & set(v031.names())
    assert main.meta["pins"]["megatron_lm"] == v031.meta["pins"]["megatron_lm"]
    assert main.meta["pins"]["sglang_patches"][-1] == "docker/patch/latest/sglang-deterministic.patch"


@pytest.mark.parametrize("name,source,parser,type_,default,nargs", [
    ("--freeze-indexer", "slime", "main", None, False, 0),
    ("--megatron-deepgemm-forward-layers", "slime", "main", "int", None, "+"),
    ("--megatron-deepgemm-moe-forward-modules", "slime", "main", None, None, "+"),
    ("--ci-train-rollout-logprob-abs-diff-threshold", "slime", "main", "float", 0.1, None),
    ("--sglang-enable-fp32-moe-router", "sglang-patch", "sglang", None, False, 0),
])
def test_main_only_flags(name, source, parser, type_, default, nargs):
    flag = load_registry("main@624b824").lookup(name)
    assert (flag.source, flag.parser, flag.type, flag.default, flag.nargs) == (source, parser, type_, default, nargs)


def test_main_keeps_slimes_default_resets():
    main = load_registry("main@624b824")
    assert main.lookup("--lr").default == 1e-6 and main.lookup("--router-balance-abs-threshold").default == 10
    assert "--sglang-model-path" not in main and main.suggest("--freeze-indexers") == ["--freeze-indexer"]


def unknown_flags(script: Path, reg) -> list[str]:
    return [f.finding for report in lint_script(script, slime_dir=SOURCES, reg=reg) for f in report.findings
            if f.id == "config.unknown_flag" and f.status is Status.FAIL]


@pytest.mark.parametrize("target", KNOWN_SLIMES)
def test_slimes_own_scripts_use_only_known_flags(target):
    scripts = sorted((SOURCES / "scripts").glob("run-*.sh"))
    assert len(scripts) == 23
    reg = load_registry(target)
    assert {s.name: unknown_flags(s, reg) for s in scripts} == {s.name: [] for s in scripts}


def test_a_main_only_flag_is_unknown_to_v031_only(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "models").symlink_to(SOURCES / "scripts" / "models")
    script = tmp_path / "scripts" / "run-qwen3-4B.sh"
    text = (SOURCES / "scripts" / "run-qwen3-4B.sh").read_text()
    script.write_text(text.replace("GRPO_ARGS=(\n", "GRPO_ARGS=(\n   --freeze-indexer\n", 1))
    assert unknown_flags(script, load_registry("main@624b824")) == []
    found = unknown_flags(script, load_registry("v0.3.1"))
    assert len(found) == 1 and found[0].startswith("--freeze-indexer ")


# ---------------------------------------------------------------------------------------------
# The user's own checkout
# ---------------------------------------------------------------------------------------------


def checkout(tmp_path: Path, which: str) -> Path:
    tree = tmp_path / which
    shutil.copytree(SOURCES / which / "slime", tree / "slime")
    return tree


def test_checkout_of_main_knows_mains_flags(tmp_path):
    reg, notes = registry_for_checkout(checkout(tmp_path, "main-624b824"), "v0.3.1", label="main@624b824")
    assert reg.label == "main@624b824" and str(tmp_path) in reg.flags_from
    for name in MAIN_ONLY - {"--sglang-enable-fp32-moe-router"}:  # that one is a Docker patch: from base
        assert name in reg, name
    assert reg.lookup("--freeze-indexer").source == "slime"
    assert "slime/utils/arguments.py" in notes[0] and "v0.3.1" in notes[-1]
    # Over main's own registry, a main checkout reads as exactly that registry.
    over_main, _ = registry_for_checkout(tmp_path / "main-624b824", "main@624b824")
    assert [vars(f) for f in over_main.flags] == [vars(f) for f in load_registry("main@624b824").flags]


def test_checkout_of_v031_does_not_know_mains_flags(tmp_path):
    reg, _ = registry_for_checkout(checkout(tmp_path, "v0.3.1"), "main@624b824")
    assert "--freeze-indexer" not in reg and "--megatron-deepgemm-forward-layers" not in reg
    assert "--rollout-batch-size" in reg and reg.label == "main@624b824"
    over_v031, _ = registry_for_checkout(tmp_path / "v0.3.1", "v0.3.1")
    assert [vars(f) for f in over_v031.flags] == [vars(f) for f in load_registry("v0.3.1").flags]


def test_checkout_reads_the_users_own_edits(tmp_path):
    tree = checkout(tmp_path, "main-624b824")
    args = tree / "slime" / "utils" / "arguments.py"
    args.write_text(args.read_text().replace('"--freeze-indexer"', '"--freeze-the-indexer"'))
    reg, _ = registry_for_checkout(tree, "main@624b824")
    assert "--freeze-the-indexer" in reg and "--freeze-indexer" not in reg


def test_checkout_that_cannot_be_read_falls_back_and_says_so(tmp_path):
    tree = checkout(tmp_path, "main-624b824")
    (tree / "slime" / "backends" / "sglang_utils" / "arguments.py").write_text("def broken(:\n")
    reg, notes = registry_for_checkout(tree, "main@624b824")
    assert "--freeze-indexer" in reg and "--sglang-enable-fp32-moe-router" in reg
    assert any("could not read" in n and "sglang_utils/arguments.py" in n for n in notes)
    (tree / "slime" / "backends" / "sglang_utils" / "arguments.py").unlink()
    _, notes = registry_for_checkout(tree, "main@624b824")
    assert any("is missing" in n for n in notes)


def test_not_a_slime_checkout_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"--slime-dir .*slime/utils/arguments.py"):
        registry_for_checkout(tmp_path, "v0.3.1")
    with pytest.raises(ValueError, match="known: v0.3.1, main@624b824"):
        registry_for_checkout(SOURCES / "main-624b824", "v9")


def test_checkout_is_read_without_importing_torch_or_slime(tmp_path):
    code = (
        "import sys, json\n"
        "from slime_check.flag_source import registry_for_checkout\n"
        f"reg, _ = registry_for_checkout({str(SOURCES / 'main-624b824')!r}, 'v0.3.1')\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'slime', 'megatron', 'sglang', 'yaml')]\n"
        "print(json.dumps({'freeze': '--freeze-indexer' in reg, 'heavy': heavy}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout) == {"freeze": True, "heavy": []}


def fake_sglang(root: Path, body: str) -> Path:
    """A folder holding a tiny ``sglang`` package whose ServerArgs defines the flags ``body`` adds."""
    srt = root / "sglang" / "srt"
    srt.mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("raise RuntimeError('sglang must not be imported')\n")
    (root / "sglang" / "version.py").write_text('__version__ = "9.9.9"\n')
    (srt / "server_args.py").write_text(
        "import argparse\nimport torch  # never imported: a stub stands in\n\n"
        "class ServerArgs:\n    @staticmethod\n    def add_cli_args(parser):\n" + body
    )
    return root


def test_installed_sglang_flags_replace_the_shipped_ones(tmp_path):
    body = ("        for i in range(300):\n            parser.add_argument(f'--knob-{i}', type=int, default=i)\n"
            "        parser.add_argument('--mem-fraction-static', type=float, default=None)\n"
            "        parser.add_argument('--model-path', type=str)\n")
    root = fake_sglang(tmp_path / "site", body)
    before = set(sys.modules)
    reg, notes = registry_for_checkout(SOURCES / "main-624b824", "main@624b824", sglang_root=root)
    assert not {m for m in set(sys.modules) - before if m.split(".")[0] in ("sglang", "torch", "slime")}
    knob = reg.lookup("--sglang-knob-7")
    assert knob.source == "sglang" and knob.default == 7 and knob.upstream_flags == ("--knob-7",)
    assert "--sglang-mem-fraction-static" in reg and "--sglang-model-path" not in reg  # slime's skip list
    assert "--sglang-enable-deterministic-inference" not in reg and "--router-policy" in reg
    assert "--freeze-indexer" in reg and "--sglang-server-concurrency" in reg
    assert any("sglang 9.9.9" in n for n in notes) and notes[-1].startswith("Megatron-LM and router flags")


@pytest.mark.parametrize("body,why", [
    ("        parser.add_argument('--only-one')\n", "too few"),
    ("        parser.add_argument(\n", "could not read"),
])
def test_installed_sglang_that_cannot_be_trusted_falls_back(tmp_path, body, why):
    root = fake_sglang(tmp_path / "site", body)
    reg, notes = registry_for_checkout(SOURCES / "main-624b824", "main@624b824", sglang_root=root)
    assert [vars(f) for f in reg.flags if f.parser == "sglang"] == \
        [vars(f) for f in load_registry("main@624b824").flags if f.parser == "sglang"]
    assert any(why in n for n in notes)


def test_installed_sglang_that_breaks_slimes_wrapper_falls_back(tmp_path):
    root = fake_sglang(tmp_path / "site", "        raise RuntimeError('needs a GPU')\n")
    reg, notes = registry_for_checkout(SOURCES / "main-624b824", "main@624b824", sglang_root=root)
    assert "--sglang-mem-fraction-static" in reg and "--freeze-indexer" in reg
    assert any("could not be used" in n for n in notes)
    assert not any("could not read" in n for n in notes)  # slime's own file is fine
