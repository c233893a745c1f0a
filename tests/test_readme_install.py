"""README's install commands get the CPU build of torch wherever the CPU index answers, and still work
where it does not. Tested on the command text: pip resolves it against two local indexes, one playing
PyPI (torch 2.13.0 with a CUDA dependency, as PyPI serves it for Linux) and one playing PyTorch's CPU
index (torch 2.13.0+cpu)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def readme_command(marker: str) -> str:
    text = (REPO / "README.md").read_text()
    block = text.split(f"<!-- {marker} -->", 1)[1]
    return re.search(r"```bash\n(.+?)\n```", block, re.S).group(1)


def torch_step(command: str) -> list[str]:
    """The `pip install ... torch` step of a README command, as argv."""
    for part in command.split("&&"):
        argv = shlex.split(part)
        if argv[:2] == ["pip", "install"] and "torch" in argv:
            return argv
    raise AssertionError(f"no `pip install ... torch` step in: {command}")


@pytest.mark.parametrize("marker", ["main-command", "test-command"])
def test_each_install_command_takes_torch_from_the_cpu_index_first(marker):
    command = readme_command(marker)
    argv = torch_step(command)
    assert argv[argv.index("--extra-index-url") + 1] == CPU_INDEX
    assert argv[argv.index("-c") + 1] == "constraints-cpu.txt"  # pins torch==2.13.0
    assert "--retries" in argv  # an unreachable CPU index costs no retries with back-off
    assert command.index("torch") < command.index("-e "), "torch before the package, whose deps would pull it"


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)))
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    links = "".join(f'<a href="{p.name}">{p.name}</a>\n' for p in sorted(folder.glob("*.whl")))
    (folder / "index.html").write_text(links)


def _resolve(tmp_path: Path, cpu_index_url: str) -> str:
    pypi = tmp_path / "pypi"
    _wheel(pypi / "torch", "torch", "2.13.0", ["nvidia-cublas-cu12"])
    _wheel(pypi / "nvidia-cublas-cu12", "nvidia_cublas_cu12", "12.9.1", [])
    argv = torch_step(readme_command("main-command"))
    argv[argv.index("--extra-index-url") + 1] = cpu_index_url
    report = tmp_path / "report.json"
    # only the command's own options and the two local indexes: no pip configuration of this machine
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run([sys.executable, "-m", *argv, "--index-url", pypi.as_uri(), "--dry-run", "--ignore-installed",
                           "--report", str(report), "--quiet"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    installs = json.loads(report.read_text())["install"]
    return next(i["metadata"]["version"] for i in installs if i["metadata"]["name"] == "torch")


def test_where_the_cpu_index_answers_torch_is_the_cpu_build(tmp_path):
    cpu = tmp_path / "cpu"
    _wheel(cpu / "torch", "torch", "2.13.0+cpu", [])
    assert _resolve(tmp_path, cpu.as_uri()) == "2.13.0+cpu"


def test_where_it_does_not_answer_the_install_goes_on_from_the_package_index(tmp_path):
    assert _resolve(tmp_path, "http://127.0.0.1:9/whl/cpu") == "2.13.0"  # port 9: nothing listens
