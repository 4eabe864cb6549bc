"""Tables over all search runs of a scale: final hypervolume per run, per-algorithm summary
with ranks, and empirical attainment surfaces (moocore) of the 2-objective runs."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import moocore
import numpy as np
import polars as pl

GROUP = ["objectives", "device", "algorithm"]
PERCENTILES = (0, 25, 50, 75, 100)


def read_runs(folders: Sequence[str | os.PathLike[str]]) -> pl.DataFrame:
    """Every run table ``{seed}.parquet`` in the given algorithm folders, in one table."""
    paths = sorted(p for folder in folders for p in Path(folder).glob("*.parquet"))
    if not paths:
        raise FileNotFoundError(f"no run tables in {[str(f) for f in folders]}")
    return pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed")


def final_runs(runs: pl.DataFrame) -> pl.DataFrame:
    """The last row of each run: final hypervolume and regret, with evaluations and cost,
    and each run's rank among the algorithms of its (objectives, device, seed); 1 is best."""
    final = (runs.sort("evaluation").group_by([*GROUP, "seed"], maintain_order=True)
             .agg(pl.len().alias("evaluations"), pl.col("cumulative_cost").last().alias("cost"),
                  pl.col("hypervolume").last(), pl.col("hv_regret").last())
             .sort([*GROUP, "seed"]))
    return final.with_columns(rank=pl.col("hypervolume").rank("average", descending=True)
                              .over("objectives", "device", "seed"))


def summarize(final: pl.DataFrame) -> pl.DataFrame:
    """Mean and standard deviation of final hypervolume and regret, and mean rank, per
    algorithm of each (objectives, device)."""
    return (final.group_by(GROUP).agg(
        pl.len().alias("runs"), pl.col("hypervolume").mean().alias("hv_mean"),
        pl.col("hypervolume").std().alias("hv_std"),
        pl.col("hv_regret").mean().alias("hv_regret_mean"),
        pl.col("hv_regret").std().alias("hv_regret_std"), pl.col("rank").mean().alias("rank_mean"))
        .sort("objectives", "device", "rank_mean", "algorithm"))


def attainment(runs: pl.DataFrame, metrics: Mapping[str, Sequence[str]],
               percentiles: Sequence[int] = PERCENTILES) -> pl.DataFrame:
    """Empirical attainment surfaces (objective values, raw units) per algorithm of every
    2-objective set: the points attained by at least ``percentile`` % of the seeds."""
    parts = []
    for (objectives, device, algorithm), group in runs.filter(pl.col("full_fidelity")).group_by(
            GROUP, maintain_order=True):
        names = metrics[objectives]
        if len(names) != 2:
            continue
        points = group.select(names).to_numpy()
        _, sets = np.unique(group["seed"].to_numpy(), return_inverse=True)
        surface = moocore.eaf(points, sets=sets + 1, percentiles=list(percentiles))
        parts.append(pl.DataFrame({
            "objectives": objectives, "device": device, "algorithm": algorithm,
            "percentile": surface[:, 2], "x_metric": names[0], "x": surface[:, 0],
            "y_metric": names[1], "y": surface[:, 1]}))
    schema = {"objectives": pl.String, "device": pl.String, "algorithm": pl.String,
              "percentile": pl.Float64, "x_metric": pl.String, "x": pl.Float64,
              "y_metric": pl.String, "y": pl.Float64}
    return pl.concat(parts) if parts else pl.DataFrame(schema=schema)


def metrics_document(summary: pl.DataFrame) -> dict[str, Any]:
    """The summary as nested JSON for `dvc metrics`: objectives -> device -> algorithm."""
    document: dict[str, Any] = {}
    for row in summary.iter_rows(named=True):
        node = document.setdefault(row["objectives"], {}).setdefault(row["device"], {})
        node[row["algorithm"]] = {k: None if row[k] is None else round(row[k], 5)
                                  for k in ("hv_mean", "hv_std", "hv_regret_mean", "rank_mean")}
    return document
