"""A file larger than one transfer, carried in pieces and joined where it arrives.

    python pieces.py split FILE OUT_DIR PREFIX MIB    cut FILE into pieces, one per OUT_DIR/PREFIXn
    python pieces.py join STORE                       rebuild the file whose pieces STORE holds

Each folder ``split`` writes holds one piece of at most MIB MiB and the manifest ``NAME.pieces.json``
(sizes and sha256 of the pieces and of the whole file). Where the file goes, the pieces gather in one
folder over several transfers, and ``join`` checks every piece and the whole against the manifest
before it writes the file (atomically, beside the pieces). Exit 2, naming what is wrong, when a piece
is missing or damaged. install_pieces.sh beside this file gathers, joins and installs a wheel.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

MANIFEST_SUFFIX = ".pieces.json"


def split(src: Path, out: Path, prefix: str, mib: int) -> None:
    limit = mib * 2**20
    size = src.stat().st_size
    count = max(1, -(-size // limit))
    whole = hashlib.sha256()
    pieces = []
    for old in out.glob(f"{prefix}[0-9]*"):
        shutil.rmtree(old)
    with open(src, "rb") as f:  # one pass: each piece and the whole file hashed as they are read
        for i in range(1, count + 1):
            data = f.read(limit)
            whole.update(data)
            piece = f"{src.name}.part{i:03d}of{count:03d}"
            folder = out / f"{prefix}{i}"
            folder.mkdir(parents=True)
            (folder / piece).write_bytes(data)
            pieces.append({"file": piece, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    text = json.dumps({"name": src.name, "size": size, "sha256": whole.hexdigest(), "pieces": pieces}, indent=1)
    for i in range(1, count + 1):
        (out / f"{prefix}{i}" / (src.name + MANIFEST_SUFFIX)).write_text(text)
    print(f"{src.name}: {count} pieces of at most {mib} MiB in {out}/{prefix}1..{count}")


def join(store: Path) -> Path | None:
    """Rebuild the file whose pieces ``store`` holds; None (and what is still missing) while incomplete."""
    manifests = sorted(store.glob("*" + MANIFEST_SUFFIX))
    if len(manifests) != 1:
        _fail(f"{store}: expected one *{MANIFEST_SUFFIX} manifest, found {len(manifests)}; carry a folder split wrote")
    manifest = json.loads(manifests[0].read_text())
    missing = [i for i, p in enumerate(manifest["pieces"], 1) if not (store / p["file"]).is_file()]
    if missing:
        print(f"{store}: {len(manifest['pieces']) - len(missing)} of {len(manifest['pieces'])} pieces of "
              f"{manifest['name']}; still to carry: {', '.join(map(str, missing))}")
        return None
    dst = store / manifest["name"]
    tmp = store / (manifest["name"] + ".partial")
    whole = hashlib.sha256()
    with open(tmp, "wb") as out:  # one pass: each piece checked as it is appended
        for p in manifest["pieces"]:
            data = (store / p["file"]).read_bytes()
            if len(data) != p["size"] or hashlib.sha256(data).hexdigest() != p["sha256"]:
                out.close()
                tmp.unlink()
                _fail(f"{store / p['file']}: damaged (size or sha256 differs from the manifest); "
                      "carry that piece again")
            whole.update(data)
            out.write(data)
    if whole.hexdigest() != manifest["sha256"]:
        tmp.unlink()
        _fail(f"{dst}: the joined file's sha256 differs from the manifest; split it again")
    os.replace(tmp, dst)
    print(f"{dst}: joined from {len(manifest['pieces'])} pieces, {manifest['size'] / 2**20:.1f} MiB, sha256 checked")
    return dst


def _fail(message: str) -> None:
    print(f"pieces: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> None:
    if len(argv) == 5 and argv[0] == "split":
        split(Path(argv[1]), Path(argv[2]), argv[3], int(argv[4]))
    elif len(argv) == 2 and argv[0] == "join":
        join(Path(argv[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
