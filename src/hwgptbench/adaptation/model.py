"""The adapted surrogate: a surrogate family (``adapted``) that predicts a new target from the
source models and an adaptation method fitted on k measured archs.

It takes the same feature matrix as every surrogate (the target's condition); the features of
each source's condition are re-derived from its leading ``space.encode`` columns. Saved with
:func:`hwgptbench.predictors.store.save_surrogate` like the fitted families, so
``Benchmark.query`` loads it as any other surrogate. Its interval is log-normal with the
method's leave-one-out residual scale (``sigma``): a rough interval from k rows, not calibrated
like the fitted families'.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy.stats import norm

from ..io import atomic_write_text, read_json
from ..lightgbm_core import read_booster
from ..outputs import atomic_path, make_dirs
from ..predictors.base import FIX, check_features, check_rows, to_target
from ..space import SearchSpace
from .methods import Design, Method, gpt_linear, method_from_state
from .sources import SourceModel, condition_features
from .targets import Target

_OPTIONS = "options.json"
_SOURCES = "sources"


class AdaptedSurrogate:
    """Source models + an adaptation method, as a surrogate of one new target."""

    family: ClassVar[str] = "adapted"

    def __init__(self, space: SearchSpace, vocab_size: int, sources: Sequence[SourceModel],
                 method: Method, coverage: float = 0.9) -> None:
        if method.needs_sources and not sources:
            raise ValueError(f"transfer method {method.name!r} needs at least one source")
        if not 0 < coverage < 1:
            raise ValueError(f"coverage must be in (0, 1), got {coverage}")
        self.space, self.vocab_size = space, vocab_size
        self.sources, self.method, self._coverage = list(sources), method, coverage

    @property
    def coverage(self) -> float:
        """Nominal coverage of :meth:`predict_interval`."""
        return self._coverage

    def design(self, X: np.ndarray) -> Design:
        """Features X of the target's condition plus the sources' log predictions."""
        X = check_features(X)
        encoded = X[:, :len(self.space.feature_names())]
        features = condition_features(self.space, encoded, self.vocab_size,
                                      [s.target for s in self.sources])
        logs = [s.predict_log(f) for s, f in zip(self.sources, features, strict=True)]
        return Design(gpt_linear(X), np.column_stack(logs) if logs else np.zeros((len(X), 0)))

    def prepare(self, reference: np.ndarray, measured: np.ndarray) -> AdaptedSurrogate:
        """Let the method learn from the sources over reference archs (features X) and the
        sources' measured log values of them (NaN where not measured); return self."""
        design = self.design(reference)
        self.method.prepare(Design(design.linear, design.sources, measured))
        return self

    def fit(self, X: np.ndarray, y: np.ndarray) -> AdaptedSurrogate:
        """Adapt the prepared method to the measured values y of the k archs X; return self."""
        z = to_target(y, True)
        check_rows(X, z)
        self.method.fit(self.design(X), z)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Point predictions (n,) in metric units."""
        return np.exp(self.method.predict(self.design(X)))

    def predict_interval(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """exp(log prediction ± z·sigma)."""
        z = self.method.predict(self.design(X))
        half = norm.ppf(0.5 + self._coverage / 2) * self.method.sigma
        return np.exp(z - half), np.exp(z + half)

    def save(self, folder: str | os.PathLike[str]) -> None:
        """The source models as LightGBM text files, the rest as JSON."""
        folder = Path(folder)
        make_dirs(folder / _SOURCES)
        for index, source in enumerate(self.sources):
            with atomic_path(folder / _SOURCES / f"{index}.txt") as tmp:
                source.booster.save_model(tmp)
        options: dict[str, Any] = {
            "space_name": self.space.name, "space": self.space.to_dict(),
            "vocab_size": self.vocab_size, "coverage": self._coverage,
            "sources": [s.target.columns() for s in self.sources],
            "method": self.method.name, "method_state": self.method.state()}
        atomic_write_text(folder / _OPTIONS, json.dumps(options, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> AdaptedSurrogate:
        """Read a model written by :meth:`save`."""
        folder = Path(folder)
        options = read_json(folder / _OPTIONS, FIX)
        sources = [SourceModel(Target.from_columns(target),
                               read_booster(folder / _SOURCES / f"{index}.txt", FIX))
                   for index, target in enumerate(options["sources"])]
        return cls(SearchSpace.from_dict(options["space_name"], options["space"]),
                   options["vocab_size"], sources,
                   method_from_state(options["method"], options["method_state"]),
                   options["coverage"])
