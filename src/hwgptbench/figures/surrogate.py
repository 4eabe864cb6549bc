"""Figures of surrogate quality: interval calibration and out-of-fold predictions."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import polars as pl
from scipy.stats import kendalltau

from ..plotting.style import (
    DOUBLE_WIDTH,
    SINGLE_WIDTH,
    family_color,
    grid_shape,
    metric_label,
    new_figure,
    save,
    styled,
)

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


def _where(device: str | None, condition: str | None) -> str:
    """Panel subtitle of a (device, condition), leaving out the ``any`` placeholders; a
    perplexity fidelity ``steps-N`` reads "after N training steps"."""
    if condition and condition.startswith("steps-"):
        condition = f"after {condition.removeprefix('steps-')} training steps"
    return "\n".join(p for p in (device, condition) if p and p != "any") or "all devices"


@styled
def surrogate_calibration(quality: pl.DataFrame, out_stem: PathLike) -> list[Path]:
    """Nominal against empirical (out-of-fold) coverage of the prediction intervals, one panel
    per metric, one colour per family (dodged apart by 0.006 on x), one point per (device,
    condition)."""
    table = (quality.filter(pl.col("status") == "ok")
             .drop_nulls(["coverage", "nominal_coverage"]).sort("metric", "family"))
    if table.is_empty():
        log.info("surrogate_calibration: skipped, no ok rows with a coverage")
        return []
    metrics = table["metric"].unique(maintain_order=True).to_list()
    families = table["family"].unique(maintain_order=True).to_list()
    values = np.concatenate([table["coverage"].to_numpy(), table["nominal_coverage"].to_numpy()])
    low = max(0.0, np.floor((values.min() - 0.05) * 20) / 20)
    rows, cols = grid_shape(len(metrics), 4)
    fig = new_figure(min(DOUBLE_WIDTH, 2.0 * cols + 0.6), 2.0 * rows + 0.6)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    offsets = {f: (k - (len(families) - 1) / 2) * 0.006 for k, f in enumerate(families)}
    for ax, metric in zip(axes.flat, metrics, strict=False):
        ax.plot([low, 1], [low, 1], color="black", linewidth=0.8, linestyle="--", zorder=1)
        for family in families:
            part = table.filter((pl.col("metric") == metric) & (pl.col("family") == family))
            for line in part.partition_by("device", "condition", maintain_order=True):
                ax.plot(line["nominal_coverage"] + offsets[family], line["coverage"], marker="o",
                        markersize=4.5, color=family_color(family), alpha=0.8, linewidth=0.8)
        ax.set_title(metric_label(metric))
        ax.set_xlim(low, 1.01)
        ax.set_ylim(low, 1.01)
        ax.set_aspect("equal")
    for ax in axes[-1]:
        ax.set_xlabel("nominal coverage")
    for ax in axes[:, 0]:
        ax.set_ylabel("empirical coverage")
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    handles = [ax.plot([], [], marker="o", color=family_color(f), linestyle="")[0]
               for f in families]
    fig.legend(handles, families, loc="outside lower center", ncols=len(families),
               title="surrogate family (one point per device and condition)")
    return save(fig, out_stem)


@styled
def surrogate_scatter(predictions: pl.DataFrame, out_stem: PathLike) -> list[Path]:
    """Out-of-fold predicted against measured values with prediction intervals, one panel per
    (metric, device, condition), one colour per family (Kendall tau in the legend)."""
    table = predictions.drop_nulls(["measured", "predicted"]).sort(
        "metric", "device", "condition", "family", "arch_id", nulls_last=True)
    if table.is_empty():
        log.info("surrogate_scatter: skipped, no predictions")
        return []
    panels = table.partition_by("metric", "device", "condition", maintain_order=True,
                                as_dict=True)
    rows, cols = grid_shape(len(panels))
    fig = new_figure(DOUBLE_WIDTH if cols > 1 else SINGLE_WIDTH, 2.5 * rows + 0.2)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, ((metric, device, condition), part) in zip(axes.flat, panels.items(), strict=False):
        both = np.concatenate([part["measured"].to_numpy(), part["predicted"].to_numpy()])
        lo, hi = float(np.nanmin(both)), float(np.nanmax(both))
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, linestyle="--", zorder=1)
        for family, sub in part.partition_by("family", maintain_order=True, as_dict=True).items():
            x, y = sub["measured"].to_numpy(), sub["predicted"].to_numpy()
            lower = sub["lower"].fill_null(np.nan).to_numpy()
            upper = sub["upper"].fill_null(np.nan).to_numpy()
            err = np.nan_to_num(np.vstack([y - lower, upper - y]).clip(min=0))
            tau = kendalltau(x, y).statistic if len(x) > 1 else np.nan
            ax.errorbar(x, y, yerr=err, fmt="o", markersize=2.5, elinewidth=0.5, alpha=0.6,
                        color=family_color(family[0]), label=f"{family[0]} (τ = {tau:.2f})")
        label = metric_label(metric)
        ax.set_title(f"{label.split(' (')[0]}\n{_where(device, condition)}")
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.legend(loc="upper left", framealpha=0.9, handletextpad=0.3, borderpad=0.3,
                  markerscale=1.6)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    return save(fig, out_stem)
