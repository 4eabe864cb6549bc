"""The runtime stage: how the way a model is run changes its cost, and where its time goes.

For a spread of the sampled archs (``runtime.n_archs``, evenly spaced over their parameter
counts) each workload (prefill, decode, train_step) is timed in each dtype with the default
options, then each runtime option (SDPA backend, int8 weights, torch.compile, activation
recomputation) is varied alone on one dtype's conditions (the first dtype; bf16 on CUDA, where
flash attention has no fp32 kernel; see :mod:`hwgptbench.meters.condition` and
:mod:`hwgptbench.runtime.rows`, which measures the rows of one condition). The archs of one
condition are timed interleaved, as the measure stage does. Rows have the measure stage's
columns plus ``tokens_per_s``; decode's latency is per generated token. Memory is the
allocator's peak of one call on CUDA, read with that workload alone on the device (a memory
pass before the timing); on the CPU it is not measured here (a fresh process per row, as the
measure stage pays, would dominate the stage), and the row says so.

The per-module breakdown (:mod:`hwgptbench.runtime.breakdown`) profiles the default conditions
of the first dtype for ``runtime.breakdown.n_archs`` of those archs. The serving sweep
(:mod:`hwgptbench.runtime.serving`) times prefill and decode at each of
``runtime.serving.batch_sizes`` for ``runtime.serving.n_archs`` of them, and the parallel train
step (:mod:`hwgptbench.runtime.parallel`: DDP and ZeRO-1/2/3 under torchrun, one row per rank)
runs for ``runtime.parallel.n_archs``; its collectives join the breakdown table as the
``communication`` class, with ``parallel`` naming the mode.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from ..io import write_parquet
from ..meters.condition import Condition
from ..meters.device import default_device, fingerprint
from ..meters.host import resolve_label
from ..meters.latency import measure_latency
from ..meters.runner import Settings, cpu_estimator
from ..metrics import nullable_columns
from ..repeatability import REPEAT_MIN
from ..settings.sections import RuntimeSettings
from ..space import Arch, SearchSpace
from ..versions import library_versions
from .breakdown import profile_breakdown
from .parallel import launch_parallel
from .rows import measure_condition, runtime_conditions
from .serving import serving_sweep
from .workloads import Unsupported, build_workload

log = logging.getLogger(__name__)


def spread_archs(archs: Sequence[Arch], space: SearchSpace, vocab_size: int, n: int
                 ) -> list[Arch]:
    """n archs evenly spaced over the parameter counts of archs (smallest and largest
    included; all of them when there are no more than n)."""
    ordered = sorted(archs, key=lambda a: (space.n_params(a, vocab_size), a.id))
    if len(ordered) <= n:
        return ordered
    picks = np.unique(np.linspace(0, len(ordered) - 1, n).round().astype(int))
    return [ordered[i] for i in picks]


def repeat_archs(chosen: Sequence[Arch], space: SearchSpace, vocab_size: int, share: float
                 ) -> list[Arch]:
    """The archs every condition is timed again for, in a separate visit after all of them:
    ``share`` of the chosen ones (at least REPEAT_MIN), spread over their sizes; none for a
    share of 0."""
    if share <= 0:
        return []
    count = max(REPEAT_MIN, math.ceil(share * len(chosen)))
    return spread_archs(chosen, space, vocab_size, count)


def runtime_settings(section: RuntimeSettings, threads: int,
                     device: torch.device | None = None) -> Settings:
    """Timing settings of the ``runtime`` params section (its estimator on CPU devices)."""
    return Settings(threads=threads, warmup=section.warmup,
                    min_repeats=section.min_repeats, max_repeats=section.max_repeats,
                    target_rel_ci=section.target_rel_ci, max_seconds=section.max_seconds,
                    seed=section.seed, estimator=cpu_estimator(section.estimator, device),
                    energy_seconds=0.0, memory=False)  # latency only: the workloads measure
                                                       # memory themselves


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


def _breakdown(section: RuntimeSettings, space: SearchSpace, chosen: Sequence[Arch],
               vocab_size: int, conditions: Sequence[Condition], device: torch.device,
               settings: Settings) -> list[dict[str, Any]]:
    """Breakdown rows of the first dtype's default conditions, for a spread of ``chosen``."""
    profiled = spread_archs(chosen, space, vocab_size, section.breakdown.n_archs)
    defaults = [c for c in conditions if c.dtype == section.dtypes[0]
                and c == Condition(**{**c.as_dict(), "attention": "default", "quant": "none",
                                      "compile": False, "recompute": False})]
    parts = []
    for arch in tqdm(profiled, desc="breakdown", unit="arch"):
        for condition in defaults:
            try:
                parts += breakdown_rows(space, arch, vocab_size, condition, device, settings,
                                        section.breakdown.repeats)
            except Unsupported as err:
                log.warning("breakdown of %s skipped: %s", arch.id, err)
    return parts


def measure_runtime(section: RuntimeSettings, threads: int, space: SearchSpace,
                    archs: Sequence[Arch], vocab_size: int, label: str,
                    aliases: dict[str, str]) -> RuntimeTables:
    """The runtime stage's tables of this machine, labelled ``label``."""
    device = default_device()
    torch.set_num_threads(threads)
    settings = runtime_settings(section, threads, device)
    identity = fingerprint(threads, device)
    resolved = resolve_label(label, identity, aliases)
    chosen = spread_archs(archs, space, vocab_size, section.n_archs)
    extra = {"device": resolved, "scale": space.name, **identity, **library_versions()}
    rows = []
    conditions = runtime_conditions(section, device)
    for condition in tqdm(conditions, desc="runtime", unit="condition"):
        rows += [extra | row for row in measure_condition(space, chosen, vocab_size, condition,
                                                          device, settings)]
    repeated = repeat_archs(chosen, space, vocab_size, section.repeat_share)
    repeats = {(row["arch_id"], row["condition"]): row["latency_ms"]
               for condition in tqdm(conditions if repeated else [], desc="runtime repeat",
                                     unit="condition")
               for row in measure_condition(space, repeated, vocab_size, condition, device,
                                            settings) if row["status"] == "ok"}
    rows = [row | {"latency_repeat_ms": repeats.get((row["arch_id"], row["condition"]))}
            for row in rows]
    parts = _breakdown(section, space, chosen, vocab_size, conditions, device, settings)
    serving = section.serving
    served = spread_archs(chosen, space, vocab_size, serving.n_archs)
    swept = serving_sweep(
        lambda condition: measure_condition(space, served, vocab_size, condition, device,
                                            settings),
        tqdm(serving.batch_sizes, desc="serving", unit="batch size"), section.seq_len,
        section.gen_len, section.dtypes[0])
    runtime = pl.DataFrame(rows, schema_overrides=nullable_columns() | {"tokens_per_s": pl.Float64},
                           infer_schema_length=None)
    breakdown = pl.DataFrame(parts, infer_schema_length=None).with_columns(
        pl.lit(resolved).alias("device"))
    serving_table = pl.DataFrame([extra | row for row in swept], infer_schema_length=None)
    parallel, collectives = _parallel(section, space, chosen, vocab_size)
    parallel = parallel.with_columns(**{k: pl.lit(v) for k, v in extra.items()})
    breakdown = pl.concat([breakdown, collectives.with_columns(pl.lit(resolved).alias("device"))],
                          how="diagonal_relaxed")
    return RuntimeTables(runtime, breakdown, serving_table, parallel)


def _parallel(section: RuntimeSettings, space: SearchSpace, chosen: Sequence[Arch],
              vocab_size: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The parallel train step's rows (every rank) and their collectives as breakdown rows
    (``parallel`` names the mode; ``workload`` is ``train_step``), from a torchrun job."""
    spec = section.parallel
    archs = spread_archs(chosen, space, vocab_size, spec.n_archs)
    if not archs:
        return pl.DataFrame(), pl.DataFrame()
    tables = launch_parallel(
        space, archs, vocab_size, modes=spec.modes, recompute_values=spec.recompute,
        dtypes=spec.dtypes, batch_size=spec.batch_size, seq_len=section.seq_len,
        warmup=section.warmup, repeats=spec.repeats, seed=section.seed,
        profile_steps=spec.profile_steps, cpu_ranks=spec.cpu_ranks)
    collectives = tables.breakdown.rename({"mode": "parallel", "device": "torch_device"})
    return (tables.runtime.rename({"device": "torch_device"}),
            collectives.with_columns(workload=pl.lit("train_step")))


def write_runtime(tables: RuntimeTables, paths: RuntimeTables) -> None:
    """Write each table to its path (atomically, each)."""
    for table, path in zip(tables, paths, strict=True):
        write_parquet(table, path)


