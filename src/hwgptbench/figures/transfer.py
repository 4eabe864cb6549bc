"""Figure and table of few-shot transfer: quality on held-out targets against k; where the
stage also evaluated the scale's shipped device tables (rows with ``tables`` = ``shipped``),
Spearman ρ against k of each of those targets, transferred from the other shipped devices."""

from __future__ import annotations

import logging
import math
import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from ..plotting.style import DOUBLE_WIDTH, metric_label, new_figure, number, save, styled

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]
# methods first, then baselines, then the upper bound; fixed colours (Okabe-Ito and greys)
TRANSFER_COLORS = {"ensemble": "#d55e00", "table_prior": "#0072b2", "meta_ridge": "#56b4e9",
                   "source_ridge": "#009e73", "feature_ridge": "#e69f00",
                   "flops_line": "#f0e442", "flops": "#7f7f7f", "params": "#bbbbbb",
                   "nearest_source": "#cc79a7", "full_surrogate": "#000000"}
SELECTION_STYLES: dict[str, LineStyleType] = {"designed": "-", "random": "--"}
SHIPPED = "shipped"  # the transfer stage's ``tables`` of the shipped device tables' rows
HOLD_OUT_LABELS = {"target": "sources: all other targets",
                   "device": "sources: other devices only"}
# (score, statistic, title): a 2 x 2 block of panels per metric
PANELS = (("spearman", "median", "median Spearman ρ"),
          ("within_10pct", "median", "median fraction within ±10%"),
          ("spearman", "worst", "worst-target Spearman ρ"),
          ("within_10pct", "worst", "worst-target fraction within ±10%"))


def _order(methods: list[str]) -> list[str]:
    known = list(TRANSFER_COLORS)
    return sorted(set(methods), key=lambda m: (known.index(m) if m in known else len(known), m))


def _not_evaluated(quality: pl.DataFrame, out_stem: PathLike) -> list[Path]:
    """A figure that says why nothing was evaluated."""
    reasons = quality.filter(pl.col("method").is_null()).select("metric", "reason").unique()
    text = "\n".join(f"{m}: {r}" for m, r in reasons.sort("metric", "reason").iter_rows())
    fig = new_figure(DOUBLE_WIDTH, 1.6)
    ax = fig.subplots()
    ax.axis("off")
    ax.text(0.5, 0.5, "few-shot transfer not evaluated\n" + text, ha="center", va="center",
            wrap=True)
    return save(fig, out_stem)


def _of_shipped(table: pl.DataFrame, shipped: bool) -> pl.DataFrame:
    """The rows of the shipped device tables (or the others; tables without the column have
    none of them)."""
    if "tables" not in table.columns:
        return table if not shipped else table.clear()
    is_shipped = pl.col("tables") == SHIPPED
    return table.filter(is_shipped if shipped else ~is_shipped)


def shipped_targets(quality: pl.DataFrame) -> pl.DataFrame:
    """Per shipped target, method, selection and k: Spearman ρ, mean over seeds."""
    ok = _of_shipped(quality, True).filter(pl.col("status") == "ok",
                                           pl.col("method").is_not_null())
    keys = ["metric", "device", "condition", "source_devices", "method", "selection", "k"]
    return ok.group_by(keys).agg(pl.col("spearman").mean()).sort(keys, nulls_last=True)


def _lines(ax: Axes, part: pl.DataFrame, column: str, methods: list[str]) -> None:
    """One line per method and selection against k; a method without k as a dotted level."""
    for method in methods:
        lines = part.filter(pl.col("method") == method)
        if lines.is_empty():
            continue
        if lines["k"].is_null().all():  # the upper bound: one level for every k
            ax.axhline(lines[column][0], color=TRANSFER_COLORS.get(method, "#000000"),
                       linestyle=":", linewidth=1.2)
            continue
        for (selection,), line in lines.group_by("selection", maintain_order=True):
            line = line.sort("k")
            ax.plot(line["k"], line[column], color=TRANSFER_COLORS.get(method),
                    linestyle=SELECTION_STYLES.get(selection, "-."), marker="o",
                    markersize=2.5)


def _k_axis(ax: Axes, ks: list[int]) -> None:
    if not ks:
        ax.text(0.5, 0.5, "no k leaves transfer.min_test archs to test",
                transform=ax.transAxes, ha="center", va="center")
    ax.set_xscale("log")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()


@styled
def transfer_quality(summary: pl.DataFrame, quality: pl.DataFrame, out_stem: PathLike
                     ) -> list[Path]:
    """Median and worst (over held-out targets) Spearman ρ and fraction within ±10% against k:
    one line per method and baseline (solid: designed selection, dashed: random), the full
    per-target surrogate as a dotted level; a row of panels per metric. Then, where the stage
    evaluated shipped device tables, Spearman ρ against k per shipped target (sources: the
    other shipped devices). ``summary`` is the transfer stage's (every k), ``quality`` its
    per-target rows."""
    shipped = shipped_targets(quality)
    summary = _of_shipped(summary, False)
    if summary.is_empty() and shipped.is_empty():
        log.info("transfer_quality: no evaluated target")
        return _not_evaluated(quality, out_stem)
    blocks = summary.select("metric", "hold_out").unique().sort("metric", "hold_out",
                                                                 descending=[False, True])
    targets = shipped.select("metric", "device", "condition", "source_devices").unique(
        maintain_order=True)
    shipped_rows = sum(math.ceil(n / 2) for n in targets.group_by("metric").len()["len"])
    note = int(summary.is_empty())  # a row saying why the results' targets are missing
    rows = 2 * blocks.height + shipped_rows + note
    fig = new_figure(DOUBLE_WIDTH, 2.2 * (rows - 0.6 * note) + 0.7)
    axes = fig.subplots(rows, 2, squeeze=False,
                        gridspec_kw={"height_ratios": [0.4] * note + [1] * (rows - note)})
    methods = _order([*summary["method"].to_list(), *shipped["method"].to_list()])
    ks = sorted({*summary["k"].drop_nulls(), *shipped["k"].drop_nulls()})
    if note:
        reasons = _of_shipped(quality, False).filter(pl.col("method").is_null()).select(
            "metric", "reason").unique().sort("metric", "reason")
        for ax in axes[0]:
            ax.axis("off")
        text = "\n".join(textwrap.fill(f"{m}: {r}", 110) for m, r in reasons.iter_rows())
        axes[0][0].text(0, 0.5, f"the workflow's targets: not evaluated\n{text}", ha="left",
                        va="center", fontsize=6.5).set_in_layout(False)
    for block, (metric, hold_out) in enumerate(blocks.iter_rows()):
        part = summary.filter(pl.col("metric") == metric, pl.col("hold_out") == hold_out)
        heading = (f"{metric_label(metric)}, {int(number(part['targets'].max()))} held-out "
                   f"targets, {HOLD_OUT_LABELS.get(hold_out, hold_out)}")
        block_axes = axes[note + 2 * block:note + 2 * block + 2].flat
        for ax, (score, statistic, title) in zip(block_axes, PANELS, strict=True):
            column = f"{score}_{statistic}"
            _lines(ax, part, column, methods)
            _k_axis(ax, ks)
            ax.set_title(f"{heading}\n{title}", fontsize=7.5)
            if score == "within_10pct":
                ax.set_ylim(-0.02, 1.02)
        for ax in axes[note + 2 * block + 1]:
            ax.set_xlabel("k (measured archs of the held-out target)")
    shipped_axes = list(axes[note + 2 * blocks.height:].flat)
    used = 0
    for (metric,), of_metric in targets.group_by("metric", maintain_order=True):
        for i, (_, device, condition, sources) in enumerate(of_metric.iter_rows()):
            ax = shipped_axes[used + i]
            part = shipped.filter(pl.col("metric") == metric, pl.col("device") == device,
                                  pl.col("condition") == condition)
            _lines(ax, part, "spearman", methods)
            _k_axis(ax, ks)
            ax.set_title(f"shipped: {device}, {condition}\nfrom {sources}",
                         fontsize=6.5)
            ax.set_ylabel(f"{metric_label(metric)}: Spearman ρ", fontsize=7)
            ax.set_xlabel("k (measured archs of the held-out target)")
        used += 2 * math.ceil(of_metric.height / 2)
        if of_metric.height % 2:
            shipped_axes[used - 1].axis("off")
    handles = [Line2D([], [], color=TRANSFER_COLORS.get(m), linestyle=":" if
                      m == "full_surrogate" else "-") for m in methods]
    handles += [Line2D([], [], color="#444444", linestyle=s) for s in SELECTION_STYLES.values()]
    labels = [m.replace("_", " ") for m in methods] + [f"{s} selection" for s in SELECTION_STYLES]
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 5))
    return save(fig, out_stem)


def transfer_table(summary: pl.DataFrame, quality: pl.DataFrame) -> pl.DataFrame:
    """The report's table: per tables (the workflow's results, or the shipped device tables),
    metric, method or baseline and selection at one k (the summary's ``reported`` rows),
    median and worst over held-out targets; or why nothing was evaluated."""
    summary = summary.filter("reported")
    origin = ["tables"] if "tables" in summary.columns else []
    if summary.is_empty():
        return quality.filter(pl.col("method").is_null()).select(
            *[c for c in origin if c in quality.columns], "metric", "hold_out", "status",
            "reason").unique(maintain_order=True)
    columns = ["spearman", "kendall_tau", "within_10pct", "mdape"]
    return summary.select(
        *origin, "metric", "hold_out", "method", "kind", "selection", "k", "targets",
        *(pl.col(f"{c}_{s}").round(4).alias(f"{c} {s}") for c in columns
          for s in ("median", "worst"))).with_columns(
        pl.col("k").cast(pl.String).fill_null("all"))

