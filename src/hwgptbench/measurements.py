"""The measurement stage around `hwgptbench.measure`: shards of archs, device tables and the
cross-device table, as parquet.

``measure_shard`` measures archs ``i, i+n, i+2n, ...`` of the archs table (shard i of n) on
this machine and writes one atomic parquet file, so a killed run resumes from the shards that
are done and many jobs or machines can share the work. ``merge_shards`` builds the device table
``results/{scale}/measure/{device}.parquet``; ``merge_devices`` stacks device tables into
``results/{scale}/measurements.parquet``. Every row carries the device label, its hardware
fingerprint and the software versions, so tables from many machines merge.
"""

from __future__ import annotations

import logging
import os
import platform
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from collections.abc import Sequence
from typing import Any

import polars as pl
import torch
from tqdm import tqdm

from . import __version__
from .archs import write_table
from .measure import (DTYPES, Condition, Settings, conditions_from_params, cpu_memory,
                      default_device, fingerprint, measure_arch, open_energy_meter,
                      resolve_label)
from .measure.runner import measure_latency_of_archs
from .space import Arch, SearchSpace

log = logging.getLogger(__name__)

class MeasurementError(ValueError):
    """Bad measurement request or inconsistent tables; the message says which."""


KEY = ["device", "arch_id", "batch_size", "seq_len", "dtype", "launch"]
# Columns whose values may all be null in one table: typed explicitly so tables concatenate.
NULLABLE = {
    "reason": pl.String, "latency_ms": pl.Float64, "latency_mean_ms": pl.Float64,
    "latency_std_ms": pl.Float64, "latency_iqr_ms": pl.Float64, "latency_n": pl.Int64,
    "latency_ci95_ms": pl.Float64, "latency_ci95_rel": pl.Float64, "energy_mj": pl.Float64,
    "energy_window_s": pl.Float64, "energy_calls": pl.Int64, "energy_source": pl.String,
    "energy_reason": pl.String, "memory_weights_mb": pl.Float64, "memory_peak_mb": pl.Float64,
    "memory_activations_mb": pl.Float64, "memory_reason": pl.String,
    "latency_drift_cv": pl.Float64, "cpu_cores_physical": pl.Int64, "memory_gb": pl.Float64,
    "gpu_memory_gb": pl.Float64,
    "gpu_driver": pl.String, "cuda_version": pl.String,
}


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' → (i, n) with 0 ≤ i < n."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise MeasurementError(f"--shard: {text!r} is not i/n (e.g. 0/4)") from None
    if not 0 <= index < count:
        raise MeasurementError(f"--shard: {text!r} needs 0 <= i < n")
    return index, count


def settings_from_params(section: dict[str, Any]) -> Settings:
    """Measurement settings of the ``measure`` params section."""
    return Settings(threads=section["threads"], warmup=section["warmup"],
                    min_repeats=section["min_repeats"], max_repeats=section["max_repeats"],
                    target_rel_ci=section["target_rel_ci"], max_seconds=section["max_seconds"],
                    energy_seconds=section["energy_window_s"], memory=section["memory"],
                    seed=section["seed"])


def conditions(section: dict[str, Any], space: SearchSpace, device: torch.device
               ) -> list[Condition]:
    """The conditions of the ``measure`` params section that this device runs."""
    too_long = [t for t in section["seq_lens"] if t > space.block_size]
    if too_long:
        raise MeasurementError(f"measure.seq_lens: {too_long} exceed block_size {space.block_size} "
                         f"of space '{space.name}'")
    return conditions_from_params({"batch_size": section["batch_sizes"],
                                   "seq_len": section["seq_lens"], "dtype": section["dtypes"],
                                   "launch": section["launch"]}, device)


def device_label(section: dict[str, Any], threads: int) -> str:
    """This machine's label: ``measure.device`` checked against the hardware, or derived."""
    return resolve_label(section["device"], fingerprint(threads, default_device()),
                         section["aliases"])


def measure_rows(section: dict[str, Any], space: SearchSpace, archs: Sequence[Arch],
                 vocab_size: int, label: str, desc: str = "measure") -> list[dict[str, Any]]:
    """Rows of every (arch, condition) on this machine, labelled ``label``.

    With ``measure.interleave`` the latency of all archs of a condition is timed round-robin
    (one forward of each per cycle), so a machine whose speed drifts over time (shared or
    virtual CPUs) biases no arch against another; energy and memory are then measured arch by
    arch.
    """
    device = default_device()
    settings = settings_from_params(section)
    identity = fingerprint(settings.threads, device)
    resolved = resolve_label(label, identity, section["aliases"])
    interleave = section["interleave"]
    # On the CPU, memory is read in subprocesses that do not time anything: run them in
    # parallel after the per-arch pass (which may read energy counters, so it runs alone).
    memory_in_pool = settings.memory and device.type == "cpu"
    per_arch = replace(settings, latency=not interleave, memory=settings.memory and not
                       memory_in_pool)
    versions = {"hwgptbench_version": __version__, "python_version": platform.python_version()}
    rows = []
    with open_energy_meter(device) as meter:
        if not meter.available:
            log.info("energy not measured: %s", meter.reason)
        for condition in conditions(section, space, device):
            batch = [measure_arch(space, arch, vocab_size, condition, device, meter, per_arch)
                     for arch in tqdm(archs, desc=f"{desc} {condition.batch_size}x"
                                      f"{condition.seq_len} {condition.dtype} "
                                      f"{condition.launch}", unit="arch", mininterval=2.0)]
            ok = [i for i, row in enumerate(batch) if row["status"] == "ok"]
            if memory_in_pool and ok:
                for i, memory in zip(ok, _cpu_memory_pool(space, [archs[i] for i in ok],
                                                          vocab_size, condition, settings)):
                    batch[i].update(memory)
            if interleave and ok:
                log.info("timing %d archs interleaved", len(ok))
                timed = measure_latency_of_archs(space, [archs[i] for i in ok], vocab_size,
                                                 condition, device, settings)
                for i, stats in zip(ok, timed):
                    batch[i].update(stats)
            rows += [{"device": resolved, "scale": space.name, **row,
                      "latency_interleaved": interleave, **identity, **versions}
                     for row in batch]
    return rows


def _cpu_memory_pool(space: SearchSpace, archs: Sequence[Arch], vocab_size: int,
                     condition: Condition, settings: Settings) -> list[dict[str, Any]]:
    """CPU memory fields of archs, one subprocess each, ``settings.threads`` at a time."""
    def one(arch: Arch) -> dict[str, Any]:
        return cpu_memory(space, arch, vocab_size, DTYPES[condition.dtype],
                          condition.batch_size, condition.seq_len, settings.seed,
                          settings.threads)

    with ThreadPoolExecutor(max_workers=settings.threads) as pool:
        return list(tqdm(pool.map(one, archs), total=len(archs), desc="memory", unit="arch",
                         mininterval=2.0))


def measure_shard(section: dict[str, Any], space: SearchSpace, archs: Sequence[Arch],
                  vocab_size: int, label: str, shard: tuple[int, int],
                  out: str | os.PathLike[str]) -> pl.DataFrame:
    """Measure shard i of n of ``archs`` on this machine; write the rows to ``out``."""
    rows = measure_rows(section, space, list(archs)[shard[0]::shard[1]], vocab_size, label,
                        desc=f"measure shard {shard[0]}/{shard[1]}")
    table = pl.DataFrame(rows, schema_overrides=NULLABLE, infer_schema_length=None)
    write_table(table, out)
    return table


def _check_unique(table: pl.DataFrame, what: str) -> None:
    duplicated = table.filter(table.select(KEY).is_duplicated())
    if duplicated.height:
        raise MeasurementError(f"{what}: {duplicated.height} rows measure the same "
                         f"(device, arch, condition) twice, e.g. {duplicated.row(0, named=True)}")


def merge_shards(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]
                 ) -> pl.DataFrame:
    """One device's table from its shards; each (arch, condition) exactly once."""
    table = pl.concat([pl.read_parquet(p) for p in paths], how="vertical_relaxed")
    if table["device"].n_unique() != 1:
        raise MeasurementError(f"shards of several devices: {sorted(table['device'].unique())}")
    _check_unique(table, "device table")
    table = table.sort(KEY)
    write_table(table, out)
    return table


def merge_devices(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]
                  ) -> pl.DataFrame:
    """The cross-device table from device tables; a label used by two machines is an error."""
    table = pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed")
    identities = table.select("device", "device_name", "cpu_model").unique()
    clashes = identities.filter(identities["device"].is_duplicated())
    if clashes.height:
        raise MeasurementError(f"one label names different hardware: {clashes.to_dicts()}")
    _check_unique(table, "cross-device table")
    table = table.sort(KEY)
    write_table(table, out)
    log.info("merged %d rows from %d device(s): %s", table.height, table["device"].n_unique(),
             ", ".join(sorted(table["device"].unique())))
    return table

