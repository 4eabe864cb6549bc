"""Figures of the search results: anytime hypervolume (against evaluations and against wall
time), attainment surfaces, critical-difference diagrams and EAF differences."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.collections import PatchCollection
from matplotlib.colors import Colormap, LinearSegmentedColormap, Normalize
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
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


def matplotlib_colormap(name: str) -> Colormap:
    """A registered colormap, its lightest tenth left out (so that small differences show)."""
    base = colormaps[name]
    return LinearSegmentedColormap.from_list(f"{name}_cut", base(np.linspace(0.1, 1.0, 256)))


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


@styled
def hypervolume_time(runs: pl.DataFrame, out_stem: PathLike, points: int = 200) -> list[Path]:
    """Hypervolume regret (log) against the wall time each run had spent (log; before its
    first evaluation a run's regret is the whole reference hypervolume), mean over seeds with
    a 95 % confidence band, one panel per (objectives, device): the comparison at
    equal wall time, which charges each algorithm its own overhead (model fits, acquisition)
    besides the queries. Runs without ``elapsed_s`` are skipped."""
    if "elapsed_s" not in runs.columns or runs["elapsed_s"].is_null().all():
        log.info("hypervolume_time: skipped, no wall times")
        return []
    runs = runs.drop_nulls("elapsed_s").sort("objectives", "device", "algorithm", "seed",
                                             "evaluation")
    groups = runs.partition_by("objectives", "device", maintain_order=True, as_dict=True)
    rows, cols = grid_shape(len(groups), 2)
    fig = new_figure(DOUBLE_WIDTH if cols > 1 else SINGLE_WIDTH + 1.1, 2.6 * rows + 0.3)
    axes = fig.subplots(rows, cols, squeeze=False)
    algorithms = algorithm_order(runs["algorithm"].unique())
    for ax, ((objectives, device), group) in zip(axes.flat, groups.items(), strict=False):
        elapsed = group["elapsed_s"].to_numpy()
        start = max(float(elapsed[elapsed > 0].min()), 1e-4)
        grid = np.geomspace(start, float(elapsed.max()), points)
        positive = group.filter(pl.col("hv_regret") > 0)["hv_regret"]
        floor = 10 ** np.floor(np.log10(number(positive.min()) / 2)) if len(positive) else 1e-4
        best = float((group["hypervolume"] + group["hv_regret"]).max())
        for algorithm in algorithms:
            seeds = group.filter(pl.col("algorithm") == algorithm).partition_by("seed")
            if not seeds:
                continue
            curves = np.vstack([step_values(s["elapsed_s"].to_numpy(),
                                            s["hv_regret"].to_numpy(), grid) for s in seeds])
            curves = np.where(np.isnan(curves), best, curves)  # nothing found yet: all regret
            # after its last evaluation a run keeps its final regret (a step function)
            ends = np.array([s["elapsed_s"][-1] for s in seeds])
            finals = np.array([s["hv_regret"][-1] for s in seeds])
            mean, half = mean_band(curves)
            color = algorithm_color(algorithm)
            ax.plot(grid, mean, drawstyle="steps-post", color=color, label=algorithm)
            ax.fill_between(grid, np.clip(mean - half, floor, best),
                            np.clip(mean + half, floor, best), step="post", color=color,
                            alpha=0.08, linewidth=0)
            ax.plot(np.median(ends), np.mean(finals), marker=algorithm_marker(algorithm),
                    color=color, markersize=3.5, linestyle="")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(floor, best * 1.3)
        ax.set_xlabel("wall time of the run (s)")
        ax.set_ylabel("hypervolume regret")
        ax.set_title(f"{objectives}, {device}")
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper",
               title="mean ± 95 % CI\n(marker: end of run)")
    return save(fig, out_stem)


@styled
def critical_difference(friedman: pl.DataFrame, ranks: pl.DataFrame,
                        out_stem: PathLike) -> list[Path]:
    """Critical-difference diagrams (Demšar 2006), one per (objectives, device): each
    algorithm at its mean rank over the seeds (1 is best), the Nemenyi critical difference as
    a bar, and a thick line joining every group of algorithms whose mean ranks differ by less
    than it (not significantly different); the Friedman test's p-value in the title."""
    if friedman.is_empty():
        log.info("critical_difference: skipped, no rank tests")
        return []
    tests = friedman.sort("objectives", "device").rows(named=True)
    fig = new_figure(DOUBLE_WIDTH, 1.9 * len(tests) + 0.2)
    axes = fig.subplots(len(tests), 1, squeeze=False)[:, 0]
    for ax, test in zip(axes, tests, strict=True):
        part = ranks.filter((pl.col("objectives") == test["objectives"])
                            & (pl.col("device") == test["device"])).sort("mean_rank",
                                                                         "algorithm")
        names, mean = part["algorithm"].to_list(), part["mean_rank"].to_numpy()
        k, cd = len(names), float(test["critical_difference"])
        ax.set_xlim(k + 0.3, 0.7)  # rank 1 (best) on the right
        ax.axis("off")
        ax.hlines(0, 1, k, color="black", linewidth=0.8)
        for r in range(1, k + 1):
            ax.vlines(r, 0, 0.12, color="black", linewidth=0.8)
            ax.text(r, 0.2, str(r), ha="center", va="bottom", fontsize=7.5)
        ax.hlines(1.1, 1, 1 + cd, color="black", linewidth=1.2)
        ax.vlines([1, 1 + cd], 1.03, 1.17, color="black", linewidth=1.2)
        ax.text(1 + cd / 2, 1.2, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=7.5)
        # maximal groups of consecutive algorithms whose rank spread is below the CD
        cliques: list[tuple[int, int]] = []
        for i in range(k):
            j = max(j for j in range(i, k) if mean[j] - mean[i] < cd)
            if j > i and not any(a <= i and j <= b for a, b in cliques):
                cliques.append((i, j))
        for level, (i, j) in enumerate(cliques):
            ax.hlines(-0.1 - 0.09 * level, mean[i] - 0.03, mean[j] + 0.03, color="black",
                      linewidth=2.2)
        top = -0.25 - 0.09 * len(cliques)
        half = (k + 1) // 2
        for i, (name, rank) in enumerate(zip(names, mean, strict=True)):
            right = i < half  # the better half labelled on the right
            depth = top - 0.4 * (i if right else k - 1 - i)
            end = 0.75 if right else k + 0.25
            ax.plot([rank, rank, end], [0, depth, depth], color=algorithm_color(name),
                    linewidth=0.9)
            ax.text(end + (-0.05 if right else 0.05), depth, f"{name} ({rank:.2f})",
                    ha="left" if right else "right", va="center", fontsize=7.5,
                    color=algorithm_color(name))
        ax.set_ylim(top - 0.4 * ((k + 1) // 2) - 0.1, 1.45)
        p = test["p_value"]
        ax.set_title(f"{test['objectives']}, {test['device']}: {test['seeds']} seeds, "
                     f"Friedman p = {p:.2g}" if p == p else
                     f"{test['objectives']}, {test['device']}: {test['seeds']} seeds")
    return save(fig, out_stem)


@styled
def eaf_difference(eafdiff: pl.DataFrame, out_stem: PathLike) -> list[Path]:
    """Where the two best algorithms differ: the regions that each attains in a larger share of
    its seeds than the other (left: the first algorithm better, right: the second), shaded by
    the difference in the share of seeds, one row per 2-objective set and device; a figure that
    says so where there is no difference (the workflow's output exists either way)."""
    if eafdiff.is_empty():
        log.info("eaf_difference: no EAF difference to draw")
        fig = new_figure(DOUBLE_WIDTH, 1.2)
        ax = fig.subplots()
        ax.axis("off")
        ax.text(0.5, 0.5, "no EAF difference: the two best algorithms attain the same regions, "
                "or no 2-objective set has two algorithms", ha="center", va="center", wrap=True)
        return save(fig, out_stem)
    panels = eafdiff.partition_by("objectives", "device", maintain_order=True, as_dict=True)
    fig = new_figure(DOUBLE_WIDTH, 2.7 * len(panels) + 0.3)
    axes = fig.subplots(len(panels), 2, squeeze=False)
    cmap = matplotlib_colormap("Greys")
    for row, ((objectives, device), part) in zip(axes, panels.items(), strict=True):
        finite = part.select("x_low", "y_low", "x_high", "y_high").to_numpy()
        lows = finite[:, :2]
        highs = np.where(np.isfinite(finite[:, 2:]), finite[:, 2:], np.nan)
        right = np.nanmax(np.column_stack([lows[:, 0], highs[:, 0]]))
        top = np.nanmax(np.column_stack([lows[:, 1], highs[:, 1]]))
        x_pad = (right - lows[:, 0].min()) * 0.05
        y_pad = (top - lows[:, 1].min()) * 0.05
        names = (part["algorithm_a"][0], part["algorithm_b"][0])
        for ax, sign, name in zip(row, (1, -1), names, strict=True):
            side = part.filter(pl.col("difference") * sign > 0)
            box = side.select("x_low", "y_low", "x_high", "y_high").to_numpy()
            box[:, 2] = np.where(np.isfinite(box[:, 2]), box[:, 2], right + x_pad)
            box[:, 3] = np.where(np.isfinite(box[:, 3]), box[:, 3], top + y_pad)
            ax.add_collection(PatchCollection(
                [Rectangle((x0, y0), x1 - x0, y1 - y0) for x0, y0, x1, y1 in box],
                facecolors=cmap(side["difference"].abs().to_numpy()), edgecolors="none",
                rasterized=True))  # thousands of rectangles: an image inside the SVG
            ax.set_xlim(lows[:, 0].min() - x_pad, right + x_pad)
            ax.set_ylim(lows[:, 1].min() - y_pad, top + y_pad)
            ax.set_xlabel(metric_label(part["x_metric"][0]))
            ax.set_ylabel(metric_label(part["y_metric"][0]))
            ax.set_title(f"{objectives}, {device}: {name} better", color=algorithm_color(name))
    mappable = ScalarMappable(Normalize(0, 1), cmap)
    fig.colorbar(mappable, ax=axes.ravel().tolist(), shrink=0.8,
                 label="difference in the share of seeds attaining")
    return save(fig, out_stem)
