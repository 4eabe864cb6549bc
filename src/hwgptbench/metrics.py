"""What a measurement table holds: its key columns and the types of columns that may be all
null in one table (typed explicitly so that tables from many machines concatenate)."""

from collections.abc import Sequence
from typing import Any

import polars as pl

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
    "gpu_driver": pl.String, "cuda_version": pl.String, "latency_group_factor": pl.Float64,
    "latency_group": pl.Int64, "latency_anchor_only": pl.Boolean,
    "latency_repeat_ms": pl.Float64,
}


def measurement_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    """Measurement rows as a table, the nullable columns typed."""
    return pl.DataFrame(rows, schema_overrides=NULLABLE, infer_schema_length=None)
