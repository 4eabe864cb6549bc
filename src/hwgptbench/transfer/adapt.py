"""Adapting the benchmark to a new device from k measured archs (`hwgptbench adapt`).

The measurement table of the benchmark gives the sources (every device and condition but the
new device); the new device's rows come from a file (checked by :mod:`.measurements`) or are
measured here through the measurement stage's own code
(:func:`hwgptbench.meters.campaign.measure_rows`). For each metric and condition of the new
device, k of its measured archs are selected, an :class:`~.model.AdaptedSurrogate` is fitted
and saved, with the rows, under ``results/{scale}/adapted/{device}/``, where
``Benchmark.load`` finds them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ..io import write_parquet
from ..meters.campaign import conditions, measure_rows
from ..meters.device import default_device
from ..metrics import measurement_frame
from ..outputs import replace_dir
from ..predictors.features import feature_matrix
from ..predictors.store import save_surrogate
from ..settings.sections import MeasureSettings, TransferSettings
from ..space import Arch, SearchSpace
from .methods import make_method
from .model import AdaptedSurrogate
from .selection import select
from .sources import fit_sources
from .targets import Profiles, TransferError, long_table, targets_of

log = logging.getLogger(__name__)

MEASURED = "measurements.parquet"
LABEL = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def measure_for_adaptation(measure_section: MeasureSettings, space: SearchSpace,
                           candidates: Sequence[Arch], vocab_size: int, label: str, k: int,
                           selection: str, seed: int) -> pl.DataFrame:
    """Measure k of the candidate archs on this machine under every condition of the measure
    section, labelled ``label`` (which must name this hardware, as in the measure stage); the
    archs are selected on the first condition's features."""
    first = conditions(measure_section, space, default_device())[0]
    features = feature_matrix(space, candidates, vocab_size, first.batch_size, first.seq_len)
    chosen = [candidates[i] for i in select(selection, features, k, seed)]
    log.info("measuring %d archs (%s selection) on %s", len(chosen), selection, label)
    rows = measure_rows(measure_section, space, chosen, vocab_size, label, desc="adapt")
    return measurement_frame(rows)


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


def adapt_device(section: TransferSettings, space: SearchSpace, vocab_size: int,
                 sources_table: pl.DataFrame, target_table: pl.DataFrame, device: str, k: int,
                 out_dir: str | os.PathLike[str], method: str | None = None,
                 selection: str | None = None) -> list[dict[str, Any]]:
    """Fit and save an adapted surrogate per metric and condition of the new device; return one
    summary per surrogate written (metric, condition, measured, k, method, sources, folder)."""
    method = method or section.method
    selection = selection or section.selection
    target_table = _target_rows(target_table, device)
    if device in set(sources_table["device"]):
        log.info("%s is among the measured devices: not used as its own source", device)
    sources_table = sources_table.filter(pl.col("device") != device)
    out = Path(out_dir) / device
    written: list[dict[str, Any]] = []
    with replace_dir(out, "adapt", flag="--device") as staging:
        for metric in section.metrics:
            targets = long_table(target_table, [metric])
            if not targets.height:
                log.info("%s: no measured %s; nothing to adapt", device, metric)
                continue
            sources = long_table(sources_table, [metric])
            if not sources.height and make_method(method, section).needs_sources:
                log.warning("%s: no source device measured %s; %s needs sources, skipped",
                            device, metric, method)
                continue
            written += _adapt_metric(section, space, vocab_size, sources, targets, k, staging,
                                     method, selection)
        if not written:
            raise TransferError(f"nothing adapted for {device}: no metric of "
                                f"transfer.metrics ({', '.join(section.metrics)}) has both "
                                "measured rows and source devices")
        write_parquet(target_table, staging / MEASURED)
    return [{**record, "folder": str(out / record["folder"])} for record in written]


def _adapt_metric(section: TransferSettings, space: SearchSpace, vocab_size: int,
                  sources: pl.DataFrame, targets: pl.DataFrame, k: int, out: Path, method: str,
                  selection: str) -> list[dict[str, Any]]:
    """The adapted surrogates of every condition of one metric of the new device, written
    under ``out`` (each summary's folder relative to it)."""
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
    for target in targets_of(targets):
        rows = targets.filter(*target.matches())
        shape = (target.condition.batch_size, target.condition.seq_len)
        if rows.height < k:
            raise TransferError(f"{target.name}: {rows.height} measured archs, fewer than "
                                f"k = {k}; measure more archs or lower --k")
        archs = [Arch.from_id(a) for a in rows["arch_id"]]
        X = feature_matrix(space, archs, vocab_size, *shape)
        chosen = select(selection, X, k, section.seed)
        model = AdaptedSurrogate(space, vocab_size, models, make_method(method, section),
                                 section.coverage)
        model.prepare(feature_matrix(space, reference, vocab_size, *shape), measured)
        model.fit(X[chosen], rows["value"].to_numpy()[chosen])
        folder = out / target.metric / target.condition.id / AdaptedSurrogate.family
        measured_archs = [archs[i].id for i in chosen]
        save_surrogate(model, folder, {
            "space_name": space.name, "space": space.to_dict(), "metric": target.metric,
            "device": target.device, "device_fingerprint": {},
            "condition": target.condition.id, "training_rows": k,
            "feature_args": {"vocab_size": vocab_size, "batch_size": shape[0],
                             "seq_len": shape[1]},
            "transfer": {"method": method, "selection": selection, "k": k,
                         "measured_archs": measured_archs,
                         "sources": [m.target.name for m in models]}})
        log.info("%s: %s from %d measured archs and %d sources (leave-one-out error %.1f%%)",
                 target.name, method, k, len(models), 100 * np.expm1(model.method.sigma))
        written.append({"metric": target.metric, "condition": target.condition.id,
                        "measured": rows.height, "k": k, "method": method,
                        "sources": len(models), "folder": str(folder.relative_to(out))})
    return written
