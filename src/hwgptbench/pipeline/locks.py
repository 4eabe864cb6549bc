"""Locks left behind by an interrupted run, told apart from locks of a run still working.

A killed ``snakemake`` leaves its directory lock (``.snakemake/locks/``) and a killed ``dvc
repro`` its entries in ``.dvc/tmp/rwlock``; the next run then stops on them. Both are safe to
remove exactly when no process of either tool still works in the project, which is what
:func:`clear_stale_locks` checks (on Linux, from ``/proc``) before the ``make`` targets start.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..io import atomic_write_text
from ..outputs import remove_file

log = logging.getLogger(__name__)

SNAKEMAKE_LOCKS = Path(".snakemake/locks")
DVC_RWLOCK = Path(".dvc/tmp/rwlock")
TOOLS = ("snakemake", "dvc")


class LockHeldError(UserError, RuntimeError):
    """A workflow tool is still running in the project: its locks are not stale."""


@dataclass(frozen=True)
class Process:
    pid: int
    command: str


def workflow_processes(project: Path, proc: Path = Path("/proc")) -> list[Process] | None:
    """Processes other than this one that run Snakemake or DVC with ``project`` as their
    working directory; None where the process table cannot be read (no ``/proc``)."""
    if not proc.is_dir():
        return None
    project = project.resolve()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:  # exited meanwhile, or another user's
            continue
        words = [Path(arg.decode(errors="replace")).name for arg in argv[:3] if arg]
        if cwd == project and any(word in TOOLS for word in words):
            found.append(Process(int(entry.name), " ".join(a.decode(errors="replace")
                                                           for a in argv if a)))
    return found


def clear_stale_locks(project: Path = Path("."), proc: Path = Path("/proc")) -> list[Path]:
    """Remove the Snakemake and DVC locks of ``project`` when no Snakemake or DVC process
    works in it; the removed files. Raises :class:`LockHeldError` naming the running process
    when one does, and when the process table cannot be read while locks exist."""
    locks = sorted((project / SNAKEMAKE_LOCKS).glob("*.lock"))
    rwlock = project / DVC_RWLOCK
    if rwlock.exists() and _has_entries(rwlock):
        locks.append(rwlock)
    if not locks:
        return []
    running = workflow_processes(project, proc)
    if running is None:
        raise LockHeldError(f"{project / SNAKEMAKE_LOCKS} or {rwlock} holds a lock and the "
                            "running processes cannot be listed here: if no snakemake or dvc "
                            "runs in this project, run `snakemake --unlock` and delete "
                            f"{rwlock}, then rerun")
    if running:
        first = running[0]
        raise LockHeldError(f"another run works in {project.resolve()}: PID {first.pid} "
                            f"({first.command}); wait for it, or stop it (kill {first.pid}) "
                            "and rerun")
    for lock in locks:
        if lock == rwlock:
            atomic_write_text(rwlock, json.dumps({"read": {}, "write": {}}), owned=True)
        else:  # the lock files of an interrupted run: named here, never a user's
            remove_file(lock, owned=True)
    log.info("removed the locks of an interrupted run (no snakemake or dvc runs in %s): %s",
             project.resolve(), ", ".join(str(lock) for lock in locks))
    return locks


def _has_entries(rwlock: Path) -> bool:
    """Whether DVC's read/write lock file names any path (an unreadable file counts)."""
    try:
        table = json.loads(rwlock.read_text() or "{}")
    except (OSError, ValueError):
        return True
    return any(table.get(kind) for kind in ("read", "write"))
