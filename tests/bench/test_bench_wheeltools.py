"""bench/gpu/wheeltools.py: the wheels the offline GPU sets carry stay installable and truthful.

A patched or slimmed wheel must list exactly its files in RECORD with their real sha256 and size (pip
trusts RECORD for `pip show -f` and uninstalls), a patch that does not apply must stop the build, and
each group must fit its size limit.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "wheeltools.py"
FILES = {"pkg/__init__.py": b"VALUE = 1\n", "pkg/engine.py": b"def run():\n    return 'old'\n",
         "pkg/big.so": b"\0" * 64}


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(path: Path, files: dict[str, bytes]) -> Path:
    record = "pkg-1.0.dist-info/RECORD"
    with zipfile.ZipFile(path, "w") as z:
        rows = []
        for name, data in files.items():
            z.writestr(name, data)
            rows.append([name, digest(data), str(len(data))])
        z.writestr("pkg-1.0.dist-info/METADATA", "Name: pkg\nVersion: 1.0\n")
        rows.append(["pkg-1.0.dist-info/METADATA", digest(b"Name: pkg\nVersion: 1.0\n"), "23"])
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([*rows, [record, "", ""]])
        z.writestr(record, text.getvalue())
    return path


def record_is_true(path: Path) -> list[str]:
    """The wheel's members; asserts RECORD lists each of them once, with its true hash and size."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(z.read(record).decode())))
        assert sorted(r[0] for r in rows) == sorted(names)
        for name, hash_, size in rows:
            if name == record:
                assert hash_ == size == ""
            else:
                assert (hash_, int(size)) == (digest(z.read(name)), len(z.read(name))), name
    return names


def tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_repack_drops_the_matching_members_and_their_record_rows(tmp_path):
    src = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", FILES)
    done = tool("repack", src, tmp_path / "out.whl", "pkg/*.so")
    assert done.returncode == 0, done.stderr
    assert "pkg/big.so" not in record_is_true(tmp_path / "out.whl")
    nothing = tool("repack", src, tmp_path / "out2.whl", "pkg/absent/*")
    assert nothing.returncode != 0 and "nothing matched" in nothing.stderr


@pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0, reason="needs git")
def test_patch_edits_and_adds_files_with_a_true_record_and_refuses_a_patch_that_does_not_apply(tmp_path):
    src = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", FILES)
    # written against the project's repository layout (python/pkg/...), as slime's SGLang patches are
    good = tmp_path / "good.patch"
    good.write_text("""\
diff --git a/python/pkg/engine.py b/python/pkg/engine.py
--- a/python/pkg/engine.py
+++ b/python/pkg/engine.py
@@ -1,2 +1,2 @@
 def run():
-    return 'old'
+    return 'patched'
diff --git a/python/pkg/added.py b/python/pkg/added.py
new file mode 100644
--- /dev/null
+++ b/python/pkg/added.py
@@ -0,0 +1 @@
+ADDED = True
""")
    done = tool("patch", src, tmp_path / "out.whl", 2, good)
    assert done.returncode == 0, done.stderr
    names = record_is_true(tmp_path / "out.whl")
    with zipfile.ZipFile(tmp_path / "out.whl") as z:
        assert z.read("pkg/engine.py") == b"def run():\n    return 'patched'\n"
        assert z.read("pkg/added.py") == b"ADDED = True\n" and "pkg/__init__.py" in names
    stale = tmp_path / "stale.patch"
    stale.write_text(good.read_text().replace("return 'old'", "return 'older'"))
    refused = tool("patch", src, tmp_path / "out2.whl", 2, stale)
    assert refused.returncode != 0 and "stale.patch does not apply" in refused.stderr
    assert not (tmp_path / "out2.whl").exists()


def test_group_packs_largest_first_within_the_limit_and_refuses_an_oversized_file(tmp_path):
    src = tmp_path / "all"
    src.mkdir()
    for name, mib in (("a.whl", 3), ("b.whl", 2), ("c.whl", 2), ("d.tar.gz", 1)):
        (src / name).write_bytes(b"\0" * (mib * 2**20))
    out = tmp_path / "out"
    (out / "set9").mkdir(parents=True)  # a stale group from an earlier build goes
    done = tool("group", src, out, "set", 4)
    assert done.returncode == 0, done.stderr
    groups = {p.name: sorted(f.name for f in p.iterdir()) for p in out.iterdir()}
    assert groups == {"set1": ["a.whl", "d.tar.gz"], "set2": ["b.whl", "c.whl"]}
    too_big = tool("group", src, tmp_path / "out2", "set", 2)
    assert too_big.returncode != 0 and "a.whl alone is 3.0 MiB" in too_big.stderr
