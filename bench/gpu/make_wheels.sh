#!/usr/bin/env bash
# Wheels for `python bench/grpo_step.py --gpu` on an offline GPU machine whose Python 3.12 already has
# torch 2.11.0 (CUDA), triton, transformers 5.17, tokenizers, accelerate, aiohttp, pandas, pyarrow,
# psutil, pyyaml, rich, click, matplotlib and the other common packages, but no network. Run it where
# PyPI is reachable; it writes cp312 manylinux wheels into groups of at most GROUP_MIB (default 56) MiB:
#
#   OUT/gpu1, OUT/gpu2, ...   each small enough to travel in one call to a machine that takes 64 MiB
#                             a call (the repository's own files ride along, about 2 MiB)
#
# What goes in:
#   - the slim SGLang 0.5.15.post1 set of bench/gpu/build_sglang_wheelset.sh (52 MiB; it brings
#     transformers 5.12.1 + tokenizers 0.22.2, SGLang's pins: 5.17 breaks SGLang's start-up);
#   - ray 2.60.0 without ray/jars (the Java workers' 31 MiB jar) and the dashboard's web client
#     build (this package starts Ray with include_dashboard=False): 79 MB -> about 46 MiB;
#   - sglang-router 0.3.2, megatron-core 0.16.1;
#   - trl 1.16.0 with what it needs beyond the machine's packages: datasets 5.2.0, multiprocess
#     0.70.19 (dill comes with the SGLang set), tzdata.
# slime-ref itself needs no wheel: put reference_impl/ on PYTHONPATH.
#
# On the GPU machine, one group per call, into one target directory that stays between calls:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target .whl/site .whl/gpuN/*.whl
# then run with PYTHONPATH=.whl/site:reference_impl (the README of bench/ has the exact sequence).
#
# Usage: bench/gpu/make_wheels.sh [OUT_DIR]   (default .whl)
set -euo pipefail

OUT=${1:-.whl}
GROUP_MIB=${GROUP_MIB:-56}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/all"

download() {
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$@"
}

echo "building the slim SGLang set ..."
bash "$HERE/build_sglang_wheelset.sh" "$WORK/sglang" >/dev/null
cp "$WORK"/sglang/*.whl "$WORK/all/"   # not $WORK/sglang/test: the GPU machine has pytest

echo "downloading ray, sglang-router, megatron-core, trl and its missing dependencies ..."
download "$WORK/big" ray==2.60.0
download "$WORK/all" sglang-router==0.3.2 megatron-core==0.16.1 trl==1.16.0 datasets==5.2.0 \
  multiprocess==0.70.19 tzdata==2026.6

echo "slimming ray ..."
ray_wheel=$(ls "$WORK"/big/ray-2.60.0-*.whl)
"$PYTHON" - "$ray_wheel" "$WORK/all/$(basename "$ray_wheel")" 'ray/jars/*' 'ray/dashboard/client/build/*' <<'PY'
import csv, fnmatch, io, sys, zipfile
src, dst, *drop = sys.argv[1:]
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
    dropped = {n for n in zin.namelist() if any(fnmatch.fnmatch(n, p) for p in drop)}
    if not dropped:
        sys.exit(f"{src}: nothing matched {drop}; the wheel changed, check the patterns")
    for info in zin.infolist():
        if info.filename in dropped:
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):  # keep RECORD true to the files left
            rows = [r for r in csv.reader(io.StringIO(data.decode())) if r and r[0] not in dropped]
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(rows)
            data = text.getvalue().encode()
        zout.writestr(info, data)
print(f"{dst}: dropped {len(dropped)} files")
PY

echo "grouping into $OUT/gpu* (at most $GROUP_MIB MiB each) ..."
rm -rf "$OUT"/gpu[0-9]*
"$PYTHON" - "$WORK/all" "$OUT" "$GROUP_MIB" <<'PY'
import shutil, sys
from pathlib import Path
src, out, limit = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) * 2**20
wheels = sorted(src.glob("*.whl"), key=lambda p: -p.stat().st_size)
groups: list[list[Path]] = []
for wheel in wheels:  # first fit, largest first
    size = wheel.stat().st_size
    if size > limit:
        sys.exit(f"{wheel.name} alone is {size / 2**20:.1f} MiB, over the {limit // 2**20} MiB limit")
    for group in groups:
        if sum(p.stat().st_size for p in group) + size <= limit:
            group.append(wheel)
            break
    else:
        groups.append([wheel])
for i, group in enumerate(groups, 1):
    folder = out / f"gpu{i}"
    folder.mkdir(parents=True, exist_ok=True)
    for wheel in group:
        shutil.copy2(wheel, folder / wheel.name)
    print(f"{folder}: {len(group)} wheels, {sum(p.stat().st_size for p in group) / 2**20:.1f} MiB")
PY
