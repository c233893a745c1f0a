"""dev/offline-wheels/: what carries the GPU benches to an offline machine that takes a few MiB a call.

A file too big for one call travels in checked pieces and installs once the last arrives; compiled
kernels travel to the next machine; a call cut off at a fixed time starts only the jobs it has time for.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from _final_run import run_recorded

REPO = Path(__file__).resolve().parents[2]
DEV = REPO / "dev" / "offline-wheels"
INSTALL_PIECES = DEV / "install_pieces.sh"
FILES = {"pkg/__init__.py": b"VALUE = 1\n", "pkg/engine.py": b"def run():\n    return 'old'\n"}
pytestmark = pytest.mark.skipif(subprocess.run(["bash", "--version"], capture_output=True).returncode != 0,
                                reason="needs bash")


def make_wheel(path: Path, files: dict[str, bytes]) -> Path:
    """A wheel whose RECORD lists every member with its sha256 and size."""
    def digest(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "pkg-1.0.dist-info/RECORD"
    with zipfile.ZipFile(path, "w") as z:
        rows = []
        for name, data in {**files, "pkg-1.0.dist-info/METADATA": b"Name: pkg\nVersion: 1.0\n"}.items():
            z.writestr(name, data)
            rows.append([name, digest(data), str(len(data))])
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([*rows, [record, "", ""]])
        z.writestr(record, text.getvalue())
    return path


def pieces(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEV / "pieces.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def gather(group: Path, store: Path, **env) -> subprocess.CompletedProcess:
    """One device call's worth: install_pieces.sh with one piece's folder."""
    return subprocess.run(["bash", str(INSTALL_PIECES), str(group), str(store)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHON": sys.executable, **env})


def test_a_wheel_too_big_for_one_call_travels_in_pieces_and_installs_once_the_last_arrives(tmp_path):
    import random

    big = random.Random(0).randbytes(int(2.5 * 2**20))  # incompressible: the wheel stays 2.5 MiB
    wheel_file = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    src = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl",
                     {**FILES, "pkg/big.so": big, "pkg-1.0.dist-info/WHEEL": wheel_file})
    out = tmp_path / "out"
    (out / "fa3-7").mkdir(parents=True)  # a stale piece folder from an earlier build goes
    done = pieces("split", src, out, "fa3-", 1)
    assert done.returncode == 0, done.stderr
    folders = sorted(p.name for p in out.iterdir())
    assert folders == ["fa3-1", "fa3-2", "fa3-3"]
    assert all(len(list((out / f).iterdir())) == 2 for f in folders)  # one piece and the manifest each
    assert all(p.stat().st_size <= 2**20 for p in out.glob("fa3-*/*.part*"))

    store, site = tmp_path / "store", tmp_path / "site"
    first = gather(out / "fa3-3", store, TARGET=str(site))
    assert first.returncode == 0, first.stderr
    assert "1 of 3 pieces" in first.stderr and "still to carry: 1, 2" in first.stderr
    assert not site.exists()
    assert gather(out / "fa3-1", store, TARGET=str(site)).returncode == 0
    last = gather(out / "fa3-2", store, TARGET=str(site))
    assert last.returncode == 0, last.stderr
    assert (store / src.name).read_bytes() == src.read_bytes()
    assert (site / "pkg" / "big.so").read_bytes() == big


def test_a_damaged_or_foreign_piece_stops_the_join_naming_it(tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    out = tmp_path / "out"
    assert pieces("split", src, out, "p", 1).returncode == 0
    store = tmp_path / "store"
    assert gather(out / "p1", store).returncode == 0
    piece = next((out / "p2").glob("*.part*"))
    data = piece.read_bytes()
    piece.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit flipped in transit
    damaged = gather(out / "p2", store)
    assert damaged.returncode == 2
    assert f"{piece.name}: damaged" in damaged.stderr and "Traceback" not in damaged.stderr
    assert not (store / "blob.bin").exists() and not (store / "blob.bin.partial").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = gather(empty, store)
    assert refused.returncode == 2 and "no pieces manifest" in refused.stderr


def test_kernel_cache_carries_flashinfer_modules_to_its_ahead_of_time_folder(tmp_path):
    """kernel_cache.sh: pack on the machine that compiled the kernels, unpack on the next one;
    flashinfer's module libraries land where it loads ahead-of-time builds without ninja, triton's cache
    where triton looks."""
    script = DEV / "kernel_cache.sh"
    base, triton, site = tmp_path / "home", tmp_path / "triton", tmp_path / "site"
    ops = base / ".cache" / "flashinfer" / "0.6.12" / "90a" / "cached_ops"
    (ops / "batch_decode").mkdir(parents=True)
    library = os.urandom(3 << 20)  # incompressible: 3 MiB packed
    (ops / "batch_decode" / "batch_decode.so").write_bytes(library)
    (ops / "batch_decode" / "batch_decode.cuda.o").write_bytes(b"object file: stays behind")
    (triton / "abc").mkdir(parents=True)
    (triton / "abc" / "k.cubin").write_bytes(b"cubin")
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("raise SystemExit('imported')\n")
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(base), "TRITON_CACHE_DIR": str(triton),
           "PART_MIB": "1", "PYTHONPATH": str(site)}

    def cache(*args, **extra):
        return subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                              env={**env, **extra}, timeout=60)

    too_big = cache("pack", str(tmp_path / "none"), MAX_MIB="2")
    assert too_big.returncode == 0 and "3 MiB packed, over MAX_MIB=2; not packed" in too_big.stdout
    assert not list((tmp_path / "none").glob("kernels.tgz.part*"))
    packed = cache("pack", str(tmp_path / "parts"))
    assert packed.returncode == 0 and "1 flashinfer modules" in packed.stdout, packed.stdout + packed.stderr
    assert "into 4 parts" in packed.stdout
    (triton / "abc" / "k.cubin").unlink()
    unpacked = cache("unpack", str(tmp_path / "parts"))
    assert unpacked.returncode == 0, unpacked.stderr
    aot = site / "flashinfer" / "data" / "aot"
    assert (aot / "batch_decode" / "batch_decode.so").read_bytes() == library
    assert sorted(p.name for p in aot.rglob("*") if p.is_file()) == ["batch_decode.so"]
    assert (triton / "abc" / "k.cubin").read_bytes() == b"cubin"
    missing = cache("unpack", str(tmp_path / "none"))
    assert missing.returncode == 2 and "no kernels.tgz.part*" in missing.stderr
    no_flashinfer = cache("unpack", str(tmp_path / "parts"), PYTHONPATH=str(tmp_path / "empty"))
    assert no_flashinfer.returncode == 2 and "flashinfer is not importable" in no_flashinfer.stderr
    assert cache("bogus", "x").returncode == 2


def final_run_in_a_call(tmp_path: Path, *jobs: str, call_s: int = 585, out: Path | None = None):
    """final_run_in_a_call.sh with a python3 on PATH that records its arguments (the benches need a GPU)."""
    return run_recorded(DEV / "final_run_in_a_call.sh", tmp_path, *jobs, out=out, CALL_S=str(call_s),
                        HOME=str(tmp_path))


def test_a_call_starts_only_the_jobs_it_has_time_for_and_logs_the_compiled_kernels(tmp_path):
    proc, calls, log = final_run_in_a_call(tmp_path, "t1", "g1", call_s=100)
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 1 and calls[0].startswith("bench/train_throughput.py --variants ours,hf_sdpa")
    assert "t1 rc=0" in log and "g1 skipped: " in log and "it takes about 330 s" in log
    assert "compiled-kernel caches:" in log and ".cache/flashinfer" in log and ".triton/cache" in log
    (tmp_path / "long").mkdir()
    proc, calls, _ = final_run_in_a_call(tmp_path / "long", "g1", "e1", call_s=3000)
    assert proc.returncode == 0
    assert [c.split()[0] for c in calls] == ["bench/grpo_step.py", "bench/engine_throughput.py"]


def test_a_call_with_an_unknown_job_or_no_output_folder_runs_nothing(tmp_path):
    proc, calls, _ = final_run_in_a_call(tmp_path, "t1", "x9")
    assert proc.returncode == 2 and calls == [] and "unknown job 'x9'" in proc.stderr
    proc, calls, _ = final_run_in_a_call(tmp_path, "t1", out=tmp_path / "missing")
    assert proc.returncode == 2 and calls == [] and "$OUT must be a folder" in proc.stderr
