"""Tables as markdown: numbers formatted for reading, missing values named, written atomically
beside a parquet copy."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from ..io import atomic_write_text

PathLike = str | os.PathLike[str]

MISSING = "n/a"


def format_float(value: float | None, digits: int | None = 4) -> str:
    """``digits`` significant digits, trailing zeros kept (integers for large values); the
    shortest round-trip repr for ``digits=None``; ``n/a`` for null."""
    if value is None:
        return MISSING
    if digits is None or not np.isfinite(value):
        return repr(float(value))
    if abs(value) >= 10**digits:
        return f"{value:.0f}"
    return f"{value:#.{digits}g}".rstrip(".")


def _as_text(df: pl.DataFrame, digits: int | None) -> pl.DataFrame:
    """Every column as strings: floats by ``format_float``, nulls as ``n/a``."""
    return df.with_columns(
        (pl.col(c).map_elements(lambda v: format_float(v, digits), return_dtype=pl.String)
         if df.schema[c].is_float() else pl.col(c).cast(pl.String))
        .fill_null(MISSING) for c in df.columns)


def to_markdown(df: pl.DataFrame, digits: int = 4) -> str:
    """A GitHub Markdown table; numeric columns right-aligned."""
    text = _as_text(df, digits)
    cells = [list(df.columns)] + [list(row) for row in text.iter_rows()]
    widths = [max(len(row[i]) for row in cells) for i in range(len(df.columns))]
    numeric = [df.schema[c].is_numeric() for c in df.columns]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if r else v.ljust(w)
                                 for v, w, r in zip(row, widths, numeric, strict=True)) + " |"

    rule = "| " + " | ".join("-" * (w - 1) + ":" if r else "-" * w
                             for w, r in zip(widths, numeric, strict=True)) + " |"
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])]) + "\n"


def write_table(df: pl.DataFrame, out_stem: PathLike, digits: int = 4) -> list[Path]:
    """Write ``{out_stem}.csv`` (floats in full) and ``{out_stem}.md`` (floats to ``digits``
    significant digits) atomically, nulls as ``n/a``; return the two paths."""
    stem = Path(out_stem)
    csv, md = stem.with_name(stem.name + ".csv"), stem.with_name(stem.name + ".md")
    atomic_write_text(csv, _as_text(df, None).write_csv(line_terminator="\n"))
    atomic_write_text(md, to_markdown(df, digits))
    return [csv, md]
