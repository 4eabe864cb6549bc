"""The traces that ``sitecustomize.py`` (beside this file) writes, read per DVC stage.

A process belongs to the DVC stage whose command (``snakemake TARGET``) is it or a process
above it: the stage's Snakemake and every job it starts. What a stage ran and read is what
its processes loaded and opened, among the project's files; the params sections its commands
read are the section files (``results/.params/{section}.json``) its jobs opened (Snakemake
itself reads every one when it rewrites them, so its own reads are not counted).
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

TRACE_ENV = "HWGPTBENCH_TEST_TRACE"  # sitecustomize.py's (which imports nothing of ours)
FOLDER = Path(__file__).resolve().parent
SECTION_FILE = re.compile(r"results/\.params/([A-Za-z0-9_.]+)\.json")
# DVC tracks params.yaml by key (a stage's `params:`), not as a file
BY_KEY = frozenset({"params.yaml"})


def traced_env(env: Mapping[str, str], folder: Path) -> dict[str, str]:
    """env with every Python process writing its trace into folder."""
    path = os.pathsep.join(p for p in (str(FOLDER), env.get("PYTHONPATH", "")) if p)
    return {**env, TRACE_ENV: str(folder), "PYTHONPATH": path}


@dataclass
class Process:
    """One traced process: its command line, those above it, and what it loaded and read."""

    argv: list[str]
    ancestors: list[list[str]]
    modules: list[str]
    opened: list[str]


def processes(folder: Path) -> list[Process]:
    return [Process(**json.loads(path.read_text())) for path in sorted(folder.glob("*.json"))]


def snakemake_args(argv: list[str]) -> tuple[str, ...] | None:
    """The arguments of a ``snakemake`` command line (None for another command)."""
    names = [Path(word).name for word in argv[:2]]
    return tuple(argv[names.index("snakemake") + 1:]) if "snakemake" in names else None


def hwgptbench_command(argv: list[str]) -> str | None:
    """The subcommand of an ``hwgptbench`` command line (None for another command)."""
    names = [Path(word).name for word in argv[:2]]
    if "hwgptbench" not in names:
        return None
    rest = argv[names.index("hwgptbench") + 1:]
    return next((word for word in rest if not word.startswith("-")), None)


@dataclass
class StageReads:
    """What the processes of each DVC stage ran and read."""

    files: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    sections: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    # hwgptbench subcommand -> the package modules its processes loaded
    commands: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


def relative(path: str, roots: Iterable[Path]) -> str | None:
    for root in roots:
        if Path(path).is_relative_to(root):
            return Path(path).relative_to(root).as_posix()
    return None


def under_tracer(file: str) -> bool:
    """A file of the tracer itself (``tests/tracing/``: loaded by every process it traces)."""
    return Path(file).parts[:2] == ("tests", FOLDER.name)


def module_name(file: str) -> str:
    """The dotted name of a package module from its file (relative to the project)."""
    parts = Path(file).with_suffix("").parts[1:]  # below src/
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage_reads(folder: Path, commands: Mapping[str, tuple[str, ...]], roots: list[Path],
                tracked: set[str]) -> StageReads:
    """The traces in folder per stage: ``commands`` maps each stage to its Snakemake
    arguments; ``roots`` are where the project's files are (the project, and the checkout
    whose package is installed); ``tracked`` the project's files."""
    stage_of = {args: stage for stage, args in commands.items()}
    reads = StageReads()
    for process in processes(folder):
        lines = [process.argv, *process.ancestors]
        stage = next((stage_of[args] for line in lines
                      if (args := snakemake_args(line)) in stage_of), None)
        if stage is None:
            continue
        own = snakemake_args(process.argv) in stage_of
        for path in [*process.modules, *process.opened]:
            file = relative(path, roots)
            if file in tracked and file not in BY_KEY and not under_tracer(file):
                reads.files[stage].add(file)
            if file and not own and (match := SECTION_FILE.fullmatch(file)):
                reads.sections[stage].add(match[1])
        if command := hwgptbench_command(process.argv):
            reads.commands[command] |= {
                module_name(file) for path in process.modules
                if (file := relative(path, roots)) and file.startswith("src/")
                and file.endswith(".py")}
    return reads
