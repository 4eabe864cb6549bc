"""A rule's code as an input of its jobs, so that Snakemake reruns them when it changes.

``make deps`` (:mod:`.dvc_deps`) lists in ``workflow/code/{rule}.txt`` the files that a rule's
commands load and read. When Snakemake parses the rule, :func:`code_input` hashes those files
and writes ``results/.code/{rule}.sha256``, rewritten only when the hash changed; the rule's
jobs take that file as input. It is written at parse time, as the params section files are
(:func:`hwgptbench.params.write_sections`): Snakemake takes stock of the files before it
builds the jobs. A change to the code a rule runs so reruns its jobs, as a params change
does, and Snakemake run by hand agrees with ``dvc status`` (docs/workflow.md).
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

from ..errors import UserError
from ..io import atomic_write_text, sha256_file
from ..layout import RESULTS, code_fingerprints

LISTINGS = "workflow/code"
# set by `make deps` for its dry run, which plans the jobs before their listings exist
PLANNING_ENV = "HWGPTBENCH_PLANNING_LISTINGS"
FIX = "run `make deps` (hwgptbench dvc-deps) to write the rules' code listings"


def listing(rule: str, root: Path) -> list[str]:
    """The entries (files and folders, relative to root) of a rule's code listing."""
    path = root / LISTINGS / f"{rule}.txt"
    if not path.is_file():
        if os.environ.get(PLANNING_ENV):
            return []
        raise UserError(f"{path}: rule {rule} has no code listing; {FIX}")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def folder_files(folder: Path) -> list[Path]:
    """The files under a folder, Python's byte-code caches aside, sorted."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def entry_files(entry: str, root: Path) -> list[Path]:
    """The files an entry stands for: itself, or every file under the folder."""
    path = root / entry
    if path.is_file():
        return [path]
    if path.is_dir():
        return folder_files(path)
    raise UserError(f"{path}: listed as code in {LISTINGS}/ but missing; {FIX}")


@lru_cache(maxsize=4096)
def content_hash(path: Path) -> str:
    """A file's SHA-256, once per process (the rules share most of their files)."""
    return sha256_file(path)


def fingerprint(entries: list[str], root: Path) -> str:
    """SHA-256 over the name and content hash of each file the entries stand for."""
    digest = hashlib.sha256()
    for entry in entries:
        for path in entry_files(entry, root):
            digest.update(f"{path.relative_to(root).as_posix()}\0{content_hash(path)}\n".encode())
    return digest.hexdigest()


def code_input(rule: str, root: str | Path = ".", results: str = RESULTS) -> str:
    """The path of ``rule``'s code fingerprint, (re)written first where its hash changed."""
    root = Path(root)
    text = fingerprint(listing(rule, root), root) + "\n"
    folder = code_fingerprints(results)
    target = root / folder / f"{rule}.sha256"
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        atomic_write_text(target, text)
    return f"{folder}/{rule}.sha256"
