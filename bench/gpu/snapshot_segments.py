"""Where a process's reserved GPU memory grew: the segment allocations of a torch memory snapshot
(``torch.cuda.memory._dump_snapshot``, slime's --record-memory-history), in order, with the running
reserved total and the Python frames that asked for each segment.

    python3 bench/gpu/snapshot_segments.py SNAPSHOT.pickle [--min-mib 64] [--frames 5]
"""
import argparse
import pickle

MIB = 1 << 20


def python_frames(frames: list[dict], keep: int) -> list[str]:
    """The first ``keep`` frames from Python files (C++ frames of the allocator left out)."""
    out = [f"{f['filename'].split('site-packages/')[-1].split('slime-set/')[-1]}:{f['line']} {f['name']}"
           for f in frames if f.get("filename", "").endswith(".py")]
    return out[:keep]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("snapshot")
    p.add_argument("--min-mib", type=float, default=64)
    p.add_argument("--frames", type=int, default=5)
    a = p.parse_args()
    try:
        with open(a.snapshot, "rb") as f:
            snap = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        p.exit(2, f"snapshot_segments.py: cannot read {a.snapshot} ({e}); give the .pickle that "
               "--record-memory-history wrote under --memory-snapshot-dir\n")
    for device, trace in enumerate(snap.get("device_traces", [])):
        if not trace:
            continue
        reserved = 0
        t0 = trace[0].get("time_us", 0)
        print(f"device {device}: {len(trace)} events")
        for e in trace:
            action, size = e["action"], e.get("size", 0)
            if action in ("segment_alloc", "segment_map"):
                reserved += size
            elif action in ("segment_free", "segment_unmap"):
                reserved -= size
            else:
                continue
            if size >= a.min_mib * MIB:
                t = (e.get("time_us", 0) - t0) / 1e6
                print(f"{t:9.2f}s {action:13s} {size / MIB:9.1f} MiB  reserved {reserved / 2**30:6.2f} GiB")
                for line in python_frames(e.get("frames", []), a.frames):
                    print("      " + line)
    segs = snap.get("segments", [])
    print(f"at the dump: {len(segs)} segments, {sum(s['total_size'] for s in segs) / 2**30:.2f} GiB reserved, "
          f"{sum(s['allocated_size'] for s in segs) / 2**30:.2f} GiB allocated")


if __name__ == "__main__":
    main()
