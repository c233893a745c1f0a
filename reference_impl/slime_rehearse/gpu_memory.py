"""GPU memory during a memory-faithful ``slime-check smoke``: each GPU's peak per phase, and the
numbers of an out-of-memory error.

What is read, and why that: NVML's device-wide "used" memory (``nvmlDeviceGetMemoryInfo``), sampled
every ``INTERVAL_S`` on a thread of the smoke's own process. It counts every process on the GPU
(trainer, SGLang, CUDA contexts, NCCL, fragmentation): what runs out is the card, not one allocator.
NVML is reached through ``libnvidia-ml.so.1`` with ctypes, so no package is needed; where the library
is missing (a CPU machine) nothing is sampled. Every ``PROCESS_EVERY`` samples it also reads each process's
share (``nvmlDeviceGetComputeRunningProcesses``: its CUDA context, allocator pool, NCCL buffers), so the
memory that is no allocator's (a sleeping trainer's or engine's remainder) is measured, not guessed.

Phases come from the run itself:
- the rollout: the smoke's generate wrapper (``smoke_runtime``) appends the start and end time of every
  generate call to ``OUT/memory/generate.<pid>``; the union of those calls is the rollout;
- training (the log-prob passes and the optimizer steps): slime's ``Timer train start`` / ``Timer
  train end`` log lines, or slime-ref's ``timeline.jsonl``;
- the weight update: slime-ref's ``timeline.jsonl`` (slime's whole-second stamps cannot tell its
  fraction of a second from the engine taking its pool back right after);
- start-up: what comes before the first of those windows (engines, trainer, first weight sync);
- the rest: the switches between rollout and training (an engine's pool released or taken back, the
  trainer put to sleep or woken), and slime's weight updates.
A colocated engine holds its pool until the switch after the rollout, so only these windows tell the
training peak from the engine's: "after the rollout" is not "training".
"""

from __future__ import annotations

import ctypes
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

GIB = 2**30
INTERVAL_S = 0.02  # a logits buffer lives for tens of milliseconds; 20 ms sees most of them
PROCESS_EVERY = 25  # each process's share every 0.5 s: what is no allocator's changes at the switches, seconds apart
STARTUP, ROLLOUT, TRAIN = "start-up", "rollout", "training and log-prob passes"
WEIGHTS = "weight update"
BETWEEN = "switches between rollout and training"
PHASES = (STARTUP, ROLLOUT, TRAIN, WEIGHTS, BETWEEN)
MARKS_DIR = "memory"


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2 and v3 alike)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1  # a process whose share the driver does not tell (some containers)


class Nvml:
    """The few NVML calls the sampler needs; ``Nvml.open()`` is None where NVML is absent."""

    def __init__(self, lib):
        self.lib = lib
        count = ctypes.c_uint()
        self._check(lib.nvmlDeviceGetCount_v2(ctypes.byref(count)))
        self.handles = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            self._check(lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)))
            self.handles.append(handle)

    @staticmethod
    def _check(rc: int) -> None:
        if rc != 0:
            raise OSError(f"NVML error {rc}")

    @classmethod
    def open(cls) -> Nvml | None:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            cls._check(lib.nvmlInit_v2())
            return cls(lib)
        except (OSError, AttributeError):
            return None

    def memory(self) -> list[tuple[int, int]]:
        """(used, total) bytes of each GPU."""
        out = []
        for handle in self.handles:
            info = _Memory()
            self._check(self.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(info)))
            out.append((info.used, info.total))
        return out

    def processes(self) -> list[dict[int, int]] | None:
        """Each GPU's compute processes: {pid: used bytes}; None where this driver cannot tell."""
        call = getattr(self.lib, "nvmlDeviceGetComputeRunningProcesses_v3", None)
        if call is None:
            return None
        out = []
        for handle in self.handles:
            count = ctypes.c_uint(16)
            for _ in range(3):  # the list may grow between asking its size and reading it
                infos = (_ProcessInfo * count.value)()
                rc = call(handle, ctypes.byref(count), infos)
                if rc != NVML_ERROR_INSUFFICIENT_SIZE:
                    break
                count.value += 8  # NVML set it to what it needs now; room for a few more
            self._check(rc)
            out.append({info.pid: info.usedGpuMemory for info in infos[:count.value]
                        if info.usedGpuMemory != NVML_VALUE_NOT_AVAILABLE})
        return out

    def close(self) -> None:
        self.lib.nvmlShutdown()


def process_name(pid: int) -> str:
    """A process's command line, short (Ray actors and SGLang's scheduler name themselves there:
    ``ray::MegatronTrainRayActor.train``, ``sglang::scheduler``); "?" for one this machine cannot see."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return b" ".join(w for w in words if w).decode(errors="replace")[:120] or "?"


@dataclass
class Trace:
    """Samples of each GPU's used bytes: ``times[i]`` and ``used[i][gpu]``; ``total[gpu]`` the card."""
    times: list[float] = field(default_factory=list)
    used: list[list[int]] = field(default_factory=list)
    total: list[int] = field(default_factory=list)
    baseline: list[int] = field(default_factory=list)  # used before the run started (other processes)
    processes: list[tuple[float, int, int, int]] = field(default_factory=list)  # (time, gpu, pid, used bytes)
    process_names: dict[int, str] = field(default_factory=dict)  # named when first seen: it may be gone by the end


class Sampler:
    """Samples NVML on a thread until :meth:`stop`; :attr:`trace` holds what it saw."""

    def __init__(self, nvml: Nvml, interval_s: float = INTERVAL_S):
        self.nvml, self.interval_s = nvml, interval_s
        self.trace = Trace()
        first = nvml.memory()
        self.trace.total = [t for _, t in first]
        self.trace.baseline = [u for u, _ in first]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpu-memory")
        self._thread.start()

    def _run(self) -> None:
        n, per_process = 0, True
        while not self._stop.is_set():
            try:
                sample = self.nvml.memory()
            except OSError:
                return
            now = time.time()
            self.trace.times.append(now)
            self.trace.used.append([u for u, _ in sample])
            if per_process and n % PROCESS_EVERY == 0:
                per_process = self._sample_processes(now)
            n += 1
            self._stop.wait(self.interval_s)

    def _sample_processes(self, now: float) -> bool:
        """One reading of each process's share; False once the driver cannot give it (stop asking)."""
        try:
            shares = self.nvml.processes()
        except OSError:
            return False
        for gpu, by_pid in enumerate(shares or []):
            for pid, used in by_pid.items():
                if pid not in self.trace.process_names:
                    self.trace.process_names[pid] = process_name(pid)
                self.trace.processes.append((now, gpu, pid, used))
        return shares is not None

    def stop(self) -> Trace:
        self._stop.set()
        self._thread.join(timeout=5)
        self.nvml.close()
        return self.trace


def start_sampler() -> Sampler | None:
    nvml = Nvml.open()
    return Sampler(nvml) if nvml is not None and nvml.handles else None


# ---------------------------------------------------------------------------------------------
# phases


def generate_windows(out: Path) -> list[tuple[float, float]]:
    """The generate calls the smoke's wrapper recorded (``start end`` a line, in any process), merged."""
    spans = []
    for path in sorted((out / MARKS_DIR).glob("generate.*")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                try:
                    spans.append((float(parts[0]), float(parts[1])))
                except ValueError:
                    continue
    return _merge(spans)


# slime's timer (slime/utils/timer.py) logs "[2026-12-06 14:29:40] timer.py:24 - Timer train start" in the
# training actor, and "Timer train end (elapsed: 30.7s)"; "train" spans the log-prob passes and the optimizer steps
SLIME_TIMER = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] timer\.py:\d+ - Timer (\w+) (start|end)"
                         r"(?: \(elapsed: ([\d.]+)s\))?")
# a colocated engine giving up or taking back its memory: SGLang's access log, written once the call is done
POOL_SWITCH = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] INFO: .*\"POST /(release|resume)_memory_occupation")


@dataclass
class Timeline:
    """When each phase ran (wall-clock seconds): lists of (start, end), merged."""
    rollout: list[tuple[float, float]] = field(default_factory=list)
    train: list[tuple[float, float]] = field(default_factory=list)
    weights: list[tuple[float, float]] = field(default_factory=list)


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _stamp(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S"))  # the machine's local time, as logged


def slime_timer_spans(log: str, name: str) -> list[tuple[float, float]]:
    """Spans of slime's ``Timer NAME`` from the log. Its stamps are whole seconds and its end line gives
    the elapsed time, so a phase that started in second S and ended in second E after D seconds ran
    somewhere in [max(S, E - D), min(E + 1, S + 1 + D)], and surely in [min(S + 1, E + 1 - D),
    max(E, S + D)]. A span is the first, narrowed to the second where a colocated engine gave up its pool
    in the start's second (before training) or took it back in the end's second or the next (after it):
    that memory is the engine's, not the phase's. A sub-second step (the second step of a short job, the
    one that trains beside Adam's moments) keeps its window."""
    switched: dict[str, set[float]] = {"release": set(), "resume": set()}
    for m in POOL_SWITCH.finditer(log):
        switched[m.group(2)].add(_stamp(m.group(1)))
    spans, opened = [], []
    for m in SLIME_TIMER.finditer(log):
        if m.group(2) != name:
            continue
        t = _stamp(m.group(1))
        if m.group(3) == "start":
            opened.append(t)
        elif opened:
            start = opened.pop(0)
            # no elapsed time on the line: the whole seconds surely inside, [S + 1, E]
            took = float(m.group(4)) if m.group(4) else max(0.0, t - start - 1)
            early, late = (max(start, t - took), min(start + 1, t + 1 - took))  # where it may have started
            first, last = (max(t, start + took), min(t + 1, start + 1 + took))  # where it may have ended
            begin = late if start in switched["release"] else early
            end = first if {t, t + 1} & switched["resume"] else last
            if end > begin:
                spans.append((begin, end))
    return spans


def timeline_spans(path: Path) -> dict[str, list[tuple[float, float]]]:
    """slime-ref's ``timeline.jsonl``: the spans of each phase it names."""
    spans: dict[str, list[tuple[float, float]]] = {}
    if not path.is_file():
        return spans
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            spans.setdefault(row["phase"], []).append((float(row["start"]), float(row["end"])))
        except (ValueError, KeyError, TypeError):
            continue
    return spans


def read_timeline(out: Path, log: str, run_dir: Path | None = None) -> Timeline:
    """The run's phases: generate marks under ``out``, slime's timer lines in ``log``, slime-ref's
    ``run_dir/timeline.jsonl``."""
    ref = timeline_spans((run_dir or out / "run") / "timeline.jsonl")
    train = ref.get("train") or slime_timer_spans(log, "train")
    return Timeline(rollout=generate_windows(out), train=_merge(train), weights=_merge(ref.get("update_weights", [])))


def phase_at(t: float, timeline: Timeline) -> str:
    """The phase at ``t``: inside a window, that phase; before the first window of any kind, start-up (a
    job with --load-debug-rollout-data has no rollout, one with --debug-rollout-only no training)."""
    phases = ((ROLLOUT, timeline.rollout), (TRAIN, timeline.train), (WEIGHTS, timeline.weights))
    for name, spans in phases:
        if any(s <= t <= e for s, e in spans):
            return name
    starts = [s for _, spans in phases for s, _ in spans]
    return STARTUP if not starts or t < min(starts) else BETWEEN


def phase_peaks(trace: Trace, timeline: Timeline) -> list[dict]:
    """Per GPU: the peak used bytes of the whole run and of each phase (phases with no sample left out)."""
    gpus = []
    for g, total in enumerate(trace.total):
        peaks: dict[str, int] = {}
        for t, used in zip(trace.times, trace.used, strict=True):
            name = phase_at(t, timeline)
            peaks[name] = max(peaks.get(name, 0), used[g])
        gpus.append({"gpu": g, "total_bytes": total, "baseline_bytes": trace.baseline[g],
                     "peak_bytes": max(peaks.values(), default=0),
                     "phases": {name: peaks[name] for name in PHASES if name in peaks}})
    return gpus


def process_peaks(trace: Trace, timeline: Timeline) -> list[dict]:
    """Per GPU and process: the largest share it held in the whole run and in each phase. A process
    asleep in a phase (a colocated engine during training, the trainer during the rollout) shows there
    what it keeps that is no allocator's: its CUDA context, NCCL's buffers, what the memory saver left."""
    peaks: dict[tuple[int, int], dict[str, int]] = {}
    for t, gpu, pid, used in trace.processes:
        phases = peaks.setdefault((gpu, pid), {})
        name = phase_at(t, timeline)
        phases[name] = max(phases.get(name, 0), used)
    return [{"gpu": gpu, "pid": pid, "name": trace.process_names.get(pid, "?"),
             "peak_bytes": max(phases.values()), "phases": {n: phases[n] for n in PHASES if n in phases}}
            for (gpu, pid), phases in sorted(peaks.items())]


def coarse_trace(trace: Trace, bin_s: float = 0.1) -> dict:
    """The trace at ``bin_s`` resolution, each bin the largest sample in it: small enough to keep beside
    the report, fine enough to line up with the log afterwards."""
    bins: dict[int, list[int]] = {}
    for t, used in zip(trace.times, trace.used, strict=True):
        key = int(t / bin_s)
        bins[key] = [max(a, b) for a, b in zip(bins[key], used, strict=True)] if key in bins else list(used)
    return {"bin_s": bin_s, "total": trace.total, "baseline": trace.baseline,
            "samples": [[round(k * bin_s, 2), *v] for k, v in sorted(bins.items())]}


def peak_time(trace: Trace) -> float | None:
    """When the busiest GPU was fullest: where an OOM whose traceback names no phase most likely hit."""
    if not trace.times:
        return None
    return max(zip(trace.times, trace.used, strict=True), key=lambda s: max(s[1]))[0]


# ---------------------------------------------------------------------------------------------
# an out-of-memory error in the log

_SIZE = r"([\d.]+) ([KMGT]i?B)"
_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9,
          "TB": 10**12}
# torch: "CUDA out of memory. Tried to allocate 58.00 GiB. GPU 0 has a total capacity of 139.81 GiB of
# which 40.12 GiB is free."
TORCH_OOM = re.compile(r"Tried to allocate " + _SIZE + r"\.? GPU (\d+) has a total capacity of " + _SIZE
                       + r" of which " + _SIZE + r" is free")
# What ran out, by the traceback's frames ("file function"), most specific phase first.
OOM_FRAMES = (
    (r"\bcapture", "SGLang's CUDA-graph capture (engine start)"),
    (r"init_memory_pool|profile_max_num_token|Not enough memory\. Please try to increase --mem-fraction-static",
     "SGLang's KV pool (engine start)"),
    (r"torch_memory_saver|resume_memory_occupation|wake_up|onload", "the switch between rollout and training"),
    (r"update_weight|weight_update|broadcast_weights|weight_sync", "the weight update"),
    (r"compute_log_prob|log_prob", "the log-prob pass"),
    (r"train_one_step|train_actor|forward_backward|backward|optimizer|train_step|loss_fn| train$",
     "the training step"),
    (r"scheduler|decode|prefill|forward_batch|generate", "the rollout (SGLang)"),
)
OOM_LINE = re.compile(r"CUDA out of memory|OutOfMemoryError|Not enough memory\. Please try to increase "
                      r"--mem-fraction-static|\[torch_memory_saver\.cpp\] (CUresult error: 2|cudaError error: 2)")
# "... Process 2259 has 57.50 GiB memory in use. Including non-PyTorch memory, this process has 21.32 GiB ..."
OTHER_PROCESS = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
THIS_PROCESS = re.compile(r"this process has " + _SIZE + r" memory in use")
TRACEBACK_LINES = 400  # how far above the error its traceback may start
FRAME = re.compile(r'File "([^"]+)", line \d+, in (\S+)')


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


@dataclass
class OutOfMemory:
    phase: str  # what ran out, in words
    requested: int | None = None  # bytes the failing allocation asked for
    free: int | None = None  # bytes free on the GPU then
    capacity: int | None = None
    gpu: int | None = None
    line: str = ""
    others: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes) of the card's other processes
    this_process: int | None = None  # bytes the process that ran out held

    @property
    def short_by(self) -> int | None:
        if self.requested is None or self.free is None:
            return None
        return max(0, self.requested - self.free)


def find_oom(log: str, timeline: Timeline | None = None, at: float | None = None) -> OutOfMemory | None:
    """The first out-of-memory error in ``log``: which phase it hit (from the traceback's frames above
    the error, else from the time ``at`` it was seen against the run's ``timeline``) and, for torch's
    message, the allocation and the free memory."""
    lines = log.splitlines()
    # torch's own message carries the numbers; Ray's "RayTaskError(OutOfMemoryError)" line comes before it
    hit = next((i for i, ln in enumerate(lines) if TORCH_OOM.search(ln)), None)
    if hit is None:
        hit = next((i for i, ln in enumerate(lines) if OOM_LINE.search(ln)), None)
    if hit is None:
        return None
    top = next((i for i in range(hit, max(-1, hit - TRACEBACK_LINES), -1) if "Traceback (most recent call last)"
                in lines[i]), max(0, hit - TRACEBACK_LINES))
    frames = [f"{m.group(1)} {m.group(2)}" for ln in lines[top:hit] if (m := FRAME.search(ln))] + [lines[hit]]
    # the most specific phase any frame names (a log-prob pass runs inside train(), through Megatron's
    # forward_backward, so its own frame must win over theirs)
    phase = next((name for pattern, name in OOM_FRAMES if any(re.search(pattern, f) for f in frames)), None)
    if phase is None:
        phase = phase_at(at, timeline) if at is not None and timeline is not None else "an unknown phase"
    oom = OutOfMemory(phase, line=lines[hit].strip()[:300])
    m = TORCH_OOM.search(lines[hit]) or TORCH_OOM.search(" ".join(lines[hit:hit + 3]))
    if m:
        oom.requested = _bytes(m.group(1), m.group(2))
        oom.gpu = int(m.group(3))
        oom.capacity = _bytes(m.group(4), m.group(5))
        oom.free = _bytes(m.group(6), m.group(7))
        text = " ".join(lines[hit:hit + 3])
        oom.others = [(int(pid), _bytes(n, u)) for pid, n, u in OTHER_PROCESS.findall(text)]
        own = THIS_PROCESS.search(text)
        oom.this_process = _bytes(own.group(1), own.group(2)) if own else None
    return oom
