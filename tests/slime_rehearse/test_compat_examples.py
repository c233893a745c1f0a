"""The slime names slime v0.3.1's examples use, and what slime-check's slime compatibility layer does with each.

The inventory (slime_rehearse/compat/examples_v0.3.1.json) lists, per example folder, the launch scripts,
the hook flags they pass, every ``slime.*`` name the example's code imports (at module level or inside
a function) or its scripts pass as a hook path, and the services it needs outside slime; its
``names`` table says for each name whether the layer provides it or refuses it, and why.

Without slime's source the tests check the layer against the committed inventory: every provided
name imports, every refused one raises an ImportError (or, as a hook path, a UserError) that names it
and gives the reason. With slime's source (the git mirror, or SLIME_GIT_DIR) they also check the
inventory against the examples themselves, and the provided functions against slime's signatures.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiohttp import web

from slime_ref.errors import UserError
from slime_ref.types import Sample
from slime_ref.utils import hooks
from slime_ref.utils.hooks import SLIME_BUILTINS, load_function
from slime_rehearse.compat import ROOT as COMPAT_ROOT
from slime_rehearse.compat import TARGET_ENV

REPO = Path(__file__).resolve().parents[2]
INVENTORY_PATH = REPO / "reference_impl" / "slime_rehearse" / "compat" / "examples_v0.3.1.json"
INVENTORY = json.loads(INVENTORY_PATH.read_text())
NAMES = INVENTORY["names"]
PROVIDED = sorted(n for n, e in NAMES.items() if e["status"] == "provided")
REFUSED = sorted(n for n, e in NAMES.items() if e["status"] == "refused")
HOOK_PATHS = sorted({h["path"] for e in INVENTORY["examples"].values() for h in e["hook_flags"]
                     if h["path"].split(".")[0] == "slime"})

SLIME_GIT = Path(os.environ.get("SLIME_GIT_DIR", "/work/.mirror/THUDM+slime/repo"))
TAG = "v0.3.1"


def _compat_env(*extra_paths) -> dict:
    """The PYTHONPATH a smoke run without slime gets: the compat `slime` first, then slime-ref; the
    target is v0.3.1, whose examples these are (tests/slime_rehearse/test_compat_layouts.py covers main's layout)."""
    path = [*map(str, extra_paths), str(COMPAT_ROOT), str(REPO / "reference_impl")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), TARGET_ENV: TAG}


def _run(code: str, *extra_paths) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=_compat_env(*extra_paths))


# ---------------------------------------------------------------------------------------------
# the committed inventory against the layer (no slime needed)
# ---------------------------------------------------------------------------------------------


def test_inventory_is_complete_and_consistent():
    assert len(INVENTORY["examples"]) == 13
    for example, entry in INVENTORY["examples"].items():
        assert entry["launch_scripts"], example
        assert {"outside_services", "on_slime_ref", "hook_flags", "slime_names"} <= set(entry), example
        for name, use in entry["slime_names"].items():
            assert name in NAMES, (example, name)
            assert use["status"] == NAMES[name]["status"], (example, name)
        for hook in entry["hook_flags"]:
            if hook["path"].split(".")[0] == "slime":
                assert hook["path"] in entry["slime_names"], (example, hook)
    used = {n for e in INVENTORY["examples"].values() for n in e["slime_names"]}
    assert used == set(NAMES)
    for name, entry in NAMES.items():
        assert entry["status"] in ("provided", "refused"), name
        if entry["status"] == "provided":
            assert entry["backed_by"], name
        else:  # one line each: the layer's ImportError carries them
            assert entry["reason"] and entry["with_slime"] and "\n" not in entry["reason"] + entry["with_slime"], name
            assert "slime-ref" in entry["reason"] and "--with slime" in entry["with_slime"], name


_IMPORT_EACH = """
import importlib, json, sys
results = {}
for name, kind in json.loads(sys.argv[1]):
    module, _, attr = name.rpartition(".")
    try:
        if kind == "module":
            importlib.import_module(name)
        exec(f"from {module} import {attr}")
        results[name] = "ok"
    except ImportError as e:
        results[name] = f"{type(e).__name__}: {e}"
print(json.dumps(results))
"""


def _import_each(names: list[str]) -> dict[str, str]:
    kinds = [(n, "module" if n in ("slime.utils.misc", "slime.agent.sandbox") else "attr") for n in names]
    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH, json.dumps(kinds)], capture_output=True, text=True,
                          timeout=300, env=_compat_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_provided_name_imports_from_the_compat_layer():
    results = _import_each(PROVIDED)
    assert {name: r for name, r in results.items() if r != "ok"} == {}


def test_every_refused_name_raises_an_import_error_with_its_reason():
    results = _import_each(REFUSED)
    for name in REFUSED:
        message = results[name]
        entry = NAMES[name]
        assert message.startswith(("ImportError: ", "ModuleNotFoundError: ")), (name, message)
        assert "\n" not in message
        # the line names what Python was importing: the name itself or the slime module that holds it
        named = message.split(": ", 1)[1].split(" ", 1)[0]
        assert name == named or name.startswith(named + "."), (name, message)
        assert "is not provided by slime-check's slime compatibility layer" in message
        assert entry["reason"] in message and entry["with_slime"] in message, (name, message)


def test_a_missing_slime_submodule_gets_the_layers_message_not_a_bare_module_error():
    done = _run("""
        from slime.rollout.rm_hub.math_dapo_utils import compute_score
        print("dapo", compute_score("so... Answer: 34", "34")["score"])
        from slime.rollout import sglang_rollout   # a submodule asked of its package
        print("package attribute", sglang_rollout.__name__)
        for stmt in ["from slime.rollout.rm_hub.no_such_module import f", "from slime.agent import sandbox",
                     "import slime.backends.megatron_utils.cp_utils", "from slime.agent.harness import CodexHarness",
                     "from slime.rollout import fully_async_rollout", "import slime.no_such_package"]:
            try:
                exec(stmt)
                print("imported", stmt)
            except ImportError as e:
                print(type(e).__name__, "|", e)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert "dapo 1.0" in out and "package attribute slime.rollout.sglang_rollout" in out
    errors = [line for line in out if "|" in line]
    assert len(errors) == 6 and not [line for line in out if line.startswith("imported")]
    assert all(line.startswith("ModuleNotFoundError | ") for line in errors)  # code catching that still does
    assert all("is not provided by slime-check's slime compatibility layer" in line for line in errors)
    assert "slime.rollout.rm_hub.no_such_module is not provided" in errors[0]
    assert "(it has: async_rm, batched_async_rm" in errors[0] and "math_dapo_utils" in errors[0]
    assert "slime.agent.sandbox is not provided" in errors[1] and "E2B" in errors[1]
    assert "slime.backends.megatron_utils.cp_utils is not provided" in errors[2]
    assert "context-parallel" in errors[2] and "--with slime" in errors[2]
    assert "slime.agent.harness is not provided" in errors[3]
    assert "slime.rollout.fully_async_rollout is not provided" in errors[4] and "fully-async" in errors[4]
    assert "slime.no_such_package is not provided" in errors[5]
    assert "(it has: agent, backends, rollout, utils)" in errors[5]


def test_slime_hook_paths_the_examples_pass_load_or_refuse_with_the_reason():
    """The hook check maps slime's built-in paths without importing slime (SLIME_BUILTINS)."""
    assert HOOK_PATHS
    for path in HOOK_PATHS:
        entry = NAMES[path]
        if entry["status"] == "provided":
            assert path in SLIME_BUILTINS, path
            module, _, attr = SLIME_BUILTINS[path].rpartition(".")
            assert load_function(path, "--some-hook-path") is getattr(__import__(module, fromlist=[attr]), attr)
        else:
            with pytest.raises(UserError) as e:
                load_function(path, "--rollout-function-path")
            message = str(e.value)
            assert message.startswith(f"--rollout-function-path {path!r}: {path} is ") and "\n" not in message
            assert entry["reason"] in message and entry["with_slime"] in message, message
    assert set(hooks.SLIME_REFUSED) <= {p.rpartition(".")[0] for p in HOOK_PATHS if NAMES[p]["status"] == "refused"}


# ---------------------------------------------------------------------------------------------
# load_function: the cause of an import failure, and a fix only where one follows
# ---------------------------------------------------------------------------------------------


def test_a_hooks_own_import_error_keeps_its_cause(tmp_path):
    """retool's hook re-raises a failed slime import as "MathDapo is not installed": both must show."""
    # a slime without math_dapo_utils (an older one): the hook's import of it fails
    (tmp_path / "slime" / "rollout" / "rm_hub").mkdir(parents=True)
    for pkg in ("slime", "slime/rollout", "slime/rollout/rm_hub"):
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "retool_hook.py").write_text(
        "try:\n"
        "    from slime.rollout.rm_hub.math_dapo_utils import compute_score\n"
        "except ImportError as e:\n"
        "    raise ImportError('MathDapo is not installed') from e\n"
        "def reward_func(args, sample, **kwargs):\n"
        "    return 0.0\n")
    done = subprocess.run(
        [sys.executable, "-c", "from slime_ref.utils.hooks import load_function\n"
                               "try:\n    load_function('retool_hook.reward_func', '--custom-rm-path')\n"
                               "except Exception as e:\n    print(type(e).__name__, '|', e)\n"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "reference_impl")])})
    message = done.stdout.strip()
    assert message.startswith("UserError | --custom-rm-path 'retool_hook.reward_func': "), done.stdout + done.stderr
    assert "ImportError: MathDapo is not installed" in message
    assert "No module named 'slime.rollout.rm_hub.math_dapo_utils'" in message
    assert "use a dotted path like" not in message  # the path is fine; the cause is what to fix


def test_a_hooks_import_error_keeps_the_compat_layers_reason_as_its_cause(tmp_path):
    (tmp_path / "tis_hook.py").write_text(
        "try:\n"
        "    from slime.backends.megatron_utils.cp_utils import all_gather_with_cp\n"
        "except ImportError as e:\n"
        "    raise ImportError('the context-parallel helpers are missing') from e\n")
    done = _run("""
        from slime_ref.utils.hooks import load_function
        for path in ["tis_hook.f", "slime.rollout.rm_hub.no_such_reward"]:
            try:
                load_function(path, "--custom-tis-function-path")
            except Exception as e:
                print(type(e).__name__, "|", e)
    """, tmp_path)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    assert "ImportError: the context-parallel helpers are missing; caused by ModuleNotFoundError: " in lines[0]
    assert "slime.backends.megatron_utils.cp_utils is not provided" in lines[0]
    assert "context-parallel helper" in lines[0]
    # a name a compat package lacks is a UserError too, not an ImportError out of the hook check
    assert lines[1].startswith("UserError | --custom-tis-function-path 'slime.rollout.rm_hub.no_such_reward': ")
    assert "slime.rollout.rm_hub.no_such_reward is not provided" in lines[1]


def test_the_dotted_path_advice_is_given_only_for_a_path_that_is_not_dotted(tmp_path, monkeypatch):
    (tmp_path / "needs_dep_q.py").write_text("import not_installed_dep_q\n")
    (tmp_path / "plain_hooks_q.py").write_text("def f():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    advice = "use a dotted path like my_pkg.rewards.fn"
    for path, expected in [("needs_dep_q.f", "No module named 'not_installed_dep_q'"),
                           ("plain_hooks_q.missing", "module 'plain_hooks_q' has no attribute 'missing'"),
                           ("no_such_hooks_q.f", "put the folder that holds 'no_such_hooks_q' on PYTHONPATH")]:
        with pytest.raises(UserError) as e:
            load_function(path, "--custom-rm-path")
        assert expected in str(e.value) and advice not in str(e.value), str(e.value)
    for path in ["rewards/my.py", "reward_fn"]:
        with pytest.raises(UserError, match=advice):
            load_function(path, "--custom-rm-path")


# ---------------------------------------------------------------------------------------------
# the provided hooks and helpers behave as slime's
# ---------------------------------------------------------------------------------------------


def test_on_policy_distillation_hooks_ask_the_teacher_and_keep_the_response_log_probs():
    from slime_ref.utils.hooks import opd_post_process_rewards, opd_teacher_reward

    requests = []

    async def teacher(request):
        body = await request.json()
        requests.append(body)
        ids = body["input_ids"]  # the first token has no log-prob, as SGLang answers
        return web.json_response({"text": "", "meta_info": {
            "input_token_logprobs": [[None, ids[0], None]] + [[-0.1 * i, t, None] for i, t in enumerate(ids[1:], 1)]}})

    async def body():
        app = web.Application()
        app.router.add_post("/generate", teacher)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            args = SimpleNamespace(rm_url=f"http://127.0.0.1:{port}/generate", reward_key=None)
            sample = Sample(index=3, tokens=[11, 12, 13, 14, 15], response_length=2)
            sample.reward = await opd_teacher_reward(args, sample)
            return args, sample
        finally:
            await runner.cleanup()

    args, sample = asyncio.run(body())
    assert requests == [{"input_ids": [11, 12, 13, 14, 15], "return_logprob": True, "logprob_start_len": 0,
                         "sampling_params": {"max_new_tokens": 0, "temperature": 0, "skip_special_tokens": False}}]
    raw, rewards = opd_post_process_rewards(args, [sample])
    assert raw == rewards == [0.0]
    assert sample.teacher_log_probs == pytest.approx([-0.3, -0.4])  # the two response tokens
    with pytest.raises(UserError, match="not a teacher /generate reply"):
        opd_post_process_rewards(args, [Sample(index=0, reward=1.0, response_length=1)])
    with pytest.raises(UserError, match="--rm-url"):
        asyncio.run(opd_teacher_reward(SimpleNamespace(rm_url=None), sample))


def test_dapo_compute_score_keeps_slimes_signature_and_results():
    from slime_rehearse.compat.slime.rollout.rm_hub.math_dapo_utils import compute_score

    assert compute_score("... so the total is\nAnswer: 34", "34") == {"score": 1.0, "acc": True, "pred": "34"}
    assert compute_score("Answer: 35", "34.0")["score"] == -1.0
    assert compute_score("we get \\boxed{34}", "34", strict_box_verify=True) == {"score": 1.0, "acc": True,
                                                                                 "pred": "34"}
    assert compute_score("no box", "34", strict_box_verify=True)["acc"] is False
    with pytest.raises(ValueError):
        compute_score("Answer: 34", "x + 1")  # DAPO's labels are integers, and slime raises too


# ---------------------------------------------------------------------------------------------
# the inventory against slime v0.3.1's source (needs the mirror)
# ---------------------------------------------------------------------------------------------


def _git(*args) -> str:
    return subprocess.run(["git", "-C", str(SLIME_GIT), *args], capture_output=True, text=True, check=True).stdout


def _have_slime() -> bool:
    try:
        return bool(_git("rev-parse", "--verify", "--quiet", f"{TAG}^{{commit}}").strip())
    except (OSError, subprocess.CalledProcessError):
        return False


needs_slime = pytest.mark.skipif(not _have_slime(), reason=f"slime's source ({TAG}) is not at {SLIME_GIT}; set "
                                 "SLIME_GIT_DIR to a slime git clone to check the inventory against it")


def _hook_flags() -> set[str]:
    from slime_common.registry import load_registry

    return set(load_registry().hook_flags())


def _scan_examples() -> dict[str, dict]:
    """What each example folder of slime's source uses: launch scripts, hook flags, slime names."""
    hook_flags = _hook_flags()
    found: dict[str, dict] = {}
    for path in _git("ls-tree", "-r", "--name-only", TAG, "examples").split():
        parts = path.split("/")
        if len(parts) < 3:
            continue
        entry = found.setdefault(parts[1], {"launch_scripts": [], "hook_flags": [], "slime_names": {}})
        rel = "/".join(parts[2:])
        if not path.endswith((".py", ".sh")):
            continue
        text = _git("show", f"{TAG}:{path}")
        if path.endswith(".sh") or parts[-1].startswith("run_"):  # a launcher, shell or Python
            entry["launch_scripts"].append(rel)
            for line in text.splitlines():
                if line.strip().startswith("#"):
                    continue
                for flag, value in re.findall(r"(--[a-z0-9-]+)\s+['\"]?([A-Za-z_][\w.]*)", line):
                    if flag in hook_flags:
                        entry["hook_flags"].append({"script": rel, "flag": flag, "path": value})
                        if value.split(".")[0] == "slime":
                            entry["slime_names"].setdefault(value, set()).add(f"{rel} {flag}")
        if path.endswith(".py"):
            tree = ast.parse(text)
            aliases = {}
            names = entry["slime_names"]
            for node in ast.walk(tree):  # module level and inside functions
                if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "slime":
                    for alias in node.names:
                        names.setdefault(f"{node.module}.{alias.name}", set()).add(f"{rel}:{node.lineno}")
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] == "slime":
                            names.setdefault(alias.name, set()).add(f"{rel}:{node.lineno}")
                            if alias.asname:
                                aliases[alias.asname] = alias.name
            for node in ast.walk(tree):  # `import slime.utils.misc as U` ... U.exec_command(...)
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                    names.setdefault(f"{aliases[node.value.id]}.{node.attr}", set()).add(f"{rel}:{node.lineno}")
    return found


@needs_slime
def test_inventory_lists_what_every_example_of_slime_uses():
    found = _scan_examples()
    assert sorted(found) == sorted(INVENTORY["examples"])
    for example, seen in found.items():
        listed = INVENTORY["examples"][example]
        assert sorted(listed["launch_scripts"]) == sorted(seen["launch_scripts"]), example
        assert listed["hook_flags"] == seen["hook_flags"], example
        assert {n: sorted(u) for n, u in seen["slime_names"].items()} == \
            {n: use["used_in"] for n, use in listed["slime_names"].items()}, example


def _slime_module(module: str) -> ast.Module | None:
    base = module.replace(".", "/")
    for path in (f"{base}.py", f"{base}/__init__.py"):
        try:
            return ast.parse(_git("show", f"{TAG}:{path}"))
        except subprocess.CalledProcessError:
            continue
    return None


def _defined(tree: ast.Module) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, ast.Assign):
            names.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
    return names


@needs_slime
def test_every_inventory_name_exists_in_slime():
    for name in NAMES:
        if _slime_module(name) is not None:  # a module
            continue
        module, _, attr = name.rpartition(".")
        tree = _slime_module(module)
        assert tree is not None, f"{module} is not in slime {TAG}"
        assert attr in _defined(tree), f"{name} is not defined in slime {TAG}"


@needs_slime
def test_provided_functions_take_slimes_parameters():
    """A hook calling a provided function with slime's keywords works the same here. (Names the examples
    pass only as hook paths are called by the trainer, by position.)"""
    imported = {n for e in INVENTORY["examples"].values() for n, use in e["slime_names"].items()
                if any(":" in where for where in use["used_in"])}
    functions = {}
    for name in sorted(imported & set(PROVIDED)):
        module, _, attr = name.rpartition(".")
        tree = _slime_module(module)
        node = _defined(tree).get(attr) if tree is not None else None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[name] = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
    assert "slime.rollout.rm_hub.math_dapo_utils.compute_score" in functions
    done = _run("""
        import importlib, inspect, json, sys
        out = {}
        for name in json.loads(sys.argv[1]):
            module, _, attr = name.rpartition(".")
            fn = getattr(importlib.import_module(module), attr)
            out[name] = [p.name for p in inspect.signature(fn).parameters.values()
                         if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        print(json.dumps(out))
    """.replace("sys.argv[1]", repr(json.dumps(sorted(functions)))))
    assert done.returncode == 0, done.stderr[-3000:]
    ours = json.loads(done.stdout.strip().splitlines()[-1])
    assert {n: ours[n] for n in functions if ours[n] != functions[n]} == {}


@needs_slime
def test_dapo_compute_score_gives_slimes_values(tmp_path):
    """slime's own math_dapo_utils (standard library only) against the layer's, on the same answers."""
    (tmp_path / "slime_dapo_q.py").write_text(_git("show", f"{TAG}:slime/rollout/rm_hub/math_dapo_utils.py"))
    cases = [("Answer: 34", "34"), ("so\nAnswer: $34$ dollars", "34"), ("Answer: 1,000", "1000"),
             ("Answer: \\frac{1}{2}", "2"), ("x" * 400 + "\nAnswer: 7", "7"), ("Answer: 7\nmore text", "7.0"),
             ("the answer is \\boxed{12}", "12"), ("no answer at all", "5")]
    strict = [("we get \\boxed{12}", "12"), ("\\boxed{12} " + "y" * 120, "12"), ("\\boxed{1{2}}", "1{2}")]
    done = _run(f"""
        import json
        import slime_dapo_q as theirs
        from slime.rollout.rm_hub import math_dapo_utils as ours
        for solution, truth in {cases!r}:
            print(json.dumps([theirs.compute_score(solution, truth), ours.compute_score(solution, truth)]))
        for solution, truth in {strict!r}:
            print(json.dumps([theirs.compute_score(solution, truth, strict_box_verify=True),
                              ours.compute_score(solution, truth, strict_box_verify=True)]))
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    pairs = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(pairs) == len(cases) + len(strict)
    assert [theirs for theirs, _ in pairs] == [ours for _, ours in pairs]
