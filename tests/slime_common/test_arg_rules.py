"""Every rule of slime_common.arg_rules fires in both tools, and every MODEL_ARGS flag slime-ref takes
is compared with config.json by both: slime-check config on a launch argv, slime-ref on its flags."""

from __future__ import annotations

import json

import pytest

from _lint_inputs import TINY_HF_CONFIG, words
from slime_check.config_argv import Config, ConfigValues, parse_argv
from slime_check.config_lint import lint_argv
from slime_check.findings import Status
from slime_check.launch_script import Origin, Word
from slime_check.shell_expansion import Sym
from slime_common.arg_rules import RULES, VALID_JOB, NamespaceValues, broken_rules, user_message
from slime_common.model_args import MODEL_ARGS, hf_value, text_config
from slime_common.registry import load_registry
from slime_ref.arguments import build_parser, parse_args
from slime_ref.errors import UserError


def lint_values(argv) -> ConfigValues:
    reg = load_registry()
    return ConfigValues(Config(parse_argv(words(*argv), reg), reg))


def ref_values(argv) -> NamespaceValues:
    return NamespaceValues(build_parser().parse_known_args(list(argv))[0])


def rule_id(rule) -> str:
    return f"{rule.id}:{RULES.index(rule)}"


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_the_example_breaks_its_rule_first(rule):
    # a rule's example is the job both tools are tested on; the rule must be the first it breaks
    assert broken_rules(lint_values(rule.example))[:1] == [rule]
    assert broken_rules(ref_values(rule.example))[:1] == [rule]


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_config_lint_fails_the_broken_rule(rule):
    findings = lint_argv(words(*rule.example))
    values = lint_values(rule.example)
    hits = [f for f in findings if f.id == rule.id and f.status is Status.FAIL]
    assert [(f.finding, f.fix) for f in hits][:1] == [(rule.message(values), rule.fix(values))], findings


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_slime_ref_refuses_the_broken_rule(rule):
    with pytest.raises(UserError) as e:
        parse_args(list(rule.example))
    assert str(e.value) == user_message(rule, ref_values(rule.example))


def test_the_valid_job_breaks_no_rule_in_either_tool():
    assert broken_rules(lint_values(VALID_JOB)) == [] and broken_rules(ref_values(VALID_JOB)) == []
    ids = {rule.id for rule in RULES}
    assert not [f for f in lint_argv(words(*VALID_JOB)) if f.status is Status.FAIL and f.id in ids]
    args = parse_args(list(VALID_JOB))
    assert (args.global_batch_size, args.num_steps_per_rollout, args.over_sampling_batch_size) == (8, 1, 4)


def test_a_symbolic_value_skips_the_rules_that_compare_it():
    argv = words(*VALID_JOB, "--over-sampling-batch-size")
    argv.append(Word([Sym("${OVER}")], Origin("argv", len(argv) + 1)))
    assert not [f for f in lint_argv(argv) if f.id == "config.over_sampling"]
    assert [f.id for f in lint_argv(words(*VALID_JOB, "--over-sampling-batch-size", "2"))
            if f.status is Status.FAIL and f.id == "config.over_sampling"] == ["config.over_sampling"]


def test_rule_ids_are_config_lint_ids_flags_are_slime_flags_and_examples_differ():
    assert all(rule.id.startswith("config.") for rule in RULES)
    reg = load_registry()
    assert [f for rule in RULES for f in rule.flags if reg.lookup(f) is None] == []
    assert len({rule.example for rule in RULES}) == len(RULES)


SLIME_REF_MODEL_ARGS = [arg.flag for arg in MODEL_ARGS if arg.flag in build_parser()._option_string_actions]


def test_slime_ref_takes_every_dense_model_arg():
    assert set(SLIME_REF_MODEL_ARGS) == {arg.flag for arg in MODEL_ARGS} - {
        "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size"}


def model_job(folder) -> list[str]:
    """VALID_JOB with MODEL_ARGS that match TINY_HF_CONFIG, as a slime model script gives them."""
    hf = text_config(TINY_HF_CONFIG)
    model_args = [w for flag in SLIME_REF_MODEL_ARGS for w in (flag, str(hf_value(hf, flag, with_default=True)))]
    return [*VALID_JOB, "--hf-checkpoint", str(folder), "--untie-embeddings-and-output-weights", "--qk-layernorm",
            "--group-query-attention", *model_args]


def test_model_args_that_match_config_json_pass_both_tools(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_HF_CONFIG))
    job = model_job(tmp_path)
    assert [f.status for f in lint_argv(words(*job)) if f.id == "config.hf_config"] == [Status.PASS]
    assert parse_args(job).num_layers == 2


@pytest.mark.parametrize("flag", SLIME_REF_MODEL_ARGS)
def test_both_tools_refuse_a_model_arg_that_disagrees_with_config_json(flag, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_HF_CONFIG))
    wrong = hf_value(text_config(TINY_HF_CONFIG), flag, with_default=True) * 2
    job = [*model_job(tmp_path), flag, str(wrong)]  # the last value wins, in argparse as in config lint
    hf = [f for f in lint_argv(words(*job)) if f.id == "config.hf_config"]
    assert [f.status for f in hf] == [Status.FAIL] and f"vs {flag} " in hf[0].finding, hf
    with pytest.raises(UserError, match=f"MODEL_ARGS disagree with .*{flag} "):
        parse_args(job)
