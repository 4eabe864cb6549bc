"""What a Python process loaded and read, for the dependency tests (tests/test_workflow.py).

Not part of the package, and independent of it: with this folder on ``PYTHONPATH`` and
``HWGPTBENCH_TEST_TRACE=DIR`` in the environment, every Python process (``dvc``,
``snakemake``, each ``hwgptbench`` command) writes ``DIR/{pid}.json`` when it exits: its
command line, the command lines of the processes above it (from ``/proc``), the files of
the modules it loaded and the files it opened for reading, except those read to fingerprint
a rule's code (``hwgptbench.pipeline.fingerprints``: what it hashes stands for code that the
rule's commands run, which their own traces show).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path
from types import FrameType

TRACE_ENV = "HWGPTBENCH_TEST_TRACE"  # reader.TRACE_ENV
WRITES = frozenset("wax+")
FINGERPRINTS = "hwgptbench.pipeline.fingerprints"


def command_line(pid: int | str) -> list[str]:
    """A process's command line (empty when it has gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def parent_of(pid: int | str) -> int:
    """A process's parent (0 when it has gone or is the first)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rpartition(")")[2].split()[1])


def ancestors() -> list[list[str]]:
    """The command lines of the processes above this one, nearest first."""
    found, pid = [], parent_of("self")
    while pid > 1:
        found.append(command_line(pid))
        pid = parent_of(pid)
    return found


def fingerprinting() -> bool:
    """Whether the fingerprinting of a rule's code is on the stack."""
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        if frame.f_globals.get("__name__") == FINGERPRINTS:
            return True
        frame = frame.f_back
    return False


def start(folder: str) -> None:
    """Record this process's reads from now on and write them at exit."""
    above = ancestors()
    opened: set[str] = set()

    def on_event(event: str, args: tuple[object, ...]) -> None:
        if event != "open" or not args or not isinstance(args[0], (str, os.PathLike)):
            return
        mode = args[1] if len(args) > 1 else None
        if isinstance(mode, str) and WRITES & set(mode):
            return
        flags = args[2] if len(args) > 2 else 0
        if mode is None and isinstance(flags, int) and flags & os.O_ACCMODE != os.O_RDONLY:
            return
        if not fingerprinting():
            opened.add(os.path.abspath(os.fspath(args[0])))

    def write() -> None:
        modules = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
        record = {"argv": command_line("self"), "ancestors": above,
                  "modules": sorted(str(Path(f).resolve()) for f in modules if f),
                  "opened": sorted(opened)}
        path = Path(folder) / f"{os.getpid()}.json"
        path.write_text(json.dumps(record))

    sys.addaudithook(on_event)
    atexit.register(write)


if os.environ.get(TRACE_ENV):
    start(os.environ[TRACE_ENV])
