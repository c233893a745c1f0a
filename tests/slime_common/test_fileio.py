from __future__ import annotations

import pytest

from slime_ref.utils.fileio import atomic_directory, atomic_write_json, atomic_write_text


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "a" / "f.txt"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert [x.name for x in p.parent.iterdir()] == ["f.txt"]


def test_atomic_write_json_sorted(tmp_path):
    p = tmp_path / "x.json"
    atomic_write_json(p, {"b": 1, "a": 2})
    assert p.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_atomic_directory_keeps_old_on_error(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as d:
        (d / "x").write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_directory(target) as d:
        (d / "x").write_text("half")
        raise KeyboardInterrupt
    assert (target / "x").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_atomic_directory_replaces(tmp_path):
    target = tmp_path / "ckpt"
    for content in ("one", "two"):
        with atomic_directory(target) as d:
            (d / "x").write_text(content)
    assert (target / "x").read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
