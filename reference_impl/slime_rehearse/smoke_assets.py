"""``slime-check smoke``, what a rehearsal on slime-ref runs on: a tiny model of the script's family
and a stand-in tokenizer, the first rows of its data, the stand-in engine's script, the counted hooks'
site (:data:`SMOKE_SITE`) and the coverage config."""

from __future__ import annotations

import json
import os
from pathlib import Path

from slime_check.findings import USAGE, Finding, Status, slime_doc
from slime_rehearse.smoke_job import DATA_ROWS, DOC, EVAL_ROWS, FULL_LENGTH_HOOK, SUPPORTED_MODEL_TYPES, as_int, last

# ---------------------------------------------------------------------------------------------
# assets: the tiny model, the first rows of the data, the hook wrappers


def build_model(job_items, out: Path, responses: list[dict] = ()) -> tuple[Path, list[Finding]]:
    """A tiny model of the user's family from their config.json, or ours, with a finding saying which.
    Its context covers the job's (a multi-turn job's prompt, observations and answers), and a tokenizer
    that is not the user's is byte-level, so any text a hook or the stand-in engine writes is spelled."""
    hf = last(job_items, "--hf-checkpoint")
    src = Path(hf[0]).expanduser() if hf else None
    config_path = src / "config.json" if src else None
    context = stand_in_context(job_items)
    if not config_path or not config_path.is_file():
        why = f"--hf-checkpoint {hf[0] if hf else '(none)'} is not on this machine"
        return _family_tiny(out, None, {}, "qwen3", context, [], why, responses)
    try:
        user_cfg = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        return _family_tiny(out, None, {}, "qwen3", context, [], f"{config_path} cannot be read ({e})", responses)
    user_cfg = user_cfg.get("text_config", user_cfg)
    family = user_cfg.get("model_type")
    findings = []
    if family not in SUPPORTED_MODEL_TYPES:
        findings.append(Finding("smoke.model", Status.WARN,
                                f"slime-ref builds {', '.join(SUPPORTED_MODEL_TYPES)} models, not {family!r}: the "
                                "rehearsal uses the nearest dense shape (qwen3) with your GQA ratio, tied embeddings "
                                "and rope base; MoE, MLA, sliding windows and custom layers are not rehearsed.",
                                "Rehearse with --with slime on one GPU node for the real architecture.", DOC))
        family = "qwen3"
    tok_local = any((src / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json"))
    return _family_tiny(out, src if tok_local else None, user_cfg, family, context, findings, None, responses)


STAND_IN_CONTEXT = 4096  # tokens: a search loop's second turn (prompt + observation) is about 620


def stand_in_context(job_items) -> int:
    """The stand-in model's context: the job's --rollout-max-context-len, or prompt + response limits,
    and at least :data:`STAND_IN_CONTEXT`."""
    lengths = [as_int(last(job_items, "--rollout-max-context-len"), 0),
               as_int(last(job_items, "--rollout-max-prompt-len"), 0) + as_int(last(job_items,
                                                                              "--rollout-max-response-len"), 0)]
    return max(STAND_IN_CONTEXT, *lengths)


def stand_in_tokenizer(texts: list[str]):
    """A byte-level BPE tokenizer with a ChatML template: every text round-trips, whatever its script."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from slime_ref.assets import CHAT_TEMPLATE, IM_END, IM_START, PAD_TOKEN

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=[PAD_TOKEN, IM_START, IM_END], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts or [""], trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD_TOKEN,
                                     additional_special_tokens=[IM_START])
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def _family_tiny(out: Path, tokenizer_src: Path | None, user_cfg: dict, family: str, context: int, findings,
                 missing: str | None = None, responses: list[dict] = ()):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from slime_ref.assets import padded_vocab_size

    model_dir = out / "model"
    tokenizer = None
    if tokenizer_src is not None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_src))
        except Exception as e:  # a broken or exotic tokenizer: ours stands in
            findings.append(Finding("smoke.tokenizer", Status.WARN, f"{tokenizer_src}'s tokenizer does not load "
                                    f"({e}); a byte-level tokenizer stands in.", "Check the tokenizer files.", DOC))
    elif missing is None:
        findings.append(Finding("smoke.tokenizer", Status.WARN, "the checkpoint has no tokenizer files here; a "
                                "byte-level tokenizer with a ChatML template stands in (your chat template and "
                                "special tokens differ).", "Copy tokenizer.json / tokenizer_config.json next to "
                                "config.json.", DOC))
    if tokenizer is None:
        tokenizer = stand_in_tokenizer(sample_texts(out, responses))
    heads = int(user_cfg.get("num_attention_heads", 4))
    kv = int(user_cfg.get("num_key_value_heads") or heads)
    ratio = max(1, heads // max(1, kv))
    tiny_heads = 4 if ratio <= 4 else ratio
    tiny_kv = max(1, tiny_heads // ratio)
    cfg = AutoConfig.for_model(
        family, vocab_size=padded_vocab_size(len(tokenizer), 64), hidden_size=tiny_heads * 32,
        intermediate_size=tiny_heads * 96, num_hidden_layers=2, num_attention_heads=tiny_heads,
        num_key_value_heads=tiny_kv, head_dim=32, max_position_embeddings=context,
        rms_norm_eps=user_cfg.get("rms_norm_eps", 1e-6), rope_theta=user_cfg.get("rope_theta", 10000.0),
        tie_word_embeddings=bool(user_cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(user_cfg.get("attention_bias", False)) if family != "qwen3" else False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float32)
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    whose = "your" if tokenizer_src is not None and not findings_about_tokenizer(findings) else "a byte-level"
    findings.append(Finding("smoke.model", Status.WARN if missing else Status.PASS,
                            (f"{missing}: the rehearsal uses a stand-in: " if missing else "")
                            + f"tiny {family} (2 layers, {tiny_heads} heads, GQA {ratio}:1, tied embeddings "
                            f"{cfg.tie_word_embeddings}, rope base {user_cfg.get('rope_theta', 10000.0):g}, "
                            f"context {context}), random weights, {whose} tokenizer: {model_dir}",
                            "Copy the checkpoint's config.json and tokenizer files here to rehearse your model's "
                            "family and tokenizer." if missing else "", DOC if missing else ""))
    return model_dir, findings


def findings_about_tokenizer(findings) -> bool:
    return any(f.id == "smoke.tokenizer" for f in findings)


def sample_texts(out: Path, responses: list[dict] = ()) -> list[str]:
    """The texts the stand-in tokenizer's merges are learned from: the rehearsal's data rows, and the
    answer shapes the stand-in engine may give."""
    from slime_rehearse.smoke_runtime import ANSWER_SHAPES

    texts = [template.format(a="42") for template in ANSWER_SHAPES.values()]
    for path in sorted((out / "data").glob("*.jsonl")):
        texts += path.read_text().splitlines()
    return texts + [turn for r in responses for turn in response_turns(r)]


def response_turns(given: dict) -> list[str]:
    response = given["response"]
    return response if isinstance(response, list) else [response]


def scripted_tokens(model_dir: Path, responses: list[dict]) -> int:
    """Tokens the longest ``--responses`` answer needs (its turns, each ended by eos): the rehearsal's
    response cap must not cut a scripted tool call short."""
    if not responses:
        return 0
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return max(sum(len(tokenizer(turn, add_special_tokens=False)["input_ids"]) + 1 for turn in response_turns(r))
               for r in responses)


def write_data(items, out: Path) -> tuple[dict, list[Finding]]:
    from slime_check.config_lint import first_rows

    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"eval": []}
    findings = []
    prompt = last(items, "--prompt-data")
    if not prompt:
        from slime_common.errors import UserError

        raise UserError("the job has no --prompt-data; smoke rehearses a run on the first rows of its data")
    path = Path(prompt[0]).expanduser()
    if not path.is_file():
        findings.append(Finding("smoke.data", Status.FAIL, f"--prompt-data {prompt[0]} is not on this machine.",
                                "Copy the data file here (smoke uses its first rows).", slime_doc(USAGE)))
        return result, findings
    rows = first_rows(path, DATA_ROWS)
    result["prompt"] = data_dir / "prompt.jsonl"
    result["prompt"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    findings.append(Finding("smoke.data", Status.PASS, f"first {len(rows)} rows of {path} with their keys: "
                            f"{result['prompt']}"))
    ev = last(items, "--eval-prompt-data") or []
    pairs = list(zip(ev[0::2], ev[1::2], strict=False)) if len(ev) > 1 else []
    eval_config = last(items, "--eval-config")
    if eval_config:  # slime reads the datasets from the YAML and ignores --eval-prompt-data then
        from slime_check.eval_config import eval_config_as_prompt_data, read_eval_config
        from slime_common.errors import UserError

        try:
            pairs = eval_config_as_prompt_data(read_eval_config(Path(eval_config[0]).expanduser()))
        except UserError as e:
            findings.append(Finding("smoke.eval_config", Status.WARN, f"{e}; no eval is rehearsed.",
                                    "Fix the file (slime-check config reports what is wrong).", DOC))
            pairs = []
        else:
            findings.append(Finding("smoke.eval_config", Status.PASS, f"--eval-config {eval_config[0]}: its "
                                    f"datasets ({', '.join(name for name, _ in pairs)}) are rehearsed as "
                                    "--eval-prompt-data on their first rows; per-dataset settings are not"))
    for name, p in pairs:
        p = Path(p).expanduser()
        if p.is_file():
            target = data_dir / f"eval-{name}.jsonl"
            target.write_text("".join(json.dumps(r) + "\n" for r in first_rows(p, EVAL_ROWS)))
            result["eval"].append((name, target))
    return result, findings


SMOKE_SITE = Path(__file__).resolve().parent / "smoke_site"  # holds slime_smoke_hooks, first on the run's path


def hook_counts(hooks: dict[str, tuple[str, str]], out: Path) -> dict[str, dict]:
    calls = out / "hooks" / "calls"
    result = {}
    for hook_id, (flag, path) in hooks.items():
        c = sum(p.stat().st_size for p in calls.glob(f"{hook_id}.calls.*"))
        e = sum(p.stat().st_size for p in calls.glob(f"{hook_id}.err.*"))
        first = calls / f"{hook_id}.first_error"
        result[hook_id] = {"flag": flag, "path": path, "calls": c, "errors": e,
                           "first_error": first.read_text() if first.is_file() else None}
    return result


def read_responses(path: Path) -> list[dict]:
    """``--responses`` FILE: one JSON object a line, ``{"prompt"?: str, "response": str | [str, ...],
    "correct"?: bool}``; a usage error names the line that is not."""
    from slime_common.errors import UserError

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UserError(f"--responses {path}: cannot be read ({e.strerror or e})") from e
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise UserError(f"--responses {path}:{n}: not JSON ({e})") from e
        response = row.get("response") if isinstance(row, dict) else None
        turns = response if isinstance(response, list) else [response]
        if not turns or not all(isinstance(t, str) and t for t in turns):
            raise UserError(f"--responses {path}:{n}: \"response\" must be a non-empty string or a list of them "
                            "(the turns of a multi-turn answer)")
        if not isinstance(row.get("prompt", ""), str) or not isinstance(row.get("correct", False), bool):
            raise UserError(f"--responses {path}:{n}: \"prompt\" must be a string and \"correct\" true or false")
        found.append(row)
    if not found:
        raise UserError(f"--responses {path}: no responses in it (one JSON object a line)")
    return found


def write_engine_script(out: Path, items, probe: dict | None, responses: list[dict]) -> Path | None:
    """OUT/engine-script.json for the stand-in engine (slime_ref/engine/script.py): for each prompt row,
    the user's --responses for it, then its label in each answer shape the reward scored. The engine
    gives every second answer of a prompt from this list and samples the others, so groups have spread."""
    from slime_rehearse.smoke_runtime import ANSWER_SHAPES, answer_text, prompt_text

    input_key = (last(items, "--input-key") or ["input"])[0]
    label_key = (last(items, "--label-key") or [None])[0]
    taken = [shape for shape, score in (probe or {}).get("shapes", {}).items() if score > 0]
    entries: dict[str, list] = {}
    for line in (out / "data" / "prompt.jsonl").read_text().splitlines():
        row = json.loads(line)
        match = prompt_text(row.get(input_key))
        if not match or match in entries:
            continue
        answer = answer_text(row.get(label_key)) if label_key else None
        given = [r["response"] for r in responses if r.get("prompt") is None or r["prompt"] in match]
        answers = [ANSWER_SHAPES[shape].format(a=answer) for shape in taken] if answer else []
        if given or answers:
            entries[match] = given + answers
    if not entries:
        return None
    path = out / "engine-script.json"
    path.write_text(json.dumps({"entries": [{"match": m, "responses": r} for m, r in entries.items()],
                                "every": 2}, indent=1))
    return path


def write_coverage_config(out: Path, files: list[str]) -> Path:
    """OUT/hooks/coverage.ini: measure only the user's hook files, one data file per process."""
    data = out / "coverage"
    data.mkdir(parents=True, exist_ok=True)
    path = out / "hooks" / "coverage.ini"
    path.write_text(f"[run]\ndata_file = {data / '.coverage'}\nparallel = True\ninclude =\n"
                    + "".join(f"    {f}\n" for f in files))
    return path


def users_files(files: dict[str, str]) -> list[str]:
    """The user's hook files and the Python modules beside them (what the hooks load: an agent system, a
    tool sandbox); not slime-ref's, the compatibility layer's or slime-check's, nor slime's generate where
    only the smoke's full-length wrapper names it."""
    ours = Path(__file__).resolve().parent.parent  # reference_impl
    hook_files = {Path(f).resolve() for hook_id, f in files.items() if hook_id != FULL_LENGTH_HOOK}
    beside = {p.resolve() for f in hook_files for p in f.parent.glob("*.py") if p.name != "__init__.py"}
    return sorted(str(f) for f in hook_files | beside if not f.is_relative_to(ours))
