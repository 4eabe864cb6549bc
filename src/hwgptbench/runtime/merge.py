"""The runtime, breakdown, serving and parallel tables of every device of a scale stacked,
one table each; polars alone, so that the merge job starts without torch."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from ..io import write_parquet


def merge_tables(paths: Sequence[str | Path], out: str | os.PathLike[str]
                 ) -> pl.DataFrame:
    """The tables of several devices in one (an empty table when there are none)."""
    tables = [pl.read_parquet(p) for p in paths]
    merged = pl.concat(tables, how="diagonal_relaxed") if tables else pl.DataFrame()
    write_parquet(merged, out)
    return merged
