"""Leave-one-target-out quality of few-shot transfer on given measurement tables; prints the
table at one k (per method and baseline: median and worst Spearman, Kendall τ, ±10 %, MdAPE).

    python benchmarks/transfer_quality.py --scale tiny --data results/data/shakespeare \\
        --k 10 --out /tmp/transfer-quality.parquet TABLE.parquet [TABLE.parquet ...]

Tables are measurement tables (`hwgptbench measure` shards, device tables or
measurements.parquet, and `hwgptbench runtime` tables, whose workloads and options are
conditions of their own), stacked; every (device, condition) in them is a target. The transfer
settings are those of params.yaml (`--params` overrides, as for `hwgptbench`).

`--retest TABLE ...` gives a second measurement of the same targets: each target's
test-retest agreement (the scores of the re-measurement as a prediction of the first) is
printed next to the method's and the full surrogate's scores, with sqrt(retest Spearman), the
approximate ceiling of any predictor's rank agreement with one noisy measurement; then the
whole evaluation is repeated on the geometric mean of both measurements (less noise).
`--third TABLE ...` (with `--retest`) gives a third measurement of some targets: each run's
own reliability then follows without assuming equal noise, corr(truth, first run) ≈
sqrt(ρ_12 ρ_13 / ρ_23), the ceiling of a predictor's Spearman against the first run.
"""

from __future__ import annotations

import argparse
import logging
import time

import polars as pl

from hwgptbench import params
from hwgptbench.io import write_parquet
from hwgptbench.meters.condition import CONDITION_KEYS, with_condition_columns
from hwgptbench.params import section_of
from hwgptbench.settings.sections import TransferSettings
from hwgptbench.space import SearchSpace
from hwgptbench.tokens.shards import TokenShards
from hwgptbench.transfer.evaluate import evaluate, retest, summarize

TABLE_FORMAT = {"tbl_rows": 100, "tbl_cols": 20, "tbl_width_chars": 220, "float_precision": 3,
                "tbl_hide_dataframe_shape": True, "tbl_hide_column_data_types": True}


def _stacked(paths: list[str]) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", help="measurement tables (parquet)")
    parser.add_argument("--scale", default="tiny")
    parser.add_argument("--data", default="results/data/shakespeare",
                        help="data-stage folder (vocabulary size)")
    parser.add_argument("--params", action="append", help="params files (default: params.yaml)")
    parser.add_argument("--k", type=int, default=10, help="k of the printed table")
    parser.add_argument("--out", help="write the full quality table here (parquet)")
    parser.add_argument("--retest", nargs="+", default=[],
                        help="a second measurement of the same targets: noise ceilings")
    parser.add_argument("--third", nargs="+", default=[],
                        help="a third measurement (with --retest): each run's reliability")
    parser.add_argument("--method", default="ensemble",
                        help="method shown per target next to the ceiling (designed selection)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = params.merge_files(args.params or ["params.yaml"], ["transfer", "spaces"])
    section = section_of(TransferSettings, {**config["transfer"],
                                            "ks": sorted({*config["transfer"]["ks"], args.k})})
    space = SearchSpace.from_dict(args.scale, config["spaces"][args.scale])
    vocab_size = TokenShards.open(args.data).manifest["tokenizer"]["vocab_size"]
    table = _stacked(args.tables)
    start = time.perf_counter()
    quality = evaluate(table, space, vocab_size, section)
    seconds = time.perf_counter() - start
    if args.out:
        write_parquet(quality, args.out)
    targets = quality.filter(pl.col("method") == "full_surrogate").select(
        "metric", "device", "condition").unique()
    print(f"{targets.height} targets ({', '.join(sorted(set(targets['device'])))}); "
          f"evaluated in {seconds:.1f} s")
    for row in quality.filter(pl.col("method").is_null()).select(
            "metric", "hold_out", "reason").unique().iter_rows(named=True):
        print(f"{row['metric']} (hold out {row['hold_out'] or 'any'}): not evaluated: "
              f"{row['reason']}")
    _print_summary(quality, args.k)
    if args.retest:
        again = _stacked(args.retest)
        _print_ceilings(quality, retest(table, again, section.metrics), args.k, args.method)
        if args.third:
            _print_reliability(table, again, _stacked(args.third), section.metrics)
        print("the evaluation on the geometric mean of both measurements:")
        _print_summary(evaluate(_geometric_mean(table, again, section.metrics), space,
                                vocab_size, section), args.k)


def _print_reliability(first: pl.DataFrame, second: pl.DataFrame, third: pl.DataFrame,
                       metrics: list[str]) -> None:
    """Pairwise test-retest Spearman of three runs and the first run's reliability."""
    keys = ["metric", "device", "condition"]

    def rho(a: pl.DataFrame, b: pl.DataFrame, name: str) -> pl.DataFrame:
        return retest(a, b, metrics).select(*keys, pl.col("spearman").alias(name))

    table = rho(first, second, "rho_12").join(rho(first, third, "rho_13"), on=keys).join(
        rho(second, third, "rho_23"), on=keys).with_columns(
        (pl.col("rho_12") * pl.col("rho_13") / pl.col("rho_23")).sqrt().alias("ceiling_first"))
    print("three runs: corr(truth, first run) ~ sqrt(rho_12 rho_13 / rho_23):")
    with pl.Config(**TABLE_FORMAT):
        print(table)


def _print_summary(quality: pl.DataFrame, k: int) -> None:
    with pl.Config(**TABLE_FORMAT):
        print(summarize(quality, [k]).select(
            "metric", "hold_out", "method", "kind", "selection", "k", "targets",
            "spearman_median", "spearman_worst", "kendall_tau_median", "kendall_tau_worst",
            "within_10pct_median", "within_10pct_worst", "mdape_median", "mdape_worst"))


def _geometric_mean(first: pl.DataFrame, second: pl.DataFrame, metrics: list[str]
                    ) -> pl.DataFrame:
    """The rows measured ok in both tables, each metric the geometric mean of the two."""
    keys = ["device", *CONDITION_KEYS, "arch_id"]

    def ok(table: pl.DataFrame) -> pl.DataFrame:
        return with_condition_columns(table.filter(pl.col("status") == "ok"))

    present = [m for m in metrics if m in first.columns and m in second.columns]
    again = ok(second).select(*keys, *(pl.col(m).alias(f"{m}_again") for m in present))
    return ok(first).join(again, on=keys).with_columns(
        (pl.col(m) * pl.col(f"{m}_again")).sqrt().alias(m) for m in present)


def _print_ceilings(quality: pl.DataFrame, ceilings: pl.DataFrame, k: int, method: str
                    ) -> None:
    """Per target: the re-measurement's scores next to the method's and the full surrogate's
    (device hold-out where evaluated, else target hold-out); then medians and worsts."""
    hold_out = "device" if quality.filter(pl.col("hold_out") == "device",
                                          pl.col("status") == "ok").height else "target"
    ok = quality.filter(pl.col("status") == "ok", pl.col("hold_out") == hold_out)
    keys = ["metric", "device", "condition"]
    picked = ok.filter(pl.col("method") == method, pl.col("selection") == "designed",
                       pl.col("k") == k).select(*keys, pl.col("spearman").alias("method_rho"),
                                                pl.col("within_10pct").alias("method_10pct"))
    full = ok.filter(pl.col("method") == "full_surrogate").select(
        *keys, pl.col("spearman").alias("full_rho"), pl.col("within_10pct").alias("full_10pct"))
    joined = ceilings.rename({"spearman": "retest_rho", "within_10pct": "retest_10pct"}).join(
        picked, on=keys, how="left").join(full, on=keys, how="left")
    joined = joined.with_columns(pl.col("retest_rho").sqrt().alias("ceiling_rho"))
    columns = ["retest_rho", "ceiling_rho", "method_rho", "full_rho", "retest_10pct",
               "method_10pct", "full_10pct"]
    print(f"noise ceilings (re-measurement as the prediction), {method} designed k = {k}, "
          f"hold out {hold_out}:")
    with pl.Config(**TABLE_FORMAT):
        print(joined.select(*keys, "n", *columns))
        print(joined.group_by("metric").agg(
            *(pl.col(c).median().alias(f"{c}_median") for c in columns),
            *(pl.col(c).min().alias(f"{c}_worst") for c in columns)))


if __name__ == "__main__":
    main()
