"""Device tables from their shards and the cross-device table from device tables, each
(device, arch, condition) once; polars alone, so that a merge job starts without torch."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from ..errors import MeasurementError
from ..io import atomic_write_json, write_parquet
from ..meters.condition import CONDITION_KEYS, Condition, with_condition_columns
from ..metrics import KEY, still_contended

log = logging.getLogger(__name__)


def _check_unique(table: pl.DataFrame, what: str) -> None:
    duplicated = table.filter(table.select(KEY).is_duplicated())
    if duplicated.height:
        raise MeasurementError(f"{what}: {duplicated.height} rows measure the same (device, "
                               f"arch, condition) twice, e.g. {duplicated.row(0, named=True)}")


def merge_shards(paths: Sequence[str | Path], out: str | os.PathLike[str]
                 ) -> pl.DataFrame:
    """One device's table from its shards; each (arch, condition) exactly once."""
    table = pl.concat([pl.read_parquet(p) for p in paths], how="vertical_relaxed")
    if table["device"].n_unique() != 1:
        raise MeasurementError(f"shards of several devices: {sorted(table['device'].unique())}")
    _check_unique(table, "device table")
    table = table.sort(KEY)
    write_parquet(table, out)
    return table


def contention_summary(table: pl.DataFrame) -> dict[str, dict[str, dict[str, int]]]:
    """Per device and condition: the ok rows, those timed under contention at first (timed
    again, ``latency_remeasured``, or still ``latency_contended``), those re-measured
    uncontended and those still contended (left out of fitting and transfer)."""
    summary: dict[str, dict[str, dict[str, int]]] = {}
    ok = with_condition_columns(table.filter(pl.col("status") == "ok"))
    still = still_contended(ok.columns)
    again = (pl.col("latency_remeasured").fill_null(0) > 0 if "latency_remeasured" in ok.columns
             else pl.lit(False))
    for (device, *condition), part in ok.group_by("device", *CONDITION_KEYS,
                                                  maintain_order=True):
        key = Condition(**dict(zip(CONDITION_KEYS, condition, strict=True))).id
        summary.setdefault(str(device), {})[key] = {
            "ok": part.height, "contended": part.filter(still | again).height,
            "remeasured": part.filter(again & ~still).height,
            "still_contended": part.filter(still).height}
    return summary


def merge_devices(paths: Sequence[str | Path], out: str | os.PathLike[str],
                  metrics_out: str | os.PathLike[str] | None = None) -> pl.DataFrame:
    """The cross-device table from device tables; a label used by two machines is an error.
    ``metrics_out``: the contention of each device and condition (:func:`contention_summary`)
    as JSON, for `dvc metrics`."""
    table = pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed")
    identities = table.select("device", "device_name", "cpu_model").unique()
    clashes = identities.filter(identities["device"].is_duplicated())
    if clashes.height:
        raise MeasurementError(f"one label names different hardware: {clashes.to_dicts()}")
    _check_unique(table, "cross-device table")
    table = table.sort(KEY)
    write_parquet(table, out)
    log.info("merged %d rows from %d device(s): %s", table.height, table["device"].n_unique(),
             ", ".join(sorted(table["device"].unique())))
    summary = contention_summary(table)
    for device, conditions in summary.items():
        for condition, counts in conditions.items():
            if counts["contended"]:
                log.warning("%s %s: %d of %d rows timed under contention, %d re-measured, %d "
                            "still contended (left out of fitting and transfer; re-measure: "
                            "`hwgptbench measure`, docs/measure.md)", device, condition,
                            counts["contended"], counts["ok"], counts["remeasured"],
                            counts["still_contended"])
    if metrics_out is not None:
        atomic_write_json(metrics_out, summary)
    return table
