"""What is current, at one glance: each pipeline against its lock (``hwgptbench status``).

A bare ``dvc status`` lists every dependency of a stage that never ran as "modified": after
``make run`` that is the ~100 deps of the paper's pipeline (paper/dvc.yaml), which ``make
paper`` builds and ``make run`` never does. Here a pipeline in a folder of its own with no lock
is "not built"; every other pipeline is current or names its stages that are not (``dvc status
FILE`` then says what changed in them).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .dvc_deps import DVC_FILES
from .remote import BUILD


def summary(stages: Mapping[str, list[str]], stale: Mapping[str, Any],
            locked: set[str]) -> list[str]:
    """One line per pipeline (``stages``: pipeline -> its stage addresses), from ``dvc status
    --json`` (``stale``) and the pipelines that have a lock file (``locked``)."""
    lines = []
    for file, names in stages.items():
        build = BUILD.get(file, f"dvc repro {file}")
        behind = [name for name in names if name in stale]
        if file != "dvc.yaml" and file not in locked:
            lines.append(f"{file}: not built ({build} builds it)")
        elif behind:
            lines.append(f"{file}: {len(behind)} of {len(names)} stages not current: "
                         f"{', '.join(behind)} (`dvc status {file}` says what changed; "
                         f"{build} rebuilds them)")
        else:
            lines.append(f"{file}: current ({len(names)} stages)")
    return lines


def main(root: Path) -> list[str]:
    """``hwgptbench status`` in the project folder ``root``."""
    from .dvc_deps import dvc_stages
    from .remote import stale_stages

    stages: dict[str, list[str]] = {}
    for stage in dvc_stages(root):
        address = stage.name if stage.file == "dvc.yaml" else f"{stage.file}:{stage.name}"
        stages.setdefault(stage.file, []).append(address)
    locked = {file for file in DVC_FILES
              if (root / file).with_name("dvc.lock").is_file()}
    return summary(stages, stale_stages(), locked)
