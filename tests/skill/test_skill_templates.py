"""The launch templates' own shell logic, run for real against stub programs.

`nvidia-smi`, `ray`, `python`/`python3` and `slime-check` are stubs on a PATH that holds nothing else
but a few text tools (grep, wc, ...): each stub records its arguments and answers as a host with or
without NVLink would. No Ray, GPU or
trainer is touched; what is checked is the order of the steps and what would be submitted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from skill_docs import REPO

TEMPLATES = REPO / "skill" / "templates"
SINGLE_NODE = ["run-qwen3-4B-grpo-8gpu.sh", "run-qwen2.5-0.5B-grpo-small.sh"]
MULTI_NODE = "run-qwen3-32B-grpo-multinode.sh"
TEXT_TOOLS = ("grep", "wc", "sed", "awk", "cat", "head", "tr", "seq")

PCIE_TOPOLOGY = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPHB\t0-15\t0
GPU1\tPHB\t X \t0-15\t0

Legend:

  X    = Self
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  NV#  = Connection traversing a bonded set of # NVLinks
"""
NVLINK_TOPOLOGY = PCIE_TOPOLOGY.replace("\tPHB\t", "\tNV18\t")

STUB = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps([name, *sys.argv[1:]]) + "\\n")
if name == "nvidia-smi" and sys.argv[1:2] == ["topo"]:
    sys.stdout.write(os.environ["STUB_TOPOLOGY"])
if name == "ray" and sys.argv[1:2] == ["status"]:
    sys.exit(1)  # no Ray cluster runs here
if name in os.environ.get("STUB_FAIL", "").split():
    sys.exit(1)
"""


def run_template(tmp_path, name, *, topology=PCIE_TOPOLOGY, nvidia_smi=True, **env):
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for program in ("ray", "python", "python3", "slime-check", *(["nvidia-smi"] if nvidia_smi else [])):
        stub = stubs / program
        stub.write_text(STUB.format(python=sys.executable))
        stub.chmod(0o755)
    for tool in TEXT_TOOLS:  # harmless text tools a launch script may pipe through, the real ones
        if shutil.which(tool) and not (stubs / tool).exists():
            (stubs / tool).symlink_to(shutil.which(tool))
    log = tmp_path / "calls.jsonl"
    log.unlink(missing_ok=True)
    result = subprocess.run(
        [shutil.which("bash"), str(TEMPLATES / name)],
        check=False, capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={"PATH": str(stubs), "HOME": str(tmp_path), "STUB_LOG": str(log), "STUB_TOPOLOGY": topology, **env},
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


def step(calls, *prefix) -> int:
    return next(i for i, call in enumerate(calls) if call[: len(prefix)] == list(prefix))


def submitted(calls) -> tuple[dict, list[str]]:
    """The runtime env and the train.py arguments of the `ray job submit`."""
    (submit,) = [c for c in calls if c[:3] == ["ray", "job", "submit"]]
    env = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    return env["env_vars"], submit[submit.index("--") + 1:]


@pytest.mark.parametrize("name", SINGLE_NODE)
@pytest.mark.parametrize(("topology", "nvidia_smi", "nvls"), [
    (PCIE_TOPOLOGY, True, "0"), (NVLINK_TOPOLOGY, True, "1"), ("", False, "0"),
], ids=["pcie-only", "nvlink", "no-nvidia-smi"])
def test_single_node_template_submits_on_any_topology(tmp_path, name, topology, nvidia_smi, nvls):
    result, calls = run_template(tmp_path, name, topology=topology, nvidia_smi=nvidia_smi, NUM_ROLLOUT="2")
    assert result.returncode == 0, result.stdout + result.stderr
    # checks first, then NVLink detection, and only then Ray
    assert step(calls, "slime-check", "prereqs") < step(calls, "slime-check", "config") < step(calls, "ray")
    if nvidia_smi and "NCCL_NVLS_ENABLE" in (TEMPLATES / name).read_text():
        assert step(calls, "nvidia-smi", "topo") < step(calls, "ray", "start")
    env, train = submitted(calls)
    assert train[0] == "python3" and train[1].endswith("/train.py")
    assert train[train.index("--num-rollout") + 1] == "2"
    if "NCCL_NVLS_ENABLE" in env:
        assert env["NCCL_NVLS_ENABLE"] == nvls


def test_small_template_passes_extra_args_last_so_that_they_win(tmp_path):
    # the skill's one-GPU test: NUM_GPUS=1 NUM_ROLLOUT=3 EXTRA_ARGS=--check-weight-update-equal
    result, calls = run_template(tmp_path, "run-qwen2.5-0.5B-grpo-small.sh", NUM_GPUS="1", NUM_ROLLOUT="3",
                                 EXTRA_ARGS="--check-weight-update-equal --rollout-max-response-len 512")
    assert result.returncode == 0, result.stdout + result.stderr
    _, train = submitted(calls)
    assert train[-3:] == ["--check-weight-update-equal", "--rollout-max-response-len", "512"]
    assert train[train.index("--actor-num-gpus-per-node") + 1] == "1"
    _, plain = submitted(run_template(tmp_path, "run-qwen2.5-0.5B-grpo-small.sh", NUM_GPUS="1")[1])
    assert plain[-1] != "--check-weight-update-equal" and "--check-weight-update-equal" not in plain


@pytest.mark.parametrize("name", [*SINGLE_NODE, MULTI_NODE])
def test_failed_checks_start_nothing(tmp_path, name):
    result, calls = run_template(tmp_path, name, STUB_FAIL="slime-check", MASTER_ADDR="10.0.0.1", NODE_RANK="0")
    assert result.returncode == 1 and "slime-check prereqs failed" in result.stderr
    assert [c[0] for c in calls] == ["slime-check"]


def test_multinode_head_checks_detects_nvlink_and_submits(tmp_path):
    result, calls = run_template(tmp_path, MULTI_NODE, MASTER_ADDR="10.0.0.1", NODE_RANK="0", NODE_IP="10.0.0.1",
                                 SOCKET_IFNAME="eth1", NUM_NODES="4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert step(calls, "slime-check", "prereqs") < step(calls, "slime-check", "config") < step(calls, "nvidia-smi")
    assert step(calls, "nvidia-smi") < step(calls, "ray", "start", "--head")
    head = calls[step(calls, "ray", "start", "--head")]
    assert head[head.index("--node-ip-address") + 1] == "10.0.0.1"
    env, train = submitted(calls)
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["MASTER_ADDR"] == "10.0.0.1"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert train[train.index("--actor-num-nodes") + 1] == "4" and "--colocate" in train


def test_multinode_worker_joins_and_submits_nothing(tmp_path):
    result, calls = run_template(tmp_path, MULTI_NODE, MASTER_ADDR="10.0.0.1", NODE_RANK="1")
    assert result.returncode == 0, result.stdout + result.stderr
    ray_calls = [c for c in calls if c[0] == "ray"]
    assert ray_calls == [["ray", "start", "--address=10.0.0.1:6379", "--num-gpus", "8", "--disable-usage-stats"]]
    assert not any(c[:2] == ["slime-check", "config"] for c in calls)  # only the head lints the script
    assert any(c[:2] == ["slime-check", "prereqs"] for c in calls)  # every node checks its machine


def test_multinode_without_master_addr_starts_nothing(tmp_path):
    result, calls = run_template(tmp_path, MULTI_NODE, NODE_RANK="0")
    assert result.returncode == 2 and "MASTER_ADDR" in result.stderr
    assert calls == []


@pytest.mark.parametrize("name", [*SINGLE_NODE, MULTI_NODE])
def test_templates_call_no_program_beyond_the_stubs(tmp_path, name):
    # the stub PATH holds nothing else, so a program a template needs that is not stubbed shows here
    result, _ = run_template(tmp_path, name, MASTER_ADDR="10.0.0.1", NODE_RANK="0")
    assert result.returncode == 0 and "command not found" not in result.stderr, result.stderr
