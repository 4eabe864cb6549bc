"""What a search optimizes: objective values of archs from the surrogate benchmark.

A :class:`Problem` is a set of metrics (all minimized) of one device and condition; its values
come from :meth:`Benchmark.query` in batches. Spaces small enough to enumerate (the tiny
default has 9 288 archs) are predicted once, whole, and then looked up: a search of 100
single-arch evaluations then costs microseconds per evaluation instead of a model call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..api import PERPLEXITY, Benchmark
from ..meters.condition import Condition
from ..space import Arch, SearchSpace

TABLE_LIMIT = 50_000  # spaces up to this size are predicted whole, once per fidelity
BATCH = 10_000


class Objectives(Protocol):
    """What :class:`~.evaluator.Evaluator` and :func:`~.runner.run` need of a problem: a
    :class:`Problem`, or another source of objective values (the sub-networks of a compressed
    model, surrogate predictions)."""

    @property
    def space(self) -> SearchSpace:
        """The space of the archs evaluated."""

    @property
    def metrics(self) -> tuple[str, ...]:
        """Names of the objectives (all minimized)."""

    @property
    def fidelities(self) -> list[int]:
        """Training steps at which perplexity can be queried ([] without fidelities)."""

    def values(self, archs: Sequence[Arch], fidelity: int | None = None) -> np.ndarray:
        """Raw objective values (n, len(metrics))."""


@dataclass
class Problem:
    """Objective values of archs: ``metrics`` of ``device`` under ``condition``."""

    benchmark: Benchmark
    metrics: tuple[str, ...]
    device: str | None
    condition: str | None
    _tables: dict[int | None, tuple[dict[str, int], np.ndarray]] = field(default_factory=dict,
                                                                          repr=False)
    _fidelities: list[int] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.metrics = tuple(self.metrics)
        if len(self.metrics) < 2 or len(set(self.metrics)) != len(self.metrics):
            raise ValueError(f"objectives {list(self.metrics)}: need at least two distinct "
                             "metrics")
        self.values(self.benchmark.space.sample(1, 0))  # unknown metric/device fails here

    @property
    def space(self) -> SearchSpace:
        return self.benchmark.space

    @property
    def fidelities(self) -> list[int]:
        """Training steps at which perplexity can be queried; the last is the full one (read
        once: the evaluator asks at every evaluation)."""
        if self._fidelities is None:
            self._fidelities = list(self.benchmark.fidelities)
        return list(self._fidelities)

    def _query(self, archs: Sequence[Arch], fidelity: int | None) -> np.ndarray:
        table = self.benchmark.query(archs, list(self.metrics), device=self.device,
                                     condition=self.condition, fidelity=fidelity)
        return table.select(self.metrics).to_numpy().astype(float)

    def _batched(self, archs: Sequence[Arch], fidelity: int | None) -> np.ndarray:
        parts = [self._query(archs[i:i + BATCH], fidelity) for i in range(0, len(archs), BATCH)]
        return np.vstack(parts) if parts else np.empty((0, len(self.metrics)))

    def _table(self, fidelity: int | None) -> tuple[dict[str, int], np.ndarray] | None:
        """(arch id -> row, values) of the whole space, or None if it is too large."""
        if self.space.size() > TABLE_LIMIT:
            return None
        if fidelity not in self._tables:
            archs = list(self.space.all_archs())
            self._tables[fidelity] = ({a.id: i for i, a in enumerate(archs)},
                                      self._batched(archs, fidelity))
        return self._tables[fidelity]

    def values(self, archs: Sequence[Arch], fidelity: int | None = None) -> np.ndarray:
        """Raw objective values (n, len(metrics)); ``fidelity`` applies to perplexity only."""
        if fidelity is not None and PERPLEXITY not in self.metrics:
            fidelity = None
        table = self._table(fidelity)
        if table is None:
            return self._batched(archs, fidelity)
        index, values = table
        for arch in archs:
            self.space.validate(arch)
        return values[[index[a.id] for a in archs]].reshape(len(archs), len(self.metrics))


def make_problem(benchmark: Benchmark, metrics: Sequence[str], device: str,
                 condition: Condition | None) -> Problem:
    """The problem of minimizing metrics on device, hardware metrics under condition (None:
    the device's only one)."""
    return Problem(benchmark, tuple(metrics), device, None if condition is None else condition.id)
