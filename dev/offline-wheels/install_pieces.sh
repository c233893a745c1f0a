#!/usr/bin/env bash
# Gather one piece of a file too big for one device call (pieces.py split, beside this file), one call
# per piece, back to back while the machine is warm; the call that brings the last piece joins them
# (every piece and the whole checked against the manifest) and, for a wheel, installs it:
#
#   bash dev/offline-wheels/install_pieces.sh .whl/fa3-1         # then fa3-2, fa3-3, ... in any order
#
# STORE (default /tmp/pieces) keeps the pieces between calls; the machine keeps /tmp only while it is
# warm, so a machine taken back means every piece again. A joined wheel goes into the interpreter's
# site-packages (--force-reinstall: it replaces the slim build of the same version), or into
# --target TARGET when TARGET is set.
set -euo pipefail

GROUP=${1:?usage: install_pieces.sh GROUP_DIR [STORE]}
STORE=${2:-/tmp/pieces}
PYTHON=${PYTHON:-python3}
[ -d "$GROUP" ] || { echo "install_pieces.sh: no folder $GROUP (was it named in the call's carry?)" >&2; exit 2; }
shopt -s nullglob
manifest=("$GROUP"/*.pieces.json)
[ ${#manifest[@]} -eq 1 ] || { echo "install_pieces.sh: $GROUP holds no pieces manifest; carry a folder that pieces.py split wrote" >&2; exit 2; }
mkdir -p "$STORE"
cp "$GROUP"/* "$STORE/"

joined=$("$PYTHON" "$(dirname "$0")/pieces.py" join "$STORE" | tee /dev/stderr | sed -n 's/: joined from .*//p')
[ -n "$joined" ] || exit 0  # more pieces to come
case "$joined" in
  *.whl)
    target=()
    [ -z "${TARGET:-}" ] || target=(--target "$TARGET" --upgrade)
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --force-reinstall "${target[@]}" "$joined"
    echo "installed $(basename "$joined")" ;;
esac
