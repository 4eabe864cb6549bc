"""Source models: one LightGBM model of log(value) per target, on the surrogate features of
the target's condition; what transfer methods know about the sources for any arch.

``cross_fitted`` predicts every arch by a model that did not see that arch (k-fold over archs),
so evaluated predictions are those of archs the sources never measured, as for a user's query.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from ..lightgbm_core import lgb
from ..predictors.features import features_of_encoded
from ..predictors.quality import fold_indices
from ..space import SearchSpace
from .targets import Profiles, Target

log = logging.getLogger(__name__)

# Deterministic on CPU for a fixed thread count (as the surrogate family's models).
FIXED_PARAMS: dict[str, Any] = {"objective": "regression", "verbosity": -1, "num_threads": 1,
                                "deterministic": True, "force_row_wise": True}


def train_booster(X: np.ndarray, z: np.ndarray, params: Mapping[str, Any], seed: int,
                  init_score: np.ndarray | None = None) -> lgb.Booster:
    """A LightGBM L2 model of z on X (deterministic settings kept, seeded)."""
    options = {**params, **FIXED_PARAMS, "seed": seed}
    return lgb.train(options, lgb.Dataset(X, z, init_score=init_score, params=options))


def condition_features(space: SearchSpace, encoded: np.ndarray, vocab_size: int,
                       targets: Sequence[Target]) -> list[np.ndarray]:
    """The feature matrix of the rows of ``encoded`` for each target's condition (computed once
    per distinct batch size and sequence length)."""
    cache: dict[tuple[int, int], np.ndarray] = {}
    shapes = [(t.condition.batch_size, t.condition.seq_len) for t in targets]
    for shape in shapes:
        if shape not in cache:
            cache[shape] = features_of_encoded(space, encoded, vocab_size, *shape)
    return [cache[shape] for shape in shapes]


@dataclass
class SourceModel:
    """The model of one source target, fitted on all its measured archs."""

    target: Target
    booster: lgb.Booster

    def predict_log(self, features: np.ndarray) -> np.ndarray:
        """log(value) predictions from features of this target's condition."""
        logs = self.booster.predict(features, num_threads=os.cpu_count() or 1)
        assert isinstance(logs, np.ndarray)  # dense features give dense predictions
        return logs


def fit_sources(profiles: Profiles, encoded: np.ndarray, space: SearchSpace, vocab_size: int,
                params: Mapping[str, Any], seed: int) -> list[SourceModel]:
    """A model per target of ``profiles`` on all the archs it measured (rows of ``encoded``
    are ``profiles.arch_ids``)."""
    features = condition_features(space, encoded, vocab_size, profiles.targets)
    models = []
    for j, target in enumerate(profiles.targets):
        rows = profiles.measured(j)
        models.append(SourceModel(target, train_booster(
            features[j][rows], np.log(profiles.values[rows, j]), params, seed)))
    return models


def cross_fitted(profiles: Profiles, encoded: np.ndarray, space: SearchSpace, vocab_size: int,
                 params: Mapping[str, Any], folds: int, seed: int) -> np.ndarray:
    """Out-of-fold log predictions (n_archs, n_targets): arch i by the model of target j fitted
    without i's fold of archs (folds seeded, the same for every target)."""
    features = condition_features(space, encoded, vocab_size, profiles.targets)
    n = len(profiles.arch_ids)
    held_out_folds = fold_indices(n, folds, seed)
    predicted = np.empty((n, len(profiles.targets)))
    for j in tqdm(range(len(profiles.targets)), desc="source models", unit="target",
                  mininterval=2.0, disable=len(profiles.targets) < 8):
        measured = ~np.isnan(profiles.values[:, j])
        for held_out in held_out_folds:
            train = measured.copy()
            train[held_out] = False
            if train.sum() < 2:
                raise ValueError(f"{profiles.targets[j].name}: {int(train.sum())} measured "
                                 f"archs outside a fold of {folds}; need at least 2")
            booster = train_booster(features[j][train], np.log(profiles.values[train, j]),
                                    params, seed)
            predicted[held_out, j] = booster.predict(features[j][held_out])
    return predicted
