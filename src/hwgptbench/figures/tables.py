"""Tables for the paper: builders (tables in, table out) and a CSV + Markdown writer."""

from __future__ import annotations

import os

import polars as pl

from ..metrics import hardware_metrics, still_contended
from ..moo.summary import summarize
from ..plotting.markdown import MISSING
from ..plotting.style import algorithm_order
from .benchmark import measured

PathLike = str | os.PathLike[str]


def quality_table(quality: pl.DataFrame) -> pl.DataFrame:
    """Surrogate quality per (metric, device, condition, family): status, rows, R², MAE,
    Kendall tau, Spearman rho, shares within ±5% and ±10%, MdAPE and worst APE (%),
    empirical and nominal interval coverage, and whether the query uses it (selected)."""
    columns = ["metric", "device", "condition", "family", "status", "rows", "r2", "mae",
               "kendall_tau", "spearman_rho", "within_5pct", "within_10pct", "mdape",
               "max_ape", "coverage", "nominal_coverage", "selected"]
    return quality.select(c for c in columns if c in quality.columns).sort(
        "metric", "device", "condition", "family")


def _mean_std(mean: float | None, std: float | None, decimals: int) -> str:
    if mean is None:
        return MISSING
    return f"{mean:.{decimals}f}" + ("" if std is None else f" ± {std:.{decimals}f}")


def hypervolume_table(final: pl.DataFrame, decimals: int = 4) -> pl.DataFrame:
    """Per (objectives, device, algorithm): runs, final hypervolume and regret as mean ± std
    over seeds, and mean rank; algorithms by mean rank."""
    stats = summarize(final)
    order = {a: i for i, a in enumerate(algorithm_order(stats["algorithm"]))}
    rows = [{"objectives": r["objectives"], "device": r["device"], "algorithm": r["algorithm"],
             "runs": r["runs"], "hypervolume": _mean_std(r["hv_mean"], r["hv_std"], decimals),
             "hv_regret": _mean_std(r["hv_regret_mean"], r["hv_regret_std"], decimals),
             "mean_rank": r["rank_mean"]}
            for r in stats.iter_rows(named=True)]
    schema = {"objectives": pl.String, "device": pl.String, "algorithm": pl.String,
              "runs": pl.UInt32, "hypervolume": pl.String, "hv_regret": pl.String,
              "mean_rank": pl.Float64}
    return (pl.DataFrame(rows, schema=schema)
            .with_columns(_order=pl.col("algorithm").replace_strict(order, return_dtype=pl.Int64))
            .sort("objectives", "device", "mean_rank", "_order").drop("_order"))


def reference_table(reference: pl.DataFrame) -> pl.DataFrame:
    """Per (objectives, device), how the reference front was built: for each stage (the
    sample, then an optimisation on the surrogates, then every run's archive), the evaluations
    it added, the archs on the front of it and the stages before, how many of the final front's
    archs it holds, that front's hypervolume in the final box and its gap to the final front's;
    and the final box (ideal and nadir per metric)."""
    return reference.with_columns(
        box=pl.struct("metrics", "ideal", "nadir").map_elements(
            lambda r: "; ".join(f"{m} {lo:.4g}–{hi:.4g}" for m, lo, hi in
                                zip(r["metrics"], r["ideal"], r["nadir"], strict=True)),
            return_dtype=pl.String)).select(
        "objectives", "device", "stage", "evaluations", "front_archs", "final_front_archs",
        "hypervolume", "hv_gap", "box")


def rank_table(friedman: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Per (objectives, device, algorithm): mean rank over the seeds and median final
    hypervolume, with the Friedman test (statistic, p-value) and the Nemenyi critical
    difference of its (objectives, device); algorithms by mean rank."""
    return ranks.join(friedman, on=["objectives", "device"], how="left").select(
        "objectives", "device", "algorithm", "mean_rank", "hv_median", "seeds",
        pl.col("statistic").alias("friedman_chi2"), pl.col("p_value").alias("friedman_p"),
        "critical_difference").sort("objectives", "device", "mean_rank", "algorithm")


def pairwise_table(pairwise: pl.DataFrame) -> pl.DataFrame:
    """Every pair of algorithms of an (objectives, device): mean-rank difference (positive: a
    ranks better) and whether it exceeds the critical difference, median per-seed difference of
    final hypervolume, seeds won by each, Wilcoxon signed-rank p-value and its Holm
    adjustment; pairs by adjusted p-value."""
    return pairwise.select(
        "objectives", "device", "algorithm_a", "algorithm_b", "rank_difference",
        "nemenyi_different", "hv_median_difference", "wins_a", "wins_b", "p_value", "p_holm",
        "holm_different").sort("objectives", "device", "p_holm", "algorithm_a", "algorithm_b")


def device_summary(measurements: pl.DataFrame) -> pl.DataFrame:
    """Per (device, condition): archs measured (status ok) and failed, latencies still timed
    under contention after the measure stage's visits (left out of fitting and transfer,
    docs/measure.md), and median, min and max of each hardware metric (hwgptbench.metrics;
    null where not measured)."""
    metrics = [m for m in hardware_metrics() if m in measurements.columns]
    ok = measured(measurements)
    still = still_contended(ok.columns)
    failed = (measurements.filter(pl.col("status") != "ok")
              .group_by("device", "batch_size", "seq_len", "dtype", "launch")
              .agg(failed=pl.len()))
    stats = (ok.group_by("device", "batch_size", "seq_len", "dtype", "launch", "condition")
             .agg(pl.col("arch_id").n_unique().alias("archs"),
                  still.sum().cast(pl.Int64).alias("contended"),
                  *(getattr(pl.col(m), f)().alias(f"{m}_{f}")
                    for m in metrics for f in ("median", "min", "max")))
             .join(failed, on=["device", "batch_size", "seq_len", "dtype", "launch"], how="left")
             .with_columns(pl.col("failed").fill_null(0))
             .sort("device", "batch_size", "seq_len", "dtype", "launch"))
    return stats.select("device", "condition", "archs", "failed", "contended",
                        *(f"{m}_{f}" for m in metrics for f in ("median", "min", "max")))
