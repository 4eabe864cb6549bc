"""Cross-validated quality of a surrogate family: accuracy, rank agreement, interval coverage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .base import Surrogate, check_rows


def interval_coverage(y: np.ndarray, low: np.ndarray, high: np.ndarray) -> float:
    """Fraction of y inside the closed intervals [low, high]."""
    y, low, high = (np.asarray(a, dtype=np.float64) for a in (y, low, high))
    if not y.shape == low.shape == high.shape or y.ndim != 1 or len(y) == 0:
        raise ValueError(f"need equal non-empty 1-d arrays, got {y.shape}, {low.shape}, "
                         f"{high.shape}")
    return float(np.mean((low <= y) & (y <= high)))


def fold_indices(rows: int, folds: int, seed: int) -> list[np.ndarray]:
    """Held-out row indices of each fold of a seeded random k-fold split."""
    if not 2 <= folds <= rows:
        raise ValueError(f"need 2 <= folds <= rows, got {folds} folds for {rows} rows")
    return np.array_split(np.random.default_rng(seed).permutation(rows), folds)


def out_of_fold(make_model: Callable[[], Surrogate], X: np.ndarray, y: np.ndarray,
                folds: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Out-of-fold point predictions and interval ends, each (n,), from fresh models."""
    X, y = np.asarray(X), np.asarray(y, dtype=np.float64)
    check_rows(X, y)
    point, low, high = (np.empty(len(y)) for _ in range(3))
    for held_out in fold_indices(len(y), folds, seed):
        train = np.ones(len(y), dtype=bool)
        train[held_out] = False
        model = make_model().fit(X[train], y[train])
        point[held_out] = model.predict(X[held_out])
        low[held_out], high[held_out] = model.predict_interval(X[held_out])
    return point, low, high


def relative_errors(y: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """The shares of predictions within ±5% and ±10% of y, and the median and worst absolute
    percentage error (MdAPE, max APE, in %): the measures of latency predictors (nn-Meter)."""
    y, predicted = np.asarray(y, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    ape = np.abs(predicted - y) / np.abs(y)
    return {"within_5pct": float(np.mean(ape <= 0.05)), "within_10pct": float(np.mean(ape <= 0.10)),
            "mdape": float(100 * np.median(ape)), "max_ape": float(100 * np.max(ape))}


def score(y: np.ndarray, point: np.ndarray, low: np.ndarray, high: np.ndarray
          ) -> dict[str, Any]:
    """R², MAE, Kendall τ, Spearman ρ, the relative errors of :func:`relative_errors` and
    interval coverage of predictions (point, interval ends) of y, with the predictions
    themselves (``predicted``, ``lower``, ``upper``) and the number of ``rows``."""
    from scipy import stats  # a second to import: not on the query path, which needs none

    y = np.asarray(y, dtype=np.float64)
    residual = y - point
    return {
        **relative_errors(y, point),
        "r2": float(1 - np.sum(residual**2) / np.sum((y - y.mean()) ** 2)),
        "mae": float(np.mean(np.abs(residual))),
        "kendall_tau": float(stats.kendalltau(y, point).statistic),
        "spearman_rho": float(stats.spearmanr(y, point).statistic),
        "coverage": interval_coverage(y, low, high),
        "rows": len(y),
        "predicted": point,
        "lower": low,
        "upper": high,
    }


def cross_validate(make_model: Callable[[], Surrogate], X: np.ndarray, y: np.ndarray,
                   folds: int = 5, seed: int = 0) -> dict[str, Any]:
    """:func:`score` of the out-of-fold predictions of fresh models, with ``folds``."""
    point, low, high = out_of_fold(make_model, X, y, folds, seed)
    return {**score(y, point, low, high), "folds": folds}
