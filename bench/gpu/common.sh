# Sourced by the offline-set builders beside it and by dev/offline-wheels/. PYTHON: the interpreter
# that runs pip (default python3).
PYTHON=${PYTHON:-python3}

# download DEST SPEC...: wheels for CPython 3.12 on manylinux x86_64 (the GPU machine), whatever this
# machine runs; no dependencies are followed, each set names every wheel it needs.
download() {
  local dest=$1
  shift
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --platform any -d "$dest" "$@"
}

# wheeltools ARGS...: bench/gpu/wheeltools.py (repack, patch, group)
wheeltools() { "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/wheeltools.py" "$@"; }
