"""Rehearse every launch script of slime's examples/ with `slime-check smoke` on slime-ref (CPU).

For each `examples/*/*.sh` of a slime release that starts train.py or train_async.py, the bench builds
what the example needs to rehearse on this machine and nothing more, runs
`slime-check smoke SCRIPT --out OUT --json` (one after another, never in parallel), and prints one JSON
object: per script its outcome, seconds, the coverage of its hook files and its outside services.

What it builds, per script, in a folder of its own under --work (slime's files are exported from the
git mirror at run time, never committed):

  root/slime/       slime's examples/ and scripts/models/ at --tag. The scripts read `/root/...` paths
                    (checkpoints, data, `source /root/slime/scripts/models/...`): in this copy of the
                    script (and of the --eval-config YAML it names) those literal paths are pointed at
                    WORK/N/root/... (listed per file under "rewritten_paths"). Nothing else in slime's
                    files is changed. Paths the script reads from variables (MODEL_DIR, DATA_PATH,
                    HF_CHECKPOINT, ...) are given with smoke's --env instead ("env").
  root/<model>/     config.json only: a Qwen3-style config of the size the script's MODEL_ARGS name,
                    with the checkpoint's own model_type; the smoke builds a tiny model of that family.
  root/<data>       a few prompt rows in the example's own format (the keys its --input-key,
                    --label-key, --metadata-key read; .jsonl or .parquet as the script names), for
                    --prompt-data, --eval-prompt-data and the datasets of --eval-config.
  responses.jsonl   for examples whose generate loops over tool calls (retool, search-r1) or agents
                    (multi_agent): scripted turns for the stand-in model (smoke's --responses), so the
                    tool and answer branches run.
  out/              the smoke's --out (its report, log, coverage).

Outside services: search-r1's retriever (127.0.0.1:8000/retrieve) and on-policy distillation's teacher
(127.0.0.1:13141/generate) get a stand-in the bench starts on 127.0.0.1 for that script and stops after
it. strands' packages come from PyPI (``packages``: installed once into ~/.cache/slime-ref/bench-packages,
and put on the hooks' PYTHONPATH). The others (E2B sandboxes, the tau-bench user simulator, IFBench,
W&B) are not stood in: the bench checks that the smoke ends in a finding naming them (or, for W&B, runs
it offline) and says which, per service, under "services".

Outcomes: "passed" (the run finished, no finding FAILs), "findings" (it ran; the FAIL ids are listed),
"refused" (smoke did not start the job: a check or a hook import FAILed first, or smoke refused the
script; the finding or message is given), "stopped" (the run did not finish: smoke's --timeout, or the
bench's own guard of --timeout + 300 s for the checks and assets around it).

    PYTHONPATH=reference_impl python bench/smoke_examples.py --output results/smoke-examples.json
    PYTHONPATH=reference_impl python bench/smoke_examples.py --only retool search-r1 --work /tmp/se

Progress goes to stderr. The 15 scripts of v0.3.1 take about 12 minutes on 2 CPU cores (the refused
ones stop in seconds; each run is 50-100 s).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "reference_impl"))  # the bench runs from a checkout, installed or not
from slime_common.process_tree import start_in_session, stop_groups  # noqa: E402

DEFAULT_MIRROR = Path("/work/.mirror/THUDM+slime/repo")
INVENTORY = REPO / "reference_impl" / "slime_rehearse" / "compat" / "examples_v0.3.1.json"
ENTRY = re.compile(r"\btrain(_async)?\.py\b")
GUARD_S = 300  # the bench's margin over smoke's --timeout, for its checks, assets and hook preflight


def log(msg: str) -> None:
    print(f"[smoke_examples] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# what each example reads: rows in its own format, scripted turns, services
# ---------------------------------------------------------------------------------------------

DAPO_PROMPT = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\n"
               "Remember to put your answer on its own line after \"Answer:\".")
MATH = [("What is 6 times 7?", "42"), ("What is 15 plus 19?", "34"), ("What is 100 minus 37?", "63"),
        ("What is 9 squared?", "81")]
SEARCH_PROMPT = ("Answer the given question. You must conduct reasoning inside <think> and </think> first every "
                 "time you get new information. After reasoning, if you find you lack some knowledge, you can call "
                 "a search engine by <search> query </search> and it will return the top searched results between "
                 "<information> and </information>. You can search as many times as your want. If you find no "
                 "further external knowledge needed, you can directly provide the answer inside <answer> and "
                 "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
                 "Question: {q}?\n")
QA = [("what is the capital of france", "Paris"), ("who wrote the novel moby dick", "Herman Melville"),
      ("which planet is known as the red planet", "Mars"), ("what is the largest ocean on earth", "Pacific Ocean")]
# a 1x1 PNG: geo3k_imgurl's rows carry their images as URLs; a data URL keeps the row self-contained
PIXEL = "data:image/png;base64," + base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082")).decode()


def math_rows(input_key: str, label_key: str | None) -> list[dict]:
    """dapo-math-17k / aime-2024 as slime's READMEs download them: a chat prompt and an integer label."""
    rows = []
    for q, a in MATH:
        row = {input_key: [{"role": "user", "content": DAPO_PROMPT.format(q=q)}]}
        if label_key:
            row[label_key] = a
        rows.append(row)
    return rows


def search_rows(input_key: str, label_key: str) -> list[dict]:
    """Search-R1's nq_hotpotqa_train parquet (scripts/data_process/qa_search_train_merge.py)."""
    return [{"data_source": "nq", input_key: [{"role": "user", "content": SEARCH_PROMPT.format(q=q)}],
             "ability": "fact-reasoning", label_key: {"ground_truth": {"target": [a]}, "style": "rule"},
             "extra_info": {"index": i, "split": "train"}} for i, (q, a) in enumerate(QA)]


def sft_rows(input_key: str) -> list[dict]:
    """ReTool-SFT after examples/retool/sft_data_processing.py: system/user/assistant messages."""
    rows = []
    for q, a in MATH:
        rows.append({input_key: [
            {"role": "system", "content": "You are a helpful assistant that can use Python tools."},
            {"role": "user", "content": q},
            {"role": "assistant", "content": f"<code>\n```python\nprint({a})\n```\n</code>\n<interpreter>\n{a}\n"
                                             f"</interpreter>\nAnswer: \\boxed{{{a}}}"}]})
    return rows


def gpqa_rows(input_key: str, label_key: str) -> list[dict]:
    """GPQA-diamond for slime's rm_type gpqa (rm_hub/gpqa.py): the letter, choices in the metadata."""
    choices = ["Helium", "Neon", "Argon", "Krypton"]
    return [{input_key: [{"role": "user", "content": f"Which noble gas is lightest? (question {i})\n" + "\n".join(
        f"{'ABCD'[k]}. {c}" for k, c in enumerate(choices)) + "\nAnswer with the letter."}], label_key: "A",
        "metadata": {"choices": choices, "correct_letter": "A"}} for i in range(2)]


def ifbench_rows(input_key: str, label_key: str) -> list[dict]:
    """IFBench for slime's rm_type ifbench (rm_hub/ifbench.py): the instructions in the metadata."""
    text = "Write one sentence about the sea, in lowercase letters only."
    return [{input_key: [{"role": "user", "content": text}], label_key: "",
             "metadata": {"record_id": i, "prompt_text": text, "instruction_id_list": ["change_case:english_lowercase"],
                          "kwargs": [{}]}} for i in range(2)]


def tau_rows(input_key: str) -> list[dict]:
    """tau-bench's retail tasks as examples/tau-bench/tau1_mock.py writes them: the task index and the task."""
    return [{input_key: i, "metadata": {"user_id": f"user_{i}", "instruction": "Return the blue kettle.",
                                        "actions": [], "outputs": []}} for i in range(4)]


def geo3k_rows(input_key: str, label_key: str) -> list[dict]:
    """chenhegu/geo3k_imgurl: problem, answer, images (geo3k_vlm/README.md)."""
    return [{input_key: f"<image>Find x. The angles of the figure sum to {s}.", label_key: a, "images": [PIXEL]}
            for s, a in (("180", "60"), ("360", "90"), ("540", "108"), ("720", "120"))]


def swe_rows(input_key: str, label_key: str, metadata_key: str) -> list[dict]:
    """A scaleswe-shaped row (coding_agent_rl/swe.py get_metadata): prompt, label, flat metadata."""
    return [{input_key: f"Fix the off-by-one error in utils.count_{i}.", label_key: f"demo__repo-{i}",
             metadata_key: {"instance_id": f"demo__repo-{i}", "image": "python:3.11-slim", "workdir": "/testbed",
                            "problem_statement": f"count_{i} returns one too many.", "eval_cmd": "pytest -q"}}
            for i in range(4)]


# Scripted turns stay under the smoke's 32-token response cap in its byte-level stand-in tokenizer (a
# longer turn is cut at the cap, and a cut tool call never reaches the tool).


def retool_responses() -> list[dict]:
    """Code to run, then the boxed answer (generate_with_retool.postprocess_predictions): a <code> block,
    and a ```python block. (Its <tool_call> JSON shape is 67 tokens here, over the cap.)"""
    out = []
    for q, a in MATH:
        out.append({"prompt": q, "response": [f"<code>print({a})</code>", f"Answer: \\boxed{{{a}}}"],
                    "correct": True})
        out.append({"prompt": q, "response": [f"```python\nprint({a})\n```", f"Answer: \\boxed{{{a}}}"],
                    "correct": True})
    return out


def search_responses() -> list[dict]:
    """A <search> turn, then the <answer> (generate_with_search.postprocess_predictions)."""
    return [{"prompt": q, "response": [f"<search>{q}</search>", f"<answer>{a}</answer>"], "correct": True}
            for q, a in QA]


def multi_agent_responses() -> list[dict]:
    """A reasoning block then the boxed answer, and a judgment: the solver, rewriter and selector agents
    each take the text after </think> (agent_system.generate_response, extract_selected_solution_idx)."""
    return [{"prompt": q, "response": f"<think>ok</think>\\boxed{{{a}}} Judgment: 1", "correct": True}
            for q, a in MATH]


@dataclass
class Spec:
    """What one launch script needs here. ``env``: variables it reads, as paths under the script's root
    (``{root}``) or literal values; ``data``: the row format of its --prompt-data; ``model_type``: its
    checkpoint's config.json model_type; ``services``: how each outside service is handled."""

    data: str
    model_type: str
    env: dict[str, str] = field(default_factory=dict)
    responses: object = None  # a function giving --responses rows
    stand_ins: list[str] = field(default_factory=list)  # "retriever", "teacher"
    services: list[dict] = field(default_factory=list)  # {"service", "handled": stand-in|finding|offline, "names"}
    text_config: bool = False  # the checkpoint's config.json nests the language model under text_config
    packages: list[str] = field(default_factory=list)  # PyPI packages its hooks import (see packages_site)


DAPO_DATA = "{root}/datasets/dapo-math-17k/dapo-math-17k.jsonl"  # the scripts' default, under the work folder
WANDB = {"service": "Weights & Biases", "handled": "offline", "names": []}
SPECS: dict[str, Spec] = {
    "coding_agent_rl/run_qwen36_35b_a3b_swe_8nodes.sh": Spec(
        "swe", "qwen3_5_moe", text_config=True,
        env={"HF_CHECKPOINT": "{root}/models/Qwen3.6-35B-A3B", "PROMPT_DATA": "{root}/data/swe_train.jsonl",
             "MASTER_ADDR": "127.0.0.1"},
        services=[{"service": "E2B sandbox service", "handled": "finding", "names": ["E2B"]},
                  {"service": "Claude Code / Codex CLI in the sandboxes", "handled": "finding",
                   "names": ["slime.agent", "agent harness", "agent framework"]},
                  {"service": "the example's adapter HTTP server", "handled": "finding",
                   "names": ["slime.agent", "agent framework"]},
                  {"service": "swebench", "handled": "finding", "names": ["swebench", "slime.agent"]},
                  {"service": "8-node Ray cluster", "handled": "not needed (one rank, one engine)", "names": []}]),
    "delta_weight_sync/run-glm4.7-30B-A3B-delta.sh": Spec(
        "math", "glm4_moe_lite",
        env={"MODEL_DIR": "{root}/models/GLM-4.7-Flash", "DATA_PATH": DAPO_DATA},
        services=[{"service": "shared filesystem for --update-weight-disk-dir", "handled": "not needed "
                   "(the smoke writes it under OUT)", "names": []},
                  {"service": "2-node Ray cluster", "handled": "not needed (one rank, one engine)", "names": []}]),
    "eval_multi_task/multi_task.sh": Spec(
        "math", "qwen3",
        services=[{"service": "IFBench checkers (the yaml's rm_type ifbench)", "handled": "finding",
                   "names": ["per-dataset settings are not"]}, WANDB]),
    "fully_async/run-qwen2.5-0.5B-fully_async.sh": Spec(
        "math", "qwen2",
        env={"MODEL_DIR": "{root}/models/Qwen2.5-0.5B-Instruct", "DATA_PATH": DAPO_DATA}),
    "fully_async/run-qwen3.5-9B-fully_async.sh": Spec(
        "math", "qwen3_5", text_config=True,
        env={"MODEL_DIR": "{root}/models/Qwen3.5-9B", "DATA_PATH": DAPO_DATA}),
    "geo3k_vlm/run_geo3k_qwen35.sh": Spec(
        "geo3k", "qwen3_5_moe", text_config=True, env={"WANDB_API_KEY": ""},  # unset: the script's no-W&B branch
        services=[{"service": "Hugging Face Hub (model, dataset, pip)", "handled": "not needed (config.json and "
                   "rows built here; the script's downloads are not run by the smoke)", "names": []}, WANDB]),
    "multi_agent/run-qwen3-30B-A3B-multi-agent.sh": Spec("math", "qwen3_moe", responses=multi_agent_responses),
    "on_policy_distillation/run-qwen3-8B-opd-megatron.sh": Spec("math", "qwen3"),
    "on_policy_distillation/run-qwen3-8B-opd.sh": Spec(
        "math", "qwen3", stand_ins=["teacher"],
        services=[{"service": "teacher SGLang server at --rm-url", "handled": "stand-in", "names": []}]),
    "retool/retool_qwen3_4b_rl.sh": Spec(
        "math", "qwen3", responses=retool_responses,
        services=[WANDB, {"service": "jinja2 and the local tool subprocess", "handled": "here (jinja2 installed; "
                          "tool_sandbox runs the code in a subprocess)", "names": []}]),
    "retool/retool_qwen3_4b_sft.sh": Spec("sft", "qwen3", services=[WANDB]),
    "search-r1/run_qwen2.5_3B.sh": Spec(
        "search", "qwen2", responses=search_responses, stand_ins=["retriever"],
        services=[{"service": "retrieval server at 127.0.0.1:8000/retrieve", "handled": "stand-in", "names": []}]),
    "strands_sglang/strands_qwen3_8b.sh": Spec(
        "math", "qwen3", packages=["strands-sglang==0.4.2"],  # the version its README installs
        services=[{"service": "strands-agents and strands-sglang", "handled": "installed (PyPI, on the "
                   "hooks' PYTHONPATH)", "names": []}, WANDB]),
    "tau-bench/run_qwen3_4B.sh": Spec(
        "tau", "qwen3",
        services=[{"service": "tau-bench and its user-simulator LLM API (Gemini)", "handled": "finding",
                   "names": ["tau_bench", "GEMINI_API_KEY"]},
                  {"service": "sglang (its FunctionCallParser)", "handled": "finding", "names": ["sglang"]}]),
    "train_infer_mismatch_helper/run-qwen3-4b-mis.sh": Spec("math", "qwen3", services=[WANDB]),
}


# ---------------------------------------------------------------------------------------------
# stand-in services on 127.0.0.1
# ---------------------------------------------------------------------------------------------


class StandIn:
    """An aiohttp app served from a thread of this process on 127.0.0.1:port; stop() ends it."""

    def __init__(self, name: str, port: int, routes):
        self.name, self.port, self.routes = name, port, routes
        self.requests = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        from aiohttp import web

        asyncio.set_event_loop(self.loop)
        app = web.Application()
        for method, path, handler in self.routes:
            app.router.add_route(method, path, self._counted(handler))
        self.runner = web.AppRunner(app, access_log=None)
        try:
            self.loop.run_until_complete(self.runner.setup())
            self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        except OSError as e:
            self.error = e
            self.ready.set()
            return
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def _counted(self, handler):
        async def wrapped(request):
            self.requests += 1
            return await handler(request)
        return wrapped

    def start(self) -> StandIn:
        self.thread.start()
        self.ready.wait(30)
        if self.error:
            raise RuntimeError(f"the stand-in {self.name} cannot bind 127.0.0.1:{self.port}: {self.error}")
        return self

    def stop(self):
        if self.thread.is_alive() and not self.error:
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def retriever() -> StandIn:
    """Search-R1's retrieval_server.py API: POST /retrieve {"queries", "topk", "return_scores": false} ->
    {"result": [[{"id", "contents": '"Title"\\ntext'}, ...] per query]}."""
    from aiohttp import web

    answers = dict(QA)

    async def retrieve(request):
        body = await request.json()
        result = []
        for query in body.get("queries", []):
            answer = next((a for q, a in answers.items() if q in query.lower()), "nothing")
            docs = [{"id": str(k), "contents": f"\"{query.title()}\"\nReference {k}: the answer is {answer}."}
                    for k in range(int(body.get("topk") or 3))]
            result.append(docs)
        return web.json_response({"result": result})

    return StandIn("retriever", 8000, [("POST", "/retrieve", retrieve)])


def teacher() -> StandIn:
    """An SGLang /generate that scores the prompt, as the on-policy-distillation teacher is asked
    (max_new_tokens 0, return_logprob, logprob_start_len 0): input_token_logprobs, the first None."""
    from aiohttp import web

    async def generate(request):
        body = await request.json()
        ids = body.get("input_ids") or []
        logprobs = [[None, ids[0], None]] if ids else []
        logprobs += [[-0.05 - (t % 97) / 100.0, t, None] for t in ids[1:]]
        return web.json_response({"text": "", "meta_info": {
            "input_token_logprobs": logprobs, "prompt_tokens": len(ids), "completion_tokens": 0,
            "finish_reason": {"type": "length", "length": 0}}})

    async def health(request):
        return web.Response(text="ok")

    return StandIn("teacher", 13141, [("POST", "/generate", generate), ("GET", "/health_generate", health)])


STAND_INS = {"retriever": retriever, "teacher": teacher}


# ---------------------------------------------------------------------------------------------
# building what a script reads
# ---------------------------------------------------------------------------------------------

ROOT_PATH = re.compile(r"(?<![\w./])/root(?=/|\b)")
DEFAULT_OF = re.compile(r"\$\{(\w+):?-$")


def point_root_paths(path: Path, root: Path, given_env: set[str]) -> list[str]:
    """Point the file's literal /root/... paths at ``root`` (in this copy only); a /root path that is the
    default of a variable given with --env is left alone. Returns the paths pointed, as written."""
    text = path.read_text()
    pointed: list[str] = []
    out, last = [], 0
    for m in ROOT_PATH.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if text[line_start:m.start()].lstrip().startswith("#"):
            continue  # a comment
        default = DEFAULT_OF.search(text[max(0, m.start() - 40):m.start()])
        if default and default.group(1) in given_env:
            continue
        end = re.match(r"[^\s\"'\\:;,()\]]*", text[m.start():]).end() + m.start()
        shown = text[m.start():end]
        pointed.append(shown[:-1] if shown.endswith("}") and shown.count("${") < shown.count("}") else shown)
        out += [text[last:m.start()], str(root)]
        last = m.end()
    if pointed:
        path.write_text("".join(out) + text[last:])
    return sorted(set(pointed))


def flags_of(words: list[str]) -> dict[str, list[str]]:
    """flag -> its values (the last occurrence), as slime's parser would read these scripts' flags."""
    flags: dict[str, list[str]] = {}
    i = 0
    while i < len(words):
        if words[i].startswith("--"):
            name, values = words[i], []
            i += 1
            while i < len(words) and not words[i].startswith("--"):
                values.append(words[i])
                i += 1
            flags[name] = values
        else:
            i += 1
    return flags


def read_argv(script: Path, slime_dir: Path, env: dict[str, str]) -> tuple[str, dict[str, list[str]], set[str]]:
    """The train command's entry, its flags and the words that cannot be known without running the
    script, read as slime-check reads it (never run)."""
    from slime_check.launch_script import read_script

    reading = read_script(script, slime_dir, env)
    if not reading.invocations:
        return "", {}, set()
    inv = reading.invocations[0]
    return inv.entry, flags_of([w.text for w in inv.argv]), {w.text for w in inv.argv if not w.known}


def model_config(flags: dict[str, list[str]], model_type: str, text_config: bool) -> dict:
    """A Qwen3-style config.json of the size MODEL_ARGS name, with the checkpoint's model_type."""
    def num(flag, default, cast=int):
        try:
            return cast(flags[flag][0])
        except (KeyError, IndexError, ValueError):
            return default

    heads = num("--num-attention-heads", 16)
    hidden = num("--hidden-size", 2048)
    cfg = {
        "architectures": ["ForCausalLM"], "model_type": model_type,
        "num_hidden_layers": num("--num-layers", 28), "hidden_size": hidden,
        "intermediate_size": num("--ffn-hidden-size", 4 * hidden), "num_attention_heads": heads,
        "num_key_value_heads": num("--num-query-groups", heads) if "--group-query-attention" in flags else heads,
        "head_dim": num("--kv-channels", hidden // heads), "vocab_size": num("--vocab-size", 151936),
        # Megatron-LM's defaults where MODEL_ARGS are silent
        "rope_theta": num("--rotary-base", 10000.0, float), "rms_norm_eps": num("--norm-epsilon", 1e-5, float),
        "tie_word_embeddings": "--untie-embeddings-and-output-weights" not in flags,
        "attention_bias": "--add-qkv-bias" in flags, "max_position_embeddings": 40960,
        "hidden_act": "silu", "torch_dtype": "bfloat16",
    }
    if "--num-experts" in flags:
        cfg.update({"num_experts": num("--num-experts", 8), "num_experts_per_tok": num("--moe-router-topk", 2),
                    "moe_intermediate_size": num("--moe-ffn-hidden-size", 768)})
        if "--moe-shared-expert-intermediate-size" in flags:
            cfg["shared_expert_intermediate_size"] = num("--moe-shared-expert-intermediate-size", 0)
    family = {"qwen2": "Qwen2", "qwen3": "Qwen3", "qwen3_moe": "Qwen3Moe", "qwen3_5": "Qwen3_5",
              "qwen3_5_moe": "Qwen3_5Moe", "glm4_moe_lite": "Glm4MoeLite"}.get(model_type, "Qwen3")
    cfg["architectures"] = [f"{family}ForCausalLM"]
    if text_config:  # Qwen3.5/3.6 checkpoints are vision-language: the language model under text_config
        text = {**cfg, "model_type": f"{model_type}_text"}
        del text["architectures"]
        return {"architectures": [f"{family}ForConditionalGeneration"], "model_type": model_type,
                "text_config": text, "tie_word_embeddings": cfg["tie_word_embeddings"]}
    return cfg


def write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rows_for(kind: str, flags: dict[str, list[str]]) -> list[dict]:
    key = lambda flag, default=None: (flags.get(flag) or [default])[0]  # noqa: E731
    input_key, label_key = key("--input-key", "input"), key("--label-key")
    if kind == "math":
        return math_rows(input_key, label_key)
    if kind == "search":
        return search_rows(input_key, label_key)
    if kind == "sft":
        return sft_rows(input_key)
    if kind == "gpqa":
        return gpqa_rows(input_key, label_key)
    if kind == "ifbench":
        return ifbench_rows(input_key, label_key)
    if kind == "tau":
        return tau_rows(input_key)
    if kind == "geo3k":
        return geo3k_rows(input_key, label_key)
    if kind == "swe":
        return swe_rows(input_key, label_key, key("--metadata-key", "metadata"))
    raise ValueError(kind)


def inside(path: Path, folder: Path) -> bool:
    return Path(os.path.normpath(path)).is_relative_to(folder)


def build(script: Path, spec: Spec, slime_dir: Path, root: Path) -> dict:
    """Point the script's /root paths at ``root``, read its flags, write config.json and the rows it reads
    (its --prompt-data, --eval-prompt-data and the datasets of its --eval-config). Returns what was done;
    ``refused`` when the script reads a path outside the work folder."""
    env = {k: v.format(root=root) for k, v in spec.env.items()}
    pointed = {str(script.relative_to(slime_dir)): point_root_paths(script, root, set(env))}
    entry, flags, unknown = read_argv(script, slime_dir, env)
    made: list[str] = []
    done = {"env": env, "rewritten_paths": pointed, "entry": entry, "assets": made}
    if unknown:
        done["unknown_words"] = sorted(unknown)
    if not flags:
        return done

    def place(value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else slime_dir / p  # slime's scripts run from the checkout

    hf = flags.get("--hf-checkpoint")
    if hf and hf[0] not in unknown:
        folder = place(hf[0])
        if not inside(folder, root):
            done["refused"] = f"--hf-checkpoint {hf[0]} is outside the work folder"
            return done
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(model_config(flags, spec.model_type, spec.text_config),
                                                       indent=1))
        made.append(str((folder / "config.json").relative_to(root)))
    targets = [("prompt", flags.get("--prompt-data", [None])[0], spec.data)]
    ev = flags.get("--eval-prompt-data") or []
    targets += [(f"eval {name}", p, spec.data) for name, p in zip(ev[0::2], ev[1::2], strict=False)]
    config = (flags.get("--eval-config") or [None])[0]
    if config and config not in unknown and place(config).is_file() and inside(place(config), slime_dir):
        import yaml

        path = place(config)
        pointed[str(path.relative_to(slime_dir))] = point_root_paths(path, root, set())
        for entry_ in (yaml.safe_load(path.read_text()) or {}).get("eval", {}).get("datasets", []):
            kind = entry_.get("rm_type") if entry_.get("rm_type") in ("gpqa", "ifbench") else spec.data
            targets.append((f"eval-config {entry_.get('name')}", str(entry_.get("path")), kind))
    for what, value, kind in targets:
        if not value or value in unknown:  # unknown: the smoke says so; nothing to build where nobody knows
            continue
        path = place(value)
        if not inside(path, root):
            done["refused"] = f"{what} data {value} is outside the work folder"
            return done
        write_rows(path, rows_for(kind, flags))
        made.append(str(path.relative_to(root)))
    return done


# ---------------------------------------------------------------------------------------------
# running one script
# ---------------------------------------------------------------------------------------------


PACKAGES_CACHE = Path.home() / ".cache" / "slime-ref" / "bench-packages"


def packages_site(packages: list[str]) -> Path:
    """A folder holding ``packages`` and those of their dependencies this environment lacks, installed
    once from PyPI (``pip install --target``, torch pinned by constraints-cpu.txt) and cached. The
    distributions this environment already has are removed from it, so the folder, put first on the
    hooks' PYTHONPATH, adds packages and never replaces the ones slime-ref runs on."""
    import hashlib
    import importlib.metadata

    site = PACKAGES_CACHE / hashlib.sha256(" ".join(sorted(packages)).encode()).hexdigest()[:16]
    if (site / ".complete").is_file():
        return site
    tmp = site.with_name(site.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"installing {' '.join(packages)} into {site}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(tmp), "-c",
                    str(REPO / "constraints-cpu.txt"), *packages], check=True, stdin=subprocess.DEVNULL)
    for info in tmp.glob("*.dist-info"):
        name = info.name.split("-")[0]
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # new here: kept
        for line in (info / "RECORD").read_text().splitlines():
            target = tmp / line.split(",")[0]
            if target.is_file() and target.resolve().is_relative_to(tmp.resolve()):
                target.unlink()
        shutil.rmtree(info, ignore_errors=True)
    (tmp / ".complete").write_text(" ".join(packages))
    shutil.rmtree(site, ignore_errors=True)
    tmp.rename(site)
    return site


def run_smoke(script: Path, slime_dir: Path, out: Path, env: dict[str, str], responses: Path | None,
              timeout_s: float, rollouts: int,
              site: Path | None = None,
              slime_version: str | None = None) -> tuple[int | None, dict | None, str, float, bool]:
    """(exit status, the --json report, stderr tail, wall seconds, stopped by the bench's guard).
    ``slime_version``: the slime the examples come from, for smoke's --slime-version (the exported tree
    has no git history to tell it)."""
    cmd = [sys.executable, "-c", "from slime_rehearse.cli import main; main()", "smoke", str(script),
           "--with", "slime-ref", "--slime-dir", str(slime_dir), "--out", str(out), "--json",
           "--timeout", str(timeout_s), "--rollouts", str(rollouts)]
    if slime_version:
        cmd += ["--slime-version", slime_version]
    for name, value in env.items():
        cmd += ["--env", f"{name}={value}"]
    if responses:
        cmd += ["--responses", str(responses)]
    run_env = {**os.environ, "COLUMNS": "200",
               "PYTHONPATH": os.pathsep.join(str(p) for p in [REPO / "reference_impl", site,
                                                              os.environ.get("PYTHONPATH")] if p)}
    start = time.perf_counter()
    with open(out.parent / "smoke.stdout", "wb") as stdout, open(out.parent / "smoke.stderr", "wb") as stderr:
        proc = start_in_session(cmd, stdout=stdout, stderr=stderr, env=run_env, cwd=slime_dir)
        guarded = False
        try:
            proc.wait(timeout=timeout_s + GUARD_S)
        except subprocess.TimeoutExpired:
            guarded = True
            # Ctrl-C, as at a terminal: smoke stops exactly what it started; SIGKILL after 90 s
            stop_groups([proc], interrupt_s=90, terminate_s=None)
        except KeyboardInterrupt:
            stop_groups([proc], interrupt_s=90, terminate_s=None)
            raise
    wall = time.perf_counter() - start
    text = (out.parent / "smoke.stdout").read_text(errors="replace")
    err = (out.parent / "smoke.stderr").read_text(errors="replace")
    report = None
    if text.strip().startswith("{"):
        try:
            report = json.loads(text)
        except ValueError:
            report = None
    return proc.returncode, report, err.strip()[-1500:], wall, guarded


def outcome_of(rc, report, err: str, guarded: bool) -> dict:
    if guarded:
        return {"outcome": "stopped", "reason": f"the bench stopped it after --timeout + {GUARD_S} s"}
    if report is None:
        line = next((ln for ln in reversed(err.splitlines()) if ln.strip()), f"exit status {rc}, no report")
        return {"outcome": "refused", "finding": line.strip()}
    run = report.get("run", {})
    fails = [{"id": f["id"], "finding": f["finding"]} for f in report.get("findings", []) if f["status"] == "FAIL"]
    if "stopped" in run:
        return {"outcome": "refused", "reason": run["stopped"], "finding": fails}
    if run.get("timed_out"):
        return {"outcome": "stopped", "reason": "the run did not finish within smoke's --timeout", "fails": fails}
    if fails:
        return {"outcome": "findings", "fails": fails}
    return {"outcome": "passed"}


def coverage_of(report: dict | None, slime_dir: Path) -> list[dict]:
    cov = ((report or {}).get("run") or {}).get("coverage") or []
    out = []
    for entry in cov:
        path = Path(entry["file"])
        name = str(path.relative_to(slime_dir)) if path.is_relative_to(slime_dir) else str(path)
        missed = sorted({g["function"] for g in entry.get("missing", []) if g.get("function")
                         and g["function"] in entry.get("functions_run", [])})
        out.append({"file": name, "run": entry["run"], "statements": entry["statements"],
                    "functions_with_lines_not_run": missed})
    return out


NAMING = {"smoke.not_rehearsed", "smoke.eval_config"}  # besides FAILs, the findings that say what is not rehearsed


def services_of(spec: Spec, report: dict | None, err: str, stand_ins: dict[str, dict]) -> list[dict]:
    """How each outside service was handled, checked against the report: a "finding" must name the
    service (a FAIL, or the findings that say what is not rehearsed); "offline" must be in the changes
    the smoke made; a stand-in reports the requests it answered."""
    findings = [f for f in (report or {}).get("findings", []) if f["status"] == "FAIL" or f["id"] in NAMING]
    text = err + json.dumps(findings)
    run = (report or {}).get("run") or {}
    started = report is not None and "stopped" not in run
    out = []
    for s in spec.services:
        entry = {"service": s["service"], "handled": s["handled"]}
        if s["handled"] == "finding":
            named = [n for n in s["names"] if n in text]
            entry["named_by"] = sorted({f["id"] for f in findings if any(n in json.dumps(f) for n in named)}) or (
                ["smoke's error"] if named else [])
            if not named:
                entry["handled"] = "NOT NAMED by any finding"
        elif s["handled"] == "offline":
            if not started:
                entry["handled"] = "not reached (the job did not start)"
            elif any("W&B offline" in c for c in run.get("changes", [])):
                entry["handled"] = "offline (the smoke runs W&B offline)"
            else:
                entry["handled"] = "not used by the rehearsal"
        elif s["handled"] == "stand-in":
            entry.update(stand_ins.get(next(iter(spec.stand_ins), ""), {}))
        out.append(entry)
    return out


def rehearse(rel: str, src: Path, work: Path, index: int, opts, inventory: dict) -> dict:
    example = rel.split("/")[0]
    spec = SPECS.get(rel)
    inv = inventory.get("examples", {}).get(example, {})
    result: dict = {"script": rel, "outside_services": inv.get("outside_services", []),
                    "inventory_on_slime_ref": inv.get("on_slime_ref")}
    if spec is None:
        return {**result, "outcome": "refused", "finding": "the bench has no spec for this script (new in this "
                "slime version?): add one to SPECS in bench/smoke_examples.py"}
    case = work / f"{index:02d}"
    root = case / "root"
    slime_dir = root / "slime"
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(src, slime_dir, symlinks=True)
    script = slime_dir / "examples" / rel
    done = build(script, spec, slime_dir, root)
    result.update({k: v for k, v in done.items() if k != "entry"})
    if "refused" in done:
        return {**result, "outcome": "refused", "finding": done["refused"]}
    responses = None
    if spec.responses:
        responses = case / "responses.jsonl"
        responses.write_text("".join(json.dumps(r) + "\n" for r in spec.responses()))
        result["responses"] = [json.loads(line) for line in responses.read_text().splitlines()][:2]
    running: list[StandIn] = []
    stand_ins: dict[str, dict] = {}
    try:
        for name in spec.stand_ins:
            try:
                running.append(STAND_INS[name]().start())
            except RuntimeError as e:
                return {**result, "outcome": "refused", "finding": str(e)}
        site = packages_site(spec.packages) if spec.packages else None
        if site is not None:
            result["packages"] = {"installed": spec.packages, "site": str(site)}
        log(f"{rel}: smoke (stand-ins: {', '.join(spec.stand_ins) or 'none'})")
        rc, report, err, wall, guarded = run_smoke(script, slime_dir, case / "out", done["env"], responses,
                                                   opts.timeout, opts.rollouts, site,
                                                   opts.tag if opts.tag in ("v0.3.1", "main") else None)
    finally:
        for s in running:
            s.stop()
            stand_ins[s.name] = {"stand_in": f"127.0.0.1:{s.port}", "requests": s.requests}
    run = (report or {}).get("run") or {}
    result.update(outcome_of(rc, report, err, guarded))
    result.update({
        "returncode": rc, "seconds": round(run["phase_s"]["total"], 1) if "total" in run.get("phase_s", {}) else None,
        "wall_s": round(wall, 1), "coverage": coverage_of(report, slime_dir),
        "services": services_of(spec, report, err, stand_ins),
        "warns": sorted({f["id"] for f in (report or {}).get("findings", []) if f["status"] == "WARN"}),
        "not_rehearsed": [f["finding"] for f in (report or {}).get("findings", []) if f["id"] == "smoke.not_rehearsed"],
        "hooks": {p: {"flag": h["flag"], "calls": h["calls"], "errors": h["errors"]}
                  for p, h in run.get("hooks", {}).items()},
        "rewards": run.get("rewards"), "stand_in_answers": run.get("stand_in"),
    })
    if opts.work is not None:  # kept: the smoke's report, log and coverage are there
        result["out"] = str(case / "out")
    if report is None and err:
        result["stderr_tail"] = err[-600:]
    return result


# ---------------------------------------------------------------------------------------------


def why(result: dict) -> str | None:
    """One line on an outcome other than passed: the reason, then the first finding."""
    if result["outcome"] == "passed":
        return None
    finding = result.get("finding") or result.get("fails") or ""
    if isinstance(finding, list):  # the hook check's message repeats the flag and path: keep the cause
        finding = "; ".join(f"{f['id']}: " + re.sub(r"^(.*?) cannot be loaded: UserError: --[\w-]+ '[^']+': ",
                                                     r"\1: ", f["finding"]) for f in finding[:1])
    return " | ".join(x for x in (result.get("reason"), finding) if x)[:400]


def export(mirror: Path, tag: str, dest: Path) -> str:
    """slime's examples/ and scripts/models/ at ``tag`` into ``dest``; returns the commit."""
    commit = subprocess.run(["git", "-C", str(mirror), "rev-parse", "--verify", "--quiet", f"{tag}^{{commit}}"],
                            capture_output=True, text=True).stdout.strip()
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", str(mirror), "archive", tag, "examples", "scripts/models"],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise SystemExit(f"smoke_examples: git archive {tag} failed in {mirror}")
    return commit


def launch_scripts(src: Path) -> tuple[list[str], list[str]]:
    """(examples/*/*.sh that start train.py or train_async.py, other launchers skipped)."""
    scripts, others = [], []
    for path in sorted((src / "examples").glob("*/*")):
        rel = str(path.relative_to(src / "examples"))
        if path.suffix == ".sh" and ENTRY.search(path.read_text(errors="replace")):
            scripts.append(rel)
        elif path.name.startswith("run") and path.suffix == ".py":
            others.append(rel)
    return scripts, others


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slime-mirror", type=Path, default=DEFAULT_MIRROR,
                        help="slime's git repository (a bare mirror will do) holding --tag (default: %(default)s)")
    parser.add_argument("--tag", default="v0.3.1", help="the slime release whose examples are rehearsed")
    parser.add_argument("--work", type=Path, default=None,
                        help="work here and keep it (default: a short temp dir under /tmp, removed at the end; "
                             "keep the path short: Ray's socket paths live under each script's OUT)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="rehearse only these example folders or scripts (e.g. retool search-r1/run_qwen2.5_3B.sh)")
    parser.add_argument("--timeout", type=float, default=300, help="smoke's --timeout per script, seconds")
    parser.add_argument("--rollouts", type=int, default=2, help="smoke's --rollouts")
    parser.add_argument("--output", type=Path, default=None, help="also write the JSON here")
    opts = parser.parse_args()

    mirror = opts.slime_mirror
    ok = mirror.exists() and subprocess.run(
        ["git", "-C", str(mirror), "rev-parse", "--verify", "--quiet", f"{opts.tag}^{{commit}}"],
        capture_output=True).returncode == 0
    if not ok:
        print(f"smoke_examples: no slime git repository with {opts.tag} at {mirror} (give --slime-mirror)",
              file=sys.stderr)
        sys.exit(2)
    work = (opts.work or Path(tempfile.mkdtemp(prefix="se-", dir="/tmp"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    inventory = json.loads(INVENTORY.read_text()) if INVENTORY.is_file() else {}
    started = time.perf_counter()
    try:
        src = work / "src"
        shutil.rmtree(src, ignore_errors=True)
        commit = export(mirror, opts.tag, src)
        scripts, others = launch_scripts(src)
        chosen = [s for s in scripts if not opts.only or any(s == o or s.split("/")[0] == o for o in opts.only)]
        log(f"slime {opts.tag} ({commit[:10]}): {len(scripts)} launch scripts, rehearsing {len(chosen)} in {work}")
        results = []
        for rel in chosen:
            t = time.perf_counter()
            entry = rehearse(rel, src, work, scripts.index(rel), opts, inventory)
            results.append(entry)
            log(f"{rel}: {entry['outcome']} ({time.perf_counter() - t:.0f} s)")
        report = {
            "bench": "smoke_examples", "slime_version": opts.tag, "slime_commit": commit,
            "engine": "slime-ref (CPU)", "cpu_cores": os.cpu_count(), "rollouts": opts.rollouts,
            "timeout_s": opts.timeout, "date": time.strftime("%Y-%m-%d"),
            "edits_to_slime_files": "in the exported copy only: literal /root/... paths of each script pointed at "
                                    "its work folder (per script: rewritten_paths); nothing else",
            "launchers_not_rehearsed": {o: "not a shell launch script (a Python launcher; smoke rehearses .sh "
                                           "scripts or a train.py argv)" for o in others},
            "counts": {k: sum(r["outcome"] == k for r in results) for k in ("passed", "findings", "refused",
                                                                            "stopped")},
            "total_s": round(time.perf_counter() - started, 1),
            "table": [{"script": r["script"], "outcome": r["outcome"], "seconds": r.get("seconds"),
                       "coverage": ", ".join(f"{Path(c['file']).name} {c['run']}/{c['statements']}"
                                             for c in r.get("coverage", [])) or None,
                       "fails": [f["id"] for f in (r.get("fails") or r.get("finding") or [])
                                 if isinstance(f, dict)],
                       "why": why(r)} for r in results],
            "scripts": results,
        }
        text = json.dumps(report, indent=1)
        print(text)
        if opts.output:
            opts.output.parent.mkdir(parents=True, exist_ok=True)
            opts.output.write_text(text + "\n")
    finally:
        if opts.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
