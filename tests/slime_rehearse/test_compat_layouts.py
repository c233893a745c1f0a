"""The slime compatibility namespace serves the module layout of the slime a job targets.

slime #2298 (in main after v0.3.1) moved slime.utils.{logging_utils, metric_utils, ...} to
slime.observability.*. The table in slime_rehearse/compat/layouts.py says which name each slime has; the
namespace serves the target's name, refuses the other one with where the module went, and
``layout_findings`` reads the same from a hook's source. Without slime's source the table is checked
against the committed module listing (tests/fixtures/slime_layouts/, README there); with the git
mirror (or SLIME_GIT_DIR) the listing is regenerated and must be byte-identical.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from slime_rehearse.compat import ROOT as COMPAT_ROOT
from slime_rehearse.compat import TARGET_ENV, layout_findings, layouts
from slime_rehearse.compat.layouts import MAIN, MODULES, V031, explain, explain_import_error

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "slime_layouts" / "modules.json"
SLIME_GIT = Path(os.environ.get("SLIME_GIT_DIR", "/work/.mirror/THUDM+slime/repo"))
COMMITS = {V031: "a6272da0d4f3d0a08520c99a2f3b4f6c887960dc", MAIN: "624b824a898ab0ec1fcb4d373004c7f3852bf515"}
TRACE_FUNCTIONS = ("bind_trace", "bind_trace_carrier", "build_sglang_meta_trace_attrs", "export_trace",
                   "import_trace", "trace_event", "trace_function", "trace_next_attempt", "trace_span")

MAIN_HOOK = '''
from slime.observability.trace_utils import build_sglang_meta_trace_attrs, trace_function, trace_span


@trace_function("reward", target="sample")
async def reward(args, sample, **kwargs):
    with trace_span(sample, "verify", attrs={"label": sample.label}) as span:
        span.update(build_sglang_meta_trace_attrs({"prompt_tokens": 3, "finish_reason": {"type": "stop"}}))
    return float(sample.response.strip() == sample.label)
'''
V031_HOOK = MAIN_HOOK.replace("slime.observability.trace_utils", "slime.utils.trace_utils")


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return path


def _env(target: str | None, *paths) -> dict:
    env = {k: v for k, v in os.environ.items() if k != TARGET_ENV}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(COMPAT_ROOT), str(REPO / "reference_impl")])
    if target:
        env[TARGET_ENV] = target
    return env


def _run(code: str, target: str | None, *paths) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=_env(target, *paths))


# ---------------------------------------------------------------------------------------------
# the table against slime's module listing (committed; regenerated from the mirror where present)
# ---------------------------------------------------------------------------------------------


def _listing() -> dict:
    return json.loads(FIXTURE.read_text())


def test_known_targets_are_the_registrys_slimes():
    from slime_common.registry import KNOWN_SLIMES

    assert layouts.TARGETS == tuple(KNOWN_SLIMES)


def test_every_row_of_the_table_matches_slimes_modules():
    modules = {target: set(_listing()[target]["modules"]) for target in layouts.TARGETS}

    def present(name, target):  # a module, or a package holding modules
        return name in modules[target] or any(m.startswith(name + ".") for m in modules[target])

    for row in MODULES:
        for target in layouts.TARGETS:
            name = row.name_in(target)
            other = MAIN if target == V031 else V031
            if name is not None:
                assert present(name, target), (row, target)
                assert not present(name, other) or row.name_in(other) == name, (row, other)
        assert row.prs and all(pr.startswith("#") for pr in row.prs), row


def test_the_table_lists_every_module_one_slime_has_and_the_other_lacks():
    v031, main = (set(_listing()[t]["modules"]) for t in (V031, MAIN))
    for target, only in ((V031, v031 - main), (MAIN, main - v031)):
        for name in sorted(only):
            other = MAIN if target == V031 else V031
            assert explain(name, other) is not None, f"{name} is only in slime {target}; the table misses it"
            assert explain(name, target) is None, name
    for name in sorted(v031 & main):  # a module both have is never refused
        assert explain(name, V031) is None and explain(name, MAIN) is None, name


def _git(*args) -> str:
    return subprocess.run(["git", "-C", str(SLIME_GIT), *args], capture_output=True, text=True, check=True).stdout


def _have_slime() -> bool:
    try:
        return all(_git("rev-parse", "--verify", "--quiet", f"{c}^{{commit}}").strip() for c in COMMITS.values())
    except (OSError, subprocess.CalledProcessError):
        return False


def _trace_signatures(commit: str, path: str) -> dict[str, list[str]]:
    import ast

    tree = ast.parse(_git("show", f"{commit}:{path}"))
    return {n.name: [a.arg for a in n.args.posonlyargs + n.args.args + n.args.kwonlyargs]
            for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in TRACE_FUNCTIONS}


def listing_from_git() -> str:
    """The fixture's text, from slime's source: every module of the slime package at each commit, and
    the parameters of slime's public trace helpers (the module the namespace serves under both names)."""
    out: dict = {"about": "slime's Python modules at each known slime, and the parameters of "
                          "slime's trace helpers; written by "
                          "tests/slime_rehearse/test_compat_layouts.py::listing_from_git"}
    trace_paths = {V031: "slime/utils/trace_utils.py", MAIN: "slime/observability/trace_utils.py"}
    for target, commit in COMMITS.items():
        names = set()
        for path in _git("ls-tree", "-r", "--name-only", commit, "slime").split():
            if path.endswith(".py"):
                names.add(path[:-3].removesuffix("/__init__").replace("/", "."))
        out[target] = {"commit": commit, "modules": sorted(names),
                       "trace_utils": _trace_signatures(commit, trace_paths[target])}
    return json.dumps(out, indent=1) + "\n"


@pytest.mark.skipif(not _have_slime(), reason=f"slime's source is not at {SLIME_GIT}; set SLIME_GIT_DIR to a "
                    "slime git clone to regenerate the module listing")
def test_the_committed_listing_regenerates_byte_identical_from_slimes_source():
    assert FIXTURE.read_text() == listing_from_git()


def test_the_trace_helpers_take_slimes_parameters():
    from slime_rehearse.compat.backing import trace_utils

    for target in layouts.TARGETS:
        theirs = _listing()[target]["trace_utils"]
        assert sorted(theirs) == sorted(TRACE_FUNCTIONS), target
        ours = {name: [p.name for p in inspect.signature(getattr(trace_utils, name)).parameters.values()]
                for name in theirs}
        assert ours == theirs, target


# ---------------------------------------------------------------------------------------------
# the namespace at run time, through smoke's preflight (the import the rehearsal does first)
# ---------------------------------------------------------------------------------------------


def _preflight(tmp_path: Path, target: str | None, hook_path: str) -> tuple[list, dict]:
    from slime_check.hook_check import preflight_hooks, write_hooks
    from slime_rehearse.smoke_launch import run_env

    hooks = {"rm": ("--custom-rm-path", hook_path)}
    out = tmp_path / "out"
    config = write_hooks(hooks, out)
    opts = SimpleNamespace(env={"PYTHONPATH": str(tmp_path)}, out=out, target=target)
    job = SimpleNamespace(env={})
    env = run_env(opts, job, config, compat=True)
    assert env.get(TARGET_ENV) == target
    return preflight_hooks(hooks, env, config)


def test_a_main_hook_importing_slime_observability_rehearses_under_a_main_target(tmp_path):
    _write(tmp_path, "main_hook_q", MAIN_HOOK)
    findings, _ = _preflight(tmp_path, MAIN, "main_hook_q.reward")
    assert [(f.id, f.status.value) for f in findings] == [("smoke.hook_import", "PASS")], findings
    # and it runs: the hook's spans land on the sample's trace, as slime records them
    done = _run("""
        import asyncio
        from slime_ref.utils.hooks import load_function
        from slime.utils.types import Sample
        reward = load_function("main_hook_q.reward", "--custom-rm-path")
        sample = Sample(index=4, group_index=1, response=" 8", label="8")
        print(asyncio.run(reward(None, sample)))
        print([(e["type"], e["name"], e.get("attrs")) for e in sample.trace["events"]])
        print(sample.trace["sample_id"], sample.trace["group_id"], len({e["trace_id"] for e in sample.trace["events"]}))
    """, MAIN, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    score, events, ids = done.stdout.splitlines()
    assert score == "1.0"
    assert events == str([("span_start", "reward", None), ("span_start", "verify", {"label": "8"}),
                          ("span_end", "verify", {"prompt_tokens": 3, "finish_reason": "stop"}),
                          ("span_end", "reward", None)])
    assert ids == "4 1 1"


def test_a_v031_import_under_a_main_target_is_reported_as_moved(tmp_path):
    _write(tmp_path, "old_hook_q", V031_HOOK)
    findings, _ = _preflight(tmp_path, MAIN, "old_hook_q.reward")
    assert len(findings) == 1 and findings[0].status.value == "FAIL", findings
    message = findings[0].finding
    assert message.startswith("--custom-rm-path old_hook_q.reward cannot be loaded: ")
    assert ("slime.utils.trace_utils moved to slime.observability.trace_utils in slime #2298, so slime "
            "main@624b824 has no slime.utils.trace_utils") in message
    assert "import from slime.observability.trace_utils" in message and "--slime-version v0.3.1" in message
    assert "is not provided by slime-check's slime compatibility layer" not in message


def test_under_a_v031_target_slime_observability_is_not_in_v031_and_the_v031_name_rehearses(tmp_path):
    _write(tmp_path, "main_hook_q", MAIN_HOOK)
    _write(tmp_path, "old_hook_q", V031_HOOK)
    findings, _ = _preflight(tmp_path, V031, "main_hook_q.reward")
    assert len(findings) == 1 and findings[0].status.value == "FAIL", findings
    message = findings[0].finding
    assert "slime.observability is not in slime v0.3.1: slime #2298 added it after v0.3.1" in message
    assert "trace_utils" in message and "import them from slime.utils" in message
    assert "--slime-version main" in message
    findings, _ = _preflight(tmp_path, V031, "old_hook_q.reward")
    assert [(f.id, f.status.value) for f in findings] == [("smoke.hook_import", "PASS")], findings


def test_each_moved_or_removed_module_is_refused_by_name_and_the_target_name_is_served():
    statements = {
        MAIN: ["from slime.utils import timer", "import slime.utils.train_metric_utils",
               "from slime.utils.train_dump_utils import save_debug_train_data", "import slime.utils.wandb_utils",
               "from slime.observability import trace_utils", "import slime.observability.timer"],
        V031: ["from slime.observability.trace_utils import trace_span", "import slime.observability.rollout_metrics",
               "import slime.utils.accelerator", "from slime.utils import trace_utils", "import slime.utils.timer"],
    }
    out = {}
    for target, stmts in statements.items():
        done = _run(f"""
            for stmt in {stmts!r}:
                try:
                    exec(stmt)
                    print("ok")
                except ImportError as e:
                    print(type(e).__name__, "|", e)
        """, target)
        assert done.returncode == 0, done.stderr[-3000:]
        out[target] = done.stdout.splitlines()
    timer, metric, dump, wandb, served, not_backed = out[MAIN]
    assert timer.startswith("ModuleNotFoundError | slime.utils.timer moved to slime.observability.timer in slime #2298")
    assert metric.startswith("ModuleNotFoundError | slime.utils.train_metric_utils was removed from slime in #2298")
    assert "log_perf_data in slime.observability.train_metric_utils" in metric
    assert "moved to slime.observability.train_data_utils in slime #2266 and #2298" in dump
    assert "moved to slime.observability.wandb_utils in slime #2298" in wandb
    assert served == "ok"
    # a main name slime-check does not back is the layer's usual message, not a "moved" one
    assert "slime.observability.timer is not provided by slime-check's slime compatibility layer" in not_backed
    assert "(it has: trace_utils)" in not_backed
    observability, rollout_metrics, accelerator, served, not_backed = out[V031]
    assert "slime.observability is not in slime v0.3.1" in observability
    assert "slime.observability is not in slime v0.3.1" in rollout_metrics  # the package is what fails first
    assert "slime.utils.accelerator is not in slime v0.3.1: slime #2216 added it after v0.3.1" in accelerator
    assert served == "ok"
    assert "slime.utils.timer is not provided by slime-check's slime compatibility layer" in not_backed
    assert "trace_utils" in not_backed


def test_without_a_target_both_names_are_served():
    done = _run("""
        from slime.utils.trace_utils import trace_span as a
        from slime.observability.trace_utils import trace_span as b
        print(a is b)
    """, None)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-3000:]


def test_a_real_slimes_bare_import_error_gets_where_the_module_went():
    bare = "ModuleNotFoundError: No module named 'slime.utils.trace_utils'"
    assert "moved to slime.observability.trace_utils in slime #2298" in explain_import_error(bare, MAIN)
    assert explain_import_error(bare, V031) is None  # v0.3.1 has it: the cause is elsewhere
    assert explain_import_error(bare, None) is None
    assert explain_import_error("No module named 'my_rewards'", MAIN) is None
    assert "not in slime v0.3.1" in explain_import_error("No module named 'slime.observability'", V031)


# ---------------------------------------------------------------------------------------------
# the static check: hook files' imports, without running them
# ---------------------------------------------------------------------------------------------


def test_layout_findings_name_the_module_the_pr_and_the_import_to_use(tmp_path):
    old = _write(tmp_path, "old_style", """
        import slime.utils.timer
        from slime.utils.types import Sample
        from slime.utils import logging_utils, misc

        def f():
            from slime.utils.train_metric_utils import log_perf_data_raw
    """)
    new = _write(tmp_path, "new_style", """
        from slime.observability.trace_utils import trace_span
        from slime.observability import wandb_utils
        import slime.observability.rollout_metrics as rm
        from slime.utils.types import Sample
    """)
    plain = _write(tmp_path, "plain", "from slime.utils.types import Sample\nimport os\n")
    broken = _write(tmp_path, "broken", "def (:\n")

    on_main = layout_findings([old, new, plain, broken, tmp_path / "missing.py"], MAIN)
    assert {f.id for f in on_main} == {"config.hook_layout"} and {f.status.value for f in on_main} == {"FAIL"}
    lines = sorted(f.finding for f in on_main)
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{old}:2: slime.utils.timer moved to slime.observability.timer in slime #2298")
    assert lines[1].startswith(f"{old}:4: slime.utils.logging_utils moved to slime.observability.logging_utils")
    assert lines[2].startswith(f"{old}:7: slime.utils.train_metric_utils was removed from slime in #2298")

    on_v031 = layout_findings([old, new, plain], V031)
    lines = sorted(f.finding for f in on_v031)
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{new}:2: slime.observability.trace_utils is slime main's name (slime #2298, "
                               "after v0.3.1); slime v0.3.1 has it as slime.utils.trace_utils")
    assert lines[1].startswith(f"{new}:3: slime.observability.wandb_utils is slime main's name")
    assert lines[2].startswith(f"{new}:4: slime.observability.rollout_metrics is not in slime v0.3.1: slime "
                               "#2298 added it")
    assert layout_findings([old, new], None) == [] and layout_findings([old, new], "v9") == []
    assert layout_findings([plain], MAIN) == [] and layout_findings([plain], V031) == []


def test_the_trace_helpers_never_fail_the_code_they_wrap():
    from slime_ref.types import Sample
    from slime_rehearse.compat.backing import trace_utils as T

    @T.trace_function("plain")
    def plain(x):
        return x + 1

    assert plain(1) == 2  # no traceable argument: runs untraced
    with T.trace_span("not a sample", "s") as span:
        assert span == "not a sample"
    sample = Sample(index=0, group_index=0)

    @T.trace_function("boom", target="sample")
    async def boom(sample):
        raise ValueError("bad")

    with pytest.raises(ValueError):
        asyncio.run(boom(sample))
    end = sample.trace["events"][-1]
    assert end["type"] == "span_end" and end["attrs"] == {"error_type": "ValueError", "error_message": "bad"}
    handle = T.trace_next_attempt(sample)
    assert handle.attempt == 1 and sample.trace["events"][-1]["name"] == "attempt_start"
    again = T.import_trace(T.export_trace(handle))
    assert again.trace_id == handle.trace_id and again.carrier is not sample.trace
