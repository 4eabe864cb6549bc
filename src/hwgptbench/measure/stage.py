"""The measure stage around the measure library: shards of archs, device tables and the
cross-device table, as parquet.

``measure_shard`` measures archs ``i, i+n, i+2n, ...`` of the archs table (shard i of n) on this
machine and writes one atomic parquet file, so many jobs or machines can share the work; within a
shard, the archs are timed in groups that fit the memory budget, and each group's rows are stored as
it completes, so a killed job resumes with the groups it has not measured. ``merge_shards`` builds
the device table ``results/{scale}/measure/{device}.parquet``; ``merge_devices`` stacks device
tables into ``results/{scale}/measurements.parquet``. Every row carries the device label, its
hardware fingerprint and the software versions, so tables from many machines merge.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import polars as pl

from .. import __version__
from ..campaign.parts import ShardParts
from ..campaign.shard import MeasurementError, measure_rows
from ..io import atomic_write_json, canonical_json, write_parquet
from ..meters.condition import CONDITION_KEYS, Condition, with_condition_columns
from ..metrics import KEY, measurement_frame, still_contended
from ..settings.sections import MeasureSettings
from ..space import Arch, SearchSpace

log = logging.getLogger(__name__)


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' → (i, n) with 0 ≤ i < n."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise MeasurementError(f"--shard: {text!r} is not i/n (e.g. 0/4)") from None
    if not 0 <= index < count:
        raise MeasurementError(f"--shard: {text!r} needs 0 <= i < n")
    return index, count


def inputs_key(section: MeasureSettings, space: SearchSpace, archs: Sequence[Arch],
               vocab_size: int, label: str) -> str:
    """Hash of everything a shard's rows depend on: what a part file must have been measured
    with to be reused."""
    doc = {"measure": {k: v for k, v in asdict(section).items()
                       if k not in ("device", "aliases")},
           "space": space.name, "spec": repr(space), "archs": [a.id for a in archs],
           "vocab_size": vocab_size, "label": label, "version": __version__}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def measure_shard(section: MeasureSettings, space: SearchSpace, archs: Sequence[Arch],
                  vocab_size: int, label: str, shard: tuple[int, int],
                  out: str | os.PathLike[str]) -> pl.DataFrame:
    """Measure shard i of n of ``archs`` on this machine; write the rows to ``out``. Each
    group's rows are kept in ``{out}.parts/`` as it completes, so a killed job resumes with the
    groups it has not measured; the folder is removed once ``out`` is written."""
    chosen = list(archs)[shard[0]::shard[1]]
    parts = ShardParts(f"{out}.parts", inputs_key(section, space, chosen, vocab_size, label))
    rows = measure_rows(section, space, chosen, vocab_size, label,
                        desc=f"measure shard {shard[0]}/{shard[1]}", parts=parts)
    table = measurement_frame(rows)
    write_parquet(table, out)
    parts.remove()
    return table


def _check_unique(table: pl.DataFrame, what: str) -> None:
    duplicated = table.filter(table.select(KEY).is_duplicated())
    if duplicated.height:
        raise MeasurementError(f"{what}: {duplicated.height} rows measure the same "
                         f"(device, arch, condition) twice, e.g. {duplicated.row(0, named=True)}")


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
