"""Out-of-fold quality of surrogate candidates on one device table, side by side.

    python benchmarks/surrogate_families.py --measurements results/tiny/measure/DEVICE.parquet \
        [--runtime results/tiny/runtime/DEVICE.parquet] [--params params.yaml]

Fits, as the `surrogates_device` rule does, every family the params name (and the linear
family) with their blend, then LightGBM with linear leaves (``linear_tree``), into temporary
folders. Prints per (metric, condition, rows) the share of archs
within ±5% and ±10% and the MdAPE of each candidate, which one the selection takes, and a
summary per candidate over the targets with ≥ 100 archs and with fewer.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import device_table
import polars as pl

from hwgptbench.params import section_of
from hwgptbench.predictors import fitting as surrogates
from hwgptbench.settings.sections import SurrogateSettings

VARIANTS = {  # name -> (families, LightGBM parameters added); None: the params' and linear
    "params": (None, {}),
    "linear_tree": (["lightgbm"], {"linear_tree": True}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    device_table.add_arguments(parser)
    args = parser.parse_args()
    config, space, vocab, table = device_table.load(args)
    base = config["surrogate"]
    tables = []
    for name, (families, lightgbm) in VARIANTS.items():
        section = {**base, "lightgbm": {**base["lightgbm"], **lightgbm},
                   "families": families or list(dict.fromkeys([*base["families"], "linear"]))}
        with tempfile.TemporaryDirectory() as out:
            quality = surrogates.fit_device(section_of(SurrogateSettings, section),
                                            space, vocab, table, Path(out) / "m")
        if name == "linear_tree":
            quality = quality.with_columns(family=pl.lit("lightgbm_linear_tree"))
        tables.append(quality.filter(pl.col("status") == "ok").with_columns(variant=pl.lit(name)))
    quality = pl.concat(tables)
    candidates = quality.filter((pl.col("variant") == "params")
                                | (pl.col("family") == "lightgbm_linear_tree"))
    candidates = surrogates.mark_selected(candidates.drop("selected"))
    with pl.Config(tbl_rows=500, tbl_cols=12, tbl_width_chars=200, float_precision=3):
        print(candidates.select("metric", "condition", "rows", "family", "within_5pct",
                                "within_10pct", "mdape", "coverage", "selected")
              .sort("metric", "condition", "family"))
        summary = candidates.with_columns(size=pl.when(pl.col("rows") >= 100).then(
            pl.lit(">=100 archs")).otherwise(pl.lit("<100 archs"))).group_by(
            "size", "family").agg(targets=pl.len(), within_5pct=pl.col("within_5pct").mean(),
                                  min_within_5pct=pl.col("within_5pct").min(),
                                  within_10pct=pl.col("within_10pct").mean(),
                                  min_within_10pct=pl.col("within_10pct").min(),
                                  mdape=pl.col("mdape").median(),
                                  coverage=pl.col("coverage").mean(),
                                  selected=pl.col("selected").sum())
        print(summary.sort("size", "family"))


if __name__ == "__main__":
    main()
