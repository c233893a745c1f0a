"""Turn a slime (or slime-ref) run log into findings: what failed, the fix, and where slime documents it.

Each signature is a regular expression over one log line, written from the messages slime v0.3.1 and
SGLang print (see the failure notes the skill's troubleshooting pages are built from). The first line
that matches gives the finding its evidence; a signature reports once however often it matches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slime_check.findings import CUSTOMIZATION, FAQ, USAGE, Finding, Status, slime_doc

DEBUG = "docs/en/developer_guide/debug.md"


@dataclass(frozen=True)
class Signature:
    id: str
    pattern: re.Pattern
    status: Status
    finding: str
    fix: str
    doc: str


def _sig(id_: str, pattern: str, finding: str, fix: str, doc: str, status: Status = Status.FAIL) -> Signature:
    return Signature(f"smoke.log.{id_}", re.compile(pattern), status, finding, fix, slime_doc(doc))


# Most specific first: a CUDA-graph OOM is reported as such, not also as a generic OOM.
SIGNATURES: list[Signature] = [
    _sig("ray_auth", r"AuthenticationError: .*(InvalidAuthToken|token is missing or incorrect)",
         "The job could not join its Ray cluster: the cluster wants a token and this process sent none "
         "(Ray turns token auth on for `ray start --head` whenever ~/.ray/auth_token exists).",
         "export RAY_AUTH_MODE=token (the token is read from ~/.ray/auth_token) for the job as for the head, "
         "or start the head with RAY_AUTH_MODE=disabled.", USAGE),
    _sig("placement_group", r"Waiting for placement group of \d+ GPUs|cannot be scheduled right now: \{.*'GPU'",
         "The job waits for GPUs Ray does not have free (the placement group cannot be scheduled).",
         "Use --colocate, or make the GPU count cover actor + rollout GPUs; clear leftover jobs with `ray job stop`.",
         FAQ),
    _sig("cuda_graph", r"Capture cuda graph failed|CUDA graph failed",
         "SGLang failed to capture CUDA graphs at engine start (usually out of memory).",
         "Lower --sglang-mem-fraction-static, set --sglang-cuda-graph-max-bs-decode 16, or "
         "--sglang-disable-decode-cuda-graph.",
         "docs/en/get_started/agent.md"),
    _sig("engine_kv_oom", r"Not enough memory\. Please try to increase --mem-fraction-static",
         "The SGLang engine could not allocate its KV cache at start: the weights leave no room.",
         "Raise --sglang-mem-fraction-static, or spread each engine over more GPUs (--rollout-num-gpus-per-engine).",
         FAQ),
    _sig("colocate_oom", r"\[torch_memory_saver\.cpp\] (CUresult error: 2|cudaError error: 2)",
         "Out of GPU memory while switching between rollout and training (colocate offload/onload).",
         "Lower --sglang-mem-fraction-static (about 0.7-0.8 in colocate), or shrink rollouts / response length.",
         FAQ),
    _sig("train_oom", r"(MegatronTrainRayActor|TrainRayActor|train_actor).*(OutOfMemoryError|CUDA out of memory)",
         "The train actor ran out of GPU memory in a training or log-prob step.",
         "Lower --max-tokens-per-gpu (start at rollout_max_response_len / cp_size) or --log-probs-max-tokens-per-gpu.",
         FAQ),
    _sig("engine_oom", r"(SGLangEngine|Scheduler hit an exception).*"
         r"(OutOfMemoryError|CUDA out of memory|illegal memory)|CUDA error: an illegal memory access was encountered",
         "An SGLang engine ran out of GPU memory (or hit an illegal memory access, often OOM in disguise).",
         "Lower --sglang-mem-fraction-static; set CUDA_LAUNCH_BLOCKING=1 to locate a real illegal access.", DEBUG),
    _sig("cuda_oom", r"torch\.OutOfMemoryError|CUDA out of memory",
         "A process ran out of GPU memory.",
         "Lower --max-tokens-per-gpu or --sglang-mem-fraction-static; see which process printed it.", FAQ),
    _sig("nccl_timeout", r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imeout|DistBackendError"
         r"|ncclUnhandledCudaError",
         "A collective (NCCL) timed out or failed: usually a hung weight update or a dead rank.",
         "Check which rank died first; try --colocate, sync train.py, or --update-weight-transport disk.", USAGE),
    _sig("engine_exit", r"Server process terminated unexpectedly|Received sigquit from a child process"
         r"|Scheduler hit an exception",
         "An SGLang server exited: read the first (SGLangEngine ...) error above this line.",
         "Fix the engine's own error (memory, port, build); see the engine start failures in the FAQ.", FAQ),
    _sig("port_in_use", r"Address already in use",
         "A port was already taken when a server started.",
         "Run fewer SGLang servers per node, or stop the leftover run holding the port.", FAQ),
    _sig("router_unreachable", r"Max retries \(60\) reached|no_available_workers|All connection attempts failed"
         r"|'503 Service Unavailable'",
         "Rollout requests could not reach the router or engines.",
         "unset http_proxy/https_proxy before `ray start` (or set no_proxy); if an engine died, fix that first.", FAQ),
    _sig("numpy2", r"Megatron does not support numpy 2\.x",
         "slime's Megatron actor refuses NumPy 2 (it asserts numpy 1.x when it starts).",
         "pip install numpy==1.26.4 scipy==1.17.1 (slime's image pins both; SciPy 1.18+ needs NumPy 2).",
         "docker/Dockerfile"),
    _sig("te_layer_names", r"Unsupported Qwen/Llama Megatron parameter '[^']*(input_layernorm|pre_mlp_layernorm)"
         r"|Unknown parameter name: \S*(input_layernorm|pre_mlp_layernorm)",
         "Megatron built its local layer spec (--transformer-impl local), whose layer-norm names slime's Qwen/Llama "
         "weight converters do not know: neither the HF load nor the weight update works.",
         "Install TransformerEngine (slime's image has 2.16.1) and drop --transformer-impl local.",
         "docker/Dockerfile"),
    _sig("te_missing", r"is not available\. Please install TE|(ModuleNotFoundError|ImportError): No module named "
         r"'transformer_engine",
         "A Megatron setting needs TransformerEngine, which is not installed.",
         "Install TransformerEngine (slime's image has 2.16.1); --transformer-impl local does not load Qwen/Llama "
         "weights in slime v0.3.1.", "docker/Dockerfile"),
    # an exception line, not the engine's notes on optional kernels ("... is not available (No module named ...)")
    _sig("hook_import", r"^(?:.*?\(\w+ pid=\d+\)\S*\s+)?(?:ModuleNotFoundError|ImportError): No module named '[^']+'"
         r"|has no attribute '[^']+'.*(path|module)|importing '[^']+' failed",
         "A hook (--custom-*-path, --rollout-function-path, filters) could not be imported.",
         "Put the hook's folder on the workers' PYTHONPATH (runtime env) and give module.function.", CUSTOMIZATION),
    _sig("rm_type_missing", r"Rule-based RM type is not specified|Rule-based RM for .* is not implemented",
         "No reward is configured, or --rm-type names one slime does not have.",
         "Give --rm-type (math, deepscaler, dapo, f1, ...) or --custom-rm-path.", USAGE),
    _sig("reward_dict", r"unsupported operand type\(s\) for \+: 'int' and 'dict'|type dict doesn't define __round__",
         "The reward function returns a dict, but slime expects a number.",
         "Pass --reward-key <key> naming the dict's score field.", CUSTOMIZATION),
    _sig("data_key", r"KeyError: '[^']+'.*|lack '[^']+'|has no key '[^']+'",
         "A data row lacks a key the config reads.",
         "Set --input-key / --label-key (and --metadata-key) to the keys of the prompt file.", USAGE),
    _sig("weight_check", r"check tensor equality failed|--check-weight-update-equal: an engine's log-probs differ"
         r"|Weight version mismatch after disk reload",
         "The weight-update check failed: engines do not hold the trainer's weights after the sync.",
         "Check MODEL_ARGS against the checkpoint and the weight conversion; retry with --debug-rollout-only.", DEBUG),
    _sig("nan", r"found NaN in local grad norm|Unexpected result nan|'train/grad_norm': nan|'train/loss': nan",
         "NaN in the loss or gradients.",
         "Lower --lr, check the data; --no-check-for-nan-in-loss-and-grad skips bad steps.", FAQ),
    _sig("ray_start", r"The current node timed out during startup|Failed to connect to GCS",
         "Ray did not start in time (the raylet or GCS did not come up): often an overloaded machine.",
         "Retry when the machine is less busy; check /dev/shm and the session logs under the Ray temp dir.", FAQ),
    _sig("host_oom", r"Worker exit type: SYSTEM_ERROR|memory monitor|killed by the memory monitor|OOM killer",
         "A worker was killed for host memory.",
         "Give the job more RAM, or save less often / smaller shards.", FAQ),
]


def scan(text: str) -> list[Finding]:
    """Findings for every signature the log matches (one each, the first matching line as evidence)."""
    found: list[Finding] = []
    seen: set[str] = set()
    lines = text.splitlines()
    for sig in SIGNATURES:
        for line in lines:
            if sig.pattern.search(line):
                group = _family(sig.id)
                if group in seen:
                    break
                seen.add(group)
                evidence = line.strip()
                if len(evidence) > 200:
                    evidence = evidence[:197] + "..."
                found.append(Finding(sig.id, sig.status, f"{sig.finding} Log: {evidence}", sig.fix, sig.doc))
                break
    return found


def _family(sig_id: str) -> str:
    # the GPU-memory signatures are alternatives: the most specific one reports, the generic one stays quiet
    return "oom" if sig_id.rsplit(".", 1)[1] in OOM_FAMILY else sig_id


OOM_FAMILY = {"cuda_graph", "engine_kv_oom", "colocate_oom", "train_oom", "engine_oom", "cuda_oom"}
