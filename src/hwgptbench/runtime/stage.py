"""The runtime stage: how the way a model is run changes its cost, and where its time goes.

For a spread of the sampled archs (``runtime.n_archs``, evenly spaced over their parameter
counts) each workload (prefill, decode, train_step) is timed in each dtype with the default
options, then each runtime option (SDPA backend, int8 weights, torch.compile, activation
recomputation) is varied alone on the first dtype's conditions (see
:mod:`hwgptbench.measure.condition`). The archs of one condition are timed interleaved, as the
measure stage does. Rows have the measure stage's columns plus ``tokens_per_s``; decode's
latency is per generated token. Memory is the allocator's peak of one call on CUDA, read with
that workload alone on the device (a memory pass before the timing); on the CPU
it is not measured here (a fresh process per row, as the measure stage pays, would dominate
the stage), and the row says so.

The per-module breakdown (:mod:`hwgptbench.runtime.breakdown`) profiles the default conditions
of the first dtype for ``runtime.breakdown.n_archs`` of those archs. The serving sweep
(:mod:`hwgptbench.runtime.serving`) times prefill and decode at each of
``runtime.serving.batch_sizes`` for ``runtime.serving.n_archs`` of them, and the parallel train
step (:mod:`hwgptbench.runtime.parallel`: DDP and ZeRO-1/2/3 under torchrun, one row per rank)
runs for ``runtime.parallel.n_archs``; its collectives join the breakdown table as the
``communication`` class, with ``parallel`` naming the mode.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from ..io import write_parquet
from ..measure.condition import Condition
from ..measure.device import default_device, fingerprint, resolve_label
from ..measure.flops import forward_flops
from ..measure.latency import (
    LATENCY_FIELDS,
    CallFailed,
    is_out_of_memory,
    measure_latency,
    measure_latency_interleaved,
)
from ..measure.memory import unmeasured
from ..measure.runner import Settings
from ..measure.stage import NULLABLE
from ..space import Arch, SearchSpace
from ..versions import library_versions
from .breakdown import profile_breakdown
from .parallel import launch_parallel
from .serving import serving_sweep
from .workloads import (
    Unsupported,
    Workload,
    build_workload,
    cuda_peak_memory,
    unsupported_reason,
)

log = logging.getLogger(__name__)

PER_CALL_FIELDS = ("latency_ms", "latency_mean_ms", "latency_std_ms", "latency_iqr_ms",
                   "latency_ci95_ms")
CPU_MEMORY_REASON = ("not measured on the CPU by the runtime stage (the measure stage reads "
                     "the forward's memory on the CPU)")
OPTION_WORKLOADS = {"attention": ("prefill", "decode", "train_step"),
                    "quant": ("prefill", "decode"), "compile": ("prefill", "decode", "train_step"),
                    "recompute": ("train_step",)}


def runtime_conditions(section: dict[str, Any]) -> list[Condition]:
    """Each workload in each dtype with default options, then each option value varied alone
    on the first dtype's condition of every workload it applies to."""
    def base(workload: str, dtype: str) -> Condition:
        return Condition(section["batch_size"], section["seq_len"], dtype, "eager", workload,
                         section["gen_len"] if workload == "decode" else 0)

    conditions = [base(w, d) for w in section["workloads"] for d in section["dtypes"]]
    for option, values in section["options"].items():
        for value in values:
            conditions += [Condition(**{**base(w, section["dtypes"][0]).as_dict(), option: value})
                           for w in section["workloads"] if w in OPTION_WORKLOADS[option]]
    return list(dict.fromkeys(conditions))


def spread_archs(archs: Sequence[Arch], space: SearchSpace, vocab_size: int, n: int
                 ) -> list[Arch]:
    """n archs evenly spaced over the parameter counts of archs (smallest and largest
    included; all of them when there are no more than n)."""
    ordered = sorted(archs, key=lambda a: (space.n_params(a, vocab_size), a.id))
    if len(ordered) <= n:
        return ordered
    picks = np.unique(np.linspace(0, len(ordered) - 1, n).round().astype(int))
    return [ordered[i] for i in picks]


def runtime_settings(section: dict[str, Any], threads: int) -> Settings:
    """Timing settings of the ``runtime`` params section."""
    return Settings(threads=threads, warmup=section["warmup"],
                    min_repeats=section["min_repeats"], max_repeats=section["max_repeats"],
                    target_rel_ci=section["target_rel_ci"], max_seconds=section["max_seconds"],
                    seed=section["seed"])


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


def breakdown_rows(space: SearchSpace, arch: Arch, vocab_size: int, condition: Condition,
                   device: torch.device, settings: Settings, repeats: int
                   ) -> list[dict[str, Any]]:
    """Module and operator rows of one arch and condition: ms per call under the profiler,
    the fraction of the profiled step, the step and the unprofiled latency per call.

    The unprofiled latency is timed here, back to back as the profiled calls run, not taken
    from the interleaved runtime rows: interleaving leaves caches colder (a tiny train step
    timed interleaved took up to 1.16x its profiled step), which would confound the
    profiler's overhead with the timing schedule."""
    workload = build_workload(space, arch, vocab_size, condition, device, settings.seed)
    latency = measure_latency(workload.call, device, **settings.timing())["latency_ms"]
    profiled = profile_breakdown(workload.model, workload.call, repeats, device)
    base = {"arch_id": arch.id, **condition.as_dict(), "condition": condition.id,
            "step_ms": profiled["step_ms"], "latency_ms": latency}
    return [base | {"view": view, "category": category, "ms": ms,
                    "fraction": ms / profiled["step_ms"]}
            for view in ("modules", "operators")
            for category, ms in sorted(profiled[view].items())]


class RuntimeTables(NamedTuple):
    """The runtime stage's tables of one device (module doc); the same fields name their
    paths in :func:`write_runtime`."""

    runtime: Any
    breakdown: Any
    serving: Any
    parallel: Any


def _breakdown(section: dict[str, Any], space: SearchSpace, chosen: Sequence[Arch],
               vocab_size: int, conditions: Sequence[Condition], device: torch.device,
               settings: Settings) -> list[dict[str, Any]]:
    """Breakdown rows of the first dtype's default conditions, for a spread of ``chosen``."""
    profiled = spread_archs(chosen, space, vocab_size, section["breakdown"]["n_archs"])
    defaults = [c for c in conditions if c.dtype == section["dtypes"][0]
                and c == Condition(**{**c.as_dict(), "attention": "default", "quant": "none",
                                      "compile": False, "recompute": False})]
    parts = []
    for arch in tqdm(profiled, desc="breakdown", unit="arch"):
        for condition in defaults:
            try:
                parts += breakdown_rows(space, arch, vocab_size, condition, device, settings,
                                        section["breakdown"]["repeats"])
            except Unsupported as err:
                log.warning("breakdown of %s skipped: %s", arch.id, err)
    return parts


def measure_runtime(section: dict[str, Any], threads: int, space: SearchSpace,
                    archs: Sequence[Arch], vocab_size: int, label: str,
                    aliases: dict[str, str]) -> RuntimeTables:
    """The runtime stage's tables of this machine, labelled ``label``."""
    device = default_device()
    torch.set_num_threads(threads)
    settings = runtime_settings(section, threads)
    identity = fingerprint(threads, device)
    resolved = resolve_label(label, identity, aliases)
    chosen = spread_archs(archs, space, vocab_size, section["n_archs"])
    extra = {"device": resolved, "scale": space.name, **identity, **library_versions()}
    rows = []
    conditions = runtime_conditions(section)
    for condition in tqdm(conditions, desc="runtime", unit="condition"):
        rows += [extra | row for row in measure_condition(space, chosen, vocab_size, condition,
                                                          device, settings)]
    parts = _breakdown(section, space, chosen, vocab_size, conditions, device, settings)
    serving = section["serving"]
    served = spread_archs(chosen, space, vocab_size, serving["n_archs"])
    swept = serving_sweep(
        lambda condition: measure_condition(space, served, vocab_size, condition, device,
                                            settings),
        tqdm(serving["batch_sizes"], desc="serving", unit="batch size"), section["seq_len"],
        section["gen_len"], section["dtypes"][0])
    runtime = pl.DataFrame(rows, schema_overrides=NULLABLE | {"tokens_per_s": pl.Float64},
                           infer_schema_length=None)
    breakdown = pl.DataFrame(parts, infer_schema_length=None).with_columns(
        pl.lit(resolved).alias("device"))
    serving_table = pl.DataFrame([extra | row for row in swept], infer_schema_length=None)
    parallel, collectives = _parallel(section, space, chosen, vocab_size)
    parallel = parallel.with_columns(**{k: pl.lit(v) for k, v in extra.items()})
    breakdown = pl.concat([breakdown, collectives.with_columns(pl.lit(resolved).alias("device"))],
                          how="diagonal_relaxed")
    return RuntimeTables(runtime, breakdown, serving_table, parallel)


def _parallel(section: dict[str, Any], space: SearchSpace, chosen: Sequence[Arch],
              vocab_size: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The parallel train step's rows (every rank) and their collectives as breakdown rows
    (``parallel`` names the mode; ``workload`` is ``train_step``), from a torchrun job."""
    spec = section["parallel"]
    archs = spread_archs(chosen, space, vocab_size, spec["n_archs"])
    if not archs:
        return pl.DataFrame(), pl.DataFrame()
    tables = launch_parallel(
        space, archs, vocab_size, modes=spec["modes"], recompute_values=spec["recompute"],
        dtypes=spec["dtypes"], batch_size=spec["batch_size"], seq_len=section["seq_len"],
        warmup=section["warmup"], repeats=spec["repeats"], seed=section["seed"],
        profile_steps=spec["profile_steps"], cpu_ranks=spec["cpu_ranks"])
    collectives = tables.breakdown.rename({"mode": "parallel", "device": "torch_device"})
    return (tables.runtime.rename({"device": "torch_device"}),
            collectives.with_columns(workload=pl.lit("train_step")))


def write_runtime(tables: RuntimeTables, paths: RuntimeTables) -> None:
    """Write each table to its path (atomically, each)."""
    for table, path in zip(tables, paths, strict=True):
        write_parquet(table, path)


def merge_tables(paths: Sequence[str | Path], out: str | os.PathLike[str]
                 ) -> pl.DataFrame:
    """The tables of several devices in one (an empty table when there are none)."""
    tables = [pl.read_parquet(p) for p in paths]
    merged = pl.concat(tables, how="diagonal_relaxed") if tables else pl.DataFrame()
    write_parquet(merged, out)
    return merged
