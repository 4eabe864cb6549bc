"""A long NSGA-II run on the surrogates: the optimisation part of the reference front.

A random sample of a paper-scale space (10^12 to 10^35 archs) misses the front that a
model-based search finds, so the reference front also takes the non-dominated archs of a
long NSGA-II run (pymoo, the integer recipe of the ``nsga2`` algorithm). Surrogate queries are
cheap when batched: each generation is one query. Only the non-dominated archs found and the
range of each metric are kept, so memory stays small however long the run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from pymoo.core.evaluator import Evaluator as PymooEvaluator
from pymoo.core.problem import Problem as PymooProblem
from pymoo.problems.static import StaticProblem

from ..search_algorithms import NSGA2Options
from ..space import Arch
from .algorithms.nsga2 import make_nsga2
from .genome import Genome
from .hypervolume import pareto_mask
from .problem import Objectives

log = logging.getLogger(__name__)

POPULATION = 1_000


@dataclass
class Found:
    """What an optimisation found: its non-dominated archs and their raw values, and the best
    and worst value of each metric over all its evaluations."""

    archs: list[Arch]
    values: np.ndarray
    low: np.ndarray
    high: np.ndarray
    evaluations: int


def _merge(archs: list[Arch], values: np.ndarray, new: list[Arch], new_values: np.ndarray
           ) -> tuple[list[Arch], np.ndarray]:
    """The non-dominated archs (one row per arch id) of both sets."""
    every, stacked = archs + new, np.vstack([values, new_values])
    first: dict[str, int] = {}
    for i, arch in enumerate(every):
        first.setdefault(arch.id, i)
    rows = np.fromiter(first.values(), dtype=np.int64, count=len(first))
    keep = rows[pareto_mask(stacked[rows])]
    return [every[i] for i in keep], stacked[keep]


def optimise(problem: Objectives, evaluations: int, seed: int,
             population: int = POPULATION) -> Found:
    """NSGA-II on problem for whole generations of ``population`` archs until at least
    ``evaluations`` archs were evaluated; restarts from a new random population when no
    offspring is new (a space the population covers)."""
    genome = Genome(problem.space)
    m = len(problem.metrics)
    coded = PymooProblem(n_var=genome.size, n_obj=m, xl=0, xu=genome.cardinalities - 1,
                         vtype=int)
    options = NSGA2Options(population_size=population)
    algorithm, restarts = make_nsga2(coded, options, seed), 0
    archs: list[Arch] = []
    values = np.empty((0, m))
    low, high = np.full(m, np.inf), np.full(m, -np.inf)
    spent = 0
    while spent < evaluations:
        offspring = algorithm.ask()
        if offspring is None:
            restarts += 1
            algorithm = make_nsga2(coded, options, seed + restarts)
            continue
        batch = [genome.decode(g) for g in np.rint(offspring.get("X")).astype(np.int64)]
        found = np.asarray(problem.values(batch), dtype=float).reshape(len(batch), m)
        PymooEvaluator().eval(StaticProblem(coded, F=found), offspring)
        algorithm.tell(infills=offspring)
        spent += len(batch)
        low, high = np.minimum(low, found.min(axis=0)), np.maximum(high, found.max(axis=0))
        archs, values = _merge(archs, values, batch, found)
    log.info("optimisation: %d evaluations (%d restarts), %d non-dominated archs", spent,
             restarts, len(archs))
    return Found(archs, values, low, high, spent)
