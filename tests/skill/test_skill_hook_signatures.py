"""The hook signatures the skill documents are the ones the loop calls.

slime-ref loads and calls every hook the way slime v0.3.1 does (same arguments, same order), so its
call sites are the reference: each `load_function(..., "--flag")` in `reference_impl/slime_ref` is
followed to the call of the loaded hook, and the documented signature for that flag
(`skill/references/custom-hooks.md`) must accept exactly those arguments. A short rollout with
recording hooks then checks the shapes the hooks receive against the documented annotations.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from skill_docs import FENCE, INLINE_CODE, REPO

SLIME_REF = REPO / "reference_impl" / "slime_ref"
HOOKS_MD = REPO / "skill" / "references" / "custom-hooks.md"
# names the call sites use for what the documentation calls `args`
ARGS_NAMES = {"args", "a", "self.args"}


# ----------------------------------------------------------------------------- documented signatures


def _parse_def(code: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    code = code.replace("\\|", "|").strip().rstrip(".").rstrip()
    code = re.sub(r":\s*(\.\.\.)?\s*$", "", code)
    tree = ast.parse(code + ": ...")
    node = tree.body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), code
    return node


def documented() -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
    """flag -> the signatures custom-hooks.md gives for it (table rows and `### ... --flag` sections)."""
    text = HOOKS_MD.read_text(encoding="utf-8")
    found: dict[str, list] = {}
    for line in text.splitlines():
        row = re.match(r"\| `(--[a-z-]+-path)`[^|]*\| (.*?) \| [^|]*\|$", line)
        if row:
            defs = [c for c in INLINE_CODE.findall(row.group(2)) if re.match(r"(async )?def ", c)]
            found.setdefault(row.group(1), []).extend(_parse_def(d) for d in defs[:1])
    for section in re.split(r"^### ", text, flags=re.MULTILINE)[1:]:
        heading, _, body = section.partition("\n")
        flag = re.search(r"`(--[a-z-]+-path)`", heading)
        if not flag:
            continue
        for lang, block in FENCE.findall(body):
            if lang != "python":
                continue
            for line in textwrap.dedent(block).splitlines():
                if re.match(r"(async )?def ", line):
                    found.setdefault(flag.group(1), []).append(_parse_def(line))
    return found


def params(sig) -> tuple[list[str], int]:
    """Positional parameter names (without `self`) and how many of them are required."""
    names = [a.arg for a in sig.args.posonlyargs + sig.args.args]
    required = len(names) - len(sig.args.defaults)
    if names[:1] == ["self"]:
        names, required = names[1:], required - 1
    return names, required


# ----------------------------------------------------------------------------- call sites in slime-ref


@dataclass
class Site:
    where: str
    positional: list[str]  # the argument expressions, as source
    keywords: list[str | None] = field(default_factory=list)  # None: a **mapping passed through


def _modules() -> dict[Path, ast.Module]:
    trees = {}
    for path in sorted(SLIME_REF.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                child.parent = node  # type: ignore[attr-defined]
        trees[path] = tree
    return trees


def _site(call: ast.Call, path: Path, skip: int = 0) -> Site:
    return Site(f"{path.relative_to(SLIME_REF)}:{call.lineno}", [ast.unparse(a) for a in call.args[skip:]],
                [k.arg for k in call.keywords])


def _function_defs(trees) -> dict[tuple[Path, str], ast.FunctionDef]:
    return {
        (p, n.name): n
        for p, t in trees.items()
        for n in ast.walk(t)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def _through_wrapper(outer: ast.Call, path: Path, defs, depth: int = 0) -> list[Site]:
    """`wrapper(hook, x, y)`: the call of the hook inside the wrapper's body (this module's, else any),
    also through a wrapper that hands the hook and its ``*args`` on to another wrapper."""
    name = ast.unparse(outer.func).rsplit(".", 1)[-1]
    candidates = [key for key in defs if key[1] == name]
    candidates.sort(key=lambda key: key[0] != path)
    if not candidates:
        return []
    wpath, wdef = candidates[0][0], defs[candidates[0]]
    hook_param = wdef.args.args[0].arg
    named = len(wdef.args.posonlyargs + wdef.args.args)  # the outer call's arguments before the wrapper's *args
    sites = []
    for node in ast.walk(wdef):
        if not isinstance(node, ast.Call):
            continue
        starred = any(isinstance(a, ast.Starred) for a in node.args)
        if ast.unparse(node.func) == hook_param:
            if starred:  # hook(*args, **kwargs): the outer call's arguments after the wrapper's own
                sites.append(_site(outer, path, skip=named))
            else:
                sites.append(_site(node, wpath))
        elif starred and depth < 3 and node.args and ast.unparse(node.args[0]) == hook_param:
            # inner(hook, *args, **kwargs): follow it with the outer call's trailing arguments
            inner = ast.Call(func=node.func, args=[outer.args[0], *outer.args[named:]], keywords=outer.keywords)
            inner.lineno = outer.lineno
            sites += _through_wrapper(inner, path, defs, depth + 1)
    return sites


def call_sites() -> dict[str, list[Site]]:
    """flag -> how slime-ref calls the hook loaded for it."""
    trees = _modules()
    defs = _function_defs(trees)
    sites: dict[str, list[Site]] = {}
    for path, tree in trees.items():
        for load in ast.walk(tree):
            if not (isinstance(load, ast.Call) and ast.unparse(load.func).endswith("load_function")
                    and len(load.args) == 2 and isinstance(load.args[1], ast.Constant)
                    and str(load.args[1].value).startswith("--")):
                continue
            flag = load.args[1].value
            child, parent = load, load.parent
            while isinstance(parent, ast.IfExp):
                child, parent = parent, parent.parent
            position = None
            if isinstance(parent, ast.Tuple):  # hook, name = load_function(...), ...
                position = parent.elts.index(child)
                parent = parent.parent
            found = []
            if isinstance(parent, ast.Call):  # wrapper(load_function(...), x, y)
                found += _through_wrapper(parent, path, defs)
            elif isinstance(parent, ast.Assign):
                target = parent.targets[0]
                target = ast.unparse(target.elts[position] if position is not None else target)
                scope = tree if target.startswith("self.") else parent
                while not isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
                    scope = scope.parent
                for node in ast.walk(scope):
                    if not isinstance(node, ast.Call):
                        continue
                    if ast.unparse(node.func) == target:
                        found.append(_site(node, path))
                    elif node.args and ast.unparse(node.args[0]) == target:
                        found += _through_wrapper(node, path, defs)
            assert found, f"{flag}: loaded at {path.relative_to(SLIME_REF)}:{load.lineno} but never called"
            sites.setdefault(flag, []).extend(found)
    return sites


SITES = call_sites()
DOCS = documented()


def accepts(sig, site: Site, *, keywords: bool) -> list[str]:
    """Why the documented signature cannot take the call (empty: it can)."""
    names, required = params(sig)
    why = []
    n = len(site.positional)
    if not (required <= n <= len(names) or (sig.args.vararg and n >= required)):
        why.append(f"{n} positional arguments, documented {len(names)} ({', '.join(names)})")
    for i, expr in enumerate(site.positional[: len(names)]):
        passed = "args" if expr in ARGS_NAMES else expr
        if passed in ("args", "rollout_id") and names[i] != passed:
            why.append(f"argument {i + 1} is {passed}, documented {names[i]}")
    if keywords:
        known = set(names) | {a.arg for a in sig.args.kwonlyargs}
        for kw in site.keywords:
            if (kw is None or kw not in known) and sig.args.kwarg is None:
                why.append(f"passes {'**' if kw is None else kw + '='}..., documented without it")
    return why


# hooks the audit of the skill against slime v0.3.1 found documented wrongly, and the core ones
MUST_PIN = {
    "--rollout-data-postprocess-path", "--rollout-sample-filter-path", "--rollout-all-samples-process-path",
    "--data-source-path", "--custom-rm-path", "--custom-generate-function-path", "--dynamic-sampling-filter-path",
    "--buffer-filter-path", "--rollout-function-path", "--custom-reward-post-process-path",
}


def test_every_hook_slime_ref_calls_is_documented_with_a_signature():
    assert MUST_PIN <= set(SITES), sorted(MUST_PIN - set(SITES))
    assert set(SITES) - set(DOCS) == set(), "hooks slime-ref calls that custom-hooks.md gives no signature for"


@pytest.mark.parametrize("flag", sorted(SITES))
def test_documented_signature_matches_every_call_site(flag):
    sigs = DOCS.get(flag, [])
    assert sigs, f"custom-hooks.md gives no signature for {flag}"
    for site in SITES[flag]:  # every call passes a number and order of arguments some documented form takes
        problems = [accepts(sig, site, keywords=False) for sig in sigs]
        assert any(p == [] for p in problems), (
            f"{flag} is called at {site.where} as f({', '.join(site.positional)}): {problems}"
        )
    for sig in sigs:  # and every documented form is one the loop really calls, keywords included
        problems = [accepts(sig, site, keywords=True) for site in SITES[flag]]
        assert any(p == [] for p in problems), f"{flag}: `{ast.unparse(sig.args)}` matches no call site: {problems}"


# ----------------------------------------------------------------------------- what the hooks receive

HOOKS_MODULE = '''
import copy
from slime_ref.types import Sample

SEEN = []
SPLIT = False
PRESET_REWARD = None


class PromptSource:
    def __init__(self, args):
        self.args, self.drawn = args, 0

    def get_samples(self, num_samples):
        groups = []
        for _ in range(num_samples):
            n = self.args.n_samples_per_prompt
            groups.append([Sample(prompt="1+1=", label="2", group_index=self.drawn, index=self.drawn * n + j)
                           for j in range(n)])
            self.drawn += 1
        return groups

    def add_samples(self, samples):
        pass

    def save(self, rollout_id):
        pass

    def load(self, rollout_id=None):
        pass

    def __len__(self):
        return 1000


async def generate(args, sample, sampling_params):
    sample.tokens = [1, 2, 3]
    sample.response, sample.response_length = "\\\\boxed{2}", 1
    sample.loss_mask, sample.rollout_log_probs = [1], [-0.5]
    sample.status = Sample.Status.COMPLETED
    sample.reward = PRESET_REWARD
    if SPLIT:
        second = copy.deepcopy(sample)
        second.index = sample.index + 1000
        return [sample, second]
    return sample


async def reward(args, sample, **kwargs):
    SEEN.append(("reward", sample))
    return [1.0] * len(sample) if isinstance(sample, list) else 1.0


def sample_filter(args, groups):
    SEEN.append(("sample_filter", groups))


def all_samples(args, all_groups, data_source):
    SEEN.append(("all_samples", all_groups, data_source))
'''


def shape(value) -> str:
    """The type annotation the documentation would give a value: Sample, list[Sample], ..."""
    from slime_ref.types import Sample

    if isinstance(value, Sample):
        return "Sample"
    if isinstance(value, list):
        inner = {shape(v) for v in value}
        assert len(inner) == 1, inner
        return f"list[{inner.pop()}]"
    return type(value).__name__


def annotation(flag: str, position: int, *, form: int = 0) -> str:
    sig = DOCS[flag][form]
    names, _ = params(sig)
    arg = (sig.args.posonlyargs + sig.args.args)[position + (len(sig.args.args) - len(names))]
    return ast.unparse(arg.annotation) if arg.annotation is not None else ""


@pytest.fixture
def hooks(tmp_path, monkeypatch):
    (tmp_path / "skill_hooks_probe.py").write_text(HOOKS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("skill_hooks_probe", None)
    import skill_hooks_probe

    yield skill_hooks_probe
    sys.modules.pop("skill_hooks_probe", None)


def probe_args(tiny, tmp_path, *extra):
    from slime_ref.arguments import parse_args

    args = parse_args([
        "--hf-checkpoint", str(tiny.model_dir), "--prompt-data", str(tiny.train_path), "--input-key", "prompt",
        "--label-key", "label", "--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--global-batch-size", "4", "--rollout-max-response-len", "4", "--actor-num-gpus-per-node", "1",
        "--output-dir", str(tmp_path), "--data-source-path", "skill_hooks_probe.PromptSource",
        "--custom-generate-function-path", "skill_hooks_probe.generate", "--custom-rm-path", "skill_hooks_probe.reward",
        *extra,
    ])
    # no engine is contacted: the generate hook answers without one
    args.sglang_router_ip, args.sglang_router_port = "127.0.0.1", 9
    return args


def test_rollout_hooks_receive_what_the_skill_says(tiny, tmp_path, hooks):
    from slime_ref.data.source import load_tokenizer, make_data_source
    from slime_ref.rollout import sglang_rollout

    args = probe_args(tiny, tmp_path, "--rollout-sample-filter-path", "skill_hooks_probe.sample_filter",
                      "--rollout-all-samples-process-path", "skill_hooks_probe.all_samples")
    source = make_data_source(args, load_tokenizer(args))  # constructed as cls(args)
    assert isinstance(source, hooks.PromptSource)
    out = sglang_rollout.generate_rollout(args, 0, source)
    assert len(out.samples) == 2
    seen = {entry[0]: entry[1:] for entry in hooks.SEEN}

    (groups,) = seen["sample_filter"]
    assert shape(groups) == "list[list[Sample]]" == annotation("--rollout-sample-filter-path", 1)
    all_groups, data_source = seen["all_samples"]
    assert shape(all_groups) == "list[list[Sample]]" == annotation("--rollout-all-samples-process-path", 1)
    assert data_source.__self__ is source and data_source.__name__ == "get_samples"
    rewarded = [entry[1] for entry in hooks.SEEN if entry[0] == "reward"]
    assert {shape(r) for r in rewarded} == {"Sample"} == {annotation("--custom-rm-path", 1, form=0)}


def test_reward_gets_a_list_when_generate_returns_a_list_without_group_rm(tiny, tmp_path, hooks):
    from slime_ref.rollout import sglang_rollout
    from slime_ref.types import Sample
    from slime_ref.utils.async_loop import run

    hooks.SPLIT = True
    args = probe_args(tiny, tmp_path)
    assert not args.group_rm
    done = run(sglang_rollout.generate_and_rm(args, Sample(prompt="1+1=", label="2", index=0), {"max_new_tokens": 4}))
    assert [s.reward for s in done] == [1.0, 1.0]
    ((_, received),) = hooks.SEEN
    assert shape(received) == "list[Sample]" == annotation("--custom-rm-path", 1, form=1)
    assert re.search(r"without `--group-rm`, whenever\s+the generate hook returns `list\[Sample\]`",
                     HOOKS_MD.read_text(encoding="utf-8"))


def test_group_rm_scores_samples_whose_reward_generate_already_set(tiny, tmp_path, hooks):
    from slime_ref.rollout import sglang_rollout
    from slime_ref.types import Sample
    from slime_ref.utils.async_loop import run

    hooks.PRESET_REWARD = 5.0
    args = probe_args(tiny, tmp_path, "--group-rm")
    group = [Sample(prompt="1+1=", label="2", group_index=0, index=i) for i in range(2)]
    done = run(sglang_rollout.generate_and_rm_group(args, group, {"max_new_tokens": 4}))
    assert [s.reward for s in done] == [1.0, 1.0]  # overwritten, not skipped
    ((_, received),) = hooks.SEEN
    assert shape(received) == "list[Sample]"
    text = " ".join(HOOKS_MD.read_text(encoding="utf-8").split())
    assert (
        "If you set `sample.reward`, slime does not call the reward function for that sample, "
        "**unless `--group-rm` is on**" in text
    )

    hooks.SEEN.clear()
    args = probe_args(tiny, tmp_path)  # without --group-rm a preset reward is kept
    done = run(sglang_rollout.generate_and_rm(args, Sample(prompt="1+1=", label="2", index=0), {"max_new_tokens": 4}))
    assert done.reward == 5.0 and hooks.SEEN == []


def test_skill_md_names_both_reward_forms():
    from skill_docs import REPO as root

    body = (root / "SKILL.md").read_text(encoding="utf-8")
    assert "async def reward_func(args, sample: Sample, **kwargs) -> float" in body
    assert re.search(r"list\[Sample\].*--group-rm.*whenever generate returns a list", body)

