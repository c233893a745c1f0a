"""A hook's missing import names the package and the outside service behind it (slime's tau-bench and
strands examples stop here on a machine without their packages)."""

from __future__ import annotations

from types import SimpleNamespace

from slime_check.outside_services import describe, explain_missing, missing_modules, top_level_imports

TAU_LIKE = """
import json
import os
from tau_bench.envs import get_env
from sglang_tool_parser import parse_tools
from . import sibling_relative
from slime.utils.types import Sample
"""
PARSER = "from sglang.srt.function_call.function_call_parser import FunctionCallParser\n"


def test_top_level_imports_in_order_without_relative_ones(tmp_path):
    hook = tmp_path / "generate_with_tau.py"
    hook.write_text(TAU_LIKE)
    assert top_level_imports(hook) == ["json", "os", "tau_bench", "sglang_tool_parser", "slime"]


def test_missing_modules_skips_the_standard_library_and_the_hooks_own_folder(tmp_path):
    hook = tmp_path / "generate_with_tau.py"
    hook.write_text(TAU_LIKE)
    (tmp_path / "sglang_tool_parser.py").write_text(PARSER)
    # the module beside it is read too; this interpreter has no `slime` (the rehearsal's layer provides it)
    assert missing_modules(hook) == ["tau_bench", "sglang", "slime"]
    assert missing_modules(tmp_path / "sglang_tool_parser.py") == ["sglang"]


def test_the_message_names_the_package_and_the_llm_api_behind_it(tmp_path):
    hook = tmp_path / "generate_with_tau.py"
    hook.write_text(TAU_LIKE + "import litellm\n")
    (tmp_path / "sglang_tool_parser.py").write_text(PARSER)
    line = explain_missing("ModuleNotFoundError: No module named 'tau_bench'", hook)
    assert line.startswith("tau_bench is tau-bench") and "LLM API" in line and "GEMINI_API_KEY" in line
    assert "it also imports sglang, litellm, missing too" in line and "litellm is litellm" in line
    assert "smoke --with slime" in line  # sglang's entry: where it can be rehearsed
    assert "slime" not in line.split("it also imports")[1]  # the compat layer speaks for slime.* itself


def test_a_gpu_only_package_says_where_it_can_be_rehearsed():
    assert "smoke --with slime" in describe("sglang.srt.function_call")
    assert describe("strands").startswith("strands is strands-agents (pip install strands-sglang==0.4.2")
    assert describe("some_private_lib") == "some_private_lib is not installed where the hooks run"


def test_other_errors_are_left_alone():
    assert explain_missing("ValueError: bad reward") is None
    assert explain_missing("No module named 'slime.agent.sandbox'") is None


def test_the_preflight_finding_names_the_service(tmp_path):
    from slime_check.hook_check import preflight_hooks, write_hooks
    from slime_rehearse.smoke_launch import run_env

    (tmp_path / "generate_with_tau.py").write_text(TAU_LIKE.replace("from . import sibling_relative\n", "")
                                                   + "async def generate(args, sample, sampling_params):\n"
                                                     "    return sample\n")
    (tmp_path / "sglang_tool_parser.py").write_text(PARSER + "def parse_tools(*a):\n    return []\n")
    hooks = {"generate": ("--custom-generate-function-path", "generate_with_tau.generate")}
    out = tmp_path / "out"
    config = write_hooks(hooks, out)
    env = run_env(SimpleNamespace(env={"PYTHONPATH": str(tmp_path)}, out=out, target=None),
                  SimpleNamespace(env={}, target=None), config, compat=True)
    findings, _ = preflight_hooks(hooks, env, config)
    assert [(f.id, f.status.value) for f in findings] == [("smoke.hook_import", "FAIL")]
    assert "tau_bench is tau-bench" in findings[0].finding and "GEMINI_API_KEY" in findings[0].finding
