"""The common interface of predictors of one benchmark metric (perplexity, latency, energy,
memory) of an arch, and their target transform.

A surrogate is fitted for one (device, condition) on the feature matrix of
:mod:`.features` and predicts the metric and a central prediction interval for many archs at
once. The families are :class:`.lightgbm_model.LightGBMSurrogate` and
:class:`.mlp.MLPEnsembleSurrogate` (imported from their modules, so that using one does not
import the other's library); :mod:`.quality` cross-validates them and :mod:`.store` saves them
with their metadata. This module holds their common interface and target transform.

Strictly positive metrics are fitted in log space (``log_target=True``): errors become
relative, the multiplicative structure of latency and energy in the sizes becomes additive,
and predictions and intervals, mapped back with exp, stay positive. Quantiles survive the
monotone map, so the interval keeps its coverage; the point prediction becomes a median-like
(geometric) estimate.
"""

from __future__ import annotations

import os
from typing import Protocol, TypeVar

import numpy as np

S = TypeVar("S", bound="Surrogate")
# what to do about a surrogate folder that cannot be read (its loaders' errors end with it)
FIX = ("refit the surrogates (`make run`, which reruns the surrogates stage) or pull them "
       "again (`make pull`); a cache of the shipped tables (published/{scale}-{key}/, under "
       "results/ or the user cache folder) is refitted once deleted")


class Surrogate(Protocol):
    """A regression model of one metric with a central prediction interval.

    Each family's class also reads a model back with its classmethod ``load(folder)`` (what
    :func:`.store.load_surrogate` calls); a model wrapped with a conformal widening
    (:class:`.conformal.ConformalSurrogate`) is a surrogate too, rebuilt from its files by
    :func:`.conformal.calibrated`.
    """

    @property
    def family(self) -> str:
        """Name of the family (a class constant of each family's class)."""

    @property
    def coverage(self) -> float:
        """Nominal coverage of :meth:`predict_interval`."""

    def fit(self: S, X: np.ndarray, y: np.ndarray) -> S:
        """Fit on features X (n, d) and targets y (n,); return self."""

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Point predictions (n,)."""

    def predict_interval(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper ends (n,) of the central interval of nominal coverage."""

    def save(self, folder: str | os.PathLike[str]) -> None:
        """Write the fitted model into folder (created if missing)."""


def check_features(X: np.ndarray) -> np.ndarray:
    """X as a finite float32 matrix; raise ValueError otherwise."""
    X = np.asarray(X, dtype=np.float32)
    if X.ndim != 2:
        raise ValueError(f"features must be a 2-d matrix, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("features contain NaN or infinite values")
    return X


def to_target(y: np.ndarray, log_target: bool) -> np.ndarray:
    """The fitted target as float64: log(y) when log_target (y must be > 0), else y."""
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1 or not np.isfinite(y).all():
        raise ValueError(f"targets must be a finite 1-d array, got shape {y.shape}")
    if not log_target:
        return y
    if (y <= 0).any():
        raise ValueError(f"log_target needs strictly positive targets, got min {y.min()}; "
                         "fit with log_target=False")
    return np.log(y)


def from_target(z: np.ndarray, log_target: bool) -> np.ndarray:
    """Map fitted-space predictions back to metric units (inverse of :func:`to_target`)."""
    return np.exp(z) if log_target else np.asarray(z, dtype=np.float64)


def check_rows(X: np.ndarray, y: np.ndarray) -> None:
    """Raise ValueError unless X and y have the same number of rows, at least two."""
    if len(X) != len(y) or len(y) < 2:
        raise ValueError(f"need matching features and targets with at least 2 rows, got "
                         f"{len(X)} and {len(y)}")
