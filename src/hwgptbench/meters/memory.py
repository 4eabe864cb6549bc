"""Memory of one forward pass: the model's weights, its peak and the activations' share of it.

All three are per model and input, the same on every device: ``memory_weights_mb`` is the exact
bytes of its parameters and buffers, ``memory_peak_mb`` the weights plus the peak of the bytes
that PyTorch's allocator holds for the forward's tensors over what it held before the forward,
``memory_activations_mb`` that peak alone (reported apart because at large batch the logits
dominate it). MB are 2**20 bytes.

CUDA: the caching allocator's statistics (``reset_peak_memory_stats``, ``memory_allocated``
before the forward, ``max_memory_allocated`` after it).

CPU: PyTorch's CPU allocator has no counters, but it reports every allocation and free to the
profiler: the forward runs under ``torch.profiler`` with ``profile_memory=True`` and the peak is
the high-water mark of the running sum of those events. Like CUDA's statistics this counts
tensor bytes (library scratch outside PyTorch's allocator excluded), so it depends on the model
and its input alone: not on what the process ran before, on the allocator's cached pages or on
page granularity, which made the resident set size of small models measure the process rather
than the model (docs/measure.md). bf16 weights are exactly half of fp32 ones, and
``python benchmarks/memory_dtypes.py`` shows that the bf16 peak ranks archs like the fp32 peak.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from .latency import synchronize

MB = 2**20


def tensor_bytes(model: nn.Module) -> int:
    """Exact bytes of a model's parameters and buffers."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this process; any other tensor itself."""
    to_local = getattr(tensor, "to_local", None)  # torch.distributed.tensor.DTensor
    return to_local() if callable(to_local) else tensor


def tensors_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Exact bytes of tensors held by this process (a DTensor's local shard), each storage
    region once (tied weights)."""
    seen: set[tuple[str, int, int]] = set()
    total = 0
    for tensor in tensors:
        local = _local(tensor)
        nbytes = local.numel() * local.element_size()
        key = (str(local.device), local.data_ptr(), nbytes)
        if nbytes and key not in seen:
            seen.add(key)
            total += nbytes
    return total


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Exact bytes of an optimizer's state tensors held here (AdamW: two moments and a step
    per parameter; ZeroRedundancyOptimizer: those of its local optimizer over this rank's
    share)."""
    inner = getattr(optimizer, "optim", optimizer)
    return tensors_bytes(value for state in inner.state.values() for value in state.values()
                         if isinstance(value, torch.Tensor))


def memory_row(weights: int, peak: int, activations: int) -> dict[str, Any]:
    """The memory fields of a row, from byte counts."""
    return {"memory_weights_mb": weights / MB, "memory_peak_mb": peak / MB,
            "memory_activations_mb": activations / MB, "memory_reason": None}


def unmeasured(reason: str) -> dict[str, Any]:
    """The memory fields of a row whose memory was not measured."""
    return {"memory_weights_mb": None, "memory_peak_mb": None, "memory_activations_mb": None,
            "memory_reason": reason}


def cuda_memory(model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Memory of one forward of model on token ids x, on x's CUDA device."""
    device = x.device
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.inference_mode():
        model(x)
    synchronize(device)
    activations = torch.cuda.max_memory_allocated(device) - before
    weights = tensor_bytes(model)
    return memory_row(weights, weights + activations, activations)


def peak_rss_bytes() -> int:
    """Peak RSS of this process's memory in bytes: VmHWM where /proc has it, else ru_maxrss."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: KB on Linux, bytes on macOS
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: the profiler's backend prints a line there whenever
    it starts or stops, once per measured model."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def cpu_allocation_peak(run: Callable[[], Any]) -> int:
    """Peak bytes that PyTorch's CPU allocator holds while ``run()`` runs, over what it held
    before."""
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    events.sort(key=lambda e: e.start_ns())  # stable: ties keep the order of recording
    held = peak = 0
    for event in events:
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def cpu_memory(model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Memory of one CPU forward of model on token ids x (see module doc)."""
    with torch.inference_mode():
        activations = cpu_allocation_peak(lambda: model(x))
    weights = tensor_bytes(model)
    return memory_row(weights, weights + activations, activations)
