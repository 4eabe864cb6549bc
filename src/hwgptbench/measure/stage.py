"""The measure stage around the measure library: shards of archs, device tables and the
cross-device table, as parquet.

``measure_shard`` measures archs ``i, i+n, i+2n, ...`` of the archs table (shard i of n) on this
machine and writes one atomic parquet file, so many jobs or machines can share the work; within a
shard, the archs are timed in groups that fit the memory budget, and each group's rows are stored as
it completes, so a killed job resumes with the groups it has not measured (:mod:`.merge` builds
the device table and the cross-device table from the shards). Every row carries the device
label, its hardware fingerprint and the software versions, so tables from many machines merge.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import polars as pl

from ..campaign.parts import ShardParts, inputs_key
from ..campaign.shard import measure_rows
from ..errors import MeasurementError
from ..io import write_parquet
from ..metrics import measurement_frame
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


