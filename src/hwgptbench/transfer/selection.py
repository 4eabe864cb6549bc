"""Which k archs to measure on a new target.

- ``random``: k archs drawn uniformly (seeded).
- ``designed``: spread over the size range and the depths: the candidates sorted by the
  target condition's FLOPs fall into k equal-count bins; bin i takes the arch nearest the bin's
  median FLOPs among those with the i-th layer count of a cycle through the space's depths
  (any depth where the bin has none of that one). Deterministic: it needs no seed.

Both use only what is known before measuring (the archs and the condition), never a value.
"""

from __future__ import annotations

import numpy as np

from ..adaptation.targets import TransferError

SELECTIONS = ("designed", "random")


class SelectionError(TransferError):
    """More archs are asked for than there are candidates."""


def select(strategy: str, features: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """Indices (sorted) of k of the candidate rows of ``features`` (surrogate features of the
    target's condition: ``n_layer`` second, log FLOPs last)."""
    n = len(features)
    if k > n:
        raise SelectionError(f"{k} archs to measure, but only {n} candidates")
    if k < 1:
        raise SelectionError(f"k must be positive, got {k}")
    if strategy == "random":
        return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))
    if strategy == "designed":
        return _designed(features[:, -1].astype(np.float64), features[:, 1].astype(int), k)
    raise ValueError(f"unknown selection {strategy!r}; known: {', '.join(SELECTIONS)}")


def _designed(log_flops: np.ndarray, layers: np.ndarray, k: int) -> np.ndarray:
    order = np.lexsort((np.arange(len(log_flops)), log_flops))
    depths = np.unique(layers)
    chosen = []
    for i, rows in enumerate(np.array_split(order, k)):  # k disjoint, non-empty bins
        wanted = rows[layers[rows] == depths[i % len(depths)]]
        pool = wanted if len(wanted) else rows
        middle = np.median(log_flops[rows])
        chosen.append(int(pool[np.argmin(np.abs(log_flops[pool] - middle))]))
    return np.sort(np.asarray(chosen))
