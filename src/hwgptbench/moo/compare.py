"""How search algorithms compare across seeds: a rank test, pairwise tests and the empirical
attainment difference of the best two.

Per (objectives, device), over the seeds that every algorithm ran (blocks) and the algorithms
(treatments), on each run's final hypervolume:

* **Friedman test** (:func:`scipy.stats.friedmanchisquare`) of the null hypothesis that all
  algorithms rank alike, with each algorithm's mean rank (1 is best, ties averaged) and the
  **critical difference** of the Nemenyi post-hoc test (Demšar 2006): two algorithms differ
  at level ``alpha`` when their mean ranks differ by more than
  ``q_alpha * sqrt(k (k + 1) / (6 N))``, ``q_alpha`` the studentized range quantile
  (:data:`scipy.stats.studentized_range`) over ``sqrt(2)``, k algorithms, N seeds;
* **pairwise Wilcoxon signed-rank tests** (:func:`scipy.stats.wilcoxon`, two-sided, exact
  for small N) of every pair on the per-seed differences, their p-values adjusted for the
  k (k - 1) / 2 comparisons by Holm's step-down method (scipy has no Holm adjustment;
  :func:`holm` is its four lines);
* the **EAF difference** (:func:`moocore.eafdiff`) of the two best algorithms by mean rank, in
  2-objective sets: the regions of objective space that one attains in more seeds than the
  other, as rectangles with the difference in the share of seeds (positive: the first one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

import moocore
import numpy as np
import polars as pl
from scipy import stats

KEYS = ["objectives", "device"]
ALPHA = 0.05

FRIEDMAN_SCHEMA = {"objectives": pl.String, "device": pl.String, "algorithms": pl.Int64,
                   "seeds": pl.Int64, "statistic": pl.Float64, "p_value": pl.Float64,
                   "alpha": pl.Float64, "critical_difference": pl.Float64}
RANKS_SCHEMA = {"objectives": pl.String, "device": pl.String, "algorithm": pl.String,
                "mean_rank": pl.Float64, "hv_median": pl.Float64}
PAIRWISE_SCHEMA = {"objectives": pl.String, "device": pl.String, "algorithm_a": pl.String,
                   "algorithm_b": pl.String, "rank_difference": pl.Float64,
                   "nemenyi_different": pl.Boolean, "hv_median_difference": pl.Float64,
                   "wins_a": pl.Int64, "wins_b": pl.Int64, "wilcoxon_statistic": pl.Float64,
                   "p_value": pl.Float64, "p_holm": pl.Float64, "holm_different": pl.Boolean}
EAFDIFF_SCHEMA = {"objectives": pl.String, "device": pl.String, "algorithm_a": pl.String,
                  "algorithm_b": pl.String, "x_metric": pl.String, "y_metric": pl.String,
                  "x_low": pl.Float64, "y_low": pl.Float64, "x_high": pl.Float64,
                  "y_high": pl.Float64, "difference": pl.Float64}


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjustment of p-values for multiple comparisons (same order; NaN, a
    test that could not run, stays NaN and does not count as a comparison)."""
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full_like(p, np.nan)
    finite = np.flatnonzero(~np.isnan(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    stepped = np.maximum.accumulate(p[order] * (len(order) - np.arange(len(order))))
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


def critical_difference(k: int, n: int, alpha: float = ALPHA) -> float:
    """The Nemenyi critical difference of mean ranks of k algorithms over n blocks."""
    q = stats.studentized_range.ppf(1 - alpha, k, np.inf) / np.sqrt(2)
    return float(q * np.sqrt(k * (k + 1) / (6 * n)))


def _matrix(final: pl.DataFrame) -> tuple[list[str], np.ndarray]:
    """(algorithms, final hypervolume (seeds, algorithms)) over the seeds all of them ran."""
    wide = final.pivot(on="algorithm", index="seed", values="hypervolume",
                       aggregate_function="first").drop_nulls().sort("seed")
    algorithms = sorted(c for c in wide.columns if c != "seed")
    return algorithms, wide.select(algorithms).to_numpy().astype(float)


def rank_tests(final: pl.DataFrame, alpha: float = ALPHA
               ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(Friedman test and critical difference, mean ranks, pairwise tests) per (objectives,
    device) of the final table (:func:`~.summary.final_runs`)."""
    tests, ranks, pairs = [], [], []
    for (objectives, device), group in final.group_by(KEYS, maintain_order=True):
        algorithms, hv = _matrix(group)
        n, k = hv.shape
        if n == 0:
            continue
        labels = {"objectives": objectives, "device": device}
        mean_rank = stats.rankdata(-hv, axis=1).mean(axis=0)
        # the Friedman test needs 3 algorithms, and any test 2 seeds: NaN where not
        statistic, p_value = (stats.friedmanchisquare(*hv.T) if k >= 3 and n >= 2
                              else (float("nan"), float("nan")))
        cd = critical_difference(k, n, alpha)
        tests.append({**labels, "algorithms": k, "seeds": n, "statistic": float(statistic),
                      "p_value": float(p_value), "alpha": alpha, "critical_difference": cd})
        ranks += [{**labels, "algorithm": a, "mean_rank": float(r),
                   "hv_median": float(np.median(hv[:, j]))}
                  for j, (a, r) in enumerate(zip(algorithms, mean_rank, strict=True))]
        rows = []
        for i, j in combinations(range(k), 2):
            diff = hv[:, i] - hv[:, j]
            if n < 2:
                w, p = float("nan"), float("nan")
            elif np.all(diff == 0):
                w, p = float("nan"), 1.0
            else:
                result = stats.wilcoxon(hv[:, i], hv[:, j])
                w, p = float(result.statistic), float(result.pvalue)
            rows.append({**labels, "algorithm_a": algorithms[i], "algorithm_b": algorithms[j],
                         "rank_difference": float(mean_rank[j] - mean_rank[i]),
                         "nemenyi_different": bool(abs(mean_rank[i] - mean_rank[j]) > cd),
                         "hv_median_difference": float(np.median(diff)),
                         "wins_a": int((diff > 0).sum()), "wins_b": int((diff < 0).sum()),
                         "wilcoxon_statistic": w, "p_value": p})
        adjusted = holm([r["p_value"] for r in rows])
        for row, p in zip(rows, adjusted, strict=True):
            row["p_holm"] = float(p)
            row["holm_different"] = bool(p < alpha)  # False for NaN
        pairs += rows
    return (pl.DataFrame(tests, schema=FRIEDMAN_SCHEMA),
            pl.DataFrame(ranks, schema=RANKS_SCHEMA).sort(*KEYS, "mean_rank", "algorithm"),
            pl.DataFrame(pairs, schema=PAIRWISE_SCHEMA))


def best_two(ranks: pl.DataFrame, objectives: str, device: str) -> list[str]:
    """The two algorithms of lowest mean rank (ties by name) of an (objectives, device)."""
    part = ranks.filter((pl.col("objectives") == objectives) & (pl.col("device") == device))
    return part.sort("mean_rank", "algorithm")["algorithm"].head(2).to_list()


def eaf_differences(runs: pl.DataFrame, ranks: pl.DataFrame,
                    metrics: Mapping[str, Sequence[str]]) -> pl.DataFrame:
    """The EAF difference (rectangles, raw units) of the two best algorithms of every
    2-objective set and device: ``difference`` is the share of seeds of ``algorithm_a`` that
    attain the rectangle minus that of ``algorithm_b``."""
    parts = []
    full = runs.filter(pl.col("full_fidelity"))
    for (objectives, device), group in full.group_by(KEYS, maintain_order=True):
        names = list(metrics[str(objectives)])
        pair = best_two(ranks, str(objectives), str(device))
        if len(names) != 2 or len(pair) != 2:
            continue
        seeds = set.intersection(*(set(group.filter(pl.col("algorithm") == a)["seed"])
                                   for a in pair))
        sets = []
        for algorithm in pair:
            part = group.filter((pl.col("algorithm") == algorithm)
                                & pl.col("seed").is_in(sorted(seeds))).drop_nulls(names)
            _, index = np.unique(part["seed"].to_numpy(), return_inverse=True)
            sets.append(np.column_stack([part.select(names).to_numpy().astype(float),
                                         index + 1]))
        try:
            rectangles = moocore.eafdiff(sets[0], sets[1], rectangles=True)
        except ValueError as err:  # moocore cannot shape an empty difference: equal EAFs
            if "reshape" not in str(err):
                raise
            continue
        rectangles = rectangles[rectangles[:, 4] != 0]
        parts.append(pl.DataFrame({
            "objectives": objectives, "device": device, "algorithm_a": pair[0],
            "algorithm_b": pair[1], "x_metric": names[0], "y_metric": names[1],
            "x_low": rectangles[:, 0], "y_low": rectangles[:, 1], "x_high": rectangles[:, 2],
            "y_high": rectangles[:, 3], "difference": rectangles[:, 4] / len(seeds)},
            schema=EAFDIFF_SCHEMA))
    return pl.concat(parts) if parts else pl.DataFrame(schema=EAFDIFF_SCHEMA)


def comparison_tables(runs: pl.DataFrame, final: pl.DataFrame,
                      metrics: Mapping[str, Sequence[str]], alpha: float = ALPHA
                      ) -> dict[str, pl.DataFrame]:
    """The tables the search summary writes: ``friedman``, ``ranks``, ``pairwise`` and
    ``eafdiff`` (see the module docstring)."""
    friedman, ranks, pairwise = rank_tests(final, alpha)
    return {"friedman": friedman, "ranks": ranks, "pairwise": pairwise,
            "eafdiff": eaf_differences(runs, ranks, metrics)}
