"""slime's names map (slime_ref/slime_names.py) is the one list both users read: the hook loader's
SLIME_BUILTINS and the compatibility namespace's exports come from it, and every entry is a real
slime-ref object served under its slime name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from slime_ref.slime_names import SLIME_NAMES, hook_targets, names_in, resolve
from slime_ref.utils.hooks import SLIME_BUILTINS, load_function
from slime_rehearse.compat import ROOT as COMPAT_ROOT
from slime_rehearse.compat import TARGET_ENV

REPO = Path(__file__).resolve().parents[2]
COMPAT_MODULES = sorted(
    ".".join(path.relative_to(COMPAT_ROOT).with_suffix("").parts).removesuffix(".__init__")
    for path in (COMPAT_ROOT / "slime").rglob("*.py"))


def _compat_exports() -> dict:
    """Per compat module, run where the compat `slime` is the one imported: each exported name, the
    slime-ref dotted path of the object it is (None for one the compat module defines itself)."""
    code = textwrap.dedent(f"""
        import importlib, json
        modules = {COMPAT_MODULES!r}
        found = {{}}
        for name in modules:
            module = importlib.import_module(name)
            found[name] = {{}}
            for attr in module.__all__:
                obj = getattr(module, attr)
                home = getattr(obj, "__module__", "") or ""
                found[name][attr] = f"{{home}}.{{obj.__qualname__}}" if home.startswith("slime_ref.") else None
        print(json.dumps(found))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(COMPAT_ROOT), str(REPO / "reference_impl")]),
           TARGET_ENV: "v0.3.1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_slime_builtins_are_the_maps_hook_entries():
    assert SLIME_BUILTINS == hook_targets()
    assert SLIME_BUILTINS == {slime: name.ref for slime, name in SLIME_NAMES.items() if name.hook}
    assert "slime.rollout.sglang_rollout.generate_rollout" in SLIME_BUILTINS
    assert "slime.utils.types.Sample" in SLIME_NAMES and "slime.utils.types.Sample" not in SLIME_BUILTINS


def test_every_entry_is_a_slime_ref_object_and_hook_entries_load_as_hooks():
    for slime, name in SLIME_NAMES.items():
        assert slime.startswith("slime.") and name.ref.startswith("slime_ref."), slime
        target = resolve(name.ref)
        assert callable(target), slime
        if name.hook:
            assert load_function(slime, "--some-hook-path") is target, slime


def test_compat_modules_export_the_map_and_only_their_own_names_besides():
    exports = _compat_exports()
    assert set(exports) == set(COMPAT_MODULES)
    served = set()
    for module, names in exports.items():
        mapped = names_in(module)
        assert set(mapped) <= set(names), module
        for attr, ref in names.items():
            if attr in mapped:
                # the very object the map names (an alias such as DataSource has the class's own path)
                assert ref == f"{resolve(mapped[attr]).__module__}.{resolve(mapped[attr]).__qualname__}", (module, attr)
                served.add(f"{module}.{attr}")
            else:
                assert ref is None, f"{module}.{attr} re-exports slime-ref's {ref} outside slime_ref/slime_names.py"
    assert served == set(SLIME_NAMES)


def test_names_in_gives_a_modules_own_names_only():
    assert names_in("slime.utils.types") == {"Sample": "slime_ref.types.Sample"}
    assert names_in("slime.rollout.data_source")["DataSource"] == "slime_ref.data.source.RolloutDataSource"
    assert "math_utils.grade_answer_mathd" not in names_in("slime.rollout.rm_hub")
    assert "grade_answer_mathd" not in names_in("slime.rollout.rm_hub")
