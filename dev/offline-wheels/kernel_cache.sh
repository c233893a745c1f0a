#!/usr/bin/env bash
# flashinfer's and triton's compiled kernels, carried from one GPU machine to the next of the same kind,
# so that the next machine's first SGLang start does not compile them again (about 3 minutes on an H200
# machine's 16 cores).
#
#   bash dev/offline-wheels/kernel_cache.sh pack DIR    # on the machine that compiled them:
#                                                       # DIR/kernels.tgz.partNN, PART_MIB (15) MiB each, if
#                                                       # the archive is at most MAX_MIB (75) MiB; otherwise
#                                                       # nothing, and it says so
#   bash dev/offline-wheels/kernel_cache.sh unpack DIR  # on the next machine, once flashinfer is installed
#
# What travels: each flashinfer module's library (cached_ops/NAME/NAME.so, not its object files) and
# triton's whole cache. unpack puts the libraries where flashinfer looks for ahead-of-time builds
# (flashinfer/data/aot/NAME/NAME.so), which it loads as they are: its JIT cache would go through ninja,
# which compiles again whatever is older than the sources the wheel has just installed.
set -euo pipefail

# where flashinfer's JIT and triton keep the kernels they compile on a machine's first SGLang start
FLASHINFER_CACHE=${FLASHINFER_WORKSPACE_BASE:-$HOME}/.cache/flashinfer
TRITON_CACHE=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
PART_MIB=${PART_MIB:-15}
MAX_MIB=${MAX_MIB:-75}

usage() { echo "usage: kernel_cache.sh pack|unpack DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
mode=$1 dir=$2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

case $mode in
  pack)
    modules=0
    for so in "$FLASHINFER_CACHE"/*/*/cached_ops/*/*.so; do
      [ -e "$so" ] || continue
      name=$(basename "$(dirname "$so")")
      [ "$(basename "$so")" = "$name.so" ] || continue
      mkdir -p "$stage/aot/$name" && cp "$so" "$stage/aot/$name/" && modules=$((modules + 1))
    done
    [ -d "$TRITON_CACHE" ] && cp -r "$TRITON_CACHE" "$stage/triton"
    if [ "$modules" -eq 0 ] && [ ! -d "$stage/triton" ]; then
      echo "kernel_cache.sh: no compiled kernels under $FLASHINFER_CACHE or $TRITON_CACHE; nothing packed"
      exit 0
    fi
    tar -czf "$stage.tgz" -C "$stage" .
    mib=$(( $(stat -c %s "$stage.tgz") / 1048576 ))
    if [ "$mib" -gt "$MAX_MIB" ]; then
      echo "kernel_cache.sh: $modules flashinfer modules and triton's cache come to ${mib} MiB packed, over MAX_MIB=${MAX_MIB}; not packed"
    else
      mkdir -p "$dir"
      split -b "${PART_MIB}M" -d "$stage.tgz" "$dir/kernels.tgz.part"
      echo "kernel_cache.sh: $modules flashinfer modules and triton's cache, ${mib} MiB packed into $(ls "$dir"/kernels.tgz.part* | wc -l) parts in $dir"
    fi
    rm -f "$stage.tgz" ;;
  unpack)
    parts=("$dir"/kernels.tgz.part*)
    if [ ! -e "${parts[0]}" ]; then
      echo "kernel_cache.sh: no kernels.tgz.part* in $dir; run 'kernel_cache.sh pack DIR' on a machine that compiled them" >&2
      exit 2
    fi
    if ! package=$(python3 -c "import importlib.util as u; print(u.find_spec('flashinfer').submodule_search_locations[0])" 2>/dev/null); then
      echo "kernel_cache.sh: flashinfer is not importable by python3; install its wheel first" >&2
      exit 2
    fi
    cat "${parts[@]}" | tar -xz -C "$stage"
    if [ -d "$stage/aot" ]; then mkdir -p "$package/data/aot" && cp -r "$stage/aot/." "$package/data/aot/"; fi
    if [ -d "$stage/triton" ]; then mkdir -p "$TRITON_CACHE" && cp -r "$stage/triton/." "$TRITON_CACHE/"; fi
    echo "kernel_cache.sh: $(ls "$stage/aot" 2>/dev/null | wc -l) flashinfer modules into $package/data/aot," \
         "$(find "$stage/triton" -type f 2>/dev/null | wc -l) triton files into $TRITON_CACHE" ;;
  *) usage ;;
esac
