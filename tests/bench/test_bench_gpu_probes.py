"""bench/gpu's memory probes on this CPU machine: the snapshot reader on a snapshot in torch's own
format (``torch.cuda.memory._snapshot``'s dict), and each probe's one-line refusal."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))

import process_overhead  # noqa: E402
import snapshot_segments  # noqa: E402

MIB = 1 << 20


def _frame(path: str, line: int, name: str) -> dict:
    return {"filename": path, "line": line, "name": name}


def test_segments_are_listed_in_order_with_the_running_reserved_total_and_python_frames(tmp_path, monkeypatch, capsys):
    adam = _frame("/venv/lib/python3.12/site-packages/torch/optim/adamw.py", 500, "_multi_tensor_adamw")
    native = _frame("??", 0, "c10::cuda::CUDACachingAllocator::malloc")
    snap = {"device_traces": [[
        {"action": "segment_alloc", "addr": 0, "size": 2048 * MIB, "stream": 0, "time_us": 1_000_000,
         "frames": [native, _frame("/tmp/slime-set/slime/slime/model.py", 10, "forward")]},
        {"action": "alloc", "addr": 0, "size": 2048 * MIB, "stream": 0, "time_us": 1_000_001, "frames": []},
        {"action": "segment_alloc", "addr": 1, "size": 2 * MIB, "stream": 0, "time_us": 1_500_000, "frames": [adam]},
        {"action": "segment_alloc", "addr": 2, "size": 512 * MIB, "stream": 0, "time_us": 3_000_000,
         "frames": [native, adam]},
        {"action": "segment_free", "addr": 0, "size": 2048 * MIB, "stream": 0, "time_us": 4_000_000, "frames": []},
    ]], "segments": [{"total_size": 512 * MIB, "allocated_size": 256 * MIB}]}
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    monkeypatch.setattr(sys, "argv", ["snapshot_segments.py", str(path), "--min-mib", "64"])
    snapshot_segments.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "device 0: 5 events"
    # the 2 MiB segment is under --min-mib, yet counted in the running total
    assert lines[1].split() == ["0.00s", "segment_alloc", "2048.0", "MiB", "reserved", "2.00", "GiB"]
    assert lines[2].strip() == "slime/slime/model.py:10 forward"
    assert lines[3].split() == ["2.00s", "segment_alloc", "512.0", "MiB", "reserved", "2.50", "GiB"]
    assert lines[4].strip() == "torch/optim/adamw.py:500 _multi_tensor_adamw"
    assert lines[5].split()[:6] == ["3.00s", "segment_free", "2048.0", "MiB", "reserved", "0.50"]
    assert lines[-1] == "at the dump: 1 segments, 0.50 GiB reserved, 0.25 GiB allocated"


@pytest.mark.parametrize("probe, argv, words", [
    (snapshot_segments, ["snapshot_segments.py", "/nonexistent/snap.pickle"], "cannot read /nonexistent/snap.pickle"),
    (process_overhead, ["process_overhead.py"], "needs a CUDA GPU and NVML"),
])
def test_each_probe_refuses_in_one_line_with_exit_2(probe, argv, words, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", argv)
    if probe is process_overhead:
        monkeypatch.setattr(process_overhead.Nvml, "open", classmethod(lambda cls: None))
    with pytest.raises(SystemExit) as stop:
        probe.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and words in err and len(err.strip().splitlines()) == 1
