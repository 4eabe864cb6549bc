"""Iterative surrogate-assisted NSGA-II (the lightweight iterative search LLaMA-NAS builds on).

Evaluate ``initial`` uniformly sampled archs; then, every round, fit one LightGBM regressor
per objective on all archs evaluated so far (features: the space's arch encoding), run
NSGA-II (:mod:`.nsga2`, pymoo) on the regressors' predictions for ``generations`` generations
of ``population_size``, and evaluate ``per_round`` archs of the predicted Pareto front that
were not evaluated yet, spread evenly along it (random archs when the front holds no new one).
The true evaluations are the only ones the run's budget counts; the surrogate's are free.

LightGBM is the benchmark's surrogate library already (:mod:`hwgptbench.surrogate`); with tens
of points a shallow model (few leaves, ``min_data_in_leaf`` 3) keeps the ranking useful.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...lightgbm_core import lgb
from ...search_algorithms import IterativeOptions, NSGA2Options
from ...space import Arch, SearchSpace
from ..evaluator import BudgetExhausted, Evaluator
from ..genome import Genome
from ..hypervolume import pareto_mask
from ..reference import Reference
from .nsga2 import nsga2

LGB_PARAMS = {"objective": "regression", "num_leaves": 7, "min_data_in_leaf": 3,
              "learning_rate": 0.1, "verbosity": -1, "num_threads": 1, "deterministic": True,
              "force_row_wise": True}


@dataclass
class PredictedProblem:
    """The Problem interface of :class:`Evaluator` over surrogate predictions."""

    space: SearchSpace
    boosters: list[lgb.Booster]

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(f"predicted_{i}" for i in range(len(self.boosters)))

    @property
    def fidelities(self) -> list[int]:
        return []

    def values(self, archs: Sequence[Arch], fidelity: int | None = None) -> np.ndarray:
        X = self.space.encode(archs)
        return np.column_stack([b.predict(X) for b in self.boosters]) if archs else (
            np.empty((0, len(self.boosters))))


def fit_boosters(space: SearchSpace, archs: list[Arch], values: np.ndarray, seed: int,
                 rounds: int) -> list[lgb.Booster]:
    """One regressor per objective column of values (n, m)."""
    X = space.encode(archs)
    return [lgb.train(LGB_PARAMS | {"seed": seed}, lgb.Dataset(X, values[:, j]),
                      num_boost_round=rounds) for j in range(values.shape[1])]


def spread(front: list[tuple[Arch, np.ndarray]], k: int) -> list[Arch]:
    """k archs evenly spaced along a front, ordered by its first objective."""
    ordered = [a for a, _ in sorted(front, key=lambda item: tuple(item[1]))]
    if len(ordered) <= k:
        return ordered
    return [ordered[i] for i in np.linspace(0, len(ordered) - 1, k).round().astype(int)]


def propose(space: SearchSpace, genome: Genome, archs: list[Arch], values: np.ndarray,
            seed: int, options: IterativeOptions) -> list[tuple[Arch, np.ndarray]]:
    """The predicted Pareto front (arch, predicted values) of an NSGA-II run on surrogates."""
    problem = PredictedProblem(space, fit_boosters(space, archs, values, seed,
                                                   options.boost_rounds))
    m = values.shape[1]
    identity = Reference(list(problem.metrics), None, None, [0.0] * m, [1.0] * m, 0.0, 0,
                         False, seed)
    population = options.population_size
    inner = Evaluator(problem, identity, float(population * options.generations))
    try:
        nsga2(inner, genome, seed, NSGA2Options(population_size=population))
    except BudgetExhausted:  # the inner budget ends the inner run
        pass
    predicted = np.array([r["values"] for r in inner.records])
    unique: dict[str, tuple[Arch, np.ndarray]] = {}
    for record, row in zip(inner.records, predicted, strict=True):
        unique.setdefault(record["arch"].id, (record["arch"], row))
    candidates = list(unique.values())
    mask = pareto_mask(np.array([v for _, v in candidates]))
    return [c for c, keep in zip(candidates, mask, strict=True) if keep]


def iterative(evaluate: Evaluator, genome: Genome, seed: int, options: IterativeOptions
              ) -> None:
    """Surrogate-assisted rounds until the budget ends the run."""
    space = genome.space
    rng = np.random.default_rng(seed)
    archs = space.sample(options.initial, seed)
    values = evaluate(archs)
    seen = {a.id for a in archs}
    for round_index in range(1, 10**6):
        front = propose(space, genome, archs, values, seed + round_index, options)
        new = spread([(a, v) for a, v in front if a.id not in seen], options.per_round)
        while not new:
            arch = space.sample(1, int(rng.integers(2**31)))[0]
            new = [] if arch.id in seen else [arch]
        seen.update(a.id for a in new)
        archs = archs + new
        values = np.vstack([values, evaluate(new)])
