"""Figure and tables of the compression stage: dense vs found sub-networks vs quantized vs
pruning baselines, and the search's edge over each baseline (over fine-tune seeds)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from scipy import stats

from ..plotting.style import (
    DOUBLE_WIDTH,
    algorithm_color,
    algorithm_marker,
    new_figure,
    save,
    styled,
)

PathLike = str | os.PathLike[str]
# the pruning baselines at the size of each pick (hwgptbench.compress.baselines): marker, colour
BASELINES = {"uniform_width": ("v", "C4"), "depth": ("^", "C5"), "wanda": ("D", "C6")}
# cost column, axis label, scale, the subnets' Pareto flag of that cost
COSTS = (("params", "parameters (M)", 1e-6, "pareto_ppl-params"),
         ("tokens_per_s", "prefill throughput (k tokens/s)", 1e-3, "pareto_ppl-latency"))
QUALITIES = (("perplexity", "validation perplexity"), ("accuracy", "cloze accuracy"))
# a baseline's training (compress.table.baseline_finetune) -> filled; those without training
# after pruning (none) are in the table only: far above the rest, they would squash the axes
FINETUNE_FILLED = {"equal": True, "supernet": False}
SUMMARY_COLUMNS = ("model", "arch_id", "baseline", "finetune", "matched_to", "quant", "params",
                   "size_mb", "latency_ms", "tokens_per_s", "perplexity", "accuracy", "size_x",
                   "throughput_x", "perplexity_rel_change", "accuracy_change",
                   "throughput_x_vs_pretrained", "perplexity_rel_change_vs_pretrained")


@styled
def compression_figure(table: pl.DataFrame, subnets: pl.DataFrame, runs: pl.DataFrame,
                       out_stem: PathLike) -> list[Path]:
    """Perplexity (top) and cloze accuracy (bottom) against parameters (a Wanda model's
    nonzeros) and against prefill throughput: every evaluated sub-network (grey), those each
    algorithm found (its markers), the search's Pareto front of that cost (line), the dense
    model (star), the table's picks as is and quantized (outlined) and the pruning baselines
    at each searched pick's size (:data:`BASELINES`; filled: fine-tuned with the supernet's
    budget after pruning, outlined: pruned from the fine-tuned largest)."""
    fig = new_figure(DOUBLE_WIDTH, 5.4)
    axes = fig.subplots(len(QUALITIES), len(COSTS), squeeze=False)
    for row, (quality, quality_label) in enumerate(QUALITIES):
        for column, (cost, cost_label, scale, front) in enumerate(COSTS):
            ax = axes[row][column]
            _panel(ax, table, subnets, runs, quality, cost, scale, front)
            ax.set_xlabel(cost_label)
            ax.set_ylabel(quality_label)
            ax.grid(alpha=0.3)
    legend: dict[str, Artist] = {}
    for ax in axes.flat:  # squares appear on the throughput panels only
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncol=4,
               frameon=False)
    return save(fig, out_stem)


def _panel(ax: Axes, table: pl.DataFrame, subnets: pl.DataFrame, runs: pl.DataFrame,
           quality: str, cost: str, scale: float, front: str) -> None:
    """One panel of :func:`compression_figure`: ``quality`` against ``cost``."""
    known = subnets.filter(pl.col(cost).is_not_null() & pl.col(quality).is_not_null())
    ax.scatter(known[cost] * scale, known[quality], s=6, color="0.75",
               label="evaluated sub-networks", zorder=1)
    for algorithm in runs["algorithm"].unique(maintain_order=True):
        found = known.join(runs.filter(pl.col("algorithm") == algorithm)
                           .select("arch_id").unique(), on="arch_id")
        ax.scatter(found[cost] * scale, found[quality], s=10, marker=algorithm_marker(algorithm),
                   color=algorithm_color(algorithm), alpha=0.6, label=f"{algorithm} evaluations",
                   zorder=2)
    if quality == "perplexity" and front in known.columns:  # the fronts are of perplexity
        pareto = known.filter(pl.col(front)).sort(cost)
        ax.plot(pareto[cost] * scale, pareto[quality], color="black", lw=0.8,
                drawstyle="steps-post", label="search's Pareto front", zorder=2)
    picked = table.filter(pl.col("baseline").is_in(["dense", "search"])
                          & (pl.col("model") != "dense") & pl.col(quality).is_not_null())
    for quant, marker in (("none", "o"), *[(q, "s") for q in table["quant"].unique()
                                          if q != "none"]):
        if cost == "params" and quant != "none":
            continue  # quantization keeps the parameter count
        rows = picked.filter(pl.col("quant") == quant)
        ax.scatter(rows[cost] * scale, rows[quality], s=40, marker=marker, facecolors="none",
                   edgecolors="black", zorder=3, label=f"table picks ({quant})")
    for baseline, (marker, color) in BASELINES.items():
        for finetune, filled in FINETUNE_FILLED.items():
            rows = table.filter((pl.col("baseline") == baseline) & pl.col(quality).is_not_null()
                                & (pl.col("finetune") == finetune))
            ax.scatter(rows[cost] * scale, rows[quality], s=36, marker=marker,
                       facecolors=color if filled else "none", edgecolors=color, zorder=3,
                       label=f"{baseline} ({finetune})")
    dense = table.filter((pl.col("model") == "dense") & (pl.col("quant") == "none"))
    ax.scatter(dense[cost] * scale, dense[quality], s=120, marker="*", color="C3", zorder=4,
               label="dense model")


def compression_summary(table: pl.DataFrame) -> pl.DataFrame:
    """The compression table's columns, in reading order; unsupported methods keep their
    reason."""
    columns = [c for c in SUMMARY_COLUMNS if c in table.columns]
    summary = table.select(*columns, "reason")
    return summary.with_columns(pl.col(c).cast(pl.Float64) for c in columns
                                if summary.schema[c].is_numeric() and c != "params")


EDGES = ("perplexity_vs_search", "accuracy_vs_search", "throughput_vs_search")


def _edges(table: pl.DataFrame) -> pl.DataFrame:
    """For each searched pick and each baseline at its size, of one compression table: the
    baseline's perplexity relative to the pick's (> 0: the search's sub-network is better), its
    accuracy minus the pick's, and its throughput relative to the pick's; unquantized rows."""
    plain = table.filter(pl.col("quant") == "none")
    picks = plain.filter(pl.col("baseline") == "search").select(
        pl.col("model").alias("matched_to"), pl.col("params").alias("pick_params"),
        pl.col("perplexity").alias("pick_perplexity"), pl.col("accuracy").alias("pick_accuracy"),
        pl.col("latency_ms").alias("pick_latency_ms"))
    rows = plain.filter(pl.col("matched_to").is_not_null()).join(picks, on="matched_to")
    return rows.select(
        "matched_to", "baseline", "finetune", "pick_params", "params", "pick_perplexity",
        "perplexity",
        ((pl.col("perplexity") - pl.col("pick_perplexity")) / pl.col("pick_perplexity"))
        .alias(EDGES[0]),
        (pl.col("accuracy") - pl.col("pick_accuracy")).alias(EDGES[1]),
        (pl.col("pick_latency_ms") / pl.col("latency_ms")).alias(EDGES[2]),
    )


def search_edge(tables: Sequence[pl.DataFrame], level: float = 0.95) -> pl.DataFrame:
    """The search's edge over each baseline at matched size (:func:`_edges`), over the
    compression tables of one or more fine-tune seeds: per (pick label, baseline, training)
    the mean over the seeds and its Student-t interval at ``level`` (``_lo``, ``_hi``; null
    with one seed); sizes and perplexities are means too."""
    edges = [_edges(table).with_columns(seed=pl.lit(i)) for i, table in enumerate(tables)
             if "matched_to" in table.columns]
    rows = pl.concat(edges) if edges else pl.DataFrame()
    if rows.is_empty():
        return pl.DataFrame({"note": ["no baseline rows (compression table without them)"]})
    columns = ("pick_params", "params", "pick_perplexity", "perplexity")
    summary = rows.group_by("matched_to", "baseline", "finetune", maintain_order=True).agg(
        pl.col("seed").n_unique().alias("seeds"), *[pl.col(c).mean() for c in columns],
        *[pl.col(edge).mean() for edge in EDGES],
        *[pl.col(edge).std().alias(f"{edge}_std") for edge in EDGES])
    seeds = summary["seeds"].to_numpy()
    quantile = np.where(seeds > 1, stats.t.ppf((1 + level) / 2, np.maximum(seeds - 1, 1)),
                        np.nan)
    half = {edge: pl.Series(quantile) * summary[f"{edge}_std"] / np.sqrt(seeds)
            for edge in EDGES}
    return summary.with_columns(
        *[(pl.col(edge) + sign * half[edge]).fill_nan(None).alias(f"{edge}_{side}")
          for edge in EDGES for side, sign in (("lo", -1), ("hi", 1))],
    ).drop(f"{edge}_std" for edge in EDGES).sort("matched_to", "finetune", "baseline")
