"""Leave-one-target-out quality of few-shot transfer on given measurement tables; prints the
table at one k (per method and baseline: median and worst Spearman, Kendall τ, ±10 %, MdAPE).

    python benchmarks/transfer_quality.py --scale tiny --data results/data/shakespeare \\
        --k 10 --out /tmp/transfer-quality.parquet TABLE.parquet [TABLE.parquet ...]

Tables are measurement tables (`hwgptbench measure` shards, device tables or
measurements.parquet), stacked; every (device, condition) in them is a target. The transfer
settings are those of params.yaml (`--params` overrides, as for `hwgptbench`).
"""

from __future__ import annotations

import argparse
import logging
import time

import polars as pl

from hwgptbench import data, params
from hwgptbench.archs import write_table
from hwgptbench.space import SearchSpace
from hwgptbench.transfer import evaluate, summarize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", help="measurement tables (parquet)")
    parser.add_argument("--scale", default="tiny")
    parser.add_argument("--data", default="results/data/shakespeare",
                        help="data-stage folder (vocabulary size)")
    parser.add_argument("--params", action="append", help="params files (default: params.yaml)")
    parser.add_argument("--k", type=int, default=10, help="k of the printed table")
    parser.add_argument("--out", help="write the full quality table here (parquet)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = params.merge_files(args.params or ["params.yaml"], ["transfer", "spaces"])
    section = {**config["transfer"], "ks": sorted({*config["transfer"]["ks"], args.k})}
    space = SearchSpace.from_dict(args.scale, config["spaces"][args.scale])
    vocab_size = data.TokenShards.open(args.data).manifest["tokenizer"]["vocab_size"]
    table = pl.concat([pl.read_parquet(p) for p in args.tables], how="diagonal_relaxed")
    start = time.perf_counter()
    quality = evaluate(table, space, vocab_size, section)
    seconds = time.perf_counter() - start
    if args.out:
        write_table(quality, args.out)
    targets = quality.filter(pl.col("method") == "full_surrogate").select(
        "metric", "device", "condition").unique()
    print(f"{targets.height} targets ({', '.join(sorted(set(targets['device'])))}); "
          f"evaluated in {seconds:.1f} s")
    for row in quality.filter(pl.col("method").is_null()).select(
            "metric", "hold_out", "reason").unique().iter_rows(named=True):
        print(f"{row['metric']} (hold out {row['hold_out'] or 'any'}): not evaluated: "
              f"{row['reason']}")
    summary = summarize(quality, [args.k])
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=220, float_precision=3,
                   tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        print(summary.select("metric", "hold_out", "method", "kind", "selection", "k", "targets",
                             "spearman_median", "spearman_worst", "kendall_tau_median",
                             "kendall_tau_worst", "within_10pct_median", "within_10pct_worst",
                             "mdape_median", "mdape_worst"))


if __name__ == "__main__":
    main()
