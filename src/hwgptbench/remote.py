"""Move results between checkouts with DVC so that Snakemake sees them as DVC does.

After ``dvc pull`` a fresh clone has the right bytes but neither Snakemake's metadata nor a
meaningful mtime order, so Snakemake would rerun everything. ``snakemake --touch`` fixes
that, but it would also bless results that no longer match params.yaml or the code. So only
the stages that ``dvc status`` (content hashes against dvc.lock) finds current, together with
everything they are built from, are touched; the stale ones are named.

A device's measurement table is published on its own (``devices/{scale}/{label}.parquet``,
one DVC pointer file per device), so machines measuring at the same time never conflict.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from . import layout
from .errors import UserError
from .io import atomic_path

log = logging.getLogger(__name__)


# The mtime given to outputs of stale stages: 1 s after the epoch (Snakemake takes an mtime of
# 0 for "unknown" and then never finds the output older than its inputs).
OLDEST = 1


class StaleResultsError(UserError, RuntimeError):
    """Pulled results do not match the current params or code."""


def _tool(name: str) -> str:
    """Path of a console script installed beside this interpreter, else the bare name."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _run(args: list[str], capture: bool = False) -> str:
    log.info("$ %s", " ".join(args))
    result = subprocess.run(args, check=True, text=True,
                            stdout=subprocess.PIPE if capture else None)
    return result.stdout if capture else ""


def stale_stages() -> dict[str, Any]:
    """DVC stages whose deps, params or outs differ from dvc.lock (empty when all current)."""
    return json.loads(_run([_tool("dvc"), "status", "--json"], capture=True) or "{}")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def current_targets(lock: dict[str, Any], stale: set[str]) -> list[str]:
    """Snakemake targets of the locked stages that are current with all their upstream stages.

    A stage is upstream of another when one of its outputs is (or holds) a dependency of the
    other. Only such targets may be touched: touching a target also marks everything it is
    built from as up to date in Snakemake.
    """
    stages = lock.get("stages", {})
    outs = {name: [o["path"] for o in stage.get("outs", [])] for name, stage in stages.items()}

    def upstream(name: str) -> set[str]:
        deps = [d["path"] for d in stages[name].get("deps", [])]
        return {other for other, paths in outs.items() if other != name and any(
            _inside(dep, out) or _inside(out, dep) for dep in deps for out in paths)}

    blocked: set[str] = set()
    pending = [name for name in stages if name in stale]
    while pending:  # everything downstream of a stale stage is blocked too
        name = pending.pop()
        if name not in blocked:
            blocked.add(name)
            pending.extend(other for other in stages if name in upstream(other))
    targets: list[str] = []
    for name, stage in stages.items():
        command = stage["cmd"].split()
        if name not in blocked and command[:1] == ["snakemake"]:
            targets.extend(command[1:])
    return targets


def pull(targets: list[str] | None = None, remote: str | None = None) -> None:
    """``dvc pull``, then ``snakemake --touch`` for every stage that is current, with all it is
    built from, against dvc.lock.

    ``targets`` are stage names. A stage that does not match the current params or code (nor
    anything downstream of one) is not touched, so Snakemake and DVC both still report it;
    :class:`StaleResultsError` then names it.
    """
    targets = list(targets or [])
    _run([_tool("dvc"), "pull", *(["--remote", remote] if remote else []), *targets])
    stale = stale_stages()
    lock_path = Path("dvc.lock")
    lock = yaml.safe_load(lock_path.read_text()) if lock_path.exists() else {}
    current = current_targets(lock, set(stale))
    for name in stale:  # outputs of stale stages: older than any input, so Snakemake reruns them
        for out in lock.get("stages", {}).get(name, {}).get("outs", []):
            path = Path(out["path"])
            for file in ([path] if path.is_file() else path.rglob("*") if path.is_dir() else []):
                os.utime(file, (OLDEST, OLDEST))
    if current:
        _run([_tool("snakemake"), "--touch", "--quiet=progress", *current])
    if stale:
        details = "\n".join(f"  {stage}: {json.dumps(change)}" for stage, change in stale.items())
        raise StaleResultsError(
            "pulled results do not match the current params.yaml or code for these stages:\n"
            f"{details}\nSnakemake was NOT told they (nor what they feed) are up to date; run "
            "`make run` (dvc repro) to rebuild exactly what changed.")
    log.info("pulled results are current; Snakemake marks them up to date")


def publish_device(scale: str, label: str, results: str | Path = layout.RESULTS,
                   folder: str | Path = layout.PUBLISHED, push: bool = True,
                   remote: str | None = None) -> Path:
    """Publish the measurement table of one device: copy it to ``devices/{scale}/{label}.parquet``,
    version it with ``dvc add`` (a pointer file per device: machines never conflict in git) and
    ``dvc push`` it. Returns the pointer file, which the caller commits to git."""
    source = Path(layout.device_table(scale, label, str(results)))
    if not source.exists():
        raise FileNotFoundError(
            f"{source} not found: measure the device first (`snakemake {source}`, or `make run` "
            "with the device in workflow.devices)")
    labels = set(pl.read_parquet(source, columns=["device"])["device"])
    if labels != {label}:
        raise UserError(f"{source} holds devices {sorted(labels)}, not only {label!r}")
    dest = Path(layout.published_table(scale, label, str(folder)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest) as tmp:
        shutil.copyfile(source, tmp)
    _run([_tool("dvc"), "add", "--quiet", str(dest)])
    pointer = dest.with_name(dest.name + ".dvc")
    if push:
        _run([_tool("dvc"), "push", *(["--remote", remote] if remote else []), str(pointer)])
    return pointer
