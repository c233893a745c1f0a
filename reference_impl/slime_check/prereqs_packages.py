"""``slime-check prereqs`` package checks: Python, torch, Megatron-LM, SGLang and its router, Ray,
Transformer Engine, flash-attn, numpy and transformers against slime v0.3.1's pins, and versions
known to break it.
"""

from __future__ import annotations

from slime_check import facts
from slime_check import probes as P
from slime_check.facts import version_tuple
from slime_check.findings import Finding, Status
from slime_check.prereqs_machine import (
    CONDA_DOC,
    IMAGE_DOC,
    PIN_FLASH_ATTN,
    PIN_MEGATRON,
    PIN_NUMPY,
    PIN_PYTHON,
    PIN_ROUTER,
    PIN_SCIPY,
    PIN_SGLANG,
    PIN_TE,
    PIN_TORCH,
    PIN_TRANSFORMERS,
    Machine,
)


def _pkg(m: Machine, *names: str) -> tuple[str, str] | None:
    """(name, version) of the first of ``names`` installed."""
    for name in names:
        if m.packages and facts.normalise(name) in m.packages:
            return name, m.packages[facts.normalise(name)]
    return None


def _no_packages(id_: str) -> Finding:
    return Finding(id_, Status.SKIP, "The installed Python packages could not be listed.")


def packages_python(m: Machine) -> Finding:
    id_ = "packages.python"
    out = m.probe.run(P.PYTHON)
    version = facts.parse_python_version(out.text) if out.ok else None
    if version is None:
        collect = m.probe.run(P.COLLECT_ENV)
        version = facts.parse_python_version(collect.text) if collect.ok else None
    if version is None:
        return Finding(id_, Status.SKIP, "The Python version could not be read.")
    v = version_tuple(version)
    if v < (3, 10):
        return Finding(id_, Status.FAIL, f"Python {version}: slime needs 3.10 or newer.",
                       f"Use Python {PIN_PYTHON} (slime's image and build_conda.sh).", CONDA_DOC)
    if v[:2] > (3, 12):
        return Finding(id_, Status.WARN, f"Python {version}: slime v0.3.1 is tested on 3.10-3.12 (its image uses "
                                         f"3.12).",
                       f"Use Python {PIN_PYTHON}.", CONDA_DOC)
    return Finding(id_, Status.PASS, f"Python {version} (slime's image: {PIN_PYTHON}).")


def packages_torch(m: Machine) -> Finding:
    id_ = "packages.torch"
    version, cuda = m.torch_build
    if version is None and m.packages is None:
        return _no_packages(id_)
    if version is None:
        found = _pkg(m, "torch")
        version = found[1] if found else None
    if version is None:
        return Finding(id_, Status.FAIL, "torch is not installed.", f"Use slime's image (torch {PIN_TORCH}+cu129).",
                       IMAGE_DOC)
    if cuda:
        build = f"CUDA {cuda}"
    else:  # our own section states a CPU build outright; a pip list cannot tell
        build = "CPU-only" if "+cpu" in version or m.probe.run(P.TORCH_BUILD).ok else "CUDA unknown"
    text = f"torch {version} ({build} build); slime v0.3.1 pins {PIN_TORCH} (cu129, or cu130 for Blackwell)"
    if version_tuple(version)[:2] != version_tuple(PIN_TORCH)[:2]:
        return Finding(id_, Status.WARN, text + ".", f"Install torch {PIN_TORCH} as slime's image does.", CONDA_DOC)
    if build == "CPU-only":
        return Finding(
            id_, Status.WARN, text + ": slime needs a CUDA build.", f"Install torch {PIN_TORCH}+cu129.", CONDA_DOC
        )
    return Finding(id_, Status.PASS, text + ".")


def packages_megatron(m: Machine) -> Finding:
    id_ = "packages.megatron"
    pin = f"slime v0.3.1 pins Megatron-LM {PIN_MEGATRON[:7]} with docker/patch/v0.5.15.post1/megatron.patch"
    fix_install = (f"git clone https://github.com/NVIDIA/Megatron-LM && git checkout {PIN_MEGATRON[:7]}, apply slime's "
                   "megatron.patch, `pip install -e .`, and put it on PYTHONPATH as slime's scripts do.")
    out = m.probe.run(P.MEGATRON)
    if out.ok:
        info = facts.parse_megatron(out.text)
        version = info.get("version")
        if info.get("megatron.training") == "present":
            commit = info.get("commit")
            text = f"Megatron-LM at {info.get('megatron', '?')}" + (f", megatron-core {version}" if version else "")
            if commit and not PIN_MEGATRON.startswith(commit[:7]):
                return Finding(id_, Status.WARN, f"{text}, commit {commit[:7]}; {pin}.", fix_install, IMAGE_DOC)
            return Finding(id_, Status.PASS, f"{text}" + (f", commit {commit[:7]}" if commit else "") + ".")
        checkout = info.get("checkout")
        if checkout:
            return Finding(
                id_,
                Status.WARN,
                f"megatron.training is not importable from this Python, but a Megatron-LM "
                f"checkout exists at {checkout}.",
                "slime's scripts add it with PYTHONPATH=/root/Megatron-LM "
                "in the Ray runtime env; make sure yours does.",
                IMAGE_DOC,
            )
        if info.get("megatron.core") == "present":
            return Finding(
                id_,
                Status.FAIL,
                "Only the megatron-core wheel is installed: slime imports megatron.training, "
                "which lives in a Megatron-LM checkout.",
                fix_install,
                IMAGE_DOC,
            )
        return Finding(id_, Status.FAIL, f"Megatron-LM is not installed; {pin}.", fix_install, IMAGE_DOC)
    if m.packages is None:
        return _no_packages(id_)
    found = _pkg(m, "megatron-core")
    pythonpath = (m.env or {}).get("PYTHONPATH", "")
    if "megatron" in pythonpath.lower():
        return Finding(id_, Status.WARN, f"PYTHONPATH names Megatron ({pythonpath}); the capture cannot tell its "
                                         f"commit.",
                       "Capture with `slime-check capture` to include the Megatron checkout.", IMAGE_DOC)
    if found:
        return Finding(id_, Status.WARN, f"megatron-core {found[1]} is installed; whether a Megatron-LM checkout "
                       "(megatron.training) is importable is unknown.", fix_install, IMAGE_DOC)
    return Finding(id_, Status.FAIL, f"Megatron-LM is not installed (not in the package list, not on PYTHONPATH); "
                                     f"{pin}.",
                   fix_install, IMAGE_DOC)


def _pinned(m: Machine, id_: str, names: tuple[str, ...], pin: str, what: str, missing: Status,
            missing_fix: str, same=lambda v, pin: v == pin) -> Finding:
    """A package against its pin: missing gives ``missing``; another version WARNs."""
    if m.packages is None:
        return _no_packages(id_)
    found = _pkg(m, *names)
    if found is None:
        return Finding(id_, missing, f"{names[0]} is not installed: {what}.", missing_fix, IMAGE_DOC)
    name, version = found
    if not same(version, pin):
        return Finding(id_, Status.WARN, f"{name} {version}; slime v0.3.1's image has {pin}.",
                       f"Install {names[0]}=={pin}.", IMAGE_DOC)
    return Finding(id_, Status.PASS, f"{name} {version} (pinned {pin}).")


def packages_sglang(m: Machine) -> Finding:
    return _pinned(m, "packages.sglang", ("sglang",), PIN_SGLANG, "slime's rollout engines are SGLang servers",
                   Status.FAIL, f"Use slime's image (SGLang {PIN_SGLANG} with slime's patches).")


def packages_sglang_router(m: Machine) -> Finding:
    id_ = "packages.sglang_router"
    found = _pinned(m, id_, ("sglang-router",), PIN_ROUTER, "slime starts its engines behind sglang-router",
                    Status.FAIL, f"pip install sglang-router=={PIN_ROUTER} (slime's image installs its own build).",
                    same=lambda v, pin: version_tuple(v) >= (0, 3, 0))
    if found.status is not Status.PASS:
        return found
    module = m.probe.run(P.MODULE_VERSIONS)
    versions = facts.parse_megatron(module.text) if module.ok else {}
    router_version = versions.get("sglang_router")
    if router_version and "slime" not in router_version:
        return Finding(
            id_,
            Status.WARN,
            f"sglang_router.__version__ is {router_version}, not slime's build "
            "(slime's Dockerfile asserts 'slime' in it).",
            "Install the sglang_router 0.3.2 wheel slime's Dockerfile names (zhuzilin/sgl-router).",
            IMAGE_DOC,
        )
    return found


def packages_ray(m: Machine) -> Finding:
    if m.packages is None:
        return _no_packages("packages.ray")
    found = _pkg(m, "ray")
    if found is None:
        return Finding("packages.ray", Status.FAIL, "ray is not installed: slime places every engine and trainer with "
                                                    "Ray.",
                       "pip install 'ray[default]' (slime's requirements.txt).", IMAGE_DOC)
    return Finding("packages.ray", Status.PASS, f"ray {found[1]} (slime does not pin it).")


def packages_transformer_engine(m: Machine) -> Finding:
    return _pinned(m, "packages.transformer_engine", ("transformer-engine", "transformer-engine-torch",
                   "transformer-engine-cu12", "transformer-engine-cu13"), PIN_TE,
                   "Megatron's default --transformer-impl is transformer_engine, and slime v0.3.1's Qwen, Llama and "
                   "GLM-4 weight converters know only its layer names (--transformer-impl local does not load them)",
                   Status.FAIL, f"pip install --no-build-isolation 'transformer_engine[pytorch]=={PIN_TE}'",
                   same=lambda v, pin: version_tuple(v)[:2] == version_tuple(pin)[:2])


def packages_flash_attn(m: Machine) -> Finding:
    return _pinned(m, "packages.flash_attn", ("flash-attn",), PIN_FLASH_ATTN,
                   "slime's scripts pass --attention-backend flash", Status.WARN,
                   f"pip install flash-attn=={PIN_FLASH_ATTN} --no-build-isolation",
                   same=lambda v, pin: (2, 7, 4) <= version_tuple(v) <= (2, 8, 3))


def packages_numpy(m: Machine) -> Finding:
    return _pinned(
        m,
        "packages.numpy",
        ("numpy",),
        PIN_NUMPY,
        "Megatron and SGLang need it",
        Status.FAIL,
        f"pip install numpy=={PIN_NUMPY} scipy=={PIN_SCIPY}",
        same=lambda v, pin: version_tuple(v)[:1] == (1,),
    )


def packages_transformers(m: Machine) -> Finding:
    return _pinned(m, "packages.transformers", ("transformers",), PIN_TRANSFORMERS,
                   "slime reads HF configs and tokenizers with it", Status.FAIL,
                   f"pip install transformers=={PIN_TRANSFORMERS}")


def packages_known_bad(m: Machine) -> Finding:
    """Combinations slime's build files call out, or that sglang 0.5.15.post1's pins forbid."""
    id_ = "packages.known_bad"
    if m.packages is None:
        return _no_packages(id_)
    get = {name: _pkg(m, name) for name in ("numpy", "scipy", "sglang", "torch", "kernels", "flash-attn-4",
                                            "transformers", "megatron-core")}
    ver = {k: version_tuple(v[1]) if v else None for k, v in get.items()}
    megatron = m.probe.run(P.MEGATRON)
    has_megatron = bool(get["megatron-core"]) or (megatron.ok and "megatron.core=present" in megatron.text)
    problems = []
    if ver["numpy"] and ver["numpy"][0] >= 2 and has_megatron:
        # slime's own start-up check, not Megatron's: Megatron-LM 1dcf0da's pyproject asks only for "numpy"
        problems.append(f"numpy {get['numpy'][1]}: slime stops at start-up on NumPy 2 (its Megatron set-up, "
                        "slime/backends/megatron_utils/initialize.py, asserts \"Megatron does not support numpy "
                        "2.x\"), though megatron-core itself installs and runs with it (slime-ref trains on it); "
                        f"pin numpy=={PIN_NUMPY}")
    if ver["scipy"] and ver["numpy"] and ver["scipy"] >= (1, 18) and ver["numpy"][0] < 2:
        problems.append(f"scipy {get['scipy'][1]} with numpy {get['numpy'][1]}: SciPy 1.18+ needs NumPy 2 (pin "
                        f"scipy=={PIN_SCIPY})")
    if (
        get["sglang"]
        and ver["torch"]
        and ver["torch"][:2] != version_tuple(PIN_TORCH)[:2]
        and get["sglang"][1] == PIN_SGLANG
    ):
        problems.append(f"torch {get['torch'][1]} with sglang {PIN_SGLANG}, which requires torch=={PIN_TORCH}")
    if get["sglang"] and ver["kernels"] and ver["kernels"] >= (0, 15):
        problems.append(f"kernels {get['kernels'][1]}: 0.15+ breaks `import sglang` (pin kernels<0.15)")
    if get["flash-attn-4"]:
        problems.append(f"flash-attn-4 {get['flash-attn-4'][1]} is installed: slime's image removes it so TE 2.16 "
                        f"picks FA2/FA3")
    if (
        get["sglang"]
        and get["transformers"]
        and get["sglang"][1] == PIN_SGLANG
        and get["transformers"][1] != PIN_TRANSFORMERS
    ):
        problems.append(f"transformers {get['transformers'][1]} with sglang {PIN_SGLANG}, which requires "
                        f"{PIN_TRANSFORMERS}")
    if problems:
        return Finding(id_, Status.FAIL, "; ".join(problems) + ".",
                       "Use slime's image, or match its pins (docker/Dockerfile, build_conda.sh).", CONDA_DOC)
    return Finding(id_, Status.PASS, "None of the known-bad combinations.")


# ---------------------------------------------------------------------------------------------
