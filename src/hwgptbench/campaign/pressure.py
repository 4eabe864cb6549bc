"""Memory that other processes take while a measurement runs.

A group's plan (:mod:`.budget`) fits the memory free when the condition was planned; a process
that starts later can take that memory, and on a CPU the kernel's OOM killer then ends the
job without a word. The campaign therefore reads the memory free now before a group starts
and before each of its models is built (:class:`MemoryWatch`): when it is short of what the
group (or the next model and the forward's activations) needs, plus :data:`RESERVE` kept free,
:class:`Shortage` stops the build and the campaign splits the rest of the condition into
smaller groups, or stops with :class:`MemoryPressure`, a message that names memory.

:func:`oom_kills` reads the kernel's count of OOM kills, so that a rerun can say whether a
group that never finished was killed for memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from ..errors import UserError
from ..meters.host import total_memory_bytes
from .budget import GB, free_memory_bytes

RESERVE_SHARE = 0.05  # of the device's memory kept free beside a group, for other processes ...
RESERVE_MAX = 1 * GB  # ... but at most this
SHRINKS = 3  # smaller plans tried in a row (each after WAIT_S) before the condition stops
WAIT_S = 10.0


class MemoryPressure(UserError, RuntimeError):
    """The machine has less memory free than a condition's smallest group needs, after the
    smaller plans and waits: other processes hold it. The groups measured so far are kept."""


@dataclass(frozen=True)
class Shortfall:
    """Bytes needed (and kept free) against the bytes free, when they did not fit."""

    needed: int
    free: int
    reserve: int

    def __str__(self) -> str:
        return (f"{self.free / GB:.2f} GiB free, {self.needed / GB:.2f} GiB needed and "
                f"{self.reserve / GB:.2f} GiB kept free")


class Shortage(Exception):
    """Less memory free than the next group or model needs (:meth:`MemoryWatch.check`)."""

    def __init__(self, shortfall: Shortfall) -> None:
        super().__init__(str(shortfall))
        self.shortfall = shortfall


def device_memory_bytes(device: torch.device) -> int | None:
    """The device's memory: the GPU's, or the machine's physical memory on the CPU (None where
    it cannot be read)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    return total_memory_bytes()


def available_bytes(device: torch.device) -> int:
    """Memory free for new tensors now, without collecting garbage: the kernel's MemAvailable
    on the CPU; on CUDA the driver's free memory plus the blocks this process's allocator has
    cached but not handed out."""
    if device.type == "cuda":
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0]) + max(0, cached)
    return free_memory_bytes(device)


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere: macOS, musl, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed() -> None:
    """Return to the system what this process has dropped and still holds: Python's
    unreachable objects (a model in a reference cycle keeps its weights until the collector
    runs), then the C heap's free pages that glibc keeps (``malloc_trim``). A campaign that
    read the memory free without it held 6 GB after its first group of 12 ``l`` archs, and the
    next group's check counted them as taken by other processes."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@dataclass(frozen=True)
class MemoryWatch:
    """Checks that what is about to be built fits the memory free now, ``reserve`` kept."""

    device: torch.device
    reserve: int

    @classmethod
    def on(cls, device: torch.device) -> MemoryWatch:
        """The watch of device, with :data:`RESERVE_SHARE` of its memory (at most
        :data:`RESERVE_MAX`) kept free."""
        total = device_memory_bytes(device)
        return cls(device, RESERVE_MAX if total is None
                   else min(RESERVE_MAX, int(RESERVE_SHARE * total)))

    def free(self) -> int:
        """The memory free on the device now, once this process has returned what it freed."""
        release_freed()
        return available_bytes(self.device)

    def check(self, needed: int) -> None:
        """Raise :class:`Shortage` when ``needed`` bytes and the reserve exceed the memory free."""
        free = self.free()
        if needed + self.reserve > free:
            raise Shortage(Shortfall(needed, free, self.reserve))


def oom_kills() -> int | None:
    """The kernel's count of processes its OOM killer ended since boot (``oom_kill`` of
    /proc/vmstat); None where it is not readable."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None
