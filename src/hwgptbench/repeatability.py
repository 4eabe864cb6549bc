"""How well two measurements of the same archs agree: the ceiling a surrogate of the metric
can reach, since it is scored against one of them.

The measure stage times a repeat subset of each condition's archs a second time, in a
separate visit (``latency_repeat_ms``, docs/measure.md); the surrogate stage scores the pair
with :func:`agreement` and writes it beside each surrogate's quality.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

REPEAT_MIN = 5  # archs re-measured at least (fewer: no ceiling is read)
TOLERANCE = 0.02  # a surrogate whose Kendall τ is within this of the ceiling's is at it


def agreement(first: ArrayLike, second: ArrayLike) -> dict[str, float | int]:
    """Archs, the shares within ±2% and ±5% once the two visits' median ratio is divided out
    (a machine's speed differs between visits; a surrogate is scored on ranks and shares
    alike), Kendall τ between the visits, the largest deviation and the median ratio."""
    a, b = np.asarray(first, float), np.asarray(second, float)
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"agreement needs two paired series of >= 2 values, got {len(a)} "
                         f"and {len(b)}")
    ratio = b / a
    deviation = np.abs(ratio / np.median(ratio) - 1)
    return {"archs": len(a), "within_2pct": float(np.mean(deviation <= 0.02)),
            "within_5pct": float(np.mean(deviation <= 0.05)),
            "kendall_tau": float(stats.kendalltau(a, b).statistic),
            "max_dev": float(deviation.max()), "median_ratio": float(np.median(ratio))}


def at_ceiling(kendall_tau: float | None, ceiling_tau: float | None) -> bool | None:
    """Whether a surrogate's out-of-fold Kendall τ reaches the measurements' own (None where
    either is unknown)."""
    if kendall_tau is None or ceiling_tau is None:
        return None
    return kendall_tau >= ceiling_tau - TOLERANCE
