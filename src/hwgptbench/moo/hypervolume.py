"""Pareto dominance and hypervolume of minimization problems, from moocore.

moocore (the C library behind the EAF tools, and pymoo's own hypervolume backend) computes
exact hypervolumes in any number of objectives and the empirical attainment function.
"""

from __future__ import annotations

import moocore
import numpy as np


def pareto_mask(points: np.ndarray) -> np.ndarray:
    """True for the rows of points (n, m) that no other row dominates (duplicates kept)."""
    points = np.asarray(points, dtype=float)
    if len(points) == 0:
        return np.zeros(0, dtype=bool)
    return np.asarray(moocore.is_nondominated(points, maximise=False, keep_weakly=True))


def hypervolume(points: np.ndarray, reference: np.ndarray) -> float:
    """Volume dominated by points (n, m) and bounded by reference; points not strictly
    better than reference in every objective contribute nothing."""
    points = np.asarray(points, dtype=float).reshape(-1, len(reference))
    inside = points[(points < reference).all(axis=1)]
    return float(moocore.hypervolume(inside, ref=reference)) if len(inside) else 0.0


def hypervolume_trace(points: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Hypervolume of the first i+1 points, for every i (non-decreasing by construction)."""
    points = np.asarray(points, dtype=float)
    trace = np.zeros(len(points))
    front = np.empty((0, len(reference)))
    value = 0.0
    for i, point in enumerate(points):
        if not np.isnan(point).any() and not (front <= point).all(axis=1).any():
            front = np.vstack([front[~(point <= front).all(axis=1)], point])
            value = hypervolume(front, reference)
        trace[i] = value
    return trace
