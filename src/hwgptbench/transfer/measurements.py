"""The measurement table given to `hwgptbench adapt` (``--measurements``, ``--sources``),
checked as a whole before anything is fitted: read as a file from outside
(:func:`hwgptbench.io.read_outside_parquet`), then its columns and their types, conditions,
arch ids and measured values (within the physical bounds of their units,
:data:`hwgptbench.metrics.UNIT_BOUNDS`); docs/transfer.md, "Measurements from a file".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import polars as pl

from ..adaptation.targets import TransferError
from ..io import CorruptFileError, read_outside_parquet
from ..meters.condition import (
    ATTENTIONS,
    CONDITION_KEYS,
    DTYPE_NAMES,
    LAUNCHES,
    QUANTS,
    WORKLOADS,
    Condition,
    with_condition_columns,
)
from ..metrics import METRICS, Metric
from ..params import schema_at
from ..space import SearchSpace

REQUIRED = ("arch_id", "batch_size", "seq_len", "dtype")
TEXT = {"arch_id": None, "dtype": DTYPE_NAMES, "launch": LAUNCHES, "workload": WORKLOADS,
        "attention": ATTENTIONS, "quant": QUANTS, "device": None, "device_name": None,
        "status": None}
COUNTS = {"batch_size": 1, "seq_len": 1, "gen_len": 0}  # column: its least value
FLAGS = ("compile", "recompute")
TYPES = {"text": pl.String, "count": pl.Int64, "flag": pl.Boolean, "metric": pl.Float64}
WORDS = {"text": "text (names)", "count": "integers", "flag": "booleans", "metric": "numbers"}
NOT_NULL = ("arch_id", "batch_size", "seq_len", "dtype", "device")
TABLE_HELP = "docs/transfer.md, \"Measurements from a file\""


class MeasurementsFileError(TransferError):
    """A measurements table given to ``hwgptbench adapt`` that is not one: unreadable, a column
    missing or of the wrong type, or a value outside what can be measured. The message names
    the file, the column, the first bad row and the fix."""


def read_measurements(path: str | os.PathLike[str], space: SearchSpace,
                      flag: str = "--measurements", required: Sequence[str] = REQUIRED
                      ) -> pl.DataFrame:
    """The measurements table at ``path`` (given with ``flag``), checked by
    :func:`check_measurements`."""
    try:
        table = read_outside_parquet(path, f"give a parquet table of measured rows ({TABLE_HELP})")
    except CorruptFileError as err:
        raise MeasurementsFileError(f"{flag} {err}") from None
    return check_measurements(table, space, f"{flag} {path}", required)


def check_measurements(table: pl.DataFrame, space: SearchSpace, where: str,
                       required: Sequence[str] = REQUIRED) -> pl.DataFrame:
    """``table`` with its columns cast to the measurement table's types, or
    :class:`MeasurementsFileError` (``where`` names the input): the ``required`` columns
    (default :data:`REQUIRED`; a table of several devices needs ``device`` too) and a metric
    column present, each column of the types it must have (cast only where no value changes),
    no nulls in :data:`NOT_NULL`, counts within the params schema's bounds, names among the
    known values, every condition valid, every arch id one of the space's, and every measured
    metric value finite and within its unit's bounds (:attr:`Metric.bounds`)."""
    missing = [name for name in required if name not in table.columns]
    if missing or not set(METRICS) & set(table.columns):
        absent = missing or [f"a metric ({', '.join(METRICS)})"]
        raise MeasurementsFileError(f"{where}: no column {', '.join(absent)}; this table needs "
                                    f"the columns {', '.join(required)} and a metric column "
                                    f"of measured values ({TABLE_HELP})")
    table = table.with_columns(_cast(table, name, where) for name in table.columns
                               if _kind(name))
    for name in NOT_NULL:
        if name in table.columns:
            _refuse_rows(table, name, table[name].is_null(), where, "is missing",
                         "every row needs one")
    for name, choices in TEXT.items():
        if choices and name in table.columns:
            _refuse_rows(table, name, ~table[name].is_in(choices) & table[name].is_not_null(),
                         where, f"is not one of {', '.join(choices)}", "use a known name")
    for name, least in COUNTS.items():
        if name in table.columns:
            _check_count(table, name, least, space, where)
    _check_conditions(table, where)
    _check_archs(table, space, where)
    for name, metric in METRICS.items():
        if name in table.columns:
            _check_values(table, metric, where)
    return table


def _kind(name: str) -> str | None:
    """What a column of the measurements table holds: text, count, flag or metric (None: a
    column the adaptation does not read)."""
    if name in TEXT:
        return "text"
    if name in COUNTS:
        return "count"
    if name in FLAGS:
        return "flag"
    return "metric" if name in METRICS else None


def _cast(table: pl.DataFrame, name: str, where: str) -> pl.Series:
    """Column ``name`` as its kind's type where no value changes, or MeasurementsFileError
    naming it."""
    column, kind = table[name], _kind(name) or "metric"
    dtype = column.dtype
    if dtype == pl.Null:
        return column.cast(TYPES[kind])
    if kind == "text" and dtype in (pl.String, pl.Categorical, pl.Enum):
        return column.cast(pl.String)
    if kind == "flag" and dtype == pl.Boolean:
        return column
    if kind == "metric" and dtype.is_numeric():
        return column.cast(pl.Float64)
    if kind == "count" and (dtype.is_integer() or dtype.is_float()):
        _refuse_rows(table, name, _not_whole(column), where, "is not a whole number",
                     "write counts as integers")
        return column.cast(pl.Int64)
    raise MeasurementsFileError(f"{where}: column {name} holds {dtype}, not {WORDS[kind]}; "
                                f"write it as a table of the measure stage does "
                                f"({TABLE_HELP})")


def _not_whole(column: pl.Series) -> pl.Series:
    """Where a numeric column holds a value that is no Int64: a fraction, NaN, inf or a
    number beyond its range."""
    beyond = column.cast(pl.Int64, strict=False).is_null() & column.is_not_null()
    if column.dtype.is_float():
        return beyond | ~column.is_finite() | (column != column.floor())
    return beyond


def _refuse_rows(table: pl.DataFrame, name: str, bad: pl.Series, where: str, problem: str,
                 fix: str) -> None:
    """MeasurementsFileError naming the first row where ``bad`` holds, if any."""
    rows = bad.fill_null(False).arg_true()
    if rows.len():
        first = rows[0]
        more = f" (and {rows.len() - 1} more rows)" if rows.len() > 1 else ""
        value = _shown(table[name][first])
        raise MeasurementsFileError(f"{where}: column {name}, row {first} (counting from 0): "
                                    f"{value} {problem}{more}; {fix}")


def _shown(value: Any) -> str:
    """A cell's value as a message quotes it: at most 60 characters."""
    if value is None:
        return "the value"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_count(table: pl.DataFrame, name: str, least: int, space: SearchSpace,
                 where: str) -> None:
    """A count column within [least, the params schema's bound] (seq_len: the space's
    block_size)."""
    most = schema_at(["measure", "batch_sizes", 0])["maximum"]
    if name == "seq_len":
        most = min(most, space.block_size)
    column = table[name]
    bound = (f"the block_size of space {space.name!r}" if most == space.block_size
             else "the params schema's bound")
    _refuse_rows(table, name, (column < least) | (column > most), where,
                 f"is not in [{least}, {most}] ({most}: {bound})",
                 "give the shape the rows were measured with, or drop the row")


def _check_conditions(table: pl.DataFrame, where: str) -> None:
    """Every distinct condition of the rows is a valid :class:`Condition`."""
    filled = with_condition_columns(table)
    for row in filled.select(CONDITION_KEYS).unique().iter_rows(named=True):
        try:
            Condition(**row)
        except ValueError as err:
            bad = filled.select(pl.all_horizontal(
                pl.col(key).eq_missing(value) for key, value in row.items()))
            first = bad.to_series().arg_true()[0]
            raise MeasurementsFileError(
                f"{where}: row {first} (counting from 0): its condition is not one the measure "
                f"stage runs ({err}); fix the condition columns "
                f"({', '.join(k for k in CONDITION_KEYS if k in table.columns)}) or drop the "
                "row (docs/measure.md)") from None


def _check_archs(table: pl.DataFrame, space: SearchSpace, where: str) -> None:
    """Every arch id is canonical and an arch of the scale's space."""
    invalid = space.first_invalid(table["arch_id"])
    if invalid is not None:
        arch_id, err = invalid
        _refuse_rows(table, "arch_id", table["arch_id"] == arch_id, where,
                     f"is not an arch of space {space.name!r} ({err})",
                     "give the archs' ids as the archs table of the scale writes them")


def _check_values(table: pl.DataFrame, metric: Metric, where: str) -> None:
    """A metric's measured values are finite, positive and within its unit's bounds."""
    name, column = metric.name, table[metric.name]
    _refuse_rows(table, name, ~column.is_finite(), where, "is not a finite number",
                 "drop the row, or measure it again")
    if metric.bounds is None:
        _refuse_rows(table, name, column <= 0, where, "is not positive",
                     "drop the row, or measure it again")
        return
    low, high = metric.bounds.low, metric.bounds.high
    _refuse_rows(table, name, (column < low) | (column > high), where,
                 f"is outside [{low:g}, {high:g}] {metric.unit} ({metric.bounds.words})",
                 f"give {name} in {metric.unit} (a unit off by 1000?), or drop the row")
