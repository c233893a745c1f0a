"""``slime-check plan``'s inputs: the GPU and one train invocation's flags into a :class:`slime_check.plan_job.Job`.

The card comes from ``--gpu`` (a name in :data:`slime_check.plan_job.CARDS` or a size) or from a
capture; the model's shapes from the ``--hf-checkpoint`` config.json when it is here, else from
``MODEL_ARGS``; the parallel layout, training and rollout settings from the flags, with registry
defaults. A value the script leaves symbolic is a usage error naming the ``--env`` that fixes it;
every assumption made on the way is kept as a note. Nothing here imports torch.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from slime_check import plan as P
from slime_check import plan_job as J
from slime_check.config_lint import UNKNOWN, Config, parse_argv
from slime_common.errors import UserError

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


def card_from(gpu: str | None, fixture: str | None) -> tuple[J.Card, int | None]:
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
                            f"(one of {', '.join(J.CARDS)}, or a size such as 79.2GiB)")
        raise UserError(f"name the GPU: --gpu H100-80GB (known: {', '.join(J.CARDS)}; or a size such as 79.2GiB), "
                        "or --fixture CAPTURE from `slime-check capture` on the GPU machine")
    return capture_card, host


def _named_card(gpu: str) -> J.Card:
    size = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(GiB|GB|G)?", gpu.strip(), re.I)
    if size:
        usable = int(float(size.group(1)) * J.GIB)
        return J.Card(f"{size.group(1)} GiB GPU", usable, usable // J.MIB + J.RUNTIME_RESERVED_MIB, "--gpu")
    wanted = gpu.upper().replace("_", "-")
    matches = [name for name in J.CARDS if name.upper() == wanted or name.upper().startswith(wanted + "-")]
    if len(matches) != 1:
        raise UserError(f"--gpu {gpu}: unknown GPU; use one of {', '.join(J.CARDS)}, or a size such as 79.2GiB")
    usable, smi, source = J.CARDS[matches[0]]
    return J.Card(matches[0], usable, smi, f"--gpu's table: {source}")


def card_for_smi(smi_mib: int, source: str) -> J.Card:
    """The card whose nvidia-smi memory.total (NVML's total) is ``smi_mib``: a known card where the size
    matches one, else a card of that size less the CUDA runtime's share."""
    for name, (usable, smi, known) in J.CARDS.items():
        if smi == smi_mib:
            return J.Card(name, usable, smi, known)
    usable = (smi_mib - J.RUNTIME_RESERVED_MIB) * J.MIB
    return J.Card(f"{usable / J.GIB:.1f} GiB GPU", usable, smi_mib, source)


def _from_capture(path: str) -> tuple[J.Card | None, int | None]:
    from slime_check import facts
    from slime_check import probes as probes_
    from slime_check.prereqs_machine import Machine, Options

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
        usable = usable or (smi - J.RUNTIME_RESERVED_MIB) * J.MIB
        card = J.Card(name, usable, smi or usable // J.MIB + J.RUNTIME_RESERVED_MIB, f"the capture {Path(path).name}")
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


def shape_from(flags: Flags, notes: list[tuple[str, bool]]) -> tuple[J.Shape, dict | None, str]:
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
        mla = J.MLA(q_lora=int(need("--q-lora-rank", "q_lora_rank", 0)) or None,
                    kv_lora=int(need("--kv-lora-rank", "kv_lora_rank")),
                    qk_head=int(need("--qk-head-dim", "qk_nope_head_dim")),
                    qk_pos=int(need("--qk-pos-emb-head-dim", "qk_rope_head_dim")),
                    v_head=int(need("--v-head-dim", "v_head_dim")))
    if flags.soft("--spec"):
        notes.append(("--spec names a custom layer spec: its layers are counted as standard attention + MLP", True))
    if flags.soft("--mtp-num-layers"):
        notes.append(("--mtp-num-layers: the multi-token-prediction layers are not counted", True))
    shape = J.Shape(layers=layers, hidden=hidden, ffn=ffn, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
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


def job_from(cfg: Config, card: J.Card, host_ram: int | None, prompt_len: int | None,
             adam_kernel: str = "fused") -> tuple[J.Job, list[tuple[str, bool]], str]:
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
    par = J.Parallel(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=int(etp) if etp is not None else None,
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
    # slime: --debug-rollout-only starts the engines alone (no trainer, nothing colocated or offloaded);
    # --load-debug-rollout-data (or --debug-train-only) trains on saved samples with no engine
    rollout_only = flags.on("--debug-rollout-only")
    train_only = flags.on("--debug-train-only") or flags.soft("--load-debug-rollout-data") is not None
    if rollout_only:
        offload_train = offload_rollout = critic = False
    rbs, n = int(flags.get("--rollout-batch-size", 1)), int(flags.get("--n-samples-per-prompt", 1))
    steps = flags.get("--num-steps-per-rollout")
    gbs = flags.get("--global-batch-size") or (rbs * n // int(steps) if steps else rbs * n)
    backend = str(flags.soft("--attention-backend", "auto")).split(".")[-1].lower()
    train = J.Train(
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
        cpu_adam_fraction=float(flags.get("--optimizer-offload-fraction", 1.0)), adam_kernel=adam_kernel,
        layer_impl="local" if flags.soft("--transformer-impl") == "local" else "transformer_engine",
        offload_train=offload_train, ref=float(flags.get("--kl-coef", 0.0)) != 0 or flags.on("--use-kl-loss"),
        critic=critic, keep_old_actor=flags.on("--keep-old-actor"),
        teacher=flags.on("--use-opd") and flags.soft("--opd-type") == "megatron")
    if train.layer_impl == "local":
        every_layer = all(P.counts_local_layers(shape, train, shape.is_moe(i)) for i in range(shape.layers))
        notes.append(("--transformer-impl local: activations are counted as Megatron's local layers keep them "
                      "(torch's norms, rotary and SwiGLU in PyTorch ops, varlen flash attention): about 1.4x "
                      "TransformerEngine's fused layers a token", False) if every_layer else
                     ("--transformer-impl local: MLA and MoE layers, and any under selective recompute, are counted "
                      "as TransformerEngine's fused layers keep them; in PyTorch ops they keep more, so the "
                      "activations line is a floor", True))
    if train.dynamic and not train.max_tokens:
        raise UserError("--use-dynamic-batch-size needs --max-tokens-per-gpu (slime asserts it); give it")

    rollout = None
    if not train_only and not flags.soft("--rollout-external-engine-addrs"):
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
        rollout = J.Rollout(
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
    job = J.Job(shape=shape, par=par, train=train, rollout=rollout, card=card,
                colocate=colocate and rollout is not None and not rollout_only, trains=not rollout_only,
                offload_rollout=bool(offload_rollout), gpus_per_node=per_node, host_ram=host_ram,
                bf16=not flags.on("--fp16"))
    return job, notes, source


def plan_argv(argv, reg, target, title: str, card: J.Card, host_ram: int | None, prompt_len: int | None,
              adam_kernel: str = "fused") -> Planned:
    cfg = Config(parse_argv(argv, reg), reg, "train.py", target)
    job, notes, source = job_from(cfg, card, host_ram, prompt_len, adam_kernel)
    return Planned(title, P.make_plan(job), notes, source)


# ---------------------------------------------------------------------------------------------
# Findings: the verdict per phase, with the knob that fixes it and what that costs
# ---------------------------------------------------------------------------------------------
