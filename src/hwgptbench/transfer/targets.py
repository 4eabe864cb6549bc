"""Transfer targets: one (metric, device, condition) of the measurement tables, and the values
of many targets per arch as one matrix.

A target is what one surrogate predicts. Two targets of one device label differ in a
measurement condition (batch size, sequence length, dtype, launch) on the same machine; two
device labels may name different hardware, or the same hardware with another thread count
(CPU labels end in ``-{threads}t``). ``hardware`` (the measured ``device_name``) tells which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from ..measure.condition import SHAPE_KEYS
from ..surrogates import condition_id

TARGET_KEYS = ("metric", "device", *SHAPE_KEYS)


class TransferError(ValueError):
    """A transfer request that the data cannot serve; the message says what is missing."""


LONG_SCHEMA = {"metric": pl.String, "device": pl.String, "batch_size": pl.Int64,
               "seq_len": pl.Int64, "dtype": pl.String, "launch": pl.String,
               "hardware": pl.String, "arch_id": pl.String, "value": pl.Float64}


@dataclass(frozen=True, order=True)
class Target:
    """One metric of one device under one measurement condition."""

    metric: str
    device: str
    batch_size: int
    seq_len: int
    dtype: str
    launch: str

    @property
    def condition(self) -> str:
        """Condition id, e.g. ``b1-t128-fp32-eager``."""
        return condition_id(self.batch_size, self.seq_len, self.dtype, self.launch)

    @property
    def name(self) -> str:
        """``metric/device/condition``, for messages."""
        return f"{self.metric}/{self.device}/{self.condition}"


def long_table(measurements: pl.DataFrame, metrics: Sequence[str]) -> pl.DataFrame:
    """One row per (target, arch) with a positive measured value (``ok`` rows only):
    ``metric, device, batch_size, seq_len, dtype, launch, hardware, arch_id, value``."""
    ok = measurements.filter(pl.col("status") == "ok") if "status" in measurements.columns \
        else measurements
    hardware = (pl.col("device_name").cast(pl.String) if "device_name" in ok.columns
                else pl.col("device"))
    parts = [ok.select(pl.lit(metric).alias("metric"), "device", *SHAPE_KEYS,
                       hardware.alias("hardware"), "arch_id",
                       pl.col(metric).cast(pl.Float64).alias("value"))
             .filter(pl.col("value").is_not_null() & (pl.col("value") > 0))
             for metric in metrics if metric in ok.columns]
    table = (pl.concat(parts) if parts else pl.DataFrame(schema=LONG_SCHEMA)).cast(LONG_SCHEMA)
    return table.sort(*TARGET_KEYS, "arch_id")


def targets_of(long: pl.DataFrame) -> list[Target]:
    """The targets of a long table, sorted."""
    return sorted(Target(*row) for row in long.select(TARGET_KEYS).unique().iter_rows())


def hardware_of(long: pl.DataFrame) -> dict[str, str]:
    """Device label -> measured hardware name."""
    pairs = long.select("device", "hardware").unique().sort("device")
    return dict(pairs.iter_rows())


@dataclass
class Profiles:
    """Values of one metric's targets (columns) per arch (rows); NaN where not measured."""

    targets: list[Target]
    arch_ids: list[str]
    values: np.ndarray

    @classmethod
    def from_long(cls, long: pl.DataFrame) -> Profiles:
        """The profiles of the targets of a long table of one metric."""
        metrics = long["metric"].unique().to_list()
        if len(metrics) > 1:
            raise ValueError(f"profiles hold one metric, got {sorted(metrics)}")
        targets = targets_of(long)
        arch_ids = sorted(long["arch_id"].unique())
        row = {a: i for i, a in enumerate(arch_ids)}
        values = np.full((len(arch_ids), len(targets)), np.nan)
        for j, target in enumerate(targets):
            part = long.filter(*(pl.col(k) == getattr(target, k) for k in TARGET_KEYS))
            values[[row[a] for a in part["arch_id"]], j] = part["value"].to_numpy()
        return cls(targets, arch_ids, values)

    def measured(self, j: int) -> np.ndarray:
        """Row indices of the archs target j measured."""
        return np.flatnonzero(~np.isnan(self.values[:, j]))
