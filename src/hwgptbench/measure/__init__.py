"""Hardware measurements of fixed models: latency, energy, memory and FLOPs, one row per arch.

Needs torch and numpy only (pynvml is imported where NVML is read), so it runs on measurement
machines with few packages; writing the rows is left to the caller.
"""

from .condition import CONDITION_KEYS, Condition
from .device import (
    DTYPES,
    DeviceMismatchError,
    auto_label,
    default_device,
    dtype_unsupported_reason,
    fingerprint,
    resolve_label,
)
from .energy import EnergyMeter, RaplMeter, measure_energy, open_energy_meter
from .flops import forward_flops
from .latency import cuda_graph_callable, measure_latency, median_ci_halfwidth, median_ci_ranks
from .memory import cpu_memory, cuda_memory, tensor_bytes
from .runner import Settings, conditions_from_params, measure_arch

__all__ = [
    "CONDITION_KEYS",
    "DTYPES",
    "Condition",
    "DeviceMismatchError",
    "EnergyMeter",
    "RaplMeter",
    "Settings",
    "auto_label",
    "conditions_from_params",
    "cpu_memory",
    "cuda_graph_callable",
    "cuda_memory",
    "default_device",
    "dtype_unsupported_reason",
    "fingerprint",
    "forward_flops",
    "measure_arch",
    "measure_energy",
    "measure_latency",
    "median_ci_halfwidth",
    "median_ci_ranks",
    "open_energy_meter",
    "resolve_label",
    "tensor_bytes",
]
