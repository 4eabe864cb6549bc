"""Latencies timed in different groups, made comparable through the anchors every group times.

Within a group, interleaving divides out the machine's drift from cycle to cycle
(:func:`~.latency.interleaved_stats`): the statistics describe the group's archs at the group's
typical speed. Groups run minutes apart, and a shared or virtual machine's typical speed moves
by several percent over minutes, so the anchors (the same archs, timed in every group) tell how
fast each group's machine was: a group's factor is the geometric mean over anchors of the
anchor's median there relative to its geometric mean over all groups. Dividing a group's
latencies by its factor puts every group at the shard's typical speed. With several anchors the
factor's noise is that of their mean, below one anchor's own CI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

SCALED_FIELDS = ("latency_ms", "latency_mean_ms", "latency_std_ms", "latency_iqr_ms",
                 "latency_ci95_ms")


def group_factors(anchor_medians: Mapping[int, Mapping[str, float]]) -> dict[int, float]:
    """Speed factor of each group from {group: {anchor id: median ms}}; anchors missing from
    any group (they failed there) are left out, and with none left every factor is 1."""
    groups = sorted(anchor_medians)
    common = sorted(set.intersection(*(set(anchor_medians[g]) for g in groups))) if groups else []
    if len(groups) <= 1 or not common:
        return dict.fromkeys(groups, 1.0)
    logs = np.log([[anchor_medians[g][a] for a in common] for g in groups])  # (groups, anchors)
    relative = logs - logs.mean(axis=0)
    return {g: float(f) for g, f in zip(groups, np.exp(relative.mean(axis=1)), strict=True)}


def rescale(row: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """The row's latency statistics divided by factor (relative ones and counts unchanged)."""
    return {**row, **{k: row[k] / factor for k in SCALED_FIELDS if row.get(k) is not None},
            "latency_group_factor": factor}
