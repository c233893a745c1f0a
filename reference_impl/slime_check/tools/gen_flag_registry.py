"""Generate the flag registry: every command-line flag slime v0.3.1 accepts, with type and default.

slime parses its command line with three argparse parsers (``slime/utils/arguments.py``):

* ``preparse``: ``--train-backend``, ``--debug-rollout-only``, ``--debug-train-only``,
  ``--load-debug-rollout-data`` (exact names only);
* ``main``: Megatron-LM's arguments plus slime's own (``megatron_parse_args`` with
  ``ignore_unknown_args=True``: a flag no parser knows is dropped without a word);
* ``sglang``: every SGLang ``ServerArgs`` flag renamed ``--sglang-*`` (minus the ones slime sets
  itself), the router's flags as ``--router-*`` and a few slime flags. It keeps argparse's
  default ``allow_abbrev=True``, so unambiguous prefixes of its flags are accepted.

This script builds those parsers the way slime does, by running the real argparse definitions
at the pinned versions, and writes one JSON record per argparse action. Upstream modules that
only the runtime needs are replaced by inert stubs, and slime's Docker patches (which add flags
to Megatron-LM and SGLang) are applied first, because slime's image ships them.

Sources (slime v0.3.1 pins them in docker/Dockerfile and build_conda.sh)::

    git -C SLIME_GIT archive v0.3.1 | tar -x -C /tmp/slime            # or pass SLIME_GIT@v0.3.1
    git -C MEGATRON_GIT archive 1dcf0dafa884ad52ffb243625717a3471643e087 megatron | tar -x -C /tmp/mlm
    pip download --no-deps sglang==0.5.15.post1 -d /tmp/w
    pip download --no-deps sglang-router==0.3.2 -d /tmp/w

    python -m slime_check.tools.gen_flag_registry --slime /tmp/slime --megatron /tmp/mlm \\
        --sglang-wheel /tmp/w/sglang-0.5.15.post1-*.whl --router-wheel /tmp/w/sglang_router-0.3.2-*.whl

Megatron-LM is imported for real (its flags come from config dataclasses in megatron.core), so
the run needs torch; it takes about 15 s. That full run made ``slime_v0.3.1_flags.json``.

Derived registries (``--base``): another slime with the same pins
-----------------------------------------------------------------

slime's main at 624b824 pins the same Megatron-LM commit (1dcf0da) and the same SGLang image
(``v0.5.15.post1-cu129``) as v0.3.1, and applies the same five patches plus two new ones
(``megatron-sglang-aligned.patch``, which adds no flag, and ``sglang-deterministic.patch``,
which adds one ``ServerArgs`` field). Its registry is derived from v0.3.1's, without Megatron-LM,
the SGLang wheel or torch::

    python -m slime_check.tools.gen_flag_registry --base slime_common/data/slime_v0.3.1_flags.json \
        --slime SLIME_GIT@624b824 --version main --arg-utils SGLANG_0.5.15.post1_SOURCE \
        --out slime_common/data/slime_main-624b824_flags.json

What a derivation regenerates from the target slime's own files:

* every record whose source is ``slime``: the ``main`` parser's slime flags (running slime's
  ``get_slime_extra_args_provider`` from ``slime/utils/arguments.py`` on a parser that holds the
  base's Megatron flags), the ``preparse`` parser, and the ``sglang`` parser's slime flags
  (running ``add_sglang_arguments`` from ``slime/backends/sglang_utils/arguments.py``);
* the defaults slime resets on Megatron, SGLang and router flags (``megatron_default``), and
  which SGLang flags slime hides (its skip list);
* the ``--sglang-*`` flags added by SGLang patches the base does not apply: the ``ServerArgs``
  fields such a patch adds are run through SGLang's own ``arg_utils.py`` (v0.5.15.post1).

What it carries from the base registry unchanged: every Megatron-LM, Megatron-patch, SGLang,
SGLang-patch and router record of the pinned upstreams. A new Megatron patch that adds a flag,
or a new SGLang patch field that needs more of ``server_args.py`` than ``arg_utils``, stops the
derivation with a message: that slime needs the full run above.

``slime_check.flag_source`` uses the same derivation to read a user's own slime checkout.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

from slime_check.tools.flag_records import action_record, option_actions, to_json
from slime_check.tools.registry_derivation import DerivationError, derive
from slime_check.tools.upstream_sources import (
    MissingModuleStubber,
    SourceTree,
    build_preparse_parser,
    captured_parser,
    exec_source,
    import_with_stubs,
    load_slime_module,
    patch_added_flags,
    patch_text,
)

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "slime_common" / "data" / "slime_v0.3.1_flags.json"

# slime's Dockerfile applies these to SGLang's source, in this order (docker/patch/<version>/).
SGLANG_PATCHES = ["sglang.patch", "sglang-top_p.patch", "sglang-release_hicache.patch", "sglang-pull_weights.patch"]
PATCH_VERSION = "v0.5.15.post1"


# ---------------------------------------------------------------------------------------------
# The three parsers, built the way slime builds them
# ---------------------------------------------------------------------------------------------


def build_main_parser(slime: SourceTree, megatron_root: Path, stubber: MissingModuleStubber):
    """Megatron-LM's parser with slime's extra-args provider, as ``megatron_parse_args`` builds it."""
    sys.path.insert(0, str(megatron_root))
    mlm_args = import_with_stubs("megatron.training.arguments", "megatron", stubber)
    if not str(Path(mlm_args.__file__).resolve()).startswith(str(megatron_root.resolve())):
        raise SystemExit(f"gen_flag_registry: imported {mlm_args.__file__}, not the checkout at {megatron_root}")
    slime_args = load_slime_module(slime, "slime/utils/arguments.py", {})
    provider = slime_args.get_slime_extra_args_provider()

    before: dict[int, object] = {}

    def recording_provider(parser):
        for action in option_actions(parser):
            before[id(action)] = action.default
        return provider(parser)

    parser = captured_parser(
        lambda: mlm_args.parse_args(extra_args_provider=recording_provider, ignore_unknown_args=True)
    )
    return parser, before


def load_sglang_server_args(wheel: SourceTree, slime: SourceTree, patched: bool) -> types.ModuleType:
    arg_utils = exec_source(
        "sglang.srt.arg_groups.arg_utils", wheel.read("sglang/srt/arg_groups/arg_utils.py"), "arg_utils.py", {}
    )
    actions = exec_source(
        "sglang.srt.arg_groups.argparse_actions",
        wheel.read("sglang/srt/arg_groups/argparse_actions.py"),
        "argparse_actions.py",
        {},
    )
    source = wheel.read("sglang/srt/server_args.py")
    if patched:
        for name in SGLANG_PATCHES:
            patch = slime.read(f"docker/patch/{PATCH_VERSION}/{name}")
            source = patch_text(
                source, patch.replace("a/python/", "a/").replace("b/python/", "b/"), "sglang/srt/server_args.py"
            )
    provided = {
        "sglang": types.ModuleType("sglang"),
        "sglang.srt.arg_groups.arg_utils": arg_utils,
        "sglang.srt.arg_groups.argparse_actions": actions,
    }
    return exec_source("sglang.srt.server_args", source, "server_args.py", provided)


def build_sglang_parser(slime: SourceTree, server_args: types.ModuleType, router_wheel: SourceTree):
    """slime's ``add_sglang_arguments`` on a fresh parser, as ``sglang_parse_args`` does."""
    router_args = exec_source(
        "sglang_router.router_args", router_wheel.read("sglang_router/router_args.py"), "router_args.py", {}
    )
    provided = {
        "sglang": types.ModuleType("sglang"),
        "sglang_router": types.ModuleType("sglang_router"),
        "sglang.srt.server_args": server_args,
        "sglang_router.launch_router": router_args,
    }
    module = load_slime_module(slime, "slime/backends/sglang_utils/arguments.py", provided)

    origin: dict[int, str] = {}

    def tagging(cls, source):
        original = cls.add_cli_args

        def wrapper(parser, *args, **kwargs):
            seen = {id(a) for a in parser._actions}
            result = original(parser, *args, **kwargs)
            origin.update({id(a): source for a in parser._actions if id(a) not in seen})
            return result

        cls.add_cli_args = staticmethod(wrapper)

    tagging(server_args.ServerArgs, "sglang")
    tagging(router_args.RouterArgs, "router")
    parser = argparse.ArgumentParser(add_help=False)
    module.add_sglang_arguments(parser)
    return parser, origin


def generate(args) -> dict:
    slime = SourceTree(args.slime)
    megatron = SourceTree(args.megatron)
    sglang_wheel = SourceTree(args.sglang_wheel)
    router_wheel = SourceTree(args.router_wheel)
    stubber = MissingModuleStubber()
    sys.meta_path.append(stubber)

    records: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = megatron.export("megatron", Path(tmp))
        # slime's image applies its Megatron patch, which adds flags; the tree here is a copy.
        mlm_patch = slime.read(f"docker/patch/{PATCH_VERSION}/megatron.patch")
        subprocess.run(["patch", "-p1", "-s", "--forward", "-d", str(root)], input=mlm_patch, text=True, check=True)
        patch_flags = patch_added_flags(mlm_patch)

        main, megatron_defaults = build_main_parser(slime, root, stubber)
        for action in option_actions(main):
            if id(action) in megatron_defaults:
                source = "megatron-patch" if set(action.option_strings) & patch_flags else "megatron"
                record = action_record(action, "main", source)
                if to_json(megatron_defaults[id(action)]) != record["default"]:
                    record["megatron_default"] = to_json(megatron_defaults[id(action)])
            else:
                record = action_record(action, "main", "slime")
            records.append(record)
        megatron_commit = megatron.commit() or args.megatron_commit

    for action in option_actions(build_preparse_parser(slime)):
        records.append(action_record(action, "preparse", "slime"))

    unpatched = {
        tuple(a.option_strings)
        for a in option_actions(
            build_sglang_parser(slime, load_sglang_server_args(sglang_wheel, slime, False), router_wheel)[0]
        )
    }
    sglang_parser, origin = build_sglang_parser(
        slime, load_sglang_server_args(sglang_wheel, slime, True), router_wheel
    )
    for action in option_actions(sglang_parser):
        source = origin.get(id(action), "slime")
        if source == "sglang" and tuple(action.option_strings) not in unpatched:
            source = "sglang-patch"
        record = action_record(action, "sglang", source)
        if source.startswith("sglang"):
            record["upstream_flags"] = ["--" + f[len("--sglang-"):] for f in action.option_strings]
        records.append(record)

    records.sort(key=lambda r: (r["flags"][0], r["parser"]))
    return {
        "schema": 1,
        "slime": {"version": "v0.3.1", "commit": slime.commit() or args.slime_commit},
        "pins": {
            "megatron_lm": megatron_commit,
            "sglang": "0.5.15.post1",
            "sglang_patches": [f"docker/patch/{PATCH_VERSION}/{p}" for p in SGLANG_PATCHES],
            "megatron_patch": f"docker/patch/{PATCH_VERSION}/megatron.patch",
            "sglang_router": router_args_version(router_wheel),
            # slime's image installs its own 0.3.2 build of the router (zhuzilin/sgl-router
            # v0.3.2-9daabcd); the flags here come from the PyPI 0.3.2 wheel's router_args.py.
            "sglang_router_source": "PyPI wheel",
        },
        "parsers": {
            "preparse": {"allow_abbrev": False, "unknown": "ignored"},
            "main": {"allow_abbrev": False, "unknown": "ignored (Megatron parse_known_args)"},
            "sglang": {"allow_abbrev": True, "unknown": "ignored (parse_known_args)"},
        },
        "stubbed_modules": sorted(stubber.names),
        "flags": records,
    }


def router_args_version(wheel: SourceTree) -> str:
    text = wheel.read("sglang_router/version.py")
    match = re.search(r"""__version__\s*=\s*['"]([^'"]+)""", text)
    return match.group(1) if match else "unknown"


def dump(registry: dict) -> str:
    """Pretty JSON with one flag record per line, so a regenerated registry diffs line by line."""
    head = {k: v for k, v in registry.items() if k != "flags"}
    lines = json.dumps(head, indent=1)[:-2] + ',\n "flags": [\n'
    lines += ",\n".join("  " + json.dumps(r) for r in registry["flags"])
    return lines + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slime", required=True, help="slime: a checkout, or GITDIR@REV (v0.3.1, 624b824, ...)")
    parser.add_argument("--slime-commit", default=None, help="commit to record when --slime is a plain directory")
    parser.add_argument("--base", type=Path, default=None,
                        help="derive from this registry (same pins) instead of reading Megatron-LM and SGLang")
    parser.add_argument("--version", default="v0.3.1", help="the slime version to record (v0.3.1, main)")
    parser.add_argument("--arg-utils", default=None,
                        help="with --base: SGLang 0.5.15.post1 source (wheel or directory) holding "
                             "sglang/srt/arg_groups/arg_utils.py, for flags new SGLang patches add")
    parser.add_argument("--megatron", help="Megatron-LM at 1dcf0da: a checkout, or GITDIR@1dcf0da...")
    parser.add_argument("--megatron-commit", default="1dcf0dafa884ad52ffb243625717a3471643e087")
    parser.add_argument("--sglang-wheel", help="sglang-0.5.15.post1 wheel")
    parser.add_argument("--router-wheel", help="sglang_router-0.3.2 wheel")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.base is not None:
        slime = SourceTree(args.slime)
        commit = slime.commit() or args.slime_commit
        if commit is None:
            parser.error("--slime-commit is required when --slime is a plain directory")
        try:
            registry = derive(json.loads(args.base.read_text()), slime, args.version, commit,
                              SourceTree(args.arg_utils) if args.arg_utils else None)
        except DerivationError as e:
            raise SystemExit(f"gen_flag_registry: {e}") from None
    else:
        missing = [f"--{n.replace('_', '-')}" for n in ("megatron", "sglang_wheel", "router_wheel")
                   if getattr(args, n) is None]
        if missing:
            parser.error(f"{', '.join(missing)} required without --base")
        registry = generate(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(dump(registry))
    tmp.replace(args.out)
    counts: dict[str, int] = {}
    for record in registry["flags"]:
        counts[record["source"]] = counts.get(record["source"], 0) + 1
    print(json.dumps({"out": str(args.out), "records": len(registry["flags"]), "by_source": counts}))


if __name__ == "__main__":
    main()
