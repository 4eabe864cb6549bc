"""The objective function a search algorithm calls, with its budget and its record.

Every call is recorded (arch, fidelity, cost, raw objective values, and the seconds since
the run started when its values came back: the algorithm's own time and the queries'). Costs
are counted in full evaluations: an evaluation at fidelity f (training steps) costs f /
f_max, and an arch already evaluated at a lower fidelity pays only the difference, as a
trial resumed from its checkpoint would. When the next evaluation would exceed the budget,
:class:`BudgetExhausted` ends the run; algorithms are written as plain loops and never
count.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..space import Arch
from .problem import Objectives
from .reference import Reference

EPS = 1e-9


class BudgetExhausted(Exception):
    """The run's budget of evaluations is spent."""


@dataclass
class Evaluator:
    """Scaled objective values (all minimized) of archs, within a budget of evaluations."""

    problem: Objectives
    reference: Reference
    budget: float
    records: list[dict] = field(default_factory=list)
    spent: float = 0.0
    _paid: dict[str, int] = field(default_factory=dict)  # arch id -> highest fidelity evaluated
    started: float = field(default_factory=time.perf_counter)  # the run's clock starts here

    @property
    def n_objectives(self) -> int:
        return len(self.problem.metrics)

    @property
    def fidelities(self) -> list[int]:
        """Training steps at which perplexity can be evaluated; the last is the full one."""
        return self.problem.fidelities

    @property
    def full_fidelity(self) -> int | None:
        fidelities = self.fidelities
        return fidelities[-1] if fidelities else None

    def cost(self, arch: Arch, fidelity: int | None) -> float:
        """What evaluating arch at fidelity (None: the full one) would cost now."""
        full = self.full_fidelity
        if full is None:
            return 1.0
        level = full if fidelity is None else fidelity
        paid = self._paid.get(arch.id, 0)
        return (level - (paid if paid < level else 0)) / full

    def __call__(self, archs: Sequence[Arch], fidelity: int | None = None) -> np.ndarray:
        """Scaled objective values (len(archs), m); raises BudgetExhausted, after recording
        the archs that fit, if the batch does not fit in the budget."""
        if fidelity is not None and fidelity not in self.fidelities:
            raise ValueError(f"fidelity {fidelity} not in {self.fidelities}")
        full = fidelity is None or fidelity == self.full_fidelity
        archs = list(archs)
        fitting = []
        for arch in archs:
            cost = self.cost(arch, fidelity)
            if self.spent + cost > self.budget + EPS:
                break
            self.spent += cost
            fitting.append((arch, cost))
            level = fidelity or self.full_fidelity or 0
            self._paid[arch.id] = max(self._paid.get(arch.id, 0), level)
        values = self.problem.values([a for a, _ in fitting], None if full else fidelity)
        elapsed = time.perf_counter() - self.started
        for (arch, cost), row in zip(fitting, values, strict=True):
            self.records.append({"arch": arch, "fidelity": self.full_fidelity if full
                                 else fidelity, "full": full, "cost": cost, "values": row,
                                 "elapsed": elapsed})
        if len(fitting) < len(archs):
            raise BudgetExhausted
        return self.reference.normalize(values)
