"""Atomic writes: an output appears complete or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hwgptbench.io import atomic_write_json, atomic_write_text, sha256_file
from hwgptbench.outputs import atomic_dir, atomic_path, remove_stale_staging


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_atomic_path_failure_keeps_old_content(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    atomic_write_json(target, {"a": 1})
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("killed")
    assert target.read_text() == '{\n  "a": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_atomic_dir_swaps_only_when_complete(tmp_path: Path) -> None:
    target = tmp_path / "shards"
    with atomic_dir(target) as staging:
        (staging / "a.bin").write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_dir(target) as staging:
        (staging / "a.bin").write_bytes(b"new-partial")
        raise RuntimeError("killed")
    assert (target / "a.bin").read_bytes() == b"old"
    with atomic_dir(target) as staging:
        (staging / "b.bin").write_bytes(b"new")
    assert sorted(p.name for p in target.iterdir()) == ["b.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["shards"]


def test_stale_staging_is_removed(tmp_path: Path) -> None:
    target = tmp_path / "shards"
    (tmp_path / ".shards.tmp-abc").mkdir()
    (tmp_path / ".shards.tmp-def").write_text("x")
    (tmp_path / "other").write_text("keep")
    remove_stale_staging(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_sha256_file(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.write_bytes(b"abc")
    assert sha256_file(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
