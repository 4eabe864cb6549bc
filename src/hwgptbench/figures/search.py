"""Figures of the search results: anytime hypervolume and attainment surfaces."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.lines import Line2D
from scipy.stats import t as student_t

from ..plotting.style import (
    DOUBLE_WIDTH,
    SINGLE_WIDTH,
    algorithm_color,
    algorithm_marker,
    algorithm_order,
    grid_shape,
    metric_label,
    new_figure,
    number,
    save,
    styled,
)

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


def step_values(cost: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """A run's step function (value after the last evaluation with cumulative cost <= g) on
    grid; NaN before its first evaluation."""
    index = np.searchsorted(cost, grid, side="right") - 1
    return np.where(index >= 0, values[np.maximum(index, 0)], np.nan)


def mean_band(curves: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds (rows) and the half width of its Student-t confidence interval (zero for
    a single seed)."""
    valid = ~np.isnan(curves)
    n = valid.sum(axis=0)
    filled = np.where(valid, curves, 0.0)
    mean = np.divide(filled.sum(axis=0), n, out=np.full(n.shape, np.nan), where=n > 0)
    squares = np.where(valid, (curves - mean) ** 2, 0.0).sum(axis=0)
    std = np.sqrt(np.divide(squares, n - 1, out=np.zeros(n.shape), where=n > 1))
    half = student_t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)) * std / np.sqrt(np.maximum(n, 1))
    return mean, np.where(n > 1, half, 0.0)


@styled
def hypervolume_curves(runs: pl.DataFrame, out_stem: PathLike) -> list[Path]:
    """Hypervolume and hypervolume regret (log) against cumulative cost, mean over seeds with a
    95 % confidence band, one colour per algorithm, one row per (objectives, device)."""
    runs = runs.sort("objectives", "device", "algorithm", "seed", "cumulative_cost")
    groups = runs.partition_by("objectives", "device", maintain_order=True, as_dict=True)
    if not groups:
        log.info("hypervolume_curves: skipped, no runs")
        return []
    fig = new_figure(DOUBLE_WIDTH, 2.4 * len(groups) + 0.4)
    axes = fig.subplots(len(groups), 2, squeeze=False)
    algorithms = algorithm_order(runs["algorithm"].unique())
    for (hv_ax, regret_ax), ((objectives, device), group) in zip(axes, groups.items(), strict=True):
        grid = np.unique(group["cumulative_cost"].to_numpy())
        best = float((group["hypervolume"] + group["hv_regret"]).max())  # the reference front's
        positive = group.filter(pl.col("hv_regret") > 0)["hv_regret"]
        floor = 10 ** np.floor(np.log10(number(positive.min()) / 2)) if len(positive) else 1e-4
        for algorithm in algorithms:
            seeds = group.filter(pl.col("algorithm") == algorithm).partition_by("seed")
            if not seeds:
                continue
            color = algorithm_color(algorithm)
            for ax, column, low in ((hv_ax, "hypervolume", 0.0), (regret_ax, "hv_regret", floor)):
                curves = np.vstack([step_values(s["cumulative_cost"].to_numpy(),
                                                s[column].to_numpy(), grid) for s in seeds])
                mean, half = mean_band(curves)
                ax.plot(grid, mean, drawstyle="steps-post", color=color, label=algorithm)
                # Both lie in [0, best]: clip the band there (and to the log axis' floor).
                ax.fill_between(grid, np.clip(mean - half, low, best),
                                np.clip(mean + half, low, best), step="post", color=color,
                                alpha=0.08, linewidth=0)
        hv_ax.axhline(best, color="black", linestyle="--", linewidth=0.8)
        hv_ax.annotate("reference front", (grid.max(), best), xytext=(0, 2),
                       textcoords="offset points", ha="right", va="bottom", fontsize=8)
        hv_ax.set_ylabel("hypervolume")
        hv_ax.set_ylim(0, best * 1.08)
        regret_ax.set_ylabel("hypervolume regret")
        regret_ax.set_yscale("log")
        regret_ax.set_ylim(floor, best * 1.3)
        for ax in (hv_ax, regret_ax):
            ax.set_title(f"{objectives}, {device}")
            ax.set_xlabel("cumulative cost (full-fidelity evaluations)")
            ax.set_xlim(0, grid.max())
    n_seeds = runs.group_by("objectives", "device", "algorithm").agg(pl.col("seed").n_unique())
    seeds_text = "/".join(str(s) for s in sorted(set(n_seeds["seed"])))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper",
               title=f"mean ± 95 % CI\n({seeds_text} seeds)")
    return save(fig, out_stem)


@styled
def attainment_surfaces(attainment: pl.DataFrame, out_stem: PathLike,
                        percentile: float = 50.0) -> list[Path]:
    """The ``percentile`` % attainment surface of each algorithm as a step line (both
    objectives minimized), one panel per 2-objective set and device."""
    table = attainment.filter(pl.col("percentile") == percentile).sort(
        "objectives", "device", "algorithm", "x", "y")
    if table.is_empty():
        log.info("attainment_surfaces: skipped, no %g %% surfaces", percentile)
        return []
    panels = table.partition_by("objectives", "device", maintain_order=True, as_dict=True)
    rows, cols = grid_shape(len(panels), 2)
    fig = new_figure(DOUBLE_WIDTH if cols > 1 else SINGLE_WIDTH + 1.1, 2.8 * rows + 0.2)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, ((objectives, device), part) in zip(axes.flat, panels.items(), strict=False):
        right, top = part["x"].max(), part["y"].max()
        for algorithm in algorithm_order(part["algorithm"].unique()):
            sub = part.filter(pl.col("algorithm") == algorithm)
            x = np.concatenate([[sub["x"][0]], sub["x"].to_numpy(), [right]])
            y = np.concatenate([[top], sub["y"].to_numpy(), [sub["y"][-1]]])
            ax.plot(x, y, drawstyle="steps-post", color=algorithm_color(algorithm),
                    linewidth=1.1)
            ax.plot(sub["x"], sub["y"], linestyle="", marker=algorithm_marker(algorithm),
                    markersize=2.5, color=algorithm_color(algorithm))
        ax.set_xlabel(metric_label(part["x_metric"][0]))
        ax.set_ylabel(metric_label(part["y_metric"][0]))
        ax.set_title(f"{objectives}, {device}: {percentile:g} % attainment")
        handles = [Line2D([], [], color=algorithm_color(a), marker=algorithm_marker(a),
                          markersize=3.5) for a in algorithm_order(part["algorithm"].unique())]
        ax.legend(handles, algorithm_order(part["algorithm"].unique()), loc="upper right",
                  ncols=2)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    return save(fig, out_stem)
