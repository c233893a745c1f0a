"""``slime-check config``'s checks of the files a launch command points at: the HF checkpoint's
config.json against MODEL_ARGS, the prompt data's keys, ``--eval-config``; and the drift rows."""

from __future__ import annotations

import json
from pathlib import Path

from slime_check.config_argv import BATCH_DOC, DATA_DOC, DATA_ROWS, MODEL_DOC, UNKNOWN, Config, known
from slime_check.findings import Finding, Status
from slime_common.model_args import MODEL_ARGS, TIE_KEY, UNTIE_FLAG, hf_value, same_value, text_config

# ---------------------------------------------------------------------------------------------
# Files the config points at: HF config.json, prompt data
# ---------------------------------------------------------------------------------------------


def existing_path(cfg: Config, name: str) -> Path | None:
    """The path flag ``name`` gives, when it exists on this machine."""
    value = cfg.get(name)
    if not isinstance(value, str) or not value:
        return None
    path = Path(value).expanduser()
    return path if path.exists() else None


def check_hf_config(cfg: Config) -> list[Finding]:
    id_ = "config.hf_config"
    if not cfg.has("--hf-checkpoint"):
        return []
    folder = existing_path(cfg, "--hf-checkpoint")
    if folder is None or not (folder / "config.json").is_file():
        written = " ".join(w.text for w in cfg.given("--hf-checkpoint")[-1].values)
        return [Finding(id_, Status.SKIP, f"--hf-checkpoint {written} is not reachable here; "
                        "MODEL_ARGS not compared with its config.json.")]
    try:
        hf = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        return [Finding(id_, Status.WARN, f"{folder}/config.json cannot be read: {e}.", "Check the file.", MODEL_DOC)]
    hf = text_config(hf)
    moe = any(k in hf for k in ("moe_intermediate_size", "num_experts", "n_routed_experts", "num_local_experts"))
    freq = cfg.get("--moe-layer-freq")
    dense_layers = not moe or freq is None or (isinstance(freq, str) and "0" in freq)
    gqa = cfg.get("--group-query-attention") is True
    # compared below with their defaults: Megatron's, and the query groups only with GQA
    special = ("--num-query-groups", "--kv-channels")
    skipped = (*special, *(() if dense_layers else ("--ffn-hidden-size",)),
               *(() if cfg.has("--vocab-size") else ("--vocab-size",)))
    mismatches, compared = [], 0
    for arg in MODEL_ARGS:
        flag, hf_key = arg.flag, arg.hf_keys[-1]
        expected = None if flag in skipped else hf_value(hf, flag)
        if expected is None:
            continue
        value = cfg.number(flag)
        if value is UNKNOWN:
            continue
        compared += 1
        if value is None or not same_value(value, expected):
            mismatches.append(f"{hf_key} {expected} vs {flag} {value}{cfg.where(flag)}")
    kv = hf_value(hf, "--num-query-groups")
    heads = hf.get("num_attention_heads")
    if kv is not None and heads is not None:
        groups = cfg.number("--num-query-groups") if gqa else heads
        if groups is not UNKNOWN:
            compared += 1
            if groups != kv:
                what = f"--num-query-groups {groups}" if gqa else "no --group-query-attention"
                mismatches.append(f"num_key_value_heads {kv} vs {what}")
    head_dim = hf_value(hf, "--kv-channels")
    if head_dim is not None and cfg.get("--multi-latent-attention") is not True:
        # Megatron's --kv-channels defaults to hidden_size / heads; MLA sizes heads differently.
        channels = cfg.number("--kv-channels")
        hidden, n_heads = cfg.number("--hidden-size"), cfg.number("--num-attention-heads")
        if channels is None and known(hidden, n_heads) and n_heads:
            channels = hidden // n_heads
        if known(channels):
            compared += 1
            if channels != head_dim:
                mismatches.append(f"head_dim {head_dim} vs --kv-channels {channels}")
    tie = hf.get(TIE_KEY)  # absent: the model class decides, so it is not compared
    untie = cfg.get(UNTIE_FLAG) is True
    compared += tie is not None
    if tie is not None and tie == untie:
        untie_text = ("--untie-embeddings-and-output-weights" if untie
                      else "tied embeddings (no --untie-embeddings-and-output-weights)")
        mismatches.append(f"tie_word_embeddings {str(tie).lower()} vs {untie_text}")
    if mismatches:
        return [Finding(id_, Status.FAIL, f"MODEL_ARGS disagree with {folder}/config.json: {'; '.join(mismatches)}.",
                        "Source the scripts/models/*.sh that matches the checkpoint, or fix the flags (slime checks "
                        "several of these at start-up; the rest corrupt weight conversion).", MODEL_DOC)]
    return [Finding(id_, Status.PASS, f"MODEL_ARGS match {folder}/config.json ({compared} fields compared).")]


def first_rows(path: Path, n: int = DATA_ROWS) -> list:
    """The first rows of a .jsonl or .parquet prompt file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(path).iter_batches(batch_size=n), None)
        return batch.to_pylist() if batch is not None else []
    rows = []
    with path.open(errors="replace") as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
                if len(rows) >= n:
                    break
    return rows


def check_data(cfg: Config) -> list[Finding]:
    out = []
    input_key, label_key = cfg.get("--input-key"), cfg.get("--label-key")
    sets = [("--prompt-data", cfg.get("--prompt-data"), input_key, label_key)]
    eval_data = cfg.get("--eval-prompt-data")
    if isinstance(eval_data, list):
        paths = eval_data[1::2] if len(eval_data) > 1 else eval_data
        eval_input = cfg.get("--eval-input-key") or input_key
        eval_label = cfg.get("--eval-label-key") or label_key
        sets += [("--eval-prompt-data", p, eval_input, eval_label) for p in paths]
    for flag, value, in_key, lab_key in sets:
        if not isinstance(value, str) or in_key is UNKNOWN or lab_key is UNKNOWN:
            continue
        path = Path(value).expanduser()
        if not path.is_file():
            out.append(Finding("config.data", Status.SKIP, f"{flag} {value} is not reachable here; its keys are not "
                                                           f"checked."))
            continue
        try:
            rows = first_rows(path)
        except (OSError, ValueError) as e:  # bad JSON, bad parquet (ArrowInvalid is a ValueError)
            out.append(Finding("config.data", Status.FAIL, f"{flag} {value} cannot be read as "
                               f"{'parquet' if path.suffix == '.parquet' else 'JSON lines'}: {e}.",
                               "Use .jsonl (one JSON object per line) or .parquet.", DATA_DOC))
            continue
        missing = [k for k in (in_key, lab_key) if k and any(not isinstance(r, dict) or k not in r for r in rows)]
        if not rows:
            out.append(Finding("config.data", Status.WARN, f"{flag} {value} has no rows.", "Check the file.", DATA_DOC))
        elif missing:
            keys = sorted({k for r in rows if isinstance(r, dict) for k in r})
            out.append(Finding("config.data", Status.FAIL, f"{flag} {value}: the first {len(rows)} rows lack "
                               f"{', '.join(repr(k) for k in missing)} (their keys: {', '.join(keys)}).",
                               "Set --input-key / --label-key to the file's keys (slime's default --input-key is "
                               "'input').", DATA_DOC))
        else:  # a plain-text prompt is fine with --apply-chat-template: slime makes it one user message
            out.append(Finding("config.data", Status.PASS, f"{flag} {value}: the first {len(rows)} rows have "
                               f"{', '.join(repr(k) for k in (in_key, lab_key) if k)}."))
    return out


def check_eval_config(cfg: Config) -> list[Finding]:
    """The datasets of ``--eval-config`` (see :mod:`slime_check.eval_config`)."""
    from slime_check.eval_config import FLAG_FALLBACKS, eval_config_findings

    value = cfg.get("--eval-config")
    if value is None:
        return []
    if value is UNKNOWN:
        return [Finding("config.eval_config", Status.SKIP, f"--eval-config{cfg.where('--eval-config')} is symbolic "
                                                           "here; its datasets are not checked.")]
    out = []
    if cfg.has("--eval-prompt-data"):
        out.append(Finding("config.eval_config", Status.WARN, "--eval-prompt-data and --eval-config are both given: "
                           "slime evaluates the datasets of --eval-config and ignores --eval-prompt-data.",
                           "Drop --eval-prompt-data, or add its datasets to the YAML.", BATCH_DOC))
    flags = {f: cfg.get(f) for fallbacks in FLAG_FALLBACKS.values() for f in fallbacks}
    found = eval_config_findings(value, flags=flags)
    if cfg.target != "v0.3.1":  # main reads eval.defaults otherwise (#2242): the drift rows say how
        found = [f for f in found if not (f.status is Status.WARN and " defaults." in f.finding
                                          and "is ignored by slime" in f.finding)]
    return out + found


def check_drift(cfg: Config) -> list[Finding]:
    """Behaviours that differ between slime v0.3.1 and main the job relies on (see :mod:`slime_check.drift`)."""
    from slime_check.drift import drift_findings

    return drift_findings(cfg, cfg.target)

