"""Figure and table of the compression stage: dense vs found sub-networks vs quantized."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
from matplotlib.artist import Artist

from .style import DOUBLE_WIDTH, algorithm_color, algorithm_marker, new_figure, save, styled

PathLike = str | os.PathLike[str]
# the pruning baselines at the size of each pick (hwgptbench.compress.baselines): marker, colour
BASELINES = {"uniform_width": ("v", "C4"), "depth": ("^", "C5"), "wanda": ("D", "C6")}
COSTS = (("params", "parameters (M)", 1e-6), ("latency_ms", "prefill latency (ms)", 1.0))
SUMMARY_COLUMNS = ("model", "arch_id", "baseline", "matched_to", "quant", "params", "size_mb",
                   "latency_ms", "tokens_per_s", "perplexity", "accuracy", "size_x", "throughput_x",
                   "perplexity_rel_change", "accuracy_change", "throughput_x_vs_pretrained",
                   "perplexity_rel_change_vs_pretrained")


@styled
def compression_figure(table: pl.DataFrame, subnets: pl.DataFrame, runs: pl.DataFrame,
                       out_stem: PathLike) -> list[Path]:
    """Perplexity vs parameters (a Wanda model's nonzeros) and vs latency: every evaluated
    sub-network (grey), the sub-networks each algorithm found (its markers), the dense model
    (star), the table's picks as is and quantized (outlined) and the pruning baselines at each
    searched pick's size (filled)."""
    fig = new_figure(DOUBLE_WIDTH, 3.0)
    axes = fig.subplots(1, len(COSTS))
    dense = table.filter((pl.col("model") == "dense") & (pl.col("quant") == "none"))
    for ax, (cost, label, scale) in zip(axes, COSTS, strict=True):
        known = subnets.filter(pl.col(cost).is_not_null())
        ax.scatter(known[cost] * scale, known["perplexity"], s=6, color="0.75",
                   label="evaluated sub-networks", zorder=1)
        for algorithm in runs["algorithm"].unique(maintain_order=True):
            found = known.join(runs.filter(pl.col("algorithm") == algorithm)
                               .select("arch_id").unique(), on="arch_id")
            ax.scatter(found[cost] * scale, found["perplexity"], s=10,
                       marker=algorithm_marker(algorithm), color=algorithm_color(algorithm),
                       alpha=0.6, label=f"{algorithm} evaluations", zorder=2)
        picked = table.filter(pl.col("baseline").is_in(["dense", "search"])
                              & (pl.col("model") != "dense"))
        for quant, marker in (("none", "o"), *[(q, "s") for q in table["quant"].unique()
                                              if q != "none"]):
            rows = picked.filter((pl.col("quant") == quant) & pl.col("perplexity").is_not_null())
            if cost == "params" and quant != "none":
                continue  # quantization keeps the parameter count
            ax.scatter(rows[cost] * scale, rows["perplexity"], s=40, marker=marker,
                       facecolors="none", edgecolors="black", zorder=3,
                       label=f"table picks ({quant})")
        for baseline, (marker, color) in BASELINES.items():
            rows = table.filter((pl.col("baseline") == baseline)
                                & pl.col("perplexity").is_not_null())
            ax.scatter(rows[cost] * scale, rows["perplexity"], s=36, marker=marker, color=color,
                       zorder=3, label=f"{baseline} at a pick's size")
        ax.scatter(dense[cost] * scale, dense["perplexity"], s=120, marker="*", color="C3",
                   zorder=4, label="dense model")
        ax.set_xlabel(label)
        ax.set_ylabel("validation perplexity")
        ax.grid(alpha=0.3)
    legend: dict[str, Artist] = {}
    for ax in axes:  # squares appear on the latency panel only
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncol=3,
               frameon=False)
    return save(fig, out_stem)


def compression_summary(table: pl.DataFrame) -> pl.DataFrame:
    """The compression table's columns, in reading order; unsupported methods keep their
    reason."""
    columns = [c for c in SUMMARY_COLUMNS if c in table.columns]
    summary = table.select(*columns, "reason")
    return summary.with_columns(pl.col(c).cast(pl.Float64) for c in columns
                                if summary.schema[c].is_numeric() and c != "params")


def search_edge(table: pl.DataFrame) -> pl.DataFrame:
    """For each searched pick and each baseline at its size: the baseline's perplexity
    relative to the pick's (> 0: the search's sub-network is better), its accuracy minus the
    pick's, and its throughput relative to the pick's; unquantized rows only."""
    plain = table.filter(pl.col("quant") == "none")
    if "baseline" not in plain.columns or plain.filter(pl.col("matched_to").is_not_null()
                                                       ).is_empty():
        return pl.DataFrame({"note": ["no baseline rows (compression table without them)"]})
    picks = plain.filter(pl.col("baseline") == "search").select(
        pl.col("model").alias("matched_to"), pl.col("params").alias("pick_params"),
        pl.col("perplexity").alias("pick_perplexity"), pl.col("accuracy").alias("pick_accuracy"),
        pl.col("latency_ms").alias("pick_latency_ms"))
    rows = plain.filter(pl.col("matched_to").is_not_null()).join(picks, on="matched_to")
    return rows.select(
        "matched_to", "baseline", "pick_params", "params", "pick_perplexity", "perplexity",
        ((pl.col("perplexity") - pl.col("pick_perplexity")) / pl.col("pick_perplexity"))
        .alias("perplexity_vs_search"),
        (pl.col("accuracy") - pl.col("pick_accuracy")).alias("accuracy_vs_search"),
        (pl.col("pick_latency_ms") / pl.col("latency_ms")).alias("throughput_vs_search"),
    ).sort("matched_to", "baseline")
