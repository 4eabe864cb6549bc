"""The measured device: a hardware fingerprint, its label, and the dtypes it can run.

Every measurement row belongs to a device label. ``auto_label`` derives a stable slug from the
hardware alone (``cpu-amd-epyc-7b13-2t``, ``cuda-nvidia-h100-80gb-hbm3``); a label given in the
configuration must name the hardware it runs on, directly or through an alias, so results of
one machine are never filed under another. Sizes are binary: GB = 2**30 bytes.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import platform
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import UserError
from .condition import DTYPE_NAMES

log = logging.getLogger(__name__)

GB = 2**30
DEVICE_ENV = "HWGPTBENCH_DEVICE"  # names the device that default_device() returns
DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))

_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_NAME_NOISE = re.compile(r"\((?:r|tm|c)\)|@.*$|\b\d+-core\b|\bprocessor\b|\bcpu\b")


class DeviceMismatchError(UserError, ValueError):
    """A configured device label does not name the hardware the measurement runs on."""


def default_device(index: int = 0) -> torch.device:
    """The device that work runs on when none is named: the one ``$HWGPTBENCH_DEVICE`` names
    (``cpu``, ``cuda`` or ``cuda:N``; ``auto`` or unset: choose), else CUDA device ``index``
    (a rank's local index) when CUDA is available, else the CPU. The test suite sets ``cpu``,
    so a GPU machine runs it on the CPU like any other machine."""
    named = os.environ.get(DEVICE_ENV, "").strip().lower()
    if named in ("", "auto"):
        return torch.device("cuda", index) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device: torch.device | None = torch.device(named)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UserError(f"{DEVICE_ENV}={named!r}: expected cpu, cuda, cuda:N or auto")
    if device.type == "cpu":
        return device
    if not torch.cuda.is_available():
        raise UserError(f"{DEVICE_ENV}={named!r} but torch sees no CUDA device")
    return device if device.index is not None else torch.device("cuda", index)


def process_group_backend(device: torch.device) -> str:
    """The ``torch.distributed`` backend of ranks that compute on ``device``: NCCL for CUDA
    devices, gloo for the CPU (on a machine with CUDA too)."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def release(device: torch.device) -> None:
    """Free what a dropped model and optimizer held: collect their reference cycles and, on
    CUDA, return the allocator's cached blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _cpuinfo() -> list[dict[str, str]]:
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


def _cpu_model(cpuinfo: list[dict[str, str]]) -> str:
    """The CPU model name from /proc/cpuinfo, else from the platform module."""
    for entry in cpuinfo:
        if entry.get("model name"):
            return entry["model name"]
    return platform.processor() or platform.machine() or "unknown"


def _physical_cores(cpuinfo: list[dict[str, str]]) -> int | None:
    """Distinct (physical id, core id) pairs of /proc/cpuinfo; None where they are not listed."""
    cores = {(e.get("physical id"), e["core id"]) for e in cpuinfo if "core id" in e}
    return len(cores) or None


def _total_memory_gb() -> float | None:
    """Physical memory of the machine in GB."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, 2)
    except (ValueError, OSError, AttributeError):
        return None


def _nvidia_driver() -> str | None:
    """The NVIDIA driver version from NVML; None where NVML cannot be read."""
    try:
        import pynvml
    except ImportError:
        log.warning("NVIDIA driver version unavailable: pynvml (nvidia-ml-py) is not installed")
        return None
    try:
        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as err:
        log.warning("NVIDIA driver version unavailable: %s", err)
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def fingerprint(threads: int, device: torch.device | None = None) -> dict[str, Any]:
    """Hardware and software facts of the device that runs measurements (default: auto)."""
    device = default_device() if device is None else torch.device(device)
    cpuinfo = _cpuinfo()
    cpu_model = _cpu_model(cpuinfo)
    fp: dict[str, Any] = {
        "device_kind": device.type,
        "device_name": cpu_model,
        "cpu_model": cpu_model,
        "cpu_cores_physical": _physical_cores(cpuinfo) or os.cpu_count(),
        "cpu_cores_logical": os.cpu_count(),
        "memory_gb": _total_memory_gb(),
        "gpu_memory_gb": None,
        "gpu_driver": None,
        "cuda_version": None,
        "torch_version": torch.__version__,
        "threads": threads,
        "hostname_hash": hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12],
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        fp |= {"device_name": props.name, "gpu_memory_gb": round(props.total_memory / GB, 2),
               "gpu_driver": _nvidia_driver(), "cuda_version": torch.version.cuda}
    elif device.type != "cpu":
        raise ValueError(f"unsupported device {device}: expected cpu or cuda")
    return fp


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
    it or be mapped to it by aliases (label -> auto label), else DeviceMismatchError."""
    detected = auto_label(fp)
    if label == "auto":
        return detected
    if not _SLUG.fullmatch(label):
        raise ValueError(f"device label {label!r} is not a slug of [a-z0-9] words joined by '-'")
    aliases = aliases or {}
    if label == detected or aliases.get(label) == detected:
        return label
    target = f" (an alias of {aliases[label]!r})" if label in aliases else ""
    raise DeviceMismatchError(
        f"device label {label!r}{target} does not match the detected hardware {detected!r} "
        f"({fp['device_name']}); use 'auto', {detected!r}, or add {label!r}: {detected!r} "
        "to the device aliases")


def dtype_unsupported_reason(dtype: torch.dtype, device: torch.device) -> str | None:
    """None when a tiny attention and MLP step runs in dtype on device, else why it does not.

    On CUDA the step also runs backward: besides the dtype, that creates the cuBLAS workspace
    of autograd's device thread (32 MiB on Hopper; its own, kept for the process), which the
    first train step measured in a process would otherwise count as its own memory."""
    device = torch.device(device)
    backward = device.type == "cuda"
    try:
        with torch.inference_mode(False), torch.enable_grad():
            x = torch.ones(1, 2, 4, 8, dtype=dtype, device=device, requires_grad=backward)
            weight = torch.ones(8, 8, dtype=dtype, device=device, requires_grad=backward)
            y = F.layer_norm(F.scaled_dot_product_attention(x, x, x, is_causal=True), (8,))
            out = F.gelu(F.linear(y, weight, torch.zeros(8, dtype=dtype, device=device))).sum()
            if backward:
                out.backward()
            out.item()
    except (RuntimeError, TypeError, NotImplementedError) as err:
        return f"{dtype} not supported on {device}: {err}".splitlines()[0]
    return None
