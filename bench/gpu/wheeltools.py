"""Wheel surgery and packing for the offline GPU machine's install sets (used by the scripts beside it).

    python wheeltools.py repack SRC.whl DST.whl GLOB...        copy a wheel without the members matching GLOB
    python wheeltools.py patch SRC.whl DST.whl STRIP PATCH...  copy a wheel with unified diffs applied to it
    python wheeltools.py group SRC_DIR OUT_DIR PREFIX MIB      pack SRC_DIR's files into OUT_DIR/PREFIX1, 2, ...
    python wheeltools.py split FILE OUT_DIR PREFIX MIB         cut FILE into pieces, one per OUT_DIR/PREFIXn
    python wheeltools.py join STORE                            rebuild the file whose pieces STORE holds

Every wheel written keeps its name and version, and its RECORD lists exactly the files it holds with
their true sha256 and size, so ``pip install`` and ``pip show -f`` describe what is really there.
``group`` fills folders of at most MIB MiB each (first fit, largest file first): one device call
carries one folder. A file bigger than one call travels as ``split`` pieces: each folder holds one
piece and the manifest ``NAME.pieces.json`` (sizes and sha256 of the pieces and of the whole file);
on the GPU machine the pieces gather in one folder over back-to-back calls, and ``join`` checks every
piece and the whole against the manifest before it writes the file (atomically, beside the pieces).
Exit 2, naming what is wrong, when a piece is missing or damaged.
"""

from __future__ import annotations

import base64
import csv
import fnmatch
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def _record_row(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def rewrite(src: Path, dst: Path, members: dict[str, bytes | None]) -> None:
    """Copy wheel ``src`` to ``dst``; ``members`` maps a member name to its new bytes (a new member is
    added), or to None to drop it. RECORD follows: rows of dropped members go, changed and added members
    get a true hash and size."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record, rows = None, []
        for info in zin.infolist():
            name = info.filename
            if name.endswith(".dist-info/RECORD"):  # CSV: path,hash,size (paths may be quoted); written last
                record = info
                for row in csv.reader(io.StringIO(zin.read(info).decode("utf-8"))):
                    if row and row[0] not in members and row[0] != name:
                        rows.append(row)
                continue
            if name in members and members[name] is None:
                continue
            zout.writestr(info, members[name] if name in members else zin.read(info))
        existing = set(zin.namelist())
        for name, data in members.items():
            if data is None:
                continue
            if name not in existing:
                zout.writestr(zipfile.ZipInfo(name, date_time=record.date_time), data, zipfile.ZIP_DEFLATED)
            rows.append(_record_row(name, data))
        rows.append([record.filename, "", ""])
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(sorted(rows, key=lambda r: r[0] == record.filename))
        zout.writestr(record, text.getvalue().encode("utf-8"))


def repack(src: Path, dst: Path, patterns: list[str]) -> None:
    with zipfile.ZipFile(src) as z:
        dropped = [n for n in z.namelist() if any(fnmatch.fnmatch(n, p) for p in patterns)]
    if not dropped:
        sys.exit(f"{src}: nothing matched {patterns}; the wheel changed, check the patterns")
    rewrite(src, dst, dict.fromkeys(dropped))
    print(f"{dst.name}: dropped {len(dropped)} files")


def patch(src: Path, dst: Path, strip: int, patches: list[Path]) -> None:
    """Apply ``patches`` in order with ``git apply -pSTRIP`` (exact context, as slime's Dockerfile applies
    them) to the wheel's files; refuse any that does not apply, naming it."""
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(src) as z:
        root = Path(tmp)
        z.extractall(root)
        before = {n: (root / n).read_bytes() for n in z.namelist() if not n.endswith("/")}
        for p in patches:
            proc = subprocess.run(["git", "apply", f"-p{strip}", str(p.resolve())], cwd=root, capture_output=True,
                                  text=True)
            if proc.returncode != 0:
                sys.exit(f"{p} does not apply to {src.name}:\n{proc.stdout}{proc.stderr}")
        after = {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*") if f.is_file()}
    changed = {n: after.get(n) for n in before.keys() | after.keys() if after.get(n) != before.get(n)}
    rewrite(src, dst, changed)  # None: the patch deleted the file
    added = len(set(after) - set(before))
    print(f"{dst.name}: {len(patches)} patches, {len(changed)} files changed" + (f" ({added} new)" if added else ""))


def group(src: Path, out: Path, prefix: str, mib: int) -> None:
    limit = mib * 2**20
    files = sorted((p for p in src.iterdir() if p.is_file()), key=lambda p: -p.stat().st_size)
    groups: list[list[Path]] = []
    for f in files:
        size = f.stat().st_size
        if size > limit:
            sys.exit(f"{f.name} alone is {size / 2**20:.1f} MiB, over the {mib} MiB limit")
        for g in groups:
            if sum(p.stat().st_size for p in g) + size <= limit:
                g.append(f)
                break
        else:
            groups.append([f])
    for old in out.glob(f"{prefix}[0-9]*"):
        shutil.rmtree(old)
    for i, g in enumerate(groups, 1):
        folder = out / f"{prefix}{i}"
        folder.mkdir(parents=True)
        for f in g:
            shutil.copy2(f, folder / f.name)
        print(f"{folder}: {len(g)} files, {sum(p.stat().st_size for p in g) / 2**20:.1f} MiB")


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
    print(f"wheeltools: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> None:
    if len(argv) >= 4 and argv[0] == "repack":
        repack(Path(argv[1]), Path(argv[2]), argv[3:])
    elif len(argv) >= 5 and argv[0] == "patch":
        patch(Path(argv[1]), Path(argv[2]), int(argv[3]), [Path(p) for p in argv[4:]])
    elif len(argv) == 5 and argv[0] == "group":
        group(Path(argv[1]), Path(argv[2]), argv[3], int(argv[4]))
    elif len(argv) == 5 and argv[0] == "split":
        split(Path(argv[1]), Path(argv[2]), argv[3], int(argv[4]))
    elif len(argv) == 2 and argv[0] == "join":
        join(Path(argv[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
