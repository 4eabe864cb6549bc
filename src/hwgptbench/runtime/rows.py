"""The runtime rows of one condition: each arch's workload built, its memory read alone and
the archs timed interleaved (:func:`measure_condition`), and the conditions a device runs
(:func:`runtime_conditions`).

The runtime stage (:mod:`hwgptbench.runtime.stage`) writes these rows as tables; this module
needs torch and numpy only, so a machine with few packages (a lent GPU) runs it as it is.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..meters.condition import Condition
from ..meters.flops import forward_flops
from ..meters.latency import (
    LATENCY_FIELDS,
    CallFailed,
    is_out_of_memory,
    measure_latency_interleaved,
)
from ..meters.memory import unmeasured
from ..meters.runner import Settings
from ..settings.sections import RuntimeSettings
from ..space import Arch, SearchSpace
from .workloads import Unsupported, Workload, build_workload, cuda_peak_memory, unsupported_reason

PER_CALL_FIELDS = ("latency_ms", "latency_mean_ms", "latency_std_ms", "latency_iqr_ms",
                   "latency_ci95_ms")
CPU_MEMORY_REASON = ("not measured on the CPU by the runtime stage (the measure stage reads "
                     "the forward's memory on the CPU)")
OPTION_WORKLOADS = {"attention": ("prefill", "decode", "train_step"),
                    "quant": ("prefill", "decode"), "compile": ("prefill", "decode", "train_step"),
                    "recompute": ("train_step",)}


def option_dtype(dtypes: Sequence[str], device: torch.device) -> str:
    """The dtype the runtime options are varied on: on CUDA bf16 when it is among ``dtypes``
    (every SDPA backend runs in it; flash attention has no fp32 kernel, so varied on fp32 it
    would never be measured), else the first of ``dtypes``."""
    if torch.device(device).type == "cuda" and "bf16" in dtypes:
        return "bf16"
    return dtypes[0]


def runtime_conditions(section: RuntimeSettings, device: torch.device) -> list[Condition]:
    """Each workload in each dtype with default options, then each option value varied alone
    on the :func:`option_dtype` condition of every workload it applies to."""
    def base(workload: str, dtype: str) -> Condition:
        return Condition(section.batch_size, section.seq_len, dtype, "eager", workload,
                         section.gen_len if workload == "decode" else 0)

    conditions = [base(w, d) for w in section.workloads for d in section.dtypes]
    varied = option_dtype(section.dtypes, device)
    for option, values in section.options:
        for value in values:
            conditions += [Condition(**{**base(w, varied).as_dict(), option: value})
                           for w in section.workloads if w in OPTION_WORKLOADS[option]]
    return list(dict.fromkeys(conditions))


def _flops(arch: Arch, space: SearchSpace, vocab_size: int, condition: Condition) -> int:
    """Forward FLOPs of one call's tokens: decode per generated token (a one-token forward,
    attention over the cache not counted), a train step three forwards (forward + backward)."""
    if condition.workload == "decode":
        return forward_flops(arch, space, vocab_size, condition.batch_size, 1)
    flops = forward_flops(arch, space, vocab_size, condition.batch_size, condition.seq_len)
    return 3 * flops if condition.workload == "train_step" else flops


def _null_metrics(reason: str) -> dict[str, Any]:
    return {**dict.fromkeys(LATENCY_FIELDS), "latency_drift_cv": None, "tokens_per_s": None,
            **unmeasured(reason)}


def _per_token(stats: dict[str, Any], workload: Workload) -> dict[str, Any]:
    """Latency statistics of one call, as per generated token for decode, and throughput."""
    scaled = {k: (v / workload.per_call if k in PER_CALL_FIELDS else v)
              for k, v in stats.items()}
    call_s = stats["latency_ms"] / 1000
    return scaled | {"tokens_per_s": workload.tokens / call_s if call_s > 0 else None}


def _failure(error: BaseException) -> dict[str, Any] | None:
    """Status, reason and null metrics of a workload that cannot run (unsupported, or out of
    memory); None for any other error."""
    if isinstance(error, Unsupported):
        return {"status": "unsupported", "reason": str(error), **_null_metrics(str(error))}
    if is_out_of_memory(error):
        message = f"out of memory: {error}".splitlines()[0]
        return {"status": "oom", "reason": message, **_null_metrics(message)}
    return None


def memory_pass(archs: Sequence[Arch], measure_alone: Callable[[Arch], dict[str, Any]]
                ) -> list[dict[str, Any]]:
    """Memory fields (or a failure's status and reason) of each arch's workload, built, read
    and dropped one at a time by ``measure_alone``, so that each peak is that of the workload
    alone on the device: what a user who runs only that workload sees."""
    out = []
    for arch in archs:
        try:
            out.append(measure_alone(arch))
        except (RuntimeError, MemoryError) as err:
            failure = _failure(err)
            if failure is None:
                raise
            out.append(failure)
        gc.collect()  # a workload's optimizer and cache hold reference cycles
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def cuda_memory_alone(build: Callable[[Arch], Workload], device: torch.device
                      ) -> Callable[[Arch], dict[str, Any]]:
    """Build an arch's workload and read its peak over what was allocated before (the CUDA
    context's library workspaces and anything left by earlier work excluded)."""
    def measure(arch: Arch) -> dict[str, Any]:
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        return cuda_peak_memory(build(arch), device, baseline)

    return measure


def measure_condition(space: SearchSpace, archs: Sequence[Arch], vocab_size: int,
                      condition: Condition, device: torch.device, settings: Settings
                      ) -> list[dict[str, Any]]:
    """One row per arch of one condition: status, latency (interleaved), throughput, memory.

    On CUDA a memory pass first builds and reads each workload alone
    (:func:`memory_pass`); the interleaved timing then holds them all. An arch that cannot run
    or runs out of memory gets its status and reason; the others are timed without it."""
    rows = [{"arch_id": a.id, **condition.as_dict(), "condition": condition.id,
             "params": space.n_params(a, vocab_size),
             "flops": _flops(a, space, vocab_size, condition), "threads": settings.threads}
            for a in archs]
    reason = unsupported_reason(condition, device, space.block_size)
    if reason is not None:
        return [row | {"status": "unsupported", "reason": reason, **_null_metrics(reason)}
                for row in rows]

    def build(arch: Arch) -> Workload:
        return build_workload(space, arch, vocab_size, condition, device, settings.seed)

    if device.type == "cuda":
        memory = memory_pass(archs, cuda_memory_alone(build, device))
    else:
        memory = [unmeasured(CPU_MEMORY_REASON)] * len(archs)
    built: dict[int, Workload] = {}
    for i, arch in enumerate(archs):
        if "status" in memory[i]:
            rows[i] |= memory[i]
            continue
        try:
            built[i] = build(arch)
        except (RuntimeError, MemoryError) as err:
            failure = _failure(err)
            if failure is None:
                raise
            rows[i] |= failure
    while built:
        order = list(built)
        try:
            stats = measure_latency_interleaved([built[i].call for i in order], device,
                                                **settings.timing(), seed=settings.seed)
        except CallFailed as failed:
            rows[order[failed.index]] |= _failure(failed.error) or {}
            del built[order[failed.index]]
            continue
        for i, timed in zip(order, stats, strict=True):
            rows[i] |= {"status": "ok", "reason": None, **_per_token(timed, built[i]),
                        **memory[i]}
        break
    if device.type == "cuda":
        built.clear()
        torch.cuda.empty_cache()
    return rows
