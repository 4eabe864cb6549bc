"""The hardware metrics and the measurement table that holds them, declared once.

A hardware metric is a column of the measurement table that the surrogates are fitted on
(:class:`Metric`: its name, unit, figure label, the columns its meter writes and the column that
says why it is null). :data:`METRICS` is the registry: the measure stage writes every metric's
columns (null with the reason where the device cannot measure it), the params schema accepts
exactly these names wherever a hardware metric is named (``surrogate.metrics``,
``transfer.metrics``, ``search.objective_sets``), the surrogates stage reads a null metric's
reason from its reason column, and figures and tables label it from here. The physical range
of a measured value is its unit's (:data:`UNIT_BOUNDS`, :attr:`Metric.bounds`): the tables
read from outside (``hwgptbench adapt``, ``ship-tables``) are checked against it.

The built-in metrics are measured by :mod:`hwgptbench.meters.runner` itself (latency, energy,
memory). A further metric names its meter (``measure``): a function called on each built model
after the built-in meters, ``measure(model, forward, x) -> {column: value}``, where ``forward``
runs one forward pass of ``model`` on the token ids ``x`` under the row's condition.
docs/architecture.md ("Where does X go?") has the recipe.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import UserError

if TYPE_CHECKING:
    import polars as pl


KEY = ["device", "arch_id", "batch_size", "seq_len", "dtype", "launch"]
PERPLEXITY = "perplexity"  # the one metric that does not depend on the device

# Meter: (model, forward, token ids) -> the metric's columns of one row
Meter = Callable[[Any, Callable[[], Any], Any], Mapping[str, Any]]


class MetricError(UserError, ValueError):
    """A metric declared twice or without its columns, or a meter that cannot be found."""


@dataclass(frozen=True)
class Bounds:
    """The physical range of one measured value of a unit: what a device can measure."""

    low: float
    high: float
    words: str  # the range in words, as a refusal quotes it


# the bounds of each unit of a measured value: a forward pass takes 1 µs to 1 h and draws
# 1 µJ to 10 kW for that hour, its memory is 1 kB to 100 TB
UNIT_BOUNDS = {"ms": Bounds(1e-3, 3.6e6, "1 µs to 1 h per forward"),
               "mJ": Bounds(1e-3, 3.6e10, "1 µJ to 10 kW for 1 h"),
               "MB": Bounds(1e-3, 1e8, "1 kB to 100 TB")}
# the bounds of the perplexity table's metrics, which have no unit of UNIT_BOUNDS: a perplexity
# is the exponential of a mean cross-entropy, at least 1 (a uniform guess over the schema's
# largest vocabulary, 2^24 tokens, scores 1.7e7; 1e12 is 27.6 nats per token), an accuracy a
# fraction
ARCH_BOUNDS = {PERPLEXITY: Bounds(1.0, 1e12, "1 to 1e12, the exponential of a loss"),
               "accuracy": Bounds(0.0, 1.0, "a fraction, 0 to 1")}


@dataclass(frozen=True)
class Metric:
    """A hardware metric of the measurement table."""

    name: str  # its column (unit in the name: latency_ms, energy_mj, memory_peak_mb)
    unit: str  # as printed: ms, mJ, MB
    label: str  # axis and table label, with the unit
    reason_column: str  # the column that says why the metric is null on a row
    # every column its meter writes (itself, the reason and any statistics) with its polars
    # type's name, so that tables whose rows are all null concatenate with measured ones
    columns: Mapping[str, str] = field(default_factory=dict)
    # None: measured by meters.runner itself; else a Meter or its "module:function"
    measure: Meter | str | None = None

    @property
    def bounds(self) -> Bounds | None:
        """The range of a measured value of the metric (its unit's), or None for a unit of no
        known range."""
        return UNIT_BOUNDS.get(self.unit)

    def meter(self) -> Meter | None:
        """The meter function of a further metric (imported on first use), or None."""
        if self.measure is None or callable(self.measure):
            return self.measure
        module, _, name = self.measure.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise MetricError(f"metric {self.name}: meter {self.measure!r} not found: {err}"
                              ) from err


_LATENCY_COLUMNS = {
    "latency_ms": "Float64", "latency_mean_ms": "Float64", "latency_std_ms": "Float64",
    "latency_iqr_ms": "Float64", "latency_n": "Int64", "latency_ci95_ms": "Float64",
    "latency_ci95_rel": "Float64", "latency_drift_cv": "Float64",
    "latency_group_factor": "Float64", "latency_group": "Int64",
    "latency_anchor_only": "Boolean", "latency_repeat_ms": "Float64", "reason": "String",
    "latency_contended": "Boolean", "latency_remeasured": "Int64",
    "latency_runqueue_wait": "Float64",
}
_ENERGY_COLUMNS = {
    "energy_mj": "Float64", "energy_window_s": "Float64", "energy_calls": "Int64",
    "energy_power_w": "Float64", "energy_ms_per_call": "Float64",
    "energy_above_idle_mj": "Float64", "energy_idle_w": "Float64",
    "energy_source": "String", "energy_reason": "String",
}
_MEMORY_COLUMNS = {
    "memory_weights_mb": "Float64", "memory_peak_mb": "Float64",
    "memory_activations_mb": "Float64", "memory_reason": "String",
}
# what identifies the machine and may be null on one (no GPU, no physical core count)
_DEVICE_COLUMNS = {
    "cpu_cores_physical": "Int64", "memory_gb": "Float64", "gpu_memory_gb": "Float64",
    "gpu_driver": "String", "cuda_version": "String",
}

METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("latency_ms", "ms", "latency (ms)", "reason", _LATENCY_COLUMNS),
    Metric("energy_mj", "mJ", "energy (mJ)", "energy_reason", _ENERGY_COLUMNS),
    Metric("memory_peak_mb", "MB", "peak memory (MB)", "memory_reason", _MEMORY_COLUMNS),
    Metric("memory_activations_mb", "MB", "activation memory (MB)", "memory_reason",
           _MEMORY_COLUMNS),
)}
# labels of table columns that are not hardware metrics
OTHER_LABELS = {PERPLEXITY: "validation perplexity", "memory_weights_mb": "weight memory (MB)",
                "params": "parameters", "flops": "FLOPs"}
# units of the measured columns that are not hardware metrics
OTHER_UNITS = {"memory_weights_mb": "MB"}


def hardware_metrics() -> list[str]:
    """The names of the registered hardware metrics, in registration order."""
    return list(METRICS)


def further_metrics() -> list[Metric]:
    """The registered metrics that name their own meter."""
    return [m for m in METRICS.values() if m.measure is not None]


def register(metric: Metric) -> Metric:
    """Add a hardware metric to the registry; a name or column already declared is an error."""
    if metric.name in METRICS:
        raise MetricError(f"metric {metric.name} is already registered")
    if metric.name not in metric.columns or metric.reason_column not in metric.columns:
        raise MetricError(f"metric {metric.name}: columns must include {metric.name} and its "
                          f"reason column {metric.reason_column}")
    METRICS[metric.name] = metric
    return metric


@contextlib.contextmanager
def registered(metric: Metric) -> Iterator[Metric]:
    """The metric registered for the duration of a ``with`` block (plugins' tests, scripts)."""
    register(metric)
    try:
        yield metric
    finally:
        del METRICS[metric.name]


def measured_bounds() -> dict[str, Bounds]:
    """The range of each measured column of a unit of known range: every metric's and the
    other measured columns' (:data:`OTHER_UNITS`), by column."""
    units = {metric.name: metric.unit for metric in METRICS.values()} | OTHER_UNITS
    return {column: UNIT_BOUNDS[unit] for column, unit in units.items() if unit in UNIT_BOUNDS}


def answer_bounds(metric: str) -> Bounds | None:
    """The range of a value of ``metric`` that a query may return (measured or predicted):
    its unit's for a hardware metric or another measured column, :data:`ARCH_BOUNDS` for the
    perplexity table's; None for a metric of no known range."""
    if metric in ARCH_BOUNDS:
        return ARCH_BOUNDS[metric]
    return measured_bounds().get(metric)


def label(column: str) -> str | None:
    """The label of a metric or another known column, or None."""
    return METRICS[column].label if column in METRICS else OTHER_LABELS.get(column)


def reason_column(metric: str) -> str:
    """The column that says why ``metric`` is null on a row."""
    return METRICS[metric].reason_column


def nullable_columns() -> dict[str, Any]:
    """The columns that may be all null in one measurement table with their polars types:
    every metric's and the machine's."""
    import polars as pl

    names: dict[str, str] = dict(_DEVICE_COLUMNS)
    for metric in METRICS.values():
        names |= metric.columns
    return {column: getattr(pl, dtype) for column, dtype in names.items()}


def further_nulls(reason: str) -> dict[str, Any]:
    """The further metrics' columns of a row that they did not measure, with the reason."""
    row: dict[str, Any] = {}
    for metric in further_metrics():
        row |= dict.fromkeys(metric.columns) | {metric.reason_column: reason}
    return row


def still_contended(columns: Collection[str]) -> pl.Expr:
    """Rows whose latency stayed contended after the measure stage's visits:
    ``latency_contended`` on a row the stage could time again (``latency_remeasured`` not
    null). They stay in the tables and are left out of surrogate fitting and transfer
    (docs/measure.md); false for tables without the columns."""
    import polars as pl

    if not {"latency_contended", "latency_remeasured"} <= set(columns):
        return pl.lit(False)
    return (pl.col("latency_contended").fill_null(False)
            & pl.col("latency_remeasured").is_not_null())


def measurement_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    """Measurement rows as a table, the nullable columns typed."""
    import polars as pl

    return pl.DataFrame(rows, schema_overrides=nullable_columns(), infer_schema_length=None)
