"""Bayesian linear regression surrogate: the family for targets with a few dozen archs.

On the log target, latency, energy and memory are close to linear in the features, whose
analytic columns (log parameters, log FLOPs, :mod:`.features`) carry most of the signal, and
per-layer widths and depth add the per-layer overhead. A linear model then has a few dozen
coefficients to fit where trees need splits and MLPs need data. scikit-learn's
``BayesianRidge`` fits it on standardised features, choosing the weight prior's and the noise's
precisions by evidence maximisation, so it has no hyperparameter to tune on 20 rows; its
posterior predictive variance (noise plus coefficient uncertainty) gives a Gaussian interval.
The fitted model is stored as JSON (coefficients, their covariance, the noise precision and
the standardisation) and predicts with numpy, so loading needs no pickle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy.stats import norm

from ..io import atomic_write_text, read_json
from ..outputs import make_dirs
from .base import FIX, check_features, check_rows, from_target, to_target

_MODEL = "linear.json"


class LinearSurrogate:
    """Bayesian ridge regression on standardised features (see module doc)."""

    family: ClassVar[str] = "linear"

    def __init__(self, coverage: float = 0.9, log_target: bool = True) -> None:
        if not 0 < coverage < 1:
            raise ValueError(f"coverage must be in (0, 1), got {coverage}")
        self.coverage, self.log_target = coverage, log_target
        self.state: dict[str, Any] = {}

    def fit(self, X: np.ndarray, y: np.ndarray) -> LinearSurrogate:
        """Fit on features X (n, d) and targets y (n,); return self."""
        from sklearn.linear_model import BayesianRidge

        X = check_features(X).astype(np.float64)
        z = to_target(y, self.log_target)
        check_rows(X, z)
        scale = X.std(axis=0)
        self.state = {"x_mean": X.mean(axis=0).tolist(),
                      "x_scale": np.where(scale > 0, scale, 1.0).tolist()}
        model = BayesianRidge().fit(self._standardised(X), z)
        self.state |= {"coef": model.coef_.tolist(), "intercept": float(model.intercept_),
                       "covariance": model.sigma_.tolist(), "noise_var": 1 / model.alpha_}
        return self

    def _standardised(self, X: np.ndarray) -> np.ndarray:
        return (np.asarray(X, dtype=np.float64) - self.state["x_mean"]) / self.state["x_scale"]

    def _mean(self, x: np.ndarray) -> np.ndarray:
        """Predictive mean in fitted (log) space of standardised features x."""
        return x @ np.asarray(self.state["coef"]) + self.state["intercept"]

    def _inputs(self, X: np.ndarray) -> np.ndarray:
        if "coef" not in self.state:
            raise RuntimeError("LinearSurrogate is not fitted; call fit or load first")
        return self._standardised(check_features(X))

    def _posterior(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predictive mean and variance in fitted (log) space."""
        x = self._inputs(X)
        spread = np.einsum("ij,jk,ik->i", x, np.asarray(self.state["covariance"]), x)
        return self._mean(x), spread + self.state["noise_var"]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predictive means (n,) in metric units."""
        return from_target(self._mean(self._inputs(X)), self.log_target)

    def predict_interval(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """mean ± z·predictive std, mapped to metric units."""
        mean, variance = self._posterior(X)
        half = norm.ppf(0.5 + self.coverage / 2) * np.sqrt(variance)
        return (from_target(mean - half, self.log_target),
                from_target(mean + half, self.log_target))

    def save(self, folder: str | os.PathLike[str]) -> None:
        """Write options and fitted state as JSON."""
        if "coef" not in self.state:
            raise RuntimeError("LinearSurrogate is not fitted; nothing to save")
        folder = make_dirs(folder)
        document = {"coverage": self.coverage, "log_target": self.log_target,
                    "state": self.state}
        atomic_write_text(folder / _MODEL, json.dumps(document, sort_keys=True) + "\n")

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> LinearSurrogate:
        """Read a model written by :meth:`save`."""
        document = read_json(Path(folder) / _MODEL, FIX)
        model = cls(document["coverage"], document["log_target"])
        model.state = document["state"]
        return model
