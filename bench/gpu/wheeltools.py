"""Wheel surgery and packing for the offline GPU sets (build_sglang_wheelset.sh, make_slime_set.sh).

    python wheeltools.py repack SRC.whl DST.whl GLOB...        copy a wheel without the members matching GLOB
    python wheeltools.py patch SRC.whl DST.whl STRIP PATCH...  copy a wheel with unified diffs applied to it
    python wheeltools.py group SRC_DIR OUT_DIR PREFIX MIB      pack SRC_DIR's files into OUT_DIR/PREFIX1, 2, ...

Every wheel written keeps its name and version, and its RECORD lists exactly the files it holds with
their true sha256 and size, so ``pip install`` and ``pip show -f`` describe what is really there.
``group`` fills folders of at most MIB MiB each (first fit, largest file first), for a medium that
carries a limited size at a time; a large MIB gives one folder. A single file larger than that travels
in pieces: dev/offline-wheels/pieces.py.
"""

from __future__ import annotations

import base64
import csv
import fnmatch
import hashlib
import io
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


def main(argv: list[str]) -> None:
    if len(argv) >= 4 and argv[0] == "repack":
        repack(Path(argv[1]), Path(argv[2]), argv[3:])
    elif len(argv) >= 5 and argv[0] == "patch":
        patch(Path(argv[1]), Path(argv[2]), int(argv[3]), [Path(p) for p in argv[4:]])
    elif len(argv) == 5 and argv[0] == "group":
        group(Path(argv[1]), Path(argv[2]), argv[3], int(argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
