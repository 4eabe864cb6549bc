"""The transfer methods on other projects' public data (docs/transfer.md, "Other projects'
data"): each split's held-out devices, k archs drawn many times, the package's own methods
(:mod:`.methods`) and baselines (:mod:`.evaluate`) scored with intervals over draws.

A held-out device becomes an :class:`~.evaluate.Case` as in the transfer stage: the reference
archs are the target's and every source's archs; a source's profile of an arch is its measured
log latency where it measured the arch, else a LightGBM model of the source.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
from scipy import stats
from tqdm import tqdm

from ..adaptation.methods import METHODS, Design, Structure, make_method
from ..adaptation.sources import train_booster
from .evaluate import BASELINES, Case, adapt_predictions, baseline_predictions, scores
from .external import DeviceTable, ExternalDataError, ExternalSet, Split, device_of

log = logging.getLogger(__name__)

SOURCE_MODEL = {"num_leaves": 31, "learning_rate": 0.05, "num_iterations": 400,
                "min_data_in_leaf": 20}
QUALITY_SCHEMA = {"set": pl.String, "split": pl.String, "role": pl.String, "target": pl.String,
                  "method": pl.String, "k": pl.Int64, "seed": pl.Int64, "test": pl.String,
                  "n_test": pl.Int64, "spearman": pl.Float64, "within_10pct": pl.Float64,
                  "mdape": pl.Float64}


def linear_of(table: DeviceTable) -> np.ndarray:
    """A table's linear features: its feature vectors, then log FLOPs and log parameters."""
    return np.column_stack([table.features, np.log(table.flops), np.log(table.params)])


def structure_of(data: ExternalSet) -> Structure:
    """Which linear columns are standardised (the proxies always) and the indicator blocks."""
    d = len(data.feature_names) + 2
    standardise = np.ones(d, dtype=bool) if data.standardise else np.arange(d) >= d - 2
    if data.blocks is None or data.groups is None:
        return Structure(standardise)
    return Structure(standardise, np.concatenate([data.blocks, [-1, -1]]),
                     np.concatenate([data.groups, [-1, -1]]))


def case_of(data: ExternalSet, target: str, sources: Sequence[str], seed: int = 0) -> Case:
    """The held-out target with the given sources (never the target itself)."""
    if target in sources or not sources:
        raise ExternalDataError(f"{target}: need sources other than itself, got "
                                f"{list(sources)}")
    own = data.table(target)
    tables = [data.table(s) for s in sources]
    same = [len(t.keys) == len(own.keys) and np.array_equal(t.keys, own.keys) for t in tables]
    blocks = [own] + [t for t, shared in zip(tables, same, strict=True) if not shared]
    linear = np.vstack([linear_of(t) for t in blocks])
    features = np.vstack([t.features for t in blocks])
    starts = np.cumsum([0] + [len(t.keys) for t in blocks])
    measured = np.full((len(linear), len(tables)), np.nan)
    profiles = np.empty_like(measured)
    block_of = {id(t): i for i, t in enumerate(blocks)}
    for s, (table, shared) in enumerate(zip(tables, same, strict=True)):
        block = 0 if shared else block_of[id(table)]
        measured[starts[block]:starts[block + 1], s] = np.log(table.values)
        profiles[:, s] = measured[:, s]
        missing = np.isnan(profiles[:, s])
        if missing.any():
            booster = train_booster(table.features, np.log(table.values), SOURCE_MODEL, seed)
            profiles[missing, s] = booster.predict(features[missing])
    reference = Design(linear, profiles, measured, structure_of(data))
    rows = np.arange(len(own.keys))
    return Case(0, rows, np.log(own.values), reference, profiles[rows], own.features)


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
            raise ExternalDataError(f"{split.name}: the help protocol needs "
                                    f"{split.train + split.query} archs, got {n}")
        pool = _trimmed(np.arange(split.train), values)
        query = _trimmed(np.arange(split.train, split.train + split.query), values)
        return pool, {"query": query, "all": None}
    return np.arange(n), {"all": None}


def check_ks(data: ExternalSet, split: Split, ks: Sequence[int]) -> None:
    """Refuse a k that the split cannot draw for one of its targets: more archs than its pool
    holds, or too many to leave 2 archs to score (--ks, paper.external.ks)."""
    for target in split.targets:
        values = data.table(target).values
        pool, _ = pools(split, values)
        most = min(len(pool), len(values) - 2)
        over = [k for k in ks if k > most]
        if over:
            raise ExternalDataError(
                f"--ks {' '.join(map(str, over))}: split {split.name} draws the k archs of "
                f"{target} from {len(pool)} of its {len(values)} archs and scores the rest, so "
                f"k is at most {max(most, 0)} (paper.external.ks for the workflow)")


def sources_of(data: ExternalSet, split: Split, target: str) -> list[str]:
    """The split's sources, or every table of another device outside ``split.exclude``."""
    if split.sources:
        return [s for s in split.sources if s != target]
    return [s for s in data.tables
            if device_of(s) != device_of(target) and s not in split.exclude]


def evaluate_split(data: ExternalSet, split: Split, ks: Sequence[int], seeds: int,
                   methods: Sequence[str] | None = None) -> pl.DataFrame:
    """Quality rows (``QUALITY_SCHEMA``): every target of the split held out, k archs drawn
    from its pool ``seeds`` times per k, every method and baseline fitted and scored on each
    test set."""
    names = list(methods or (*METHODS, *BASELINES))
    unknown = [m for m in names if m not in METHODS and m not in BASELINES]
    if unknown:
        raise ExternalDataError(f"unknown methods {', '.join(unknown)}; known: "
                                f"{', '.join((*METHODS, *BASELINES))}")
    rows: list[dict[str, Any]] = []
    for target in split.targets:
        case = case_of(data, target, sources_of(data, split, target))
        fitted = {name: make_method(name) for name in names if name in METHODS}
        for method in fitted.values():
            method.prepare(case.reference)
        measured = np.exp(case.z)
        pool, tests = pools(split, measured)
        for k, seed in tqdm(list(itertools.product(ks, range(seeds))), mininterval=2.0,
                            desc=f"{split.name}: {target}", unit="draw"):
            chosen = np.random.default_rng([seed, k]).choice(pool, size=k, replace=False)
            outside = np.setdiff1d(np.arange(len(measured)), chosen)
            for name in names:
                if name in fitted:
                    predicted, ranking = adapt_predictions(case, fitted[name], chosen), None
                else:
                    ranking, predicted = baseline_predictions(case, name, chosen)
                for test, scored_rows in tests.items():
                    scored = outside if scored_rows is None else \
                        np.setdiff1d(scored_rows, chosen)
                    rows.append({"set": data.name, "split": split.name, "role": split.role,
                                 "target": target, "method": name, "k": k, "seed": seed,
                                 "test": test, "n_test": len(scored),
                                 **_scored(measured[scored], predicted[scored],
                                           None if ranking is None else ranking[scored])})
    return pl.DataFrame(rows, schema=QUALITY_SCHEMA)


def _scored(measured: np.ndarray, log_predicted: np.ndarray, ranking: np.ndarray | None
            ) -> dict[str, float]:
    got = scores(measured, np.exp(log_predicted), ranking)
    return {key: got[key] for key in ("spearman", "within_10pct", "mdape")}


def own_cv(data: ExternalSet, target: str, folds: int = 5, seed: int = 0) -> dict[str, float]:
    """The upper bound of a full campaign: a LightGBM model of the target's own log latency,
    ``folds``-fold cross-validated over all its archs, scored on every arch (out of fold)."""
    table = data.table(target)
    predicted = out_of_fold(table, folds, seed)
    return _scored(table.values, predicted, None)


def out_of_fold(table: DeviceTable, folds: int = 5, seed: int = 0) -> np.ndarray:
    """Log latency of each arch by a LightGBM model of the table that did not see it."""
    n = len(table.values)
    fold = np.random.default_rng(seed).permutation(n) % folds
    predicted = np.empty(n)
    for i in range(folds):
        booster = train_booster(table.features[fold != i], np.log(table.values[fold != i]),
                                SOURCE_MODEL, seed)
        predicted[fold == i] = booster.predict(table.features[fold == i])
    return predicted


DRIFT_SCHEMA = {"table": pl.String, "first_row": pl.Int64, "last_row": pl.Int64,
                "ratio": pl.Float64, "beyond_10pct": pl.Float64}


def drifting_blocks(table: DeviceTable, block: int = 100, threshold: float = 0.10
                    ) -> pl.DataFrame:
    """Runs of consecutive rows (in the file's order, ``block`` rows at a time) whose median
    measured / modelled latency differs from the table's by more than ``threshold``: the
    model is the table's own LightGBM model, out of fold. Each run with that ratio and its
    share of rows beyond ±10%. A flag, not a filter: the scores use every row."""
    residual = np.log(table.values) - out_of_fold(table)
    residual -= np.median(residual)
    n = len(residual)
    flagged: list[tuple[int, int]] = []
    for start in range(0, n, block):
        stop = min(start + block, n)
        if abs(np.expm1(np.median(residual[start:stop]))) <= threshold:
            continue
        if flagged and flagged[-1][1] == start:
            flagged[-1] = (flagged[-1][0], stop)
        else:
            flagged.append((start, stop))
    rows = [{"table": table.device, "first_row": a, "last_row": b - 1,
             "ratio": float(np.exp(np.median(residual[a:b]))),
             "beyond_10pct": float(np.mean(np.abs(np.expm1(residual[a:b])) > 0.10))}
            for a, b in flagged]
    return pl.DataFrame(rows, schema=DRIFT_SCHEMA)


def summarize(quality: pl.DataFrame, confidence: float = 0.95) -> pl.DataFrame:
    """Per split, target, method, k and test set: the mean over seeds of Spearman and of the
    share within ±10%, each with its t interval (``confidence``) over seeds."""
    keys = ["set", "split", "role", "target", "method", "k", "test"]
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
    return part.group_by("set", "split", "role", "method", "k", "test",
                         maintain_order=True).agg(
        pl.col("spearman_mean").min().alias("spearman_worst"),
        pl.col("spearman_mean").mean().alias("spearman_mean"),
        pl.col("within_10pct_mean").min().alias("within_10pct_worst"),
        pl.col("within_10pct_mean").mean().alias("within_10pct_mean"))
