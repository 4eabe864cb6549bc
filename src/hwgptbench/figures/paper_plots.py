"""Figures of the paper that the workflow's own figures do not draw: cost against size across
the shipped devices."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
from matplotlib.ticker import FuncFormatter, NullFormatter

from ..plotting.style import (
    DOUBLE_WIDTH,
    SINGLE_WIDTH,
    cycle_colors,
    grid_shape,
    metric_label,
    new_figure,
    save,
    styled,
)
from .benchmark import measured

PathLike = str | os.PathLike[str]


@styled
def cost_vs_size(measurements: pl.DataFrame, out_stem: PathLike) -> list[Path]:
    """Latency and peak memory against the parameter count of every measured arch, log-log,
    one panel per metric, one colour per (device, condition)."""
    table = measured(measurements).with_columns(
        column=pl.format("{} {}", "device", "condition"))
    columns = table["column"].unique(maintain_order=True).to_list()
    colors = cycle_colors(columns)
    metrics = [m for m in ("latency_ms", "memory_peak_mb") if table[m].is_not_null().any()]
    rows, cols = grid_shape(len(metrics), max_cols=2)
    fig = new_figure(DOUBLE_WIDTH if cols > 1 else SINGLE_WIDTH, 3.0 * rows + 0.6)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for column in columns:
            part = table.filter(pl.col("column") == column).drop_nulls(metric)
            ax.scatter(part["params"] / 1e6, part[metric], s=6, color=colors[column],
                       linewidths=0, alpha=0.7, label=column)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("parameters (millions)")
        ax.set_ylabel(metric_label(metric))
    fig.legend(*axes.flat[0].get_legend_handles_labels(), loc="outside lower center",
               ncols=min(2, len(columns)), markerscale=2.5, fontsize=7)
    return save(fig, out_stem)
