"""Figures of the benchmark itself: trade-offs, device agreement, dimension effects, training."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from scipy.stats import kendalltau

from ..moo.hypervolume import pareto_mask
from ..plotting.style import (
    CLOUD_COLOR,
    DOUBLE_WIDTH,
    FRONT_COLOR,
    KIND_COLORS,
    SINGLE_WIDTH,
    cycle_colors,
    grid_shape,
    metric_label,
    new_figure,
    number,
    save,
    styled,
)
from ..schema import fully_trained
from ..space import Arch

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


def measured(measurements: pl.DataFrame) -> pl.DataFrame:
    """The ok rows of a measurements table with a ``condition`` column
    (``b{batch}-t{seq}-{dtype}-{launch}``, as ``hwgptbench.meters.condition.condition_id``)."""
    return (measurements.filter(pl.col("status") == "ok")
            .with_columns(condition=pl.format("b{}-t{}-{}-{}", "batch_size", "seq_len", "dtype",
                                              "launch"))
            .sort("device", "batch_size", "seq_len", "dtype", "launch", "arch_id"))


def _has_values(table: pl.DataFrame, metric: str, what: str) -> bool:
    """Whether table has a non-null metric column; log why not."""
    if metric not in table.columns or table[metric].null_count() == len(table):
        log.info("%s: skipped, no %s values", what, metric)
        return False
    return True


def _draw_front(ax: Axes, x: np.ndarray, y: np.ndarray, color: str = FRONT_COLOR) -> int:
    """Highlight the Pareto front (both minimized) of points (x, y) as a step line; return its
    size."""
    mask = pareto_mask(np.column_stack([x, y]))
    order = np.argsort(x[mask], kind="stable")
    ax.plot(x[mask][order], y[mask][order], drawstyle="steps-post", color=color, marker="o",
            markersize=3.5, linewidth=1.2, zorder=3)
    return int(mask.sum())


def perplexity_label(perplexity: pl.DataFrame) -> str:
    """Axis label naming where the perplexities come from: the imported repository
    (``source`` column, ``host/owner/name@commit``) or the supernet's training steps."""
    if "source" in perplexity.columns and perplexity["source"].drop_nulls().len():
        repository = perplexity["source"].drop_nulls()[0].split("@")[0].rsplit("/", 1)[-1]
        return f"perplexity (published by {repository})"
    return f"perplexity ({int(number(perplexity['train_steps'].max()))} training steps)"


@styled
def pareto_fronts(perplexity: pl.DataFrame, measurements: pl.DataFrame, out_stem: PathLike,
                  metric: str = "latency_ms") -> list[Path]:
    """Perplexity (largest ``train_steps``) against a hardware metric of every measured arch,
    Pareto front highlighted; one panel per (device, condition)."""
    ppl = fully_trained(perplexity).select("arch_id", "perplexity")
    label = perplexity_label(perplexity)
    table = measured(measurements)
    if not _has_values(table, metric, "pareto_fronts"):
        return []
    table = table.join(ppl, on="arch_id").drop_nulls([metric, "perplexity"])
    panels = table.partition_by("device", "condition", maintain_order=True, as_dict=True)
    rows, cols = grid_shape(len(panels))
    fig = new_figure(DOUBLE_WIDTH if cols > 1 else SINGLE_WIDTH, 2.6 * rows + 0.3)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, ((device, condition), part) in zip(axes.flat, panels.items(), strict=False):
        x, y = part[metric].to_numpy(), part["perplexity"].to_numpy()
        ax.scatter(x, y, s=9, color=CLOUD_COLOR, linewidths=0, zorder=2)
        n_front = _draw_front(ax, x, y)
        ax.set_title(f"{device}\n{condition}\n{n_front} of {len(part)} on the front",
                     fontsize=8)
        ax.set_xlabel(metric_label(metric))
        ax.set_ylabel(label)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    fig.legend([Line2D([], [], color=CLOUD_COLOR, marker="o", linestyle=""),
                Line2D([], [], color=FRONT_COLOR, marker="o")],
               ["measured arch", "Pareto front (both minimized)"], loc="outside lower center",
               ncols=2)
    return save(fig, out_stem)


def metric_columns(table: pl.DataFrame, metric: str, separator: str = "\n") -> pl.DataFrame:
    """The metric of every (device, condition) of ``table`` as one column each, labelled
    ``{device}{separator}{condition}``, one row per arch."""
    return (table.with_columns(column=pl.format(f"{{}}{separator}{{}}", "device", "condition"))
            .drop_nulls(metric)
            .pivot(on="column", index="arch_id", values=metric, aggregate_function="mean"))


def kendall_matrix(wide: pl.DataFrame) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Column labels, Kendall tau and shared-arch counts between every two columns of
    ``wide`` (one row per arch; tau where they share two archs or more)."""
    labels = [c for c in wide.columns if c != "arch_id"]
    values = wide.select(labels).to_numpy().astype(float)
    n = len(labels)
    tau, shared = np.full((n, n), np.nan), np.zeros((n, n), dtype=int)
    for i in range(n):
        for j in range(n):
            both = ~np.isnan(values[:, i]) & ~np.isnan(values[:, j])
            shared[i, j] = both.sum()
            if shared[i, j] >= 2:
                tau[i, j] = kendalltau(values[both, i], values[both, j]).statistic
    return labels, tau, shared


@styled
def device_correlation(measurements: pl.DataFrame, out_stem: PathLike,
                       metric: str = "latency_ms") -> list[Path]:
    """Kendall tau between the arch rankings of every two (device, condition) columns, over the
    archs both measured, as an annotated heatmap."""
    table = measured(measurements)
    if not _has_values(table, metric, "device_correlation"):
        return []
    labels, tau, shared = kendall_matrix(metric_columns(table, metric))
    n = len(labels)
    size = min(DOUBLE_WIDTH - 1.0, 1.6 + 0.8 * n)
    fig = new_figure(size + 1.0, size)
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(tau), cmap="RdBu_r", vmin=-1, vmax=1)
    for i in range(n):
        for j in range(n):
            text = "n/a" if np.isnan(tau[i, j]) else f"{tau[i, j]:.2f}"
            dark = not np.isnan(tau[i, j]) and abs(tau[i, j]) > 0.6
            ax.text(j, i, f"{text}\nn={shared[i, j]}", ha="center", va="center", fontsize=8,
                    color="white" if dark else "black")
    ax.set_xticks(range(n), labels, rotation=30 if n > 1 else 0, ha="right" if n > 1 else "center",
                  rotation_mode="anchor")
    ax.set_yticks(range(n), labels)
    ax.grid(False)
    ax.spines[:].set_visible(False)
    fig.suptitle(f"Kendall τ between arch rankings by {metric_label(metric)}\n"
                 "(n: archs measured in both)")
    fig.colorbar(image, ax=ax, label="Kendall τ", shrink=0.8)
    return save(fig, out_stem)


def _dimensions(arch_ids: pl.Series) -> pl.DataFrame:
    """Per arch id: embed_dim, n_layer and mean MLP ratio, parsed from the id."""
    archs = [Arch.from_id(a) for a in arch_ids]
    return pl.DataFrame({"arch_id": arch_ids,
                         "embed_dim": [a.embed_dim for a in archs],
                         "n_layer": [a.n_layer for a in archs],
                         "mlp_ratio": [float(np.mean(a.mlp_ratio)) for a in archs]})


_DIMENSION_LABELS = {"embed_dim": "embedding dimension", "n_layer": "number of layers",
                     "mlp_ratio": "mean MLP ratio"}


@styled
def dimension_effects(measurements: pl.DataFrame, out_stem: PathLike,
                      metrics: Sequence[str] = ("latency_ms",)) -> list[Path]:
    """Each metric against embed_dim, n_layer (box and points) and mean MLP ratio (points),
    one row per metric, one colour per (device, condition); log y where values span more than
    20x."""
    table = measured(measurements)
    metrics = [m for m in metrics if _has_values(table, m, "dimension_effects")]
    if not metrics:
        return []
    table = table.join(_dimensions(table["arch_id"].unique(maintain_order=True)), on="arch_id")
    groups = table.select(pl.format("{} {}", "device", "condition")).to_series().unique(
        maintain_order=True).to_list()
    colors = cycle_colors(groups)
    table = table.with_columns(group=pl.format("{} {}", "device", "condition"))
    rng = np.random.default_rng(0)
    fig = new_figure(DOUBLE_WIDTH, 2.3 * len(metrics) + (0.4 if len(groups) > 1 else 0.1))
    axes = fig.subplots(len(metrics), 3, squeeze=False)
    width = 0.7 / len(groups)
    for row, metric in zip(axes, metrics, strict=True):
        part = table.drop_nulls(metric)
        for ax, dim in zip(row, ("embed_dim", "n_layer", "mlp_ratio"), strict=True):
            levels = sorted(part[dim].unique().to_list())
            for k, group in enumerate(groups):
                sub = part.filter(pl.col("group") == group)
                color = colors[group]
                if dim == "mlp_ratio":
                    ax.scatter(sub[dim], sub[metric], s=8, color=color, alpha=0.7, linewidths=0)
                    continue
                offset = (k - (len(groups) - 1) / 2) * width
                data = [sub.filter(pl.col(dim) == v)[metric].to_numpy() for v in levels]
                pos = np.arange(len(levels)) + offset
                ax.boxplot(data, positions=pos, widths=width * 0.8, showfliers=False,
                           medianprops={"color": color, "linewidth": 1.5},
                           boxprops={"color": color}, whiskerprops={"color": color},
                           capprops={"color": color})
                for p, values in zip(pos, data, strict=True):
                    jitter = rng.uniform(-width * 0.3, width * 0.3, len(values))
                    ax.scatter(p + jitter, values, s=6, color=color, alpha=0.5, linewidths=0)
            if dim != "mlp_ratio":
                ax.set_xticks(range(len(levels)), [str(v) for v in levels])
            ax.set_xlabel(_DIMENSION_LABELS[dim])
            low, high = number(part[metric].min()), number(part[metric].max())
            if low > 0 and high > 20 * low:
                ax.set_yscale("log")  # conditions an order of magnitude apart
        row[0].set_ylabel(metric_label(metric))
    if len(groups) > 1:
        fig.legend([Line2D([], [], color=colors[g], marker="o", linestyle="") for g in groups],
                   groups, loc="outside lower center", ncols=2)
    else:
        fig.suptitle(groups[0])
    return save(fig, out_stem)


@styled
def pareto_3d(table: pl.DataFrame, metrics: Sequence[str], out_stem: PathLike,
              title: str | None = None) -> list[Path]:
    """3-D scatter of three metric columns of table (all minimized), Pareto points
    highlighted."""
    if len(metrics) != 3:
        raise ValueError(f"pareto_3d needs 3 metrics, got {list(metrics)}")
    for metric in metrics:
        if not _has_values(table, metric, "pareto_3d"):
            return []
    points = table.drop_nulls(list(metrics)).select(metrics).to_numpy().astype(float)
    mask = pareto_mask(points)
    fig = new_figure(SINGLE_WIDTH + 0.6, SINGLE_WIDTH + 0.3)
    ax = fig.add_subplot(projection="3d")
    ax.scatter(*points[~mask].T, s=7, color="#808080", alpha=0.7, linewidths=0,
               label=f"dominated ({int((~mask).sum())})")
    ax.scatter(*points[mask].T, s=14, color=FRONT_COLOR, depthshade=False,
               label=f"Pareto front ({int(mask.sum())})")
    ax.set_xlabel(metric_label(metrics[0]), labelpad=2)
    ax.set_ylabel(metric_label(metrics[1]), labelpad=2)
    ax.set_zlabel(metric_label(metrics[2]), labelpad=2)
    ax.tick_params(pad=0)
    ax.view_init(elev=22, azim=-55)
    ax.set_box_aspect(None, zoom=0.95)
    ax.legend(loc="upper left")
    if title:
        ax.set_title(title)
    return save(fig, out_stem)


@styled
def loss_curve(loss: pl.DataFrame, out_stem: PathLike, smooth: int = 0) -> list[Path]:
    """Supernet training loss per step for each sandwich kind (smallest, largest, random:
    mean of the random archs), raw and as a moving average over ``smooth`` steps (default:
    a fiftieth of the run)."""
    per_step = loss.group_by("step", "kind").agg(pl.col("loss").mean()).sort("kind", "step")
    window = smooth or max(1, per_step["step"].n_unique() // 50)
    kinds = [k for k in KIND_COLORS if k in set(per_step["kind"])] + sorted(
        set(per_step["kind"]) - set(KIND_COLORS))
    colors = {**cycle_colors(kinds), **KIND_COLORS}
    fig = new_figure(SINGLE_WIDTH, 2.5)
    ax = fig.subplots()
    for kind in kinds:
        part = per_step.filter(pl.col("kind") == kind).with_columns(
            smooth=pl.col("loss").rolling_mean(window, min_samples=1))
        ax.plot(part["step"], part["loss"], color=colors[kind], alpha=0.25, linewidth=0.7)
        ax.plot(part["step"], part["smooth"], color=colors[kind], label=kind)
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss (nats/token)")
    ax.legend(title="sandwich arch" + (f"\n(bold: {window}-step moving mean)" if window > 1
                                       else ""), loc="upper right")
    return save(fig, out_stem)
