"""Adapting the benchmark to a new device from k measured archs (`hwgptbench adapt`).

The sources are every other device's measurements: the run's measurement table where it
exists, and the package's device tables of a scale that ships them (:func:`default_sources`),
so a fresh install adapts a shipped scale with nothing measured but the new device. The new
device's rows come from a file (checked by :mod:`.measurements`) or are measured here through
the measurement stage's own code (:func:`hwgptbench.campaign.shard.measure_rows`). For each
metric and condition of the new device, k of its measured archs are selected, an
:class:`~.model.AdaptedSurrogate` is fitted and saved, with the rows, under
``results/{scale}/adapted/{device}/``, where ``Benchmark.load`` finds them; ``adapted.json``
beside them holds the device's default condition and the estimate of each surrogate's error:
its leave-one-out error on the k archs and, with validation archs (measured archs the fit did
not see), its Spearman ρ, share within ±10%, MdAPE and interval coverage on them.

Measured here, the rows are kept as they are measured (the measure stage's resume folder,
:class:`~hwgptbench.campaign.parts.ShardParts`, under ``results/{scale}/.adapt/{device}/``), so
a rerun of the same command measures only what is missing and times again the rows still
contended; a time bound (``--max-minutes``) stops the measuring at the next arch or timing
cycle. A
condition whose rows cannot fit a surrogate (fewer than k usable archs) is reported with its
counts and skipped; the others are adapted and saved.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from .. import layout, published
from ..adaptation.methods import make_method
from ..adaptation.model import AdaptedSurrogate
from ..adaptation.sources import fit_sources
from ..adaptation.targets import Profiles, TransferError, long_table, targets_of
from ..api import ADAPTED_SUMMARY
from ..campaign.parts import Owner, ShardParts, inputs_key
from ..campaign.shard import conditions, measure_rows
from ..io import atomic_write_text, canonical_json, write_parquet
from ..meters.condition import CONDITION_KEYS, Condition, with_condition_columns
from ..meters.device import default_device
from ..metrics import measurement_frame, still_contended
from ..outputs import replace_dir
from ..predictors.features import feature_matrix
from ..predictors.store import save_surrogate
from ..settings.sections import MeasureSettings, SpaceSettings, TransferSettings
from ..space import Arch, SearchSpace, read_archs
from .evaluate import scores
from .measurements import REQUIRED, check_measurements, read_measurements
from .selection import select

log = logging.getLogger(__name__)

MEASURED = "measurements.parquet"
SUMMARY = ADAPTED_SUMMARY  # the device's default condition and the estimate of its errors
LABEL = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
SOURCE_COLUMNS = (*REQUIRED, "device")
OWNER = Owner("adapt", "rerun the same `hwgptbench adapt` command (it measures only what is "
                       "missing)")


def adaptation_space(scale: str, params_spaces: Mapping[str, SpaceSettings]) -> SearchSpace:
    """The space to adapt ``scale`` in: that of its shipped tables where the package ships the
    scale (params' ``spaces.{scale}`` must hold the same choices, in any order), else params'."""
    if scale not in published.scales():
        if scale not in params_spaces:
            raise TransferError(f"unknown scale {scale!r}: the params define the spaces "
                                f"{', '.join(params_spaces)} and the package ships "
                                f"{', '.join(published.scales()) or 'none'}")
        return params_spaces[scale].space(scale)
    shipped = published.space(scale)
    if scale in params_spaces:
        own = params_spaces[scale].space(scale)
        if _choices(own) != _choices(shipped):
            raise TransferError(f"params' spaces.{scale} {own.to_dict()} is not the space of "
                                f"the shipped {scale} tables {shipped.to_dict()}: the sources "
                                f"and queries of {scale} are in the shipped one; restore "
                                f"spaces.{scale} to it")
    return shipped


def _choices(space: SearchSpace) -> dict[str, Any]:
    """A space's definition with each list of choices as a set: the same archs, any order."""
    return {key: frozenset(value) if isinstance(value, list) else value
            for key, value in space.to_dict().items()}


def default_sources(scale: str, results: str, space: SearchSpace) -> pl.DataFrame:
    """The source devices' rows: the run's measurement table of ``scale`` where it exists,
    and every shipped device table of the scale (all conditions) whose label it lacks."""
    local = Path(layout.measurements(scale, results))
    tables = []
    if local.exists() or scale not in published.scales():
        tables.append(read_measurements(local, space, "--sources", SOURCE_COLUMNS))
    here = set(tables[0]["device"]) if tables else set()
    if scale in published.scales():
        for label, table in published.device_tables(scale).items():
            if label not in here:
                tables.append(check_measurements(table, space, f"the shipped {scale} table of "
                                                 f"{label}", SOURCE_COLUMNS))
    if not tables:
        raise TransferError(f"no source devices of {scale}: no {local} (`make run` writes it) "
                            f"and no shipped {scale} device table; give --sources FILE")
    return pl.concat(tables, how="diagonal_relaxed")


def candidate_archs(scale: str, results: str) -> list[Arch]:
    """The archs to select from when measuring here: the run's archs table of ``scale``, else
    the archs of the scale's shipped perplexity table."""
    own = Path(layout.archs(scale, results))
    if own.exists() or scale not in published.scales():
        return read_archs(own)
    return [Arch.from_id(a) for a in published.perplexity_table(scale)["arch_id"]]


@dataclass(frozen=True)
class MeasuredHere:
    """Rows measured on this machine, which of their archs the fit takes (the others validate
    it), the conditions the time bound left unmeasured and the folder that keeps the rows."""

    table: pl.DataFrame
    fit_archs: frozenset[str]
    unfinished: tuple[str, ...] = ()
    parts: ShardParts | None = None


def measure_for_adaptation(measure_section: MeasureSettings, space: SearchSpace,
                           candidates: Sequence[Arch], vocab_size: int, label: str, k: int,
                           selection: str, seed: int, validate: int = 0,
                           progress: str | os.PathLike[str] | None = None,
                           max_minutes: float | None = None) -> MeasuredHere:
    """Measure k of the candidate archs on this machine under every condition of the measure
    section, labelled ``label`` (which must name this hardware, as in the measure stage), and
    ``validate`` more drawn at random from the rest; the k are selected on the first
    condition's features. With ``progress`` (a folder), the rows are stored as they are
    measured and a rerun with the same inputs reuses them; ``max_minutes`` bounds the
    measuring (past it, no arch or timing cycle starts)."""
    runs = conditions(measure_section, space, default_device())
    first = runs[0]
    features = feature_matrix(space, candidates, vocab_size, first.batch_size, first.seq_len)
    picked = select(selection, features, k, seed)
    rest = np.setdiff1d(np.arange(len(candidates)), picked)
    if validate > len(rest):
        raise TransferError(f"--validate {validate}: only {len(rest)} candidate archs besides "
                            f"the {k} to fit; give more candidates (--archs) or fewer")
    held = np.random.default_rng(seed).choice(rest, size=validate, replace=False)
    chosen = [candidates[i] for i in picked]
    archs = chosen + [candidates[i] for i in np.sort(held)]
    log.info("measuring %d archs (%s selection) and %d to validate on %s under %s",
             len(chosen), selection, validate, label, ", ".join(c.id for c in runs))
    parts = (ShardParts(progress, inputs_key(measure_section, space, archs, vocab_size, label),
                        OWNER) if progress is not None else None)
    deadline = time.monotonic() + 60 * max_minutes if max_minutes else None
    rows = measure_rows(measure_section, space, archs, vocab_size, label, desc="adapt",
                        parts=parts, deadline=deadline)
    table = measurement_frame(rows)
    done = set(condition_ids(table)) if table.height else set()
    return MeasuredHere(table, frozenset(a.id for a in chosen),
                        tuple(c.id for c in runs if c.id not in done), parts)


def condition_ids(table: pl.DataFrame) -> list[str]:
    """The condition id of each row of a measurement table."""
    filled = with_condition_columns(table)
    return [Condition(**row).id for row in filled.select(CONDITION_KEYS).iter_rows(named=True)]


def _target_rows(table: pl.DataFrame, device: str) -> pl.DataFrame:
    """The new device's table, every row labelled ``device``."""
    if not LABEL.fullmatch(device):
        raise TransferError(f"device label {device!r} is not a slug of [a-z0-9] words joined "
                            "by '-'")
    labels = table["device"].unique().to_list() if "device" in table.columns else []
    if len(labels) > 1:
        raise TransferError(f"the measurements of the new device hold several devices "
                            f"{sorted(labels)}; give one device's rows")
    return table.with_columns(device=pl.lit(device))


class TooFew(TransferError):
    """A condition with fewer usable archs than its fit or its validation needs."""


@dataclass(frozen=True)
class Split:
    """Which measured archs of a condition fit its surrogate (k), and which validate it."""

    k: int
    selection: str
    seed: int
    validate: int = 0
    fit_archs: Collection[str] | None = None

    def indices(self, archs: Sequence[Arch], features: np.ndarray, name: str
                ) -> tuple[np.ndarray, np.ndarray]:
        """Row indices of the k archs to fit and of the validation archs."""
        if len(archs) < self.k:
            raise TooFew(f"{name}: {len(archs)} measured archs, fewer than k = {self.k}; "
                         "measure more archs or lower --k")
        if self.fit_archs is None:
            chosen = select(self.selection, features, self.k, self.seed)
        else:
            chosen = np.flatnonzero([a.id in self.fit_archs for a in archs])
            if len(chosen) < self.k:
                raise TooFew(f"{name}: too few of the archs measured to fit have a usable "
                             "value")
        rest = np.setdiff1d(np.arange(len(archs)), chosen)
        if not self.validate:
            return chosen, rest[:0]
        if self.fit_archs is not None:
            return chosen, rest
        if len(rest) < self.validate:
            raise TooFew(f"{name}: {len(rest)} measured archs besides the k = {self.k} to "
                         f"fit, fewer than --validate {self.validate}; measure more archs or "
                         "lower --validate")
        held = np.random.default_rng(self.seed).choice(rest, size=self.validate, replace=False)
        return chosen, np.sort(held)


@dataclass(frozen=True)
class Adaptation:
    """What ``adapt`` made of a new device's rows: a summary per surrogate written, and per
    metric and condition measured, how many rows it had, how many were usable and whether it
    was adapted (:func:`coverage`)."""

    written: list[dict[str, Any]]
    coverage: pl.DataFrame


class NothingAdapted(TransferError):
    """No metric and condition of the new device could be adapted; the rows stay where they
    were kept."""


def adapt_device(section: TransferSettings, space: SearchSpace, vocab_size: int,
                 sources_table: pl.DataFrame, target_table: pl.DataFrame, device: str, k: int,
                 out_dir: str | os.PathLike[str], method: str | None = None,
                 selection: str | None = None, validate: int = 0,
                 fit_archs: Collection[str] | None = None) -> Adaptation:
    """Fit and save an adapted surrogate per metric and condition of the new device that has
    k usable archs; return one summary per surrogate written (metric, condition, measured, k,
    method, sources, folder and the estimate of its error, :data:`ESTIMATE`) and the
    :func:`coverage` of every metric and condition measured. A condition with fewer usable
    archs (latencies timed under contention are not usable) is skipped with a warning; where
    none is left, :class:`NothingAdapted` names each one's counts.

    The k archs of each condition are ``fit_archs`` (the archs measured to fit), else selected
    from the measured ones; ``validate`` of the others (drawn at random; with ``fit_archs``,
    all the others) validate the surrogate."""
    method = method or section.method
    selection = selection or section.selection
    target_table = _target_rows(target_table, device)
    if device in set(sources_table["device"]):
        log.info("%s is among the measured devices: not used as its own source", device)
    sources_table = sources_table.filter(pl.col("device") != device)
    out = Path(out_dir) / device
    written: list[dict[str, Any]] = []
    skipped: dict[tuple[str, str], str] = {}
    plan = Split(k, selection, section.seed, validate, fit_archs)
    with replace_dir(out, "adapt", flag="--device") as staging:
        for metric in section.metrics:
            targets = long_table(target_table, [metric])
            sources = long_table(sources_table, [metric])
            if not sources.height and make_method(method).needs_sources:
                skipped |= {(metric, target.condition.id): f"no source device measured "
                            f"{metric}; {method} needs sources" for target in targets_of(targets)}
                continue
            got, missed = _adapt_metric(section, space, vocab_size, sources, targets, plan,
                                        staging, method)
            written += got
            skipped |= missed
        table = coverage(target_table, section.metrics, plan, written, skipped)
        unadapted = describe(table)
        if not written:
            raise NothingAdapted(f"nothing adapted for {device}: " + (
                f"\n{unadapted}" if unadapted else f"no metric of transfer.metrics "
                f"({', '.join(section.metrics)}) has a measured value in its rows"))
        if unadapted:
            log.warning("%s: not adapted:\n%s", device, unadapted)
        write_parquet(target_table, staging / MEASURED)
        _write_summary(staging / SUMMARY, device, target_table, written, plan, method)
    return Adaptation([{**record, "folder": str(out / record["folder"])} for record in written],
                      table)


def coverage(table: pl.DataFrame, metrics: Sequence[str], plan: Split,
             written: Sequence[dict[str, Any]], skipped: dict[tuple[str, str], str]
             ) -> pl.DataFrame:
    """Per metric and condition with a measured value: ``rows`` measured, ``contended``
    (latencies still contended after the campaign's visits, not usable), ``usable``,
    ``usable_to_fit`` (of the archs measured to fit, or of all), ``k``, ``adapted`` and, for
    one not adapted, ``reason``."""
    named = table.with_columns(_condition=pl.Series(condition_ids(table), dtype=pl.String))
    ok = named.filter(pl.col("status") == "ok") if "status" in named.columns else named
    contended = still_contended(ok.columns)
    adapted = {(record["metric"], record["condition"]) for record in written}
    records = []
    for metric in metrics:
        if metric not in ok.columns:
            continue
        value = pl.col(metric).cast(pl.Float64)
        measured = ok.filter(value.is_not_null() & (value > 0))
        flagged = contended if metric == "latency_ms" else pl.lit(False)
        for (condition,), rows in measured.group_by("_condition", maintain_order=True):
            usable = rows.filter(~flagged)
            fit = (usable.filter(pl.col("arch_id").is_in(list(plan.fit_archs))).height
                   if plan.fit_archs is not None else usable.height)
            key = (metric, str(condition))
            records.append({"metric": metric, "condition": condition,
                            "rows": named.filter(pl.col("_condition") == condition).height,
                            "contended": rows.height - usable.height, "usable": usable.height,
                            "usable_to_fit": fit, "k": plan.k, "adapted": key in adapted,
                            "reason": None if key in adapted else skipped.get(
                                key, "no usable value")})
    return pl.DataFrame(records, schema={
        "metric": pl.String, "condition": pl.String, "rows": pl.Int64, "contended": pl.Int64,
        "usable": pl.Int64, "usable_to_fit": pl.Int64, "k": pl.Int64, "adapted": pl.Boolean,
        "reason": pl.String}).sort("metric", "condition")


def describe(table: pl.DataFrame) -> str:
    """A line per metric and condition not adapted, with its counts; and where latencies were
    timed under contention, that the machine was busy."""
    lines = [f"{row['metric']} at {row['condition']}: {row['usable_to_fit']} of the k = "
             f"{row['k']} archs to fit usable ({row['rows']} rows measured, "
             f"{row['contended']} timed under contention): {row['reason']}"
             for row in table.filter(~pl.col("adapted")).iter_rows(named=True)]
    busy = int(table.filter(~pl.col("adapted"))["contended"].sum())
    if busy:
        lines.append(f"the machine was busy: {busy} latencies stayed contended (the process "
                     "waited for a core: run-queue wait or wall/CPU time above "
                     "measure.contention) after the visits that time them again; measure when "
                     "the machine is quiet (docs/measure.md)")
    return "\n".join(lines)


# the estimate of each surrogate's error, in its summary (None where not measured)
ESTIMATE = ("loo_error", "validation_archs", "spearman", "within_10pct", "mdape", "coverage")


def _estimate(model: AdaptedSurrogate, X: np.ndarray, values: np.ndarray) -> dict[str, Any]:
    """The surrogate's leave-one-out error on its k archs (relative: exp(sigma) - 1, floored by
    ``transfer.sigma_floor``) and its scores on the validation archs X (measured ``values``)."""
    record: dict[str, Any] = {"loo_error": float(np.expm1(model.method.sigma)),
                              "validation_archs": len(values)}
    if len(values) < 2:
        return record | dict.fromkeys(ESTIMATE[2:])
    predicted = model.predict(X)
    low, high = model.predict_interval(X)
    got = scores(values, predicted)
    coverage = float(np.mean((values >= low) & (values <= high)))
    return record | {key: _finite(got[key]) for key in ESTIMATE[2:5]} | {"coverage": coverage}


def _finite(value: float) -> float | None:
    """value, or None where it is NaN (a constant ranking has no Spearman ρ)."""
    return None if math.isnan(value) else value


def _adapt_metric(section: TransferSettings, space: SearchSpace, vocab_size: int,
                  sources: pl.DataFrame, targets: pl.DataFrame, plan: Split, out: Path,
                  method: str) -> tuple[list[dict[str, Any]], dict[tuple[str, str], str]]:
    """The adapted surrogates of every condition of one metric of the new device, written
    under ``out`` (each summary's folder relative to it), and why each condition with too few
    usable archs was skipped."""
    models = []
    reference_ids = sorted(set(targets["arch_id"]))
    measured = np.zeros((len(reference_ids), 0))
    if sources.height:
        profiles = Profiles.from_long(sources)
        encoded = space.encode([Arch.from_id(a) for a in profiles.arch_ids])
        models = fit_sources(profiles, encoded, space, vocab_size, section.source_model,
                             section.seed)
        reference_ids = sorted(set(reference_ids) | set(profiles.arch_ids))
        index = {a: i for i, a in enumerate(profiles.arch_ids)}
        measured = np.full((len(reference_ids), len(profiles.targets)), np.nan)
        known = [(r, index[a]) for r, a in enumerate(reference_ids) if a in index]
        measured[[r for r, _ in known]] = np.log(profiles.values[[i for _, i in known]])
    reference = [Arch.from_id(a) for a in reference_ids]
    written = []
    skipped = {}
    for target in targets_of(targets):
        rows = targets.filter(*target.matches())
        shape = (target.condition.batch_size, target.condition.seq_len)
        archs = [Arch.from_id(a) for a in rows["arch_id"]]
        X = feature_matrix(space, archs, vocab_size, *shape)
        try:
            chosen, held = plan.indices(archs, X, target.name)
        except TooFew as few:
            skipped[(target.metric, target.condition.id)] = str(few)
            continue
        values = rows["value"].to_numpy()
        model = AdaptedSurrogate(space, vocab_size, models,
                                 make_method(method, section.sigma_floor), section.coverage)
        model.prepare(feature_matrix(space, reference, vocab_size, *shape), measured)
        model.fit(X[chosen], values[chosen])
        folder = out / target.metric / target.condition.id / AdaptedSurrogate.family
        save_surrogate(model, folder, {
            "space_name": space.name, "space": space.to_dict(), "metric": target.metric,
            "device": target.device, "device_fingerprint": {},
            "condition": target.condition.id, "training_rows": plan.k,
            "feature_args": {"vocab_size": vocab_size, "batch_size": shape[0],
                             "seq_len": shape[1]},
            "transfer": {"method": method, "selection": plan.selection, "k": plan.k,
                         "measured_archs": [archs[i].id for i in chosen],
                         "sources": [m.target.name for m in models]}})
        estimate = _estimate(model, X[held], values[held])
        log.info("%s: %s from %d measured archs and %d sources (leave-one-out error %.1f%%)",
                 target.name, method, plan.k, len(models), 100 * estimate["loo_error"])
        written.append({"metric": target.metric, "condition": target.condition.id,
                        "measured": rows.height, "k": plan.k, "method": method,
                        "sources": len(models), **estimate,
                        "folder": str(folder.relative_to(out))})
    return written, skipped


def _write_summary(path: Path, device: str, table: pl.DataFrame,
                   written: Sequence[dict[str, Any]], plan: Split, method: str) -> None:
    """``adapted.json``: the device's default condition (by the shipped tables' rule,
    :func:`published.default_condition_of`, among the conditions adapted) and each
    surrogate's estimate."""
    adapted = {record["condition"] for record in written}
    filled = with_condition_columns(table)
    if "status" not in filled.columns:
        filled = filled.with_columns(status=pl.lit("ok"))
    rows = filled.filter(pl.Series(condition_ids(filled)).is_in(adapted))
    summary = {"device": device, "default_condition": published.default_condition_of(rows),
               "method": method, "selection": plan.selection, "k": plan.k,
               "validation": ("archs measured here beside the k" if plan.fit_archs is not None
                              else "measured rows not among the k"),
               "estimate": [{key: record[key] for key in ("metric", "condition", *ESTIMATE)}
                            for record in written]}
    atomic_write_text(path, canonical_json(summary))
