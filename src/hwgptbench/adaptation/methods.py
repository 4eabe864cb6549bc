"""The few-shot transfer methods: a model of a new target's log(value) per arch from k measured
archs, for this project's devices (`hwgptbench adapt`, the transfer stage) and for other
projects' public data (:mod:`.external_eval`) alike.

Every method sees a :class:`Design`: linear features of the archs (any kind of vector; the
last two columns are log FLOPs and log parameters), the sources' log profiles of the archs and,
on the reference archs it is prepared on, the sources' measured log values. It is prepared on
the reference (never the target's values), fitted on the k measured rows of the target, and
reports ``sigma``, the leave-one-out residual scale of the k rows in log units (floored), from
which intervals are drawn. ``state()`` holds everything needed to predict, as JSON values.

- ``table_prior``: Bayesian linear regression on the standardised linear features (a Gaussian
  process with a linear kernel and a free intercept) under the sources' prior: mean = the mean
  of the sources' least-squares lines, covariance = ``PRIOR_SCALE`` x their covariance + a
  floor, noise = a factor x their mean residual variance. Its settings are chosen per target
  by exact leave-one-out error on the k archs: log or relative (value / mean) scale, noise
  factor, and, for indicator features of (block, group) (HELP's (layer, op)), a tie of
  strength τ: a group's deviation from the prior shared by every block.
- ``meta_ridge``: the same linear model under a mixture prior of the sources' lines, each
  weighted by its precision and by its likelihood of the k archs up to an offset (the sources
  that behave like the target count most); MAP, prior sd floored at 0.05.
- ``source_ridge``: ridge of the target's log values on the sources' centred log profiles
  (penalty by leave-one-out): a learned combination of the source devices.
- ``feature_ridge``: ridge on the standardised linear features from the k archs alone.
- ``flops_line``: a log-log line through the k archs on the FLOPs count.
- ``ensemble`` (the default): the mean log prediction of the five above, weighted by the
  inverse of each one's mean squared leave-one-out error on the k archs (equal weights below
  ``MIN_LOO`` archs).

docs/transfer.md says how the family was chosen and what lost against it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

RIDGE_ALPHAS = (1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1e3)
SCALES = ("log", "relative")
TAUS = (0.0, 0.1, 0.3, 1.0)
NOISE_FACTORS = (0.1, 1.0)
PRIOR_SCALE = 2.0    # the sources' covariance of lines, widened
SLOPE_FLOOR = 0.01   # prior sd floor of a feature's slope (standardised units)
PROXY_FLOOR = 0.1    # prior sd floor of the slopes of log FLOPs and log parameters
INTERCEPT = 100.0    # prior variance of the free intercept (log units)
MIN_LOO = 3          # fewest archs on which a choice by leave-one-out is made
NO_LOO_SIGMA = float(np.log(2.0))  # sigma without a leave-one-out error: a factor of 2
DEFAULT_SIGMA_FLOOR = 0.05


@dataclass(frozen=True)
class Structure:
    """What the linear features are: which columns are standardised (None: all) and, for
    indicator features, the block (e.g. layer) and group (e.g. op) of each column, or None."""

    standardise: np.ndarray | None = None
    blocks: np.ndarray | None = None
    groups: np.ndarray | None = None


@dataclass
class Design:
    """What a method sees of n archs: linear features (n, d; log FLOPs and log parameters
    last), the sources' log profiles (n, S), and on reference archs the sources' measured log
    values (n, S; NaN where a source did not measure an arch); ``features`` are the archs'
    full feature vectors (the surrogate features here), kept for callers that need them."""

    linear: np.ndarray
    sources: np.ndarray
    measured: np.ndarray | None = None
    structure: Structure = field(default_factory=Structure)

    def rows(self, index: np.ndarray) -> Design:
        """The design of a subset of the archs."""
        return Design(self.linear[index], self.sources[index],
                      None if self.measured is None else self.measured[index], self.structure)


def gpt_linear(features: np.ndarray) -> np.ndarray:
    """The linear features of GPT archs from their surrogate feature matrix (``space.encode``
    columns, then log parameters and log FLOPs): layers, log embedding width, log attention
    width, log MLP width, bias, log FLOPs, log parameters."""
    n_max = (features.shape[1] - 5) // 2
    embed = features[:, 0].astype(np.float64)
    heads = features[:, 3:3 + n_max].sum(1, dtype=np.float64)
    hidden = (features[:, 3 + n_max:3 + 2 * n_max] * features[:, :1]).sum(1, dtype=np.float64)
    return np.column_stack([features[:, 1], np.log(embed), np.log(np.maximum(heads, 1)),
                            np.log(np.maximum(hidden, 1)), features[:, 2], features[:, -1],
                            features[:, -2]]).astype(np.float64)


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(values))))


def penalized_fit(D: np.ndarray, z: np.ndarray, penalty: np.ndarray, prior: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients minimising |z - D θ|² + (θ - prior)ᵀ penalty (θ - prior), and the exact
    leave-one-out residuals of that linear smoother."""
    gram = D.T @ D + penalty + 1e-10 * np.eye(D.shape[1])
    theta = np.linalg.solve(gram, D.T @ z + penalty @ prior)
    hat = np.einsum("ij,ij->i", D, np.linalg.solve(gram, D.T).T)
    return theta, (z - D @ theta) / np.maximum(1 - hat, 1e-9)


def ridge_fit(D: np.ndarray, z: np.ndarray, alphas: tuple[float, ...] = RIDGE_ALPHAS
              ) -> tuple[np.ndarray, np.ndarray, float]:
    """Ridge coefficients (column 0 a free intercept) with the penalty of least exact
    leave-one-out error, those residuals and the penalty."""
    best: tuple[float, np.ndarray, np.ndarray, float] | None = None
    for alpha in alphas:
        penalty = np.diag([0.0] + [alpha] * (D.shape[1] - 1))
        theta, loo = penalized_fit(D, z, penalty, np.zeros(D.shape[1]))
        if best is None or _rms(loo) < best[0]:
            best = (_rms(loo), theta, loo, alpha)
    if best is None:
        raise ValueError("ridge has no penalty to choose from: alphas is empty")
    return best[1], best[2], best[3]


class Method(Protocol):
    """A transfer method (see the module doc)."""

    name: ClassVar[str]
    needs_sources: ClassVar[bool]

    @property
    def sigma(self) -> float:
        """Leave-one-out residual scale of the fit (log units)."""

    @property
    def loo(self) -> np.ndarray | None:
        """Leave-one-out log residuals of the k archs (None where the fit cannot say)."""

    def prepare(self, reference: Design) -> None:
        """Learn from the sources over the reference archs."""

    def fit(self, design: Design, z: np.ndarray) -> None:
        """Adapt to the target's log values z of the k rows of design."""

    def predict(self, design: Design) -> np.ndarray:
        """log(value) predictions (n,)."""

    def state(self) -> dict[str, Any]:
        """Everything needed to predict, as JSON-compatible values."""


class _Fitted:
    """The leave-one-out residuals of a fit and the scale they give (floored)."""

    sigma_floor: float = DEFAULT_SIGMA_FLOOR
    _loo: np.ndarray | None = None

    @property
    def loo(self) -> np.ndarray | None:
        """Leave-one-out log residuals of the k archs (None where the fit cannot say)."""
        return self._loo

    @property
    def sigma(self) -> float:
        """RMS leave-one-out residual (log units), at least ``sigma_floor``."""
        if self._loo is None or not len(self._loo):
            return NO_LOO_SIGMA
        return max(_rms(self._loo), self.sigma_floor)


class _Standardised(_Fitted):
    """Linear features standardised over the reference archs (columns the structure says)."""

    mean: np.ndarray
    scale: np.ndarray

    def _standardise_on(self, reference: Design) -> np.ndarray:
        linear = reference.linear
        chosen = reference.structure.standardise
        keep = np.ones(linear.shape[1], dtype=bool) if chosen is None else np.asarray(chosen)
        scale = linear.std(0)
        self.mean = np.where(keep, linear.mean(0), 0.0)
        self.scale = np.where(keep & (scale > 0), scale, 1.0)
        return self._standardised(reference)

    def _standardised(self, design: Design) -> np.ndarray:
        return (design.linear - self.mean) / self.scale


@dataclass
class _Prior:
    """The sources' lines in one scale: mean (d,), covariance (d, d) with its floor, the tie
    matrix (d, groups) or None, and the mean residual variance."""

    mean: np.ndarray
    cov: np.ndarray
    tie: np.ndarray | None
    noise: float


def _tie(coefs: np.ndarray, blocks: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(d, groups): each group's deviation tied across blocks, a block's entries scaled by the
    sources' typical deviation of a coefficient from its block's mean."""
    tie = np.zeros((coefs.shape[1], int(groups.max()) + 1))
    for block in np.unique(blocks):
        members = blocks == block
        spread = np.abs(coefs[:, members] - coefs[:, members].mean(1, keepdims=True)).mean()
        tie[np.flatnonzero(members), groups[members]] = spread
    return tie


def _transform(scale: str, values: np.ndarray) -> np.ndarray:
    """Log values in one scale: centred logs, or values over their mean."""
    if scale == "log":
        return values - values.mean()
    level = np.exp(values)
    return level / level.mean()


class TablePrior(_Standardised):
    """Bayesian linear regression under the sources' prior, settings by leave-one-out."""

    name: ClassVar[str] = "table_prior"
    needs_sources: ClassVar[bool] = True

    def __init__(self, sigma_floor: float = DEFAULT_SIGMA_FLOOR) -> None:
        self.sigma_floor = sigma_floor
        self.priors: dict[str, _Prior] = {}
        self.mean = self.scale = self.coef = np.zeros(0)
        self.intercept, self.level, self.kind, self.setting = 0.0, 1.0, "log", ""

    def prepare(self, reference: Design) -> None:
        if reference.measured is None or reference.measured.shape[1] == 0:
            raise ValueError("table_prior needs the sources' measured values of the reference "
                             "archs")
        A = self._standardise_on(reference)
        d = A.shape[1]
        D = np.column_stack([np.ones(len(A)), A])
        structure = reference.structure
        floor = np.full(d, SLOPE_FLOOR)
        floor[-2:] = PROXY_FLOOR
        for scale in SCALES:
            coefs, variances = [], []
            for values in reference.measured.T:
                rows = np.isfinite(values)
                if rows.sum() < 2:
                    continue  # no line through fewer archs: no prior component
                t = _transform(scale, values[rows])
                theta, *_ = np.linalg.lstsq(D[rows], t, rcond=None)  # least norm if n < d
                residual = t - D[rows] @ theta
                coefs.append(theta[1:])
                variances.append(float(residual @ residual / max(rows.sum() - D.shape[1], 1)))
            if not coefs:
                raise ValueError("table_prior: no source measured two of the reference archs")
            C = np.asarray(coefs)
            spread = np.atleast_2d(np.cov(C, rowvar=False)) if len(C) > 1 else np.zeros((d, d))
            tie = None
            if structure.blocks is not None and structure.groups is not None:
                tie = np.vstack([_tie(C[:, :-2], structure.blocks[:-2], structure.groups[:-2]),
                                 np.zeros((2, int(structure.groups[:-2].max()) + 1))])
            self.priors[scale] = _Prior(C.mean(0), PRIOR_SCALE * spread + np.diag(floor ** 2),
                                        tie, float(np.mean(variances)))

    def _settings(self, k: int) -> list[tuple[str, float, float]]:
        if k < MIN_LOO:
            return [("log", 0.0, NOISE_FACTORS[0])]
        taus = TAUS if self.priors["log"].tie is not None else (0.0,)
        return list(itertools.product(SCALES, taus, NOISE_FACTORS))

    def fit(self, design: Design, z: np.ndarray) -> None:
        A = self._standardised(design)
        best: tuple[float, Any] | None = None
        for scale, tau, noise in self._settings(len(z)):
            prior = self.priors[scale]
            level = float(np.exp(z).mean()) if scale == "relative" else 1.0
            t = np.exp(z) / level if scale == "relative" else z
            mean, cov = prior.mean, prior.cov
            if tau > 0 and prior.tie is not None:
                cov = cov + tau ** 2 * prior.tie @ prior.tie.T
            projected = A @ cov
            K = projected @ A.T + INTERCEPT + noise * prior.noise * np.eye(len(z))
            Kinv = np.linalg.inv(K)
            alpha = Kinv @ (t - A @ mean)
            loo_t = alpha / np.diag(Kinv)  # t_i minus its leave-one-out prediction
            loo = loo_t if scale == "log" else np.log(t) - np.log(np.maximum(t - loo_t, 1e-6))
            error = float(np.mean(np.square(loo)))
            if best is None or error < best[0]:
                coef = mean + projected.T @ alpha
                best = (error, (scale, tau, noise, level, coef, INTERCEPT * alpha.sum(), loo))
        assert best is not None
        self.kind, tau, noise, self.level, self.coef, self.intercept, self._loo = best[1]
        self.intercept = float(self.intercept)
        self.setting = f"{self.kind} tau={tau:g} noise={noise:g}"

    def predict(self, design: Design) -> np.ndarray:
        mean = self._standardised(design) @ self.coef + self.intercept
        if self.kind == "relative":
            return np.log(np.maximum(mean * self.level, 1e-12))
        return mean

    def state(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "coef": self.coef.tolist(), "intercept": self.intercept, "kind": self.kind,
                "level": self.level, "setting": self.setting, **_loo_state(self)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> TablePrior:
        method = cls(state["sigma_floor"])
        method.mean, method.scale, method.coef = (np.asarray(state[k], dtype=np.float64)
                                                  for k in ("mean", "scale", "coef"))
        method.intercept, method.kind = float(state["intercept"]), str(state["kind"])
        method.level, method.setting = float(state["level"]), str(state["setting"])
        method._loo = _loo_of(state)
        return method


def _loo_state(method: _Fitted) -> dict[str, Any]:
    return {"sigma_floor": method.sigma_floor,
            "loo": None if method.loo is None else method.loo.tolist()}


def _loo_of(state: Mapping[str, Any]) -> np.ndarray | None:
    return None if state["loo"] is None else np.asarray(state["loo"], dtype=np.float64)


class SourceRidge(_Fitted):
    """Ridge of the target's log values on the sources' centred log profiles."""

    name: ClassVar[str] = "source_ridge"
    needs_sources: ClassVar[bool] = True

    def __init__(self, sigma_floor: float = DEFAULT_SIGMA_FLOOR) -> None:
        self.sigma_floor = sigma_floor
        self.center = self.coef = np.zeros(0)
        self.intercept = 0.0

    def prepare(self, reference: Design) -> None:
        if reference.sources.shape[1] == 0:
            raise ValueError("source_ridge needs at least one source")
        self.center = reference.sources.mean(0)

    def fit(self, design: Design, z: np.ndarray) -> None:
        P = design.sources - self.center
        if len(z) < MIN_LOO:  # the sources' mean profile, shifted to the k archs
            self.coef = np.full(P.shape[1], 1 / P.shape[1])
            self.intercept, self._loo = float(np.mean(z - P @ self.coef)), None
            return
        theta, self._loo, _ = ridge_fit(np.column_stack([np.ones(len(z)), P]), z)
        self.intercept, self.coef = float(theta[0]), theta[1:]

    def predict(self, design: Design) -> np.ndarray:
        return self.intercept + (design.sources - self.center) @ self.coef

    def state(self) -> dict[str, Any]:
        return {"center": self.center.tolist(), "coef": self.coef.tolist(),
                "intercept": self.intercept, **_loo_state(self)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SourceRidge:
        method = cls(state["sigma_floor"])
        method.center, method.coef = (np.asarray(state[k], dtype=np.float64)
                                      for k in ("center", "coef"))
        method.intercept, method._loo = float(state["intercept"]), _loo_of(state)
        return method


class FeatureRidge(_Standardised):
    """Ridge on the standardised linear features from the k archs alone (no transfer)."""

    name: ClassVar[str] = "feature_ridge"
    needs_sources: ClassVar[bool] = False

    def __init__(self, sigma_floor: float = DEFAULT_SIGMA_FLOOR) -> None:
        self.sigma_floor = sigma_floor
        self.mean = self.scale = self.coef = np.zeros(0)
        self.intercept = 0.0

    def prepare(self, reference: Design) -> None:
        self._standardise_on(reference)

    def fit(self, design: Design, z: np.ndarray) -> None:
        A = self._standardised(design)
        if len(z) < MIN_LOO:
            self.coef, self.intercept, self._loo = np.zeros(A.shape[1]), float(z.mean()), None
            return
        theta, self._loo, _ = ridge_fit(np.column_stack([np.ones(len(z)), A]), z)
        self.intercept, self.coef = float(theta[0]), theta[1:]

    def predict(self, design: Design) -> np.ndarray:
        return self.intercept + self._standardised(design) @ self.coef

    def state(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "coef": self.coef.tolist(), "intercept": self.intercept, **_loo_state(self)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> FeatureRidge:
        method = cls(state["sigma_floor"])
        method.mean, method.scale, method.coef = (np.asarray(state[k], dtype=np.float64)
                                                  for k in ("mean", "scale", "coef"))
        method.intercept, method._loo = float(state["intercept"]), _loo_of(state)
        return method


class FlopsLine(_Fitted):
    """log(value) = a + b log(FLOPs) through the k archs (b = 1 below two distinct counts)."""

    name: ClassVar[str] = "flops_line"
    needs_sources: ClassVar[bool] = False

    def __init__(self, sigma_floor: float = DEFAULT_SIGMA_FLOOR) -> None:
        self.sigma_floor = sigma_floor
        self.intercept, self.slope = 0.0, 1.0

    def prepare(self, reference: Design) -> None:
        """Nothing to learn: the line uses the k archs alone."""

    def fit(self, design: Design, z: np.ndarray) -> None:
        x = design.linear[:, -2]
        if len(z) < 2 or np.ptp(x) == 0:
            self.slope, self.intercept, self._loo = 1.0, float(np.mean(z - x)), None
            return
        D = np.column_stack([np.ones(len(z)), x])
        theta, *_ = np.linalg.lstsq(D, z, rcond=None)
        hat = np.einsum("ij,ij->i", D @ np.linalg.pinv(D.T @ D), D)
        self.intercept, self.slope = float(theta[0]), float(theta[1])
        self._loo = (z - D @ theta) / np.maximum(1 - hat, 1e-9) if len(z) > 2 else None

    def predict(self, design: Design) -> np.ndarray:
        return self.intercept + self.slope * design.linear[:, -2]

    def state(self) -> dict[str, Any]:
        return {"intercept": self.intercept, "slope": self.slope, **_loo_state(self)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> FlopsLine:
        method = cls(state["sigma_floor"])
        method.intercept, method.slope = float(state["intercept"]), float(state["slope"])
        method._loo = _loo_of(state)
        return method


class MetaRidge(_Standardised):
    """The linear model under a mixture prior of the sources' lines, each weighted by its
    precision and by its likelihood of the k rows up to an offset; MAP."""

    name: ClassVar[str] = "meta_ridge"
    needs_sources: ClassVar[bool] = True

    def __init__(self, sigma_floor: float = DEFAULT_SIGMA_FLOOR, prior_floor: float = 0.05
                 ) -> None:
        self.sigma_floor, self.prior_floor = sigma_floor, prior_floor
        self.mean = self.scale = self.source_coefs = self.source_weights = np.zeros(0)
        self.coef, self.noise = np.zeros(0), float("nan")

    def prepare(self, reference: Design) -> None:
        if reference.measured is None or reference.measured.shape[1] == 0:
            raise ValueError("meta_ridge needs the sources' measured values")
        D = np.column_stack([np.ones(len(reference.linear)), self._standardise_on(reference)])
        coefs, variances = [], []
        for values in reference.measured.T:
            rows = np.isfinite(values)
            if rows.sum() < 2:
                continue
            theta, *_ = np.linalg.lstsq(D[rows], values[rows], rcond=None)
            residual = values[rows] - D[rows] @ theta
            coefs.append(theta[1:])
            variances.append(residual @ residual / max(rows.sum() - D.shape[1], 1))
        if not coefs:
            raise ValueError("meta_ridge: no source measured two of the reference archs")
        precision = 1 / np.maximum(np.asarray(variances), self.prior_floor ** 2)
        self.source_coefs = np.asarray(coefs)
        self.source_weights = precision / precision.sum()
        self.noise = float(len(precision) / precision.sum())

    def fit(self, design: Design, z: np.ndarray) -> None:
        A = self._standardised(design)
        offsets = z[:, None] - A @ self.source_coefs.T
        misfit = ((offsets - offsets.mean(0)) ** 2).sum(0)
        log_weights = np.log(self.source_weights) - misfit / (2 * self.noise)
        weights = np.exp(log_weights - log_weights.max())
        weights /= weights.sum()
        mean = weights @ self.source_coefs
        spread = self.source_coefs - mean
        cov = (spread.T * weights) @ spread + self.prior_floor ** 2 * np.eye(len(mean))
        D = np.column_stack([np.ones(len(z)), A])
        penalty = np.zeros((D.shape[1], D.shape[1]))
        penalty[1:, 1:] = self.noise * np.linalg.inv(cov)
        self.coef, self._loo = penalized_fit(D, z, penalty, np.concatenate([[0.0], mean]))

    def predict(self, design: Design) -> np.ndarray:
        return self.coef[0] + self._standardised(design) @ self.coef[1:]

    def state(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "coef": self.coef.tolist(), "prior_floor": self.prior_floor, **_loo_state(self)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> MetaRidge:
        method = cls(state["sigma_floor"], state["prior_floor"])
        method.mean, method.scale, method.coef = (np.asarray(state[k], dtype=np.float64)
                                                  for k in ("mean", "scale", "coef"))
        method._loo = _loo_of(state)
        return method


class Ensemble:
    """The members' mean log prediction, weighted by 1 / their leave-one-out error."""

    name: ClassVar[str] = "ensemble"
    needs_sources: ClassVar[bool] = True

    def __init__(self, members: list[Method]) -> None:
        if not members:
            raise ValueError("an ensemble needs members")
        self.members = members
        self.weights = np.full(len(members), 1 / len(members))

    @property
    def loo(self) -> None:
        """No closed-form leave-one-out residuals (see ``sigma``)."""
        return None

    @property
    def sigma(self) -> float:
        """The weighted root mean of the members' leave-one-out errors: with fixed weights, an
        upper bound of the ensemble's own (its errors are a convex combination)."""
        return float(np.sqrt(self.weights @ np.square([m.sigma for m in self.members])))

    def prepare(self, reference: Design) -> None:
        for member in self.members:
            member.prepare(reference)

    def fit(self, design: Design, z: np.ndarray) -> None:
        for member in self.members:
            member.fit(design, z)
        errors = np.array([np.inf if m.loo is None else float(np.mean(np.square(m.loo)))
                           for m in self.members])
        if len(z) < MIN_LOO or not np.all(np.isfinite(errors)):
            self.weights = np.full(len(self.members), 1 / len(self.members))
        else:
            weights = errors.min() / np.maximum(errors, 1e-12)
            self.weights = weights / weights.sum()

    def predict(self, design: Design) -> np.ndarray:
        return np.sum([w * m.predict(design) for w, m in
                       zip(self.weights, self.members, strict=True)], axis=0)

    def state(self) -> dict[str, Any]:
        return {"weights": self.weights.tolist(),
                "members": [{"name": m.name, "state": m.state()} for m in self.members]}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Ensemble:
        if any(m["name"] == cls.name for m in state["members"]):
            raise ValueError("an ensemble's members are never ensembles")
        method = cls([method_from_state(m["name"], m["state"]) for m in state["members"]])
        method.weights = np.asarray(state["weights"], dtype=np.float64)
        return method


def ensemble(sigma_floor: float = DEFAULT_SIGMA_FLOOR) -> Ensemble:
    """The default: one predictor of each kind (the sources' prior, flat and weighted towards
    the sources like the target; the sources combined; the FLOPs proxy; the target alone)."""
    return Ensemble([TablePrior(sigma_floor), MetaRidge(sigma_floor), SourceRidge(sigma_floor),
                     FlopsLine(sigma_floor), FeatureRidge(sigma_floor)])


_CLASSES: dict[str, Any] = {"ensemble": Ensemble, "table_prior": TablePrior,
                            "meta_ridge": MetaRidge, "source_ridge": SourceRidge,
                            "feature_ridge": FeatureRidge, "flops_line": FlopsLine}
METHODS = tuple(_CLASSES)


def make_method(name: str, sigma_floor: float = DEFAULT_SIGMA_FLOOR) -> Method:
    """A fresh method by name."""
    if name == "ensemble":
        return ensemble(sigma_floor)
    if name not in _CLASSES:
        raise ValueError(f"unknown transfer method {name!r}; known: {', '.join(METHODS)}")
    method: Method = _CLASSES[name](sigma_floor)
    return method


def method_from_state(name: str, state: Mapping[str, Any]) -> Method:
    """A fitted method from its :meth:`state`."""
    if name not in _CLASSES:
        raise ValueError(f"unknown transfer method {name!r}; known: {', '.join(METHODS)}")
    method: Method = _CLASSES[name].from_state(state)
    return method
