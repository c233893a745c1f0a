"""``slime-check plan``'s inputs and report: a launch script's flags (and the model's config.json,
and the GPU) into a :class:`slime_check.plan.Job`; the plan into findings, a table and JSON.

The arithmetic lives in :mod:`slime_check.plan`. Nothing here imports torch.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from slime_check import plan as P
from slime_check.config_lint import UNKNOWN, Config, parse_argv
from slime_check.findings import FAQ, QUICK_START, Finding, Status, slime_doc
from slime_common.errors import UserError

PERF_DOC = slime_doc(QUICK_START, "perf_args-performance-and-parallelism-parameters")
COLOCATE_DOC = slime_doc(QUICK_START, "colocated-actor-and-rollout")
FAQ_DOC = slime_doc(FAQ)
DEFAULT_PROMPT = 1024


@dataclass
class Planned:
    """One train invocation's plan, with what was assumed on the way."""

    title: str
    plan: P.Plan
    notes: list[tuple[str, bool]] = field(default_factory=list)  # assumptions, and whether they change the shapes
    model_source: str = ""


# ---------------------------------------------------------------------------------------------
# The GPU
# ---------------------------------------------------------------------------------------------


def card_from(gpu: str | None, fixture: str | None) -> tuple[P.Card, int | None]:
    """The card (``--gpu`` wins over a capture) and the host's RAM in bytes (from the capture)."""
    host = None
    capture_card = None
    if fixture:
        capture_card, host = _from_capture(fixture)
    if gpu:
        return _named_card(gpu), host
    if capture_card is None:
        if fixture:
            raise UserError(f"--fixture {fixture}: the capture reports no GPU memory; name the GPU with --gpu "
                            f"(one of {', '.join(P.CARDS)}, or a size such as 79.2GiB)")
        raise UserError(f"name the GPU: --gpu H100-80GB (known: {', '.join(P.CARDS)}; or a size such as 79.2GiB), "
                        "or --fixture CAPTURE from `slime-check capture` on the GPU machine")
    return capture_card, host


def _named_card(gpu: str) -> P.Card:
    size = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(GiB|GB|G)?", gpu.strip(), re.I)
    if size:
        usable = int(float(size.group(1)) * P.GIB)
        return P.Card(f"{size.group(1)} GiB GPU", usable, usable // P.MIB + 600, "--gpu")
    wanted = gpu.upper().replace("_", "-")
    matches = [name for name in P.CARDS if name.upper() == wanted or name.upper().startswith(wanted + "-")]
    if len(matches) != 1:
        raise UserError(f"--gpu {gpu}: unknown GPU; use one of {', '.join(P.CARDS)}, or a size such as 79.2GiB")
    usable, smi, source = P.CARDS[matches[0]]
    return P.Card(matches[0], usable, smi, f"--gpu's table: {source}")


def _from_capture(path: str) -> tuple[P.Card | None, int | None]:
    from slime_check import facts
    from slime_check import probes as probes_
    from slime_check.prereqs import Machine, Options

    probe = probes_.CaptureProbe(path)  # a file that is no capture is a UserError naming --fixture
    machine = Machine(probe, Options())
    inventory = machine.inventory
    gpus = inventory.gpus if inventory else []
    torch_props = probe.run(probes_.TORCH_CUDA_PROPS)
    usable = None
    if torch_props.ok:
        parsed = facts.parse_torch_props(torch_props.text)
        if parsed and parsed[0]:
            sizes = [d.get("mem") for d in parsed[0] if isinstance(d.get("mem"), int)]
            usable = min(sizes) if sizes else None
    smi = min((g.memory_mib for g in gpus if g.memory_mib), default=None)
    card = None
    if usable or smi:
        name = gpus[0].name if gpus else "GPU"
        usable = usable or (smi - 600) * P.MIB
        card = P.Card(name, usable, smi or usable // P.MIB + 600, f"the capture {Path(path).name}")
    meminfo = probe.read_file(probes_.MEMINFO)
    total = facts.parse_meminfo(meminfo.text).get("MemTotal") if meminfo.ok else None
    return card, total


# ---------------------------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------------------------


class Flags:
    """Flag values for the plan: registry defaults apply; a symbolic value is a usage error."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def get(self, name: str, default=None):
        value = self.cfg.get(name)
        if value is UNKNOWN or (isinstance(value, list) and UNKNOWN in value):
            given = self.cfg.given(name)[-1]
            text = " ".join(w.text for w in given.values)
            raise UserError(f"{name} {text} ({given.where}) is not known without running the script; "
                            "give its variable with --env NAME=VALUE")
        return default if value is None else value

    def soft(self, name: str, default=None):
        """The value, or ``default`` when the script leaves it symbolic."""
        value = self.cfg.get(name)
        if value is UNKNOWN or (isinstance(value, list) and UNKNOWN in value):
            return default
        return default if value is None else value

    def on(self, name: str) -> bool:
        """The switch is given (last occurrence of its destination wins: ``--no-X`` turns it off)."""
        given = self.cfg.given(name)
        if not given:
            return False
        last = given[-1]
        return name in (last.name, last.flag.name if last.flag else None) and not last.name.startswith("--no-")

    def symbolic(self, name: str) -> bool:
        value = self.cfg.get(name)
        return value is UNKNOWN or (isinstance(value, list) and UNKNOWN in value)


def _moe_pattern(freq, layers: int) -> tuple[bool, ...] | None:
    """Megatron's --moe-layer-freq: k (every k-th layer) or a Python list expression of 0/1."""
    if freq is None:
        return None
    if isinstance(freq, int):
        return tuple(i % freq == 0 for i in range(layers))
    try:
        values = _safe_list(str(freq))
    except (ValueError, SyntaxError):
        return None
    return tuple(bool(v) for v in values) if len(values) == layers else None


def _safe_list(text: str) -> list:
    """Evaluate ``[0]*3+[1]*58`` or ``[0, 1, 1]``: list literals, + and * only."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = ev(node.left), ev(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(text)

    value = ev(ast.parse(text.strip(), mode="eval"))
    if not isinstance(value, list):
        raise ValueError(text)
    return value


def _hf_config(flags: Flags) -> tuple[dict | None, str | None]:
    path = flags.soft("--hf-checkpoint")
    if not isinstance(path, str) or not path:
        return None, None
    config = Path(path).expanduser() / "config.json"
    if not config.is_file():
        return None, None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{config}: cannot be read ({e}); fix the file or point --hf-checkpoint elsewhere") from e
    if isinstance(data.get("text_config"), dict):
        data = {**data, **data["text_config"]}
    return data, str(config)


def shape_from(flags: Flags, notes: list[tuple[str, bool]]) -> tuple[P.Shape, dict | None, str]:
    """The model's shapes: the --hf-checkpoint config.json when it is here, else MODEL_ARGS."""
    hf, where = _hf_config(flags)

    def need(flag: str, hf_key: str | None = None, default=None):
        if hf is not None and hf_key and hf.get(hf_key) is not None:
            return hf[hf_key]
        value = flags.get(flag, default)
        if value is None:
            raise UserError(f"{flag} is not given and no --hf-checkpoint config.json is here: source the model's "
                            "scripts/models/*.sh (MODEL_ARGS), or make --hf-checkpoint point at the model folder")
        return value

    layers = int(need("--num-layers", "num_hidden_layers"))
    hidden = int(need("--hidden-size", "hidden_size"))
    heads = int(need("--num-attention-heads", "num_attention_heads"))
    gqa = flags.on("--group-query-attention")
    kv_heads = int(hf.get("num_key_value_heads", heads)) if hf else int(flags.get("--num-query-groups", heads) if gqa
                                                                         else heads)
    head_dim = int(need("--kv-channels", "head_dim", hidden // heads))
    ffn = int(need("--ffn-hidden-size", "intermediate_size", 4 * hidden))
    vocab = int(need("--vocab-size", "vocab_size"))
    tied = bool(hf["tie_word_embeddings"]) if hf and "tie_word_embeddings" in hf \
        else not flags.on("--untie-embeddings-and-output-weights")
    model_type = str(hf.get("model_type", "")) if hf else ""
    qk_norm = flags.on("--qk-layernorm") or model_type.startswith("qwen3")
    qkv_bias = flags.on("--add-qkv-bias") or (bool(hf.get("attention_bias")) if hf else False)
    experts = int((hf and (hf.get("num_experts") or hf.get("n_routed_experts") or hf.get("num_local_experts")))
                  or flags.get("--num-experts", 0) or 0)
    moe_ffn = topk = shared = 0
    pattern = None
    if experts:
        moe_ffn = int(need("--moe-ffn-hidden-size", "moe_intermediate_size"))
        topk = int(need("--moe-router-topk", "num_experts_per_tok", 2))
        shared = int((hf and (hf.get("shared_expert_intermediate_size")
                              or (hf.get("n_shared_experts") or 0) * (hf.get("moe_intermediate_size") or 0)))
                     or flags.soft("--moe-shared-expert-intermediate-size", 0) or 0)
        pattern = _hf_moe_pattern(hf, layers) if hf else None
        if pattern is None:
            if flags.symbolic("--moe-layer-freq"):
                notes.append(("--moe-layer-freq is left to the script's loop: every layer counted as MoE", True))
            else:
                pattern = _moe_pattern(flags.soft("--moe-layer-freq", 1), layers)
    mla = None
    if flags.on("--multi-latent-attention") or (hf and hf.get("kv_lora_rank")):
        mla = P.MLA(q_lora=int(need("--q-lora-rank", "q_lora_rank", 0)) or None,
                    kv_lora=int(need("--kv-lora-rank", "kv_lora_rank")),
                    qk_head=int(need("--qk-head-dim", "qk_nope_head_dim")),
                    qk_pos=int(need("--qk-pos-emb-head-dim", "qk_rope_head_dim")),
                    v_head=int(need("--v-head-dim", "v_head_dim")))
    if flags.soft("--spec"):
        notes.append(("--spec names a custom layer spec: its layers are counted as standard attention + MLP", True))
    if flags.soft("--mtp-num-layers"):
        notes.append(("--mtp-num-layers: the multi-token-prediction layers are not counted", True))
    shape = P.Shape(layers=layers, hidden=hidden, ffn=ffn, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                    vocab=vocab, tied=tied, swiglu=flags.on("--swiglu") or bool(hf), qkv_bias=qkv_bias,
                    linear_bias=not flags.on("--disable-bias-linear") and not hf, qk_norm=qk_norm, experts=experts,
                    moe_ffn=moe_ffn, topk=topk, shared_ffn=shared, shared_gate=flags.on("--moe-shared-expert-gate"),
                    moe_pattern=pattern, mla=mla)
    return shape, hf, (f"{where}" if where else "MODEL_ARGS")


def _hf_moe_pattern(hf: dict, layers: int) -> tuple[bool, ...] | None:
    if "first_k_dense_replace" in hf:
        k = int(hf["first_k_dense_replace"])
        return tuple(i >= k for i in range(layers))
    if "mlp_only_layers" in hf or "decoder_sparse_step" in hf:
        dense = set(hf.get("mlp_only_layers") or [])
        step = int(hf.get("decoder_sparse_step") or 1)
        return tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))
    return None


def job_from(cfg: Config, card: P.Card, host_ram: int | None,
             prompt_len: int | None) -> tuple[P.Job, list[tuple[str, bool]], str]:
    flags = Flags(cfg)
    notes: list[tuple[str, bool]] = []
    shape, hf, source = shape_from(flags, notes)
    nodes, per_node = int(flags.get("--actor-num-nodes", 1)), int(flags.get("--actor-num-gpus-per-node", 8))
    world = nodes * per_node
    tp = int(flags.get("--tensor-model-parallel-size", 1))
    pp = int(flags.get("--pipeline-model-parallel-size", 1))
    cp = int(flags.get("--context-parallel-size", 1))
    ep = int(flags.get("--expert-model-parallel-size", 1))
    etp = flags.get("--expert-tensor-parallel-size")
    if world % (tp * pp * cp):
        raise UserError(f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} x "
                        f"--context-parallel-size {cp} does not divide the {world} actor GPUs; fix the sizes "
                        "(`slime-check config` says more)")
    if shape.experts and shape.experts % ep:
        raise UserError(f"--expert-model-parallel-size {ep} does not divide --num-experts {shape.experts}")
    expert_model = ep * int(etp if etp is not None else tp) * pp
    if world % expert_model:
        raise UserError(f"EP {ep} x expert-TP {etp if etp is not None else tp} x PP {pp} = {expert_model} does not "
                        f"divide the {world} actor GPUs: megatron stops at start-up; fix the expert sizes")
    par = P.Parallel(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=int(etp) if etp is not None else None,
                     sp=flags.on("--sequence-parallel") and tp > 1,
                     vocab_multiple=int(flags.get("--make-vocab-size-divisible-by", 128)),
                     first_stage_layers=flags.get("--decoder-first-pipeline-num-layers"),
                     last_stage_layers=flags.get("--decoder-last-pipeline-num-layers"))
    if flags.soft("--num-layers-per-virtual-pipeline-stage"):
        notes.append(("virtual pipeline stages: counted as plain 1F1B (interleaving keeps a little more in flight)",
                      False))

    response = flags.get("--rollout-max-response-len")
    if prompt_len is not None:
        prompt = prompt_len
    elif flags.soft("--rollout-max-prompt-len"):
        prompt = int(flags.get("--rollout-max-prompt-len"))
    else:
        prompt = DEFAULT_PROMPT
    prompt_note = (f"prompts of at most {DEFAULT_PROMPT} tokens (no --rollout-max-prompt-len; "
                   "pass --prompt-len N for your data)", False)
    if prompt == DEFAULT_PROMPT and prompt_len is None and response is not None:
        notes.append(prompt_note)
    context = flags.soft("--rollout-max-context-len")
    cp_now = int(flags.get("--context-parallel-size", 1))
    if response is None and context is None:
        max_tokens = flags.get("--max-tokens-per-gpu")
        if not (flags.on("--use-dynamic-batch-size") and max_tokens):
            raise UserError("--rollout-max-response-len is not set: the plan sizes logits, activations and KV by "
                            "the longest response; give it in the script")
        context = int(max_tokens) * cp_now  # supervised data: whatever packs into a micro-batch
        notes.append((f"no --rollout-max-response-len: samples assumed at most --max-tokens-per-gpu x CP = "
                      f"{context} tokens (a longer one gets a micro-batch of its own)", False))
    longest = int(context) if context else prompt + int(response)
    response = int(response) if response is not None else longest - prompt

    colocate = flags.on("--colocate")
    critic = flags.get("--advantage-estimator", "grpo") == "ppo"
    release = flags.on("--release-train")
    offload_all = flags.on("--offload")
    offload_train = flags.soft("--offload-train")
    offload_rollout = flags.soft("--offload-rollout")
    if offload_all:
        offload_train = offload_rollout = True
    if colocate:
        offload_train = False if release else (True if offload_train is None else offload_train)
        offload_rollout = True if release or offload_rollout is None else offload_rollout
    offload_train = bool(offload_train) or critic
    rbs, n = int(flags.get("--rollout-batch-size", 1)), int(flags.get("--n-samples-per-prompt", 1))
    steps = flags.get("--num-steps-per-rollout")
    gbs = flags.get("--global-batch-size") or (rbs * n // int(steps) if steps else rbs * n)
    backend = str(flags.soft("--attention-backend", "auto")).split(".")[-1].lower()
    train = P.Train(
        longest=longest, dynamic=flags.on("--use-dynamic-batch-size"), max_tokens=flags.get("--max-tokens-per-gpu"),
        micro_batch=int(flags.get("--micro-batch-size", 1)), global_batch=int(gbs),
        recompute=flags.get("--recompute-granularity"), recompute_method=flags.get("--recompute-method"),
        recompute_layers=flags.get("--recompute-num-layers"),
        recompute_modules=tuple(flags.get("--recompute-modules") or ("core_attn",)),
        hidden_dropout=float(flags.get("--hidden-dropout", 0.1)), unfused_attention=backend in ("unfused", "local"),
        temperature=float(flags.get("--rollout-temperature", 1.0)),
        entropy_coef=float(flags.get("--entropy-coef", 0.0)),
        logprob_chunk=int(flags.get("--log-probs-chunk-size", -1)),
        grad_fp32=flags.on("--accumulate-allreduce-grads-in-fp32"),
        precision_aware=flags.on("--use-precision-aware-optimizer"),
        main_dtype=str(flags.get("--main-params-dtype", "fp32")),
        exp_avg_dtype=str(flags.get("--exp-avg-dtype", "fp32")),
        exp_avg_sq_dtype=str(flags.get("--exp-avg-sq-dtype", "fp32")), cpu_adam=flags.on("--optimizer-cpu-offload"),
        cpu_adam_fraction=float(flags.get("--optimizer-offload-fraction", 1.0)), offload_train=offload_train,
        ref=float(flags.get("--kl-coef", 0.0)) != 0 or flags.on("--use-kl-loss"), critic=critic,
        keep_old_actor=flags.on("--keep-old-actor"),
        teacher=flags.on("--use-opd") and flags.soft("--opd-type") == "megatron")
    if train.dynamic and not train.max_tokens:
        raise UserError("--use-dynamic-batch-size needs --max-tokens-per-gpu (slime asserts it); give it")

    rollout = None
    if not flags.on("--debug-train-only") and not flags.soft("--rollout-external-engine-addrs"):
        gpus = flags.get("--rollout-num-gpus")
        if gpus is None:
            if not colocate:
                raise UserError("--rollout-num-gpus is not set without --colocate: slime cannot place the engines; "
                                "give it, or pass --colocate")
            gpus = world
        per_engine = int(flags.get("--rollout-num-gpus-per-engine", 1))
        engines = max(1, int(gpus) // per_engine)
        samples = (flags.get("--over-sampling-batch-size") or rbs) * n
        concurrency = int(flags.get("--sglang-server-concurrency", 512)) * engines
        kv_dtype = str(flags.get("--sglang-kv-cache-dtype", "auto"))
        quant = (hf or {}).get("quantization_config") or {}
        graph_max = flags.soft("--sglang-cuda-graph-max-bs")
        graph_list = flags.soft("--sglang-cuda-graph-bs")
        if graph_max is None and isinstance(graph_list, list) and graph_list:
            graph_max = max(graph_list)
        if flags.symbolic("--sglang-cuda-graph-bs"):
            notes.append(("--sglang-cuda-graph-bs is computed by the script: SGLang's default largest batch assumed",
                          False))
        no_graphs = (flags.on("--sglang-disable-cuda-graph")
                     or flags.soft("--sglang-cuda-graph-backend-decode") == "disabled")
        prefill_graphs = not (no_graphs or offload_rollout or flags.on("--sglang-disable-prefill-cuda-graph")
                              or flags.soft("--sglang-cuda-graph-backend-prefill") == "disabled")
        eval_response = flags.soft("--eval-max-response-len")
        rollout = P.Rollout(
            gpus=int(gpus), per_engine=per_engine, pp=int(flags.get("--sglang-pp-size", 1)),
            mem_fraction=flags.get("--sglang-mem-fraction-static"), requests=min(samples, concurrency),
            max_running=flags.get("--sglang-max-running-requests"), prompt=prompt, response=longest - prompt,
            eval_response=int(eval_response) if eval_response else None,
            kv_bytes=1 if kv_dtype.startswith("fp8") else 2,
            weight_bytes=1.0 if str(quant.get("quant_method", "")).startswith("fp8") else 2.0,
            graphs=not no_graphs, graph_max_bs=int(graph_max) if graph_max else None, prefill_graphs=prefill_graphs,
            chunked_prefill=flags.get("--sglang-chunked-prefill-size"))
        if flags.on("--sglang-enable-dp-attention") or int(flags.get("--sglang-dp-size", 1)) > 1:
            notes.append(("SGLang DP attention is counted as plain TP (its KV per GPU is smaller)", True))
    job = P.Job(shape=shape, par=par, train=train, rollout=rollout, card=card,
                colocate=colocate and rollout is not None,
                offload_rollout=bool(offload_rollout), gpus_per_node=per_node, host_ram=host_ram,
                bf16=not flags.on("--fp16"))
    return job, notes, source


def plan_argv(argv, reg, target, title: str, card: P.Card, host_ram: int | None, prompt_len: int | None) -> Planned:
    cfg = Config(parse_argv(argv, reg), reg, "train.py", target)
    job, notes, source = job_from(cfg, card, host_ram, prompt_len)
    return Planned(title, P.make_plan(job), notes, source)


# ---------------------------------------------------------------------------------------------
# Findings: the verdict per phase, with the knob that fixes it and what that costs
# ---------------------------------------------------------------------------------------------


def _share(total: float, capacity: float) -> str:
    return f"{P.gib(total)} of {P.gib(capacity)} GiB ({100 * total / capacity:.0f}%)"


def _status(total: float, capacity: float) -> Status:
    return Status(P.verdict(total, capacity))


@dataclass
class Fix:
    job: P.Job
    flags: str  # what to write in the script
    what: str  # what it saves, after the saving in GiB
    cost: str
    rank: int  # cheaper knobs first


def _fix_candidates(job: P.Job, limit: float) -> list[Fix]:
    tr, par, shape = job.train, job.par, job.shape
    out = []
    floor = -(-tr.longest // par.cp)
    if tr.dynamic and tr.max_tokens:
        m = P.fitting_max_tokens(job, limit) or -(-floor // 1024) * 1024
        if m < tr.max_tokens:
            out.append(Fix(P.with_train(job, max_tokens=m), f"--max-tokens-per-gpu {m}", "activations and logits",
                           "more micro-batches per step, so slower steps", 0))
    elif tr.micro_batch > 1:
        out.append(Fix(P.with_train(job, micro_batch=1), "--micro-batch-size 1", "activations and logits",
                       "more micro-batches per step", 0))
    if tr.recompute != "full":
        out.append(Fix(P.with_train(job, recompute="full", recompute_method="uniform", recompute_layers=1),
                       "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
                       "activations", "one more forward per step (about a third more training time)", 1))
    elif (tr.recompute_layers or 1) > 1 or tr.recompute_method == "block":
        out.append(Fix(P.with_train(job, recompute_method="uniform", recompute_layers=1),
                       "--recompute-method uniform --recompute-num-layers 1", "activations",
                       "recomputation of every layer", 1))
    if not tr.cpu_adam:
        new = P.with_train(job, cpu_adam=True, cpu_adam_fraction=1.0, precision_aware=True)
        host = P.make_plan(new).host.total - P.make_plan(job).host.total
        out.append(Fix(new, "--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer",
                       f"master weights and Adam moments, {P.gib(host)} GiB more host RAM per node",
                       "a slower optimizer step on the CPU", 2))
    if tr.longest > par.cp * (tr.max_tokens or 0) and par.world % (par.tp * par.pp * par.cp * 2) == 0:
        out.append(Fix(P.with_par(job, cp=par.cp * 2), f"--context-parallel-size {par.cp * 2}",
                       "each long sample split over more GPUs", "fewer data-parallel ranks, ring-attention traffic", 3))
    ep2 = par.ep * 2
    if shape.experts and shape.experts % ep2 == 0 and par.world % (ep2 * par.expert_tp * par.pp) == 0:
        out.append(Fix(P.with_par(job, ep=ep2), f"--expert-model-parallel-size {ep2}",
                       f"{shape.experts // ep2} experts a layer on each GPU",
                       "more all-to-all traffic between expert ranks", 3))
    tp2 = par.tp * 2
    if (par.world % (tp2 * par.pp * par.cp) == 0 and shape.heads % tp2 == 0 and shape.kv_heads % tp2 == 0
            and tp2 <= job.gpus_per_node):
        out.append(Fix(P.with_par(job, tp=tp2, sp=True), f"--tensor-model-parallel-size {tp2} --sequence-parallel",
                       "weights, activations and logits split further", "more communication in every layer", 3))
    return out


def train_fixes(job: P.Job, peak: float) -> list[str]:
    """Knobs that bring the training peak under 90% of the card, each with its saving and its cost.

    Single knobs that suffice, cheapest first; else the knobs that together do, largest saving first
    (a knob raised twice on the way is given once, at its last value)."""
    limit = P.WARN_FRACTION * job.card.usable

    def line(fix: Fix, before: float, after: float) -> str:
        return f"`{fix.flags}` → {P.gib(before - after)} GiB less ({fix.what}); {fix.cost}"

    options = [(f, P.peak_train(f.job)) for f in _fix_candidates(job, limit)]
    enough = sorted(((f, p) for f, p in options if p <= limit), key=lambda fp: fp[0].rank)
    if enough:
        return [line(f, peak, p) for f, p in enough[:3]]
    chain: dict[str, tuple[Fix, float, float]] = {}  # knob -> (fix, peak before it was first raised, after)
    current, current_peak = job, peak
    for _ in range(6):
        if current_peak <= limit:
            break
        candidates = [(f, P.peak_train(f.job)) for f in _fix_candidates(current, limit)]
        candidates = [(f, p) for f, p in candidates if p < current_peak - P.MIB]
        if not candidates:
            break
        fix, new_peak = min(candidates, key=lambda c: c[1])
        knob = fix.flags.split()[0]
        before = chain[knob][1] if knob in chain else current_peak
        chain[knob] = (fix, before, new_peak)
        current, current_peak = fix.job, new_peak
    if not chain:
        return []
    lines = [line(f, before, after) for f, before, after in chain.values()]
    verdict = "fits" if current_peak <= limit else "still does not fit: use more GPUs per model copy or a larger GPU"
    if len(lines) == 1:
        return [lines[0] + f": {P.gib(current_peak)} GiB, which {verdict}"]
    return lines + [f"all {len(lines)} together: {P.gib(current_peak)} GiB, which {verdict}"]


def _join(lines: list[str]) -> str:
    if len(lines) > 1 and lines[-1].startswith("all "):
        return "; then ".join(lines[:-1]) + "; " + lines[-1]
    return "; or ".join(lines)


def findings(planned: Planned) -> list[Finding]:
    plan, job = planned.plan, planned.plan.job
    card = job.card
    out = [_model_finding(planned)]
    train = max((p for p in plan.phases if "training" in p.name or "log-prob" in p.name), key=lambda p: p.total)
    status = _status(train.total, card.usable)
    fix = "" if status is Status.PASS else _join(train_fixes(job, train.total))
    out.append(Finding("plan.train_memory", status,
                       f"Training peaks at {_share(train.total, card.usable)} per {card.name} in the {train.name}.",
                       fix or "Use more GPUs per model copy (TP, PP) or a larger GPU.", PERF_DOC))
    if plan.engine is not None:
        out += _rollout_findings(plan)
    out.append(_host_finding(plan))
    return out


def _model_finding(planned: Planned) -> Finding:
    job = planned.plan.job
    shape = job.shape
    kind = f"MoE {shape.experts} experts top-{shape.topk}" if shape.experts else "dense"
    n = P.total_params(shape)
    count = f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"
    text = (f"Model from {planned.model_source}: {count} parameters ({kind}, "
            f"{shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads / {shape.kv_heads} KV, "
            f"vocab {shape.vocab}); GPU {job.card.name} with {P.gib(job.card.usable)} GiB usable, "
            f"from {job.card.source}.")
    if planned.notes:
        text += " Assumed: " + "; ".join(note for note, _ in planned.notes) + "."
    if any(major for _, major in planned.notes):
        return Finding("plan.inputs", Status.WARN, text, "Give the model's config.json (--hf-checkpoint) or the "
                       "flags the notes name, so the shapes need no assumption.", PERF_DOC)
    return Finding("plan.inputs", Status.PASS, text)


def _rollout_findings(plan: P.Plan) -> list[Finding]:
    job, eng = plan.job, plan.engine
    card = job.card
    out = []
    rollout = next(p for p in plan.phases if p.name.startswith("rollout"))
    if eng.pool <= 0:
        need_mf = (eng.weights + P.GIB) / eng.pre
        out.append(Finding(
            "plan.rollout_memory", Status.FAIL,
            f"SGLang refuses to start: {eng.mem_fraction:g} x {P.gib(eng.pre)} GiB ({eng.mem_fraction_source}) "
            f"leaves no KV cache beside {P.gib(eng.weights)} GiB of weights per GPU.",
            f"`--sglang-mem-fraction-static {min(0.95, need_mf + 0.05):.2f}` or more (less room for the trainer when "
            f"colocated), or `--rollout-num-gpus-per-engine {eng.tp * 2}` (half the weights per GPU, half the "
            "engines).",
            COLOCATE_DOC))
        return out
    status = _status(rollout.total, card.usable)
    fix = ""
    if status is not Status.PASS:
        other = rollout.total - eng.static
        fit = (P.WARN_FRACTION * card.usable - other - (card.usable - eng.pre * 1)) / eng.pre
        fit = max(0.0, min(eng.mem_fraction - 0.01, fit))
        lost = (eng.mem_fraction - fit) * eng.pre
        fix = (f"`--sglang-mem-fraction-static {fit:.2f}` → {P.gib(lost)} GiB less KV cache per GPU "
               f"({int(lost // eng.kv_per_token):,} fewer tokens in flight per engine, so fewer concurrent requests)")
    out.append(Finding("plan.rollout_memory", status,
                       f"Rollout peaks at {_share(rollout.total, card.usable)} per GPU: SGLang claims "
                       f"{P.gib(eng.static)} GiB ({eng.mem_fraction:g} of the free memory, {eng.mem_fraction_source}) "
                       "plus its CUDA graphs and working set.", fix, COLOCATE_DOC))
    out.append(_kv_finding(plan))
    if job.colocate:
        shared = max((p for p in plan.phases if p.where == "shared GPU"), key=lambda p: p.total)
        status = _status(shared.total, card.usable)
        out.append(Finding("plan.colocated", status,
                           f"Colocated: the shared GPU peaks at {_share(shared.total, card.usable)} "
                           f"in the {shared.name} "
                           "(the other side asleep under torch_memory_saver, its context still there).",
                           "See the failing phase's fix above." if status is not Status.PASS else "", COLOCATE_DOC))
    return out


def _kv_finding(plan: P.Plan) -> Finding:
    job, eng = plan.job, plan.engine
    ro = job.rollout
    holds = int(eng.pool // eng.kv_per_token)
    longest = eng.request_tokens
    if ro.eval_response:
        longest = max(longest, ro.prompt + ro.eval_response)
    text = (f"KV pool {P.gib(eng.pool)} GiB per GPU = {holds:,} tokens per engine; {eng.running} requests in flight "
            f"per engine at {eng.request_tokens:,} tokens need {int(eng.running * eng.request_tokens):,}")
    if holds < longest:
        return Finding("plan.rollout_kv", Status.FAIL,
                       text + f"; one request of {longest:,} tokens does not fit: SGLang aborts it.",
                       f"Raise --sglang-mem-fraction-static or use `--rollout-num-gpus-per-engine {eng.tp * 2}`.",
                       COLOCATE_DOC)
    if holds < eng.running * eng.request_tokens:
        fit = holds // eng.request_tokens
        return Finding("plan.rollout_kv", Status.WARN,
                       text + f": {fit} of them fit at full length; SGLang queues or retracts the rest "
                       "(slower rollouts, not an out-of-memory).",
                       "Raise --sglang-mem-fraction-static where the GPU has room, use more GPUs per engine, "
                       "or lower --sglang-server-concurrency.", COLOCATE_DOC)
    return Finding("plan.rollout_kv", Status.PASS, text + ".")


def _host_finding(plan: P.Plan) -> Finding:
    host = plan.host
    if host.capacity is None:
        return Finding("plan.host_memory", Status.SKIP,
                       f"Host RAM per node: {P.gib(host.total)} GiB needed; the host's RAM is not known "
                       "(give --fixture CAPTURE or --host-ram GIB).")
    status = _status(host.total, host.capacity)
    fix = ""
    if status is not Status.PASS:
        fix = "Use nodes with more RAM, spread the actor over more nodes"
        if plan.job.train.cpu_adam:
            fix += ", or drop --optimizer-cpu-offload (its state then needs GPU memory)"
        if plan.job.train.ref:
            fix += "; the reference copy goes away only without KL (--kl-coef 0, no --use-kl-loss)"
    return Finding("plan.host_memory", status, f"Host RAM per node: {_share(host.total, host.capacity)}.", fix, FAQ_DOC)


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


STYLES = {"FAIL": "bold red", "WARN": "yellow", "PASS": "green"}


def peaks(plan: P.Plan) -> list[tuple[str, P.Phase]]:
    """Training and rollout apart, each with the phase that sets its peak; together where colocated."""
    out = []
    groups = (("training", ("training", "log-prob")), ("rollout", ("rollout",)), ("weight update", ("weight",)))
    for label, starts in groups:
        found = [p for p in plan.phases if any(w in p.name for w in starts)]
        if found:
            top = max(found, key=lambda p: p.total)
            out.append((f"{label} ({top.where})", top))
    if plan.job.colocate:
        out.append(("shared GPU, every phase", plan.peak("shared GPU")))
    return out + [("host RAM per node", plan.host)]


def render(planned: Planned, console) -> None:
    from rich.table import Table
    from rich.text import Text

    plan = planned.plan
    table = Table(title=f"slime-check plan: {planned.title}", title_justify="left", show_lines=False)
    table.add_column("phase / item")
    table.add_column("GiB", justify="right", no_wrap=True)
    table.add_column("how", no_wrap=True)
    table.add_column("detail")
    for phase in [*plan.phases, plan.host]:
        table.add_row(Text(f"{phase.name} [{phase.where}]", style="bold"), "", "", phase.note)
        for item in phase.items:
            table.add_row(f"  {item.label}", P.gib(item.bytes), item.kind, item.detail)
        capacity = phase.capacity
        style = STYLES.get(P.verdict(phase.total, capacity), "")
        table.add_row(Text("  = peak", style=style), Text(P.gib(phase.total), style=style), "",
                      f"of {P.gib(capacity)}" if capacity else "")
    console.print(table)
    summary = Table(title="per-GPU peak (GiB)", title_justify="left")
    for column in ("where", "peak", "of", "share", "set by"):
        summary.add_column(column, justify="right" if column in ("peak", "of", "share") else "left")
    for where, phase in peaks(plan):
        capacity = phase.capacity
        style = STYLES.get(P.verdict(phase.total, capacity), "")
        summary.add_row(where, Text(P.gib(phase.total), style=style), P.gib(capacity) if capacity else "?",
                        f"{100 * phase.total / capacity:.0f}%" if capacity else "", phase.name)
    console.print(summary)


def to_dict(planned: Planned) -> dict:
    plan = planned.plan
    job = plan.job

    def phase(p: P.Phase) -> dict:
        return {"name": p.name, "where": p.where, "note": p.note, "peak_bytes": int(p.total),
                "peak_gib": round(p.total / P.GIB, 3),
                "capacity_bytes": p.capacity, "verdict": P.verdict(p.total, p.capacity),
                "items": [{"item": i.label, "bytes": int(i.bytes), "gib": round(i.bytes / P.GIB, 3), "kind": i.kind,
                           "detail": i.detail} for i in p.items]}

    out = {"title": planned.title, "model_source": planned.model_source, "assumed": [note for note, _ in planned.notes],
           "gpu": {"name": job.card.name, "usable_bytes": job.card.usable, "source": job.card.source},
           "params": P.total_params(job.shape),
           "layout": {"actor_gpus": job.par.world, "tp": job.par.tp, "pp": job.par.pp, "cp": job.par.cp,
                      "dp": job.par.dp, "ep": job.par.ep, "colocate": job.colocate},
           "micro_batch_tokens": P.micro_batch_tokens(job.train, job.par),
           "phases": [phase(p) for p in plan.phases], "host": phase(plan.host),
           "peaks": {where: {"phase": p.name, "peak_bytes": int(p.total), "capacity_bytes": p.capacity,
                             "verdict": P.verdict(p.total, p.capacity)} for where, p in peaks(plan)}}
    if plan.engine is not None:
        e = plan.engine
        out["engine"] = {"tp": e.tp, "engines": e.engines, "mem_fraction_static": e.mem_fraction,
                         "mem_fraction_source": e.mem_fraction_source, "kv_pool_bytes": int(e.pool),
                         "kv_bytes_per_token": e.kv_per_token, "requests_per_engine": e.running,
                         "kv_needed_bytes": int(e.need)}
    return out
