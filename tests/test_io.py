"""Atomic writes: an output appears complete or not at all."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from hwgptbench.io import atomic_write_json, atomic_write_text, sha256_file
from hwgptbench.outputs import (
    MARKER,
    STAGING_MARKER,
    atomic_dir,
    atomic_path,
    remove_stale_staging,
)


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    # beside it, only the ledger listing it as written by this package
    assert sorted(p.name for p in target.parent.iterdir()) == [MARKER, "out.txt"]
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
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER, "out.json"]


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
    with pytest.raises(RuntimeError), atomic_dir(target):
        raise RuntimeError("killed")  # cleaned at once; a killed process leaves its folder:
    stale = tmp_path / ".shards.tmp-abc"
    stale.mkdir()
    (stale / STAGING_MARKER).write_text(json.dumps(
        {"format": "hwgptbench-staging", "dest": "shards", "pid": 2**22 + 1,
         "host": socket.gethostname()}))
    (tmp_path / ".shards.tmp-def").write_text("x")  # no staging marker: a user's, kept
    (tmp_path / "other").write_text("keep")
    remove_stale_staging(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".shards.tmp-def", "other"]


def test_sha256_file(tmp_path: Path) -> None:
    path = tmp_path / "x"
    path.write_bytes(b"abc")
    assert sha256_file(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
