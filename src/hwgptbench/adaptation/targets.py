"""Transfer targets: one (metric, device, condition) of the measurement tables, and the values
of many targets per arch as one matrix.

A target is what one surrogate predicts. Two targets of one device label differ in a
measurement condition on the same machine: the measure stage's (batch size, sequence length,
dtype, launch) or, for rows of the runtime stage, also the workload (prefill, decode,
train_step) and runtime options (SDPA backend, int8, compile, recompute); two
device labels may name different hardware, or the same hardware with another thread count
(CPU labels end in ``-{threads}t``). ``hardware`` (the measured ``device_name``) tells which.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from ..errors import UserError
from ..meters.condition import CONDITION_KEYS, Condition, with_condition_columns
from ..metrics import still_contended

TARGET_KEYS = ("metric", "device", *CONDITION_KEYS)

log = logging.getLogger(__name__)


class TransferError(UserError, ValueError):
    """A transfer request that the data cannot serve; the message says what is missing."""


LONG_SCHEMA = {"metric": pl.String, "device": pl.String, "batch_size": pl.Int64,
               "seq_len": pl.Int64, "dtype": pl.String, "launch": pl.String,
               "workload": pl.String, "gen_len": pl.Int64, "attention": pl.String,
               "quant": pl.String, "compile": pl.Boolean, "recompute": pl.Boolean,
               "hardware": pl.String, "arch_id": pl.String, "value": pl.Float64}


@dataclass(frozen=True, order=True)
class Target:
    """One metric of one device under one measurement condition."""

    metric: str
    device: str
    condition: Condition

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any]) -> Target:
        """The target of a row holding ``TARGET_KEYS`` (e.g. of a long table)."""
        return cls(columns["metric"], columns["device"],
                   Condition(**{key: columns[key] for key in CONDITION_KEYS}))

    def columns(self) -> dict[str, Any]:
        """The values of ``TARGET_KEYS``: the inverse of :meth:`from_columns`."""
        return {"metric": self.metric, "device": self.device, **self.condition.as_dict()}

    def matches(self) -> list[pl.Expr]:
        """Filters selecting this target's rows of a table with ``TARGET_KEYS`` columns."""
        return [pl.col(key) == value for key, value in self.columns().items()]

    @property
    def name(self) -> str:
        """``metric/device/condition id``, for messages."""
        return f"{self.metric}/{self.device}/{self.condition.id}"


def long_table(measurements: pl.DataFrame, metrics: Sequence[str]) -> pl.DataFrame:
    """One row per (target, arch) with a positive measured value (``ok`` rows only): the
    target's keys (metric, device, condition fields), ``hardware, arch_id, value``.

    Tables of the measure and of the runtime stage stack (rows without a runtime option hold
    its default); an (arch, target) measured twice is an error, not a silent choice."""
    ok = measurements.filter(pl.col("status") == "ok") if "status" in measurements.columns \
        else measurements
    ok = with_condition_columns(ok)
    if "latency_ms" in ok.columns:
        contended = still_contended(ok.columns)
        left_out = ok.filter(contended).height
        if left_out and "latency_ms" in metrics:
            log.warning("%d latencies measured under contention left out of the transfer "
                        "targets and sources (docs/measure.md)", left_out)
        ok = ok.with_columns(latency_ms=pl.when(contended).then(None)
                             .otherwise(pl.col("latency_ms")))
    hardware = (pl.col("device_name").cast(pl.String) if "device_name" in ok.columns
                else pl.col("device"))
    parts = [ok.select(pl.lit(metric).alias("metric"), "device", *CONDITION_KEYS,
                       hardware.alias("hardware"), "arch_id",
                       pl.col(metric).cast(pl.Float64).alias("value"))
             .filter(pl.col("value").is_not_null() & (pl.col("value") > 0))
             for metric in metrics if metric in ok.columns]
    # polars annotates cast's mapping with an invariant key type that a dict[str, ...] does not
    # match, though it takes one (pola-rs/polars#14468)
    table = (pl.concat(parts) if parts else pl.DataFrame(schema=LONG_SCHEMA)).cast(
        LONG_SCHEMA)  # type: ignore[arg-type]
    twice = table.filter(table.select(*TARGET_KEYS, "arch_id").is_duplicated())
    if twice.height:
        first = twice.row(0, named=True)
        target = Target.from_columns(first)
        raise TransferError(f"{twice.height} rows measure an arch of a target twice, e.g. "
                            f"{first['arch_id']} of {target.name}; stack each (device, "
                            "condition) from one table")
    return table.sort(*TARGET_KEYS, "arch_id")


def targets_of(long: pl.DataFrame) -> list[Target]:
    """The targets of a long table, sorted."""
    return sorted(Target.from_columns(row)
                  for row in long.select(TARGET_KEYS).unique().iter_rows(named=True))


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
            part = long.filter(*target.matches())
            values[[row[a] for a in part["arch_id"]], j] = part["value"].to_numpy()
        return cls(targets, arch_ids, values)

    def measured(self, j: int) -> np.ndarray:
        """Row indices of the archs target j measured."""
        return np.flatnonzero(~np.isnan(self.values[:, j]))
