"""What ``slime-check plan`` plans for: a slime job described as plain, frozen values.

The model's shapes (:class:`Shape`, with :class:`MLA` for multi-latent attention), the trainer's
parallel layout (:class:`Parallel`), the training and rollout settings (:class:`Train`,
:class:`Rollout`), the card (:class:`Card`, :data:`CARDS`) and the whole :class:`Job`; and the
:class:`Phase` of the job a peak belongs to, made of :class:`Item` lines. :mod:`slime_check.plan`
does the memory arithmetic on them; :mod:`slime_check.plan_inputs` reads them from a job's flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1 << 30
MIB = 1 << 20

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class MLA:
    """Multi-latent attention sizes (DeepSeek-V3 style)."""

    q_lora: int | None
    kv_lora: int
    qk_head: int
    qk_pos: int
    v_head: int


@dataclass(frozen=True)
class Shape:
    """The model's shapes (Megatron's MODEL_ARGS, or the HF config.json)."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True
    swiglu: bool = True
    qkv_bias: bool = False
    linear_bias: bool = False
    qk_norm: bool = False
    experts: int = 0
    moe_ffn: int = 0
    topk: int = 0
    shared_ffn: int = 0
    shared_gate: bool = False
    moe_pattern: tuple[bool, ...] | None = None  # per layer; None: every layer MoE when experts > 0
    mla: MLA | None = None

    def is_moe(self, layer: int) -> bool:
        if not self.experts:
            return False
        return True if self.moe_pattern is None else self.moe_pattern[layer]


@dataclass(frozen=True)
class Parallel:
    """The trainer's layout: Megatron's parallel sizes over ``world`` actor GPUs."""

    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # None: TP
    sp: bool = False
    vocab_multiple: int = 128
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        return self.world // (self.ep * self.expert_tp * self.pp)


@dataclass(frozen=True)
class Train:
    """The training step's knobs."""

    longest: int  # longest sample, prompt + response, in tokens
    dynamic: bool = True
    max_tokens: int | None = None
    # every sample this long (a memory-faithful smoke's full-length answers): its micro-batches, not the
    # worst case of mixed lengths
    sample_tokens: int | None = None
    micro_batch: int = 1
    global_batch: int = 1
    recompute: str | None = None  # "full" | "selective"
    recompute_method: str | None = None  # "uniform" | "block"
    recompute_layers: int | None = None
    recompute_modules: tuple[str, ...] = ("core_attn",)
    hidden_dropout: float = 0.0
    unfused_attention: bool = False
    temperature: float = 1.0
    entropy_coef: float = 0.0
    logprob_chunk: int = -1
    grad_fp32: bool = False
    precision_aware: bool = False
    main_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    cpu_adam: bool = False
    cpu_adam_fraction: float = 1.0
    # Megatron's Adam: "fused" (TransformerEngine's or Apex's FusedAdam, as in slime's image: updates in
    # place) or "torch" (torch.optim.AdamW, Megatron's fallback without either: see plan.adam_step_phase)
    adam_kernel: str = "fused"
    # the layers' kernels: "transformer_engine" (fused norms, SwiGLU and attention, as in slime's image) or
    # "local" (--transformer-impl local: norms and SwiGLU in PyTorch ops, which keep more for backward)
    layer_impl: str = "transformer_engine"
    offload_train: bool = False
    ref: bool = False
    critic: bool = False
    keep_old_actor: bool = False
    teacher: bool = False


@dataclass(frozen=True)
class Rollout:
    """The SGLang engines' knobs."""

    gpus: int
    per_engine: int
    pp: int = 1
    mem_fraction: float | None = None
    requests: int = 1  # in flight across all engines: min(rollout samples, concurrency x engines)
    max_running: int | None = None
    prompt: int = 1024
    response: int = 1024
    eval_response: int | None = None
    kv_bytes: int = 2
    weight_bytes: float = 2.0
    graphs: bool = True
    graph_max_bs: int | None = None
    prefill_graphs: bool = True
    chunked_prefill: int | None = None


@dataclass(frozen=True)
class Card:
    name: str
    usable: int  # bytes the CUDA runtime reports (torch.cuda.get_device_properties().total_memory)
    smi_mib: int  # nvidia-smi's memory.total, which SGLang's defaults read
    source: str


RUNTIME_RESERVED_MIB = 600  # nvidia-smi's memory.total less torch's total_memory (where not measured)
# torch's total_memory; nvidia-smi's memory.total. Measured where noted, else nvidia-smi minus 600 MiB.
CARDS = {
    "H100-80GB": (int(79.19 * GIB), 81559, "torch 79.19 GiB (slime-skill capture and public OOM reports)"),
    "H800-80GB": (int(79.19 * GIB), 81559, "as H100-80GB"),
    "H200-141GB": (150109880320, 143771, "measured: tests/fixtures/env/h200x1"),
    "H20-96GB": ((97871 - 600) * MIB, 97871, "nvidia-smi 97871 MiB less 600 MiB (estimate)"),
    "A100-80GB": (int(79.15 * GIB), 81920, "torch 79.15 GiB (public OOM reports)"),
    "A800-80GB": (int(79.15 * GIB), 81920, "as A100-80GB"),
    "A100-40GB": (int(39.39 * GIB), 40960, "torch 39.39 GiB (public OOM reports)"),
    "L40S-48GB": (int(44.39 * GIB), 46068, "torch 44.39 GiB (public OOM reports)"),
    "B200-180GB": ((183359 - 600) * MIB, 183359, "nvidia-smi 183359 MiB less 600 MiB (estimate)"),
}


@dataclass(frozen=True)
class Job:
    shape: Shape
    par: Parallel
    train: Train
    rollout: Rollout | None  # None: no local engines (--debug-train-only, external engines)
    card: Card
    colocate: bool = False
    offload_rollout: bool = False
    gpus_per_node: int = 8
    host_ram: int | None = None  # bytes per node
    bf16: bool = True
    trains: bool = True  # False: --debug-rollout-only, the engines alone


@dataclass
class Item:
    label: str
    bytes: float
    kind: str  # "exact" | "estimate" | CACHED
    detail: str = ""


# An item torch's caching allocator keeps reserved though no tensor holds it: NVML (and the memory smoke) sees
# it, but the allocator frees its cached blocks and retries before it raises out-of-memory.
CACHED = "cached"


@dataclass
class Phase:
    name: str
    where: str  # "actor GPU", "rollout GPU", "shared GPU", "host per node"
    items: list[Item] = field(default_factory=list)
    capacity: int | None = None
    note: str = ""

    @property
    def total(self) -> float:
        return sum(i.bytes for i in self.items)

    @property
    def releasable(self) -> float:
        """What of ``total`` torch would free before running out of memory (the ``CACHED`` items)."""
        return sum(i.bytes for i in self.items if i.kind == CACHED)

    def add(self, label: str, nbytes: float, kind: str, detail: str = "") -> None:
        self.items.append(Item(label, nbytes, kind, detail))


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f}"
