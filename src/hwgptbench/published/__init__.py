"""The benchmark's tables shipped in the package: queryable right after the install.

``manifest.json`` beside this file names, per scale, the search space, the vocabulary, and
each table with its SHA-256, row count and source: the perplexity table
(``{scale}/perplexity.parquet``, HW-GPT-Bench's published perplexities as the importer writes
them) and the measurement table of each device (``{scale}/devices/{label}.parquet``, as the
measure stage writes it). Every read checks the file against its SHA-256, so an edited or
truncated table is refused instead of queried, and the manifest itself is checked first: its
scales and device labels are names, its files exactly those paths. :func:`ship`
(``hwgptbench ship-tables``) is the one way the tables and the manifest are written; it checks
every table it is given (:func:`check_perplexity_table`, :func:`check_device_table`) before it
writes anything. docs/security.md, "Names are data too".
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any, NoReturn

import polars as pl

from .. import layout
from ..errors import UserError
from ..io import (
    CorruptFileError,
    atomic_write_json,
    first_line,
    read_outside_parquet,
    sha256_file,
)
from ..meters.condition import CONDITION_KEYS, Condition, with_condition_columns
from ..metrics import measured_bounds
from ..outputs import MARKER, atomic_path, check_output_dir, remove_file, write_marker
from ..space import SearchSpace

FOLDER = Path(__file__).parent
MANIFEST = "manifest.json"
COMMAND = "ship-tables"  # the command whose output marker the folder carries
TEXT, INTEGERS, FLOATS, BOOLEANS = "text", "integers", "floats", "booleans"
_OF_KIND: dict[str, Callable[[Any], bool]] = {
    TEXT: lambda dtype: dtype == pl.String, INTEGERS: lambda dtype: dtype.is_integer(),
    FLOATS: lambda dtype: dtype.is_float(), BOOLEANS: lambda dtype: dtype == pl.Boolean}
# The columns every shipped table must have, with their types: the perplexity importer's, the
# measure stage's keys and the metrics whose surrogates a query fits
PERPLEXITY_TYPES = {"arch_id": TEXT, "params": INTEGERS, "train_steps": INTEGERS,
                    "val_loss": FLOATS, "perplexity": FLOATS, "accuracy": FLOATS,
                    "source": TEXT}
PERPLEXITY_COLUMNS = tuple(PERPLEXITY_TYPES)
DEVICE_TYPES = {"arch_id": TEXT, "device": TEXT, "status": TEXT, "batch_size": INTEGERS,
                "seq_len": INTEGERS, "dtype": TEXT, "launch": TEXT, "latency_ms": FLOATS,
                "energy_mj": FLOATS, "memory_peak_mb": FLOATS}
DEVICE_COLUMNS = tuple(DEVICE_TYPES)
DEVICE_KEYS = ("arch_id", "device", "status", "batch_size", "seq_len", "dtype", "launch")
FINGERPRINT_COLUMNS = ("device_kind", "device_name", "cpu_model", "cpu_cores_logical",
                       "gpu_memory_gb", "gpu_driver", "cuda_version", "torch_version", "threads",
                       "hwgptbench_version")
# Columns a device table may lack, of these types where it has them: the other condition
# columns, the other memory columns, and the fingerprint the manifest records
OPTIONAL_DEVICE_TYPES = {"workload": TEXT, "gen_len": INTEGERS, "attention": TEXT,
                         "quant": TEXT, "compile": BOOLEANS, "recompute": BOOLEANS,
                         "memory_weights_mb": FLOATS, "memory_activations_mb": FLOATS,
                         "device_kind": TEXT, "device_name": TEXT, "cpu_model": TEXT,
                         "cpu_cores_logical": INTEGERS, "gpu_memory_gb": FLOATS,
                         "gpu_driver": TEXT, "cuda_version": TEXT, "torch_version": TEXT,
                         "threads": INTEGERS, "hwgptbench_version": TEXT}
# The range of each value that is not null (docs/security.md): each measured column's physical
# bounds (metrics.measured_bounds, those `hwgptbench adapt` checks too), counts of at least 1
# (train steps of at least 0), a perplexity the exponential of a loss (at least 1), an accuracy
# a fraction
BOUNDS: dict[str, tuple[float, float]] = {
    **{column: (bounds.low, bounds.high) for column, bounds in measured_bounds().items()},
    "batch_size": (1, math.inf), "seq_len": (1, math.inf), "params": (1, math.inf),
    "train_steps": (0, math.inf), "perplexity": (1.0, math.inf), "accuracy": (0.0, 1.0)}
PERPLEXITY_FIX = "write the table with hwgptbench import-perplexity and ship that"
CONTENDED_FIX = ("rerun the same hwgptbench measure command when the machine is quiet (it times "
                 "the contended rows again and keeps the others) and ship that")
DEVICE_FIX = ("measure the device with hwgptbench measure (or drop the row) and ship that "
              "table")
_RESTORE = "restore it with git checkout, or rewrite it with hwgptbench ship-tables"
_SHA256 = re.compile(r"[0-9a-f]{64}")


log = logging.getLogger(__name__)

class PublishedTablesError(UserError, ValueError):
    """A shipped table is absent, unknown or does not match its manifest, or a table to ship
    holds what no measurement or import writes."""


def perplexity_file(scale: str) -> str:
    """The perplexity table of a scale, relative to the folder: the manifest's ``file``."""
    return f"{scale}/perplexity.parquet"


def device_file(scale: str, label: str) -> str:
    """A device's table of a scale, relative to the folder: the manifest's ``file``."""
    return f"{scale}/devices/{label}.parquet"


def _name(value: object, what: str, pattern: re.Pattern[str] = layout.DEVICE_LABEL) -> str:
    """value as a device label (or a scale name) that may become part of a path."""
    try:
        return layout.check_label(value, what, pattern)
    except layout.LabelError as err:
        raise PublishedTablesError(str(err)) from None


def _count(value: object, least: int) -> bool:
    """Whether value is an int (not a bool) of at least ``least``."""
    return type(value) is int and value >= least


def manifest(folder: str | os.PathLike[str] = FOLDER) -> dict[str, Any]:
    """The manifest of the shipped tables (empty scales when none is shipped), checked
    (:func:`_check_manifest`)."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return {"scales": {}}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # ValueError: not UTF-8 or not JSON
        reason = "nested too deep" if isinstance(err, RecursionError) else first_line(err)
        raise PublishedTablesError(f"{path} is not valid JSON in UTF-8 ({reason}): "
                                   f"{_RESTORE}") from None
    _check_manifest(document, path)
    return document


def _check_manifest(document: Any, path: Path) -> None:
    """Refuse a manifest whose scales or device labels are not names, or whose table records
    name other files than their canonical paths or lack a SHA-256 and a row count."""
    if not isinstance(document, dict) or not isinstance(document.get("scales"), dict):
        raise PublishedTablesError(f"{path}: expected an object with a 'scales' object: "
                                   f"{_RESTORE}")
    for scale, record in document["scales"].items():
        _name(scale, f"{path}: a scale", layout.SCALE_NAME)
        where = f"{path}: scale {scale}"
        if not (isinstance(record, dict) and isinstance(record.get("space"), dict)
                and _count(record.get("vocab_size"), 1)
                and isinstance(record.get("devices"), dict)):
            raise PublishedTablesError(f"{where}: expected an object with a 'space' object, a "
                                       "positive integer 'vocab_size', a 'perplexity' record "
                                       f"and a 'devices' object: {_RESTORE}")
        _check_file(record.get("perplexity"), perplexity_file(scale), f"{where}, perplexity")
        for label, file in record["devices"].items():
            _name(label, f"{where}: a device")
            _check_file(file, device_file(scale, label), f"{where}, device {label}")


def _check_file(record: Any, canonical: str, where: str) -> None:
    """Refuse a table record whose ``file`` is not ``canonical`` or whose ``sha256`` and
    ``rows`` are not a digest and a count."""
    if not isinstance(record, dict) or record.get("file") != canonical:
        raise PublishedTablesError(f"{where}: expected a record whose 'file' is {canonical!r}: "
                                   f"{_RESTORE}")
    sha256 = record.get("sha256")
    if not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)
            and _count(record.get("rows"), 0)):
        raise PublishedTablesError(f"{where}: expected 'sha256', 64 hex digits, and 'rows', a "
                                   f"count: {_RESTORE}")


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


def _inside(folder: Path, relative: str) -> Path:
    """folder / relative (a canonical path of the manifest), refused where a part of it is a
    symbolic link, or a folder or file where the other is expected: a path read, written or
    deleted here names a file inside folder."""
    parts = relative.split("/")
    path = folder
    for i, part in enumerate(parts):
        path = path / part
        kind, is_kind = ("regular file", path.is_file) if i == len(parts) - 1 else (
            "folder", path.is_dir)
        if path.is_symlink():
            raise PublishedTablesError(f"{path} is a symbolic link: hwgptbench {COMMAND} reads, "
                                       f"writes and deletes only files inside {folder}; put "
                                       "the folder or file itself there")
        if path.exists() and not is_kind():
            raise PublishedTablesError(f"{path} is not a {kind}: move it away")
    return path


def _read(file: Mapping[str, Any], folder: Path) -> pl.DataFrame:
    """A shipped table, after checking its SHA-256 against the manifest (the bytes checked
    are the bytes read)."""
    path = _inside(folder, file["file"])
    if not path.exists():
        raise PublishedTablesError(f"{path} is missing: restore it (git checkout {path})")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != file["sha256"]:
        raise PublishedTablesError(
            f"{path} does not match its manifest (SHA-256 {digest[:12]}…, expected "
            f"{file['sha256'][:12]}…): {_RESTORE}")
    return pl.read_parquet(BytesIO(data))  # the bytes ship wrote, after it checked them


def perplexity_table(scale: str, folder: str | os.PathLike[str] = FOLDER) -> pl.DataFrame:
    """The scale's perplexity table (one row per arch, with accuracy and source)."""
    return _read(entry(scale, folder)["perplexity"], Path(folder))


def device_tables(scale: str, folder: str | os.PathLike[str] = FOLDER
                  ) -> dict[str, pl.DataFrame]:
    """The scale's measurement tables, by device label (empty when no device is shipped)."""
    devices = entry(scale, folder).get("devices", {})
    return {label: _read(file, Path(folder)) for label, file in sorted(devices.items())}


def device_labels(scale: str, folder: str | os.PathLike[str] = FOLDER) -> list[str]:
    """The labels of the scale's shipped device tables (none for a scale that ships none)."""
    if scale not in scales(folder):
        return []
    return sorted(entry(scale, folder).get("devices", {}))


LOCAL = "local"  # the word `adapt --device auto` adds to this machine's label of a shipped table


def unshipped_label(scale: str, label: str, folder: str | os.PathLike[str] = FOLDER) -> str:
    """``label``, or where the scale ships a table of it, ``{label}-local`` (logged): the
    label ``adapt --device auto`` files this machine under."""
    if label not in device_labels(scale, folder):
        return label
    log.warning("%s is the label of the shipped %s table %s (another machine of this model): "
                "this machine's rows are filed as %s-%s", label, scale,
                device_file(scale, label), label, LOCAL)
    return f"{label}-{LOCAL}"


def check_unshipped_label(scale: str, label: str, flag: str,
                          folder: str | os.PathLike[str] = FOLDER) -> None:
    """Refuse to file a device adapted here under the label of a shipped device table of
    ``scale``: a label names one table, and a few measured archs must neither hide the
    shipped table nor mix another machine's numbers into it."""
    if label in device_labels(scale, folder):
        raise PublishedTablesError(
            f"{flag} {label}: the package ships a {scale} table of {label} "
            f"({device_file(scale, label)}), measured on another machine of this model; a "
            f"device adapted here gets a label of its own: {flag} {label}-{LOCAL} (this "
            "machine's label extended by a word names it too), and the shipped table keeps "
            f"answering for {label}")


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


def _input(path: Path, fix: str) -> pl.DataFrame:
    """A table given to ship, read as a file from outside (:func:`io.read_outside_parquet`)."""
    try:
        return read_outside_parquet(path, fix)
    except CorruptFileError as err:
        raise PublishedTablesError(str(err)) from None


def _refuse(table: pl.DataFrame, path: Path, column: str, row: int, problem: str,
            fix: str) -> NoReturn:
    shown = repr(table[column][row])
    shown = shown if len(shown) <= 60 else shown[:60] + "..."
    raise PublishedTablesError(f"{path}: column {column!r}, row {row} ({shown}): {problem}; "
                               f"{fix}")


def _refuse_where(table: pl.DataFrame, path: Path, column: str, bad: pl.Expr, problem: str,
                  fix: str) -> None:
    """Refuse the table at the first row where ``bad`` holds (a null is not bad)."""
    row = table.select(bad.fill_null(False).arg_true().first()).item()
    if row is not None:
        _refuse(table, path, column, row, problem, fix)


def _check_rows(table: pl.DataFrame, path: Path, types: Mapping[str, str],
                optional: Mapping[str, str], keys: Sequence[str], fix: str) -> None:
    """Refuse a table that lacks a column of ``types``, holds a column of ``types`` or
    ``optional`` of another type (an all-null column passes), holds no rows, a null key, a
    NaN or infinite float, or a value outside :data:`BOUNDS`."""
    missing = [c for c in types if c not in table.columns]
    if missing:
        raise PublishedTablesError(f"{path} lacks the columns {missing}: {fix}")
    for column, kind in {**optional, **types}.items():
        dtype = table.schema.get(column)
        if dtype is not None and dtype != pl.Null and not _OF_KIND[kind](dtype):
            raise PublishedTablesError(f"{path}: column {column!r} holds {dtype}, not {kind}: "
                                       f"{fix}")
    if table.is_empty():
        raise PublishedTablesError(f"{path} holds no rows: {fix}")
    for column in keys:
        _refuse_where(table, path, column, pl.col(column).is_null(), "is null", fix)
    for column, dtype in table.schema.items():
        if dtype.is_float():
            _refuse_where(table, path, column, ~pl.col(column).is_finite(),
                          "is not a finite number", fix)
    for column, (low, high) in BOUNDS.items():
        if column in table.columns and table.schema[column].is_numeric():
            _refuse_where(table, path, column, ~pl.col(column).is_between(low, high),
                          f"is outside its range [{low:g}, {high:g}]", fix)


def _check_archs(table: pl.DataFrame, path: Path, space: SearchSpace, fix: str) -> None:
    """Refuse the first row whose arch id does not parse or is outside the space."""
    invalid = space.first_invalid(table["arch_id"])
    if invalid is not None:
        arch_id, err = invalid
        row = table.select((pl.col("arch_id") == arch_id).arg_true().first()).item()
        _refuse(table, path, "arch_id", row, f"not an arch of the space {space.name} ({err})",
                fix)


def check_perplexity_table(table: pl.DataFrame, path: Path, space: SearchSpace) -> None:
    """Refuse (:class:`PublishedTablesError`, naming path, the column, the first bad row and
    the fix) a perplexity table that is not what ``hwgptbench import-perplexity`` writes for
    ``space``: its columns of their types, no null, finite floats, a perplexity of at least 1,
    an accuracy in [0, 1], one row per arch and training steps, every arch in the space."""
    _check_rows(table, path, PERPLEXITY_TYPES, {}, PERPLEXITY_COLUMNS, PERPLEXITY_FIX)
    _check_archs(table, path, space, PERPLEXITY_FIX)
    _refuse_where(table, path, "arch_id", ~pl.struct("arch_id", "train_steps")
                  .is_first_distinct(), "the arch is in the table twice", PERPLEXITY_FIX)


def union_rows(shipped: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    """The rows of both tables of one device, a row of ``new`` replacing the shipped row of
    the same arch and condition (a later campaign adds archs and conditions to a table)."""
    both = pl.concat([new, shipped], how="diagonal_relaxed")
    keys = with_condition_columns(both).select("arch_id", *CONDITION_KEYS)
    return both.filter(keys.select(pl.struct(pl.all()).is_first_distinct()).to_series())


def check_device_table(table: pl.DataFrame, path: Path, space: SearchSpace) -> str:
    """The device label of a measurement table (:data:`layout.DEVICE_LABEL`), after refusing
    (:class:`PublishedTablesError`, naming path, the column, the first bad row and the fix) a
    table that is not what the measure stage writes for ``space``: one device, its columns of
    their types, no null key, finite floats within :data:`BOUNDS`, a latency on every ok row,
    valid conditions, every arch in the space, one row per arch and condition, no ok row
    whose latency is still contended."""
    if "device" in table.columns and table["device"].n_unique() > 1:
        labels = table["device"].unique(maintain_order=True)
        more = ", ..." if labels.len() > 5 else ""
        raise PublishedTablesError(f"{path} holds the devices {labels.head(5).to_list()}{more}: "
                                   "ship one device table per device (results/{scale}/measure/"
                                   "{label}.parquet)")
    _check_rows(table, path, DEVICE_TYPES, OPTIONAL_DEVICE_TYPES, DEVICE_KEYS, DEVICE_FIX)
    label = _name(table["device"][0], f"{path}: the device column")
    _refuse_where(table, path, "latency_ms",
                  (pl.col("status") == "ok") & pl.col("latency_ms").is_null(),
                  "null on a row whose status is ok", DEVICE_FIX)
    if "latency_contended" in table.columns:
        _refuse_where(table, path, "latency_contended",
                      (pl.col("status") == "ok") & pl.col("latency_contended"),
                      "true: the latency was timed while the machine was busy", CONTENDED_FIX)
    conditions = with_condition_columns(table).select(CONDITION_KEYS).with_row_index("row")
    for values in conditions.unique(CONDITION_KEYS, keep="first",
                                    maintain_order=True).iter_rows(named=True):
        row = values.pop("row")
        try:
            Condition(**values)
        except (TypeError, ValueError) as err:
            raise PublishedTablesError(f"{path}: row {row}: not a measurement condition "
                                       f"({err}); {DEVICE_FIX}") from None
    _check_archs(table, path, space, DEVICE_FIX)
    _refuse_where(with_condition_columns(table), path, "arch_id",
                  ~pl.struct("arch_id", *CONDITION_KEYS).is_first_distinct(),
                  "the arch is measured twice under one condition", DEVICE_FIX)
    return label


def _write(table: pl.DataFrame, dest: Path) -> dict[str, Any]:
    """Write a checked table to ``dest`` (zstd parquet, rows in their order); return its
    manifest record's SHA-256 and row count."""
    with atomic_path(dest, owned=True) as tmp:  # in a folder ship() checked, by its manifest
        table.write_parquet(tmp, compression="zstd", compression_level=19, statistics=False)
    return {"sha256": sha256_file(dest), "rows": table.height}


def _mark(folder: Path) -> None:
    """Write the folder's output marker of ship-tables, where it has none yet."""
    if not (folder / MARKER).is_file():
        write_marker(folder, COMMAND)


def fingerprint_of(table: pl.DataFrame) -> dict[str, Any]:
    """The hardware and software that measured a device table (its first row's
    :data:`FINGERPRINT_COLUMNS`; a column the table lacks is left out)."""
    row = table.row(0, named=True)
    return {c: row[c] for c in FINGERPRINT_COLUMNS if c in row}


def ship(scale: str, space_: SearchSpace, vocab: int, perplexity: str | os.PathLike[str] | None,
         devices: Sequence[str | os.PathLike[str]] = (), folder: str | os.PathLike[str] = FOLDER,
         replace_devices: bool = False, measured_by: str | None = None,
         union: bool = False) -> dict[str, Any]:
    """Ship tables of ``scale``: the perplexity table (as ``hwgptbench import-perplexity``
    wrote it) and device tables (as ``hwgptbench measure`` / ``merge-shards`` wrote them).

    Each device's record holds the table's fingerprint and ``measured_by``, the commit of the
    code that measured it (comma-separated commits for a table of several campaigns). A table
    not given keeps its shipped version; ``replace_devices`` deletes the shipped files of the
    devices not given; ``union`` adds a given table's rows to its device's shipped table
    (:func:`union_rows`), ``measured_by`` then joining the shipped commits. The folder must be
    new, empty or an earlier output of ship-tables
    (:func:`~hwgptbench.outputs.check_output_dir`), and every table, name and path is checked
    before anything is written. The tables are written file by file and the manifest last
    (atomically), so a reader never sees a table its manifest does not describe. Returns the
    scale's new manifest entry.
    """
    scale = _name(scale, "the scale (--scale)", layout.SCALE_NAME)
    if not _count(vocab, 1):
        raise PublishedTablesError(f"the vocabulary size (--vocab-size) {vocab!r} is not a "
                                   "positive integer: give the networks' vocabulary size")
    folder = check_output_dir(folder, COMMAND, "--folder")
    document = manifest(folder)
    old = document["scales"].get(scale, {})
    if old and old["space"] != space_.to_dict() and (perplexity is None or not replace_devices):
        raise PublishedTablesError(
                f"the shipped {scale} tables were written for the space {old['space']}, not "
                f"{space_.to_dict()}: ship every table of the scale anew (--perplexity and "
                "--device, with --replace-devices)")
    new_perplexity = None
    if perplexity is not None:
        new_perplexity = _input(Path(perplexity), PERPLEXITY_FIX)
        check_perplexity_table(new_perplexity, Path(perplexity), space_)
    tables: dict[str, pl.DataFrame] = {}
    shipped = old.get("devices", {})
    commits: dict[str, str | None] = {}
    for path in map(Path, devices):
        table = _input(path, DEVICE_FIX)
        label = check_device_table(table, path, space_)
        if label in tables:
            raise PublishedTablesError(f"{path} is a second table of the device {label}: ship "
                                       "one table per device")
        commits[label] = measured_by
        if union and label in shipped:
            table = union_rows(_read(shipped[label], folder), table)
            check_device_table(table, path, space_)
            earlier = str(shipped[label].get("measured_by") or "").split(", ")
            commits[label] = ", ".join(dict.fromkeys(c for c in [*earlier, measured_by] if c))
        tables[label] = table
    record: dict[str, Any] = {"space": space_.to_dict(), "vocab_size": vocab,
                              "perplexity": old.get("perplexity"),
                              "devices": {} if replace_devices else dict(shipped)}
    if new_perplexity is None and record["perplexity"] is None:
        raise PublishedTablesError(f"scale {scale} has no shipped perplexity table: give one "
                                   "(--perplexity, from hwgptbench import-perplexity)")
    perplexity_dest = _inside(folder, perplexity_file(scale))
    targets = {label: _inside(folder, device_file(scale, label)) for label in tables}
    stale = [_inside(folder, shipped[label]["file"])
             for label in sorted(set(shipped) - set(tables)) if replace_devices]
    _mark(folder)
    if new_perplexity is not None:
        sources = sorted(set(new_perplexity["source"]))
        record["perplexity"] = {"file": perplexity_file(scale),
                                **_write(new_perplexity, perplexity_dest),
                                "source": ", ".join(sources)}
    for label, table in tables.items():
        conditions = table.select("batch_size", "seq_len", "dtype", "launch").unique()
        record["devices"][label] = {"file": device_file(scale, label),
                                    **_write(table, targets[label]),
                                    "conditions": conditions.height,
                                    "default_condition": default_condition_of(table),
                                    "fingerprint": fingerprint_of(table),
                                    "measured_by": commits[label]}
    for path in stale:
        remove_file(path, owned=True)
    document["scales"][scale] = record
    atomic_write_json(folder / MANIFEST, document, owned=True)
    return record
