"""The benchmark's tables shipped in the package: queryable right after the install.

``manifest.json`` beside this file names, per scale, the search space, the vocabulary, and
each table with its SHA-256, row count and source: the perplexity table
(``{scale}/perplexity.parquet``, HW-GPT-Bench's published perplexities as the importer writes
them) and the measurement table of each device (``{scale}/devices/{label}.parquet``, as the
measure stage writes it). Every read checks the file against its SHA-256, so an edited or
truncated table is refused instead of queried. :func:`ship` (``hwgptbench ship-tables``) is
the one way the tables and the manifest are written.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from ..errors import UserError
from ..io import atomic_path, atomic_write_json, sha256_file
from ..meters.condition import CONDITION_KEYS, Condition, with_condition_columns
from ..space import SearchSpace

FOLDER = Path(__file__).parent
MANIFEST = "manifest.json"
# Columns every shipped table must have: the perplexity importer's, the measure stage's keys
PERPLEXITY_COLUMNS = ("arch_id", "params", "train_steps", "val_loss", "perplexity", "accuracy",
                      "source")
DEVICE_COLUMNS = ("arch_id", "device", "status", "batch_size", "seq_len", "dtype", "launch",
                  "latency_ms")
FINGERPRINT_COLUMNS = ("device_kind", "device_name", "cpu_model", "cpu_cores_logical",
                       "gpu_memory_gb", "gpu_driver", "cuda_version", "torch_version", "threads",
                       "hwgptbench_version")


class PublishedTablesError(UserError, ValueError):
    """A shipped table is absent, unknown or does not match its manifest."""


def manifest(folder: str | os.PathLike[str] = FOLDER) -> dict[str, Any]:
    """The manifest of the shipped tables (empty scales when none is shipped)."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return {"scales": {}}
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise PublishedTablesError(f"{path} is not valid JSON ({err}): restore it with "
                                   "git checkout, or rewrite it with hwgptbench ship-tables"
                                   ) from None
    if not isinstance(document, dict) or not isinstance(document.get("scales"), dict):
        raise PublishedTablesError(f"{path}: expected an object with a 'scales' object")
    return document


def scales(folder: str | os.PathLike[str] = FOLDER) -> list[str]:
    """Scales with shipped tables."""
    return sorted(manifest(folder)["scales"])


def entry(scale: str, folder: str | os.PathLike[str] = FOLDER) -> dict[str, Any]:
    """The manifest entry of a scale."""
    known = manifest(folder)["scales"]
    if scale not in known:
        raise PublishedTablesError(f"no shipped tables of scale {scale!r}; shipped: "
                                   f"{', '.join(sorted(known)) or 'none'}")
    return known[scale]


def space(scale: str, folder: str | os.PathLike[str] = FOLDER) -> SearchSpace:
    """The search space the scale's tables were written for."""
    return SearchSpace.from_dict(scale, entry(scale, folder)["space"])


def vocab_size(scale: str, folder: str | os.PathLike[str] = FOLDER) -> int:
    """The vocabulary size of the scale's networks (their parameter counts and FLOPs)."""
    return int(entry(scale, folder)["vocab_size"])


def _read(file: dict[str, Any], folder: Path) -> pl.DataFrame:
    """A shipped table, after checking its SHA-256 against the manifest."""
    path = folder / file["file"]
    if not path.exists():
        raise PublishedTablesError(f"{path} is missing: restore it (git checkout {path})")
    digest = sha256_file(path)
    if digest != file["sha256"]:
        raise PublishedTablesError(
            f"{path} does not match its manifest (SHA-256 {digest[:12]}…, expected "
            f"{file['sha256'][:12]}…): restore it with git checkout, or ship it anew with "
            "hwgptbench ship-tables")
    return pl.read_parquet(path)


def perplexity_table(scale: str, folder: str | os.PathLike[str] = FOLDER) -> pl.DataFrame:
    """The scale's perplexity table (one row per arch, with accuracy and source)."""
    return _read(entry(scale, folder)["perplexity"], Path(folder))


def device_tables(scale: str, folder: str | os.PathLike[str] = FOLDER
                  ) -> dict[str, pl.DataFrame]:
    """The scale's measurement tables, by device label (empty when no device is shipped)."""
    devices = entry(scale, folder).get("devices", {})
    return {label: _read(file, Path(folder)) for label, file in sorted(devices.items())}


def default_conditions(scale: str, folder: str | os.PathLike[str] = FOLDER) -> dict[str, str]:
    """The condition a query of each shipped device takes when it names none, by label."""
    devices = entry(scale, folder).get("devices", {})
    return {label: record["default_condition"] for label, record in devices.items()
            if record.get("default_condition")}


def default_condition_of(table: pl.DataFrame) -> str:
    """A device table's default condition: the one whose rows read energy most often (a GPU
    campaign reads it at one condition), else the one with the most measured rows; ties go to
    the condition first in the table."""
    energy = (pl.col("energy_mj").is_not_null() if "energy_mj" in table.columns
              else pl.lit(False))
    counts = (with_condition_columns(table)
              .group_by(CONDITION_KEYS, maintain_order=True)
              .agg(energy.sum().alias("energy"), (pl.col("status") == "ok").sum().alias("ok"))
              .sort(["energy", "ok"], descending=True, maintain_order=True))
    return Condition(**counts.select(CONDITION_KEYS).row(0, named=True)).id


def digest(scale: str, folder: str | os.PathLike[str] = FOLDER) -> str:
    """One SHA-256 over the scale's manifest entry (space, vocabulary, tables' hashes): a key
    that changes whenever any shipped table of the scale does."""
    text = json.dumps(entry(scale, folder), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_columns(table: pl.DataFrame, columns: Sequence[str], path: Path) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise PublishedTablesError(f"{path} lacks the columns {missing}: ship a perplexity "
                                   "table from hwgptbench import-perplexity and device tables "
                                   "from hwgptbench measure")


def _copy(source: Path, dest: Path, columns: Sequence[str]
          ) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Write ``source`` to ``dest`` (zstd parquet, rows in their order); return it and its
    manifest record."""
    table = pl.read_parquet(source)
    _check_columns(table, columns, source)
    with atomic_path(dest) as tmp:
        table.write_parquet(tmp, compression="zstd", compression_level=19, statistics=False)
    return table, {"sha256": sha256_file(dest), "rows": table.height}


def fingerprint_of(table: pl.DataFrame) -> dict[str, Any]:
    """The hardware and software that measured a device table (its first row's
    :data:`FINGERPRINT_COLUMNS`; a column the table lacks is left out)."""
    row = table.row(0, named=True)
    return {c: row[c] for c in FINGERPRINT_COLUMNS if c in row}


def ship(scale: str, space_: SearchSpace, vocab: int, perplexity: str | os.PathLike[str] | None,
         devices: Sequence[str | os.PathLike[str]] = (), folder: str | os.PathLike[str] = FOLDER,
         replace_devices: bool = False, measured_by: str | None = None) -> dict[str, Any]:
    """Ship tables of ``scale``: the perplexity table (as ``hwgptbench import-perplexity``
    wrote it) and device tables (as ``hwgptbench measure`` / ``merge-shards`` wrote them).

    Each device's record holds the table's fingerprint and ``measured_by``, the commit of the
    code that measured it (comma-separated commits for a table of several campaigns). A table
    not given keeps its shipped version; ``replace_devices`` drops the devices not given. The
    manifest is rewritten last (atomically), so a reader never sees a table its manifest does
    not describe. Returns the scale's new manifest entry.
    """
    folder = Path(folder)
    document = manifest(folder)
    old = document["scales"].get(scale, {})
    if old and old["space"] != space_.to_dict() and (perplexity is None or not replace_devices):
        raise PublishedTablesError(
                f"the shipped {scale} tables were written for the space {old['space']}, not "
                f"{space_.to_dict()}: ship every table of the scale anew (--perplexity and "
                "--device, with --replace-devices)")
    record: dict[str, Any] = {"space": space_.to_dict(), "vocab_size": vocab,
                              "perplexity": old.get("perplexity"),
                              "devices": {} if replace_devices else dict(old.get("devices", {}))}
    if perplexity is not None:
        dest = folder / scale / "perplexity.parquet"
        table, file = _copy(Path(perplexity), dest, PERPLEXITY_COLUMNS)
        sources = sorted(set(table["source"]))
        record["perplexity"] = {"file": dest.relative_to(folder).as_posix(), **file,
                                "source": ", ".join(sources)}
    if record["perplexity"] is None:
        raise PublishedTablesError(f"scale {scale} has no shipped perplexity table: give one "
                                   "(--perplexity, from hwgptbench import-perplexity)")
    for path in map(Path, devices):
        labels = pl.read_parquet(path, columns=["device"])["device"].unique().to_list()
        if len(labels) != 1:
            raise PublishedTablesError(f"{path} holds the devices {labels}: ship one device "
                                       "table per device (results/{scale}/measure/{label}"
                                       ".parquet)")
        dest = folder / scale / "devices" / f"{labels[0]}.parquet"
        table, file = _copy(path, dest, DEVICE_COLUMNS)
        conditions = table.select("batch_size", "seq_len", "dtype", "launch").unique()
        record["devices"][labels[0]] = {"file": dest.relative_to(folder).as_posix(), **file,
                                        "conditions": conditions.height,
                                        "default_condition": default_condition_of(table),
                                        "fingerprint": fingerprint_of(table),
                                        "measured_by": measured_by}
    for label in set(old.get("devices", {})) - set(record["devices"]):
        stale = folder / old["devices"][label]["file"]
        if stale.exists():
            stale.unlink()
    document["scales"][scale] = record
    atomic_write_json(folder / MANIFEST, document)
    return record

