"""The surrogates stage's merge: the quality tables of a scale's fits (perplexity's and every
device's) as one table, its fitted rows as nested JSON for `dvc metrics`, and the out-of-fold
predictions beside it. The fits themselves are :mod:`hwgptbench.predictors.fitting`'s."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from ..io import atomic_write_json, write_parquet
from ..outputs import check_replaceable
from ..predictors.fitting import SCORES


def merge_quality(paths: Sequence[str | Path], scale: str,
                  out_table: str | os.PathLike[str], out_metrics: str | os.PathLike[str]
                  ) -> pl.DataFrame:
    """One quality table of a scale, and its fitted rows as nested JSON for `dvc metrics`;
    the predictions tables beside the inputs are merged beside ``out_table`` too."""
    predictions = pl.concat([pl.read_parquet(Path(p).with_name("predictions.parquet"))
                             for p in paths])
    for path in (Path(out_table).with_name("predictions.parquet"), out_table, out_metrics):
        check_replaceable(path)  # all three before any is written
    write_parquet(predictions, Path(out_table).with_name("predictions.parquet"))
    # diagonal: a table fitted before a column existed (e.g. the versions) merges with nulls
    quality = pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed").sort(
        "metric", "device", "condition", "family")
    write_parquet(quality.with_columns(scale=pl.lit(scale)), out_table)
    metrics: dict[str, Any] = {}
    for row in quality.filter(pl.col("status") == "ok").iter_rows(named=True):
        node = metrics.setdefault(row["metric"], {}).setdefault(row["device"], {})
        node.setdefault(row["condition"], {})[row["family"]] = {
            **{k: round(row[k], 4) for k in SCORES if k != "rows"}, "selected": row["selected"]}
    atomic_write_json(out_metrics, metrics)
    return quality
