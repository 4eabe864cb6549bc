"""Intervals calibrated from out-of-fold errors: one method for every surrogate family.

A family's own interval (LightGBM's quantile models, the MLP ensemble's spread plus residual
variance, Bayesian ridge's posterior) is only as honest as the data it was fitted on allows:
on 20 to 100 archs, in-sample noise estimates make nominal 90% intervals cover 65-85%. The
surrogate stage therefore calibrates every candidate the same way, by cross-conformal
quantile regression (CQR, Romano et al. 2019, with the k-fold cross-fitting of Barber et al.
2021's CV+): the out-of-fold interval of each arch gives the conformity score
``max(low - y, y - high)`` (in log space for positive metrics), and both ends of every
interval move out, or in where the family is too cautious, by the ``ceil((m + 1) * coverage)``-th
smallest of the m scores.

The stored model uses the widening of all folds' scores. The quality table scores intervals
calibrated without the fold they predict (each fold's widening comes from the other folds),
so the coverage it reports is out of sample too.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..io import atomic_write_text, read_json
from .base import FIX, Surrogate, from_target, to_target

CALIBRATION = "conformal.json"


def log_space_for(*arrays: np.ndarray) -> bool:
    """Whether to calibrate in log space: every target and interval end is positive."""
    return all(bool((np.asarray(a) > 0).all()) for a in arrays)


def conformity_scores(y: np.ndarray, low: np.ndarray, high: np.ndarray, log_space: bool
                      ) -> np.ndarray:
    """How far each y lies outside its interval (negative: inside), in calibration space."""
    y, low, high = (to_target(a, log_space) for a in (y, low, high))
    return np.maximum(low - y, y - high)


def widening(scores: np.ndarray, coverage: float) -> float:
    """The finite-sample conformal quantile of the scores for a nominal coverage (the largest
    score when there are too few scores for that coverage)."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or len(scores) == 0 or not 0 < coverage < 1:
        raise ValueError(f"need a non-empty 1-d score array and coverage in (0, 1), got "
                         f"shape {scores.shape} and {coverage}")
    rank = min(len(scores), math.ceil((len(scores) + 1) * coverage))  # 1-based
    return float(np.sort(scores)[rank - 1])


def widen(low: np.ndarray, high: np.ndarray, by: float, log_space: bool,
          point: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Interval ends moved out by ``by`` (calibration space units; negative: in), clipped so
    that they still hold ``point`` where it is given (only a narrowing can cross it)."""
    low = from_target(to_target(low, log_space) - by, log_space)
    high = from_target(to_target(high, log_space) + by, log_space)
    if point is None:
        return low, high
    return np.minimum(low, point), np.maximum(high, point)


def cross_conformal(y: np.ndarray, point: np.ndarray, low: np.ndarray, high: np.ndarray,
                    folds: Sequence[np.ndarray], coverage: float
                    ) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """Out-of-fold intervals (low, high) calibrated without their own fold, the widening of
    all folds' scores for the stored model, and whether it applies in log space."""
    log_space = log_space_for(y, low, high)
    scores = conformity_scores(y, low, high, log_space)
    calibrated_low, calibrated_high = np.empty(len(y)), np.empty(len(y))
    for held_out in folds:
        others = np.ones(len(y), dtype=bool)
        others[held_out] = False
        calibrated_low[held_out], calibrated_high[held_out] = widen(
            low[held_out], high[held_out], widening(scores[others], coverage), log_space,
            point[held_out])
    return calibrated_low, calibrated_high, widening(scores, coverage), log_space


class ConformalSurrogate:
    """A fitted surrogate whose interval ends move by a conformal widening (module doc)."""

    def __init__(self, model: Surrogate, by: float, log_space: bool) -> None:
        self.model, self.by, self.log_space = model, float(by), bool(log_space)

    @property
    def family(self) -> str:
        """The wrapped model's family."""
        return self.model.family

    @property
    def coverage(self) -> float:
        """Nominal coverage the widening was calibrated for."""
        return self.model.coverage

    def fit(self, X: np.ndarray, y: np.ndarray) -> ConformalSurrogate:
        """Refit the wrapped model on X and y; the widening stays as calibrated."""
        self.model.fit(X, y)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The wrapped model's point predictions."""
        return self.model.predict(X)

    def predict_interval(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The wrapped model's interval, widened (narrowed at most to the point prediction)."""
        low, high = self.model.predict_interval(X)
        point = self.model.predict(X) if self.by < 0 else None
        return widen(low, high, self.by, self.log_space, point)

    def save(self, folder: str | os.PathLike[str]) -> None:
        """The wrapped model's files plus the widening as JSON."""
        self.model.save(folder)
        document = {"widening": self.by, "log_space": self.log_space}
        atomic_write_text(Path(folder) / CALIBRATION, json.dumps(document) + "\n")


def calibrated(model: Surrogate, folder: str | os.PathLike[str]) -> Surrogate:
    """model wrapped with the widening stored in folder, or model itself if none is stored."""
    path = Path(folder) / CALIBRATION
    if not path.exists():
        return model
    document = read_json(path, FIX)
    by, log_space = document["widening"], document["log_space"]
    if (isinstance(by, bool) or not isinstance(by, (int, float)) or not math.isfinite(by)
            or not isinstance(log_space, bool)):
        raise ValueError(f"{path}: widening {by!r} is not a finite number or log_space "
                         f"{log_space!r} not a bool")
    return ConformalSurrogate(model, by, log_space)
