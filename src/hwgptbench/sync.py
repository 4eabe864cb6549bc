"""Bring DVC-versioned results into a checkout so that Snakemake sees them as up to date.

After ``dvc pull`` a fresh clone has the right bytes but neither Snakemake's metadata nor a
meaningful mtime order, so Snakemake would rerun everything. ``snakemake --touch`` fixes
that, but it would also bless results that no longer match params.yaml or the code. So the
touch happens only when ``dvc status`` (content hashes against dvc.lock) says every stage is
current; otherwise nothing is touched and the stale stages are named.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class StaleResultsError(RuntimeError):
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


def pull(targets: list[str] | None = None, remote: str | None = None) -> None:
    """``dvc pull``, then ``snakemake --touch`` if and only if every DVC stage is current.

    ``targets`` are stage names; DVC stages and Snakemake targets share names.
    """
    targets = list(targets or [])
    _run([_tool("dvc"), "pull", *(["--remote", remote] if remote else []), *targets])
    stale = stale_stages()
    if stale:
        details = "\n".join(f"  {stage}: {json.dumps(change)}" for stage, change in stale.items())
        raise StaleResultsError(
            "pulled results do not match the current params.yaml or code for these stages:\n"
            f"{details}\nSnakemake was NOT told they are up to date; run `make run` (dvc repro) "
            "to rebuild exactly what changed.")
    _run([_tool("snakemake"), "--touch", "--quiet", *(targets or ["all"])])
    log.info("pulled results are current; Snakemake marks them up to date")
