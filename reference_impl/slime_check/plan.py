"""``slime-check plan``: will the job fit? The per-GPU peak memory of a slime job, before it runs.

Pure arithmetic on the job's shapes and flags: no torch, no GPU. What is exact and what is an
estimate is stated on every line of the report (``Item.kind``):

exact (bytes, given the shapes and flags; checked against megatron-core in tests/slime_check/test_plan_megatron.py)
  * parameters per GPU under Megatron's TP/PP/EP/expert-TP layout, the vocabulary padded to
    ``--make-vocab-size-divisible-by`` x TP; bf16 weights; the gradient buffer (fp32 with
    ``--accumulate-allreduce-grads-in-fp32``, else bf16); the distributed optimizer's fp32 master
    weights and two Adam moments, sharded over DP x CP (experts over the expert-data-parallel
    group; slime always turns the distributed optimizer on), on the host under
    ``--optimizer-cpu-offload``. Megatron pads its buffers by at most 64 elements a parameter.
  * fp32 logits, tokens x padded vocabulary / TP x 4 bytes, and the buffers slime's log-prob
    kernel keeps beside them (``slime/utils/ppo_utils.py``, ``_VocabParallelLogProbEntropy``):
    the softmax (4 bytes), a temperature-scaled copy when ``--rollout-temperature`` is not 1, the
    entropy-gradient buffer when ``--entropy-coef`` is not 0. Tokens per micro-batch: the
    ``--max-tokens-per-gpu`` cap, or the longest sample (prompt + ``--rollout-max-response-len``)
    / CP where that is longer (it lands alone in a micro-batch: ``slime/utils/dp_schedule.py``);
    ``--micro-batch-size`` x the longest sample without dynamic batching.
  * SGLang's static pool: SGLang 0.5.15 sizes the KV cache to leave ``pre x (1 - mem_fraction)``
    free, ``pre`` being the free memory after its CUDA/NCCL start-up (``model_runner_kv_cache_mixin``);
    weights per GPU; KV bytes per token 2 x layers x KV heads per GPU x head size x dtype bytes
    (MLA: (kv_lora_rank + rope dim) x layers x dtype bytes); the KV that the in-flight requests
    need at full length. Without ``--sglang-mem-fraction-static`` SGLang's own default
    (``server_args._handle_gpu_memory_settings``).
  * the Adam update with torch's AdamW, which Megatron uses where neither TransformerEngine nor Apex
    is installed (their FusedAdam updates in place): torch's multi-tensor path takes the square root
    of every second moment of a parameter group in one call, a new fp32 tensor of 4 bytes per
    parameter of the shard beside the whole state (``torch.optim.adam._multi_tensor_adam``).
  * host copies: slime's pinned weight backups per rank (actor, reference, old actor; torch's
    pinned allocator rounds each tensor up to a power of two), torch_memory_saver's copy of the
    optimizer state under ``--offload-train``, CPU Adam.

cached (reserved, not alive: what NVML and the memory smoke see beside the tensors)
  * the output layer's bf16 logits, freed after their fp32 cast, whose block torch's caching allocator keeps
    while the larger fp32 buffers come (2 bytes a logit; none where log-prob chunks reuse it). torch frees
    cached blocks and retries before raising out-of-memory, so a peak past the card by no more than these
    bytes is a WARN, not a FAIL.

estimate (a model with the constants below; GPU measurements check them)
  * activations: the per-tensor count of Korthikanti et al. 2022, "Reducing Activation
    Recomputation in Large Transformer Models" (https://arxiv.org/abs/2205.05198, section 4.1),
    for bf16, generalised to GQA, SwiGLU, QK-norm and MoE. For their GPT layer it gives their
    34 x s x b x h bytes; the 5 x a x s^2 x b attention term is absent because slime's attention
    (flash / TE fused) keeps no score matrix (it is added for ``--attention-backend unfused``).
    Tensor parallelism divides the head and FFN parts, sequence parallelism also the rest.
    Recomputation: ``full``/``uniform`` keeps each chunk's input and rebuilds one chunk at a time,
    ``full``/``block`` keeps the input of the first N layers of a stage, ``selective`` drops the
    named modules' internals. Pipeline 1F1B: the first stage holds min(PP, micro-batches) in flight.
  * the CUDA context and NCCL buffers of each process, what a sleeping (offloaded) process still
    holds, SGLang's CUDA graphs and its prefill/decode working set.
  * the NCCL communicators the trainer opens on a group's first collective, even on one GPU, and
    loses at every sleep (slime destroys and reloads its process groups around it): the log-prob
    pass opens the tensor-parallel group's (``ppo_utils``' vocab-parallel log-softmax), the step's
    end the data-parallel group's (gradients, the step's metrics) and the model-parallel group's
    (the gradient norm). Measured: 0.50 GiB a communicator, NVML per process, one H100, NCCL 2.28
    with ``NCCL_CUMEM_ENABLE=0`` as slime sets it (``bench/gpu/process_overhead.py``).

The job is described in :mod:`slime_check.plan_job`; the engine and host side is
:mod:`slime_check.plan_rollout`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slime_check.plan_job import CACHED, DTYPE_BYTES, GIB, Item, Job, Parallel, Phase, Shape, Train
from slime_check.plan_logits import cached_logits_bytes_per_element, logits_bytes_per_element
from slime_check.plan_logits import logprob_chunk_rows as logprob_chunk_rows  # re-exported

# Estimates (GiB): what torch_memory_saver and the model arithmetic do not cover. The two contexts were
# read on an H100 with torch 2.11 and CUDA 13 (bench/results/memory-fit-h100-2026-12-06.json).
CUDA_CONTEXT = 896 / 1024  # a working process's memory outside torch's allocator: context, loaded kernels,
#                            cuBLAS workspaces (NVML per process: the trainer asleep 0.90, SGLang asleep 0.96)
SGLANG_START_CONTEXT = 704 / 1024  # SGLang's own use when it sizes its KV pool (its log: 0.68 before the weights)
NCCL_BUFFERS = 0.5  # more when it talks to other GPUs: peer buffers, further groups (not GPU-measured)
NCCL_COMMUNICATOR = 0.5  # one communicator the trainer opens on a group's first collective (one GPU, NVML)
LOGPROB_COMMUNICATORS = ("tensor-parallel",)  # open from the first log-prob pass on
STEP_COMMUNICATORS = LOGPROB_COMMUNICATORS + ("data-parallel", "model-parallel")  # the step's end adds two
SGLANG_GRAPH_POOL = 0.25  # fixed part of SGLang's CUDA-graph memory pool, beside its per-request part
HOST_PER_TRAIN_RANK = 3.0  # RSS of a Megatron rank (torch, TE, CUDA libraries, the data)
HOST_PER_SGLANG_RANK = 3.0  # RSS of an SGLang scheduler process with its tokenizer/detokenizer share
WARN_FRACTION = 0.9  # a peak within 10% of the card is a WARN


def padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Megatron's ``_vocab_size_with_padding``: up to a multiple of make_vocab_size_divisible_by x TP."""
    step = multiple * tp
    return -(-vocab // step) * step


# ---------------------------------------------------------------------------------------------
# Parameters per GPU (Megatron's layout; names follow megatron-core's local layer spec)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    name: str
    numel: int
    expert: bool = False


def stage_layers(shape: Shape, par: Parallel) -> list[range]:
    """The decoder layers of each pipeline stage (uneven first/last stages as Megatron's flags give)."""
    first, last, pp, n = par.first_stage_layers, par.last_stage_layers, par.pp, shape.layers
    if pp == 1:
        return [range(n)]
    rest = n - (first or 0) - (last or 0)
    middle = pp - (first is not None) - (last is not None)
    per = rest // middle if middle else 0
    sizes = [per] * pp
    if first is not None:
        sizes[0] = first
    if last is not None:
        sizes[-1] = last
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(s, s + k) for s, k in zip(starts, sizes, strict=True)]


def _attention(shape: Shape, tp: int, p: str) -> list[Tensor]:
    h, p = shape.hidden, p + "self_attention."
    out = []
    if shape.mla:
        m = shape.mla
        q_out = shape.heads * (m.qk_head + m.qk_pos)
        if m.q_lora:
            out += [Tensor(p + "linear_q_down_proj.weight", m.q_lora * h),
                    Tensor(p + "q_layernorm.weight", m.q_lora),
                    Tensor(p + "linear_q_up_proj.weight", q_out // tp * m.q_lora)]
        else:
            out.append(Tensor(p + "linear_q_proj.weight", q_out // tp * h))
        out += [Tensor(p + "linear_kv_down_proj.weight", (m.kv_lora + m.qk_pos) * h),
                Tensor(p + "kv_layernorm.weight", m.kv_lora),
                Tensor(p + "linear_kv_up_proj.weight", shape.heads * (m.qk_head + m.v_head) // tp * m.kv_lora),
                Tensor(p + "linear_proj.weight", h * (shape.heads * m.v_head // tp))]
    else:
        d = shape.head_dim
        qkv = (shape.heads + 2 * shape.kv_heads) * d // tp
        out.append(Tensor(p + "linear_qkv.weight", qkv * h))
        if shape.qkv_bias or shape.linear_bias:
            out.append(Tensor(p + "linear_qkv.bias", qkv))
        if shape.qk_norm:
            out += [Tensor(p + "q_layernorm.weight", d), Tensor(p + "k_layernorm.weight", d)]
        out.append(Tensor(p + "linear_proj.weight", h * (shape.heads * d // tp)))
    if shape.linear_bias:
        out.append(Tensor(p + "linear_proj.bias", h))
    return out


def _mlp(prefix: str, hidden: int, ffn: int, tp: int, swiglu: bool, bias: bool, expert: bool = False) -> list[Tensor]:
    up = ffn * (2 if swiglu else 1) // tp
    out = [Tensor(prefix + "linear_fc1.weight", up * hidden, expert)]
    if bias:
        out.append(Tensor(prefix + "linear_fc1.bias", up, expert))
    out.append(Tensor(prefix + "linear_fc2.weight", hidden * (ffn // tp), expert))
    if bias:
        out.append(Tensor(prefix + "linear_fc2.bias", hidden, expert))
    return out


def layer_tensors(shape: Shape, par: Parallel, i: int, local: int | None = None) -> list[Tensor]:
    """Layer ``i``'s parameters on one GPU, named as megatron names them (``local``: its index in the stage)."""
    h, tp, p = shape.hidden, par.tp, f"decoder.layers.{i if local is None else local}."
    out = [Tensor(p + "input_layernorm.weight", h), *_attention(shape, tp, p),
           Tensor(p + "pre_mlp_layernorm.weight", h)]
    if not shape.is_moe(i):
        return out + _mlp(p + "mlp.", h, shape.ffn, tp, shape.swiglu, shape.linear_bias)
    out.append(Tensor(p + "mlp.router.weight", shape.experts * h))
    local = shape.experts // par.ep
    for e in range(local):
        out += _mlp(f"{p}mlp.experts.local_experts.{e}.", h, shape.moe_ffn, par.expert_tp, shape.swiglu,
                    shape.linear_bias, expert=True)
    if shape.shared_ffn:
        out += _mlp(p + "mlp.shared_experts.", h, shape.shared_ffn, tp, shape.swiglu, shape.linear_bias)
        if shape.shared_gate:
            out.append(Tensor(p + "mlp.shared_experts.gate_weight", h))
    return out


def param_tensors(shape: Shape, par: Parallel, stage: int, critic: bool = False) -> list[Tensor]:
    """The parameters one GPU of pipeline stage ``stage`` holds (every TP rank holds the same sizes).

    The critic has untied embeddings and a one-value head instead of the output layer (slime's
    ``LinearForLastLayer``: hidden x 1)."""
    stages = stage_layers(shape, par)
    vocab = padded_vocab(shape.vocab, par.tp, par.vocab_multiple)
    out = []
    if stage == 0:
        out.append(Tensor("embedding.word_embeddings.weight", vocab // par.tp * shape.hidden))
    for local, i in enumerate(stages[stage]):
        out += layer_tensors(shape, par, i, local)
    if stage == par.pp - 1:
        out.append(Tensor("decoder.final_layernorm.weight", shape.hidden))
        if critic:
            out.append(Tensor("output_layer.weight", shape.hidden))
        elif not shape.tied or par.pp > 1:  # a tied output layer on another stage is a copy of the embedding
            out.append(Tensor("output_layer.weight", vocab // par.tp * shape.hidden))
    return out


def total_params(shape: Shape) -> int:
    """Parameters of the whole model (unpadded vocabulary, tied embeddings counted once)."""
    one = Parallel(world=1)
    n = sum(t.numel for t in param_tensors(shape, one, 0))
    return n - (padded_vocab(shape.vocab, 1) - shape.vocab) * shape.hidden * (1 if shape.tied else 2)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def micro_batch_tokens(train: Train, par: Parallel) -> int:
    """Tokens one GPU holds in its largest micro-batch. The worst case fills ``--max-tokens-per-gpu``
    (samples of mixed lengths); samples all ``sample_tokens`` long fill it with as many as fit, as
    slime's first-fit packing of a step's samples (``slime/utils/seqlen_balancing.first_fit_pack``) does."""
    longest = -(-train.longest // par.cp)
    if train.sample_tokens:
        per_bin = (max(1, train.max_tokens * par.cp // train.sample_tokens) if train.dynamic and train.max_tokens
                   else train.micro_batch)
        return -(-min(per_bin, max(1, train.global_batch)) * train.sample_tokens // par.cp)
    if train.dynamic and train.max_tokens:
        return max(train.max_tokens, longest)
    return train.micro_batch * longest


def micro_batches(train: Train, par: Parallel) -> int:
    """Micro-batches per optimizer step per DP rank when every sample is the longest (the worst case)."""
    samples = max(1, train.global_batch // max(1, par.dp))
    if train.dynamic and train.max_tokens:
        per = max(1, (train.max_tokens * par.cp) // train.longest)
        return -(-samples // per)
    return -(-samples // train.micro_batch)


def layer_activation_per_token(shape: Shape, par: Parallel, train: Train, moe: bool, recomputed: bool = False,
                               seq: int | None = None) -> float:
    """Bytes one layer keeps for backward, per token of the micro-batch, on one GPU (Korthikanti et al. 4.1).

    ``recomputed``: the count of a layer being rebuilt during backward (all its tensors, selective
    recomputation ignored). ``train.layer_impl == "local"``: :func:`local_layer_activation_per_token`."""
    if counts_local_layers(shape, train, moe):
        return local_layer_activation_per_token(shape, par, train)
    h, t = shape.hidden, par.tp
    s_div = t if par.sp else 1
    dropout = h if train.hidden_dropout > 0 else 0
    modules = () if recomputed or train.recompute != "selective" else train.recompute_modules
    # attention
    ln_side = (2 * h + 2 * h + dropout) / s_div  # input norm input, QKV input, dropout mask
    if shape.mla:
        m = shape.mla
        lora = 2 * 2 * ((m.q_lora or 0) + m.kv_lora)  # down-projection outputs and their norms' outputs
        heads = 2 * shape.heads * ((m.qk_head + m.qk_pos) * 2 + m.v_head) + 4 * shape.heads + 2 * shape.heads * m.v_head
        attn = ln_side + lora + heads / t
    else:
        a, g, d = shape.heads, shape.kv_heads, shape.head_dim
        qkv = 2 * (a * d + 2 * g * d)
        norm_in = 2 * (a * d + g * d) if shape.qk_norm else 0
        if "core_attn" in modules:
            core = 0
        elif train.unfused_attention:
            core = 5 * a * (seq or train.longest)  # Korthikanti's scores, softmax, dropout mask and output
        else:
            core = 4 * a  # flash attention keeps only its softmax statistics (fp32)
        attn = ln_side + (qkv + norm_in + core + 2 * a * d) / t
    if "layernorm" in modules:
        attn -= 2 * h / s_div
    # MLP
    mlp_side = (2 * h + 2 * h + dropout) / s_div  # pre-MLP norm input, fc1 input, dropout mask
    if not moe:
        f = shape.ffn
        inner = (2 * f * (2 if shape.swiglu else 1) + 2 * f) / t
        if "mlp" in modules:
            inner = 0
        mlp = mlp_side + inner
    else:
        k, f, et = shape.topk, shape.moe_ffn, par.expert_tp
        router = 2 * 4 * shape.experts / s_div  # fp32 router logits and probabilities
        per_copy = 2 * h + (2 * f * (2 if shape.swiglu else 1) + 2 * f) / et + 2 * h  # permuted in, fc1 out, act, out
        if "moe_act" in modules:
            per_copy -= 2 * f / et
        experts = k * per_copy / s_div  # tokens evenly routed: each GPU gets its share x top-k
        if "moe" in modules:
            experts = 0
        shared = 0.0
        if shape.shared_ffn:
            fs = shape.shared_ffn
            shared = (2 * fs * (2 if shape.swiglu else 1) + 2 * fs) / t
        mlp = mlp_side + router + experts + shared
    if "layernorm" in modules:
        mlp -= 2 * h / s_div
    return attn + mlp


def counts_local_layers(shape: Shape, train: Train, moe: bool) -> bool:
    """Whether a layer is counted by :func:`local_layer_activation_per_token` (dense attention and MLP,
    no selective recompute); other local layers get TransformerEngine's count, a floor for them."""
    return train.layer_impl == "local" and not shape.mla and not moe and train.recompute != "selective"


def torch_norm_keeps(width: float, rows: float) -> float:
    """Bytes torch's RMSNorm/LayerNorm keeps for backward beside its output, for ``rows`` rows of ``width``
    bf16 elements with a bf16 weight. On CUDA (torch 2.8+) ``torch.rms_norm`` runs its fused kernel,
    which keeps its input and an fp32 1/rms a row (``_fused_rms_norm``)."""
    return 2 * width + 4 * rows


def local_layer_activation_per_token(shape: Shape, par: Parallel, train: Train) -> float:
    """Bytes a dense layer of Megatron's local spec (``--transformer-impl local``) keeps for backward, per
    token on one GPU, tensor by tensor as bench/gpu/layer_activations.py measured them on an H100: its norms
    are torch's (:func:`torch_norm_keeps`), rotary and SwiGLU are PyTorch ops, and attention is a varlen
    flash kernel (slime packs every micro-batch into one sequence, which only such a kernel takes)."""
    h, t = shape.hidden, par.tp
    s_div = t if par.sp else 1
    a, g, d = shape.heads / t, shape.kv_heads / t, shape.head_dim
    dropout = h if train.hidden_dropout > 0 else 0
    pre_norms = 2 * (torch_norm_keeps(h, 1) + 2 * h + dropout) / s_div  # each norm's input, its output (a GEMM's input)
    # the query norm keeps the queries Megatron reshapes out of the QKV GEMM's output (a copy); the key
    # norm's input is a view of that output, which it keeps whole
    qk_norms = (torch_norm_keeps(a * d, a) + 2 * (a + 2 * g) * d + 4 * g) if shape.qk_norm else 0
    rotary = 4 * 2 * d  # cos and sin, for the queries and for the keys (bf16, one head's width a token)
    flash = 2 * a * d + 2 * g * d + 2 * g * d + 2 * a * d + 4 * a  # rotated q and k, v made contiguous, output, lse
    f = shape.ffn / t
    # SwiGLU in PyTorch ops: fc1's output (silu's input), silu's output, the linear half plus Megatron's
    # glu_linear_offset (a new tensor), and their product (fc2's input); GeLU: fc1's output and fc2's input
    mlp = (2 * 2 * f + 2 * f + 2 * f + 2 * f) if shape.swiglu else (2 * f + 2 * f)
    return pre_norms + qk_norms + rotary + flash + mlp


def fp32_logits_bytes(shape: Shape, par: Parallel, tokens: int) -> int:
    """One fp32 ``[tokens, padded vocab / TP]`` buffer: what slime issue #1951 ran out on."""
    return tokens * (padded_vocab(shape.vocab, par.tp, par.vocab_multiple) // par.tp) * 4


def _add_logits(phase: Phase, train: Train, forward_only: bool, tokens: int, vocab: int) -> None:
    per = logits_bytes_per_element(train, forward_only, tokens)
    chunk = f", --log-probs-chunk-size {train.logprob_chunk}" if train.logprob_chunk > 0 else ""
    phase.add("logits (fp32) and softmax", per * tokens * vocab, "exact",
              f"{tokens} tokens x {vocab} vocab/TP x {per:g} B{chunk}")
    cached = cached_logits_bytes_per_element(train, forward_only, tokens)
    if cached:
        phase.add("bf16 logits' freed block, kept by torch's allocator", cached * tokens * vocab, CACHED,
                  f"{cached:g} B a logit; NVML shows it, torch frees it before an out-of-memory error")


def _bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


def optimizer_bytes_per_param(train: Train, bf16: bool = True, on_host: bool = False) -> int:
    """Master weights + two Adam moments per parameter of the shard. With
    ``--use-precision-aware-optimizer`` (TransformerEngine's FusedAdam) an fp32 master weight of a
    bf16 parameter is kept as its 16-bit remainder (megatron-core ``store_param_remainders``)."""
    if not train.precision_aware or on_host:
        return 12
    master = 2 if train.main_dtype == "fp32" and bf16 else _bytes(train.main_dtype)
    return master + _bytes(train.exp_avg_dtype) + _bytes(train.exp_avg_sq_dtype)


def state_items(job: Job, stage: int, critic: bool = False) -> tuple[list[Item], dict]:
    """Weights, gradients and optimizer state on one GPU of ``stage``; and the counts behind them."""
    tensors = param_tensors(job.shape, job.par, stage, critic)
    dense = sum(t.numel for t in tensors if not t.expert)
    expert = sum(t.numel for t in tensors if t.expert)
    n = dense + expert
    tr, par = job.train, job.par
    grad = 4 if tr.grad_fp32 or not job.bf16 else 2
    opt_pp = optimizer_bytes_per_param(tr, job.bf16)
    shard = dense / (par.dp * par.cp) + expert / par.edp
    on_gpu = 1 - (tr.cpu_adam_fraction if tr.cpu_adam else 0)
    who = "critic" if critic else "actor"
    items = [
        Item(f"{who} weights (bf16)", 2 * n, "exact", f"{n / 1e9:.3f} B parameters on this GPU"),
        Item(f"{who} gradients ({'fp32' if grad == 4 else 'bf16'})", grad * n, "exact",
             "--accumulate-allreduce-grads-in-fp32" if grad == 4 else "bf16 gradient buffer"),
        Item(f"{who} optimizer (master weights + 2 Adam moments)", opt_pp * shard * on_gpu, "exact",
             f"{opt_pp} B/param over DP x CP = {par.dp * par.cp}"
             + (f", experts over expert-DP {par.edp}" if expert else "")
             + ("; --optimizer-cpu-offload keeps it on the host" if tr.cpu_adam and on_gpu == 0 else "")),
    ]
    return items, {"params": n, "dense": dense, "expert": expert, "shard": shard, "tensors": tensors}


def _overhead(job: Job, phase: Phase, sleeping_engine: bool, groups: tuple[str, ...] = ()) -> None:
    # apart from its engines, it broadcasts its weights to them over NCCL (update_weight_from_distributed)
    nccl = job.par.world > 1 or (job.rollout is not None and not job.colocate)
    phase.add("CUDA context + NCCL", (CUDA_CONTEXT + (NCCL_BUFFERS if nccl else 0)) * GIB, "estimate")
    if groups:
        # opened after the backward's peak, but torch keeps the backward's blocks reserved: they add to it
        phase.add(f"NCCL communicators ({len(groups)})", len(groups) * NCCL_COMMUNICATOR * GIB, "estimate",
                  f"{', '.join(groups)} group{'s' if len(groups) > 1 else ''}: opened on the first collective, "
                  f"even on one GPU; {NCCL_COMMUNICATOR:g} GiB each")
    if sleeping_engine:
        tp = job.rollout.per_engine if job.rollout else 1
        phase.add("SGLang asleep (colocated)", (CUDA_CONTEXT + (NCCL_BUFFERS if tp > 1 else 0)) * GIB, "estimate",
                  "context and NCCL stay; weights, KV and graphs released")


def _other_model_asleep(job: Job, phase: Phase, critic: bool) -> None:
    """PPO: while one of actor and critic trains, the other sleeps with only its CUDA context."""
    if job.train.critic:
        phase.add(f"{'actor' if critic else 'critic'} asleep", CUDA_CONTEXT * GIB, "estimate",
                  "torch_memory_saver released its state; the context stays")


def _layers_activation(job: Job, layers: range, tokens: int, in_flight: int) -> tuple[float, float, str]:
    """(kept for backward across the in-flight micro-batches, rebuilt during backward, how) in bytes."""
    shape, par, tr = job.shape, job.par, job.train
    per = [layer_activation_per_token(shape, par, tr, shape.is_moe(i)) * tokens for i in layers]
    full = [layer_activation_per_token(shape, par, tr, shape.is_moe(i), recomputed=True) * tokens for i in layers]
    chunk_input = 2 * shape.hidden / (par.tp if par.sp else 1) * tokens
    if tr.recompute != "full" or not layers:
        how = "selective recompute" if tr.recompute == "selective" else "no recompute"
        return in_flight * sum(per), 0.0, how
    n = max(1, tr.recompute_layers or 1)
    if tr.recompute_method == "block":
        k = min(n, len(per))
        return in_flight * (k * chunk_input + sum(per[k:])), max(full[:k], default=0.0), f"full/block {k}"
    chunks = -(-len(per) // n)
    return in_flight * chunks * chunk_input, max(full) * min(n, len(full)), f"full/uniform {n}"


def train_phase(job: Job, critic: bool = False) -> Phase:
    """The training step's peak on the worst GPU (first or last pipeline stage)."""
    best = None
    for stage in sorted({0, job.par.pp - 1}):
        phase = _train_stage(job, stage, critic)
        if best is None or phase.total > best.total:
            best = phase
    return best


def _train_stage(job: Job, stage: int, critic: bool) -> Phase:
    shape, par, tr = job.shape, job.par, job.train
    tokens = micro_batch_tokens(tr, par)
    where = "shared GPU" if job.colocate else "actor GPU"
    name = f"{'critic' if critic else 'actor'} training step"
    phase = Phase(name + (f" (pipeline stage {stage})" if par.pp > 1 else ""), where)
    items, _ = state_items(job, stage, critic)
    phase.items += items
    in_flight = min(par.pp - stage, micro_batches(tr, par))
    layers = stage_layers(shape, par)[stage]
    kept, rebuilt, how = _layers_activation(job, layers, tokens, in_flight)
    phase.add("activations kept for backward", kept, "estimate",
              f"{len(layers)} layers x {tokens} tokens, {how}"
              + (f", {in_flight} micro-batches in flight" if in_flight > 1 else ""))
    last = stage == par.pp - 1
    s_div = par.tp if par.sp else 1
    logits = 0.0
    if last:
        phase.add("final norm + output-layer input", 4 * shape.hidden / s_div * tokens, "estimate")
        if not critic:
            vocab = padded_vocab(shape.vocab, par.tp, par.vocab_multiple) // par.tp
            per = logits_bytes_per_element(tr, False, tokens)
            logits = per * tokens * vocab
    if rebuilt or logits:
        if logits >= rebuilt:
            _add_logits(phase, tr, False, tokens, vocab)
        else:
            phase.add("recomputed layers (during backward)", rebuilt, "estimate", how)
    _overhead(job, phase, sleeping_engine=job.colocate and job.rollout is not None, groups=STEP_COMMUNICATORS)
    _other_model_asleep(job, phase, critic)
    return phase


def adam_step_phase(job: Job, critic: bool = False) -> Phase | None:
    """The optimizer update with torch's AdamW (``Train.adam_kernel == "torch"``): the state, and the
    square roots of the second moments, 4 bytes per parameter of the shard on the GPU. None with
    FusedAdam, whose update needs nothing beside the state."""
    tr = job.train
    on_gpu = 1 - (tr.cpu_adam_fraction if tr.cpu_adam else 0)
    if tr.adam_kernel != "torch" or on_gpu <= 0:
        return None
    who = "critic" if critic else "actor"
    # the worst stage: the one with the most parameters
    stage = max(range(job.par.pp), key=lambda s: state_items(job, s, critic)[1]["shard"])
    phase = Phase(f"{who} training step: Adam update (torch's AdamW)", "shared GPU" if job.colocate else "actor GPU",
                  note="Megatron's Adam without TransformerEngine or Apex")
    items, counts = state_items(job, stage, critic)
    phase.items += items
    phase.add("sqrt of the second moments (torch's multi-tensor AdamW)", 4 * counts["shard"] * on_gpu, "exact",
              "4 B/param of the shard, one parameter group at a time")
    _overhead(job, phase, sleeping_engine=job.colocate and job.rollout is not None, groups=STEP_COMMUNICATORS)
    _other_model_asleep(job, phase, critic)
    return phase


def logprob_phase(job: Job) -> Phase:
    """The forward-only log-prob pass (reference and old-actor log-probs): states stay, logits peak."""
    shape, par, tr = job.shape, job.par, job.train
    stage = par.pp - 1
    tokens = micro_batch_tokens(tr, par)
    who = ", ".join(["reference"] * job.train.ref + ["old actor"])
    phase = Phase(f"log-prob pass ({who}; forward only)", "shared GPU" if job.colocate else "actor GPU",
                  note="the reference's weights are swapped into the actor's from the host: no extra GPU memory")
    items, _ = state_items(job, stage)
    phase.items += items
    layer = max(layer_activation_per_token(shape, par, tr, shape.is_moe(i), recomputed=True)
                for i in stage_layers(shape, par)[stage]) if shape.layers else 0
    phase.add("one layer's forward working set", layer * tokens, "estimate")
    vocab = padded_vocab(shape.vocab, par.tp, par.vocab_multiple) // par.tp
    _add_logits(phase, tr, True, tokens, vocab)
    _overhead(job, phase, sleeping_engine=job.colocate and job.rollout is not None, groups=LOGPROB_COMMUNICATORS)
    return phase


# ---------------------------------------------------------------------------------------------
# The whole plan
# ---------------------------------------------------------------------------------------------


@dataclass
class Plan:
    job: Job
    phases: list[Phase]
    engine: object | None  # plan_rollout.Engine
    host: Phase

    def peak(self, where: str) -> Phase | None:
        found = [p for p in self.phases if p.where == where]
        return max(found, key=lambda p: p.total) if found else None


def make_plan(job: Job) -> Plan:
    from slime_check.plan_rollout import host_phase, rollout_phase, update_phase

    phases = []
    if job.trains:
        phases.append(train_phase(job))
        if job.train.critic:
            phases.append(train_phase(job, critic=True))
        phases += [p for p in (adam_step_phase(job), job.train.critic and adam_step_phase(job, critic=True)) if p]
        phases.append(logprob_phase(job))
    eng = None
    if job.rollout is not None:
        rollout, eng = rollout_phase(job)
        phases += [rollout, update_phase(job)] if job.trains else [rollout]  # no trainer: no weight update
    for p in phases:
        p.capacity = job.card.usable
    return Plan(job, phases, eng, host_phase(job))


def verdict(total: float, capacity: float | None, releasable: float = 0.0) -> str:
    """FAIL past the card; WARN within 10% of it, or past it only by what torch frees before an OOM."""
    if capacity is None:
        return "SKIP"
    if total - releasable > capacity:
        return "FAIL"
    return "WARN" if total > WARN_FRACTION * capacity else "PASS"


def phase_verdict(phase: Phase, capacity: float | None = None) -> str:
    """:func:`verdict` of a phase's peak, on its own capacity unless another is given."""
    return verdict(phase.total, phase.capacity if capacity is None else capacity, phase.releasable)


def with_train(job: Job, **changes) -> Job:
    return replace(job, train=replace(job.train, **changes))


def with_par(job: Job, **changes) -> Job:
    return replace(job, par=replace(job.par, **changes))


def with_rollout(job: Job, **changes) -> Job:
    return replace(job, rollout=replace(job.rollout, **changes))


def training_phases(plan: Plan) -> list[Phase]:
    """The training steps, their Adam updates and the log-prob passes."""
    return [p for p in plan.phases if "training" in p.name or "log-prob" in p.name]


def peak_train(job: Job) -> float:
    return max(p.total for p in training_phases(make_plan(job)))


def fitting_max_tokens(job: Job, limit: float) -> int | None:
    """The largest --max-tokens-per-gpu (a multiple of 1024) whose training peak is at most ``limit``."""
    if not job.train.dynamic or not job.train.max_tokens:
        return None
    floor = -(-job.train.longest // job.par.cp)
    best = None
    for m in range(1024, job.train.max_tokens, 1024):
        if peak_train(with_train(job, max_tokens=m)) <= limit:
            best = m
    if best is not None and best < floor:
        return None  # the longest sample still lands alone in a micro-batch of that size
    return best
