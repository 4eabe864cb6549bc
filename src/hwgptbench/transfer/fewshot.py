"""Few-shot transfer on any feature vectors: methods, baselines and the evaluation of public
splits (docs/transfer.md, "Other projects' data").

A :class:`Problem` is one held-out target device: its archs' features, the sources' log
latency of those archs (measured where a source measured the same arch, else predicted by a
LightGBM model of the source), and a prior over linear models learned from the sources (each
source's least-squares line on its own archs). Every method fits k measured archs and returns
log latency predictions of any arch (:class:`Fit`).

Methods (``METHODS``):

- ``table_prior``: Bayesian linear regression on the features (a Gaussian process with a
  linear kernel): prior mean = the sources' mean line, prior covariance = 2 x the covariance
  of the sources' lines + 0.01² per feature, noise = 0.1 x the sources' mean residual
  variance, free intercept; in log space. The same hierarchical prior as ``meta_ridge``, for
  features of any kind.
- ``table_prior_cv``: the same, with its settings chosen per target by leave-one-out error
  on the k archs among: log or relative (value / mean) scale, noise factor 0.1 or 1, and a
  tie of strength τ ∈ {0, 0.1, 0.3, 1}: for indicator features of (layer, op) an op's
  deviation from the sources' prior is shared by every layer (scaled by the layer's typical
  cost), i.e. "this device runs op o faster or slower than the sources do".
- ``source_ridge``: ridge regression of the target's log values on the sources' log profiles
  (penalty by leave-one-out): a learned combination of the source devices.
- ``feature_ridge``: ridge on the standardised features from the k archs alone (no transfer).
- ``ensemble``: the mean log prediction of ``table_prior_cv``, ``source_ridge``, the
  ``flops`` line and ``feature_ridge``, weighted by 1 / their leave-one-out error on the k
  archs.
- ``select``: per target, whichever of the other methods and baselines has the smallest
  leave-one-out error on the k archs.

Baselines: ``flops`` and ``params`` (the proxy's ranking; values from a log-log line through
the k archs), ``best_source`` (the source whose ranking of the k archs agrees best, Spearman),
``nearest_source`` (the source whose log values differ from the k values by the most constant
offset; the rule of :mod:`.evaluate`).

With fewer than 3 archs a leave-one-out choice is not possible: the choosing methods fall back
to ``table_prior`` and the choosing baselines to the sources' mean profile.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from scipy import stats
from tqdm import tqdm

from .external import DeviceTable, ExternalSet, Split, device_of
from .sources import train_booster

log = logging.getLogger(__name__)

WITHIN = 0.10
RIDGE_ALPHAS = (1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0)
TAUS = (0.0, 0.1, 0.3, 1.0)
NOISE_FACTORS = (0.1, 1.0)
PRIOR_SCALE, PRIOR_FLOOR, NOISE_FACTOR = 2.0, 0.01, 0.1
PROXY_FLOOR = 0.1  # prior sd of the slopes of the standardised log flops and log params
INTERCEPT = 100.0  # prior variance of the free intercept (log units)
SOURCE_MODEL = {"num_leaves": 31, "learning_rate": 0.05, "num_iterations": 400,
                "min_data_in_leaf": 20}
QUALITY_SCHEMA = {"set": pl.String, "split": pl.String, "target": pl.String,
                  "method": pl.String, "k": pl.Int64, "seed": pl.Int64, "test": pl.String,
                  "n_test": pl.Int64, "spearman": pl.Float64, "within_10pct": pl.Float64,
                  "mdape": pl.Float64, "chosen": pl.String}


@dataclass
class SourcePrior:
    """The sources' lines on the target's features in one scale (``log``: log value minus its
    mean; ``relative``: value / its mean): mean (d,), covariance (d, d), the mean residual
    variance, and the tie matrix (d, groups) or None."""

    mean: np.ndarray
    cov: np.ndarray
    noise: float
    tie: np.ndarray | None


@dataclass
class Problem:
    """One held-out target: its archs and what the sources say about them."""

    target: str
    sources: list[str]
    features: np.ndarray      # (n, d), standardised where the set says so
    values: np.ndarray        # (n,) measured latency
    flops: np.ndarray
    params: np.ndarray
    profiles: np.ndarray      # (n, S) sources' log latency of the target's archs
    priors: dict[str, SourcePrior]
    _cache: dict[Any, np.ndarray] = field(default_factory=dict, repr=False)

    def covariance(self, scale: str, tau: float) -> np.ndarray:
        """The prior covariance of the line's slopes in one scale with tie strength tau."""
        key = ("cov", scale, tau)
        if key not in self._cache:
            prior = self.priors[scale]
            floor = np.full(len(prior.mean), PRIOR_FLOOR)
            floor[-2:] = PROXY_FLOOR
            cov = PRIOR_SCALE * prior.cov + np.diag(floor ** 2)
            if tau > 0 and prior.tie is not None:
                cov = cov + tau ** 2 * prior.tie @ prior.tie.T
            self._cache[key] = cov
        return self._cache[key]

    def projected(self, scale: str, tau: float) -> np.ndarray:
        """features @ covariance (n, d), cached."""
        key = ("xc", scale, tau)
        if key not in self._cache:
            self._cache[key] = self.features @ self.covariance(scale, tau)
        return self._cache[key]


@dataclass
class Fit:
    """A fitted method: log predictions of rows, and its leave-one-out log residuals on the k
    archs (None where it cannot say)."""

    predict: Callable[[np.ndarray], np.ndarray]
    loo: np.ndarray | None
    ranking: Callable[[np.ndarray], np.ndarray] | None = None
    chosen: str = ""


def _with_proxies(table: DeviceTable) -> DeviceTable:
    """The table with log flops and log params appended to its features."""
    features = np.column_stack([table.features, np.log(table.flops), np.log(table.params)])
    return DeviceTable(table.device, table.keys, features, table.values, table.flops,
                       table.params)


def _lines(tables: Sequence[DeviceTable], transform: Callable[[np.ndarray], np.ndarray],
           mean: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    coefs, variances = [], []
    for table in tables:
        target = transform(table.values)
        D = np.column_stack([np.ones(len(target)), (table.features - mean) / scale])
        theta, *_ = np.linalg.lstsq(D, target, rcond=None)
        residual = target - D @ theta
        coefs.append(theta[1:])
        variances.append(float(residual @ residual / max(len(target) - D.shape[1], 1)))
    return np.asarray(coefs), np.asarray(variances)


def _tie(coefs: np.ndarray, blocks: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(d, groups) matrix tying each group's deviation across blocks, a block's column entries
    scaled by the sources' typical deviation of a coefficient from its block's mean."""
    tie = np.zeros((coefs.shape[1], int(groups.max()) + 1))
    for block in np.unique(blocks):
        members = blocks == block
        spread = np.abs(coefs[:, members] - coefs[:, members].mean(1, keepdims=True)).mean()
        tie[np.flatnonzero(members), groups[members]] = spread
    return tie


def problem(data: ExternalSet, target: str, sources: Sequence[str], seed: int = 0) -> Problem:
    """The held-out target with the given sources (never the target itself)."""
    if target in sources:
        raise ValueError(f"{target} cannot be its own source")
    table = data.table(target)
    tables = [data.table(s) for s in sources]
    tables = [_with_proxies(t) for t in tables]
    table = _with_proxies(table)
    every = np.vstack([table.features, *(t.features for t in tables)])
    d = every.shape[1]
    standardised = np.arange(d) >= d - 2 if not data.standardise else np.ones(d, dtype=bool)
    mean = np.where(standardised, every.mean(0), 0.0)
    scale = np.where(standardised, every.std(0), 1.0)
    scale = np.where(scale > 0, scale, 1.0)
    profiles = []
    for source in tables:
        if len(source.keys) == len(table.keys) and np.array_equal(source.keys, table.keys):
            profiles.append(np.log(source.values))  # measured on the same archs
            continue
        booster = train_booster(source.features, np.log(source.values), SOURCE_MODEL, seed)
        profiles.append(np.asarray(booster.predict(table.features)))
    priors = {}
    for name, transform in (("log", lambda v: np.log(v) - np.log(v).mean()),
                            ("relative", lambda v: v / v.mean())):
        coefs, variances = _lines(tables, transform, mean, scale)
        cov = np.atleast_2d(np.cov(coefs, rowvar=False)) if len(coefs) > 1 else \
            np.zeros((coefs.shape[1], coefs.shape[1]))
        tie = None if data.blocks is None or data.groups is None else \
            np.vstack([_tie(coefs[:, :-2], data.blocks, data.groups),
                       np.zeros((2, int(data.groups.max()) + 1))])
        priors[name] = SourcePrior(coefs.mean(0), cov, float(variances.mean()), tie)
    return Problem(target, list(sources), (table.features - mean) / scale, table.values,
                   table.flops, table.params, np.column_stack(profiles), priors)


# --- methods ---------------------------------------------------------------------------------

def table_prior(p: Problem, chosen: np.ndarray, z: np.ndarray, scale: str = "log",
                tau: float = 0.0, noise_factor: float = NOISE_FACTOR) -> Fit:
    """Bayesian linear regression under the sources' prior (module doc); exact leave-one-out
    residuals of the posterior mean."""
    prior = p.priors[scale]
    level = float(np.exp(z).mean()) if scale == "relative" else 1.0
    t = np.exp(z) / level if scale == "relative" else z
    A = p.features[chosen]
    K = p.projected(scale, tau)[chosen] @ A.T + INTERCEPT + \
        noise_factor * prior.noise * np.eye(len(z))
    Kinv = np.linalg.inv(K)
    alpha = Kinv @ (t - A @ prior.mean)
    loo_t = alpha / np.diag(Kinv)  # t_i minus its leave-one-out prediction

    def predict(rows: np.ndarray) -> np.ndarray:
        mean = p.features[rows] @ prior.mean + (p.projected(scale, tau)[rows] @ A.T
                                                 + INTERCEPT) @ alpha
        return np.log(np.maximum(mean * level, 1e-12)) if scale == "relative" else mean

    if scale == "relative":
        loo = np.log(t) - np.log(np.maximum(t - loo_t, 1e-6))
    else:
        loo = loo_t
    return Fit(predict, loo, chosen=f"{scale} tau={tau:g} noise={noise_factor:g}")


def table_prior_cv(p: Problem, chosen: np.ndarray, z: np.ndarray) -> Fit:
    """``table_prior`` with scale, noise factor and tie strength chosen by leave-one-out."""
    if len(z) < 3:
        return table_prior(p, chosen, z)
    taus = TAUS if p.priors["log"].tie is not None else (0.0,)
    fits = [table_prior(p, chosen, z, scale, tau, noise) for scale, tau, noise in
            itertools.product(("log", "relative"), taus, NOISE_FACTORS)]
    return min(fits, key=lambda f: (float(np.mean(np.square(f.loo))) if f.loo is not None
                                    else np.inf))


def _ridge(D: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ridge coefficients (free intercept in column 0) with the penalty of least exact
    leave-one-out error, and those residuals."""
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for alpha in RIDGE_ALPHAS:
        penalty = np.diag([0.0] + [alpha] * (D.shape[1] - 1))
        gram = D.T @ D + penalty + 1e-10 * np.eye(D.shape[1])
        theta = np.linalg.solve(gram, D.T @ z)
        hat = np.einsum("ij,ij->i", D, np.linalg.solve(gram, D.T).T)
        loo = (z - D @ theta) / np.maximum(1 - hat, 1e-9)
        if best is None or np.mean(loo ** 2) < best[0]:
            best = (float(np.mean(loo ** 2)), theta, loo)
    assert best is not None
    return best[1], best[2]


def source_ridge(p: Problem, chosen: np.ndarray, z: np.ndarray) -> Fit:
    """Ridge of the target's log values on the sources' log profiles (centred)."""
    if len(z) < 3:
        return _mean_profile(p, chosen, z)
    center = p.profiles.mean(0)
    theta, loo = _ridge(np.column_stack([np.ones(len(z)), p.profiles[chosen] - center]), z)
    return Fit(lambda rows: theta[0] + (p.profiles[rows] - center) @ theta[1:], loo)


def feature_ridge(p: Problem, chosen: np.ndarray, z: np.ndarray) -> Fit:
    """Ridge on the features from the k archs alone."""
    if len(z) < 3:
        return Fit(lambda rows: np.full(len(rows), z.mean()), None)
    theta, loo = _ridge(np.column_stack([np.ones(len(z)), p.features[chosen]]), z)
    return Fit(lambda rows: theta[0] + p.features[rows] @ theta[1:], loo)


def _mean_profile(p: Problem, chosen: np.ndarray, z: np.ndarray) -> Fit:
    profile = p.profiles.mean(1)
    offset = float(np.mean(z - profile[chosen]))
    return Fit(lambda rows: profile[rows] + offset, None)


def _line_fit(x: np.ndarray, chosen: np.ndarray, z: np.ndarray) -> Fit:
    """z ~ a + b x through the k archs (b = 1 for one arch); exact leave-one-out residuals."""
    D = np.column_stack([np.ones(len(z)), x[chosen]])
    if len(z) < 2 or np.ptp(x[chosen]) == 0:
        offset = float(np.mean(z - x[chosen]))
        return Fit(lambda rows: x[rows] + offset, None, lambda rows: x[rows])
    theta, *_ = np.linalg.lstsq(D, z, rcond=None)
    hat = np.einsum("ij,ij->i", D @ np.linalg.pinv(D.T @ D), D)
    loo = (z - D @ theta) / np.maximum(1 - hat, 1e-9) if len(z) > 2 else None
    return Fit(lambda rows: theta[0] + theta[1] * x[rows], loo, lambda rows: x[rows])


def proxy(name: str) -> Callable[[Problem, np.ndarray, np.ndarray], Fit]:
    """The ``flops`` or ``params`` baseline."""
    def fit(p: Problem, chosen: np.ndarray, z: np.ndarray) -> Fit:
        return _line_fit(np.log(getattr(p, name)), chosen, z)
    fit.__name__ = name
    return fit


def _source_fit(p: Problem, source: int, chosen: np.ndarray, z: np.ndarray) -> Fit:
    fit = _line_fit(p.profiles[:, source], chosen, z)
    fit.chosen = p.sources[source]
    return fit


def best_source(p: Problem, chosen: np.ndarray, z: np.ndarray) -> Fit:
    """The source that ranks the k archs most like the target (Spearman; ties: the first)."""
    if len(z) < 3:
        return _mean_profile(p, chosen, z)
    agreement = [stats.spearmanr(p.profiles[chosen, s], z).statistic
                 for s in range(p.profiles.shape[1])]
    return _source_fit(p, int(np.nanargmax(np.nan_to_num(agreement, nan=-2.0))), chosen, z)


def nearest_source(p: Problem, chosen: np.ndarray, z: np.ndarray) -> Fit:
    """The source whose log values differ from the k values by the most constant offset; its
    values shifted by that offset."""
    if len(z) < 2:
        return _mean_profile(p, chosen, z)
    offsets = z[:, None] - p.profiles[chosen]
    nearest = int(np.argmin(offsets.var(axis=0)))
    profile, shift = p.profiles[:, nearest], float(offsets[:, nearest].mean())
    n = len(z)
    loo = (offsets[:, nearest] - shift) * n / (n - 1)
    return Fit(lambda rows: profile[rows] + shift, loo, chosen=p.sources[nearest])


def ensemble(p: Problem, chosen: np.ndarray, z: np.ndarray) -> Fit:
    """Weighted mean log prediction of one predictor of each kind: the learned transfer
    (``table_prior_cv``), the sources combined (``source_ridge``), the proxy (``flops``) and
    the target alone (``feature_ridge``), each weighted by 1 / its mean squared leave-one-out
    error on the k archs (equal weights below 3 archs)."""
    members = [table_prior_cv(p, chosen, z), source_ridge(p, chosen, z),
               METHODS["flops"](p, chosen, z), feature_ridge(p, chosen, z)]
    errors = np.array([np.inf if m.loo is None else float(np.mean(np.square(m.loo)))
                       for m in members])
    if len(z) < 3 or not np.all(np.isfinite(errors)):
        weights = np.full(len(members), 1 / len(members))
    else:
        weights = 1 / np.maximum(errors, 1e-12)
        weights /= weights.sum()
    label = ", ".join(f"{w:.2f}" for w in weights)
    return Fit(lambda rows: np.sum([w * m.predict(rows) for w, m in
                                    zip(weights, members, strict=True)], axis=0),
               None, chosen=f"weights {label}")


def _loo(method: Callable[[Problem, np.ndarray, np.ndarray], Fit], p: Problem,
         chosen: np.ndarray, z: np.ndarray) -> float:
    """Mean squared leave-one-out log residual of a method on the k archs (refitted where the
    method has no closed form)."""
    fit = method(p, chosen, z)
    if fit.loo is not None:
        return float(np.mean(np.square(fit.loo)))
    residuals = []
    for i in range(len(z)):
        keep = np.arange(len(z)) != i
        residuals.append(method(p, chosen[keep], z[keep]).predict(chosen[i:i + 1])[0] - z[i])
    return float(np.mean(np.square(residuals)))


def select(p: Problem, chosen: np.ndarray, z: np.ndarray) -> Fit:
    """Whichever method or baseline has the least leave-one-out error on the k archs."""
    if len(z) < 3:
        return table_prior(p, chosen, z)
    candidates = {name: m for name, m in METHODS.items() if name != "select"}
    errors = {name: _loo(m, p, chosen, z) for name, m in candidates.items()}
    name = min(errors, key=errors.__getitem__)
    fit = candidates[name](p, chosen, z)
    fit.chosen = f"{name}: {fit.chosen}" if fit.chosen else name
    return fit


METHODS: dict[str, Callable[[Problem, np.ndarray, np.ndarray], Fit]] = {
    "table_prior": table_prior, "table_prior_cv": table_prior_cv,
    "source_ridge": source_ridge, "feature_ridge": feature_ridge, "ensemble": ensemble,
    "flops": proxy("flops"), "params": proxy("params"), "best_source": best_source,
    "nearest_source": nearest_source, "select": select,
}
BASELINES = ("flops", "params", "best_source", "nearest_source")


# --- evaluation ------------------------------------------------------------------------------

def scores(measured: np.ndarray, predicted_log: np.ndarray, ranking: np.ndarray | None = None
           ) -> dict[str, float]:
    """Spearman of the ranking (default: the predictions) with the measured values; share
    within ±10% and median absolute percentage error of the predictions."""
    relative = np.abs(np.exp(predicted_log) / measured - 1)
    rank_by = predicted_log if ranking is None else ranking
    return {"spearman": float(stats.spearmanr(measured, rank_by).statistic),
            "within_10pct": float(np.mean(relative <= WITHIN)),
            "mdape": float(np.median(relative))}


def _trimmed(index: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The archs of ``index`` without the 10% fastest and slowest (HELP's outlier rule)."""
    order = index[np.argsort(values[index], kind="stable")]
    return order[int(len(order) * 0.1):int(len(order) * 0.9)]


def pools(split: Split, values: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray | None]]:
    """Where the k archs are drawn from, and the scored archs per test set (None: every arch
    outside the k)."""
    n = len(values)
    if split.protocol == "help":
        if n < split.train + split.query:
            raise ValueError(f"the help protocol needs {split.train + split.query} archs, "
                             f"got {n}")
        pool = _trimmed(np.arange(split.train), values)
        query = _trimmed(np.arange(split.train, split.train + split.query), values)
        return pool, {"query": query, "all": None}
    return np.arange(n), {"all": None}


def sources_of(data: ExternalSet, split: Split, target: str) -> list[str]:
    """The split's sources, or every table of another device."""
    if split.sources:
        return [s for s in split.sources if s != target]
    return [s for s in data.tables if device_of(s) != device_of(target)]


def evaluate_split(data: ExternalSet, split: Split, ks: Sequence[int], seeds: int,
                   methods: Sequence[str] | None = None) -> pl.DataFrame:
    """Quality rows (``QUALITY_SCHEMA``): every target of the split held out, k archs drawn
    from its pool ``seeds`` times per k, every method fitted and scored on each test set."""
    names = list(methods or METHODS)
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {', '.join(unknown)}; known: {', '.join(METHODS)}")
    rows: list[dict[str, Any]] = []
    for target in split.targets:
        p = problem(data, target, sources_of(data, split, target))
        pool, tests = pools(split, p.values)
        for k, seed in tqdm(list(itertools.product(ks, range(seeds))), mininterval=2.0,
                            desc=f"{split.name}: {target}", unit="draw"):
            chosen = np.random.default_rng([seed, k]).choice(pool, size=k, replace=False)
            z = np.log(p.values[chosen])
            outside = np.setdiff1d(np.arange(len(p.values)), chosen)
            for name in names:
                fit = METHODS[name](p, chosen, z)
                for test, rows_of in tests.items():
                    scored = outside if rows_of is None else np.setdiff1d(rows_of, chosen)
                    ranking = None if fit.ranking is None else fit.ranking(scored)
                    rows.append({"set": data.name, "split": split.name, "target": target,
                                 "method": name, "k": k, "seed": seed, "test": test,
                                 "n_test": len(scored), "chosen": fit.chosen,
                                 **scores(p.values[scored], fit.predict(scored), ranking)})
    return pl.DataFrame(rows, schema=QUALITY_SCHEMA)


def own_cv(data: ExternalSet, target: str, folds: int = 5, seed: int = 0) -> dict[str, float]:
    """The upper bound of a full campaign: a LightGBM model of the target's own log latency,
    ``folds``-fold cross-validated over all its archs, scored on every arch (out of fold)."""
    table = data.table(target)
    n = len(table.values)
    fold = np.random.default_rng(seed).permutation(n) % folds
    predicted = np.empty(n)
    for i in range(folds):
        booster = train_booster(table.features[fold != i], np.log(table.values[fold != i]),
                                SOURCE_MODEL, seed)
        predicted[fold == i] = booster.predict(table.features[fold == i])
    return scores(table.values, predicted)


def summarize(quality: pl.DataFrame, confidence: float = 0.95) -> pl.DataFrame:
    """Per split, target, method, k and test set: the mean over seeds of Spearman and of the
    share within ±10%, each with its t interval (``confidence``) over seeds."""
    keys = ["set", "split", "target", "method", "k", "test"]
    grouped = quality.group_by(keys, maintain_order=True).agg(
        pl.len().alias("seeds"),
        *(pl.col(s).mean().alias(f"{s}_mean") for s in ("spearman", "within_10pct")),
        *(pl.col(s).std().alias(f"{s}_sd") for s in ("spearman", "within_10pct")))
    t = stats.t.ppf(0.5 + confidence / 2, np.maximum(grouped["seeds"].to_numpy() - 1, 1))
    out = grouped
    for s in ("spearman", "within_10pct"):
        half = t * grouped[f"{s}_sd"].fill_null(0.0).to_numpy() / np.sqrt(grouped["seeds"])
        out = out.with_columns(pl.Series(f"{s}_low", grouped[f"{s}_mean"] - half),
                               pl.Series(f"{s}_high", grouped[f"{s}_mean"] + half))
    return out.drop("spearman_sd", "within_10pct_sd")


def worst(summary: pl.DataFrame, by: Mapping[str, Any] | None = None) -> pl.DataFrame:
    """Per split, method, k and test set: the worst target's mean Spearman and share within
    ±10%, and the mean over targets."""
    part = summary.filter(*(pl.col(c) == v for c, v in (by or {}).items())) if by else summary
    return part.group_by("set", "split", "method", "k", "test", maintain_order=True).agg(
        pl.col("spearman_mean").min().alias("spearman_worst"),
        pl.col("spearman_mean").mean().alias("spearman_mean"),
        pl.col("within_10pct_mean").min().alias("within_10pct_worst"),
        pl.col("within_10pct_mean").mean().alias("within_10pct_mean"))
