"""Agreement of two latency measurements of the same archs (two protocols, two runs).

Each side is a measurement table (parquet) or a shard's part directory
(``results/{scale}/.measure/{device}/shard-*.parquet.parts``, read before its group factors
are divided out). Prints, over the archs with an ``ok`` latency on both sides: their count,
Spearman and Kendall correlations, the median and spread of the latency ratio b/a, and each
side's samples per arch, median 95% CI and Spearman correlation with FLOPs.

    python benchmarks/compare_latency.py A B [--condition b1-t128-fp32-eager]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import polars as pl
from scipy import stats

COLUMNS = ["arch_id", "flops", "latency_ms", "latency_n", "latency_ci95_rel"]


def read_side(path: Path, condition: str) -> pl.DataFrame:
    """The ok rows of one side, one per arch (anchors' extra rows left out)."""
    files = sorted(path.glob(f"{condition}.group-*.parquet")) if path.is_dir() else [path]
    table = pl.concat([pl.read_parquet(file) for file in files], how="diagonal_relaxed")
    if "latency_anchor_only" in table.columns:
        table = table.filter(~pl.col("latency_anchor_only").fill_null(False))
    return table.filter(pl.col("status") == "ok").select(COLUMNS).unique("arch_id")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--condition", default="b1-t128-fp32-eager",
                        help="condition id of the part files (directories only)")
    args = parser.parse_args()
    both = read_side(args.a, args.condition).join(read_side(args.b, args.condition),
                                                  on="arch_id", suffix="_b")
    flops = both["flops"].to_numpy()
    a, b = both["latency_ms"].to_numpy(), both["latency_ms_b"].to_numpy()
    ratio = b / a
    print(f"archs on both sides: {both.height}")
    print(f"Spearman {stats.spearmanr(a, b).statistic:.4f}, "
          f"Kendall tau {stats.kendalltau(a, b).statistic:.4f}")
    print(f"latency ratio b/a: median {np.median(ratio):.3f}, "
          f"5-95% {np.percentile(ratio, 5):.3f}-{np.percentile(ratio, 95):.3f}, "
          f"mean |log| {np.mean(np.abs(np.log(ratio))):.3f}")
    for side, suffix in (("a", ""), ("b", "_b")):
        latency = both["latency_ms" + suffix].to_numpy()
        print(f"{side}: samples per arch {int(both['latency_n' + suffix].median())}, "
              f"median 95% CI {100 * both['latency_ci95_rel' + suffix].median():.1f}%, "
              f"Spearman with FLOPs {stats.spearmanr(latency, flops).statistic:.4f}")


if __name__ == "__main__":
    main()
