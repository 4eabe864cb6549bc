"""Fit, cross-validate and store one surrogate per (metric, device, condition), and
perplexity's (device-independent), for every configured family: what the surrogates stage runs
on a workflow's tables and what the shipped tables' cache (:mod:`hwgptbench.published`) runs on
them.

Layout under ``results/{scale}/surrogates/``:
``perplexity/{family}/`` (the fully trained supernet), ``perplexity/steps-{N}/{family}/`` (its
snapshot after N training steps, a lower fidelity) and
``devices/{device}/{metric}/{condition}/{family}/`` (model files + metadata.json),
``devices/{device}/quality.parquet`` and ``perplexity/quality.parquet`` (k-fold quality),
merged into ``quality.parquet`` and ``quality.json`` (DVC metrics); beside each quality table
``predictions.parquet``, the out-of-fold predictions behind it (measured, predicted, interval),
merged into ``predictions.parquet``.

Every (target, family) fit is independent, so ``surrogate.workers`` processes run them in
parallel (each model is single-threaded and seeded, so the results do not depend on it).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from tqdm import tqdm

from ..io import write_parquet
from ..meters.condition import CONDITION_KEYS, condition_id, with_condition_columns
from ..metrics import reason_column, still_contended
from ..outputs import replace_dir
from ..repeatability import REPEAT_MIN, agreement, at_ceiling
from ..schema import ANY
from ..settings.sections import SurrogateSettings
from ..space import SearchSpace, read_archs_from
from ..versions import library_versions
from .base import Surrogate
from .blend import BlendSurrogate
from .conformal import ConformalSurrogate, cross_conformal
from .features import feature_matrix
from .quality import fold_indices, out_of_fold, score
from .store import load_surrogate, save_surrogate

log = logging.getLogger(__name__)

QUALITY_SCHEMA = {
    "metric": pl.String, "device": pl.String, "condition": pl.String, "family": pl.String,
    "status": pl.String, "reason": pl.String, "rows": pl.Int64, "r2": pl.Float64,
    "mae": pl.Float64, "kendall_tau": pl.Float64, "spearman_rho": pl.Float64,
    "within_5pct": pl.Float64, "within_10pct": pl.Float64, "mdape": pl.Float64,
    "max_ape": pl.Float64, "coverage": pl.Float64, "nominal_coverage": pl.Float64,
    "ceiling_archs": pl.Int64, "ceiling_within_5pct": pl.Float64,
    "ceiling_kendall_tau": pl.Float64, "at_ceiling": pl.Boolean, "selected": pl.Boolean,
    "left_out_contended": pl.Int64,
}
# the libraries whose code fits the surrogates, their versions a column each of the quality table
SURROGATE_LIBRARIES = ("torch", "numpy", "lightgbm", "scikit-learn")
# The quality columns a fitted row has, besides its keys
SCORES = ("rows", "r2", "mae", "kendall_tau", "spearman_rho", "within_5pct", "within_10pct",
          "mdape", "max_ape", "coverage")
PREDICTION_SCHEMA = {
    "metric": pl.String, "device": pl.String, "condition": pl.String, "family": pl.String,
    "arch_id": pl.String, "measured": pl.Float64, "predicted": pl.Float64,
    "lower": pl.Float64, "upper": pl.Float64,
}

# how the rows of a run's measure stage are timed again (docs/measure.md)
REMEASURE = ("`snakemake --forcerun measure results/{scale}/measurements.parquet`, then `make "
             "run`; or `hwgptbench measure`; docs/measure.md")


def fidelity_condition(train_steps: int) -> str:
    """Condition of the perplexity surrogate of a lower fidelity, e.g. ``steps-100``."""
    return f"steps-{train_steps}"


def make_factory(section: SurrogateSettings, family: str) -> Callable[[], Surrogate]:
    """A constructor of fresh, unfitted surrogates of a family, from the params section; the
    families' own interval calibration is off, the stage calibrates every family alike
    (:mod:`.conformal`)."""
    coverage, seed = section.coverage, section.seed
    if family == "lightgbm":
        from .lightgbm_model import LightGBMSurrogate

        tail = (1 - coverage) / 2
        return lambda: LightGBMSurrogate(section.lightgbm, (tail, 1 - tail), seed=seed,
                                         calibration_folds=0)
    if family == "linear":
        from .linear import LinearSurrogate

        return lambda: LinearSurrogate(coverage)
    from .mlp import MLPEnsembleSurrogate

    return lambda: MLPEnsembleSurrogate(**section.mlp_ensemble.model_dump(), seed=seed,
                                        coverage=coverage, calibration_folds=0)


def _base_row(section: SurrogateSettings, metric: str, device: str, condition: str
              ) -> dict[str, Any]:
    """The fields a quality row of (metric, device, condition) starts with."""
    return {"metric": metric, "device": device, "condition": condition,
            "nominal_coverage": section.coverage}


def _skipped(section: SurrogateSettings, base: dict[str, Any], reason: str, rows: int
             ) -> list[dict[str, Any]]:
    """Quality rows saying that no family was fitted, and why."""
    return [{**base, "family": family, "status": "skipped", "reason": reason, "rows": rows}
            for family in section.families]


@dataclass(frozen=True)
class _Target:
    """The data of one surrogate target: features, values, where its models go, and why."""

    X: np.ndarray
    y: np.ndarray
    folder: Path
    metadata: dict[str, Any]
    ids: list[str]
    left_out: int = 0  # latencies measured under contention, not fitted



def _scored(section: SurrogateSettings, target: _Target, family: str, quality: dict[str, Any]
            ) -> tuple[dict[str, Any], pl.DataFrame]:
    """The quality row of a family on a target and its out-of-fold predictions."""
    meta = target.metadata
    base = _base_row(section, meta["metric"], meta["device"], meta["condition"])
    ceiling = meta.get("ceiling") or {}
    row = {**base, "family": family, "status": "ok", "reason": None,
           **{k: quality[k] for k in SCORES},
           **{f"ceiling_{k}": ceiling.get(k) for k in ("archs", "within_5pct", "kendall_tau")},
           "at_ceiling": at_ceiling(quality["kendall_tau"], ceiling.get("kendall_tau")),
           "left_out_contended": target.left_out}
    predictions = pl.DataFrame(
        {"metric": base["metric"], "device": base["device"], "condition": base["condition"],
         "family": family, "arch_id": target.ids, "measured": target.y,
         **{k: quality[k] for k in ("predicted", "lower", "upper")}},
        schema=PREDICTION_SCHEMA)
    return row, predictions


def _calibrated_score(section: SurrogateSettings, target: _Target, point: np.ndarray,
                      low: np.ndarray, high: np.ndarray) -> tuple[dict[str, Any], float, bool]:
    """Scores of out-of-fold predictions whose intervals are conformally calibrated without
    their own fold, and the widening of all folds for the stored model."""
    folds = fold_indices(len(target.y), section.folds, section.seed)
    low, high, by, log_space = cross_conformal(target.y, point, low, high, folds,
                                               section.coverage)
    return score(target.y, point, low, high), by, log_space


def _fit_family(section: SurrogateSettings, target: _Target, family: str
                ) -> tuple[dict[str, Any], pl.DataFrame]:
    """Cross-validate and fit one family on a target, calibrate its interval out of fold;
    save it; return its quality row and the out-of-fold predictions of the target's archs."""
    factory = make_factory(section, family)
    point, low, high = out_of_fold(factory, target.X, target.y, section.folds,
                                   section.seed)
    quality, by, log_space = _calibrated_score(section, target, point, low, high)
    save_surrogate(ConformalSurrogate(factory().fit(target.X, target.y), by, log_space),
                   target.folder / family, {**target.metadata, "training_rows": len(target.y)})
    return _scored(section, target, family, quality)


def _fit_blend(section: SurrogateSettings, target: _Target, members: list[pl.DataFrame]
               ) -> tuple[dict[str, Any], pl.DataFrame]:
    """Score the blend of a target's fitted families on their out-of-fold predictions (same
    folds, so that is the blend's own out-of-fold prediction), calibrate its interval like a
    family's and save it beside them."""
    point, low, high = (np.mean([m[column].to_numpy() for m in members], axis=0)
                        for column in ("predicted", "lower", "upper"))
    quality, by, log_space = _calibrated_score(section, target, point, low, high)
    families = [m["family"][0] for m in members]
    blend = BlendSurrogate([load_surrogate(target.folder / f)[0] for f in families])
    save_surrogate(ConformalSurrogate(blend, by, log_space),
                   target.folder / BlendSurrogate.family,
                   {**target.metadata, "training_rows": len(target.y)})
    return _scored(section, target, BlendSurrogate.family, quality)


def _fit_targets(section: SurrogateSettings, targets: list[_Target | list[dict[str, Any]]],
                 staging: Path) -> pl.DataFrame:
    """Fit every family of every target (a list of quality rows stands for a target that
    was skipped), ``surrogate.workers`` fits at a time; write and return the quality table."""
    jobs = [(target, family) for target in targets if isinstance(target, _Target)
            for family in section.families]
    workers = min(section.workers or os.cpu_count() or 1, max(len(jobs), 1))
    progress = tqdm(total=len(jobs), desc="surrogate fits", unit="fit")
    results = []
    with contextlib.ExitStack() as stack:
        if workers > 1:
            # spawn: the workers import torch afresh instead of inheriting this process's threads
            pool = stack.enter_context(ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("spawn")))
            fitted = pool.map(_fit_family, [section] * len(jobs), *zip(*jobs, strict=True))
        else:
            fitted = (_fit_family(section, target, family) for target, family in jobs)
        for row, predicted in fitted:
            log.info("%s %s %s %s: R² %.3f, Kendall τ %.3f, coverage %.2f", row["family"],
                     row["metric"], row["device"], row["condition"], row["r2"],
                     row["kendall_tau"], row["coverage"])
            results.append((row, predicted))
            progress.update()
    progress.close()
    fitted_rows = iter(results)
    rows: list[dict[str, Any]] = []
    predictions: list[pl.DataFrame] = []
    for target in targets:
        if not isinstance(target, _Target):
            rows += target
            continue
        members = [next(fitted_rows) for _family in section.families]
        if len(members) > 1:
            members.append(_fit_blend(section, target, [p for _, p in members]))
        rows += [row for row, _ in members]
        predictions += [p for _, p in members]
    return _write_quality(rows, predictions, staging)


def _target(section: SurrogateSettings, X: np.ndarray, y: np.ndarray, folder: Path,
            metadata: dict[str, Any], ids: Sequence[str]) -> _Target | list[dict[str, Any]]:
    """A target to fit, or its skipped quality rows when it has too few measured archs."""
    if len(y) < section.min_rows:
        base = _base_row(section, metadata["metric"], metadata["device"],
                         metadata["condition"])
        reason = f"{len(y)} measured archs < surrogate.min_rows {section.min_rows}"
        log.warning("%s %s %s: no surrogate: %s", *list(base.values())[:3], reason)
        return _skipped(section, base, reason, len(y))
    return _Target(X, y, folder, metadata, list(ids))


def _metadata(space: SearchSpace, metric: str, device: str, condition: str,
              fingerprint: dict[str, Any], vocab_size: int, batch_size: int, seq_len: int
              ) -> dict[str, Any]:
    return {"space_name": space.name, "space": space.to_dict(), "metric": metric,
            "device": device, "device_fingerprint": fingerprint, "condition": condition,
            "feature_args": {"vocab_size": vocab_size, "batch_size": batch_size,
                             "seq_len": seq_len}}


def fit_perplexity(section: SurrogateSettings, space: SearchSpace, vocab_size: int,
                   table: pl.DataFrame, out_dir: str | os.PathLike[str],
                   metric: str = "perplexity") -> pl.DataFrame:
    """Surrogates of perplexity (or another device-independent ``metric`` column of the
    perplexity table, e.g. accuracy) from the perplexity table, one per training-step
    fidelity; written to ``out_dir``: the largest ``train_steps`` (the fully trained supernet)
    with condition ``any`` in ``{family}/``, each lower one in ``steps-{N}/{family}/``."""
    fidelities = sorted(table["train_steps"].unique(), reverse=True)
    targets: list[_Target | list[dict[str, Any]]] = []
    with replace_dir(out_dir, "fit-surrogates") as staging:
        for steps in fidelities:
            final = steps == fidelities[0]
            group = table.filter(pl.col("train_steps") == steps)
            condition = ANY if final else fidelity_condition(steps)
            X = feature_matrix(space, read_archs_from(group), vocab_size, 1, space.block_size)
            metadata = {**_metadata(space, metric, ANY, condition, {}, vocab_size, 1,
                                    space.block_size), "train_steps": steps}
            folder = staging if final else staging / condition
            targets.append(_target(section, X, group[metric].to_numpy(), folder,
                                   metadata, group["arch_id"].to_list()))
        return _fit_targets(section, targets, staging)


def latency_ceiling(group: pl.DataFrame) -> dict[str, float | int] | None:
    """The agreement of a condition's latencies with their repeat visit
    (``latency_repeat_ms``), None without REPEAT_MIN repeated archs."""
    if "latency_repeat_ms" not in group.columns:
        return None
    pairs = group.filter(pl.col("latency_repeat_ms").is_not_null()
                         & pl.col("latency_ms").is_not_null())
    if pairs.height < REPEAT_MIN:
        return None
    return agreement(pairs["latency_ms"].to_numpy(), pairs["latency_repeat_ms"].to_numpy())


def fit_device(section: SurrogateSettings, space: SearchSpace, vocab_size: int,
               table: pl.DataFrame, out_dir: str | os.PathLike[str]) -> pl.DataFrame:
    """Surrogates of each hardware metric and condition of one device's table (its main
    measurements, and its runtime-dissection rows where measured); a latency surrogate's
    quality row carries its condition's ceiling (:func:`latency_ceiling`) where the table
    has repeat visits."""
    devices = table["device"].unique().to_list()
    if len(devices) != 1:
        raise ValueError(f"a device table holds one device, found {devices}")
    fingerprint_columns = [c for c in ("device_kind", "device_name", "cpu_model",
                                       "gpu_memory_gb", "torch_version") if c in table.columns]
    targets: list[_Target | list[dict[str, Any]]] = []
    with replace_dir(out_dir, "fit-surrogates") as staging:
        ok = with_condition_columns(table.filter(pl.col("status") == "ok"))
        for key, group in ok.group_by(list(CONDITION_KEYS), maintain_order=True):
            condition = condition_id(**dict(zip(CONDITION_KEYS, key, strict=True)))
            X = feature_matrix(space, read_archs_from(group), vocab_size, key[0], key[1])
            fingerprint = group.select(fingerprint_columns).row(0, named=True)
            ceiling = latency_ceiling(group)
            contended = group.with_columns(still_contended(group.columns).alias(
                "_contended"))["_contended"].to_numpy()
            for metric in section.metrics:
                present = group[metric].is_not_null().to_numpy()
                left_out = int((present & contended).sum()) if metric == "latency_ms" else 0
                if left_out:
                    present &= ~contended
                    log.warning("%s %s: %d latencies measured under contention left out of "
                                "fitting (re-measure: %s)", devices[0], condition, left_out,
                                REMEASURE)
                metadata = _metadata(space, metric, devices[0], condition, fingerprint,
                                     vocab_size, key[0], key[1])
                if metric == "latency_ms" and ceiling is not None:
                    metadata["ceiling"] = ceiling
                if not present.any():
                    base = _base_row(section, metric, devices[0], condition)
                    why = (f"all {left_out} latencies were timed under contention and left out "
                           f"of fitting: re-measure on a quiet machine ({REMEASURE})" if left_out
                           else _null_reason(group, metric))
                    targets.append(_skipped(section, base, why, 0))
                    continue
                target = _target(section, X[present], group[metric].to_numpy()[present],
                                 staging / metric / condition, metadata,
                                 group["arch_id"].filter(present).to_list())
                if isinstance(target, _Target):
                    target = replace(target, left_out=left_out)
                else:
                    target = [row | {"left_out_contended": left_out} for row in target]
                targets.append(target)
        return _fit_targets(section, targets, staging)


def mark_selected(quality: pl.DataFrame) -> pl.DataFrame:
    """quality with ``selected`` true on the one fitted family of each (metric, device,
    condition) that ``Benchmark.query`` uses by default: the largest share of out-of-fold
    predictions within ±5%, then the lowest MdAPE, then the family name (docs/surrogates.md)."""
    keys = ["metric", "device", "condition"]
    ranked = quality.with_row_index("_row").filter(pl.col("status") == "ok").sort(
        [*keys, "within_5pct", "mdape", "family"], descending=[False] * 3 + [True, False, False],
        nulls_last=True)
    best = ranked.group_by(keys, maintain_order=True).first()["_row"]
    return quality.with_row_index("_row").with_columns(
        selected=pl.col("_row").is_in(best.implode()) & (pl.col("status") == "ok")).drop("_row")


def _write_quality(rows: list[dict[str, Any]], predictions: list[pl.DataFrame],
                   folder: Path) -> pl.DataFrame:
    """Write quality.parquet and predictions.parquet into folder; return the quality."""
    quality = mark_selected(pl.DataFrame(rows, schema=QUALITY_SCHEMA)).with_columns(
        pl.lit(v, dtype=pl.String).alias(k)
        for k, v in library_versions(*SURROGATE_LIBRARIES).items())
    write_parquet(quality, folder / "quality.parquet")
    write_parquet(pl.concat(predictions) if predictions else
                pl.DataFrame(schema=PREDICTION_SCHEMA), folder / "predictions.parquet")
    return quality


def _null_reason(group: pl.DataFrame, metric: str) -> str:
    """Why a metric was not measured, from its reason column (hwgptbench.metrics)."""
    column = reason_column(metric)
    reasons = group[column].drop_nulls().unique().to_list() if column in group.columns else []
    return f"not measured: {reasons[0]}" if reasons else "not measured"


