#!/usr/bin/env bash
# Install one group of bench/gpu/make_slime_set.sh's offline set on the GPU machine; run once per
# group, in back-to-back calls while the machine is warm (what it installs lives outside the repo):
#
#   bash bench/gpu/install_slime_set.sh .whl/slime1      # then slime2, slime3, ...
#   source /tmp/slime-set/env.sh                         # after the last group
#
# Where things go (PREFIX, default /tmp/slime-set):
#   wheels                   into the interpreter's own site-packages, as slime's image has them, so
#                            that Ray's workers and `ray job submit` jobs see them with no PYTHONPATH
#   megatron_core-*.whl      PREFIX/mcore, for slime-ref only (slime imports Megatron-LM's megatron/)
#   src-slime-*.tar.gz       PREFIX/slime          (SLIME_DIR), then `pip install -e` as the image does
#   src-megatron-lm-*.tar.gz PREFIX/Megatron-LM    (MEGATRON_DIR; slime puts it on PYTHONPATH)
# and PREFIX/env.sh exports SLIME_DIR, MEGATRON_DIR and SLIME_REF_PYTHONPATH.
#
# One difference from slime's image is made here: slime v0.3.1 preloads torch_memory_saver's CUDA 12
# hook (torch_memory_saver_hook_mode_preload{_cu12,}.abi3.so) into its training actors; on a CUDA 13
# torch those names are pointed at the package's CUDA 13 build.
set -euo pipefail

GROUP=${1:?usage: install_slime_set.sh GROUP_DIR [PREFIX]}
PREFIX=${2:-/tmp/slime-set}
PYTHON=${PYTHON:-python3}
[ -d "$GROUP" ] || { echo "install_slime_set.sh: no folder $GROUP (was it named in the call's carry?)" >&2; exit 2; }
mkdir -p "$PREFIX"
pip_install() { "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --force-reinstall "$@"; }

shopt -s nullglob
mcore=("$GROUP"/megatron_core-*.whl)
wheels=()
for w in "$GROUP"/*.whl; do
  case "$(basename "$w")" in megatron_core-*) ;; *) wheels+=("$w") ;; esac
done
[ ${#wheels[@]} -eq 0 ] || pip_install "${wheels[@]}"
[ ${#mcore[@]} -eq 0 ] || pip_install --target "$PREFIX/mcore" --upgrade "${mcore[@]}"
for src in "$GROUP"/src-*.tar.gz; do
  tar -xzf "$src" -C "$PREFIX"
  case "$(basename "$src")" in
    src-slime-*) pip_install --no-build-isolation -e "$PREFIX/slime" ;;  # Ray's workers import slime too
  esac
done

# torch_memory_saver: the names slime v0.3.1 preloads, pointed at the build for this torch's CUDA
site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cuda_major=$("$PYTHON" -c 'import torch; print((torch.version.cuda or "0").split(".")[0])' 2>/dev/null || echo 0)
if [ -f "$site/torch_memory_saver_hook_mode_preload_cu13.abi3.so" ] && [ "$cuda_major" = 13 ]; then
  for name in torch_memory_saver_hook_mode_preload_cu12.abi3.so torch_memory_saver_hook_mode_preload.abi3.so; do
    ln -sf torch_memory_saver_hook_mode_preload_cu13.abi3.so "$site/$name"
  done
fi

cat >"$PREFIX/env.sh" <<EOF
export SLIME_DIR=$PREFIX/slime
export MEGATRON_DIR=$PREFIX/Megatron-LM
export SLIME_REF_PYTHONPATH=$PREFIX/mcore
EOF
echo "$GROUP: ${#wheels[@]} wheels into $site, ${#mcore[@]} into $PREFIX/mcore, sources under $PREFIX"
