"""Leave-one-target-out evaluation of few-shot adaptation, with baselines and an upper bound.

For every measured target t of a metric (one device under one condition), the other targets of that
metric are the sources (hold-out ``target``), or only those of the other devices (hold-out
``device``: t's device is new, none of its conditions is known). k archs of t are selected
(``designed``, or ``random`` with several seeds), each method is adapted from their k values, and
predictions of t's other measured archs (the test archs) are scored: Spearman ρ, Kendall τ, the
fraction within ±10% of the measured value, the median absolute percentage error (MdAPE) and the
coverage of the interval. Nothing of t beyond its k values reaches a method: source models are
fitted on the sources' tables alone, cross-fitted over archs so that no test arch was seen by them
either.

Baselines in the same table: ``flops`` and ``params`` (ranks by the proxy itself; values by a
log-log line fitted to the k rows), ``nearest_source`` (the source whose log values differ
from t's k values by the most constant offset: its ranking, its values shifted by that
offset), and ``full_surrogate`` (the upper bound: a LightGBM model of t itself, k-fold
cross-validated over all of t's archs; no k).

Column ``tables`` says where the targets come from: ``results`` (the workflow's measurement
and runtime tables) or ``shipped`` (the package's device tables of the scale, when it ships two
devices or more: every target held out with the other devices' tables as sources, hold-out
``device``, :func:`evaluate_shipped`); ``source_devices`` names the sources' devices.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy import stats
from tqdm import tqdm

from .. import published
from ..adaptation.methods import Design, Method, gpt_linear, make_method
from ..adaptation.sources import condition_features, cross_fitted
from ..adaptation.targets import TARGET_KEYS, Profiles, Target, hardware_of, long_table
from ..settings.sections import TransferSettings
from ..space import Arch, SearchSpace
from .selection import select

log = logging.getLogger(__name__)

BASELINES = ("flops", "params", "nearest_source")
HOLD_OUTS = ("target", "device")
UPPER_BOUND = "full_surrogate"
WITHIN = 0.10
RESULTS, SHIPPED = "results", "shipped"  # values of the column ``tables``
QUALITY_SCHEMA = {
    "tables": pl.String, "metric": pl.String, "hold_out": pl.String, "device": pl.String,
    "condition": pl.String,
    "hardware": pl.String, "method": pl.String, "kind": pl.String, "selection": pl.String,
    "k": pl.Int64,
    "seed": pl.Int64, "sources": pl.Int64, "sources_same_hardware": pl.Int64,
    "source_devices": pl.String,
    "n_test": pl.Int64, "spearman": pl.Float64, "kendall_tau": pl.Float64,
    "within_10pct": pl.Float64, "mdape": pl.Float64, "coverage": pl.Float64,
    "status": pl.String, "reason": pl.String,
}
SCORES = ("spearman", "kendall_tau", "within_10pct", "mdape")


def scores(measured: np.ndarray, predicted: np.ndarray, ranking: np.ndarray | None = None
           ) -> dict[str, float]:
    """Rank agreement of ``ranking`` (default: the predictions) with the measured values;
    fraction within ±10% and median absolute percentage error of the predictions."""
    ranking = predicted if ranking is None else ranking
    relative = np.abs(predicted / measured - 1)
    return {"spearman": float(stats.spearmanr(measured, ranking).statistic),
            "kendall_tau": float(stats.kendalltau(measured, ranking).statistic),
            "within_10pct": float(np.mean(relative <= WITHIN)),
            "mdape": float(np.median(relative))}


@dataclass
class Case:
    """A held-out target: its measured archs, their log values, and what the sources say."""

    target_index: int
    rows: np.ndarray            # rows of the profiles that the target measured
    z: np.ndarray               # log values of those rows
    reference: Design           # every arch of the profiles, sources' out-of-fold predictions
    source_logs: np.ndarray     # the sources' measured log values of the rows (else predicted)
    features: np.ndarray        # the rows' feature vectors (what the k archs are selected on)

    @property
    def design(self) -> Design:
        """The design of the target's measured archs."""
        return self.reference.rows(self.rows)


def source_indices(profiles: Profiles, j: int, hold_out: str) -> list[int]:
    """The targets that are sources when target j is held out: every other target
    (``target``), or only the targets of other devices (``device``: as for a new machine)."""
    if hold_out not in HOLD_OUTS:
        raise ValueError(f"unknown hold-out {hold_out!r}; known: {', '.join(HOLD_OUTS)}")
    device = profiles.targets[j].device
    return [s for s, t in enumerate(profiles.targets)
            if s != j and (hold_out == "target" or t.device != device)]


def held_out_case(profiles: Profiles, oof: np.ndarray, features: np.ndarray, j: int,
                  others: Sequence[int]) -> Case:
    """Target j held out with the targets ``others`` as sources (never j itself)."""
    if j in others:
        raise ValueError(f"{profiles.targets[j].name} cannot be its own source")
    others = list(others)
    rows = profiles.measured(j)
    grid = np.ix_(rows, np.asarray(others, dtype=np.intp))  # (measured rows) x (sources)
    measured = np.log(profiles.values[grid])
    source_logs = np.where(np.isnan(measured), oof[grid], measured)
    return Case(j, rows, np.log(profiles.values[rows, j]),
                Design(gpt_linear(features), oof[:, others], np.log(profiles.values[:, others])),
                source_logs, features[rows])


def adapt_predictions(case: Case, method: Method, chosen: np.ndarray) -> np.ndarray:
    """log predictions of all the case's archs by ``method`` (prepared on the case's reference)
    adapted to the rows ``chosen`` (indices into the case's archs)."""
    design = case.design
    method.fit(design.rows(chosen), case.z[chosen])
    return method.predict(design)


def _line(x: np.ndarray, z: np.ndarray) -> tuple[float, float]:
    """Intercept and slope of the least-squares line z ~ x (slope 0 if x is constant)."""
    spread = x - x.mean()
    slope = float(spread @ (z - z.mean()) / (spread @ spread)) if spread @ spread > 0 else 0.0
    return float(z.mean() - slope * x.mean()), slope


def baseline_predictions(case: Case, name: str, chosen: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(ranking, log predictions) of all the case's archs by a baseline from the rows chosen."""
    z = case.z[chosen]
    if name in ("flops", "params"):
        proxy = case.design.linear[:, -2 if name == "flops" else -1]
        intercept, slope = _line(proxy[chosen], z)
        return proxy, intercept + slope * proxy
    if name == "nearest_source":
        offsets = z[:, None] - case.source_logs[chosen]
        nearest = int(np.argmin(offsets.var(axis=0)))
        logs = case.source_logs[:, nearest]
        return logs, logs + offsets[:, nearest].mean()
    raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")


def _interval_coverage(z: np.ndarray, predicted: np.ndarray, sigma: float, coverage: float
                       ) -> float:
    half = stats.norm.ppf(0.5 + coverage / 2) * sigma
    return float(np.mean(np.abs(z - predicted) <= half))


def _kind(method: str) -> str:
    return "baseline" if method in BASELINES else "upper_bound" if method == UPPER_BOUND \
        else "method"


def evaluate_case(case: Case, methods: Mapping[str, Method], section: TransferSettings,
                  base: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Quality rows of one held-out target for every k, selection, seed, method and baseline."""
    n = len(case.rows)
    measured = np.exp(case.z)
    rows: list[dict[str, Any]] = []
    if any(n - k >= section.min_test for k in section.ks):  # else every k is skipped
        ready = {}
        for name, method in methods.items():
            try:
                method.prepare(case.reference)
            except ValueError as err:  # the sources cannot inform this method
                rows.append({**base, "method": name, "kind": "method", "status": "skipped",
                             "reason": str(err)})
                continue
            ready[name] = method
        methods = ready
    for k in section.ks:
        if n - k < section.min_test:
            reason = (f"k = {k} of the {n} measured archs leaves {max(n - k, 0)} to test, "
                      f"fewer than transfer.min_test {section.min_test}")
            rows += [{**base, "method": m, "kind": _kind(m), "k": k, "status": "skipped",
                      "reason": reason} for m in [*methods, *BASELINES]]
            continue
        for selection in section.selections:
            seeds = ([section.seed] if selection == "designed" else
                     [section.seed + i for i in range(section.seeds)])
            for seed in seeds:
                chosen = select(selection, case.features, k, seed)
                test = np.setdiff1d(np.arange(n), chosen)
                common = {**base, "selection": selection, "k": k, "seed": seed,
                          "n_test": len(test), "status": "ok"}
                for name, method in methods.items():
                    predicted = adapt_predictions(case, method, chosen)
                    rows.append({**common, "method": name, "kind": "method",
                                 **scores(measured[test], np.exp(predicted[test])),
                                 "coverage": _interval_coverage(
                                     case.z[test], predicted[test], method.sigma,
                                     section.coverage)})
                for name in BASELINES:
                    ranking, predicted = baseline_predictions(case, name, chosen)
                    rows.append({**common, "method": name, "kind": "baseline",
                                 **scores(measured[test], np.exp(predicted[test]),
                                          ranking[test])})
    return rows


def _skipped_metric(metric: str, reason: str) -> dict[str, Any]:
    log.warning("transfer of %s not evaluated: %s", metric, reason)
    return {"metric": metric, "method": None, "status": "skipped", "reason": reason}


def evaluate_metric(long: pl.DataFrame, space: SearchSpace, vocab_size: int,
                    section: TransferSettings) -> list[dict[str, Any]]:
    """Quality rows of every held-out target of the one metric of ``long``."""
    metric = long["metric"][0]
    counts = long.group_by(TARGET_KEYS).len()
    few = counts.filter(pl.col("len") < section.folds)
    skipped = [{**_skipped_metric(metric, (
        f"{Target.from_columns(row).name}: {row['len']} measured archs, fewer than "
        f"transfer.folds {section.folds}: measure more archs (or quieter: rows timed under "
        "contention are left out, docs/measure.md)")), "device": row["device"],
        "condition": Target.from_columns(row).condition.id}
        for row in few.iter_rows(named=True)]
    if few.height:
        long = long.join(few.select(TARGET_KEYS), on=list(TARGET_KEYS), how="anti",
                         nulls_equal=True)
    if not long.height:
        return skipped
    profiles = Profiles.from_long(long)
    if len(profiles.targets) < 2:
        names = ", ".join(t.name for t in profiles.targets)
        return [*skipped, _skipped_metric(
            metric, f"{len(profiles.targets)} measured target ({names}); leave-one-target-out "
                    "needs at least 2: measure more conditions (measure.batch_sizes, seq_lens, "
                    "dtypes) or devices")]
    encoded = space.encode([Arch.from_id(a) for a in profiles.arch_ids])
    features = condition_features(space, encoded, vocab_size, profiles.targets)
    oof = cross_fitted(profiles, encoded, space, vocab_size, section.source_model,
                       section.folds, section.seed)
    hardware = hardware_of(long)
    rows: list[dict[str, Any]] = list(skipped)
    for hold_out in section.hold_out:
        for j, target in enumerate(tqdm(profiles.targets, desc=f"transfer {metric}, "
                                        f"hold out {hold_out}", unit="target", mininterval=2.0)):
            others = source_indices(profiles, j, hold_out)
            base = {"metric": metric, "hold_out": hold_out, "device": target.device,
                    "condition": target.condition.id, "hardware": hardware[target.device],
                    "sources": len(others),
                    "sources_same_hardware": sum(hardware[profiles.targets[s].device]
                                                 == hardware[target.device] for s in others),
                    "source_devices": ", ".join(sorted({profiles.targets[s].device
                                                        for s in others}))}
            if not others:
                rows.append({**base, "status": "skipped", "reason": (
                    f"no source target measured on another device than {target.device}")})
                continue
            case = held_out_case(profiles, oof, features[j], j, others)
            methods: dict[str, Method] = {name: make_method(name, section.sigma_floor)
                                          for name in section.methods}
            rows += evaluate_case(case, methods, section, base)
            rows.append({**base, "method": UPPER_BOUND, "kind": "upper_bound",
                         "selection": "all", "n_test": len(case.rows), "status": "ok",
                         **scores(np.exp(case.z), np.exp(oof[case.rows, j]))})
    return rows


def evaluate(measurements: pl.DataFrame, space: SearchSpace, vocab_size: int,
             section: TransferSettings) -> pl.DataFrame:
    """The quality table of every metric of ``transfer.metrics`` (one row per held-out target,
    method or baseline, selection, k and seed; skipped rows say why)."""
    long = long_table(measurements, section.metrics)
    rows: list[dict[str, Any]] = []
    for metric in section.metrics:
        part = long.filter(pl.col("metric") == metric)
        rows += (evaluate_metric(part, space, vocab_size, section) if part.height else
                 [_skipped_metric(metric, f"no measured {metric} values (status ok, > 0)")])
    return pl.DataFrame(rows, schema=QUALITY_SCHEMA).with_columns(tables=pl.lit(RESULTS))


def shipped_tables(scale: str, folder: str | Path = published.FOLDER
                   ) -> dict[str, pl.DataFrame]:
    """The scale's shipped device tables by label, when it ships two devices or more (else
    none: nothing to transfer across)."""
    if scale not in published.scales(folder):
        return {}
    if len(published.entry(scale, folder).get("devices", {})) < 2:
        return {}
    return published.device_tables(scale, folder)


def evaluate_shipped(tables: Mapping[str, pl.DataFrame], space: SearchSpace, vocab_size: int,
                     section: TransferSettings) -> pl.DataFrame:
    """The quality rows of cross-device transfer between shipped device tables: every
    (metric, device, condition) held out with the other devices' targets as sources (hold-out
    ``device``), by the methods and baselines of :func:`evaluate`; ``tables`` = ``shipped``."""
    long = long_table(pl.concat(list(tables.values()), how="diagonal_relaxed"),
                      section.metrics)
    across = section.model_copy(update={"hold_out": ("device",)})
    rows: list[dict[str, Any]] = []
    for metric in section.metrics:
        part = long.filter(pl.col("metric") == metric)
        devices = sorted(part["device"].unique())
        if len(devices) < 2:
            rows.append({**_skipped_metric(metric, (
                f"shipped tables: {metric} measured on {len(devices)} device(s) "
                f"({', '.join(devices) or 'none'}); cross-device transfer needs 2")),
                "hold_out": "device"})
            continue
        rows += evaluate_metric(part, space, vocab_size, across)
    return pl.DataFrame(rows, schema=QUALITY_SCHEMA).with_columns(tables=pl.lit(SHIPPED))


def retest(first: pl.DataFrame, second: pl.DataFrame, metrics: Sequence[str]) -> pl.DataFrame:
    """The noise ceiling of each target measured twice: the scores of the second measurement
    as a prediction of the first, over the archs both measured (no model predicts a single
    measurement better than a re-measurement does, on average)."""
    keys = ["metric", "device", "condition", "arch_id"]

    def named(table: pl.DataFrame) -> pl.DataFrame:
        long = long_table(table, metrics)
        return long.with_columns(pl.Series("condition", [
            Target.from_columns(row).condition.id
            for row in long.select(TARGET_KEYS).iter_rows(named=True)], dtype=pl.String))

    paired = named(first).select(*keys, "value").join(
        named(second).select(*keys, pl.col("value").alias("again")), on=keys)
    rows = [{"metric": metric, "device": device, "condition": condition, "n": part.height,
             **scores(part["value"].to_numpy(), part["again"].to_numpy())}
            for (metric, device, condition), part in paired.group_by(
                "metric", "device", "condition", maintain_order=True) if part.height > 2]
    schema = {"metric": pl.String, "device": pl.String, "condition": pl.String, "n": pl.Int64,
              **dict.fromkeys(SCORES, pl.Float64)}
    return pl.DataFrame(rows, schema=schema).sort("metric", "device", "condition")


def summarize(quality: pl.DataFrame, ks: Sequence[int] | None = None) -> pl.DataFrame:
    """Per tables, metric, method, selection and k: the median and the worst over held-out
    targets of each score (averaged over seeds first); the worst MdAPE is the largest."""
    ok = quality.filter(pl.col("status") == "ok")
    if "tables" not in ok.columns:  # a table written before the column
        ok = ok.with_columns(tables=pl.lit(RESULTS))
    if ks is not None:
        ok = ok.filter(pl.col("k").is_in(list(ks)) | pl.col("k").is_null())
    keys = ["tables", "metric", "hold_out", "method", "kind", "selection", "k"]
    per_target = ok.group_by(*keys, "device", "condition").agg(pl.col(s).mean() for s in SCORES)
    return per_target.group_by(*keys).agg(
        pl.len().alias("targets"),
        *(pl.col(s).median().alias(f"{s}_median") for s in SCORES),
        *(pl.col(s).min().alias(f"{s}_worst") for s in SCORES if s != "mdape"),
        pl.col("mdape").max().alias("mdape_worst"),
    ).sort("tables", "metric", "hold_out", "kind", "method", "selection", "k", nulls_last=True)


def shipped_per_target(quality: pl.DataFrame, k: int) -> pl.DataFrame:
    """Spearman ρ of each shipped target at k, mean over seeds: a row per target and
    selection, a column per method and baseline, and the upper bound's (no k)."""
    if "tables" not in quality.columns:
        return pl.DataFrame()
    keys = ["metric", "device", "condition", "source_devices"]
    ok = quality.filter(pl.col("tables") == SHIPPED, pl.col("status") == "ok")
    bound = ok.filter(pl.col("method") == UPPER_BOUND).select(
        *keys, pl.col("spearman").alias(UPPER_BOUND))
    return ok.filter(pl.col("k") == k).pivot(
        "method", index=[*keys, "selection"], values="spearman", aggregate_function="mean",
        sort_columns=False).join(bound, on=keys, how="left").sort(*keys, "selection")


def report(quality: pl.DataFrame, report_k: int) -> pl.DataFrame:
    """The stage's summary table: :func:`summarize` at every k (the figure's), its rows at
    ``report_k`` (and those without a k) marked ``reported`` (the report's table)."""
    return summarize(quality).with_columns(
        reported=pl.col("k").is_in([report_k]) | pl.col("k").is_null())
