"""The machine's identity without torch: CPU facts, device label slugs and label checks.

Every measurement row belongs to a device label. ``auto_label`` derives a stable slug from the
hardware alone (``cpu-amd-epyc-7b13-2t``, ``cuda-nvidia-h100-80gb-hbm3``); a label given in the
configuration must name the hardware it runs on, directly or through an alias, so results of
one machine are never filed under another. ``cpu_only_label`` gives this machine's label where
no GPU can be seen, without importing torch: the workflow asks for it each time Snakemake
plans, and a torch import costs about a second there. Sizes are binary: GB = 2**30 bytes.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UserError

GB = 2**30
DEVICE_ENV = "HWGPTBENCH_DEVICE"  # names the device that work runs on (meters.device)
# What the GPU drivers torch can use leave on Linux: NVIDIA's, NVIDIA's under WSL2, ROCm's
GPU_DEVICE_NODES = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")

_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_NAME_NOISE = re.compile(r"\((?:r|tm|c)\)|@.*$|\b\d+-core\b|\bprocessor\b|\bcpu\b")


class DeviceMismatchError(UserError, ValueError):
    """A configured device label does not name the hardware the measurement runs on."""


class DeviceLabelError(UserError, ValueError):
    """A device label given (--device, measure.device) that is not a label: not a slug."""


def cpuinfo() -> list[dict[str, str]]:
    """The processor entries of /proc/cpuinfo (empty where there is none)."""
    path = Path("/proc/cpuinfo")
    if not path.is_file():
        return []
    entries = []
    for block in path.read_text().split("\n\n"):
        pairs = (line.split(":", 1) for line in block.splitlines() if ":" in line)
        entry = {key.strip(): value.strip() for key, value in pairs}
        if entry:
            entries.append(entry)
    return entries


def cpu_model(entries: list[dict[str, str]]) -> str:
    """The CPU model name from /proc/cpuinfo, else from the platform module."""
    for entry in entries:
        if entry.get("model name"):
            return entry["model name"]
    return platform.processor() or platform.machine() or "unknown"


def physical_cores(entries: list[dict[str, str]]) -> int | None:
    """Distinct (physical id, core id) pairs of /proc/cpuinfo; None where they are not listed."""
    cores = {(e.get("physical id"), e["core id"]) for e in entries if "core id" in e}
    return len(cores) or None


def total_memory_bytes() -> int | None:
    """Physical memory of the machine in bytes."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def total_memory_gb() -> float | None:
    """Physical memory of the machine in GB."""
    total = total_memory_bytes()
    return None if total is None else round(total / GB, 2)


def slug(text: str) -> str:
    """Lower-case [a-z0-9-] form of a hardware name, without vendor marks and clock speeds."""
    cleaned = _NAME_NOISE.sub(" ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", cleaned).strip("-") or "unknown"


def auto_label(fp: Mapping[str, Any]) -> str:
    """Stable label of the hardware of a fingerprint; CPU labels include the thread count."""
    if fp["device_kind"] == "cuda":
        return f"cuda-{slug(fp['device_name'])}"
    return f"cpu-{slug(fp['cpu_model'])}-{fp['threads']}t"


def resolve_label(label: str, fp: Mapping[str, Any],
                  aliases: Mapping[str, str] | None = None) -> str:
    """The label to file results under: 'auto' gives auto_label(fp); any other label must equal
    it, extend it by a '-' and words of its own (``cpu-amd-epyc-1t-local``: this machine, named
    apart from another of the same model), or be mapped to it by aliases (label -> auto
    label), else DeviceMismatchError."""
    detected = auto_label(fp)
    if label == "auto":
        return detected
    if not _SLUG.fullmatch(label):
        raise DeviceLabelError(f"device label {label!r} (--device, measure.device) is not a "
                               "slug of [a-z0-9] words joined by '-'; use 'auto' or such a "
                               "label")
    aliases = aliases or {}
    if (label == detected or label.startswith(f"{detected}-")
            or aliases.get(label) == detected):
        return label
    target = f" (an alias of {aliases[label]!r})" if label in aliases else ""
    raise DeviceMismatchError(
        f"device label {label!r}{target} does not match the detected hardware {detected!r} "
        f"({fp['device_name']}); use 'auto', {detected!r}, {detected + '-local'!r}, or add "
        f"{label!r}: {detected!r} to the device aliases")


def named_device() -> str:
    """``$HWGPTBENCH_DEVICE`` as given, lower-case (``""`` or ``auto``: the machine chooses)."""
    return os.environ.get(DEVICE_ENV, "").strip().lower()


def cpu_only_label(threads: int) -> str | None:
    """This machine's auto label when its work can only run on the CPU (``$HWGPTBENCH_DEVICE``
    names the CPU, or it is unset or ``auto`` and no GPU driver's device node exists, so torch
    could see no GPU), else None: then only torch can tell (``meters.device``)."""
    named = named_device()
    if named in ("", "auto"):
        if sys.platform == "win32" or any(Path(node).exists() for node in GPU_DEVICE_NODES):
            return None
    elif named != "cpu":
        return None
    return auto_label({"device_kind": "cpu", "cpu_model": cpu_model(cpuinfo()),
                       "threads": threads})
