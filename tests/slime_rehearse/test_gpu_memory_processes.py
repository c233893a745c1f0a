"""Each process's share of a GPU during ``slime-check smoke --memory`` (slime_rehearse.gpu_memory): read
from NVML's compute-process list, named from /proc, and kept per phase, so what a sleeping trainer or
engine holds outside its allocator is measured."""

from __future__ import annotations

import ctypes
import os
import threading

from slime_rehearse.gpu_memory import (
    BETWEEN,
    NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_VALUE_NOT_AVAILABLE,
    PROCESS_EVERY,
    ROLLOUT,
    STARTUP,
    TRAIN,
    Nvml,
    Sampler,
    Timeline,
    Trace,
    _ProcessInfo,
    process_name,
    process_peaks,
)

GIB = 2**30


class FakeProcessList:
    """nvmlDeviceGetComputeRunningProcesses_v3 as the driver answers it: too small a buffer gets
    NVML_ERROR_INSUFFICIENT_SIZE and the count it needs."""

    def __init__(self, per_gpu: list[list[tuple[int, int]]]):
        self.per_gpu = per_gpu
        self.calls = 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count_ref, infos) -> int:
        self.calls += 1
        rows = self.per_gpu[handle]
        count = count_ref._obj
        if count.value < len(rows):
            count.value = len(rows)
            return NVML_ERROR_INSUFFICIENT_SIZE
        for i, (pid, used) in enumerate(rows):
            infos[i].pid, infos[i].usedGpuMemory = pid, used
        count.value = len(rows)
        return 0


def nvml_over(lib, gpus: int) -> Nvml:
    nvml = Nvml.__new__(Nvml)  # no libnvidia-ml here: the handles are the GPUs' indices
    nvml.lib, nvml.handles = lib, list(range(gpus))
    return nvml


def test_each_processs_share_is_read_past_the_first_buffer_and_a_hidden_one_is_left_out():
    many = [(1000 + i, i * GIB) for i in range(20)]  # more than the first buffer's 16
    lib = FakeProcessList([many + [(99, NVML_VALUE_NOT_AVAILABLE)], [(7, 3 * GIB)]])
    shares = nvml_over(lib, 2).processes()
    assert shares == [{pid: used for pid, used in many}, {7: 3 * GIB}]
    assert lib.calls == 3  # GPU 0 asked twice (16, then 21 rows), GPU 1 once


def test_a_driver_without_the_process_list_gives_none():
    assert nvml_over(object(), 1).processes() is None


def test_each_process_keeps_its_largest_share_in_each_phase():
    trace = Trace(processes=[(1.0, 0, 11, 2 * GIB), (5.0, 0, 11, 40 * GIB), (5.0, 0, 12, 1 * GIB),
                             (9.0, 0, 11, 3 * GIB), (9.0, 0, 12, 30 * GIB), (9.5, 0, 12, 31 * GIB),
                             (12.0, 0, 11, 41 * GIB), (12.0, 1, 13, 5)],
                  process_names={11: "sglang::scheduler", 12: "ray::MegatronTrainRayActor.train"})
    timeline = Timeline(rollout=[(4.0, 7.0)], train=[(8.0, 10.0)])
    assert process_peaks(trace, timeline) == [
        {"gpu": 0, "pid": 11, "name": "sglang::scheduler", "peak_bytes": 41 * GIB,
         "phases": {STARTUP: 2 * GIB, ROLLOUT: 40 * GIB, TRAIN: 3 * GIB, BETWEEN: 41 * GIB}},
        {"gpu": 0, "pid": 12, "name": "ray::MegatronTrainRayActor.train", "peak_bytes": 31 * GIB,
         "phases": {ROLLOUT: 1 * GIB, TRAIN: 31 * GIB}},
        {"gpu": 1, "pid": 13, "name": "?", "peak_bytes": 5, "phases": {BETWEEN: 5}},
    ]


def test_a_process_is_named_by_its_command_line_and_one_out_of_sight_by_a_question_mark():
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        words = [w.decode() for w in f.read().split(b"\0") if w]
    name = process_name(os.getpid())  # its arguments joined by spaces, cut short
    assert name and " ".join(words).startswith(name) and name.startswith(words[0][:len(name)])
    assert process_name(0) == "?"  # no /proc/0


class FakeNvml:
    """One GPU whose used memory and process list the sampler reads; ``processes=None``: a driver
    without the list."""

    def __init__(self, processes):
        self._processes = processes
        self.process_calls = 0
        self.samples = 0
        self.enough = threading.Event()

    def memory(self):
        self.samples += 1
        if self.samples > 3 * PROCESS_EVERY:
            self.enough.set()
        return [(5 * GIB, 80 * GIB)]

    def processes(self):
        self.process_calls += 1
        return self._processes

    def close(self):
        pass


def test_the_sampler_reads_the_processes_every_few_samples_and_names_each_once():
    nvml = FakeNvml([{os.getpid(): 4 * GIB}])
    sampler = Sampler(nvml, interval_s=0.0)
    assert nvml.enough.wait(timeout=60)
    trace = sampler.stop()
    reads = len(trace.processes)
    assert reads == nvml.process_calls and reads >= 3
    assert abs(reads - len(trace.times) / PROCESS_EVERY) <= 1  # one reading every PROCESS_EVERY samples
    assert {pid for _, _, pid, _ in trace.processes} == {os.getpid()}
    assert set(trace.process_names) == {os.getpid()} and trace.process_names[os.getpid()] != "?"


def test_a_driver_without_the_process_list_is_asked_once():
    nvml = FakeNvml(None)
    sampler = Sampler(nvml, interval_s=0.0)
    assert nvml.enough.wait(timeout=60)
    trace = sampler.stop()
    assert nvml.process_calls == 1 and trace.processes == [] and len(trace.times) > 3 * PROCESS_EVERY


def test_the_process_info_struct_has_nvmls_layout():
    # unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId
    assert ctypes.sizeof(_ProcessInfo) == 24
    assert [f for f, _ in _ProcessInfo._fields_] == ["pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId"]
