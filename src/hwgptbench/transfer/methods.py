"""Adaptation methods: a model of a new target's log(value) per arch from k measured archs.

Each method is prepared on a reference set of archs with what the *sources* say about them
(never the target's values), then fitted on the k measured rows of the target:

- ``ridge`` (simple baseline): ridge regression of log(value) on analytic features of the
  target's condition (log FLOPs, log parameters, layers, log widths, bias), standardised over
  the reference archs; the penalty is chosen by exact leave-one-out error on the k rows.
- ``meta_ridge`` (learned transfer, the default): the same linear model, with a Gaussian prior
  over its slopes learned from the sources' measured values (a precision-weighted mixture of
  the sources' own lines, weighted again by how well each explains the k rows); MAP.
- ``basis`` (learned transfer): the source targets' log predictions, centred, span a low-rank
  basis (SVD over the reference archs); a new target is an offset plus a combination of the
  basis with a Gaussian prior learned from the sources (mean and covariance of the sources'
  own coefficients; noise from how well each source is spanned by the others); MAP.
- ``boost``: ``meta_ridge``, then LightGBM boosting of its residuals on the target's features
  (``init_score`` = its prediction): corrects what the linear model misses once k is large.

Every method reports ``sigma``, the root mean squared leave-one-out residual of the k rows in
log units (at least the sources' noise where a method learns one; ``meta_ridge``'s for
``boost``), from which intervals are drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from ..lightgbm_core import booster_from_string, lgb
from ..predictors.base import FIX
from ..settings.sections import TransferSettings
from .sources import train_booster

RIDGE_ALPHAS = (1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1e3)
SUMMARY_FEATURES = ("log_flops", "log_params", "n_layer", "log_embed_dim", "log_attention_width",
                    "log_mlp_width", "bias")


@dataclass
class Design:
    """What a method sees of n archs: surrogate features of the target's condition (n, d),
    log predictions of the S source targets (n, S) and, for preparing on reference archs, the
    sources' measured log values (n, S; NaN where a source did not measure an arch)."""

    features: np.ndarray
    sources: np.ndarray
    measured: np.ndarray | None = None

    def rows(self, index: np.ndarray) -> Design:
        """The design of a subset of the archs."""
        return Design(self.features[index], self.sources[index],
                      None if self.measured is None else self.measured[index])


def summary_features(features: np.ndarray) -> np.ndarray:
    """The analytic columns of ``SUMMARY_FEATURES`` from a surrogate feature matrix
    (``space.encode`` columns, then log parameters and log FLOPs)."""
    n_max = (features.shape[1] - 5) // 2
    embed = features[:, 0].astype(np.float64)
    heads = features[:, 3:3 + n_max].sum(1, dtype=np.float64)
    hidden = (features[:, 3 + n_max:3 + 2 * n_max] * features[:, :1]).sum(1, dtype=np.float64)
    return np.column_stack([features[:, -1], features[:, -2], features[:, 1], np.log(embed),
                            np.log(np.maximum(heads, 1)), np.log(np.maximum(hidden, 1)),
                            features[:, 2]]).astype(np.float64)


def penalized_fit(D: np.ndarray, z: np.ndarray, penalty: np.ndarray, prior: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients minimising |z - D θ|² + (θ - prior)ᵀ penalty (θ - prior), and the exact
    leave-one-out residuals of that linear smoother."""
    gram = D.T @ D + penalty + 1e-10 * np.eye(D.shape[1])
    theta = np.linalg.solve(gram, D.T @ z + penalty @ prior)
    hat = np.einsum("ij,ij->i", D, np.linalg.solve(gram, D.T).T)
    loo = (z - D @ theta) / np.maximum(1 - hat, 1e-9)
    return theta, loo


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(values))))


class Method(Protocol):
    """An adaptation method (see the module doc)."""

    name: ClassVar[str]
    needs_sources: ClassVar[bool]

    @property
    def sigma(self) -> float:
        """Leave-one-out residual scale of the fit (log units)."""

    def prepare(self, reference: Design) -> None:
        """Learn from the sources' predictions of the reference archs."""

    def fit(self, design: Design, z: np.ndarray) -> None:
        """Adapt to the target's log values z of the k rows of design."""

    def predict(self, design: Design) -> np.ndarray:
        """log(value) predictions (n,)."""

    def state(self) -> dict[str, Any]:
        """Everything needed to predict, as JSON-compatible values."""


class _Standardised:
    """Analytic features standardised over the reference archs (shared by the ridges)."""

    mean: np.ndarray
    scale: np.ndarray

    def _standardised(self, design: Design) -> np.ndarray:
        return (summary_features(design.features) - self.mean) / self.scale

    def _standardise_on(self, reference: Design) -> np.ndarray:
        summary = summary_features(reference.features)
        self.mean, scale = summary.mean(0), summary.std(0)
        self.scale = np.where(scale > 0, scale, 1.0)
        return (summary - self.mean) / self.scale


class Ridge(_Standardised):
    """Ridge in log space on standardised analytic features; penalty by leave-one-out."""

    name: ClassVar[str] = "ridge"
    needs_sources: ClassVar[bool] = False

    def __init__(self, alphas: tuple[float, ...] = RIDGE_ALPHAS) -> None:
        self.alphas = tuple(alphas)
        self.mean = self.scale = self.coef = np.zeros(0)
        self.alpha, self.sigma = float("nan"), float("nan")

    def prepare(self, reference: Design) -> None:
        self._standardise_on(reference)

    def fit(self, design: Design, z: np.ndarray) -> None:
        D = np.column_stack([np.ones(len(z)), self._standardised(design)])
        prior = np.zeros(D.shape[1])
        best: tuple[float, float, np.ndarray] | None = None
        for alpha in self.alphas:
            penalty = np.diag([0.0] + [alpha] * (D.shape[1] - 1))
            theta, loo = penalized_fit(D, z, penalty, prior)
            if best is None or _rms(loo) < best[0]:
                best = (_rms(loo), alpha, theta)
        if best is None:
            raise ValueError("ridge has no penalty to choose from: alphas is empty")
        self.sigma, self.alpha, self.coef = best

    def predict(self, design: Design) -> np.ndarray:
        return self.coef[0] + self._standardised(design) @ self.coef[1:]

    def state(self) -> dict[str, Any]:
        return {"alphas": list(self.alphas), "mean": self.mean.tolist(),
                "scale": self.scale.tolist(), "coef": self.coef.tolist(), "alpha": self.alpha,
                "sigma": self.sigma}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Ridge:
        method = cls(tuple(state["alphas"]))
        method.mean, method.scale, method.coef = (np.asarray(state[k]) for k in
                                                  ("mean", "scale", "coef"))
        method.alpha, method.sigma = state["alpha"], state["sigma"]
        return method


class MetaRidge(_Standardised):
    """The ridge's linear model with a prior learned from the sources.

    Each source's own line (least squares of its measured log values on the target's
    standardised features) is one component of a mixture prior over the slopes, weighted by
    the source's precision (1 / its residual variance: a source whose measurements are noise
    counts little) and by how well its slopes explain the k rows up to an offset (their
    likelihood under it). The mixture's mean and covariance (floored) form the Gaussian prior
    that the k rows update (MAP, free intercept): two rows already give a full model, more
    rows move it to the target's own fit.
    """

    name: ClassVar[str] = "meta_ridge"
    needs_sources: ClassVar[bool] = True

    def __init__(self, prior_floor: float = 0.05) -> None:
        if prior_floor <= 0:
            raise ValueError(f"need prior_floor > 0, got {prior_floor}")
        self.prior_floor = prior_floor
        self.mean = self.scale = self.source_coefs = self.source_weights = np.zeros(0)
        self.coef = np.zeros(0)
        self.noise, self.sigma = float("nan"), float("nan")

    def prepare(self, reference: Design) -> None:
        if reference.measured is None or reference.measured.shape[1] == 0:
            raise ValueError("meta_ridge needs the sources' measured values of the reference "
                             "archs")
        Z = self._standardise_on(reference)
        D = np.column_stack([np.ones(len(Z)), Z])
        coefs, variances = [], []
        for values in reference.measured.T:
            rows = np.isfinite(values)
            if rows.sum() <= D.shape[1]:
                continue  # too few measured archs to fit a line: no prior component
            theta, *_ = np.linalg.lstsq(D[rows], values[rows], rcond=None)
            residual = values[rows] - D[rows] @ theta
            coefs.append(theta[1:])
            variances.append(residual @ residual / (rows.sum() - D.shape[1]))
        if not coefs:
            raise ValueError(f"meta_ridge: no source measured more than {D.shape[1]} of the "
                             "reference archs")
        precision = 1 / np.maximum(np.asarray(variances), self.prior_floor ** 2)
        self.source_coefs = np.asarray(coefs)
        self.source_weights = precision / precision.sum()
        self.noise = float(len(precision) / precision.sum())  # harmonic mean of variances

    def prior(self, Z: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and covariance of the slopes' prior given the rows (standardised Z, z)."""
        offsets = z[:, None] - Z @ self.source_coefs.T
        misfit = ((offsets - offsets.mean(0)) ** 2).sum(0)
        log_weights = np.log(self.source_weights) - misfit / (2 * self.noise)
        weights = np.exp(log_weights - log_weights.max())
        weights /= weights.sum()
        mean = weights @ self.source_coefs
        spread = self.source_coefs - mean
        return mean, (spread.T * weights) @ spread + self.prior_floor ** 2 * np.eye(len(mean))

    def fit(self, design: Design, z: np.ndarray) -> None:
        Z = self._standardised(design)
        D = np.column_stack([np.ones(len(z)), Z])
        mean, cov = self.prior(Z, z)
        penalty = np.zeros((D.shape[1], D.shape[1]))
        penalty[1:, 1:] = self.noise * np.linalg.inv(cov)
        self.coef, loo = penalized_fit(D, z, penalty, np.concatenate([[0.0], mean]))
        self.sigma = max(_rms(loo), float(np.sqrt(self.noise)))  # floor: the sources' noise

    def predict(self, design: Design) -> np.ndarray:
        return self.coef[0] + self._standardised(design) @ self.coef[1:]

    def state(self) -> dict[str, Any]:
        arrays = ("mean", "scale", "source_coefs", "source_weights", "coef")
        return {"prior_floor": self.prior_floor, "noise": self.noise, "sigma": self.sigma,
                **{k: getattr(self, k).tolist() for k in arrays}}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> MetaRidge:
        method = cls(state["prior_floor"])
        for key in ("mean", "scale", "source_coefs", "source_weights", "coef"):
            setattr(method, key, np.asarray(state[key], dtype=np.float64))
        method.noise, method.sigma = state["noise"], state["sigma"]
        return method


def _rank(singular: np.ndarray, max_rank: int, rows: int) -> int:
    """Components kept: at most max_rank and rows - 1, none numerically zero."""
    if len(singular) == 0 or singular[0] <= 0:
        return 0
    return int(min(max_rank, rows - 1, np.sum(singular > singular[0] * 1e-6)))


def _span_residual(C: np.ndarray, column: int, max_rank: int) -> float:
    """Mean squared residual of centred source column off the basis of the other columns."""
    others = np.delete(C, column, axis=1)
    U, singular, _ = np.linalg.svd(others, full_matrices=False)
    U = U[:, :_rank(singular, max_rank, len(C))]
    y = C[:, column]
    return float(np.mean((y - U @ (U.T @ y)) ** 2))


class Basis:
    """An offset plus a low-rank combination of source profiles, MAP under a learned prior."""

    name: ClassVar[str] = "basis"
    needs_sources: ClassVar[bool] = True

    def __init__(self, max_rank: int = 8, prior_floor: float = 0.05) -> None:
        if max_rank < 1 or prior_floor <= 0:
            raise ValueError(f"need max_rank >= 1 and prior_floor > 0, got {max_rank}, "
                             f"{prior_floor}")
        self.max_rank, self.prior_floor = max_rank, prior_floor
        self.center = self.loadings = self.prior_mean = self.prior_cov = self.coef = np.zeros(0)
        self.noise, self.sigma = float("nan"), float("nan")

    def prepare(self, reference: Design) -> None:
        G = reference.sources
        if G.shape[1] == 0:
            raise ValueError("the basis method needs at least one source target")
        n = len(G)
        self.center = G.mean(0)
        C = G - self.center
        _, singular, Vt = np.linalg.svd(C, full_matrices=False)
        r = max(_rank(singular, self.max_rank, n), 1)
        # basis scores u(a) = (g(a) - center) @ loadings have unit variance over the reference
        self.loadings = Vt[:r].T / np.maximum(singular[:r], 1e-12) * np.sqrt(n)
        coords = (Vt[:r] * singular[:r, None]).T / np.sqrt(n)  # each source's coefficients
        floor = self.prior_floor ** 2
        self.prior_mean = coords.mean(0)
        spread = (np.atleast_2d(np.cov(coords, rowvar=False)) if len(coords) > 1
                  else np.zeros((r, r)))
        self.prior_cov = spread + floor * np.eye(r)
        residuals = [_span_residual(C, s, self.max_rank) for s in range(C.shape[1])] \
            if C.shape[1] > 1 else []
        self.noise = max(float(np.mean(residuals)) if residuals else 0.0, floor)

    def _design_matrix(self, design: Design) -> np.ndarray:
        scores = (design.sources - self.center) @ self.loadings
        return np.column_stack([np.ones(len(scores)), scores])

    def fit(self, design: Design, z: np.ndarray) -> None:
        D = self._design_matrix(design)
        r = D.shape[1] - 1
        penalty = np.zeros((r + 1, r + 1))
        penalty[1:, 1:] = self.noise * np.linalg.inv(self.prior_cov)
        prior = np.concatenate([[0.0], self.prior_mean])
        self.coef, loo = penalized_fit(D, z, penalty, prior)
        self.sigma = max(_rms(loo), float(np.sqrt(self.noise)))  # floor: the sources' noise

    def predict(self, design: Design) -> np.ndarray:
        return self._design_matrix(design) @ self.coef

    def state(self) -> dict[str, Any]:
        arrays = ("center", "loadings", "prior_mean", "prior_cov", "coef")
        return {"max_rank": self.max_rank, "prior_floor": self.prior_floor,
                "noise": self.noise, "sigma": self.sigma,
                **{k: getattr(self, k).tolist() for k in arrays}}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Basis:
        method = cls(state["max_rank"], state["prior_floor"])
        for key in ("center", "loadings", "prior_mean", "prior_cov", "coef"):
            setattr(method, key, np.asarray(state[key], dtype=np.float64))
        method.noise, method.sigma = state["noise"], state["sigma"]
        return method


class Boost:
    """A learned linear method (``meta_ridge``), then LightGBM boosting of its residuals on the
    target's features (``init_score`` = its prediction)."""

    name: ClassVar[str] = "boost"
    needs_sources: ClassVar[bool] = True

    def __init__(self, base: Method, params: Mapping[str, Any], seed: int = 0) -> None:
        self.base, self.params, self.seed = base, dict(params), seed
        self.booster: lgb.Booster | None = None

    @property
    def sigma(self) -> float:
        """The base method's leave-one-out residual scale."""
        return self.base.sigma

    def prepare(self, reference: Design) -> None:
        self.base.prepare(reference)

    def fit(self, design: Design, z: np.ndarray) -> None:
        self.base.fit(design, z)
        self.booster = train_booster(design.features, z, self.params, self.seed,
                                     init_score=self.base.predict(design))

    def predict(self, design: Design) -> np.ndarray:
        if self.booster is None:
            raise RuntimeError("Boost is not fitted")
        return self.base.predict(design) + self.booster.predict(design.features)

    def state(self) -> dict[str, Any]:
        if self.booster is None:
            raise RuntimeError("Boost is not fitted")
        return {"base": self.base.name, "base_state": self.base.state(), "params": self.params,
                "seed": self.seed, "booster": self.booster.model_to_string()}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Boost:
        method = cls(method_from_state(state["base"], state["base_state"]), state["params"],
                     state["seed"])
        method.booster = booster_from_string(state["booster"], "the boost method's state", FIX)
        return method


METHODS: dict[str, Any] = {"ridge": Ridge, "meta_ridge": MetaRidge, "basis": Basis,
                           "boost": Boost}


def make_method(name: str, section: TransferSettings) -> Method:
    """A fresh method from the ``transfer`` params section."""
    if name == "ridge":
        return Ridge()
    if name == "meta_ridge":
        return MetaRidge(section.prior_floor)
    if name == "basis":
        return Basis(section.basis.max_rank, section.prior_floor)
    if name == "boost":
        return Boost(MetaRidge(section.prior_floor), section.boost, section.seed)
    raise ValueError(f"unknown transfer method {name!r}; known: {', '.join(METHODS)}")


def method_from_state(name: str, state: Mapping[str, Any]) -> Method:
    """A fitted method from its :meth:`state`."""
    if name not in METHODS:
        raise ValueError(f"unknown transfer method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name].from_state(state)
