"""Figure and table of few-shot transfer: quality on held-out targets against k."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
from matplotlib.lines import Line2D

from ..plotting.style import DOUBLE_WIDTH, metric_label, new_figure, number, save, styled

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]
# methods first, then baselines, then the upper bound; fixed colours (Okabe-Ito and greys)
TRANSFER_COLORS = {"ridge": "#e69f00", "meta_ridge": "#0072b2", "basis": "#56b4e9",
                   "boost": "#009e73", "flops": "#7f7f7f", "params": "#bbbbbb",
                   "nearest_source": "#cc79a7", "full_surrogate": "#000000"}
SELECTION_STYLES: dict[str, LineStyleType] = {"designed": "-", "random": "--"}
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


@styled
def transfer_quality(summary: pl.DataFrame, quality: pl.DataFrame, out_stem: PathLike
                     ) -> list[Path]:
    """Median and worst (over held-out targets) Spearman ρ and fraction within ±10% against k:
    one line per method and baseline (solid: designed selection, dashed: random), the full
    per-target surrogate as a dotted level; a row of panels per metric. ``summary`` is the
    transfer stage's (every k), ``quality`` its per-target rows."""
    if summary.is_empty():
        log.info("transfer_quality: no evaluated target")
        return _not_evaluated(quality, out_stem)
    blocks = summary.select("metric", "hold_out").unique().sort("metric", "hold_out",
                                                                 descending=[False, True])
    fig = new_figure(DOUBLE_WIDTH, 4.4 * blocks.height + 0.7)
    axes = fig.subplots(2 * blocks.height, 2, squeeze=False)
    methods = _order(summary["method"].to_list())
    ks = sorted(summary["k"].drop_nulls().unique())
    for block, (metric, hold_out) in enumerate(blocks.iter_rows()):
        part = summary.filter(pl.col("metric") == metric, pl.col("hold_out") == hold_out)
        heading = (f"{metric_label(metric)}, {int(number(part['targets'].max()))} held-out "
                   f"targets, {HOLD_OUT_LABELS.get(hold_out, hold_out)}")
        block_axes = axes[2 * block:2 * block + 2].flat
        for ax, (score, statistic, title) in zip(block_axes, PANELS, strict=True):
            column = f"{score}_{statistic}"
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
            if not ks:
                ax.text(0.5, 0.5, "no k leaves transfer.min_test archs to test",
                        transform=ax.transAxes, ha="center", va="center")
            ax.set_xscale("log")
            ax.set_xticks(ks, [str(k) for k in ks])
            ax.minorticks_off()
            ax.set_title(f"{heading}\n{title}", fontsize=7.5)
            if score == "within_10pct":
                ax.set_ylim(-0.02, 1.02)
        for ax in axes[2 * block + 1]:
            ax.set_xlabel("k (measured archs of the held-out target)")
    handles = [Line2D([], [], color=TRANSFER_COLORS.get(m), linestyle=":" if
                      m == "full_surrogate" else "-") for m in methods]
    handles += [Line2D([], [], color="#444444", linestyle=s) for s in SELECTION_STYLES.values()]
    labels = [m.replace("_", " ") for m in methods] + [f"{s} selection" for s in SELECTION_STYLES]
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 5))
    return save(fig, out_stem)


def transfer_table(summary: pl.DataFrame, quality: pl.DataFrame) -> pl.DataFrame:
    """The report's table: per metric, method or baseline and selection at one k (the
    summary's ``reported`` rows), median and worst over held-out targets; or why nothing was
    evaluated."""
    summary = summary.filter("reported")
    if summary.is_empty():
        return quality.filter(pl.col("method").is_null()).select(
            "metric", "hold_out", "status", "reason").unique(maintain_order=True)
    columns = ["spearman", "kendall_tau", "within_10pct", "mdape"]
    return summary.select(
        "metric", "hold_out", "method", "kind", "selection", "k", "targets",
        *(pl.col(f"{c}_{s}").round(4).alias(f"{c} {s}") for c in columns
          for s in ("median", "worst"))).with_columns(
        pl.col("k").cast(pl.String).fill_null("all"))

