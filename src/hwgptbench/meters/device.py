"""The measured device: which one work runs on, its hardware fingerprint (labelled by
``meters.host``), and the dtypes it can run. Sizes are binary: GB = 2**30 bytes."""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import socket
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import UserError
from .condition import DTYPE_NAMES
from .host import (
    DEVICE_ENV,
    GB,
    cpu_model,
    cpuinfo,
    named_device,
    physical_cores,
    total_memory_gb,
)

log = logging.getLogger(__name__)

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))

def default_device(index: int = 0) -> torch.device:
    """The device that work runs on when none is named: the one ``$HWGPTBENCH_DEVICE`` names
    (``cpu``, ``cuda`` or ``cuda:N``; ``auto`` or unset: choose), else CUDA device ``index``
    (a rank's local index) when CUDA is available, else the CPU. The test suite sets ``cpu``,
    so a GPU machine runs it on the CPU like any other machine."""
    named = named_device()
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


def freeze_survivors() -> None:
    """Collect now, then leave every object alive (the imported modules, the settings: they
    live as long as the process) out of later collections: each collection between measured
    models (:func:`release`, or one the collector starts inside a timed call) then walks only
    what was built since, a few ms instead of 0.1-0.3 s with torch's modules loaded."""
    gc.collect()
    gc.freeze()


def release(device: torch.device) -> None:
    """Free what a dropped model and optimizer held: collect their reference cycles and, on
    CUDA, return the allocator's cached blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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
    entries = cpuinfo()
    model = cpu_model(entries)
    fp: dict[str, Any] = {
        "device_kind": device.type,
        "device_name": model,
        "cpu_model": model,
        "cpu_cores_physical": physical_cores(entries) or os.cpu_count(),
        "cpu_cores_logical": os.cpu_count(),
        "memory_gb": total_memory_gb(),
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
